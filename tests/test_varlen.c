/* varlen attention (cpu) against the float64 reference: head sizes, GQA, causal bottom-right
 * alignment with Lq != Lk, empty and one-token sequences, additive bias, fp8 inputs and outputs,
 * strided views. Outputs are poisoned (NaN) before every run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ref_ops.h"
#include "testutil.h"
#include "suite.h"

#define MAX_BATCH 8

typedef struct vdesc {
    int64_t batch, hq, hk, d;
    int32_t lq[MAX_BATCH], lk[MAX_BATCH];
    attnd_dtype in_dt, out_dt, bias_dt;
    int causal, bias;
    int64_t pad; /* > d: rows of q/k/v/out padded to this many elements */
    float q_scale, k_scale, v_scale, p_scale, out_scale;
} vdesc;

typedef struct vrun {
    attnd_test_tensor q, k, v, out, cuq, cuk, bias;
    attnd_varlen_params p;
} vrun;

static void vrun_alloc(vrun *v, const vdesc *dc, attnd_rng *r)
{
    int fp8 = dc->in_dt == ATTND_DTYPE_FP8_E4M3;
    v->p = (attnd_varlen_params){.causal = dc->causal, .scale = 1.0f / sqrtf((float)dc->d)};
    attnd_tt_cu_seqlens(&v->cuq, dc->lq, dc->batch, &v->p.max_seqlen_q);
    attnd_tt_cu_seqlens(&v->cuk, dc->lk, dc->batch, &v->p.max_seqlen_k);
    int64_t tq = ((int32_t *)v->cuq.buf)[dc->batch], tk = ((int32_t *)v->cuk.buf)[dc->batch];
    int64_t qs[3] = {tq, dc->hq, dc->d}, ks[3] = {tk, dc->hk, dc->d};
    attnd_tt_alloc_padded(&v->q, dc->in_dt, 3, qs, dc->pad);
    attnd_tt_alloc_padded(&v->k, dc->in_dt, 3, ks, dc->pad);
    attnd_tt_alloc_padded(&v->v, dc->in_dt, 3, ks, dc->pad);
    attnd_tt_alloc_padded(&v->out, dc->out_dt, 3, qs, dc->pad);
    attnd_tt_fill_normal(&v->q, r, 1.0, fp8 ? dc->q_scale : 1.0);
    attnd_tt_fill_normal(&v->k, r, 1.0, fp8 ? dc->k_scale : 1.0);
    attnd_tt_fill_normal(&v->v, r, 1.0, fp8 ? dc->v_scale : 1.0);
    v->bias.buf = NULL;
    if (dc->bias) {
        int64_t bs[4] = {dc->batch, dc->hq, v->p.max_seqlen_q, v->p.max_seqlen_k};
        attnd_tt_alloc(&v->bias, dc->bias_dt, 4, bs);
        attnd_tt_fill_normal(&v->bias, r, 1.0, 1.0);
        v->p.bias = v->bias.t;
    }
    v->p.q = v->q.t, v->p.k = v->k.t, v->p.v = v->v.t, v->p.out = v->out.t;
    v->p.cu_seqlens_q = v->cuq.t, v->p.cu_seqlens_k = v->cuk.t;
    v->p.q_scale = dc->q_scale, v->p.k_scale = dc->k_scale, v->p.v_scale = dc->v_scale;
    v->p.p_scale = dc->p_scale, v->p.out_scale = dc->out_scale;
}

static void vrun_free(vrun *v)
{
    attnd_tt_free(&v->q);
    attnd_tt_free(&v->k);
    attnd_tt_free(&v->v);
    attnd_tt_free(&v->out);
    attnd_tt_free(&v->cuq);
    attnd_tt_free(&v->cuk);
    if (v->bias.buf) attnd_tt_free(&v->bias);
}

/* Run on a poisoned output; rel-L2 against the reference must be <= tol, and rows the reference
 * leaves at exactly zero (nothing visible) must be exactly zero. Returns the error. */
static double vrun_check(attnd_backend *b, vrun *v, double tol, const char *what)
{
    int64_t n = attnd_tensor_numel(&v->out.t);
    double *want = calloc((size_t)(n + 1), sizeof *want);
    double mul = v->out.t.dtype == ATTND_DTYPE_FP8_E4M3 ? v->p.out_scale : 1.0;
    attnd_tt_poison(&v->out);
    cr_assert_eq(attnd_varlen_attention(b, &v->p), ATTND_ERR_OK, "%s: %s", what,
                 attnd_backend_last_error(b));
    attnd_ref_varlen(&v->p, want);
    double err = attnd_ref_rel_err(&v->out, mul, want);
    cr_assert(err <= tol, "%s: rel err %g > %g", what, err, tol);
    int64_t bad = attnd_ref_zero_rows_differ(&v->out, want);
    cr_assert_eq(bad, -1, "%s: row %lld should be all zeros", what, (long long)bad);
    free(want);
    return err;
}

