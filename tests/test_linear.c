/* linear (lightning) attention (cpu) against the literal float64 recurrence
 *   S_t = exp(-slope) S_{t-1} + k_t^T v_t,  o_t = q_t S_t
 * at unscaled magnitudes (q, k, v ~ N(0, 0.5^2), a random non-zero starting state, ALiBi-like
 * slopes 2^(-8(h+1)/H)) and tight bounds: prefill across block boundaries (700 tokens, block 256),
 * chunked prefill carrying the state over several calls, prefill followed by decode against a
 * slot cache, padding slots, strided views. The seed's prefill exponent (lambda^i instead of
 * lambda^(i+1) for the carried state) makes the history term 1/lambda too large; on these cases
 * that is 0.6-2.7% relative error, far above the 1e-4 bounds. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_ops.h"
#include "testutil.h"
#include "suite.h"

#define SIGMA 0.5
#define F32_TOL 1e-4

typedef struct lrun {
    attnd_test_tensor q, k, v, out, slopes, state;
    attnd_linear_prefill_params p;
} lrun;

static void slopes_alloc(attnd_test_tensor *t, int64_t heads)
{
    attnd_tt_alloc(t, ATTND_DTYPE_F32, 1, (int64_t[]){heads});
    for (int64_t h = 0; h < heads; h++)
        ((float *)t->buf)[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)heads);
}

/* q, k [B, H, n, d], v/out [B, H, n, e] (rows padded to pad), random state [B, H, d, e]. */
static void lrun_alloc(lrun *l, attnd_rng *r, int64_t B, int64_t H, int64_t n, int64_t d, int64_t e,
                       attnd_dtype in, attnd_dtype out, int64_t pad)
{
    int64_t qs[4] = {B, H, n, d}, vs[4] = {B, H, n, e}, ss[4] = {B, H, d, e};
    attnd_tt_alloc_padded(&l->q, in, 4, qs, pad);
    attnd_tt_alloc_padded(&l->k, in, 4, qs, pad);
    attnd_tt_alloc_padded(&l->v, in, 4, vs, pad);
    attnd_tt_alloc_padded(&l->out, out, 4, vs, pad);
    attnd_tt_alloc_padded(&l->state, ATTND_DTYPE_F32, 4, ss, pad);
    attnd_tt_fill_normal(&l->q, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&l->k, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&l->v, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&l->state, r, 1.0, 1.0);
    slopes_alloc(&l->slopes, H);
    l->p = (attnd_linear_prefill_params){.q = l->q.t,
                                         .k = l->k.t,
                                         .v = l->v.t,
                                         .out = l->out.t,
                                         .slopes = l->slopes.t,
                                         .kv_state = l->state.t};
}

static void lrun_free(lrun *l)
{
    attnd_test_tensor *all[] = {&l->q, &l->k, &l->v, &l->out, &l->slopes, &l->state};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attnd_tt_free(all[i]);
}

static int64_t numel4(const attnd_tensor *t)
{
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* Prefill the whole of l in one call and compare output and final state with the recurrence. */
static void prefill_check(attnd_backend *b, lrun *l, double tol, const char *what)
{
    double *state = attnd_ref_state_load(&l->state.t);
    double *want = malloc((size_t)(numel4(&l->out.t) + 1) * sizeof *want);
    attnd_ref_linear_prefill(&l->p, state, want);
    attnd_tt_poison(&l->out);
    cr_assert_eq(attnd_linear_prefill(b, &l->p), ATTND_ERR_OK, "%s: %s", what,
                 attnd_backend_last_error(b));
    double err = attnd_ref_rel_err(&l->out, 1.0, want);
    cr_assert(err <= tol, "%s: output rel err %g > %g", what, err, tol);
    double serr = attnd_ref_rel_err(&l->state, 1.0, state);
    cr_assert(serr <= F32_TOL, "%s: state rel err %g > %g", what, serr, F32_TOL);
    free(state);
    free(want);
}

Test(linear, prefill_700_tokens_block_256, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 41);
    lrun l;
    lrun_alloc(&l, &r, 2, 8, 700, 128, 128, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0);
    l.p.block_size = 256;
    prefill_check(b, &l, F32_TOL, "700/256");
    lrun_free(&l);
    attnd_backend_close(b);
}

