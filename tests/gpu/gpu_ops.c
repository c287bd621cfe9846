/* gpu_ops: the CUDA backend's merge states, varlen, block-sparse and linear attention against the
 * CPU backend, on fresh random inputs (seeded from the clock unless --seed is given; the seed is
 * printed). Device outputs are poisoned (0xff: NaN in every float dtype) before each run, so an
 * element the kernel never writes fails; NaN or inf where the CPU has a finite value never passes.
 * Error: relative L2 over the whole output, bounded by the looser of the output dtype's bound and
 * the compute dtype's (P and the state are rounded to the input's 16-bit type on the GPU).
 *
 * usage: gpu_ops [--quick] [--seed N] [--verbose] [--only merge|varlen|blocksparse|linear]
 *                [--backend cpu]   (the harness against itself)
 *   --quick: small shapes only (for compute-sanitizer); --only: one op family.
 * Prints one line per failure and "gpu_ops: N passed, M failed"; exits 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/cuda/cuda_backend.h"
#include "attnd/kernels.h"
#include "testutil.h"

static attnd_backend *gpu, *cpu;
static int n_pass, n_fail, quick, verbose;
static attnd_rng rng;

/* ---------------------------------------------------------------- host/device pairs */

typedef struct pair {
    attnd_test_tensor h; /* host copy: the CPU backend's operand */
    void *d;             /* device copy of h's buffer */
} pair;

static void die(const char *what)
{
    fprintf(stderr, "gpu_ops: %s: %s\n", what, attnd_backend_last_error(gpu));
    exit(2);
}

static void pair_up(pair *p)
{
    if (attnd_backend_alloc(gpu, p->h.bytes, &p->d) != ATTND_ERR_OK) die("alloc");
    if (attnd_backend_memcpy(gpu, p->d, p->h.buf, p->h.bytes, ATTND_MEMCPY_H2D) != ATTND_ERR_OK)
        die("memcpy H2D");
}

static void pair_alloc(pair *p, attnd_dtype dt, int32_t ndim, const int64_t *shape, int64_t pad)
{
    attnd_tt_alloc_padded(&p->h, dt, ndim, shape, pad);
}

/* Fill with N(0, sigma^2) (stored / scale) and copy to the device. */
static void pair_normal(pair *p, double sigma, double scale)
{
    attnd_tt_fill_normal(&p->h, &rng, sigma, scale);
    pair_up(p);
}

static attnd_tensor dv(const pair *p)
{
    attnd_tensor t = p->h.t;
    t.data = p->d;
    return t;
}

static void pair_poison_dev(pair *p)
{
    void *ff = malloc(p->h.bytes);
    memset(ff, 0xff, p->h.bytes);
    if (attnd_backend_memcpy(gpu, p->d, ff, p->h.bytes, ATTND_MEMCPY_H2D) != ATTND_ERR_OK)
        die("memcpy poison");
    free(ff);
}

/* The device copy, as a host tensor of the same layout (caller frees with attnd_tt_free). */
static attnd_test_tensor pair_down(const pair *p)
{
    attnd_test_tensor g = p->h;
    g.buf = malloc(p->h.bytes);
    g.t.data = g.buf;
    if (attnd_backend_memcpy(gpu, g.buf, p->d, p->h.bytes, ATTND_MEMCPY_D2H) != ATTND_ERR_OK)
        die("memcpy D2H");
    return g;
}

static void pair_free(pair *p)
{
    attnd_backend_free(gpu, p->d);
    attnd_tt_free(&p->h);
    p->d = NULL;
}

/* ---------------------------------------------------------------- checks */

static double compute_tol(attnd_dtype in_dt, attnd_dtype out_dt)
{
    double a = attnd_tol_for(in_dt), b = attnd_tol_for(out_dt);
    return a > b ? a : b;
}

/* Compare the device copy of p with the CPU's result in p->h. */
static void check(const char *what, const pair *p, double tol)
{
    attnd_test_tensor g = pair_down(p);
    int64_t n = attnd_tensor_numel(&p->h.t);
    double *a = attnd_tt_to_f64(&g), *b = attnd_tt_to_f64(&p->h);
    double err = attnd_rel_l2(a, b, n);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (isnan(a[i]) && !isnan(b[i])) bad = i;
    if (err <= tol) {
        n_pass++;
        if (verbose) printf("  ok   %-64s rel %.3g (tol %.3g)\n", what, err, tol);
    } else {
        n_fail++;
        printf("  FAIL %-64s rel %.3g (tol %.3g)", what, err, tol);
        if (bad >= 0) printf(" first NaN at flat %lld", (long long)bad);
        printf("\n");
    }
    free(a);
    free(b);
    free(g.buf);
}

static int run_both(const char *what, attnd_err gpu_rv, attnd_err cpu_rv)
{
    if (gpu_rv == ATTND_ERR_OK) gpu_rv = attnd_backend_sync(gpu);
    if (gpu_rv != ATTND_ERR_OK || cpu_rv != ATTND_ERR_OK) {
        n_fail++;
        printf("  FAIL %-64s gpu %s (%s), cpu %s (%s)\n", what, attnd_strerror(gpu_rv),
               attnd_backend_last_error(gpu), attnd_strerror(cpu_rv),
               attnd_backend_last_error(cpu));
        return 0;
    }
    return 1;
}

