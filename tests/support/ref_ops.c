#include "ref_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Element at a multi-index (t->ndim entries), exactly as stored, as double. */
static double at(const attnd_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    int64_t idx[4] = {i0, i1, i2, i3}, off = 0;
    for (int32_t d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    if (t->dtype == ATTND_DTYPE_I32) return ((const int32_t *)t->data)[off];
    if (t->dtype == ATTND_DTYPE_I64) return (double)((const int64_t *)t->data)[off];
    return attnd_load_f32(t->data, t->dtype, off);
}

/* ---------------------------------------------------------------- merge */

void attnd_ref_merge(const attnd_merge_params *p, double *out, double *out_lse)
{
    int64_t T = p->out.shape[0], H = p->out.shape[1], D = p->out.shape[2];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            double a = at(&p->prefix_lse, h, t, 0, 0), b = at(&p->suffix_lse, h, t, 0, 0);
            if (a == INFINITY) a = -INFINITY;
            if (b == INFINITY) b = -INFINITY;
            double m = a > b ? a : b, wa = 0, wb = 0, lse = -INFINITY;
            if (m != -INFINITY) {
                double ea = exp(a - m), eb = exp(b - m);
                wa = ea / (ea + eb);
                wb = eb / (ea + eb);
                lse = m + log(ea + eb);
            }
            for (int64_t d = 0; d < D; d++) {
                double v = 0;
                if (wa > 0) v += wa * at(&p->prefix_out, t, h, d, 0);
                if (wb > 0) v += wb * at(&p->suffix_out, t, h, d, 0);
                out[(t * H + h) * D + d] = v;
            }
            if (out_lse) out_lse[h * T + t] = lse;
        }
}

/* ---------------------------------------------------------------- softmax attention */

/* One query row: logits s[0..n) (-inf = masked), value of key j and dim c via vals(ctx, j, c).
 * p_scale > 0 quantises p / p_scale to fp8 for the PV product. */
typedef double (*ref_val_fn)(const void *ctx, int64_t j, int64_t c);

static void softmax_row(const double *s, int64_t n, int64_t D, double p_scale, ref_val_fn vals,
                        const void *ctx, double *out)
{
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    for (int64_t c = 0; c < D; c++)
        out[c] = 0;
    if (m == -INFINITY) return;
    for (int64_t j = 0; j < n; j++) {
        if (s[j] == -INFINITY) continue;
        double pj = exp(s[j] - m), w = pj;
        l += pj;
        if (p_scale > 0) w = attnd_fp8_to_f32(attnd_f32_to_fp8((float)(pj / p_scale))) * p_scale;
        for (int64_t c = 0; c < D; c++)
            out[c] += w * vals(ctx, j, c);
    }
    for (int64_t c = 0; c < D; c++)
        out[c] /= l;
}

typedef struct kv_ctx {
    const attnd_tensor *v;
    int64_t k0, kvh;
    double v_scale;
} kv_ctx;

static double kv_val(const void *ctx, int64_t j, int64_t c)
{
    const kv_ctx *k = ctx;
    return at(k->v, k->k0 + j, k->kvh, c, 0) * k->v_scale;
}

static double dot_qk(const attnd_tensor *q, int64_t qr, int64_t h, const attnd_tensor *k,
                     int64_t kr, int64_t kh, int64_t D)
{
    double s = 0;
    for (int64_t c = 0; c < D; c++)
        s += at(q, qr, h, c, 0) * at(k, kr, kh, c, 0);
    return s;
}

/* ---------------------------------------------------------------- varlen */