Test(linear, prefill_block_sizes_and_dtypes, .timeout = 120)
{
    static const int32_t blocks[] = {16, 64, 0, 1024};
    static const int64_t lens[] = {100, 300, 513, 37};
    static const attnd_dtype ins[] = {ATTND_DTYPE_BF16, ATTND_DTYPE_F16, ATTND_DTYPE_F32,
                                      ATTND_DTYPE_BF16};
    static const attnd_dtype outs[] = {ATTND_DTYPE_F32, ATTND_DTYPE_F32, ATTND_DTYPE_BF16,
                                       ATTND_DTYPE_F16};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 42);
    for (int i = 0; i < 4; i++) {
        lrun l;
        char what[64];
        snprintf(what, sizeof what, "block %d n %lld", blocks[i], (long long)lens[i]);
        lrun_alloc(&l, &r, 1, 4, lens[i], 64, 96, ins[i], outs[i], 0);
        l.p.block_size = blocks[i];
        prefill_check(b, &l, outs[i] == ATTND_DTYPE_F32 ? F32_TOL : attnd_tol_for(outs[i]), what);
        lrun_free(&l);
    }
    attnd_backend_close(b);
}

/* A view of tokens t0 .. t0+len-1 of a [B, H, n, x] tensor. */
static attnd_tensor token_view(const attnd_tensor *t, int64_t t0, int64_t len)
{
    attnd_tensor v = *t;
    v.data = (char *)t->data + t0 * t->strides[2] * (int64_t)attnd_dtype_size(t->dtype);
    v.shape[2] = len;
    return v;
}

/* Several prefill calls, each continuing from the state the previous one left. */
Test(linear, chunked_prefill_carries_history, .timeout = 120)
{
    static const int64_t chunks[] = {1, 255, 300, 144};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 43);
    lrun l;
    lrun_alloc(&l, &r, 2, 4, 700, 128, 64, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0);
    double *state = attnd_ref_state_load(&l.state.t);
    double *want = malloc((size_t)numel4(&l.out.t) * sizeof *want);
    attnd_ref_linear_prefill(&l.p, state, want);
    attnd_tt_poison(&l.out);
    for (int64_t i = 0, t0 = 0; i < 4; t0 += chunks[i++]) {
        attnd_linear_prefill_params c = l.p;
        c.q = token_view(&l.q.t, t0, chunks[i]);
        c.k = token_view(&l.k.t, t0, chunks[i]);
        c.v = token_view(&l.v.t, t0, chunks[i]);
        c.out = token_view(&l.out.t, t0, chunks[i]);
        c.block_size = i % 2 ? 64 : 256;
        cr_assert_eq(attnd_linear_prefill(b, &c), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    }
    double err = attnd_ref_rel_err(&l.out, 1.0, want);
    cr_assert(err <= F32_TOL, "chunked output rel err %g", err);
    double serr = attnd_ref_rel_err(&l.state, 1.0, state);
    cr_assert(serr <= F32_TOL, "chunked state rel err %g", serr);
    free(state);
    free(want);
    lrun_free(&l);
    attnd_backend_close(b);
}

/* Decode tensors [rows, H, x] taking token t of sequence seq_of[row] (rows with seq -1 get
 * random padding). */
static void decode_inputs(attnd_test_tensor *dst, const attnd_test_tensor *src, const int *seq_of,
                          int64_t rows, int64_t t, attnd_rng *r)
{
    int64_t H = src->t.shape[1], x = src->t.shape[3];
    attnd_tt_alloc(dst, src->t.dtype, 3, (int64_t[]){rows, H, x});
    attnd_tt_fill_normal(dst, r, SIGMA, 1.0);
    for (int64_t row = 0; row < rows; row++)
        for (int64_t h = 0; seq_of[row] >= 0 && h < H; h++)
            for (int64_t c = 0; c < x; c++)
                attnd_tt_set(dst, (int64_t[]){row, h, c},
                             attnd_tt_get(src, (int64_t[]){seq_of[row], h, t, c}));
}

/* One decode step for rows mapped by seq_of (-1: padding) at token t of l's tensors; outputs
 * are scattered into l.out at token t, and the padding row must come back zero. */
