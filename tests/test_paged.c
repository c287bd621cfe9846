/* Paged attention, 2D and 3D (split-KV + reduce), on the CPU backend against the float64 naive
 * reference (support/ref_paged.c): fresh random inputs on many small shapes, every dtype pair,
 * masks, logit transforms and sinks, strided views, shuffled block tables, 3D = 2D for every
 * segment count, and empty segments marked in the workspace. Outputs and workspaces are poisoned
 * (NaN) before each run, and the cache holds NaN wherever no key lives, so a kernel that writes too
 * little or reads too much fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/kernels.h"
#include "ref_paged.h"
#include "testutil.h"
#include "suite.h"

#define MAX_SEQS 8
#define SPARE_BLOCKS 3 /* blocks no table uses: stay NaN */

enum { LAYOUT_DENSE, LAYOUT_PADDED, LAYOUT_TRANSPOSED };
enum { BATCH_DECODE, BATCH_PREFILL, BATCH_CHUNKED, BATCH_MIXED };

typedef struct pcase {
    int32_t num_seqs;
    int32_t qlen[MAX_SEQS], ctx[MAX_SEQS]; /* seq_len = ctx + qlen */
    int32_t hq, hkv, d, bs;
    attnd_dtype qdt, cdt, odt;
    int32_t window;
    float softcap;
    int alibi, lse;
    int sinks;     /* one sink logit per q head (head 0's -inf, i.e. none, when sinks == 2) */
    int layout;    /* q, out and out_lse: dense, padded rows, or heads-outer (transposed) */
    int cache_hnd; /* caches stored [blocks][kv_heads][block_size][d] (strided view) */
    float k_scale, v_scale;
    double q_sigma;
} pcase;

typedef struct pbufs {
    attnd_test_tensor q, k, v, out, lse, bt, sl, qsl, alibi, sinks;
    attnd_paged_params p;
    int64_t num_tokens, max_blocks;
} pbufs;

static const attnd_dtype QDT[3] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
static const attnd_dtype CDT[4] = {ATTND_DTYPE_F16, ATTND_DTYPE_BF16, ATTND_DTYPE_FP8_E4M3,
                                   ATTND_DTYPE_F32};

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static void case_defaults(pcase *c)
{
    memset(c, 0, sizeof *c);
    c->hq = 4;
    c->hkv = 2;
    c->d = 64;
    c->bs = 16;
    c->qdt = ATTND_DTYPE_BF16;
    c->cdt = ATTND_DTYPE_BF16;
    c->odt = ATTND_DTYPE_F32;
    c->lse = 1;
    c->k_scale = 0.37f;
    c->v_scale = 1.9f;
    c->q_sigma = 1.5;
}

/* Sequence lengths for a batch kind; mixed batches also get sequences with no queries. */
static void case_batch(pcase *c, attnd_rng *r, int kind)
{
    c->num_seqs = (int32_t)attnd_rng_int(r, 1, 5);
    for (int32_t s = 0; s < c->num_seqs; s++) {
        int k = kind == BATCH_MIXED ? (int)attnd_rng_int(r, 0, 3) : kind;
        switch (k) {
        case BATCH_DECODE:
            c->qlen[s] = 1, c->ctx[s] = (int32_t)attnd_rng_int(r, 0, 120);
            break;
        case BATCH_PREFILL:
            c->qlen[s] = (int32_t)attnd_rng_int(r, 1, 70), c->ctx[s] = 0;
            break;
        case BATCH_CHUNKED:
            c->qlen[s] = (int32_t)attnd_rng_int(r, 2, 45);
            c->ctx[s] = (int32_t)attnd_rng_int(r, 1, 90);
            break;
        default:
            c->qlen[s] = 0, c->ctx[s] = (int32_t)attnd_rng_int(r, 0, 50);
            break;
        }
    }
}

static void describe(const pcase *c, char *buf, size_t n)
{
    int k = snprintf(buf, n,
                     "hq=%d hkv=%d d=%d bs=%d q=%s cache=%s out=%s win=%d cap=%g alibi=%d "
                     "sinks=%d layout=%d hnd=%d seqs(q/ctx):",
                     c->hq, c->hkv, c->d, c->bs, attnd_dtype_name(c->qdt), attnd_dtype_name(c->cdt),
                     attnd_dtype_name(c->odt), c->window, c->softcap, c->alibi, c->sinks, c->layout,
                     c->cache_hnd);
    for (int32_t s = 0; s < c->num_seqs && k > 0 && (size_t)k < n; s++)
        k += snprintf(buf + k, n - (size_t)k, " %d/%d", c->qlen[s], c->ctx[s]);
}

/* ---------------------------------------------------------------- building inputs */

