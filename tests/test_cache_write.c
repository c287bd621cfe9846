/* Cache write on the CPU backend: every key/value dtype into every cache dtype lands in the slot
 * the mapping names (block = slot / block_size, row = slot % block_size) with exactly the
 * conversion the spec fixes (fp8: x / scale, nearest even, saturating at +-448); negative slots
 * and every slot not named are left byte for byte as they were; strided views are honoured. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/kernels.h"
#include "testutil.h"
#include "suite.h"

static const attnd_dtype SRC[3] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
static const attnd_dtype CACHE[4] = {ATTND_DTYPE_F16, ATTND_DTYPE_BF16, ATTND_DTYPE_FP8_E4M3,
                                     ATTND_DTYPE_F32};

typedef struct cw_case {
    int64_t tokens, heads, d, bs, blocks;
    attnd_dtype src, cache;
    attnd_dtype slot_dt;
    int src_transposed; /* key/value viewed [T][H][D] over [H][T][D] storage */
    int cache_hnd;      /* caches viewed [N][B][H][D] over [N][H][B][D] storage */
    int skip_every;     /* every skip_every-th token gets slot -1 (0: none) */
    float k_scale, v_scale;
} cw_case;

typedef struct cw_bufs {
    attnd_test_tensor key, value, kc, vc, slots;
    attnd_cache_write_params p;
} cw_bufs;

static void cw_defaults(cw_case *c)
{
    memset(c, 0, sizeof *c);
    c->tokens = 37;
    c->heads = 2;
    c->d = 40;
    c->bs = 16;
    c->blocks = 5;
    c->src = ATTND_DTYPE_BF16;
    c->cache = ATTND_DTYPE_BF16;
    c->slot_dt = ATTND_DTYPE_I64;
    c->k_scale = 0.25f;
    c->v_scale = 3.0f;
}

static void alloc_src(attnd_test_tensor *tt, const cw_case *c, attnd_rng *r, double sigma)
{
    int64_t shape[3] = {c->tokens, c->heads, c->d}, stored[3] = {c->heads, c->tokens, c->d};
    attnd_tt_alloc(tt, c->src, 3, c->src_transposed ? stored : shape);
    if (c->src_transposed) {
        memcpy(tt->t.shape, shape, sizeof shape);
        tt->t.strides[0] = c->d;
        tt->t.strides[1] = c->tokens * c->d;
    }
    attnd_tt_fill_normal(tt, r, sigma, 1.0);
}

/* Caches start as random bytes (any pattern works: untouched slots are compared bytewise). */
static void alloc_cache(attnd_test_tensor *tt, const cw_case *c, attnd_rng *r)
{
    int64_t shape[4] = {c->blocks, c->bs, c->heads, c->d};
    int64_t stored[4] = {c->blocks, c->heads, c->bs, c->d};
    attnd_tt_alloc(tt, c->cache, 4, c->cache_hnd ? stored : shape);
    if (c->cache_hnd) {
        memcpy(tt->t.shape, shape, sizeof shape);
        tt->t.strides[1] = c->d;
        tt->t.strides[2] = c->bs * c->d;
    }
    for (size_t i = 0; i < tt->bytes; i++)
        ((unsigned char *)tt->buf)[i] = (unsigned char)attnd_rng_next(r);
}

/* Distinct random slots (a shuffled prefix of all slots), some -1 if asked. */
static void alloc_slots(cw_bufs *w, const cw_case *c, attnd_rng *r)
{
    int64_t n = c->blocks * c->bs;
    int64_t *all = malloc((size_t)n * sizeof *all);
    for (int64_t i = 0; i < n; i++)
        all[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t k = attnd_rng_int(r, 0, i), t = all[i];
        all[i] = all[k], all[k] = t;
    }
    attnd_tt_alloc(&w->slots, c->slot_dt, 1, &c->tokens);
    for (int64_t t = 0; t < c->tokens; t++) {
        int skip = c->skip_every > 0 && t % c->skip_every == 0;
        attnd_tt_set(&w->slots, &t, skip ? -1.0 - (double)(t % 3) : (double)all[t]);
    }
    free(all);
}

static void cw_build(cw_bufs *w, const cw_case *c, uint64_t seed, double sigma)
{
    attnd_rng r;
    attnd_rng_seed(&r, seed);
    memset(w, 0, sizeof *w);
    alloc_src(&w->key, c, &r, sigma);
    alloc_src(&w->value, c, &r, sigma);
    alloc_cache(&w->kc, c, &r);
    alloc_cache(&w->vc, c, &r);
    alloc_slots(w, c, &r);
    w->p.key = w->key.t, w->p.value = w->value.t;
    w->p.k_cache = w->kc.t, w->p.v_cache = w->vc.t;
    w->p.slot_mapping = w->slots.t;
    w->p.k_scale = c->k_scale, w->p.v_scale = c->v_scale;
}

