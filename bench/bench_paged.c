/* bench_paged: times the cuda backend's paged attention on the anchor shapes (bf16, 32 q heads,
 * 8 kv heads, head 128, block 16) with CUDA events on the backend's stream: warm-up, then the
 * median of many runs, rotating over input sets that together exceed the L2 several times.
 *
 *   decode  (3D + reduce): GB/s  = K/V bytes the context holds (batch * ctx * 8 * 128 * 2 * elem)
 *                                  / time, as ../shared/anchors/bench_anchors.py counts them
 *   prefill (2D, causal):  TFLOP/s = 4 * batch * 32 * 128 * L^2 / 2 / time
 *
 *   bench_paged [--sweep] [--ab] [--quick] [--only SUBSTR] [--off LIST] [--l2 MIB] [--in-order]
 *
 * --sweep also times every segment count of a small list for each decode case (the chosen one is
 * marked); --ab times each decode case's split with the reduce kernel too (the backend's
 * split_reduce), alternating three rounds with the default merge; --only runs the cases whose key
 * (decode-bf16-1x32768, decode-fp8_e4m3-64x4096, prefill-1x8192, ...) contains SUBSTR (for
 * profilers); --off runs the prefill cases on the sm90 core with each ATTND_SM90_NO_* mask of a
 * comma-separated LIST (e.g. 0,256,8192) instead of the built-in variants, three rounds, each
 * starting one variant later (for per-launch A/B under a profiler's fixed clocks); --l2 sizes the
 * sm90 core's tile sections as if the L2 held MIB MiB; --in-order lays each sequence's blocks out
 * as one ascending run (as the daemon's free list hands a prompt's blocks out of a fresh cache)
 * instead of a random permutation of the pool. Prints one line per case and a summary table
 * last. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../kernels/cuda/cuda_backend.h"
#include "attnd/kernels.h"
#include "attnd/plan.h"
#include "check.h"

#define HQ 32
#define HK 8
#define HD 128
#define BS 16
#define MAX_SETS 8

static attnd_backend *g_b;
static cudaStream_t g_stream;
static int g_num_sms;
static size_t g_l2;
static int g_in_order; /* block tables: each sequence one ascending run, not shuffled */

/* ---------------------------------------------------------------- random device data */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