/* [a, b, c] in one of the layouts (transposed: stored [b][a][c], viewed [a][b][c]). */
static void alloc_rows(attnd_test_tensor *tt, attnd_dtype dt, int64_t a, int64_t b, int64_t c,
                       int layout)
{
    int64_t shape[3] = {a, b, c}, stored[3] = {b, a, c};
    if (layout == LAYOUT_PADDED) {
        attnd_tt_alloc_padded(tt, dt, 3, shape, c + 8);
    } else if (layout == LAYOUT_TRANSPOSED) {
        attnd_tt_alloc(tt, dt, 3, stored);
        tt->t.shape[0] = a, tt->t.shape[1] = b;
        tt->t.strides[0] = c, tt->t.strides[1] = a * c;
    } else {
        attnd_tt_alloc(tt, dt, 3, shape);
    }
}

/* out_lse [hq, tokens]: transposed stores it token-major, padded pads each head's row. */
static void alloc_lse(attnd_test_tensor *tt, int64_t hq, int64_t tokens, int layout)
{
    int64_t shape[2] = {hq, tokens}, stored[2] = {tokens, hq};
    if (layout == LAYOUT_PADDED) {
        attnd_tt_alloc_padded(tt, ATTND_DTYPE_F32, 2, shape, tokens + 3);
    } else if (layout == LAYOUT_TRANSPOSED) {
        attnd_tt_alloc(tt, ATTND_DTYPE_F32, 2, stored);
        tt->t.shape[0] = hq, tt->t.shape[1] = tokens;
        tt->t.strides[0] = 1, tt->t.strides[1] = hq;
    } else {
        attnd_tt_alloc(tt, ATTND_DTYPE_F32, 2, shape);
    }
}

/* A cache poisoned with NaN; hnd stores heads outside block rows (vLLM's HND layout). */
static void alloc_cache(attnd_test_tensor *tt, const pcase *c, int64_t num_blocks)
{
    int64_t shape[4] = {num_blocks, c->bs, c->hkv, c->d};
    int64_t stored[4] = {num_blocks, c->hkv, c->bs, c->d};
    attnd_tt_alloc(tt, c->cdt, 4, c->cache_hnd ? stored : shape);
    if (c->cache_hnd) {
        memcpy(tt->t.shape, shape, sizeof shape);
        tt->t.strides[1] = c->d;
        tt->t.strides[2] = c->bs * c->d;
    }
    attnd_tt_poison(tt);
}

static void alloc_index(attnd_test_tensor *tt, int64_t n)
{
    attnd_tt_alloc(tt, ATTND_DTYPE_I32, 1, &n);
}

/* Block tables over a shuffled set of physical blocks; entries past a sequence's last block are
 * garbage that nothing may read. Returns the number of physical blocks. */