static void varlen_row(const attnd_varlen_params *p, int64_t b, int64_t i, int64_t h, double *s,
                       double *out)
{
    int fp8 = p->q.dtype == ATTND_DTYPE_FP8_E4M3;
    int64_t q0 = (int64_t)at(&p->cu_seqlens_q, b, 0, 0, 0);
    int64_t lq = (int64_t)at(&p->cu_seqlens_q, b + 1, 0, 0, 0) - q0;
    int64_t k0 = (int64_t)at(&p->cu_seqlens_k, b, 0, 0, 0);
    int64_t lk = (int64_t)at(&p->cu_seqlens_k, b + 1, 0, 0, 0) - k0;
    int64_t D = p->q.shape[2], kvh = h / (p->q.shape[1] / p->k.shape[1]);
    double qk_scale = fp8 ? (double)p->q_scale * p->k_scale : 1.0;
    for (int64_t j = 0; j < lk; j++) {
        if (p->causal && j > i + lk - lq) {
            s[j] = -INFINITY;
            continue;
        }
        s[j] = p->scale * qk_scale * dot_qk(&p->q, q0 + i, h, &p->k, k0 + j, kvh, D);
        if (p->bias.data) s[j] += at(&p->bias, b, h, i, j);
    }
    kv_ctx ctx = {&p->v, k0, kvh, fp8 ? p->v_scale : 1.0};
    softmax_row(s, lk, D, fp8 ? p->p_scale : 0.0, kv_val, &ctx, out);
}

void attnd_ref_varlen(const attnd_varlen_params *p, double *out)
{
    int64_t H = p->q.shape[1], D = p->q.shape[2], batch = p->cu_seqlens_q.shape[0] - 1;
    double *s = malloc((size_t)(p->k.shape[0] + 1) * sizeof *s);
    for (int64_t b = 0; b < batch; b++) {
        int64_t q0 = (int64_t)at(&p->cu_seqlens_q, b, 0, 0, 0);
        int64_t lq = (int64_t)at(&p->cu_seqlens_q, b + 1, 0, 0, 0) - q0;
        for (int64_t i = 0; i < lq; i++)
            for (int64_t h = 0; h < H; h++)
                varlen_row(p, b, i, h, s, out + ((q0 + i) * H + h) * D);
    }
    free(s);
}

/* ---------------------------------------------------------------- block-sparse */

/* Is key block kb listed in layout row r of head h? */
static int bs_listed(const attnd_blocksparse_params *p, int64_t h, int64_t r, int64_t kb)
{
    int64_t c0 = (int64_t)at(&p->layout_crow, h, r, 0, 0);
    int64_t c1 = (int64_t)at(&p->layout_crow, h, r + 1, 0, 0);
    for (int64_t c = c0; c < c1; c++)
        if ((int64_t)at(&p->layout_col, h, c, 0, 0) == kb) return 1;
    return 0;
}

void attnd_ref_blocksparse(const attnd_blocksparse_params *p, double *out)
{
    int64_t H = p->q.shape[1], D = p->q.shape[2], batch = p->cu_seqlens_q.shape[0] - 1;
    int64_t qbs = p->q_block_size > 0 ? p->q_block_size : p->block_size;
    double *s = malloc((size_t)(p->k.shape[0] + 1) * sizeof *s);
    for (int64_t b = 0; b < batch; b++) {
        int64_t q0 = (int64_t)at(&p->cu_seqlens_q, b, 0, 0, 0);
        int64_t lq = (int64_t)at(&p->cu_seqlens_q, b + 1, 0, 0, 0) - q0;
        int64_t k0 = (int64_t)at(&p->cu_seqlens_k, b, 0, 0, 0);
        int64_t lk = (int64_t)at(&p->cu_seqlens_k, b + 1, 0, 0, 0) - k0;
        for (int64_t i = 0; i < lq; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t pos = lk - lq + i, kvh = h / (H / p->k.shape[1]);
                for (int64_t j = 0; j < lk; j++) {
                    int ok = j <= pos && bs_listed(p, h, pos / qbs, j / p->block_size);
                    s[j] =
                        ok ? p->scale * dot_qk(&p->q, q0 + i, h, &p->k, k0 + j, kvh, D) : -INFINITY;
                }
                kv_ctx ctx = {&p->v, k0, kvh, 1.0};
                softmax_row(s, lk, D, 0.0, kv_val, &ctx, out + ((q0 + i) * H + h) * D);
            }
    }
    free(s);
}

/* ---------------------------------------------------------------- linear */

