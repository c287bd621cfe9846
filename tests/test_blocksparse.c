/* block-sparse attention (cpu) against the float64 reference: prefill and decode, a layout like
 * the anchors' (local blocks + vertical stride with a per-head offset) and random layouts (empty
 * rows, missing diagonals), q_block_size != block_size, GQA, head sizes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ref_ops.h"
#include "testutil.h"
#include "suite.h"

#define MAX_BATCH 8

typedef struct bdesc {
    int64_t batch, hq, hk, d;
    int32_t lq[MAX_BATCH], lk[MAX_BATCH];
    int32_t block_size, q_block_size;
    attnd_dtype in_dt, out_dt;
    int random_layout; /* 0: local + vertical stride (anchors), 1: random */
    int32_t local, vert;
} bdesc;

typedef struct brun {
    attnd_test_tensor q, k, v, out, cuq, cuk, crow, col;
    attnd_blocksparse_params p;
} brun;

/* Does a row of head h whose diagonal key block is diag list key block kb <= diag? */
static int layout_pick(const bdesc *dc, attnd_rng *r, int64_t h, int64_t kb, int64_t diag)
{
    if (dc->random_layout) return attnd_rng_uniform(r, 0, 1) < 0.4;
    return diag - kb < dc->local || (kb + h + 1) % dc->vert == 0;
}

/* CSR layout over rows row blocks: crow [hq, rows + 1], col [hq, width] padded with zeros. */
static void layout_build(brun *br, const bdesc *dc, attnd_rng *r, int64_t rows)
{
    int64_t qbs = dc->q_block_size ? dc->q_block_size : dc->block_size;
    int64_t cap = rows * (rows * qbs / dc->block_size + 2);
    int32_t *cols = calloc((size_t)(dc->hq * cap + 1), sizeof *cols);
    int64_t cs[2] = {dc->hq, rows + 1}, width = 1;
    attnd_tt_alloc(&br->crow, ATTND_DTYPE_I32, 2, cs);
    int32_t *crow = br->crow.buf;
    for (int64_t h = 0; h < dc->hq; h++) {
        int64_t n = 0;
        for (int64_t qb = 0; qb < rows; qb++) {
            int64_t diag = ((qb + 1) * qbs - 1) / dc->block_size;
            crow[h * (rows + 1) + qb] = (int32_t)n;
            for (int64_t kb = 0; kb <= diag; kb++)
                if (layout_pick(dc, r, h, kb, diag)) cols[h * cap + n++] = (int32_t)kb;
        }
        crow[h * (rows + 1) + rows] = (int32_t)n;
        width = n > width ? n : width;
    }
    int64_t ws[2] = {dc->hq, width};
    attnd_tt_alloc(&br->col, ATTND_DTYPE_I32, 2, ws);
    for (int64_t h = 0; h < dc->hq; h++)
        for (int64_t c = 0; c < crow[h * (rows + 1) + rows]; c++)
            ((int32_t *)br->col.buf)[h * width + c] = cols[h * cap + c];
    free(cols);
}

static void brun_alloc(brun *br, const bdesc *dc, attnd_rng *r)
{
    br->p = (attnd_blocksparse_params){.block_size = dc->block_size,
                                       .q_block_size = dc->q_block_size,
                                       .scale = 1.0f / sqrtf((float)dc->d)};
    attnd_tt_cu_seqlens(&br->cuq, dc->lq, dc->batch, &br->p.max_seqlen_q);
    attnd_tt_cu_seqlens(&br->cuk, dc->lk, dc->batch, &br->p.max_seqlen_k);
    int64_t tq = ((int32_t *)br->cuq.buf)[dc->batch], tk = ((int32_t *)br->cuk.buf)[dc->batch];
    int64_t qs[3] = {tq, dc->hq, dc->d}, ks[3] = {tk, dc->hk, dc->d};
    attnd_tt_alloc(&br->q, dc->in_dt, 3, qs);
    attnd_tt_alloc(&br->k, dc->in_dt, 3, ks);
    attnd_tt_alloc(&br->v, dc->in_dt, 3, ks);
    attnd_tt_alloc(&br->out, dc->out_dt, 3, qs);
    attnd_tt_fill_normal(&br->q, r, 1.0, 1.0);
    attnd_tt_fill_normal(&br->k, r, 1.0, 1.0);
    attnd_tt_fill_normal(&br->v, r, 1.0, 1.0);
    int64_t qbs = dc->q_block_size ? dc->q_block_size : dc->block_size;
    layout_build(br, dc, r, (br->p.max_seqlen_k + qbs - 1) / qbs + 1);
    br->p.q = br->q.t, br->p.k = br->k.t, br->p.v = br->v.t, br->p.out = br->out.t;
    br->p.cu_seqlens_q = br->cuq.t, br->p.cu_seqlens_k = br->cuk.t;
    br->p.layout_crow = br->crow.t, br->p.layout_col = br->col.t;
}

static void brun_free(brun *br)
{
    attnd_test_tensor *all[] = {&br->q,   &br->k,   &br->v,    &br->out,
                                &br->cuq, &br->cuk, &br->crow, &br->col};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        attnd_tt_free(all[i]);
}