static int64_t build_tables(pbufs *pb, const pcase *c, attnd_rng *r)
{
    int64_t nb = SPARE_BLOCKS, used = 0, maxb = 1;
    for (int32_t s = 0; s < c->num_seqs; s++) {
        int64_t blocks = cdiv(c->ctx[s] + c->qlen[s], c->bs);
        nb += blocks;
        maxb = blocks + 1 > maxb ? blocks + 1 : maxb;
    }
    int32_t *perm = malloc((size_t)nb * sizeof *perm);
    for (int64_t i = 0; i < nb; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = nb - 1; i > 0; i--) {
        int64_t k = attnd_rng_int(r, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[k], perm[k] = t;
    }
    int64_t shape[2] = {c->num_seqs, maxb};
    attnd_tt_alloc(&pb->bt, ATTND_DTYPE_I32, 2, shape);
    for (int32_t s = 0; s < c->num_seqs; s++) {
        int64_t blocks = cdiv(c->ctx[s] + c->qlen[s], c->bs);
        for (int64_t j = 0; j < maxb; j++)
            ((int32_t *)pb->bt.buf)[s * maxb + j] = j < blocks ? perm[used++] : 0x7ffffff0;
    }
    free(perm);
    pb->max_blocks = maxb;
    return nb;
}

/* Random keys and values at every live key position, stored as x / scale for fp8. */
static void fill_cache(pbufs *pb, const pcase *c, attnd_rng *r)
{
    int fp8 = c->cdt == ATTND_DTYPE_FP8_E4M3;
    for (int32_t s = 0; s < c->num_seqs; s++) {
        for (int64_t j = 0; j < c->ctx[s] + c->qlen[s]; j++) {
            int64_t blk = ((int32_t *)pb->bt.buf)[s * pb->max_blocks + j / c->bs];
            for (int64_t kh = 0; kh < c->hkv; kh++) {
                for (int64_t e = 0; e < c->d; e++) {
                    int64_t idx[4] = {blk, j % c->bs, kh, e};
                    attnd_tt_set(&pb->k, idx, attnd_rng_normal(r) / (fp8 ? c->k_scale : 1.0));
                    attnd_tt_set(&pb->v, idx, attnd_rng_normal(r) / (fp8 ? c->v_scale : 1.0));
                }
            }
        }
    }
}

static void build_lengths(pbufs *pb, const pcase *c, attnd_rng *r)
{
    int32_t max_q = 0, max_s = 0, t = 0;
    alloc_index(&pb->sl, c->num_seqs);
    alloc_index(&pb->qsl, c->num_seqs + 1);
    for (int32_t s = 0; s < c->num_seqs; s++) {
        ((int32_t *)pb->qsl.buf)[s] = t;
        ((int32_t *)pb->sl.buf)[s] = c->ctx[s] + c->qlen[s];
        t += c->qlen[s];
        max_q = c->qlen[s] > max_q ? c->qlen[s] : max_q;
        max_s = c->ctx[s] + c->qlen[s] > max_s ? c->ctx[s] + c->qlen[s] : max_s;
    }
    ((int32_t *)pb->qsl.buf)[c->num_seqs] = t;
    pb->num_tokens = t;
    pb->p.max_query_len = max_q;
    pb->p.max_seq_len = max_s;
    if (c->alibi) {
        int64_t n = c->hq;
        attnd_tt_alloc(&pb->alibi, ATTND_DTYPE_F32, 1, &n);
        for (int64_t h = 0; h < n; h++)
            attnd_tt_set(&pb->alibi, &h, attnd_rng_uniform(r, .02, .8));
    }
    if (c->sinks) {
        /* around the logits' own range, so that some heads' sinks dominate and some barely
         * count */
        int64_t n = c->hq;
        attnd_tt_alloc(&pb->sinks, ATTND_DTYPE_F32, 1, &n);
        for (int64_t h = 0; h < n; h++)
            attnd_tt_set(&pb->sinks, &h, attnd_rng_uniform(r, -3.0, 4.0));
        if (c->sinks == 2) ((float *)pb->sinks.buf)[0] = -INFINITY;
    }
}

static void pb_build(pbufs *pb, const pcase *c, attnd_rng *r)
{
    memset(pb, 0, sizeof *pb);
    build_lengths(pb, c, r);
    int64_t nb = build_tables(pb, c, r), T = pb->num_tokens;
    alloc_cache(&pb->k, c, nb);
    alloc_cache(&pb->v, c, nb);
    fill_cache(pb, c, r);
    alloc_rows(&pb->q, c->qdt, T, c->hq, c->d, c->layout);
    attnd_tt_fill_normal(&pb->q, r, c->q_sigma, 1.0);
    alloc_rows(&pb->out, c->odt, T, c->hq, c->d, c->layout);
    if (c->lse) alloc_lse(&pb->lse, c->hq, T, c->layout);
    attnd_paged_params *p = &pb->p;
    p->q = pb->q.t, p->k_cache = pb->k.t, p->v_cache = pb->v.t, p->out = pb->out.t;
    p->out_lse = pb->lse.t, p->block_tables = pb->bt.t, p->seq_lens = pb->sl.t;
    p->query_start_loc = pb->qsl.t, p->alibi_slopes = pb->alibi.t, p->sinks = pb->sinks.t;
    p->scale = (float)(1.0 / sqrt((double)c->d));
    p->k_scale = c->k_scale, p->v_scale = c->v_scale;
    p->softcap = c->softcap, p->sliding_window = c->window;
}

static void pb_free(pbufs *pb)
{
    attnd_test_tensor *all[] = {&pb->q,  &pb->k,  &pb->v,   &pb->out,   &pb->lse,
                                &pb->bt, &pb->sl, &pb->qsl, &pb->alibi, &pb->sinks};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        attnd_tt_free(all[i]);
}

/* ---------------------------------------------------------------- running and checking */

static void run_2d(attnd_backend *b, pbufs *pb)
{
    attnd_tt_poison(&pb->out);
    if (pb->lse.buf) attnd_tt_poison(&pb->lse);
    attnd_err rv = attnd_paged_attention_2d(b, &pb->p);
    cr_assert_eq(rv, ATTND_ERR_OK, "2d: %s (%s)", attnd_err_name(rv), attnd_backend_last_error(b));
}

/* Runs the 3D form; returns the workspace (caller frees) for inspection. */
static float *run_3d(attnd_backend *b, pbufs *pb, int32_t nseg)
{
    size_t bytes =
        attnd_paged_3d_workspace_size(pb->num_tokens, pb->p.q.shape[1], pb->p.q.shape[2], nseg);
    void *ws = NULL;
    /* at least one line even for zero tokens: a zero-byte allocation may be NULL */
    cr_assert_eq(attnd_backend_alloc(b, bytes > 64 ? bytes : 64, &ws), ATTND_ERR_OK);
    memset(ws, 0xff, bytes);
    attnd_tt_poison(&pb->out);
    if (pb->lse.buf) attnd_tt_poison(&pb->lse);
    attnd_err rv = attnd_paged_attention_3d(b, &pb->p, nseg, ws);
    cr_assert_eq(rv, ATTND_ERR_OK, "3d/%d: %s (%s)", nseg, attnd_err_name(rv),
                 attnd_backend_last_error(b));
    return ws;
}

/* Padding of padded views must still hold the poison (nothing written outside the view). */
static void expect_padding_untouched(const attnd_test_tensor *tt, const char *what)
{
    const attnd_tensor *t = &tt->t;
    int32_t last = t->ndim - 1;
    int64_t rows = attnd_tensor_numel(t) / (t->shape[last] > 0 ? t->shape[last] : 1);
    int64_t pad = t->ndim == 3 ? t->strides[1] : t->strides[0];
    size_t es = attnd_dtype_size(t->dtype);
    for (int64_t row = 0; row < rows && t->shape[last] > 0; row++)
        for (int64_t e = t->shape[last]; e < pad; e++)
            for (size_t k = 0; k < es; k++)
                cr_assert_eq(((unsigned char *)tt->buf)[(size_t)(row * pad + e) * es + k], 0xff,
                             "%s: padding written at row %lld", what, (long long)row);
}

/* Each (token, head) row within tol of the reference (relative L2), and LSE close. */
static void expect_matches(const pbufs *pb, const pcase *c, const double *ref, const double *rlse,
                           double tol, const char *what)
{
    char desc[512];
    int64_t T = pb->num_tokens, d = c->d;
    double *o = attnd_tt_to_f64(&pb->out);
    describe(c, desc, sizeof desc);
    for (int64_t row = 0; row < T * c->hq; row++) {
        double err = attnd_rel_l2(o + row * d, ref + row * d, d);
        cr_assert(err <= tol, "%s: token %lld head %lld: rel L2 %g > %g [%s]", what,
                  (long long)(row / c->hq), (long long)(row % c->hq), err, tol, desc);
    }
    free(o);
    if (c->lse) {
        double *l = attnd_tt_to_f64(&pb->lse);
        for (int64_t i = 0; i < T * c->hq; i++) {
            int ok = isinf(rlse[i]) ? l[i] == rlse[i]
                                    : fabs(l[i] - rlse[i]) <= 1e-5 * (1 + fabs(rlse[i]));
            cr_assert(ok, "%s: lse[%lld][%lld] = %g, expected %g [%s]", what, (long long)(i / T),
                      (long long)(i % T), l[i], rlse[i], desc);
        }
        free(l);
    }
    if (c->layout == LAYOUT_PADDED) {
        expect_padding_untouched(&pb->out, what);
        if (c->lse) expect_padding_untouched(&pb->lse, what);
    }
}

/* Build a fresh case, run 2D and 3D with each listed segment count, compare with the reference. */
static void check_case(attnd_backend *b, const pcase *c, uint64_t seed, const int32_t *segs,
                       int nsegs)
{
    attnd_rng r;
    pbufs pb;
    attnd_rng_seed(&r, seed);
    pb_build(&pb, c, &r);
    int64_t n = pb.num_tokens * c->hq;
    double *ref = calloc((size_t)(n * c->d + 1), sizeof *ref);
    double *rlse = calloc((size_t)(n + 1), sizeof *rlse);
    attnd_ref_paged(&pb.p, ref, rlse);
    double tol = attnd_tol_for(c->odt);
    run_2d(b, &pb);
    expect_matches(&pb, c, ref, rlse, tol, "2d");
    for (int i = 0; i < nsegs; i++) {
        char what[32];
        snprintf(what, sizeof what, "3d/%d segments", segs[i]);
        free(run_3d(b, &pb, segs[i]));
        expect_matches(&pb, c, ref, rlse, tol, what);
    }
    free(ref);
    free(rlse);
    pb_free(&pb);
}

static const int32_t SOME_SEGS[] = {1, 3, 16};
#define NSOME (int)(sizeof SOME_SEGS / sizeof *SOME_SEGS)

/* ---------------------------------------------------------------- coverage */

Test(paged, head_sizes, .timeout = 120)
{
    static const int32_t sizes[] = {32, 64, 80, 96, 112, 128, 192, 256};
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int i = 0; i < 8; i++) {
        attnd_rng r;
        pcase c;
        attnd_rng_seed(&r, 100 + (uint64_t)i);
        case_defaults(&c);
        case_batch(&c, &r, BATCH_MIXED);
        c.d = sizes[i];
        c.qdt = QDT[i % 3];
        c.cdt = CDT[(i / 3 + i) % 3];
        check_case(b, &c, 200 + (uint64_t)i, SOME_SEGS, NSOME);
    }
    attnd_backend_close(b);
}