static const char *dn(attnd_dtype dt)
{
    return attnd_dtype_name(dt);
}

/* ---------------------------------------------------------------- merge states */

static void merge_case(int64_t T, int64_t H, int64_t D, attnd_dtype in_dt, attnd_dtype out_dt,
                       int with_lse, int64_t pad, double p_inf)
{
    char what[160];
    snprintf(what, sizeof what, "merge T=%lld H=%lld D=%lld %s->%s lse=%d pad=%lld inf=%.2f",
             (long long)T, (long long)H, (long long)D, dn(in_dt), dn(out_dt), with_lse,
             (long long)pad, p_inf);
    int64_t os[3] = {T, H, D}, ls[2] = {H, T};
    pair po, so, out, pl, sl, ol;
    pair_alloc(&po, in_dt, 3, os, pad);
    pair_alloc(&so, in_dt, 3, os, 0);
    pair_alloc(&out, out_dt, 3, os, pad);
    pair_alloc(&pl, ATTND_DTYPE_F32, 2, ls, 0);
    pair_alloc(&sl, ATTND_DTYPE_F32, 2, ls, 0);
    pair_alloc(&ol, ATTND_DTYPE_F32, 2, ls, 0);
    attnd_tt_fill_normal(&po.h, &rng, 1.0, 1.0);
    attnd_tt_fill_normal(&so.h, &rng, 1.0, 1.0);
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = 0; t < T; t++) {
            int64_t idx[2] = {h, t};
            double a = attnd_rng_uniform(&rng, -6, 6), b = attnd_rng_uniform(&rng, -6, 6);
            double u = attnd_rng_uniform(&rng, 0, 1);
            if (u < p_inf)
                a = -INFINITY; /* empty prefix */
            else if (u < 2 * p_inf)
                b = INFINITY; /* FA2's empty suffix */
            else if (u < 3 * p_inf)
                a = b = -INFINITY; /* both empty: zeros, -inf */
            else if (u < 4 * p_inf)
                a = INFINITY, b = -INFINITY;
            attnd_tt_set(&pl.h, idx, a);
            attnd_tt_set(&sl.h, idx, b);
            /* a side with weight 0 holds garbage (NaN) and must not leak */
            for (int64_t c = 0; c < D; c++) {
                int64_t oi[3] = {t, h, c};
                if (isinf(a)) attnd_tt_set(&po.h, oi, NAN);
                if (isinf(b)) attnd_tt_set(&so.h, oi, NAN);
            }
        }
    pair_up(&po);
    pair_up(&so);
    pair_up(&out);
    pair_up(&pl);
    pair_up(&sl);
    pair_up(&ol);
    pair_poison_dev(&out);
    pair_poison_dev(&ol);
    attnd_merge_params hp = {out.h.t, ol.h.t, po.h.t, pl.h.t, so.h.t, sl.h.t};
    attnd_merge_params gp = {dv(&out), dv(&ol), dv(&po), dv(&pl), dv(&so), dv(&sl)};
    if (!with_lse) hp.out_lse.data = gp.out_lse.data = NULL;
    if (run_both(what, attnd_merge_states(gpu, &gp), attnd_merge_states(cpu, &hp))) {
        check(what, &out, compute_tol(in_dt, out_dt));
        if (with_lse) {
            char w2[300];
            snprintf(w2, sizeof w2, "%s [lse]", what);
            check(w2, &ol, 1e-5);
        }
    }
    pair_free(&po);
    pair_free(&so);
    pair_free(&out);
    pair_free(&pl);
    pair_free(&sl);
    pair_free(&ol);
}

static void test_merge(void)
{
    printf("merge states\n");
    const attnd_dtype dts[3] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        merge_case(quick ? 33 : 257, 8, 128, dts[i], dts[i], 1, 0, 0.05);
        merge_case(7, 3, 72, dts[i], dts[i], 0, 0, 0.1);
        merge_case(5, 2, 40, dts[i], dts[(i + 1) % 3], 1, 0, 0.1); /* mixed: element kernel */
        merge_case(19, 4, 96, dts[i], dts[i], 1, 104, 0.05);       /* padded rows */
    }
    merge_case(1, 1, 32, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 1, 0, 0.0);
    merge_case(3, 5, 256, ATTND_DTYPE_F16, ATTND_DTYPE_F16, 1, 0, 0.2);
    merge_case(11, 3, 200, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 1, 202, 0.05); /* unaligned rows */
    if (!quick) merge_case(4096, 32, 128, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 1, 0, 0.01);
}

/* ---------------------------------------------------------------- varlen / block-sparse */

#define MAXB 16

typedef struct seqs {
    int64_t batch;
    int32_t lq[MAXB], lk[MAXB];
} seqs;