static void cw_free(cw_bufs *w)
{
    attnd_tt_free(&w->key);
    attnd_tt_free(&w->value);
    attnd_tt_free(&w->kc);
    attnd_tt_free(&w->vc);
    attnd_tt_free(&w->slots);
}

/* The exact stored value for source x: converted as the cache dtype stores it. */
static float expected(double x, attnd_dtype cache, float scale)
{
    float f = (float)x;
    switch (cache) {
    case ATTND_DTYPE_F32:
        return f;
    case ATTND_DTYPE_F16:
        return attnd_f16_to_f32(attnd_f32_to_f16(f));
    case ATTND_DTYPE_BF16:
        return attnd_bf16_to_f32(attnd_f32_to_bf16(f));
    default:
        return attnd_fp8_to_f32(attnd_f32_to_fp8(f / scale));
    }
}

/* Byte offset of (block, row, head, 0) in a cache view: one head row of d elements. */
static size_t head_row_off(const attnd_test_tensor *tt, int64_t blk, int64_t row, int64_t h)
{
    const attnd_tensor *t = &tt->t;
    return (size_t)(blk * t->strides[0] + row * t->strides[1] + h * t->strides[2]) *
           attnd_dtype_size(t->dtype);
}

/* Written slots hold exactly the converted rows; every other head row is unchanged from
 * `before` (a copy of the cache bytes taken before the write). */
static void expect_cache(const cw_case *c, const attnd_test_tensor *src,
                         const attnd_test_tensor *cache, const unsigned char *before,
                         const attnd_test_tensor *slots, float scale)
{
    int64_t nslots = c->blocks * c->bs;
    char *written = calloc((size_t)nslots, 1);
    size_t row_bytes = (size_t)c->d * attnd_dtype_size(c->cache);
    for (int64_t t = 0; t < c->tokens; t++) {
        int64_t slot = (int64_t)attnd_tt_get(slots, &t);
        if (slot < 0) continue;
        written[slot] = 1;
        for (int64_t h = 0; h < c->heads; h++) {
            for (int64_t e = 0; e < c->d; e++) {
                int64_t si[3] = {t, h, e}, ci[4] = {slot / c->bs, slot % c->bs, h, e};
                float want = expected(attnd_tt_get(src, si), c->cache, scale);
                float got = (float)attnd_tt_get(cache, ci);
                cr_assert(got == want, "token %lld head %lld [%lld]: %g, expected %g", (long long)t,
                          (long long)h, (long long)e, got, want);
            }
        }
    }
    for (int64_t s = 0; s < nslots; s++) {
        for (int64_t h = 0; h < c->heads && !written[s]; h++) {
            size_t off = head_row_off(cache, s / c->bs, s % c->bs, h);
            cr_assert(memcmp((unsigned char *)cache->buf + off, before + off, row_bytes) == 0,
                      "slot %lld head %lld changed but no token maps to it", (long long)s,
                      (long long)h);
        }
    }
    free(written);
}

/* Write, then check both caches; returns nothing, asserts everything. */
static void check_write(attnd_backend *b, const cw_case *c, uint64_t seed, double sigma)
{
    cw_bufs w;
    cw_build(&w, c, seed, sigma);
    unsigned char *kb = malloc(w.kc.bytes), *vb = malloc(w.vc.bytes);
    memcpy(kb, w.kc.buf, w.kc.bytes);
    memcpy(vb, w.vc.buf, w.vc.bytes);
    attnd_err rv = attnd_cache_write(b, &w.p);
    cr_assert_eq(rv, ATTND_ERR_OK, "%s: %s", attnd_err_name(rv), attnd_backend_last_error(b));
    expect_cache(c, &w.key, &w.kc, kb, &w.slots, c->k_scale);
    expect_cache(c, &w.value, &w.vc, vb, &w.slots, c->v_scale);
    free(kb);
    free(vb);
    cw_free(&w);
}

Test(cache_write, round_trip_every_dtype_pair, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int si = 0; si < 3; si++) {
        for (int ci = 0; ci < 4; ci++) {
            cw_case c;
            cw_defaults(&c);
            c.src = SRC[si], c.cache = CACHE[ci];
            check_write(b, &c, 10 + (uint64_t)(si * 4 + ci), 1.0);
        }
    }
    attnd_backend_close(b);
}