Test(paged, block_sizes_and_gqa_ratios, .timeout = 120)
{
    static const int32_t bss[] = {16, 32, 64};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {8, 1}, {16, 2}, {3, 1}};
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int i = 0; i < 3; i++) {
        for (int g = 0; g < 5; g++) {
            attnd_rng r;
            pcase c;
            attnd_rng_seed(&r, 300 + (uint64_t)(i * 10 + g));
            case_defaults(&c);
            case_batch(&c, &r, BATCH_MIXED);
            c.bs = bss[i];
            c.hq = heads[g][0], c.hkv = heads[g][1];
            c.d = 32;
            check_case(b, &c, 400 + (uint64_t)(i * 10 + g), SOME_SEGS, NSOME);
        }
    }
    attnd_backend_close(b);
}

Test(paged, every_dtype_pair, .timeout = 120)
{
    static const attnd_dtype odts[3] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int qi = 0; qi < 3; qi++) {
        for (int ci = 0; ci < 4; ci++) {
            for (int oi = 0; oi < 3; oi++) {
                attnd_rng r;
                pcase c;
                uint64_t seed = 500 + (uint64_t)(qi * 12 + ci * 3 + oi);
                attnd_rng_seed(&r, seed);
                case_defaults(&c);
                case_batch(&c, &r, BATCH_MIXED);
                c.qdt = QDT[qi], c.cdt = CDT[ci], c.odt = odts[oi];
                c.sinks = (qi + ci + oi) % 2;
                c.d = 48;
                check_case(b, &c, seed + 1000, SOME_SEGS + 1, 1);
            }
        }
    }
    attnd_backend_close(b);
}