static void cu_pair(pair *cu, const int32_t *lens, int64_t batch, int32_t *max_len, int64_t *total)
{
    int64_t shape[1] = {batch + 1}, acc = 0;
    pair_alloc(cu, ATTND_DTYPE_I32, 1, shape, 0);
    *max_len = 0;
    for (int64_t s = 0; s <= batch; s++) {
        ((int32_t *)cu->h.buf)[s] = (int32_t)acc;
        if (s < batch) {
            acc += lens[s];
            if (lens[s] > *max_len) *max_len = lens[s];
        }
    }
    *total = acc;
    pair_up(cu);
}

typedef struct vcase {
    seqs s;
    int64_t hq, hk, d;
    attnd_dtype in_dt, out_dt, bias_dt; /* bias_dt F32/F16/BF16, or I32 for none */
    int causal;
    int64_t pad; /* q/k/v/out innermost padded to this many elements (0: none) */
} vcase;

static void varlen_case(const vcase *c)
{
    char what[200];
    int n =
        snprintf(what, sizeof what, "varlen b=%lld hq=%lld hk=%lld d=%lld %s->%s%s%s pad=%lld L=",
                 (long long)c->s.batch, (long long)c->hq, (long long)c->hk, (long long)c->d,
                 dn(c->in_dt), dn(c->out_dt), c->causal ? " causal" : "",
                 c->bias_dt != ATTND_DTYPE_I32 ? " bias" : "", (long long)c->pad);
    for (int64_t i = 0; i < c->s.batch && n < 180; i++)
        n += snprintf(what + n, sizeof what - (size_t)n, "%d/%d,", c->s.lq[i], c->s.lk[i]);
    pair cq, ck, q, k, v, out, bias;
    attnd_varlen_params hp, gp;
    memset(&hp, 0, sizeof hp);
    int64_t tq, tk;
    cu_pair(&cq, c->s.lq, c->s.batch, &hp.max_seqlen_q, &tq);
    cu_pair(&ck, c->s.lk, c->s.batch, &hp.max_seqlen_k, &tk);
    const int fp8 = c->in_dt == ATTND_DTYPE_FP8_E4M3;
    hp.q_scale = fp8 ? 0.02f : 1.0f;
    hp.k_scale = fp8 ? 0.03f : 1.0f;
    hp.v_scale = fp8 ? 0.01f : 1.0f;
    hp.p_scale = fp8 ? 1.0f / 448.0f : 1.0f;
    hp.out_scale = c->out_dt == ATTND_DTYPE_FP8_E4M3 ? 0.005f : 1.0f;
    hp.causal = c->causal;
    hp.scale = 1.0f / sqrtf((float)c->d);
    int64_t qs[3] = {tq, c->hq, c->d}, ks[3] = {tk, c->hk, c->d};
    pair_alloc(&q, c->in_dt, 3, qs, c->pad);
    pair_alloc(&k, c->in_dt, 3, ks, c->pad);
    pair_alloc(&v, c->in_dt, 3, ks, c->pad);
    pair_alloc(&out, c->out_dt, 3, qs, c->pad);
    pair_normal(&q, 1.0, hp.q_scale);
    pair_normal(&k, 1.0, hp.k_scale);
    pair_normal(&v, 1.0, hp.v_scale);
    pair_up(&out);
    pair_poison_dev(&out);
    memset(&bias, 0, sizeof bias);
    int has_bias = c->bias_dt != ATTND_DTYPE_I32;
    if (has_bias) {
        int64_t bs[4] = {c->s.batch, c->hq, hp.max_seqlen_q, hp.max_seqlen_k};
        pair_alloc(&bias, c->bias_dt, 4, bs, 0);
        pair_normal(&bias, 2.0, 1.0);
    }
    hp.q = q.h.t, hp.k = k.h.t, hp.v = v.h.t, hp.out = out.h.t;
    hp.cu_seqlens_q = cq.h.t, hp.cu_seqlens_k = ck.h.t;
    if (has_bias) hp.bias = bias.h.t;
    gp = hp;
    gp.q = dv(&q), gp.k = dv(&k), gp.v = dv(&v), gp.out = dv(&out);
    gp.cu_seqlens_q = dv(&cq), gp.cu_seqlens_k = dv(&ck);
    if (has_bias) gp.bias = dv(&bias);
    if (run_both(what, attnd_varlen_attention(gpu, &gp), attnd_varlen_attention(cpu, &hp)))
        check(what, &out, compute_tol(fp8 ? ATTND_DTYPE_FP8_E4M3 : c->in_dt, c->out_dt));
    pair_free(&cq);
    pair_free(&ck);
    pair_free(&q);
    pair_free(&k);
    pair_free(&v);
    pair_free(&out);
    if (has_bias) pair_free(&bias);
}

static void random_seqs(seqs *s, int64_t batch, int32_t max_len, int mode)
{
    /* mode 0: lq == lk; 1: lq <= lk (chunked prefill); 2: any (lq > lk too) */
    s->batch = batch;
    for (int64_t i = 0; i < batch; i++) {
        s->lk[i] = (int32_t)attnd_rng_int(&rng, 0, max_len);
        if (mode == 0)
            s->lq[i] = s->lk[i];
        else if (mode == 1)
            s->lq[i] = (int32_t)attnd_rng_int(&rng, 0, s->lk[i]);
        else
            s->lq[i] = (int32_t)attnd_rng_int(&rng, 0, max_len);
    }
}