static void brun_check(attnd_backend *b, brun *br, double tol, const char *what)
{
    int64_t n = attnd_tensor_numel(&br->out.t);
    double *want = calloc((size_t)(n + 1), sizeof *want);
    attnd_tt_poison(&br->out);
    cr_assert_eq(attnd_blocksparse_attention(b, &br->p), ATTND_ERR_OK, "%s: %s", what,
                 attnd_backend_last_error(b));
    attnd_ref_blocksparse(&br->p, want);
    double err = attnd_ref_rel_err(&br->out, 1.0, want);
    cr_assert(err <= tol, "%s: rel err %g > %g", what, err, tol);
    int64_t bad = attnd_ref_zero_rows_differ(&br->out, want);
    cr_assert_eq(bad, -1, "%s: row %lld should be all zeros", what, (long long)bad);
    free(want);
}

static bdesc bdesc_base(int64_t hq, int64_t hk, int64_t d, int32_t bs)
{
    return (bdesc){.hq = hq,
                   .hk = hk,
                   .d = d,
                   .block_size = bs,
                   .in_dt = ATTND_DTYPE_BF16,
                   .out_dt = ATTND_DTYPE_F32,
                   .local = 4,
                   .vert = 3};
}

Test(blocksparse, prefill_local_vertical_layout, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 31);
    bdesc dc = bdesc_base(4, 2, 128, 64);
    dc.batch = 4;
    int32_t lens[4] = {600, 64, 1, 201};
    for (int s = 0; s < 4; s++)
        dc.lq[s] = dc.lk[s] = lens[s];
    brun br;
    brun_alloc(&br, &dc, &r);
    brun_check(b, &br, attnd_tol_for(ATTND_DTYPE_F32), "prefill anchors layout");
    brun_free(&br);
    attnd_backend_close(b);
}

Test(blocksparse, decode_local_vertical_layout, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 32);
    bdesc dc = bdesc_base(8, 1, 96, 32);
    dc.batch = 5;
    int32_t past[5] = {0, 31, 32, 500, 257};
    for (int s = 0; s < 5; s++)
        dc.lq[s] = 1, dc.lk[s] = past[s] + 1;
    brun br;
    brun_alloc(&br, &dc, &r);
    brun_check(b, &br, attnd_tol_for(ATTND_DTYPE_F32), "decode");
    brun_free(&br);
    attnd_backend_close(b);
}

/* Random layouts: empty rows give zeros; rows without their diagonal block still mask causally;
 * q_block_size both above and below block_size; prefill and decode in one batch. */
Test(blocksparse, random_layouts, .timeout = 120)
{
    static const int32_t sizes[][2] = {{16, 32}, {64, 16}, {32, 0}, {128, 64}};
    static const int64_t heads[] = {32, 80, 192, 256};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 33);
    for (int i = 0; i < 4; i++) {
        bdesc dc = bdesc_base(4, i % 2 ? 4 : 1, heads[i], sizes[i][0]);
        dc.q_block_size = sizes[i][1];
        dc.random_layout = 1;
        dc.in_dt = i % 2 ? ATTND_DTYPE_F16 : ATTND_DTYPE_BF16;
        dc.batch = 4;
        for (int s = 0; s < 4; s++) {
            dc.lk[s] = (int32_t)attnd_rng_int(&r, 1, 300);
            dc.lq[s] = s % 2 ? 1 : dc.lk[s];
        }
        brun br;
        char what[64];
        snprintf(what, sizeof what, "random layout bs=%d qbs=%d", sizes[i][0], sizes[i][1]);
        brun_alloc(&br, &dc, &r);
        brun_check(b, &br, attnd_tol_for(ATTND_DTYPE_F32), what);
        brun_free(&br);
    }
    attnd_backend_close(b);
}

/* A layout listing every block up to the diagonal is dense causal attention: compare with the
 * varlen op on the same inputs. */
Test(blocksparse, full_layout_equals_causal_varlen, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 34);
    bdesc dc = bdesc_base(4, 2, 64, 16);
    dc.local = 1 << 20;
    dc.batch = 3;
    int32_t lens[3] = {100, 17, 1};
    for (int s = 0; s < 3; s++)
        dc.lq[s] = dc.lk[s] = lens[s];
    brun br;
    brun_alloc(&br, &dc, &r);
    brun_check(b, &br, attnd_tol_for(ATTND_DTYPE_F32), "full layout");
    double *sparse = attnd_tt_to_f64(&br.out);
    attnd_test_tensor out2;
    attnd_tt_alloc(&out2, ATTND_DTYPE_F32, 3, br.out.t.shape);
    attnd_tt_poison(&out2);
    attnd_varlen_params vp = {.q = br.q.t,
                              .k = br.k.t,
                              .v = br.v.t,
                              .out = out2.t,
                              .cu_seqlens_q = br.cuq.t,
                              .cu_seqlens_k = br.cuk.t,
                              .max_seqlen_q = br.p.max_seqlen_q,
                              .max_seqlen_k = br.p.max_seqlen_k,
                              .causal = 1,
                              .scale = br.p.scale};
    cr_assert_eq(attnd_varlen_attention(b, &vp), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    double err = attnd_ref_rel_err(&out2, 1.0, sparse);
    cr_assert(err <= 1e-6, "blocksparse vs varlen: %g", err);
    free(sparse);
    attnd_tt_free(&out2);
    brun_free(&br);
    attnd_backend_close(b);
}

Test(blocksparse, bf16_output, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 35);
    bdesc dc = bdesc_base(2, 1, 112, 64);
    dc.out_dt = ATTND_DTYPE_BF16;
    dc.batch = 2;
    dc.lq[0] = dc.lk[0] = 250;
    dc.lq[1] = 1, dc.lk[1] = 190;
    brun br;
    brun_alloc(&br, &dc, &r);
    brun_check(b, &br, attnd_tol_for(ATTND_DTYPE_BF16), "bf16 out");
    brun_free(&br);
    attnd_backend_close(b);
}
