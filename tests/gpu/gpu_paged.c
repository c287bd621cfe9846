/* gpu_paged: the cuda backend's paged attention (2D and 3D) and cache write against the cpu
 * backend, on fresh random inputs over a grid of shapes: GQA/MQA, head sizes 32..256 (non-powers
 * of two), block sizes 16/32/64, contexts that are not multiples of the block size, empty and
 * one-token sequences, every cache dtype (f32: the exact kernel, held to f32 accuracy), Q and
 * output in f32/f16/bf16, sliding window, softcap, ALiBi, sinks, LSE, padded (strided) Q and
 * output rows, 1..many segments. Outputs are poisoned (NaN)
 * before each run, so an unwritten element fails; NaN never passes. The float64 reference of
 * tests/support checks the cpu backend on the same inputs where the case is small enough.
 *
 *   gpu_paged [--reduced] [--seed N] [--verbose] [--core 80|90] [--sm90-off MASK]
 *
 * --reduced runs a handful of small cases (for compute-sanitizer); --core forces the 2D prefill
 * core (default: the device's pick, the sm90 one on an H100 for 16-bit caches); --sm90-off turns
 * features of the sm90 core off (ATTND_SM90_NO_*: 1 ping-pong, 2 L2 sections, 4 Q prefetch). Prints
 * one summary line "gpu_paged: N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/cuda/cuda_backend.h"
#include "attnd/kernels.h"
#include "ref_paged.h"
#include "testutil.h"

#define MAX_SEQS 64

typedef struct pcase {
    char name[160];
    int num_seqs;
    int qlen[MAX_SEQS], ctx[MAX_SEQS];
    int hq, hk, d, bs;
    attnd_dtype q_dt, cache_dt, out_dt;
    int window;
    float softcap;
    int alibi, lse;
    int sinks; /* a sink logit per q head (one head's -inf: none) */
    int segments;
    int q_pad, out_pad; /* innermost row length in elements (0: contiguous) */
    double q_sigma;
    int runs; /* block tables in ascending runs of ids (a break about every 8 blocks), not a
                 permutation: the sm90 producer's one box per tile of one run */
} pcase;

static attnd_backend *g_cpu, *g_cuda;
static int g_pass, g_fail, g_verbose;

static void check(int ok, const char *what, const char *name, double err, double tol)
{
    if (ok)
        g_pass++;
    else
        g_fail++;
    if (!ok || g_verbose)
        printf("%s %-10s %s  err=%.3g tol=%.3g\n", ok ? "ok  " : "FAIL", what, name, err, tol);
}

/* ---------------------------------------------------------------- device mirrors */

typedef struct dev_tensor {
    attnd_tensor t; /* same shape and strides, device data */
    size_t bytes;
} dev_tensor;

static int dev_upload(dev_tensor *d, const attnd_test_tensor *h)
{
    d->t = h->t;
    d->bytes = h->bytes;
    d->t.data = NULL;
    if (h->t.data == NULL) return 0;
    if (attnd_backend_alloc(g_cuda, h->bytes, &d->t.data) != ATTND_ERR_OK) return -1;
    if (attnd_backend_memcpy(g_cuda, d->t.data, h->buf, h->bytes, ATTND_MEMCPY_H2D) != ATTND_ERR_OK)
        return -1;
    return 0;
}

static int dev_download(attnd_test_tensor *h, const dev_tensor *d)
{
    return attnd_backend_memcpy(g_cuda, h->buf, d->t.data, h->bytes, ATTND_MEMCPY_D2H) ==
                   ATTND_ERR_OK
               ? 0
               : -1;
}

static void dev_free(dev_tensor *d)
{
    attnd_backend_free(g_cuda, d->t.data);
    d->t.data = NULL;
}

/* Poison a device buffer (0xff bytes: NaN in every float dtype). */
static int dev_poison(dev_tensor *d)
{
    void *tmp = malloc(d->bytes ? d->bytes : 1);
    memset(tmp, 0xff, d->bytes);
    int rv =
        attnd_backend_memcpy(g_cuda, d->t.data, tmp, d->bytes, ATTND_MEMCPY_H2D) == ATTND_ERR_OK
            ? 0
            : -1;
    free(tmp);
    return rv;
}

/* ---------------------------------------------------------------- tolerances */

static double tol_of(attnd_dtype dt)
{
    return attnd_tol_for(dt);
}

/* The kernels compute in bf16 for bf16 caches and in f16 for f16 and fp8 caches (fp8 -> f16
 * is exact); Q is rounded to that type, P too, accumulation is f32. */
static double case_tol(const pcase *c)
{
    /* an f32 cache: exact f32 math on both sides, only the output's rounding differs */
    if (c->cache_dt == ATTND_DTYPE_F32)
        return c->out_dt == ATTND_DTYPE_F32 ? 1e-5 : tol_of(c->out_dt);
    double t = tol_of(c->cache_dt == ATTND_DTYPE_BF16 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16);
    double to = tol_of(c->out_dt);
    if (to > t) t = to;
    return t;
}

/* ---------------------------------------------------------------- one paged case */

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* The cuda 3D op on dp, twice (the second on the tickets the first left); before them, with
 * segments, a call on a misaligned workspace that must fail without launching anything. */