static void test_varlen(void)
{
    printf("varlen attention\n");
    static const int64_t heads[] = {32, 64, 72, 96, 128, 136, 160, 200, 256};
    static const int64_t gq[][2] = {{4, 4}, {8, 2}, {6, 1}};
    const attnd_dtype ins[3] = {ATTND_DTYPE_F16, ATTND_DTYPE_BF16, ATTND_DTYPE_FP8_E4M3};
    int32_t maxl = quick ? 80 : 300;
    for (int hi = 0; hi < 9; hi++) {
        if (quick && hi % 3) continue;
        vcase c;
        memset(&c, 0, sizeof c);
        c.hq = gq[hi % 3][0], c.hk = gq[hi % 3][1], c.d = heads[hi];
        c.in_dt = ins[hi % 3];
        c.out_dt = c.in_dt == ATTND_DTYPE_FP8_E4M3 ? ATTND_DTYPE_BF16 : c.in_dt;
        c.bias_dt = ATTND_DTYPE_I32;
        c.causal = hi % 2;
        random_seqs(&c.s, quick ? 2 : 4, maxl, hi % 3);
        varlen_case(&c);
    }
    /* awkward lengths: empty, 1, Lq > Lk (top rows fully masked), tile edges */
    vcase c;
    memset(&c, 0, sizeof c);
    c.hq = 4, c.hk = 2, c.d = 128, c.in_dt = ATTND_DTYPE_BF16, c.out_dt = ATTND_DTYPE_F32;
    c.bias_dt = ATTND_DTYPE_I32, c.causal = 1;
    c.s.batch = 7;
    int32_t lq[7] = {0, 1, 64, 65, 130, 5, 127}, lk[7] = {3, 1, 64, 200, 63, 0, 128};
    memcpy(c.s.lq, lq, sizeof lq);
    memcpy(c.s.lk, lk, sizeof lk);
    varlen_case(&c);
    c.causal = 0;
    varlen_case(&c);
    /* bias (f32 and bf16), causal and not */
    for (int i = 0; i < 2; i++) {
        vcase b = c;
        b.bias_dt = i ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F32;
        b.causal = i;
        b.in_dt = i ? ATTND_DTYPE_F16 : ATTND_DTYPE_BF16;
        b.out_dt = b.in_dt;
        b.d = i ? 96 : 128;
        random_seqs(&b.s, 3, quick ? 70 : 200, 2);
        varlen_case(&b);
    }
    /* bias on the awkward lengths: f16 bias, GQA 8/1, head 64; fp8 inputs with an f32 bias */
    vcase bb = c;
    bb.bias_dt = ATTND_DTYPE_F16, bb.hq = 8, bb.hk = 1, bb.d = 64;
    bb.in_dt = bb.out_dt = ATTND_DTYPE_BF16;
    varlen_case(&bb);
    bb.bias_dt = ATTND_DTYPE_F32, bb.hq = 4, bb.hk = 1, bb.d = 128, bb.causal = 0;
    bb.in_dt = ATTND_DTYPE_FP8_E4M3;
    varlen_case(&bb);
    /* fp8 inputs with fp8 output; fp8 with f32 output and bias */
    vcase f = c;
    f.in_dt = ATTND_DTYPE_FP8_E4M3, f.out_dt = ATTND_DTYPE_FP8_E4M3, f.causal = 1, f.d = 64;
    random_seqs(&f.s, 3, maxl, 1);
    varlen_case(&f);
    f.out_dt = ATTND_DTYPE_F32, f.bias_dt = ATTND_DTYPE_F32, f.d = 192;
    varlen_case(&f);
    /* fp8 inputs on the sm90 core (heads whose fp8 rows are 16-byte multiples): GQA 1/4/8, the
     * awkward lengths above, causal and not, then random lengths over several tiles */
    static const int64_t f8d[4] = {64, 96, 128, 256}, f8g[3][2] = {{4, 4}, {8, 2}, {8, 1}};
    for (int i = 0; i < 8; i++) {
        vcase g8 = c;
        g8.in_dt = ATTND_DTYPE_FP8_E4M3, g8.out_dt = i % 3 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16;
        g8.d = f8d[i / 2], g8.causal = i % 2;
        g8.hq = f8g[i % 3][0], g8.hk = f8g[i % 3][1];
        if (i >= 4) random_seqs(&g8.s, 3, quick ? 150 : 600, i % 3);
        varlen_case(&g8);
    }
    /* padded (strided) rows, output dtypes */
    vcase s = c;
    s.pad = 136, s.d = 128, s.in_dt = ATTND_DTYPE_F16, s.out_dt = ATTND_DTYPE_BF16, s.causal = 1;
    random_seqs(&s.s, 3, maxl, 1);
    varlen_case(&s);
    /* 16-bit inputs, fp8 output: the sm90 core's epilogue converts and scales */
    vcase e = s;
    e.pad = 0, e.in_dt = ATTND_DTYPE_BF16, e.out_dt = ATTND_DTYPE_FP8_E4M3;
    varlen_case(&e);
    if (!quick) {
        /* a serving-like shape: 32/8 heads, head 128, bf16, 2 x 1000 causal */
        vcase big = c;
        big.hq = 32, big.hk = 8, big.d = 128, big.in_dt = big.out_dt = ATTND_DTYPE_BF16;
        big.s.batch = 2, big.s.lq[0] = big.s.lk[0] = 1000, big.s.lq[1] = 333, big.s.lk[1] = 1024;
        varlen_case(&big);
        big.in_dt = ATTND_DTYPE_FP8_E4M3;
        varlen_case(&big);
    }
}