Test(paged, decode_prefill_chunked_and_mixed_batches, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int kind = BATCH_DECODE; kind <= BATCH_MIXED; kind++) {
        for (int i = 0; i < 4; i++) {
            attnd_rng r;
            pcase c;
            uint64_t seed = 700 + (uint64_t)(kind * 10 + i);
            attnd_rng_seed(&r, seed);
            case_defaults(&c);
            case_batch(&c, &r, kind);
            c.hq = 8, c.hkv = 2;
            c.cdt = CDT[i % 3];
            check_case(b, &c, seed + 1000, SOME_SEGS, NSOME);
        }
    }
    attnd_backend_close(b);
}

Test(paged, one_token_and_empty_sequences, .timeout = 120)
{
    /* seq_len 0; one token; cached context but no queries; a full block exactly; a short
     * chunk; a context of exactly one block plus one */
    static const int32_t q[] = {0, 1, 0, 1, 3, 1}, ctx[] = {0, 0, 37, 15, 13, 16};
    attnd_backend *b = attnd_test_open_cpu(3);
    pcase c;
    case_defaults(&c);
    c.num_seqs = 6;
    for (int s = 0; s < 6; s++)
        c.qlen[s] = q[s], c.ctx[s] = ctx[s];
    for (int w = 0; w < 3; w++) {
        c.window = w * 4;
        check_case(b, &c, 900 + (uint64_t)w, SOME_SEGS, NSOME);
    }
    /* no tokens at all: both forms succeed and touch nothing */
    c.num_seqs = 3;
    for (int s = 0; s < 3; s++)
        c.qlen[s] = 0;
    check_case(b, &c, 905, SOME_SEGS, NSOME);
    c.num_seqs = 0;
    check_case(b, &c, 906, SOME_SEGS, NSOME);
    attnd_backend_close(b);
}

Test(paged, sliding_window_softcap_and_alibi, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int f = 0; f < 8; f++) {
        for (int i = 0; i < 3; i++) {
            attnd_rng r;
            pcase c;
            uint64_t seed = 1000 + (uint64_t)(f * 10 + i);
            attnd_rng_seed(&r, seed);
            case_defaults(&c);
            case_batch(&c, &r, i == 0 ? BATCH_DECODE : BATCH_MIXED);
            c.window = (f & 1) ? (int32_t)attnd_rng_int(&r, 1, 40) : 0;
            c.softcap = (f & 2) ? (float)attnd_rng_uniform(&r, 1.0, 8.0) : 0.0f;
            c.alibi = (f & 4) != 0;
            c.q_sigma = (f & 2) ? 4.0 : 1.5; /* large logits, so the cap bites */
            c.cdt = CDT[i];
            check_case(b, &c, seed + 1000, SOME_SEGS, NSOME);
        }
    }
    attnd_backend_close(b);
}

/* Sinks alone and with every other option, on every cache dtype, 2D and 3D (the sink joins the
 * denominator once, after the segments merge). */
Test(paged, sinks_alone_and_with_every_option, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int f = 0; f < 8; f++) {
        for (int i = 0; i < 4; i++) {
            attnd_rng r;
            pcase c;
            uint64_t seed = 1100 + (uint64_t)(f * 10 + i);
            attnd_rng_seed(&r, seed);
            case_defaults(&c);
            case_batch(&c, &r, i == 0 ? BATCH_DECODE : BATCH_MIXED);
            c.sinks = 1 + (i & 1);
            c.window = (f & 1) ? (int32_t)attnd_rng_int(&r, 1, 40) : 0;
            c.softcap = (f & 2) ? (float)attnd_rng_uniform(&r, 1.0, 8.0) : 0.0f;
            c.alibi = (f & 4) != 0;
            c.q_sigma = (f & 2) ? 4.0 : 1.5;
            c.cdt = CDT[i];
            check_case(b, &c, seed + 1000, SOME_SEGS, NSOME);
        }
    }
    attnd_backend_close(b);
}