double *attnd_ref_state_load(const attnd_tensor *t)
{
    int64_t n = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3], e = 0;
    double *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    s[e++] = at(t, a, b, c, d);
    return s;
}

/* S <- lambda S + k^T v; o = q S, for one token of one head (S is d x e, row-major). */
static void recur_step(double *S, double lambda, const double *q, const double *k, const double *v,
                       int64_t d, int64_t e, double *o)
{
    for (int64_t c = 0; c < e; c++)
        o[c] = 0;
    for (int64_t r = 0; r < d; r++)
        for (int64_t c = 0; c < e; c++) {
            S[r * e + c] = lambda * S[r * e + c] + k[r] * v[c];
            o[c] += q[r] * S[r * e + c];
        }
}

void attnd_ref_linear_prefill(const attnd_linear_prefill_params *p, double *state, double *out)
{
    int64_t B = p->q.shape[0], H = p->q.shape[1], n = p->q.shape[2];
    int64_t d = p->q.shape[3], e = p->v.shape[3];
    double q[ATTND_HEAD_SIZE_MAX], k[ATTND_HEAD_SIZE_MAX], v[ATTND_HEAD_SIZE_MAX];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            double lambda = exp(-at(&p->slopes, h, 0, 0, 0));
            double *S = state + (b * H + h) * d * e;
            for (int64_t t = 0; t < n; t++) {
                for (int64_t r = 0; r < d; r++)
                    q[r] = at(&p->q, b, h, t, r);
                for (int64_t r = 0; r < d; r++)
                    k[r] = at(&p->k, b, h, t, r);
                for (int64_t c = 0; c < e; c++)
                    v[c] = at(&p->v, b, h, t, c);
                recur_step(S, lambda, q, k, v, d, e, out + ((b * H + h) * n + t) * e);
            }
        }
}

void attnd_ref_linear_decode(const attnd_linear_decode_params *p, double *cache, double *out)
{
    int64_t B = p->q.shape[0], H = p->q.shape[1], d = p->q.shape[2], e = p->v.shape[2];
    double q[ATTND_HEAD_SIZE_MAX], k[ATTND_HEAD_SIZE_MAX], v[ATTND_HEAD_SIZE_MAX];
    for (int64_t b = 0; b < B; b++) {
        int64_t slot = (int64_t)at(&p->slot_idx, b, 0, 0, 0);
        for (int64_t h = 0; h < H; h++) {
            double *o = out + (b * H + h) * e;
            if (slot < 0) {
                memset(o, 0, (size_t)e * sizeof *o);
                continue;
            }
            for (int64_t r = 0; r < d; r++)
                q[r] = at(&p->q, b, h, r, 0);
            for (int64_t r = 0; r < d; r++)
                k[r] = at(&p->k, b, h, r, 0);
            for (int64_t c = 0; c < e; c++)
                v[c] = at(&p->v, b, h, c, 0);
            double lambda = exp(-at(&p->slopes, h, 0, 0, 0));
            recur_step(cache + (slot * H + h) * d * e, lambda, q, k, v, d, e, o);
        }
    }
}

double attnd_ref_rel_err(const attnd_test_tensor *got, double got_mul, const double *want)
{
    int64_t n = attnd_tensor_numel(&got->t);
    double *g = attnd_tt_to_f64(got);
    for (int64_t i = 0; i < n; i++)
        g[i] *= got_mul;
    double r = attnd_rel_l2(g, want, n);
    free(g);
    return r;
}

int64_t attnd_ref_zero_rows_differ(const attnd_test_tensor *got, const double *want)
{
    int64_t d = got->t.shape[got->t.ndim - 1], rows = attnd_tensor_numel(&got->t) / (d ? d : 1);
    for (int64_t row = 0; row < rows && d > 0; row++) {
        int64_t c = 0;
        while (c < d && want[row * d + c] == 0.0)
            c++;
        for (int64_t i = 0; c == d && i < d; i++)
            if (attnd_tt_get_flat(got, row * d + i) != 0.0) return row;
    }
    return -1;
}