/* Block-sparse: CSR layout per q head over `rows` row blocks; anchors-style (local + vertical
 * stride with a per-head offset) or random. */
typedef struct bcase {
    seqs s;
    int64_t hq, hk, d;
    int32_t bs, qbs;
    attnd_dtype in_dt, out_dt;
    int random_layout;
} bcase;

static void layout_pairs(pair *crow, pair *col, const bcase *c, int64_t rows)
{
    int64_t qbs = c->qbs ? c->qbs : c->bs;
    int64_t cap = rows * (rows * qbs / c->bs + 2) + 1;
    int32_t *cols = calloc((size_t)(c->hq * cap), sizeof *cols);
    int64_t cs[2] = {c->hq, rows + 1}, width = 1;
    pair_alloc(crow, ATTND_DTYPE_I32, 2, cs, 0);
    int32_t *cr = crow->h.buf;
    for (int64_t h = 0; h < c->hq; h++) {
        int64_t n = 0;
        for (int64_t qb = 0; qb < rows; qb++) {
            int64_t diag = ((qb + 1) * qbs - 1) / c->bs;
            cr[h * (rows + 1) + qb] = (int32_t)n;
            for (int64_t kb = 0; kb <= diag; kb++) {
                int pick = c->random_layout ? attnd_rng_uniform(&rng, 0, 1) < 0.4
                                            : (diag - kb < 4 || (kb + h + 1) % 3 == 0);
                if (pick) cols[h * cap + n++] = (int32_t)kb;
            }
        }
        cr[h * (rows + 1) + rows] = (int32_t)n;
        if (n > width) width = n;
    }
    int64_t ws[2] = {c->hq, width};
    pair_alloc(col, ATTND_DTYPE_I32, 2, ws, 0);
    for (int64_t h = 0; h < c->hq; h++)
        for (int64_t i = 0; i < cr[h * (rows + 1) + rows]; i++)
            ((int32_t *)col->h.buf)[h * width + i] = cols[h * cap + i];
    free(cols);
    pair_up(crow);
    pair_up(col);
}