static double rnd_normal(void)
{
    double u1 = ((double)(rnd() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(rnd() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A 32 MiB pattern of N(0,1) values in dtype dt (fp8: divided by 0.05), copied over the buffer
 * at a random rotation so sets differ. */
#define PATTERN_BYTES (32u << 20)
static void *g_pat[4];

static const void *pattern(attnd_dtype dt)
{
    if (g_pat[dt]) return g_pat[dt];
    size_t es = attnd_dtype_size(dt), n = PATTERN_BYTES / es;
    unsigned char *p = malloc(PATTERN_BYTES);
    for (size_t i = 0; i < n; i++)
        attnd_store_f32(p, dt, (int64_t)i,
                        (float)(rnd_normal() / (dt == ATTND_DTYPE_FP8_E4M3 ? 0.05 : 1.0)));
    g_pat[dt] = p;
    return p;
}

static void *dev_random(size_t bytes, attnd_dtype dt)
{
    void *d = NULL;
    ATTND_CHECK(attnd_backend_alloc(g_b, bytes, &d), g_b);
    const unsigned char *pat = pattern(dt);
    size_t rot = (size_t)(rnd() % (PATTERN_BYTES / 16)) * 16;
    for (size_t off = 0; off < bytes;) {
        size_t n = PATTERN_BYTES - rot;
        if (n > bytes - off) n = bytes - off;
        ATTND_CHECK_CUDA(
            cudaMemcpy((unsigned char *)d + off, pat + rot, n, cudaMemcpyHostToDevice));
        off += n;
        rot = 0;
    }
    return d;
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    ATTND_CHECK(attnd_backend_alloc(g_b, bytes, &d), g_b);
    ATTND_CHECK_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* ---------------------------------------------------------------- one input set */

typedef struct set {
    attnd_paged_params p;
    void *bufs[9];
    int nbufs;
    void *ws;
    size_t ws_bytes;
} set;

static void tensor(attnd_tensor *t, void *data, attnd_dtype dt, int nd, int64_t a, int64_t b,
                   int64_t c, int64_t d)
{
    int64_t shape[4] = {a, b, c, d};
    attnd_tensor_init(t, data, dt, nd, shape);
}

static void make_set(set *s, int batch, int ctx, int qlen, attnd_dtype cache_dt, int segments)
{
    memset(s, 0, sizeof *s);
    int64_t nblk_seq = (ctx + BS - 1) / BS, nblocks = batch * nblk_seq + 8;
    int64_t T = (int64_t)batch * qlen;
    size_t ces = attnd_dtype_size(cache_dt);
    size_t cache_bytes = (size_t)nblocks * BS * HK * HD * ces;
    void *k = dev_random(cache_bytes, cache_dt), *v = dev_random(cache_bytes, cache_dt);
    void *q = dev_random((size_t)T * HQ * HD * 2, ATTND_DTYPE_BF16);
    void *out = dev_random((size_t)T * HQ * HD * 2, ATTND_DTYPE_BF16);
    int32_t *bt = malloc((size_t)batch * nblk_seq * sizeof *bt);
    int64_t *perm = malloc((size_t)(nblocks - 8) * sizeof *perm);
    for (int64_t i = 0; i < nblocks - 8; i++)
        perm[i] = i;
    for (int64_t i = nblocks - 9; i > 0 && !g_in_order; i--) {
        int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < batch * nblk_seq; i++)
        bt[i] = (int32_t)perm[i];
    int32_t *sl = malloc((size_t)batch * sizeof *sl),
            *qsl = malloc((size_t)(batch + 1) * sizeof *qsl);
    for (int b = 0; b < batch; b++)
        sl[b] = ctx;
    for (int b = 0; b <= batch; b++)
        qsl[b] = b * qlen;
    void *dbt = dev_copy(bt, (size_t)batch * nblk_seq * sizeof *bt);
    void *dsl = dev_copy(sl, (size_t)batch * sizeof *sl);
    void *dqsl = dev_copy(qsl, (size_t)(batch + 1) * sizeof *qsl);
    free(bt);
    free(perm);
    free(sl);
    free(qsl);

    attnd_paged_params *p = &s->p;
    tensor(&p->q, q, ATTND_DTYPE_BF16, 3, T, HQ, HD, 0);
    tensor(&p->k_cache, k, cache_dt, 4, nblocks, BS, HK, HD);
    tensor(&p->v_cache, v, cache_dt, 4, nblocks, BS, HK, HD);
    tensor(&p->out, out, ATTND_DTYPE_BF16, 3, T, HQ, HD, 0);
    tensor(&p->block_tables, dbt, ATTND_DTYPE_I32, 2, batch, nblk_seq, 0, 0);
    tensor(&p->seq_lens, dsl, ATTND_DTYPE_I32, 1, batch, 0, 0, 0);
    tensor(&p->query_start_loc, dqsl, ATTND_DTYPE_I32, 1, batch + 1, 0, 0, 0);
    p->scale = 1.0f / sqrtf((float)HD);
    p->k_scale = 0.05f;
    p->v_scale = 0.05f;
    p->max_query_len = qlen;
    p->max_seq_len = ctx;
    void *b[] = {k, v, q, out, dbt, dsl, dqsl};
    for (int i = 0; i < 7; i++)
        s->bufs[i] = b[i];
    s->nbufs = 7;
    if (segments > 0) {
        s->ws_bytes = attnd_paged_3d_workspace_size(T, HQ, HD, segments);
        ATTND_CHECK(attnd_backend_alloc(g_b, s->ws_bytes, &s->ws), g_b);
    }
}

static void free_set(set *s)
{
    for (int i = 0; i < s->nbufs; i++)
        attnd_backend_free(g_b, s->bufs[i]);
    attnd_backend_free(g_b, s->ws);
}

static size_t set_bytes(int batch, int ctx, int qlen, attnd_dtype cache_dt)
{
    size_t nblocks = (size_t)batch * ((ctx + BS - 1) / BS) + 8;
    return 2 * nblocks * BS * HK * HD * attnd_dtype_size(cache_dt) +
           2 * (size_t)batch * qlen * HQ * HD * 2;
}

/* ---------------------------------------------------------------- timing */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of iters runs of the op (3D when segments > 0, else 2D), rotating over nsets. */
static float time_op(set *sets, int nsets, int segments, int warmup, int iters)
{
    cudaEvent_t *ev = malloc((size_t)(iters + 1) * 2 * sizeof *ev);
    float *ms = malloc((size_t)iters * sizeof *ms);
    for (int i = 0; i < 2 * iters; i++)
        ATTND_CHECK_CUDA(cudaEventCreate(&ev[i]));
    for (int i = 0; i < warmup + iters; i++) {
        set *s = &sets[i % nsets];
        int timed = i >= warmup;
        if (timed) ATTND_CHECK_CUDA(cudaEventRecord(ev[2 * (i - warmup)], g_stream));
        if (segments > 0)
            ATTND_CHECK(attnd_paged_attention_3d(g_b, &s->p, segments, s->ws), g_b);
        else
            ATTND_CHECK(attnd_paged_attention_2d(g_b, &s->p), g_b);
        if (timed) ATTND_CHECK_CUDA(cudaEventRecord(ev[2 * (i - warmup) + 1], g_stream));
    }
    ATTND_CHECK(attnd_backend_sync(g_b), g_b);
    for (int i = 0; i < iters; i++)
        ATTND_CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    for (int i = 0; i < 2 * iters; i++)
        ATTND_CHECK_CUDA(cudaEventDestroy(ev[i]));
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    float med = ms[iters / 2];
    free(ev);
    free(ms);
    return med;
}

static int num_sets_for(size_t bytes)
{
    size_t want = 4 * g_l2;
    int n = (int)((want + bytes - 1) / bytes);
    if (n < 2) n = 2;
    if (n > MAX_SETS) n = MAX_SETS;
    return n;
}

/* Segment count for a decode batch: fill the GPU with about two CTAs per SM (the decode tiles'
 * occupancy), never cutting segments below 8 blocks (128 tokens) of context. */
/* The daemon's choice (kernels/plan): a decode launch of batch sequences at ctx. */
static int pick_segments(int batch, int ctx)
{
    attnd_plan_opts o = attnd_plan_opts_for(BS, HQ, HK, HD, g_num_sms);
    int segs = attnd_plan_segments(&o, batch, (ctx + BS - 1) / BS);
    if (o.max_split_rows > 0 && (int64_t)segs * batch > o.max_split_rows)
        segs = o.max_split_rows / batch;
    return segs < 1 ? 1 : segs;
}

/* ---------------------------------------------------------------- cases */

typedef struct result {
    char name[64];
    float ms;
    double figure; /* GB/s or TFLOP/s */
    const char *unit;
    int segments;
} result;

#define MAX_RESULTS 160
static result g_res[MAX_RESULTS];
static int g_nres;

/* The next result row; the table has room for every case this bench runs (checked). */
static result *next_result(void)
{
    if (g_nres == MAX_RESULTS) {
        fprintf(stderr, "bench_paged: more than %d results: raise MAX_RESULTS\n", MAX_RESULTS);
        exit(1);
    }
    return &g_res[g_nres++];
}
static const char *g_only;
#define MAX_OFFS 16
static int g_offs[MAX_OFFS], g_noffs; /* --off: the sm90 variants (masks) to run */
static int g_ab;                      /* --ab: decode splits timed with the reduce kernel too */

#ifdef ATTND_DECODE_TIMELINE
static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A builds-only look at one launch's CTAs (kernels built with ATTND_DECODE_TIMELINE): after a
 * warm-up over the sets, one launch records per CTA its SM, start, first tile in, warp 0's loop
 * done, partials stored, end and whether it merged; quantiles of each (us from the first start)
 * are printed and every CTA written to $TIMELINE_DIR/timeline_NAME.csv when set. */
static void timeline_case(set *sets, int nsets, int segments, int batch, const char *name)
{
    attnd_cuda *c = attnd_cuda_of(g_b);
    const size_t ctas = (size_t)batch * HK * (size_t)segments;
    unsigned long long *h = malloc(ctas * 8 * sizeof *h);
    void *d = NULL;
    ATTND_CHECK(attnd_backend_alloc(g_b, ctas * 8 * sizeof *h, &d), g_b);
    for (int i = 0; i < 2 * nsets; i++) {
        int last = i == 2 * nsets - 1;
        if (last) {
            ATTND_CHECK_CUDA(cudaMemsetAsync(d, 0, ctas * 8 * sizeof *h, g_stream));
            c->decode_timeline = (unsigned long long *)d;
        }
        ATTND_CHECK(attnd_paged_attention_3d(g_b, &sets[i % nsets].p, segments, sets[i % nsets].ws),
                    g_b);
    }
    ATTND_CHECK(attnd_backend_sync(g_b), g_b);
    c->decode_timeline = NULL;
    ATTND_CHECK_CUDA(cudaMemcpy(h, d, ctas * 8 * sizeof *h, cudaMemcpyDeviceToHost));
    attnd_backend_free(g_b, d);
    unsigned long long t0 = ~0ull;
    for (size_t i = 0; i < ctas; i++)
        if (h[i * 8 + 1] && h[i * 8 + 1] < t0) t0 = h[i * 8 + 1];
    const char *dir = getenv("TIMELINE_DIR");
    FILE *f = NULL;
    if (dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/timeline_%s.csv", dir, name);
        f = fopen(path, "w");
        if (f) fprintf(f, "cta,sm,start,first,loop,stored,end,merged\n");
    }
    int64_t *col = malloc(ctas * sizeof *col);
    static const char *what[] = {"start", "first tile", "loop done", "stored", "end"};
    printf("    timeline %s: %zu CTAs, us from the first start (min p10 p50 p90 max):\n", name,
           ctas);
    for (int k = 1; k <= 5; k++) {
        for (size_t i = 0; i < ctas; i++)
            col[i] = h[i * 8 + k] ? (int64_t)(h[i * 8 + k] - t0) : -1;
        qsort(col, ctas, sizeof *col, cmp_i64);
        printf("      %-10s %7.2f %7.2f %7.2f %7.2f %7.2f\n", what[k - 1], col[0] / 1e3,
               col[ctas / 10] / 1e3, col[ctas / 2] / 1e3, col[ctas * 9 / 10] / 1e3,
               col[ctas - 1] / 1e3);
    }
    for (size_t i = 0; f && i < ctas; i++) {
        const unsigned long long *r = h + i * 8;
        fprintf(f, "%zu,%llu", i, r[0]);
        for (int k = 1; k <= 5; k++)
            fprintf(f, ",%lld", r[k] ? (long long)(r[k] - t0) : -1ll);
        fprintf(f, ",%llu\n", r[6]);
    }
    if (f) fclose(f);
    free(col);
    free(h);
}
#endif

static int selected(const char *kind, const char *dt, int batch, int n)
{
    char key[96];
    if (dt)
        snprintf(key, sizeof key, "%s-%s-%dx%d", kind, dt, batch, n);
    else
        snprintf(key, sizeof key, "%s-%dx%d", kind, batch, n);
    return g_only == NULL || strstr(key, g_only) != NULL;
}

static float bench_decode(int batch, int ctx, attnd_dtype cache_dt, int sweep, int quick)
{
    if (!selected("decode", attnd_dtype_name(cache_dt), batch, ctx)) return 0.0f;
    set sets[MAX_SETS];
    int nsets = num_sets_for(set_bytes(batch, ctx, 1, cache_dt));
    int chosen = pick_segments(batch, ctx);
    static const int sweep_list[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33, 48, 64, 66, 132};
    int max_segs = chosen;
    if (sweep)
        for (size_t i = 0; i < sizeof sweep_list / sizeof *sweep_list; i++)
            if (sweep_list[i] > max_segs) max_segs = sweep_list[i];
    for (int i = 0; i < nsets; i++)
        make_set(&sets[i], batch, ctx, 1, cache_dt, max_segs);
    double bytes = (double)batch * ctx * HK * HD * 2 * (double)attnd_dtype_size(cache_dt);
    int iters = quick ? 30 : 200;
    float ms = time_op(sets, nsets, chosen, 20, iters);
    result *r = next_result();
    snprintf(r->name, sizeof r->name, "decode %s %d x %d", attnd_dtype_name(cache_dt), batch, ctx);
    r->ms = ms;
    r->figure = bytes / ms / 1e6;
    r->unit = "GB/s";
    r->segments = chosen;
    printf("%-28s segs=%-4d %8.4f ms %8.1f GB/s  (sets=%d)\n", r->name, chosen, ms, r->figure,
           nsets);
    if (g_ab && chosen > 1) /* the chosen split, merged by tickets vs the reduce kernel */
        for (int round = 0; round < 3; round++) {
            float t[2];
            for (int v = 0; v < 2; v++) {
                attnd_cuda_of(g_b)->split_reduce = v;
                t[v] = time_op(sets, nsets, chosen, 5, quick ? 20 : 100);
            }
            attnd_cuda_of(g_b)->split_reduce = 0;
            printf("    ab segs=%-4d tickets %8.4f ms  reduce %8.4f ms\n", chosen, t[0], t[1]);
        }
#ifdef ATTND_DECODE_TIMELINE
    {
        char tag[64];
        snprintf(tag, sizeof tag, "%s-%dx%d", attnd_dtype_name(cache_dt), batch, ctx);
        timeline_case(sets, nsets, chosen, batch, tag);
    }
#endif
    if (sweep) {
        int nb = (ctx + BS - 1) / BS;
        for (size_t i = 0; i < sizeof sweep_list / sizeof *sweep_list; i++) {
            int sg = sweep_list[i];
            if (sg > nb) continue;
            float t = time_op(sets, nsets, sg, 5, quick ? 20 : 100);
            printf("    sweep segs=%-4d %8.4f ms %8.1f GB/s%s\n", sg, t, bytes / t / 1e6,
                   sg == chosen ? "  <- chosen" : "");
        }
    }
    fflush(stdout);
    for (int i = 0; i < nsets; i++)
        free_set(&sets[i]);
    return ms;
}

/* Prefill on each core the device has (sm90: all features on, then each turned off alone; sm80):
 * three rounds over the list, each starting one variant later, so that neither drift nor the
 * clocks after a light variant favour one of them. An fp8 cache: the default and the sm80 core. */
static void bench_prefill(int batch, int L, attnd_dtype cache_dt, int quick)
{
    const int fp8 = cache_dt == ATTND_DTYPE_FP8_E4M3;
    if (!selected("prefill", fp8 ? attnd_dtype_name(cache_dt) : NULL, batch, L)) return;
    attnd_cuda *c = attnd_cuda_of(g_b);
    set sets[MAX_SETS];
    int nsets = num_sets_for(set_bytes(batch, L, L, cache_dt));
    for (int i = 0; i < nsets; i++)
        make_set(&sets[i], batch, L, L, cache_dt, 0);
    double flops = 4.0 * batch * HQ * HD * (double)L * L / 2.0;
    struct {
        int core, off;
        const char *tag;
    } variants[MAX_OFFS + 1] = {{0, 0, "default"},
                                {90, 8192, "sm90 general (chained)"},
                                {90, 8192 | 256, "sm90 general, no chain"},
                                {90, 4096, "sm90 no late store"},
                                {90, 512, "sm90 no fast epilogue"},
                                {90, 1024, "sm90 no hi-only mask"},
                                {90, 256 | 512 | 1024 | 4096, "sm90 none of the four"},
                                {90, 128, "sm90 no late wait"},
                                {90, 1, "sm90 no ping-pong"},
                                {80, 0, "sm80 core"}};
    int nv = 1;
    while (c->cc == 90 && nv <= MAX_OFFS && variants[nv].tag != NULL)
        nv++;
    if (fp8 && nv > 1) {
        variants[1] = variants[nv - 1];
        nv = 2;
    }
    char tags[MAX_OFFS][24];
    if (g_noffs > 0 && c->cc == 90) {
        nv = g_noffs;
        for (int v = 0; v < nv; v++) {
            snprintf(tags[v], sizeof tags[v], "sm90 off=%d", g_offs[v]);
            variants[v].core = 90;
            variants[v].off = g_offs[v];
            variants[v].tag = tags[v];
        }
    }
    for (int i = 0; i < 3 * nv; i++) {
        const int round = i / nv, v = (i + round) % nv;
        c->paged_core = variants[v].core;
        c->sm90_off = variants[v].off;
        float ms = time_op(sets, nsets, 0, 5, quick ? 10 : 50);
        result *r = next_result();
        const int tagged = v || g_noffs > 0;
        snprintf(r->name, sizeof r->name, "prefill %s %d x %d causal%s%s%s", fp8 ? "fp8" : "bf16",
                 batch, L, tagged ? ", " : "", tagged ? variants[v].tag : "",
                 round == 1 ? " (2)" : (round == 2 ? " (3)" : ""));
        r->ms = ms;
        r->figure = flops / ms / 1e9;
        r->unit = "TFLOP/s";
        r->segments = 0;
        printf("%-28s          %8.4f ms %8.1f TFLOP/s  (sets=%d)\n", r->name, ms, r->figure, nsets);
        fflush(stdout);
    }
    c->paged_core = 0;
    c->sm90_off = 0;
    for (int i = 0; i < nsets; i++)
        free_set(&sets[i]);
}

int main(int argc, char **argv)
{
    int sweep = 0, quick = 0, l2_mib = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sweep") == 0)
            sweep = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--ab") == 0)
            g_ab = 1;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            g_only = argv[++i];
        else if (strcmp(argv[i], "--l2") == 0 && i + 1 < argc)
            l2_mib = atoi(argv[++i]);
        else if (strcmp(argv[i], "--in-order") == 0)
            g_in_order = 1;
        else if (strcmp(argv[i], "--off") == 0 && i + 1 < argc)
            for (char *t = strtok(argv[++i], ","); t && g_noffs < MAX_OFFS; t = strtok(NULL, ","))
                g_offs[g_noffs++] = atoi(t);
        else {
            fprintf(stderr,
                    "usage: %s [--sweep] [--ab] [--quick] [--only SUBSTR] [--off LIST] [--l2 MIB] "
                    "[--in-order]\n",
                    argv[0]);
            return 2;
        }
    }
    attnd_err rv = attnd_backend_open(&g_b, "cuda", NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "bench_paged: cannot open the cuda backend: %s\n", attnd_strerror(rv));
        return 1;
    }
    attnd_cuda *c = attnd_cuda_of(g_b);
    g_stream = c->stream;
    g_num_sms = c->num_sms;
    if (l2_mib > 0 && l2_mib < 2048) c->l2_bytes = l2_mib << 20;
    struct cudaDeviceProp prop;
    ATTND_CHECK_CUDA(cudaGetDeviceProperties(&prop, c->device));
    g_l2 = (size_t)prop.l2CacheSize;
    printf("bench_paged: %s (cc %d), %d SMs, L2 %zu MiB; bf16 q/out, %d q heads, %d kv heads, head "
           "%d, block %d, blocks %s\n",
           prop.name, c->cc, g_num_sms, g_l2 >> 20, HQ, HK, HD, BS,
           g_in_order ? "in order" : "shuffled");

    static const int dec[4][2] = {{1, 32768}, {8, 8192}, {64, 4096}, {256, 2048}};
    float t_bf16_64 = 0.0f, t_fp8_64 = 0.0f;
    for (int i = 0; i < 4; i++) {
        float t = bench_decode(dec[i][0], dec[i][1], ATTND_DTYPE_BF16, sweep, quick);
        if (dec[i][0] == 64) t_bf16_64 = t;
    }
    for (int i = 0; i < 4; i++) {
        float t = bench_decode(dec[i][0], dec[i][1], ATTND_DTYPE_FP8_E4M3, sweep && i != 3, quick);
        if (dec[i][0] == 64) t_fp8_64 = t;
    }
    /* bench_hf.py's decode shapes (Llama-3-8B through attnd at 16 x 1024 and 32 x 2048 prompts,
     * contexts mid-way through its 64 new tokens), and a small batch of 4 x 1024 */
    static const int model_dec[3][2] = {{16, 1056}, {32, 2080}, {4, 1024}};
    for (int i = 0; i < 3; i++)
        bench_decode(model_dec[i][0], model_dec[i][1], ATTND_DTYPE_BF16, sweep, quick);
    bench_prefill(1, 8192, ATTND_DTYPE_BF16, quick);
    bench_prefill(8, 2048, ATTND_DTYPE_BF16, quick);
    bench_prefill(32, 2048, ATTND_DTYPE_BF16, quick); /* issue 16: the real-model prefill batch */
    bench_prefill(8, 2048, ATTND_DTYPE_FP8_E4M3, quick);

    printf("\n| case | segments | ms | figure |\n| --- | --- | --- | --- |\n");
    for (int i = 0; i < g_nres; i++)
        printf("| %s | %d | %.4f | %.1f %s |\n", g_res[i].name, g_res[i].segments, g_res[i].ms,
               g_res[i].figure, g_res[i].unit);
    if (t_fp8_64 > 0.0f && t_bf16_64 > 0.0f)
        printf("| fp8 / bf16 speed, 64 x 4096 | | | %.2fx |\n", t_bf16_64 / t_fp8_64);
    attnd_backend_close(g_b);
    for (int i = 0; i < 4; i++)
        free(g_pat[i]);
    return 0;
}