/* An f32 cache holds exactly what was written: with f32 queries and output the kernel is the
 * float64 reference up to f32 accumulation (far tighter than the bf16-cache bound). */
Test(paged, f32_cache_is_exact_f32, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int i = 0; i < 4; i++) {
        attnd_rng r;
        pcase c;
        pbufs pb;
        attnd_rng_seed(&r, 1150 + (uint64_t)i);
        case_defaults(&c);
        case_batch(&c, &r, BATCH_MIXED);
        c.qdt = c.odt = ATTND_DTYPE_F32, c.cdt = ATTND_DTYPE_F32;
        c.sinks = i & 1, c.window = (i & 2) ? 17 : 0;
        pb_build(&pb, &c, &r);
        int64_t n = pb.num_tokens * c.hq;
        double *ref = calloc((size_t)(n * c.d + 1), sizeof *ref);
        double *rlse = calloc((size_t)(n + 1), sizeof *rlse);
        attnd_ref_paged(&pb.p, ref, rlse);
        run_2d(b, &pb);
        expect_matches(&pb, &c, ref, rlse, 2e-6, "2d f32");
        free(run_3d(b, &pb, 3));
        expect_matches(&pb, &c, ref, rlse, 2e-6, "3d/3 f32");
        free(ref);
        free(rlse);
        pb_free(&pb);
    }
    attnd_backend_close(b);
}

/* The features tests above would pass vacuously if a feature changed nothing on these inputs. */
Test(paged, features_change_the_result, .timeout = 120)
{
    attnd_rng r;
    pcase c;
    pbufs pb;
    attnd_rng_seed(&r, 1200);
    case_defaults(&c);
    case_batch(&c, &r, BATCH_CHUNKED);
    c.alibi = 1;
    c.sinks = 1;
    c.q_sigma = 4.0;
    pb_build(&pb, &c, &r);
    for (int64_t h = 0; h < c.hq; h++) /* as large as these inputs' largest logits */
        ((float *)pb.sinks.buf)[h] = 10.0f;
    int64_t n = pb.num_tokens * c.hq * c.d;
    double *base = calloc((size_t)n, sizeof *base), *alt = calloc((size_t)n, sizeof *alt);
    attnd_paged_params plain = pb.p;
    plain.alibi_slopes.data = NULL;
    plain.sinks.data = NULL;
    attnd_ref_paged(&plain, base, NULL);
    for (int f = 0; f < 4; f++) {
        attnd_paged_params p = plain;
        if (f == 0) p.sliding_window = 5;
        if (f == 1) p.softcap = 2.0f;
        if (f == 2) p.alibi_slopes = pb.p.alibi_slopes;
        if (f == 3) p.sinks = pb.p.sinks;
        attnd_ref_paged(&p, alt, NULL);
        cr_assert(attnd_rel_l2(alt, base, n) > 0.05, "feature %d barely changes the output", f);
    }
    free(base);
    free(alt);
    pb_free(&pb);
}

Test(paged, window_edges, .timeout = 120)
{
    /* window 1 (only itself), exactly a block, one less and one more, longer than any sequence */
    static const int32_t windows[] = {1, 15, 16, 17, 1000};
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int i = 0; i < 5; i++) {
        attnd_rng r;
        pcase c;
        attnd_rng_seed(&r, 1300 + (uint64_t)i);
        case_defaults(&c);
        case_batch(&c, &r, BATCH_MIXED);
        c.window = windows[i];
        check_case(b, &c, 1400 + (uint64_t)i, SOME_SEGS, NSOME);
    }
    attnd_backend_close(b);
}

Test(paged, strided_views_and_cache_layouts, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int layout = LAYOUT_DENSE; layout <= LAYOUT_TRANSPOSED; layout++) {
        for (int hnd = 0; hnd < 2; hnd++) {
            attnd_rng r;
            pcase c;
            uint64_t seed = 1500 + (uint64_t)(layout * 2 + hnd);
            attnd_rng_seed(&r, seed);
            case_defaults(&c);
            case_batch(&c, &r, BATCH_MIXED);
            c.layout = layout, c.cache_hnd = hnd;
            c.hq = 6, c.hkv = 3;
            c.odt = ATTND_DTYPE_F16;
            c.cdt = CDT[(layout + hnd) % 3];
            check_case(b, &c, seed + 1000, SOME_SEGS, NSOME);
        }
    }
    attnd_backend_close(b);
}