static attnd_err run_3d_twice(const pcase *c, const attnd_paged_params *dp, int segs, void *ws)
{
    if (segs > 1 && c->cache_dt != ATTND_DTYPE_F32) {
        attnd_err bad = attnd_paged_attention_3d(g_cuda, dp, segs, (char *)ws + 4);
        check(bad != ATTND_ERR_OK, "paged_3d_misaligned_ws", c->name, 0.0, 0.0);
    }
    attnd_err rv = attnd_paged_attention_3d(g_cuda, dp, segs, ws);
    return rv == ATTND_ERR_OK ? attnd_paged_attention_3d(g_cuda, dp, segs, ws) : rv;
}

static void run_paged_case(const pcase *c, attnd_rng *rng)
{
    const int S = c->num_seqs, g = c->hq / c->hk;
    (void)g;
    int64_t T = 0, nblk_total = 0, max_blk = 1, max_q = 0, max_seq = 0;
    for (int s = 0; s < S; s++) {
        int64_t L = c->qlen[s] + c->ctx[s];
        T += c->qlen[s];
        int64_t nb = cdiv(L, c->bs);
        nblk_total += nb;
        if (nb > max_blk) max_blk = nb;
        if (c->qlen[s] > max_q) max_q = c->qlen[s];
        if (L > max_seq) max_seq = L;
    }
    const int64_t num_blocks = nblk_total + 3;
    const float k_scale = c->cache_dt == ATTND_DTYPE_FP8_E4M3 ? 0.04f : 1.0f;
    const float v_scale = c->cache_dt == ATTND_DTYPE_FP8_E4M3 ? 0.03f : 1.0f;

    attnd_test_tensor q, kc, vc, out, lse, bt, sl, qsl, alibi, sinks, ws;
    int64_t qshape[3] = {T, c->hq, c->d};
    int64_t cshape[4] = {num_blocks, c->bs, c->hk, c->d};
    int64_t lshape[2] = {c->hq, T};
    int64_t btshape[2] = {S, max_blk};
    int64_t sshape[1] = {S}, qslshape[1] = {S + 1}, ashape[1] = {c->hq};
    attnd_tt_alloc_padded(&q, c->q_dt, 3, qshape, c->q_pad);
    attnd_tt_alloc(&kc, c->cache_dt, 4, cshape);
    attnd_tt_alloc(&vc, c->cache_dt, 4, cshape);
    attnd_tt_alloc_padded(&out, c->out_dt, 3, qshape, c->out_pad);
    attnd_tt_alloc(&lse, ATTND_DTYPE_F32, 2, lshape);
    attnd_tt_alloc(&bt, ATTND_DTYPE_I32, 2, btshape);
    attnd_tt_alloc(&sl, ATTND_DTYPE_I32, 1, sshape);
    attnd_tt_alloc(&qsl, ATTND_DTYPE_I32, 1, qslshape);
    memset(&alibi, 0, sizeof alibi);
    memset(&sinks, 0, sizeof sinks);
    if (c->alibi) attnd_tt_alloc(&alibi, ATTND_DTYPE_F32, 1, ashape);
    if (c->sinks) {
        attnd_tt_alloc(&sinks, ATTND_DTYPE_F32, 1, ashape);
        for (int h = 0; h < c->hq; h++) {
            int64_t i1[1] = {h};
            attnd_tt_set(&sinks, i1, h == 1 ? -INFINITY : attnd_rng_uniform(rng, -3.0, 4.0));
        }
    }
    attnd_tt_fill_normal(&q, rng, c->q_sigma, 1.0);
    attnd_tt_fill_normal(&kc, rng, 1.0, k_scale);
    attnd_tt_fill_normal(&vc, rng, 1.0, v_scale);

    /* block tables: a random permutation of the blocks; unused entries hold valid ids too */
    int64_t *perm = malloc((size_t)num_blocks * sizeof *perm);
    for (int64_t i = 0; i < num_blocks; i++)
        perm[i] = i;
    for (int64_t i = num_blocks - 1; i > 0; i--) {
        int64_t j = attnd_rng_int(rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t next = 0, tok = 0;
    for (int s = 0; s < S; s++) {
        int64_t L = c->qlen[s] + c->ctx[s], nb = cdiv(L, c->bs);
        int64_t id = attnd_rng_int(rng, 0, num_blocks - 1);
        for (int64_t j = 0; j < max_blk; j++) {
            int64_t idx[2] = {s, j};
            if (c->runs && j > 0)
                id = attnd_rng_int(rng, 0, 7) ? (id + 1) % num_blocks
                                              : attnd_rng_int(rng, 0, num_blocks - 1);
            int64_t at = j < nb ? next + j : attnd_rng_int(rng, 0, num_blocks - 1);
            attnd_tt_set(&bt, idx, (double)(c->runs ? id : perm[at]));
        }
        next += nb;
        int64_t i1[1] = {s};
        attnd_tt_set(&sl, i1, (double)L);
        attnd_tt_set(&qsl, i1, (double)tok);
        tok += c->qlen[s];
    }
    {
        int64_t i1[1] = {S};
        attnd_tt_set(&qsl, i1, (double)tok);
    }
    free(perm);
    if (c->alibi)
        for (int h = 0; h < c->hq; h++) {
            int64_t i1[1] = {h};
            attnd_tt_set(&alibi, i1, pow(2.0, -8.0 * (h + 1) / c->hq));
        }

    attnd_paged_params p;
    memset(&p, 0, sizeof p);
    p.q = q.t;
    p.k_cache = kc.t;
    p.v_cache = vc.t;
    p.out = out.t;
    if (c->lse) p.out_lse = lse.t;
    p.block_tables = bt.t;
    p.seq_lens = sl.t;
    p.query_start_loc = qsl.t;
    if (c->alibi) p.alibi_slopes = alibi.t;
    if (c->sinks) p.sinks = sinks.t;
    p.scale = (float)(1.0 / sqrt((double)c->d));
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.softcap = c->softcap;
    p.sliding_window = c->window;
    p.max_query_len = (int32_t)max_q;
    p.max_seq_len = (int32_t)max_seq;

    const double tol = case_tol(c);
    const int64_t n_out = T * c->hq * c->d, n_lse = c->hq * T;

    /* float64 reference (small cases) */
    double *ref = NULL, *ref_lse = NULL;
    double work = 0;
    for (int s = 0; s < S; s++)
        work += (double)c->qlen[s] * (c->qlen[s] + c->ctx[s]);
    work *= c->hq * c->d;
    if (work < 4e8) {
        ref = malloc((size_t)(n_out > 0 ? n_out : 1) * sizeof *ref);
        ref_lse = malloc((size_t)(n_lse > 0 ? n_lse : 1) * sizeof *ref_lse);
        attnd_ref_paged(&p, ref, ref_lse);
    }

    /* device copies */
    dev_tensor dq, dkc, dvc, dout, dlse, dbt, dsl, dqsl, dal, dsk;
    memset(&dal, 0, sizeof dal);
    memset(&dsk, 0, sizeof dsk);
    int bad = dev_upload(&dq, &q) || dev_upload(&dkc, &kc) || dev_upload(&dvc, &vc) ||
              dev_upload(&dout, &out) || dev_upload(&dlse, &lse) || dev_upload(&dbt, &bt) ||
              dev_upload(&dsl, &sl) || dev_upload(&dqsl, &qsl) ||
              (c->alibi && dev_upload(&dal, &alibi)) || (c->sinks && dev_upload(&dsk, &sinks));
    if (bad) {
        printf("FAIL setup     %s: device allocation/copy: %s\n", c->name,
               attnd_backend_last_error(g_cuda));
        g_fail++;
        goto done_dev;
    }
    attnd_paged_params dp = p;
    dp.q = dq.t;
    dp.k_cache = dkc.t;
    dp.v_cache = dvc.t;
    dp.out = dout.t;
    if (c->lse) dp.out_lse = dlse.t;
    dp.block_tables = dbt.t;
    dp.seq_lens = dsl.t;
    dp.query_start_loc = dqsl.t;
    if (c->alibi) dp.alibi_slopes = dal.t;
    if (c->sinks) dp.sinks = dsk.t;

    /* forms: 2D; 3D (split partials merged by the last segment's CTA, launched twice: the
     * second reuses the tickets the first reset); 3D with the reduce kernel */
    for (int form = 0; form < 3; form++) {
        static const char *kWhat[3] = {"paged_2d", "paged_3d", "paged_3d_reduce"};
        const char *what = kWhat[form];
        int segs = c->segments;
        if (form == 2 && (segs < 2 || c->cache_dt == ATTND_DTYPE_F32)) continue;
        size_t wsb = attnd_paged_3d_workspace_size(T, c->hq, c->d, segs);
        void *cpu_ws = NULL, *dws = NULL;
        attnd_err rv;
        /* cpu */
        attnd_tt_poison(&out);
        attnd_tt_poison(&lse);
        if (form == 0) {
            rv = attnd_paged_attention_2d(g_cpu, &p);
        } else {
            cpu_ws = malloc(wsb ? wsb : 1);
            rv = attnd_paged_attention_3d(g_cpu, &p, segs, cpu_ws);
        }
        if (rv != ATTND_ERR_OK) {
            printf("FAIL %-10s %s: cpu backend: %s (%s)\n", what, c->name, attnd_strerror(rv),
                   attnd_backend_last_error(g_cpu));
            g_fail++;
            free(cpu_ws);
            continue;
        }
        double *cpu_o = attnd_tt_to_f64(&out), *cpu_l = attnd_tt_to_f64(&lse);
        if (ref && form == 0) {
            double e = attnd_rel_l2(cpu_o, ref, n_out);
            if (!(e <= tol)) printf("note cpu-vs-f64 %s: %s err=%.3g\n", what, c->name, e);
        }
        /* cuda */
        if (dev_poison(&dout) || dev_poison(&dlse)) {
            g_fail++;
            goto next_form;
        }
        if (form == 0) {
            rv = attnd_paged_attention_2d(g_cuda, &dp);
        } else {
            if (attnd_backend_alloc(g_cuda, wsb, &dws) != ATTND_ERR_OK) {
                g_fail++;
                goto next_form;
            }
            attnd_cuda_of(g_cuda)->split_reduce = form == 2;
            rv = run_3d_twice(c, &dp, segs, dws);
            attnd_cuda_of(g_cuda)->split_reduce = 0;
        }
        if (rv == ATTND_ERR_OK) rv = attnd_backend_sync(g_cuda);
        if (rv != ATTND_ERR_OK) {
            printf("FAIL %-10s %s: cuda backend: %s (%s)\n", what, c->name, attnd_strerror(rv),
                   attnd_backend_last_error(g_cuda));
            g_fail++;
            goto next_form;
        }
        if (dev_download(&out, &dout) || dev_download(&lse, &dlse)) {
            g_fail++;
            goto next_form;
        }
        {
            double *gpu_o = attnd_tt_to_f64(&out), *gpu_l = attnd_tt_to_f64(&lse);
            double e = attnd_rel_l2(gpu_o, cpu_o, n_out);
            char nm[220];
            snprintf(nm, sizeof nm, "%s segs=%d", c->name, form ? segs : 0);
            if (ref && !(e <= tol)) {
                double er = attnd_rel_l2(gpu_o, ref, n_out);
                printf("note gpu-vs-f64 %s: %s err=%.3g\n", what, nm, er);
            }
            check(e <= tol, what, nm, e, tol);
            if (c->lse) {
                double el = attnd_rel_l2(gpu_l, cpu_l, n_lse);
                check(el <= tol, form ? (form == 1 ? "lse_3d" : "lse_3d_reduce") : "lse_2d", nm, el,
                      tol);
            }
            free(gpu_o);
            free(gpu_l);
        }
    next_form:
        free(cpu_o);
        free(cpu_l);
        free(cpu_ws);
        attnd_backend_free(g_cuda, dws);
    }

done_dev:
    dev_free(&dq);
    dev_free(&dkc);
    dev_free(&dvc);
    dev_free(&dout);
    dev_free(&dlse);
    dev_free(&dbt);
    dev_free(&dsl);
    dev_free(&dqsl);
    if (c->alibi) dev_free(&dal);
    if (c->sinks) dev_free(&dsk);
    free(ref);
    free(ref_lse);
    attnd_tt_free(&q);
    attnd_tt_free(&kc);
    attnd_tt_free(&vc);
    attnd_tt_free(&out);
    attnd_tt_free(&lse);
    attnd_tt_free(&bt);
    attnd_tt_free(&sl);
    attnd_tt_free(&qsl);
    if (c->alibi) attnd_tt_free(&alibi);
    if (c->sinks) attnd_tt_free(&sinks);
    (void)ws;
}

/* ---------------------------------------------------------------- cache write */

static void run_cache_write_case(int T, int hk, int d, int bs, attnd_dtype src_dt,
                                 attnd_dtype cache_dt, int slot_i32, attnd_rng *rng)
{
    char name[128];
    snprintf(name, sizeof name, "T=%d hk=%d d=%d bs=%d src=%s cache=%s slots=%s", T, hk, d, bs,
             attnd_dtype_name(src_dt), attnd_dtype_name(cache_dt), slot_i32 ? "i32" : "i64");
    const int64_t num_blocks = cdiv(T, bs) + 2;
    const float k_scale = 0.05f, v_scale = 0.02f;
    attnd_test_tensor key, val, kc, vc, kc2, vc2, sm;
    int64_t kshape[3] = {T, hk, d}, cshape[4] = {num_blocks, bs, hk, d}, sshape[1] = {T};
    attnd_tt_alloc(&key, src_dt, 3, kshape);
    attnd_tt_alloc(&val, src_dt, 3, kshape);
    attnd_tt_alloc(&kc, cache_dt, 4, cshape);
    attnd_tt_alloc(&vc, cache_dt, 4, cshape);
    attnd_tt_alloc(&kc2, cache_dt, 4, cshape);
    attnd_tt_alloc(&vc2, cache_dt, 4, cshape);
    attnd_tt_alloc(&sm, slot_i32 ? ATTND_DTYPE_I32 : ATTND_DTYPE_I64, 1, sshape);
    attnd_tt_fill_normal(&key, rng, 3.0, 1.0);
    attnd_tt_fill_normal(&val, rng, 3.0, 1.0);
    /* one value far past the fp8 range: saturates */
    if (T > 0) {
        int64_t i3[3] = {0, 0, 0};
        attnd_tt_set(&key, i3, 1e4);
    }
    attnd_tt_fill_normal(&kc, rng, 1.0, cache_dt == ATTND_DTYPE_FP8_E4M3 ? k_scale : 1.0);
    attnd_tt_fill_normal(&vc, rng, 1.0, cache_dt == ATTND_DTYPE_FP8_E4M3 ? v_scale : 1.0);
    memcpy(kc2.buf, kc.buf, kc.bytes);
    memcpy(vc2.buf, vc.buf, vc.bytes);
    /* distinct random slots, every 5th token padding */
    int64_t nslots = num_blocks * bs;
    int64_t *perm = malloc((size_t)nslots * sizeof *perm);
    for (int64_t i = 0; i < nslots; i++)
        perm[i] = i;
    for (int64_t i = nslots - 1; i > 0; i--) {
        int64_t j = attnd_rng_int(rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        int64_t i1[1] = {t};
        attnd_tt_set(&sm, i1, t % 5 == 3 ? -1.0 : (double)perm[t]);
    }
    free(perm);

    attnd_cache_write_params p;
    memset(&p, 0, sizeof p);
    p.key = key.t;
    p.value = val.t;
    p.k_cache = kc.t;
    p.v_cache = vc.t;
    p.slot_mapping = sm.t;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    attnd_err rv = attnd_cache_write(g_cpu, &p);
    if (rv != ATTND_ERR_OK) {
        printf("FAIL cache_write %s: cpu backend: %s (%s)\n", name, attnd_strerror(rv),
               attnd_backend_last_error(g_cpu));
        g_fail++;
        goto done;
    }
    dev_tensor dk, dv, dkc, dvc, dsm;
    if (dev_upload(&dk, &key) || dev_upload(&dv, &val) || dev_upload(&dkc, &kc2) ||
        dev_upload(&dvc, &vc2) || dev_upload(&dsm, &sm)) {
        printf("FAIL cache_write %s: device setup\n", name);
        g_fail++;
        goto done;
    }
    attnd_cache_write_params dp = p;
    dp.key = dk.t;
    dp.value = dv.t;
    dp.k_cache = dkc.t;
    dp.v_cache = dvc.t;
    dp.slot_mapping = dsm.t;
    rv = attnd_cache_write(g_cuda, &dp);
    if (rv == ATTND_ERR_OK) rv = attnd_backend_sync(g_cuda);
    if (rv != ATTND_ERR_OK) {
        printf("FAIL cache_write %s: cuda backend: %s (%s)\n", name, attnd_strerror(rv),
               attnd_backend_last_error(g_cuda));
        g_fail++;
    } else if (dev_download(&kc2, &dkc) || dev_download(&vc2, &dvc)) {
        g_fail++;
    } else {
        /* bit-exact: both round the same way (fp8: IEEE x / scale, then RNE, saturating) */
        int same = memcmp(kc.buf, kc2.buf, kc.bytes) == 0 && memcmp(vc.buf, vc2.buf, vc.bytes) == 0;
        size_t diff = 0;
        for (size_t i = 0; i < kc.bytes; i++)
            diff += ((uint8_t *)kc.buf)[i] != ((uint8_t *)kc2.buf)[i];
        for (size_t i = 0; i < vc.bytes; i++)
            diff += ((uint8_t *)vc.buf)[i] != ((uint8_t *)vc2.buf)[i];
        check(same, "cache_wr", name, (double)diff, 0.0);
    }
    dev_free(&dk);
    dev_free(&dv);
    dev_free(&dkc);
    dev_free(&dvc);
    dev_free(&dsm);
done:
    attnd_tt_free(&key);
    attnd_tt_free(&val);
    attnd_tt_free(&kc);
    attnd_tt_free(&vc);
    attnd_tt_free(&kc2);
    attnd_tt_free(&vc2);
    attnd_tt_free(&sm);
}

/* ---------------------------------------------------------------- the grid */

static const attnd_dtype kCache[4] = {ATTND_DTYPE_BF16, ATTND_DTYPE_F16, ATTND_DTYPE_FP8_E4M3,
                                      ATTND_DTYPE_F32};
static const attnd_dtype kFloat[3] = {ATTND_DTYPE_BF16, ATTND_DTYPE_F16, ATTND_DTYPE_F32};

static void name_case(pcase *c, const char *tag)
{
    int n =
        snprintf(c->name, sizeof c->name,
                 "%s hq=%d hk=%d d=%d bs=%d q=%s kv=%s o=%s w=%d cap=%g alibi=%d sinks=%d seqs=%d[",
                 tag, c->hq, c->hk, c->d, c->bs, attnd_dtype_name(c->q_dt),
                 attnd_dtype_name(c->cache_dt), attnd_dtype_name(c->out_dt), c->window,
                 (double)c->softcap, c->alibi, c->sinks, c->num_seqs);
    for (int s = 0; s < c->num_seqs && s < 3 && n < (int)sizeof c->name - 24; s++)
        n += snprintf(c->name + n, sizeof c->name - (size_t)n, "%d+%d ", c->qlen[s], c->ctx[s]);
    if (n < (int)sizeof c->name - 6) snprintf(c->name + n, sizeof c->name - (size_t)n, "..]");
}

static void base_case(pcase *c)
{
    memset(c, 0, sizeof *c);
    c->hq = 8;
    c->hk = 2;
    c->d = 128;
    c->bs = 16;
    c->q_dt = ATTND_DTYPE_BF16;
    c->cache_dt = ATTND_DTYPE_BF16;
    c->out_dt = ATTND_DTYPE_BF16;
    c->lse = 1;
    c->segments = 3;
    c->q_sigma = 1.0;
}

static void set_seqs(pcase *c, int n, const int *qlen, const int *ctx)
{
    c->num_seqs = n;
    for (int s = 0; s < n; s++) {
        c->qlen[s] = qlen[s];
        c->ctx[s] = ctx[s];
    }
}

/* A base case on three prefill sequences (query + context 300 + 0, 129 + 77, 64 + 200): whole
 * and partial 128-row tiles, with and without context. */
static void prefill_case(pcase *c)
{
    static const int q[3] = {300, 129, 64}, x[3] = {0, 77, 200};
    base_case(c);
    set_seqs(c, 3, q, x);
}

/* Mixed batch: decode rows, empty context, one-token sequence, an empty query, prefill chunks. */
static const int kMixQ[8] = {1, 1, 1, 5, 17, 40, 0, 1};
static const int kMixC[8] = {0, 1, 37, 60, 0, 100, 9, 200};

static void reduced_grid(attnd_rng *rng)
{
    pcase c;
    /* decode tiles, 3 segments, each cache dtype (f32: the exact kernel), sinks on two */
    for (int i = 0; i < 4; i++) {
        base_case(&c);
        c.cache_dt = kCache[i];
        c.sinks = i % 2;
        c.d = i == 2 ? 80 : 128;
        set_seqs(&c, 8, kMixQ, kMixC);
        name_case(&c, "reduced-mix");
        run_paged_case(&c, rng);
    }
    /* a split at GQA 8 over many segments (empty ones too), fp8 cache, sinks */
    {
        static const int q[4] = {1, 1, 1, 1}, x[4] = {700, 0, 1, 33};
        base_case(&c);
        c.hq = 8;
        c.hk = 1;
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.sinks = 1;
        c.segments = 37;
        set_seqs(&c, 4, q, x);
        name_case(&c, "reduced-split");
        run_paged_case(&c, rng);
    }
    /* unsplit decode of more (sequence, kv head) pairs than the SMs hold CTAs at once (a second
     * wave: 640 pairs; narrow tiles run 4 CTAs per SM, 528 on 132 SMs), fp8 */
    {
        static const int x[8] = {0, 1, 63, 64, 65, 200, 17, 130};
        int q[40], xx[40];
        for (int s = 0; s < 40; s++) {
            q[s] = s == 3 ? 0 : 1;
            xx[s] = x[s % 8];
        }
        base_case(&c);
        c.hq = 64;
        c.hk = 16;
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.segments = 1;
        c.sinks = 1;
        set_seqs(&c, 40, q, xx);
        name_case(&c, "reduced-wave2");
        run_paged_case(&c, rng);
    }
    /* the narrow fp8 decode tiles (at most 8 rows) with rows of two and four tokens (positions
     * differ per row): window + softcap + alibi at GQA 4, head 128; plain at GQA 2, head 256 */
    {
        static const int q[5] = {2, 1, 2, 0, 2}, x[5] = {0, 90, 301, 5, 47};
        static const int q4[3] = {4, 3, 4}, x4[3] = {129, 0, 64};
        base_case(&c);
        c.hq = 8;
        c.hk = 2;
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.window = 70;
        c.softcap = 12.0f;
        c.alibi = 1;
        c.segments = 3;
        set_seqs(&c, 5, q, x);
        name_case(&c, "reduced-narrow");
        run_paged_case(&c, rng);
        base_case(&c);
        c.hq = 4;
        c.hk = 2;
        c.d = 256;
        c.bs = 32;
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.segments = 1;
        set_seqs(&c, 3, q4, x4);
        name_case(&c, "reduced-narrow");
        run_paged_case(&c, rng);
    }
    /* prefill tiles (rows > 16): window + softcap + alibi, head 256 and 64 */
    {
        static const int q[2] = {70, 33}, x[2] = {20, 0};
        base_case(&c);
        set_seqs(&c, 2, q, x);
        c.window = 29;
        c.softcap = 8.0f;
        c.alibi = 1;
        c.q_sigma = 2.0;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.d = 256;
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.bs = 32;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.d = 96; /* fp8 on the sm90 core: its converting producer (general instantiation) */
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.d = 48;
        c.cache_dt = ATTND_DTYPE_F16;
        c.q_dt = ATTND_DTYPE_F32;
        c.out_dt = ATTND_DTYPE_F32;
        c.bs = 64;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.sinks = 1; /* the sm90 / sm80 prefill epilogue's sink */
        c.cache_dt = ATTND_DTYPE_BF16;
        c.d = 128;
        c.bs = 16;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.cache_dt = ATTND_DTYPE_F32; /* every option on the exact kernel */
        c.d = 72;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
    }
    /* fp8 on the sm90 core's plain instantiation (no options): head 64, pages of 16; head 256
     * (64-key tiles); then the sinks instantiation at head 128 */
    {
        static const int q[2] = {70, 33}, x[2] = {20, 0};
        base_case(&c);
        set_seqs(&c, 2, q, x);
        c.cache_dt = ATTND_DTYPE_FP8_E4M3;
        c.d = 64;
        c.bs = 16;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.d = 256;
        c.bs = 64;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
        c.d = 128;
        c.sinks = 1;
        name_case(&c, "reduced-prefill");
        run_paged_case(&c, rng);
    }
    /* block tables in runs (the sm90 producer's one box per tile): 16-bit and fp8 caches, block
     * sizes 16 / 32 / 64, heads 128 / 64 / 256, tiles wholly in a run and across its breaks */
    for (int i = 0; i < 6; i++) {
        static const int bs[3] = {16, 32, 64}, d[3] = {128, 64, 256};
        prefill_case(&c);
        c.runs = 1;
        c.cache_dt = i % 2 ? ATTND_DTYPE_FP8_E4M3 : ATTND_DTYPE_BF16;
        c.bs = bs[i % 3];
        c.d = d[(i / 2) % 3];
        c.sinks = i == 4;
        name_case(&c, "reduced-runs");
        run_paged_case(&c, rng);
    }
    /* groups for Q by TMA on the sm90 plain core (boxes of g heads x 64 / g tokens): 64 (one
     * token a box), and 6 and 3 (not dividing 64: Q copied by cp.async) */
    for (int i = 0; i < 3; i++) {
        static const int hq[3] = {64, 12, 6}, hk[3] = {1, 2, 2};
        prefill_case(&c);
        c.hq = hq[i];
        c.hk = hk[i];
        c.runs = i != 1;
        name_case(&c, "reduced-qgroup");
        run_paged_case(&c, rng);
    }
    run_cache_write_case(37, 2, 128, 16, ATTND_DTYPE_BF16, ATTND_DTYPE_FP8_E4M3, 0, rng);
    run_cache_write_case(20, 3, 40, 32, ATTND_DTYPE_F32, ATTND_DTYPE_BF16, 1, rng);
    run_cache_write_case(20, 2, 64, 16, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 0, rng);
}

static void full_grid(attnd_rng *rng)
{
    pcase c;
    static const int heads[6][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {32, 1}, {32, 8}};
    static const int dims[12] = {32, 40, 64, 72, 80, 96, 112, 128, 160, 192, 224, 256};
    static const int bss[3] = {16, 32, 64};
    static const int segs[6] = {1, 2, 3, 7, 16, 64};
    int k = 0;

    /* 1. every head size x cache dtype on the mixed batch, rotating the other axes */
    for (int di = 0; di < 12; di++)
        for (int ci = 0; ci < 4; ci++, k++) {
            base_case(&c);
            c.d = dims[di];
            c.cache_dt = kCache[ci];
            c.sinks = k % 3 == 1;
            c.hq = heads[k % 6][0];
            c.hk = heads[k % 6][1];
            c.bs = bss[k % 3];
            c.q_dt = kFloat[(k / 3) % 3];
            c.out_dt = kFloat[(k / 2) % 3];
            c.segments = segs[k % 6];
            c.lse = k % 4 != 1;
            c.q_pad = k % 5 == 2 ? c.d + 8 : (k % 5 == 4 ? c.d + 4 : 0);
            c.out_pad = k % 7 == 3 ? c.d + 4 : 0;
            set_seqs(&c, 8, kMixQ, kMixC);
            name_case(&c, "mix");
            run_paged_case(&c, rng);
        }

    /* 2. features (window, softcap, ALiBi, all, sinks with all) x cache dtype x GQA 1/4/8/32 */
    for (int f = 0; f < 5; f++)
        for (int ci = 0; ci < 4; ci++)
            for (int hi = 0; hi < 4; hi++, k++) {
                static const int hsel[4] = {0, 1, 2, 4};
                base_case(&c);
                c.hq = heads[hsel[hi]][0];
                c.hk = heads[hsel[hi]][1];
                c.cache_dt = kCache[ci];
                c.d = (f + ci) % 2 ? 128 : 96;
                c.bs = bss[(f + hi) % 3];
                c.window = (f == 0 || f >= 3) ? 1 + (int)attnd_rng_int(rng, 0, 70) : 0;
                c.softcap = (f == 1 || f >= 3) ? 6.0f : 0.0f;
                c.alibi = f >= 2;
                c.sinks = f == 4;
                c.q_sigma = f == 1 ? 3.0 : 1.0;
                c.segments = segs[k % 6];
                c.out_dt = kFloat[k % 3];
                static const int q[5] = {1, 50, 3, 130, 1}, x[5] = {300, 20, 17, 0, 5};
                set_seqs(&c, 5, q, x);
                name_case(&c, "feat");
                run_paged_case(&c, rng);
            }

    /* 3. decode batches (3D's case): contexts around block edges, many segments (the reduce's
     * sink on half) */
    for (int ci = 0; ci < 4; ci++)
        for (int si = 0; si < 6; si++, k++) {
            base_case(&c);
            c.hq = 32;
            c.hk = 8;
            c.cache_dt = kCache[ci];
            c.sinks = si % 2;
            c.bs = bss[si % 3];
            c.segments = segs[si];
            c.q_dt = kFloat[si % 2];
            c.out_dt = kFloat[(si + ci) % 3];
            static const int x[12] = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 2047, 2900, 333};
            int qq[12];
            for (int s = 0; s < 12; s++)
                qq[s] = 1;
            set_seqs(&c, 12, qq, x);
            name_case(&c, "decode");
            run_paged_case(&c, rng);
        }

    /* 3b. decode splits at GQA 1, 8 and 32 (two q-blocks per sequence), many segments (empty
     * ones past the short contexts), head sizes 64 / 96 / 256, 16-bit and fp8 caches */
    for (int hi = 0; hi < 3; hi++)
        for (int ci = 0; ci < 2; ci++)
            for (int si = 0; si < 2; si++, k++) {
                static const int hsel[3] = {0, 3, 4}, dsel[3] = {64, 96, 256};
                static const int nseg[2] = {5, 130};
                base_case(&c);
                c.hq = heads[hsel[hi]][0];
                c.hk = heads[hsel[hi]][1];
                c.d = dsel[(hi + si) % 3];
                c.cache_dt = kCache[ci * 2];
                c.bs = bss[(hi + ci) % 3];
                c.sinks = (hi + si) % 2;
                c.segments = nseg[si];
                c.out_dt = kFloat[(hi + ci) % 3];
                static const int x[6] = {5000, 0, 1, 2100, 31, 17};
                int qq[6] = {1, 1, 1, 1, 1, 1};
                set_seqs(&c, 6, qq, x);
                name_case(&c, "split");
                run_paged_case(&c, rng);
            }

    /* 3c. unsplit decode of more (sequence, kv head) pairs than two CTAs per SM (a second wave
     * of CTAs): contexts around tile edges, an empty query, two query tokens, head sizes
     * 128 / 96, 16-bit and fp8 caches */
    for (int ci = 0; ci < 3; ci++)
        for (int vi = 0; vi < 2; vi++, k++) {
            base_case(&c);
            c.hq = 32;
            c.hk = 8;
            c.d = vi ? 96 : 128;
            c.cache_dt = kCache[ci];
            c.bs = bss[(ci + vi) % 3];
            c.segments = 1;
            c.sinks = vi;
            c.alibi = ci == 1 && vi == 1;
            c.softcap = ci == 2 && vi == 1 ? 6.0f : 0.0f;
            c.out_dt = kFloat[(ci + vi) % 3];
            static const int x[12] = {0, 1, 15, 64, 65, 127, 200, 1000, 2047, 513, 63, 4};
            int qq[64], xx[64];
            const int n = vi ? 64 : 48;
            for (int s = 0; s < n; s++) {
                qq[s] = s == 5 ? 0 : (s == 9 ? 2 : 1);
                xx[s] = x[(s * 7 + ci) % 12];
            }
            set_seqs(&c, n, qq, xx);
            name_case(&c, "wave2");
            run_paged_case(&c, rng);
        }

    /* 4. prefill tiles: long queries with and without context (full 128-row tiles, causal) */
    for (int ci = 0; ci < 4; ci++)
        for (int hi = 0; hi < 3; hi++, k++) {
            static const int hsel[3] = {1, 0, 5};
            prefill_case(&c);
            c.sinks = hi == 1;
            c.hq = heads[hsel[hi]][0];
            c.hk = heads[hsel[hi]][1];
            c.cache_dt = kCache[ci];
            c.bs = bss[(ci + hi) % 3];
            c.d = hi == 2 ? 64 : 128;
            c.segments = segs[k % 6];
            c.window = hi == 1 ? 200 : 0;
            c.runs = (ci + hi) % 2;
            name_case(&c, c.runs ? "prefill-runs" : "prefill");
            run_paged_case(&c, rng);
        }

    /* 5. random cases */
    for (int r = 0; r < 24; r++, k++) {
        base_case(&c);
        int hi = (int)attnd_rng_int(rng, 0, 5);
        c.hq = heads[hi][0];
        c.hk = heads[hi][1];
        c.d = 8 * (int)attnd_rng_int(rng, 4, 32);
        c.bs = bss[attnd_rng_int(rng, 0, 2)];
        c.cache_dt = kCache[attnd_rng_int(rng, 0, 3)];
        c.q_dt = kFloat[attnd_rng_int(rng, 0, 2)];
        c.out_dt = kFloat[attnd_rng_int(rng, 0, 2)];
        c.sinks = (int)attnd_rng_int(rng, 0, 1);
        c.window = attnd_rng_int(rng, 0, 2) == 0 ? (int)attnd_rng_int(rng, 1, 300) : 0;
        c.softcap = attnd_rng_int(rng, 0, 3) == 0 ? 10.0f : 0.0f;
        c.alibi = attnd_rng_int(rng, 0, 3) == 0;
        c.lse = (int)attnd_rng_int(rng, 0, 1);
        c.segments = (int)attnd_rng_int(rng, 1, 40);
        int n = (int)attnd_rng_int(rng, 1, 10);
        c.num_seqs = n;
        for (int s = 0; s < n; s++) {
            int kind = (int)attnd_rng_int(rng, 0, 3);
            c.qlen[s] = kind == 0 ? 1 : (int)attnd_rng_int(rng, 0, kind == 3 ? 200 : 20);
            c.ctx[s] = (int)attnd_rng_int(rng, 0, kind == 1 ? 2 : 700);
        }
        name_case(&c, "random");
        run_paged_case(&c, rng);
    }

    /* 6. more prefill tiles than SMs (the sm90 core's persistent CTAs take several each), uneven
     * sequences, 16-bit and fp8 caches */
    for (int ci = 0; ci < 3; ci++, k++) {
        base_case(&c);
        c.hq = 16;
        c.hk = 2;
        c.cache_dt = kCache[ci];
        c.bs = bss[(ci + 1) % 3];
        c.window = ci == 1 ? 700 : 0;
        c.softcap = ci == 0 ? 20.0f : 0.0f;
        c.sinks = ci == 1;
        c.segments = 1;
        c.runs = ci != 1;
        static const int q[4] = {1024, 700, 1, 900}, x[4] = {512, 0, 333, 1234};
        set_seqs(&c, 4, q, x);
        name_case(&c, c.runs ? "big-runs" : "big");
        run_paged_case(&c, rng);
    }

    /* cache write: every source x cache dtype, block sizes, odd head sizes, i32 and i64 slots */
    for (int si = 0; si < 3; si++)
        for (int ci = 0; ci < 4; ci++) {
            static const int d[3] = {128, 40, 256};
            run_cache_write_case(50 + 13 * si, 1 + ci, d[(si + ci) % 3], bss[(si + 2 * ci) % 3],
                                 kFloat[si], kCache[ci], (si + ci) % 2, rng);
        }
}

int main(int argc, char **argv)
{
    int reduced = 0, core = 0, off = 0;
    uint64_t seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reduced") == 0)
            reduced = 1;
        else if (strcmp(argv[i], "--verbose") == 0)
            g_verbose = 1;
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--core") == 0 && i + 1 < argc)
            core = atoi(argv[++i]);
        else if (strcmp(argv[i], "--sm90-off") == 0 && i + 1 < argc)
            off = atoi(argv[++i]);
        else {
            fprintf(
                stderr,
                "usage: %s [--reduced] [--seed N] [--verbose] [--core 80|90] [--sm90-off MASK]\n",
                argv[0]);
            return 2;
        }
    }
    attnd_err rv = attnd_backend_open(&g_cpu, "cpu", NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "gpu_paged: cannot open the cpu backend: %s\n", attnd_strerror(rv));
        return 1;
    }
    rv = attnd_backend_open(&g_cuda, "cuda", NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "gpu_paged: cannot open the cuda backend: %s\n", attnd_strerror(rv));
        attnd_backend_close(g_cpu);
        return 1;
    }
    attnd_cuda_of(g_cuda)->paged_core = core;
    attnd_cuda_of(g_cuda)->sm90_off = off;
    printf("gpu_paged: seed %llu%s, prefill core %s, cc %d%s\n", (unsigned long long)seed,
           reduced ? " (reduced grid)" : "", core ? (core == 80 ? "sm80" : "sm90") : "auto",
           attnd_cuda_of(g_cuda)->cc, off ? ", sm90 features off" : "");
    attnd_rng rng;
    attnd_rng_seed(&rng, seed);
    if (reduced)
        reduced_grid(&rng);
    else
        full_grid(&rng);
    attnd_backend_close(g_cuda);
    attnd_backend_close(g_cpu);
    printf("gpu_paged: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 && g_pass > 0 ? 0 : 1;
}