/* Dequantised read-back is the input within the cache dtype's precision. */
Test(cache_write, dequantised_read_back_is_close, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int ci = 0; ci < 3; ci++) {
        cw_case c;
        cw_bufs w;
        cw_defaults(&c);
        c.src = ATTND_DTYPE_F32, c.cache = CACHE[ci];
        cw_build(&w, &c, 30 + (uint64_t)ci, 1.0);
        cr_assert_eq(attnd_cache_write(b, &w.p), ATTND_ERR_OK);
        double *src = attnd_tt_to_f64(&w.key),
               *back = malloc((size_t)(c.tokens * c.heads * c.d) * sizeof *back);
        for (int64_t t = 0; t < c.tokens; t++) {
            int64_t slot = (int64_t)attnd_tt_get(&w.slots, &t);
            for (int64_t h = 0; h < c.heads; h++)
                for (int64_t e = 0; e < c.d; e++) {
                    int64_t ci4[4] = {slot / c.bs, slot % c.bs, h, e};
                    double x = attnd_tt_get(&w.kc, ci4);
                    back[(t * c.heads + h) * c.d + e] =
                        c.cache == ATTND_DTYPE_FP8_E4M3 ? x * c.k_scale : x;
                }
        }
        double err = attnd_rel_l2(back, src, c.tokens * c.heads * c.d);
        cr_assert(err <= attnd_tol_for(c.cache) / 2, "%s: read-back rel L2 %g",
                  attnd_dtype_name(c.cache), err);
        free(src);
        free(back);
        cw_free(&w);
    }
    attnd_backend_close(b);
}

Test(cache_write, negative_slots_are_skipped, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int ci = 0; ci < 3; ci++) {
        cw_case c;
        cw_defaults(&c);
        c.cache = CACHE[ci];
        c.skip_every = 3;
        check_write(b, &c, 40 + (uint64_t)ci, 1.0);
        c.skip_every = 1; /* every token padding: nothing changes */
        check_write(b, &c, 45 + (uint64_t)ci, 1.0);
    }
    attnd_backend_close(b);
}

Test(cache_write, i32_and_i64_slot_mappings, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    cw_case c;
    cw_defaults(&c);
    c.skip_every = 4;
    c.slot_dt = ATTND_DTYPE_I32;
    check_write(b, &c, 50, 1.0);
    c.slot_dt = ATTND_DTYPE_I64;
    check_write(b, &c, 51, 1.0);
    attnd_backend_close(b);
}

Test(cache_write, strided_views_and_layouts, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int k = 0; k < 4; k++) {
        cw_case c;
        cw_defaults(&c);
        c.src_transposed = k & 1;
        c.cache_hnd = (k >> 1) & 1;
        c.cache = CACHE[k % 3];
        c.bs = 32, c.heads = 3, c.d = 64;
        check_write(b, &c, 60 + (uint64_t)k, 1.0);
    }
    attnd_backend_close(b);
}

/* Large values (and inf) saturate at +-448 x scale in fp8 instead of turning into NaN; the
 * others are chosen exactly representable after the division, so they read back exactly. */
Test(cache_write, fp8_saturates, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    cw_case c;
    cw_bufs w;
    cw_defaults(&c);
    c.cache = ATTND_DTYPE_FP8_E4M3;
    c.src = ATTND_DTYPE_F32;
    c.k_scale = 0.5f, c.v_scale = 2.0f;
    cw_build(&w, &c, 70, 1.0);
    static const float big[] = {320.0f, -320.0f, 1e6f, -1e30f, 224.0f, -INFINITY};
    for (int64_t t = 0; t < c.tokens; t++)
        for (int64_t e = 0; e < c.d; e++) {
            int64_t i[3] = {t, 0, e};
            attnd_tt_set(&w.key, i, big[(t + e) % 6]);
            attnd_tt_set(&w.value, i, big[(t + e) % 6]);
        }
    cr_assert_eq(attnd_cache_write(b, &w.p), ATTND_ERR_OK);
    for (int64_t t = 0; t < c.tokens; t++) {
        int64_t slot = (int64_t)attnd_tt_get(&w.slots, &t);
        for (int64_t e = 0; e < c.d; e++) {
            int64_t ci[4] = {slot / c.bs, slot % c.bs, 0, e};
            float x = big[(t + e) % 6], k = (float)attnd_tt_get(&w.kc, ci) * c.k_scale;
            float v = (float)attnd_tt_get(&w.vc, ci) * c.v_scale;
            float want_k = fabsf(x / c.k_scale) >= 448.0f ? copysignf(448.0f * c.k_scale, x) : x;
            float want_v = fabsf(x / c.v_scale) >= 448.0f ? copysignf(448.0f * c.v_scale, x) : x;
            cr_assert(k == want_k, "key %g stored as %g, expected %g", x, k, want_k);
            cr_assert(v == want_v, "value %g stored as %g, expected %g", x, v, want_v);
        }
    }
    cw_free(&w);
    attnd_backend_close(b);
}

Test(cache_write, no_tokens, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    cw_case c;
    cw_defaults(&c);
    c.tokens = 0;
    check_write(b, &c, 80, 1.0);
    attnd_backend_close(b);
}

Test(cache_write, many_tokens_across_chunks, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    cw_case c;
    cw_defaults(&c);
    c.tokens = 700, c.blocks = 60, c.bs = 16, c.heads = 1, c.d = 32;
    c.cache = ATTND_DTYPE_FP8_E4M3;
    c.skip_every = 7;
    check_write(b, &c, 90, 2.0);
    attnd_backend_close(b);
}