Test(paged, random_shapes_and_features, .timeout = 120)
{
    static const int32_t sizes[] = {32, 64, 80, 96, 112, 128, 192, 256};
    static const int32_t ratios[] = {1, 2, 4, 8};
    attnd_backend *b = attnd_test_open_cpu(0);
    for (int i = 0; i < 150; i++) {
        attnd_rng r;
        pcase c;
        attnd_rng_seed(&r, 1700 + (uint64_t)i);
        case_defaults(&c);
        case_batch(&c, &r, (int)attnd_rng_int(&r, 0, 3));
        c.d = sizes[attnd_rng_int(&r, 0, 7)];
        c.bs = 16 << attnd_rng_int(&r, 0, 2);
        c.hkv = (int32_t)attnd_rng_int(&r, 1, 3);
        c.hq = c.hkv * ratios[attnd_rng_int(&r, 0, 3)];
        c.qdt = QDT[attnd_rng_int(&r, 0, 2)];
        c.cdt = CDT[attnd_rng_int(&r, 0, 3)];
        c.odt = QDT[attnd_rng_int(&r, 0, 2)];
        c.sinks = (int)attnd_rng_int(&r, 0, 2);
        c.window = attnd_rng_int(&r, 0, 1) ? (int32_t)attnd_rng_int(&r, 1, 60) : 0;
        c.softcap = attnd_rng_int(&r, 0, 1) ? (float)attnd_rng_uniform(&r, 2, 30) : 0.0f;
        c.alibi = (int)attnd_rng_int(&r, 0, 1);
        c.lse = (int)attnd_rng_int(&r, 0, 1);
        c.layout = (int)attnd_rng_int(&r, 0, 2);
        c.cache_hnd = (int)attnd_rng_int(&r, 0, 1);
        c.k_scale = (float)attnd_rng_uniform(&r, 0.05, 4.0);
        c.v_scale = (float)attnd_rng_uniform(&r, 0.05, 4.0);
        int32_t seg = (int32_t)attnd_rng_int(&r, 1, 12);
        check_case(b, &c, 1800 + (uint64_t)i, &seg, 1);
    }
    attnd_backend_close(b);
}

/* ---------------------------------------------------------------- 3D specifics */

/* Decode batches: 3D with every segment count from 1 to beyond the longest sequence's blocks
 * agrees with 2D (both f32 accumulation, so tightly) and with the reference. */
Test(paged, three_d_agrees_with_two_d_for_decode, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int i = 0; i < 3; i++) {
        attnd_rng r;
        pcase c;
        pbufs pb;
        attnd_rng_seed(&r, 2000 + (uint64_t)i);
        case_defaults(&c);
        case_batch(&c, &r, BATCH_DECODE);
        c.cdt = CDT[i];
        c.window = i == 2 ? 20 : 0;
        pb_build(&pb, &c, &r);
        run_2d(b, &pb);
        double *o2 = attnd_tt_to_f64(&pb.out), *l2 = attnd_tt_to_f64(&pb.lse);
        int64_t n = pb.num_tokens * c.hq;
        for (int32_t nseg = 1; nseg <= pb.max_blocks + 3; nseg++) {
            free(run_3d(b, &pb, nseg));
            double *o3 = attnd_tt_to_f64(&pb.out), *l3 = attnd_tt_to_f64(&pb.lse);
            for (int64_t row = 0; row < n; row++) {
                double err = attnd_rel_l2(o3 + row * c.d, o2 + row * c.d, c.d);
                cr_assert(err <= 1e-5, "nseg %d row %lld: 3d vs 2d rel L2 %g", nseg, (long long)row,
                          err);
            }
            cr_assert(attnd_rel_l2(l3, l2, n) <= 1e-5, "nseg %d: lse differs", nseg);
            free(o3);
            free(l3);
        }
        free(o2);
        free(l2);
        pb_free(&pb);
        int32_t segs[] = {1, 2, 7, 64};
        check_case(b, &c, 2100 + (uint64_t)i, segs, 4);
    }
    attnd_backend_close(b);
}

Test(paged, three_d_any_query_lengths, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    for (int kind = BATCH_PREFILL; kind <= BATCH_MIXED; kind++) {
        for (int i = 0; i < 3; i++) {
            attnd_rng r;
            pcase c;
            uint64_t seed = 2200 + (uint64_t)(kind * 10 + i);
            attnd_rng_seed(&r, seed);
            case_defaults(&c);
            case_batch(&c, &r, kind);
            c.window = i == 1 ? 9 : 0;
            c.alibi = i == 2;
            int32_t segs[] = {1, 2, 5, 9};
            check_case(b, &c, seed + 1000, segs, 4);
        }
    }
    attnd_backend_close(b);
}

/* Workspace row of (token, head, segment), as the layout in kernels.h's size function lays out. */
static int64_t ws_row(const pbufs *pb, int64_t tok, int64_t h, int64_t seg, int32_t nseg)
{
    return (tok * pb->p.q.shape[1] + h) * nseg + seg;
}

/* Segments no key of the row falls in (past the sequence, before the window, or after the
 * query's position) hold max -inf, sum 0 and zeros: the fully masked partials the reduce must
 * skip. Rows that see keys there have sum >= 1 (the max itself contributes exp(0)). */