static vdesc vdesc_base(int64_t hq, int64_t hk, int64_t d)
{
    return (vdesc){.hq = hq,
                   .hk = hk,
                   .d = d,
                   .in_dt = ATTND_DTYPE_BF16,
                   .out_dt = ATTND_DTYPE_F32,
                   .bias_dt = ATTND_DTYPE_F32};
}

static void random_lens(vdesc *dc, attnd_rng *r, int64_t batch, int32_t max_len)
{
    dc->batch = batch;
    for (int64_t s = 0; s < batch; s++) {
        dc->lq[s] = (int32_t)attnd_rng_int(r, 1, max_len);
        dc->lk[s] = (int32_t)attnd_rng_int(r, 1, max_len);
    }
}

Test(varlen, head_sizes_gqa_causal, .timeout = 120)
{
    static const int64_t heads[] = {32, 80, 96, 112, 128, 192, 256};
    static const int64_t groups[] = {1, 4, 8};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 21);
    for (int i = 0; i < 7; i++)
        for (int causal = 0; causal < 2; causal++) {
            vdesc dc = vdesc_base(8, 8 / groups[(i + causal) % 3], heads[i]);
            dc.in_dt = (i + causal) % 2 ? ATTND_DTYPE_F16 : ATTND_DTYPE_BF16;
            dc.causal = causal;
            random_lens(&dc, &r, 3, 90);
            vrun v;
            char what[64];
            snprintf(what, sizeof what, "d=%lld causal=%d", (long long)heads[i], causal);
            vrun_alloc(&v, &dc, &r);
            vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), what);
            vrun_free(&v);
        }
    attnd_backend_close(b);
}

/* Query i of (Lq, Lk) sees keys j <= i + Lk - Lq: Lq > Lk leaves the first Lq - Lk rows empty
 * (zeros); empty and one-token sequences in the same batch. */
Test(varlen, causal_bottom_right_and_empty, .timeout = 120)
{
    static const int32_t pairs[][2] = {{5, 20}, {20, 5},  {1, 100}, {100, 100}, {0, 10},
                                       {10, 0}, {64, 65}, {1, 1},   {0, 0},     {130, 70}};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 22);
    for (int causal = 0; causal < 2; causal++) {
        vdesc dc = vdesc_base(4, 2, 64);
        dc.causal = causal;
        dc.batch = 5;
        for (int half = 0; half < 2; half++) {
            for (int s = 0; s < 5; s++) {
                dc.lq[s] = pairs[half * 5 + s][0];
                dc.lk[s] = pairs[half * 5 + s][1];
            }
            vrun v;
            vrun_alloc(&v, &dc, &r);
            vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), causal ? "causal" : "full");
            vrun_free(&v);
        }
    }
    attnd_backend_close(b);
}

/* Many tiles and key blocks per sequence: the online softmax across blocks. */
Test(varlen, long_sequences, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 23);
    vdesc dc = vdesc_base(8, 2, 128);
    dc.causal = 1;
    dc.batch = 2;
    dc.lq[0] = 300, dc.lk[0] = 300, dc.lq[1] = 77, dc.lk[1] = 333;
    vrun v;
    vrun_alloc(&v, &dc, &r);
    vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "long");
    vrun_free(&v);
    attnd_backend_close(b);
}

Test(varlen, output_dtypes, .timeout = 120)
{
    static const attnd_dtype outs[] = {ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 24);
    for (int i = 0; i < 2; i++) {
        vdesc dc = vdesc_base(4, 1, 128);
        dc.out_dt = outs[i];
        dc.in_dt = outs[i];
        dc.causal = 1;
        random_lens(&dc, &r, 4, 70);
        vrun v;
        vrun_alloc(&v, &dc, &r);
        vrun_check(b, &v, attnd_tol_for(outs[i]), attnd_dtype_name(outs[i]));
        vrun_free(&v);
    }
    attnd_backend_close(b);
}

/* Bias is added to the scaled logits (not multiplied by scale), per sequence. */
Test(varlen, bias, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 25);
    for (int causal = 0; causal < 2; causal++) {
        vdesc dc = vdesc_base(4, 2, 96);
        dc.causal = causal;
        dc.bias = 1;
        dc.bias_dt = causal ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F32;
        random_lens(&dc, &r, 3, 80);
        vrun v;
        vrun_alloc(&v, &dc, &r);
        vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "bias");
        /* a bias row of -inf masks the whole row: zeros, never NaN */
        for (int64_t j = 0; j < v.p.max_seqlen_k; j++)
            attnd_tt_set(&v.bias, (int64_t[]){1, 3, 0, j}, -INFINITY);
        vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "bias -inf row");
        vrun_free(&v);
    }
    attnd_backend_close(b);
}

