#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void attnd_rng_seed(attnd_rng *r, uint64_t seed)
{
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (r->s == 0) r->s = 1;
}

uint64_t attnd_rng_next(attnd_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

double attnd_rng_uniform(attnd_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(attnd_rng_next(r) >> 11) / 9007199254740992.0);
}

int64_t attnd_rng_int(attnd_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(attnd_rng_next(r) % (uint64_t)(hi - lo + 1));
}

double attnd_rng_normal(attnd_rng *r)
{
    double u1 = attnd_rng_uniform(r, 1e-12, 1.0), u2 = attnd_rng_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void attnd_tt_alloc_padded(attnd_test_tensor *tt, attnd_dtype dt, int32_t ndim,
                           const int64_t *shape, int64_t pad)
{
    memset(tt, 0, sizeof *tt);
    int64_t padded[ATTND_MAX_DIMS] = {0, 0, 0, 0};
    for (int32_t d = 0; d < ndim; d++)
        padded[d] = shape[d];
    if (ndim > 0 && pad > shape[ndim - 1]) padded[ndim - 1] = pad;
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++)
        n *= padded[d];
    tt->bytes = (size_t)(n > 0 ? n : 1) * attnd_dtype_size(dt);
    tt->buf = calloc(1, tt->bytes);
    attnd_tensor_init(&tt->t, tt->buf, dt, ndim, padded);
    for (int32_t d = 0; d < ndim; d++)
        tt->t.shape[d] = shape[d];
}

void attnd_tt_alloc(attnd_test_tensor *tt, attnd_dtype dt, int32_t ndim, const int64_t *shape)
{
    attnd_tt_alloc_padded(tt, dt, ndim, shape, 0);
}

void attnd_tt_free(attnd_test_tensor *tt)
{
    free(tt->buf);
    memset(tt, 0, sizeof *tt);
}

static int64_t flat_offset(const attnd_tensor *t, int64_t e)
{
    int64_t off = 0;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d] > 0 ? t->shape[d] : 1;
        off += (e % n) * t->strides[d];
        e /= n;
    }
    return off;
}

static int64_t idx_offset(const attnd_tensor *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int32_t d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    return off;
}

void attnd_tt_fill_normal(attnd_test_tensor *tt, attnd_rng *r, double sigma, double scale)
{
    int64_t n = attnd_tensor_numel(&tt->t);
    for (int64_t e = 0; e < n; e++)
        attnd_store_f32(tt->buf, tt->t.dtype, flat_offset(&tt->t, e),
                        (float)(attnd_rng_normal(r) * sigma / scale));
}

void attnd_tt_poison(attnd_test_tensor *tt)
{
    memset(tt->buf, 0xff, tt->bytes);
}

double attnd_tt_get(const attnd_test_tensor *tt, const int64_t *idx)
{
    return attnd_load_f32(tt->buf, tt->t.dtype, idx_offset(&tt->t, idx));
}

void attnd_tt_set(attnd_test_tensor *tt, const int64_t *idx, double v)
{
    int64_t off = idx_offset(&tt->t, idx);
    if (tt->t.dtype == ATTND_DTYPE_I32)
        ((int32_t *)tt->buf)[off] = (int32_t)v;
    else if (tt->t.dtype == ATTND_DTYPE_I64)
        ((int64_t *)tt->buf)[off] = (int64_t)v;
    else
        attnd_store_f32(tt->buf, tt->t.dtype, off, (float)v);
}

double attnd_tt_get_flat(const attnd_test_tensor *tt, int64_t e)
{
    return attnd_load_f32(tt->buf, tt->t.dtype, flat_offset(&tt->t, e));
}

double *attnd_tt_to_f64(const attnd_test_tensor *tt)
{
    int64_t n = attnd_tensor_numel(&tt->t);
    double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    for (int64_t e = 0; e < n; e++)
        out[e] = attnd_tt_get_flat(tt, e);
    return out;
}

double attnd_rel_l2(const double *a, const double *b, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && isfinite(b[i])) return INFINITY;
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (!isfinite(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

double attnd_tol_for(attnd_dtype dt)
{
    switch (dt) {
    case ATTND_DTYPE_F32:
        return 1e-4;
    case ATTND_DTYPE_F16:
        return 2e-3;
    case ATTND_DTYPE_BF16:
        return 1.2e-2;
    case ATTND_DTYPE_FP8_E4M3:
        return 8e-2;
    default:
        return 1e-6;
    }
}

void attnd_tt_cu_seqlens(attnd_test_tensor *cu, const int32_t *lens, int64_t batch,
                         int32_t *max_len)
{
    int64_t shape[1] = {batch + 1}, acc = 0;
    attnd_tt_alloc(cu, ATTND_DTYPE_I32, 1, shape);
    *max_len = 0;
    for (int64_t s = 0; s <= batch; s++) {
        ((int32_t *)cu->buf)[s] = (int32_t)acc;
        if (s < batch) {
            acc += lens[s];
            *max_len = lens[s] > *max_len ? lens[s] : *max_len;
        }
    }
}