static void expect_segments(const pbufs *pb, const float *ws, int32_t nseg, int64_t tok,
                            int64_t pos, int64_t seq_len, int32_t window)
{
    int64_t hq = pb->p.q.shape[1], d = pb->p.q.shape[2], bs = pb->p.k_cache.shape[1];
    int64_t rows = pb->num_tokens * hq * nseg, per = cdiv(cdiv(seq_len, bs), nseg) * bs;
    const float *mx = ws + rows * d, *sum = mx + rows;
    for (int64_t h = 0; h < hq; h++) {
        for (int64_t s = 0; s < nseg; s++) {
            int64_t w = ws_row(pb, tok, h, s, nseg), lo = s * per, hi = (s + 1) * per;
            int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            int empty = lo > pos || hi <= first || lo >= seq_len;
            if (!empty) {
                cr_assert(isfinite(mx[w]) && sum[w] >= 1.0f, "tok %lld seg %lld: not filled",
                          (long long)tok, (long long)s);
                continue;
            }
            cr_assert(mx[w] == -INFINITY && sum[w] == 0.0f, "tok %lld seg %lld: max %g sum %g",
                      (long long)tok, (long long)s, mx[w], sum[w]);
            for (int64_t e = 0; e < d; e++)
                cr_assert_eq(ws[w * d + e], 0.0f);
        }
    }
}

Test(paged, three_d_marks_empty_segments, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    pcase c;
    pbufs pb;
    attnd_rng_seed(&r, 2400);
    case_defaults(&c);
    /* decode of 3 blocks with a window inside the last: 8 segments of one block each */
    c.num_seqs = 2;
    c.qlen[0] = 1, c.ctx[0] = 47;
    c.qlen[1] = 20, c.ctx[1] = 0; /* prefill: early queries leave later segments empty */
    c.window = 10;
    pb_build(&pb, &c, &r);
    float *ws = run_3d(b, &pb, 8);
    expect_segments(&pb, ws, 8, 0, 47, 48, c.window);
    for (int64_t i = 0; i < 20; i++)
        expect_segments(&pb, ws, 8, 1 + i, i, 20, c.window);
    free(ws);
    /* the reduced output still matches the reference */
    int64_t n = pb.num_tokens * c.hq;
    double *ref = calloc((size_t)(n * c.d), sizeof *ref), *rlse = calloc((size_t)n, sizeof *rlse);
    attnd_ref_paged(&pb.p, ref, rlse);
    expect_matches(&pb, &c, ref, rlse, attnd_tol_for(c.odt), "3d/8 segments");
    free(ref);
    free(rlse);
    pb_free(&pb);
    attnd_backend_close(b);
}

/* Every output row is computed by one work unit: the bytes are the same for any thread count. */
Test(paged, results_do_not_depend_on_thread_count, .timeout = 120)
{
    attnd_backend *b1 = attnd_test_open_cpu(1), *b4 = attnd_test_open_cpu(4);
    attnd_rng r;
    pcase c;
    pbufs pb;
    attnd_rng_seed(&r, 2500);
    case_defaults(&c);
    case_batch(&c, &r, BATCH_MIXED);
    c.hq = 8, c.hkv = 2;
    pb_build(&pb, &c, &r);
    size_t ob = pb.out.bytes, lb = pb.lse.bytes;
    unsigned char *o1 = malloc(ob), *l1 = malloc(lb);
    for (int32_t nseg = 0; nseg <= 4; nseg += 4) {
        if (nseg == 0)
            run_2d(b1, &pb);
        else
            free(run_3d(b1, &pb, nseg));
        memcpy(o1, pb.out.buf, ob);
        memcpy(l1, pb.lse.buf, lb);
        if (nseg == 0)
            run_2d(b4, &pb);
        else
            free(run_3d(b4, &pb, nseg));
        cr_assert(memcmp(o1, pb.out.buf, ob) == 0, "out differs (nseg %d)", nseg);
        cr_assert(memcmp(l1, pb.lse.buf, lb) == 0, "lse differs (nseg %d)", nseg);
    }
    free(o1);
    free(l1);
    pb_free(&pb);
    attnd_backend_close(b1);
    attnd_backend_close(b4);
}

/* A longer context than the random cases use: f32 accumulation over thousands of keys stays
 * within the f32 bound. */
Test(paged, long_context_decode, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(0);
    pcase c;
    case_defaults(&c);
    c.num_seqs = 2;
    c.qlen[0] = 1, c.ctx[0] = 4000;
    c.qlen[1] = 4, c.ctx[1] = 2500;
    c.hq = 8, c.hkv = 1, c.d = 128, c.bs = 64;
    c.qdt = ATTND_DTYPE_F32;
    c.cdt = ATTND_DTYPE_FP8_E4M3;
    int32_t segs[] = {1, 16, 63};
    check_case(b, &c, 2600, segs, 3);
    attnd_backend_close(b);
}