/* Bias must reach the logits unscaled: with a large scale-free bias the result differs from the
 * no-bias result, and matches the reference. */
Test(varlen, bias_changes_result, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 26);
    vdesc dc = vdesc_base(2, 2, 64);
    dc.bias = 1;
    random_lens(&dc, &r, 2, 40);
    vrun v;
    vrun_alloc(&v, &dc, &r);
    vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "bias");
    int64_t n = attnd_tensor_numel(&v.out.t);
    double *with_bias = attnd_tt_to_f64(&v.out);
    v.p.bias.data = NULL;
    vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "no bias");
    double *without = attnd_tt_to_f64(&v.out);
    cr_assert(attnd_rel_l2(with_bias, without, n) > 0.05, "bias had no visible effect");
    free(with_bias);
    free(without);
    vrun_free(&v);
    attnd_backend_close(b);
}

static vdesc fp8_desc(float p_scale)
{
    vdesc dc = vdesc_base(4, 2, 128);
    dc.in_dt = ATTND_DTYPE_FP8_E4M3;
    dc.q_scale = 0.02f, dc.k_scale = 0.015f, dc.v_scale = 0.03f, dc.p_scale = p_scale;
    dc.causal = 1;
    return dc;
}

/* Rows within one key block (Lk <= 64): P is quantised against the same maximum as the
 * reference's, so fp8 P must match tightly; forgetting p_scale or a scale costs > 1e-2. */
Test(varlen, fp8_inputs_one_block_exact_p, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 27);
    static const float p_scales[] = {1.0f / 448.0f, 1.0f, 1.0f / 300.0f};
    for (int i = 0; i < 3; i++) {
        vdesc dc = fp8_desc(p_scales[i]);
        random_lens(&dc, &r, 4, 64);
        vrun v;
        vrun_alloc(&v, &dc, &r);
        vrun_check(b, &v, 5e-3, "fp8 one block");
        vrun_free(&v);
    }
    attnd_backend_close(b);
}

/* One key, p = 1: the output is v * fp8(1 / p_scale) * p_scale exactly (300 rounds to 288). */
Test(varlen, fp8_p_quantisation_single_key, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 28);
    vdesc dc = fp8_desc(1.0f / 300.0f);
    dc.batch = 1, dc.lq[0] = 1, dc.lk[0] = 1;
    vrun v;
    vrun_alloc(&v, &dc, &r);
    vrun_check(b, &v, 1e-6, "single key");
    for (int64_t h = 0; h < 4; h++)
        for (int64_t c = 0; c < 128; c++) {
            double got = attnd_tt_get(&v.out, (int64_t[]){0, h, c});
            double want = attnd_tt_get(&v.v, (int64_t[]){0, h / 2, c}) * 0.03 * 288.0 / 300.0;
            cr_assert(fabs(got - want) <= 1e-6 * (1 + fabs(want)), "%g != %g", got, want);
        }
    vrun_free(&v);
    attnd_backend_close(b);
}

/* Longer rows quantise P against running block maxima, the reference against the row's: within
 * fp8 tolerance. fp8 output stores o / out_scale. */
Test(varlen, fp8_inputs_and_output, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 29);
    for (int fp8_out = 0; fp8_out < 2; fp8_out++) {
        vdesc dc = fp8_desc(1.0f / 448.0f);
        dc.bias = fp8_out;
        if (fp8_out) dc.out_dt = ATTND_DTYPE_FP8_E4M3, dc.out_scale = 0.004f;
        random_lens(&dc, &r, 3, 200);
        vrun v;
        vrun_alloc(&v, &dc, &r);
        vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_FP8_E4M3), fp8_out ? "fp8 out" : "fp8 in");
        vrun_free(&v);
    }
    attnd_backend_close(b);
}

Test(varlen, strided_rows, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 30);
    vdesc dc = vdesc_base(8, 1, 80);
    dc.pad = 88;
    dc.causal = 1;
    dc.bias = 1;
    random_lens(&dc, &r, 3, 70);
    vrun v;
    vrun_alloc(&v, &dc, &r);
    vrun_check(b, &v, attnd_tol_for(ATTND_DTYPE_F32), "strided");
    vrun_free(&v);
    attnd_backend_close(b);
}