static void blocksparse_case(const bcase *c)
{
    char what[200];
    int n =
        snprintf(what, sizeof what,
                 "blocksparse hq=%lld hk=%lld d=%lld bs=%d qbs=%d %s->%s %s L=", (long long)c->hq,
                 (long long)c->hk, (long long)c->d, c->bs, c->qbs, dn(c->in_dt), dn(c->out_dt),
                 c->random_layout ? "random" : "local+vert");
    for (int64_t i = 0; i < c->s.batch && n < 180; i++)
        n += snprintf(what + n, sizeof what - (size_t)n, "%d/%d,", c->s.lq[i], c->s.lk[i]);
    pair cq, ck, q, k, v, out, crow, col;
    attnd_blocksparse_params hp, gp;
    memset(&hp, 0, sizeof hp);
    int64_t tq, tk;
    cu_pair(&cq, c->s.lq, c->s.batch, &hp.max_seqlen_q, &tq);
    cu_pair(&ck, c->s.lk, c->s.batch, &hp.max_seqlen_k, &tk);
    hp.block_size = c->bs;
    hp.q_block_size = c->qbs;
    hp.scale = 1.0f / sqrtf((float)c->d);
    int64_t qbs = c->qbs ? c->qbs : c->bs;
    layout_pairs(&crow, &col, c, (hp.max_seqlen_k + qbs - 1) / qbs + 1);
    int64_t qs[3] = {tq, c->hq, c->d}, ks[3] = {tk, c->hk, c->d};
    pair_alloc(&q, c->in_dt, 3, qs, 0);
    pair_alloc(&k, c->in_dt, 3, ks, 0);
    pair_alloc(&v, c->in_dt, 3, ks, 0);
    pair_alloc(&out, c->out_dt, 3, qs, 0);
    pair_normal(&q, 1.0, 1.0);
    pair_normal(&k, 1.0, 1.0);
    pair_normal(&v, 1.0, 1.0);
    pair_up(&out);
    pair_poison_dev(&out);
    hp.q = q.h.t, hp.k = k.h.t, hp.v = v.h.t, hp.out = out.h.t;
    hp.cu_seqlens_q = cq.h.t, hp.cu_seqlens_k = ck.h.t;
    hp.layout_crow = crow.h.t, hp.layout_col = col.h.t;
    gp = hp;
    gp.q = dv(&q), gp.k = dv(&k), gp.v = dv(&v), gp.out = dv(&out);
    gp.cu_seqlens_q = dv(&cq), gp.cu_seqlens_k = dv(&ck);
    gp.layout_crow = dv(&crow), gp.layout_col = dv(&col);
    if (run_both(what, attnd_blocksparse_attention(gpu, &gp),
                 attnd_blocksparse_attention(cpu, &hp)))
        check(what, &out, compute_tol(c->in_dt, c->out_dt));
    pair *all[] = {&cq, &ck, &q, &k, &v, &out, &crow, &col};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

static void test_blocksparse(void)
{
    printf("block-sparse attention\n");
    static const int32_t sizes[][2] = {{64, 0},   {16, 32},  {64, 16}, {32, 0},
                                       {128, 64}, {16, 128}, {64, 128}};
    static const int64_t heads[] = {128, 64, 96, 200, 256, 72, 128};
    for (int i = 0; i < 7; i++) {
        if (quick && i % 2) continue;
        bcase c;
        memset(&c, 0, sizeof c);
        c.hq = 4, c.hk = i % 2 ? 4 : 1, c.d = heads[i];
        c.bs = sizes[i][0], c.qbs = sizes[i][1];
        c.in_dt = i % 2 ? ATTND_DTYPE_F16 : ATTND_DTYPE_BF16;
        c.out_dt = i % 3 == 0 ? ATTND_DTYPE_F32 : c.in_dt;
        c.random_layout = i % 2;
        c.s.batch = 4;
        for (int s = 0; s < 4; s++) {
            c.s.lk[s] = (int32_t)attnd_rng_int(&rng, 1, quick ? 150 : 400);
            c.s.lq[s] = s % 2 ? 1 : c.s.lk[s]; /* prefill and decode in one batch */
        }
        blocksparse_case(&c);
    }
    /* the anchors' layout on a serving-like shape: 32/8 heads, head 128, block 64 */
    bcase a;
    memset(&a, 0, sizeof a);
    a.hq = quick ? 8 : 32, a.hk = quick ? 2 : 8, a.d = 128, a.bs = 64;
    a.in_dt = a.out_dt = ATTND_DTYPE_BF16;
    a.s.batch = 2, a.s.lq[0] = a.s.lk[0] = quick ? 200 : 1024, a.s.lq[1] = a.s.lk[1] = 77;
    blocksparse_case(&a);
    /* decode only (max_seqlen_q == 1: the decode kernel) */
    a.s.batch = 5;
    int32_t past[5] = {0, 63, 64, 900, 257};
    for (int s = 0; s < 5; s++)
        a.s.lq[s] = 1, a.s.lk[s] = past[s] + 1;
    blocksparse_case(&a);
    static const int64_t dheads[] = {96, 64, 256, 200, 32};
    static const int32_t dsizes[][2] = {{16, 0}, {32, 64}, {128, 0}, {64, 16}, {16, 128}};
    for (int i = 0; i < 5; i++) {
        bcase c;
        memset(&c, 0, sizeof c);
        c.hq = 6, c.hk = i % 2 ? 3 : 1, c.d = dheads[i];
        c.bs = dsizes[i][0], c.qbs = dsizes[i][1];
        c.in_dt = i % 2 ? ATTND_DTYPE_F16 : ATTND_DTYPE_BF16;
        c.out_dt = i % 3 == 1 ? ATTND_DTYPE_F32 : c.in_dt;
        c.random_layout = i % 2;
        c.s.batch = 4;
        for (int s = 0; s < 4; s++) {
            c.s.lk[s] = (int32_t)attnd_rng_int(&rng, s == 0 ? 0 : 1, quick ? 300 : 2000);
            c.s.lq[s] = c.s.lk[s] > 0 ? 1 : 0;
        }
        blocksparse_case(&c);
    }
}

/* ---------------------------------------------------------------- linear attention */

static void slopes_pair(pair *s, int64_t heads)
{
    int64_t shape[1] = {heads};
    pair_alloc(s, ATTND_DTYPE_F32, 1, shape, 0);
    for (int64_t h = 0; h < heads; h++) {
        /* MiniMax-like 2^(-8(h+1)/H) and random rates, from slow (0.002) to fast decay */
        double v = h % 2 ? pow(2.0, -8.0 * (double)(h + 1) / (double)heads)
                         : exp(attnd_rng_uniform(&rng, log(0.002), log(1.5)));
        int64_t i[1] = {h};
        attnd_tt_set(&s->h, i, v);
    }
    pair_up(s);
}

typedef struct lcase {
    int64_t b, h, n, d, e;
    attnd_dtype in_dt, out_dt;
    int64_t pad;      /* q/k/v rows padded (pad not a multiple of 8: the float32 path) */
    int history;      /* random initial state */
    int split;        /* run as two prefills (chunked prefill carrying the state) */
    int decode_steps; /* then this many decode steps (slots = batch rows, one padding row) */
} lcase;

static attnd_tensor token_view(const pair *p, int on_dev, int64_t t0, int64_t len)
{
    attnd_tensor t = on_dev ? dv(p) : p->h.t;
    size_t es = attnd_dtype_size(t.dtype);
    t.data = (char *)t.data + (size_t)(t0 * t.strides[2]) * es;
    t.shape[2] = len;
    return t;
}

static void linear_case(const lcase *c)
{
    char what[200];
    snprintf(what, sizeof what,
             "linear b=%lld h=%lld n=%lld d=%lld e=%lld %s->%s pad=%lld hist=%d split=%d dec=%d",
             (long long)c->b, (long long)c->h, (long long)c->n, (long long)c->d, (long long)c->e,
             dn(c->in_dt), dn(c->out_dt), (long long)c->pad, c->history, c->split, c->decode_steps);
    pair q, k, v, out, sl, st;
    int64_t qs[4] = {c->b, c->h, c->n, c->d}, vs[4] = {c->b, c->h, c->n, c->e};
    int64_t ss[4] = {c->b, c->h, c->d, c->e};
    pair_alloc(&q, c->in_dt, 4, qs, c->pad ? c->d + c->pad : 0);
    pair_alloc(&k, c->in_dt, 4, qs, c->pad ? c->d + c->pad : 0);
    pair_alloc(&v, c->in_dt, 4, vs, c->pad ? c->e + c->pad : 0);
    pair_alloc(&out, c->out_dt, 4, vs, 0);
    pair_alloc(&st, ATTND_DTYPE_F32, 4, ss, 0);
    pair_normal(&q, 1.0, 1.0);
    pair_normal(&k, 1.0, 1.0);
    pair_normal(&v, 1.0, 1.0);
    if (c->history) attnd_tt_fill_normal(&st.h, &rng, 3.0, 1.0);
    pair_up(&st);
    pair_up(&out);
    pair_poison_dev(&out);
    slopes_pair(&sl, c->h);
    int64_t cut = c->split ? c->n / 3 + 17 : c->n;
    if (cut > c->n) cut = c->n;
    int ok = 1;
    for (int part = 0; part < (c->split ? 2 : 1) && ok; part++) {
        int64_t t0 = part ? cut : 0, len = part ? c->n - cut : cut;
        attnd_linear_prefill_params hp = {token_view(&q, 0, t0, len),
                                          token_view(&k, 0, t0, len),
                                          token_view(&v, 0, t0, len),
                                          token_view(&out, 0, t0, len),
                                          sl.h.t,
                                          st.h.t,
                                          part ? 64 : 0};
        attnd_linear_prefill_params gp = {token_view(&q, 1, t0, len),
                                          token_view(&k, 1, t0, len),
                                          token_view(&v, 1, t0, len),
                                          token_view(&out, 1, t0, len),
                                          dv(&sl),
                                          dv(&st),
                                          0};
        ok = run_both(what, attnd_linear_prefill(gpu, &gp), attnd_linear_prefill(cpu, &hp));
    }
    if (ok) {
        double tol = compute_tol(c->in_dt, c->out_dt);
        check(what, &out, tol);
        char w2[300];
        snprintf(w2, sizeof w2, "%s [state]", what);
        check(w2, &st, c->in_dt == ATTND_DTYPE_F32 ? 1e-4 : compute_tol(c->in_dt, ATTND_DTYPE_F32));
    }
    /* decode steps against the prefilled states: slot of batch row r is r (+ spare slots), the
     * last row is padding (-1) */
    for (int step = 0; step < c->decode_steps && ok; step++) {
        pair dq, dk, dvv, dout, slot, cache;
        int64_t rows = c->b + 1, slots = c->b + 2;
        int64_t s3[3] = {rows, c->h, c->d}, s3e[3] = {rows, c->h, c->e};
        int64_t cs[4] = {slots, c->h, c->d, c->e}, sls[1] = {rows};
        pair_alloc(&dq, c->in_dt, 3, s3, 0);
        pair_alloc(&dk, c->in_dt, 3, s3, 0);
        pair_alloc(&dvv, c->in_dt, 3, s3e, 0);
        pair_alloc(&dout, c->out_dt, 3, s3e, 0);
        pair_alloc(&slot, step % 2 ? ATTND_DTYPE_I32 : ATTND_DTYPE_I64, 1, sls, 0);
        pair_alloc(&cache, ATTND_DTYPE_F32, 4, cs, step % 2 ? c->e + 1 : 0);
        pair_normal(&dq, 1.0, 1.0);
        pair_normal(&dk, 1.0, 1.0);
        pair_normal(&dvv, 1.0, 1.0);
        attnd_tt_fill_normal(&cache.h, &rng, 1.0, 1.0);
        /* batch row r uses slot (r + 1) % b (rows permuted), its state the prefill's (GPU's) */
        attnd_test_tensor gst = pair_down(&st);
        for (int64_t r = 0; r < rows; r++) {
            int64_t si[1] = {r}, sv = r < c->b ? (r + 1) % c->b : -1;
            attnd_tt_set(&slot.h, si, (double)sv);
            if (sv < 0) continue;
            for (int64_t hh = 0; hh < c->h; hh++)
                for (int64_t i = 0; i < c->d; i++)
                    for (int64_t j = 0; j < c->e; j++) {
                        int64_t ci[4] = {sv, hh, i, j}, gi[4] = {r, hh, i, j};
                        attnd_tt_set(&cache.h, ci, attnd_tt_get(&gst, gi));
                    }
        }
        free(gst.buf);
        pair_up(&slot);
        pair_up(&cache);
        pair_up(&dout);
        pair_poison_dev(&dout);
        attnd_linear_decode_params hp = {dq.h.t, dk.h.t,    dvv.h.t, dout.h.t,
                                         sl.h.t, cache.h.t, slot.h.t};
        attnd_linear_decode_params gp = {dv(&dq), dv(&dk),    dv(&dvv), dv(&dout),
                                         dv(&sl), dv(&cache), dv(&slot)};
        char w3[400];
        snprintf(w3, sizeof w3, "%s [decode %d slot %s%s]", what, step, dn(slot.h.t.dtype),
                 step % 2 ? " unaligned cache" : "");
        if (run_both(w3, attnd_linear_decode(gpu, &gp), attnd_linear_decode(cpu, &hp))) {
            check(w3, &dout, compute_tol(c->in_dt, c->out_dt));
            snprintf(w3, sizeof w3, "%s [decode %d cache]", what, step);
            check(w3, &cache, 1e-5);
        }
        pair *all[] = {&dq, &dk, &dvv, &dout, &slot, &cache};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            pair_free(all[i]);
    }
    pair *all[] = {&q, &k, &v, &out, &sl, &st};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

static void test_linear(void)
{
    printf("linear attention\n");
    static const lcase cases[] = {
        {2, 3, 700, 128, 128, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 0, 1, 0, 2},
        {1, 4, 1030, 96, 96, ATTND_DTYPE_F16, ATTND_DTYPE_F32, 0, 1, 1, 1},
        {3, 2, 65, 64, 128, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 0, 0, 0, 1},
        {1, 2, 200, 128, 64, ATTND_DTYPE_F16, ATTND_DTYPE_F16, 0, 1, 1, 0},
        {1, 2, 300, 256, 256, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 0, 1, 0, 1},
        {2, 2, 130, 200, 136, ATTND_DTYPE_F16, ATTND_DTYPE_F32, 0, 1, 1, 0},
        {1, 3, 63, 40, 72, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 0, 1, 0, 1},
        {1, 1, 1, 32, 32, ATTND_DTYPE_F16, ATTND_DTYPE_F16, 0, 1, 0, 1},
        {2, 3, 333, 128, 96, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0, 1, 1, 2},
        {1, 2, 100, 256, 48, ATTND_DTYPE_F32, ATTND_DTYPE_BF16, 0, 1, 0, 1},
        {1, 2, 150, 64, 64, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 3, 1, 0, 0}, /* unaligned rows */
        {2, 8, 2048, 128, 128, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 0, 1, 1, 1},
    };
    size_t nc = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < nc; i++) {
        lcase c = cases[i];
        if (quick) {
            if (c.n > 300) c.n = 300;
            if (c.h > 2) c.h = 2;
        }
        linear_case(&c);
    }
}

int main(int argc, char **argv)
{
    uint64_t seed = (uint64_t)time(NULL);
    const char *only = NULL, *backend = "cuda";
    int core = 0, off = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--verbose") == 0)
            verbose = 1;
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--core") == 0 && i + 1 < argc)
            core = atoi(argv[++i]); /* 80: varlen / block-sparse on the mma.sync kernel */
        else if (strcmp(argv[i], "--sm90-off") == 0 && i + 1 < argc)
            off = atoi(argv[++i]); /* ATTND_SM90_NO_* of paged/launch.h */
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            backend = argv[++i]; /* "cpu": check the harness itself (both sides the oracle) */
        else {
            fprintf(stderr,
                    "usage: gpu_ops [--quick] [--seed N] [--verbose] [--only OP] [--core 80] "
                    "[--sm90-off MASK]\n");
            return 2;
        }
    }
    attnd_rng_seed(&rng, seed);
    printf("gpu_ops: seed %llu%s\n", (unsigned long long)seed, quick ? " (quick)" : "");
    attnd_err rv = attnd_backend_open(&gpu, backend, NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "gpu_ops: %s backend: %s\n", backend, attnd_strerror(rv));
        return 2;
    }
    if (attnd_backend_open(&cpu, "cpu", NULL) != ATTND_ERR_OK) return 2;
    if (core && strcmp(backend, "cuda") == 0) attnd_cuda_of(gpu)->paged_core = core;
    if (strcmp(backend, "cuda") == 0) attnd_cuda_of(gpu)->sm90_off = off;
    if (only == NULL || strcmp(only, "merge") == 0) test_merge();
    if (only == NULL || strcmp(only, "varlen") == 0) test_varlen();
    if (only == NULL || strcmp(only, "blocksparse") == 0) test_blocksparse();
    if (only == NULL || strcmp(only, "linear") == 0) test_linear();
    printf("gpu_ops: %d passed, %d failed\n", n_pass, n_fail);
    attnd_backend_close(cpu);
    attnd_backend_close(gpu);
    return n_fail ? 1 : 0;
}