static void decode_step(attnd_backend *b, lrun *l, const int *seq_of, const attnd_tensor *cache,
                        const attnd_tensor *slot_idx, int64_t t, attnd_rng *r)
{
    int64_t rows = slot_idx->shape[0], H = l->q.t.shape[1], e = l->v.t.shape[3];
    attnd_test_tensor q, k, v, out;
    decode_inputs(&q, &l->q, seq_of, rows, t, r);
    decode_inputs(&k, &l->k, seq_of, rows, t, r);
    decode_inputs(&v, &l->v, seq_of, rows, t, r);
    attnd_tt_alloc(&out, ATTND_DTYPE_F32, 3, (int64_t[]){rows, H, e});
    attnd_tt_poison(&out);
    attnd_linear_decode_params dp = {.q = q.t,
                                     .k = k.t,
                                     .v = v.t,
                                     .out = out.t,
                                     .slopes = l->slopes.t,
                                     .kv_cache = *cache,
                                     .slot_idx = *slot_idx};
    cr_assert_eq(attnd_linear_decode(b, &dp), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    for (int64_t row = 0; row < rows; row++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t c = 0; c < e; c++) {
                double o = attnd_tt_get(&out, (int64_t[]){row, h, c});
                if (seq_of[row] < 0)
                    cr_assert_eq(o, 0.0, "padding row %lld", (long long)row);
                else
                    attnd_tt_set(&l->out, (int64_t[]){seq_of[row], h, t, c}, o);
            }
    attnd_test_tensor *all[] = {&q, &k, &v, &out};
    for (size_t i = 0; i < 4; i++)
        attnd_tt_free(all[i]);
}

/* A cache of `slots` random states with l's starting states copied into slots 0 and 3; returns
 * the [B = 2, ...] view of those two slots (a strided kv_state). */
static attnd_tensor cache_with_states(attnd_test_tensor *cache, const lrun *l, int64_t slots,
                                      attnd_rng *r)
{
    int64_t H = l->state.t.shape[1], de = l->state.t.shape[2] * l->state.t.shape[3];
    attnd_tt_alloc(cache, ATTND_DTYPE_F32, 4,
                   (int64_t[]){slots, H, l->state.t.shape[2], l->state.t.shape[3]});
    attnd_tt_fill_normal(cache, r, 1.0, 1.0);
    memcpy(cache->buf, l->state.buf, (size_t)(H * de) * sizeof(float));
    memcpy((float *)cache->buf + 3 * H * de, (float *)l->state.buf + H * de,
           (size_t)(H * de) * sizeof(float));
    attnd_tensor view = cache->t;
    view.shape[0] = 2;
    view.strides[0] = 3 * cache->t.strides[0];
    return view;
}

/* Prefill writes its state straight into cache slots 0 and 3 (a strided kv_state view), then
 * decode steps continue both sequences through slot_idx {3, -1, 0}; slots 1, 2 and 4 must stay
 * bit-identical. */
Test(linear, prefill_then_decode, .timeout = 120)
{
    const int64_t H = 4, d = 64, e = 64, n = 300, steps = 5, slots = 5, slot_elems = H * d * e;
    static const int seq_of[3] = {1, -1, 0};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 44);
    lrun l; /* all n + steps tokens; the prefill sees the first n */
    lrun_alloc(&l, &r, 2, H, n + steps, d, e, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0);
    double *state = attnd_ref_state_load(&l.state.t);
    double *want = malloc((size_t)numel4(&l.out.t) * sizeof *want);
    attnd_ref_linear_prefill(&l.p, state, want);
    attnd_test_tensor cache, slot_idx;
    attnd_tensor view = cache_with_states(&cache, &l, slots, &r);
    float *before = malloc(cache.bytes);
    memcpy(before, cache.buf, cache.bytes);

    attnd_linear_prefill_params pp = l.p;
    pp.q = token_view(&l.q.t, 0, n), pp.k = token_view(&l.k.t, 0, n);
    pp.v = token_view(&l.v.t, 0, n), pp.out = token_view(&l.out.t, 0, n);
    pp.kv_state = view;
    attnd_tt_poison(&l.out);
    cr_assert_eq(attnd_linear_prefill(b, &pp), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    attnd_tt_alloc(&slot_idx, ATTND_DTYPE_I64, 1, (int64_t[]){3});
    memcpy(slot_idx.buf, (int64_t[]){3, -1, 0}, 3 * sizeof(int64_t));
    for (int64_t s = 0; s < steps; s++)
        decode_step(b, &l, seq_of, &cache.t, &slot_idx.t, n + s, &r);

    double err = attnd_ref_rel_err(&l.out, 1.0, want);
    cr_assert(err <= F32_TOL, "prefill + decode output rel err %g", err);
    double *got_state = attnd_ref_state_load(&view);
    cr_assert(attnd_rel_l2(got_state, state, 2 * slot_elems) <= F32_TOL, "final state");
    for (int64_t slot = 1; slot < slots; slot += slot == 2 ? 2 : 1)
        cr_assert(memcmp((float *)cache.buf + slot * slot_elems, before + slot * slot_elems,
                         (size_t)slot_elems * sizeof(float)) == 0,
                  "slot %lld changed", (long long)slot);
    free(got_state);
    free(state);
    free(want);
    free(before);
    attnd_tt_free(&cache);
    attnd_tt_free(&slot_idx);
    lrun_free(&l);
    attnd_backend_close(b);
}

typedef struct drun {
    attnd_test_tensor q, k, v, out, cache, idx, slopes;
    attnd_linear_decode_params p;
} drun;

/* rows decode rows of bf16 inputs against a random f32 cache of `slots` slots, i32 slot_idx. */
static void drun_alloc(drun *dr, attnd_rng *r, int64_t rows, int64_t H, int64_t d, int64_t e,
                       int64_t slots, const int32_t *slot_of)
{
    attnd_tt_alloc(&dr->q, ATTND_DTYPE_BF16, 3, (int64_t[]){rows, H, d});
    attnd_tt_alloc(&dr->k, ATTND_DTYPE_BF16, 3, (int64_t[]){rows, H, d});
    attnd_tt_alloc(&dr->v, ATTND_DTYPE_BF16, 3, (int64_t[]){rows, H, e});
    attnd_tt_alloc(&dr->out, ATTND_DTYPE_F32, 3, (int64_t[]){rows, H, e});
    attnd_tt_alloc(&dr->cache, ATTND_DTYPE_F32, 4, (int64_t[]){slots, H, d, e});
    attnd_tt_alloc(&dr->idx, ATTND_DTYPE_I32, 1, (int64_t[]){rows});
    memcpy(dr->idx.buf, slot_of, (size_t)rows * sizeof *slot_of);
    slopes_alloc(&dr->slopes, H);
    attnd_tt_fill_normal(&dr->q, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&dr->k, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&dr->v, r, SIGMA, 1.0);
    attnd_tt_fill_normal(&dr->cache, r, 1.0, 1.0);
    dr->p = (attnd_linear_decode_params){.q = dr->q.t,
                                         .k = dr->k.t,
                                         .v = dr->v.t,
                                         .out = dr->out.t,
                                         .slopes = dr->slopes.t,
                                         .kv_cache = dr->cache.t,
                                         .slot_idx = dr->idx.t};
}

static void drun_free(drun *dr)
{
    attnd_test_tensor *all[] = {&dr->q,     &dr->k,   &dr->v,     &dr->out,
                                &dr->cache, &dr->idx, &dr->slopes};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attnd_tt_free(all[i]);
}

/* Decode alone: i32 slots, bf16 inputs, against the reference step; unused slots stay
 * bit-identical. */
Test(linear, decode_slots, .timeout = 120)
{
    const int64_t rows = 4, H = 8, d = 128, e = 128, slot_elems = H * d * e;
    static const int32_t slot_of[4] = {5, -1, 2, 0};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 45);
    drun dr;
    drun_alloc(&dr, &r, rows, H, d, e, 6, slot_of);
    double *want_cache = attnd_ref_state_load(&dr.cache.t);
    double *want = malloc((size_t)(rows * H * e) * sizeof *want);
    attnd_ref_linear_decode(&dr.p, want_cache, want);
    attnd_tt_poison(&dr.out);
    float *old = malloc(dr.cache.bytes);
    memcpy(old, dr.cache.buf, dr.cache.bytes);
    cr_assert_eq(attnd_linear_decode(b, &dr.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    cr_assert(attnd_ref_rel_err(&dr.out, 1.0, want) <= F32_TOL, "decode output");
    cr_assert(attnd_ref_rel_err(&dr.cache, 1.0, want_cache) <= F32_TOL, "decode cache");
    for (int64_t slot = 1; slot <= 3; slot += 2) /* slots 1 and 3 are unused */
        cr_assert(memcmp((float *)dr.cache.buf + slot * slot_elems, old + slot * slot_elems,
                         (size_t)slot_elems * sizeof(float)) == 0,
                  "unused slot %lld changed", (long long)slot);
    free(old);
    free(want);
    free(want_cache);
    drun_free(&dr);
    attnd_backend_close(b);
}

Test(linear, strided_views, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 46);
    lrun l;
    lrun_alloc(&l, &r, 2, 2, 333, 96, 32, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 104);
    l.p.block_size = 128;
    prefill_check(b, &l, F32_TOL, "strided");
    lrun_free(&l);
    attnd_backend_close(b);
}

Test(linear, empty_prefill_keeps_state, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 47);
    lrun l;
    lrun_alloc(&l, &r, 1, 2, 0, 64, 64, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0);
    float *old = malloc(l.state.bytes);
    memcpy(old, l.state.buf, l.state.bytes);
    cr_assert_eq(attnd_linear_prefill(b, &l.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    cr_assert(memcmp(old, l.state.buf, l.state.bytes) == 0, "state changed");
    free(old);
    lrun_free(&l);
    attnd_backend_close(b);
}
