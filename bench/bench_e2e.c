/* bench_e2e: the daemon end to end on the GPU, against the same kernels called alone.
 *
 * Starts $ATTND_BUILD_DIR/daemon/attnd (backend cuda, LAYERS layers of 32 q / 8 kv heads, head
 * 128, bf16 cache, block 16) and worker threads, each with its own connection and session (to
 * the daemon a worker is a connection; threads keep this program free of fork-after-CUDA), its
 * own cudaMalloc'd Q/K/V/out buffer exported by CUDA IPC, and 64 sequences of 4096 tokens of
 * random context that it prefills through the daemon first. Then, in one run:
 *
 *   transports     everything below twice: over the shared-memory channel each worker's
 *                  client opens on ipc:// (proto/attnd_channel.h), then over the socket alone
 *                  (channels closed);
 *   decode step    64 sequences x 1 new token over 4096 context: per-layer Attend round trips
 *                  (p50, p99) with 1 worker, and steps/s with 1, 4 and 8 workers
 *                  running at once, with the GPU busy fraction they reach (requests x the kernel
 *                  time alone / wall time);
 *   mixed step     4 prefills of 512 (fresh sequences) + 60 decodes: round trips;
 *   tiny step      1 sequence x 1 token, no context: the round trip when the kernels take
 *                  almost nothing, i.e. the daemon's and the transport's own cost;
 *   breakdown      from the daemon's /metrics around each 1-worker run: the time it held each
 *                  Attend (receive to reply, server side) and the time of its kernels (launch to
 *                  sync, host clock), against the client's round trip;
 *   kernels alone  the same per-layer work (the cache write and the launches of the daemon's
 *                  own plan, attnd_plan_run_layer, on a local cache) timed with CUDA events; for
 *                  the mixed step also the seed's single-kernel choice (the whole batch in one
 *                  2D launch: a plan with one_launch); and the launch sequence of a layer issued
 * directly vs replayed from a captured CUDA graph vs captured per call (what the daemon would pay,
 * since every Attend has other pointers or shapes).
 *
 * Steps are ended with abort, so every measured step sees the same 4096-token context.
 *
 *   bench_e2e [--layers N] [--steps N] [--mixed N] [--workers N]   (defaults 4, 100, 40, 8) */
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/cuda/cuda_backend.h"
#include "attnd/client.h"
#include "attnd/kernels.h"
#include "check.h"
#include "attnd/plan.h"
#include "daemon_proc.h"

#define HQ 32
#define HK 8
#define HD 128
#define BS 16
#define NSEQ 64
#define CTX 4096
#define NMIX 4      /* prefills of the mixed step */
#define MIX_LEN 512 /* their length */
#define FILL 128    /* tokens per sequence per fill step */
#define MAX_ROWS (NSEQ * FILL)
#define MAX_WORKERS 8
#define SEQ_BLOCKS ((CTX + 256) / BS) /* local caches: room per sequence */

#define CK(call) ATTND_CHECK(call, g_gpu)

#define CU(call) ATTND_CHECK_CUDA(call)

static attnd_backend *g_gpu; /* for CK's message only; set once in main */

typedef struct opts {
    int layers, steps, mixed, workers;
} opts;

typedef struct worker {
    int id, layers;
    const attnd_daemon_proc *d;
    const uint16_t *host_rand; /* MAX_ROWS x (HQ + 2 HK) x HD bf16 of random values */
    attnd_client *c;
    char *dbuf;
    size_t dbytes;
    uint64_t off_q, off_k, off_v, off_out;
    uint64_t ids[NSEQ + NMIX];
    /* a measurement */
    int mode, steps; /* mode 0: decode, 1: mixed, 2: tiny */
    double *rtt_us;  /* [steps * layers] */
    int nrtt;
    double wall_s;
    int failed;
} worker;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p)
{
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* bf16 of about N(0, 1): the sum of four uniforms, rescaled. */
static void fill_random(uint16_t *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        double u = 0;
        for (int k = 0; k < 4; k++)
            u += (double)(rng_next(&s) >> 11) / 9007199254740992.0;
        dst[i] = attnd_f32_to_bf16((float)((u - 2.0) * 1.7320508));
    }
}

/* ---------------------------------------------------------------- workers (threads) */

static void worker_layout(worker *w)
{
    size_t q = (size_t)MAX_ROWS * HQ * HD * 2, kv = (size_t)MAX_ROWS * HK * HD * 2;
    w->off_q = 0;
    w->off_k = q;
    w->off_v = q + kv;
    w->off_out = q + 2 * kv;
    w->dbytes = 2 * q + 2 * kv;
}

static int worker_attend(worker *w, uint64_t step, int layer, int64_t T)
{
    attnd_ref q, k, v, out;
    int64_t sq[3] = {T, HQ, HD}, sk[3] = {T, HK, HD};
    attnd_ref_region(&q, 1, w->off_q, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_region(&k, 1, w->off_k, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&v, 1, w->off_v, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&out, 1, w->off_out, ATTND_DTYPE_BF16, 3, sq);
    attnd_err rv = attnd_client_attend(w->c, step, (uint32_t)layer, &q, &k, &v, &out, NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "bench_e2e: worker %d: attend: %s\n", w->id, attnd_client_last_error(w->c));
        w->failed = 1;
        return -1;
    }
    return 0;
}

/* One step over n sequences (ids, new tokens): BeginStep, every layer (round trips recorded
 * when rtt != NULL), EndStep (commit or abort). */
static int worker_step(worker *w, const attnd_step_seq *seqs, size_t n, int commit, double *rtt)
{
    attnd_step st;
    if (attnd_client_step_begin(w->c, seqs, n, &st, NULL) != ATTND_ERR_OK) {
        fprintf(stderr, "bench_e2e: worker %d: begin: %s\n", w->id, attnd_client_last_error(w->c));
        w->failed = 1;
        return -1;
    }
    for (int l = 0; l < w->layers; l++) {
        double t0 = now_s();
        if (worker_attend(w, st.id, l, st.num_tokens) != 0) return -1;
        if (rtt) rtt[l] = (now_s() - t0) * 1e6;
    }
    if (attnd_client_step_end(w->c, st.id, !commit) != ATTND_ERR_OK) {
        w->failed = 1;
        return -1;
    }
    return 0;
}

/* Connect, export the buffer, create the sequences and prefill CTX tokens each. */
static void *worker_setup(void *arg)
{
    worker *w = arg;
    cudaIpcMemHandle_t h;
    attnd_step_seq seqs[NSEQ];
    worker_layout(w);
    CU(cudaMalloc((void **)&w->dbuf, w->dbytes));
    CU(cudaMemcpy(w->dbuf, w->host_rand, w->off_out, cudaMemcpyHostToDevice));
    CU(cudaIpcGetMemHandle(&h, w->dbuf));
    if ((w->c = attnd_daemon_connect(w->d, 600000)) == NULL ||
        attnd_client_region_register_cuda(w->c, 1, &h, w->dbytes, 0) != ATTND_ERR_OK) {
        w->failed = 1;
        return NULL;
    }
    for (int s = 0; s < NSEQ + NMIX; s++) {
        w->ids[s] = (uint64_t)(w->id + 1) * 1000 + (uint64_t)s;
        if (attnd_client_seq_create(w->c, w->ids[s], NULL) != ATTND_ERR_OK) w->failed = 1;
    }
    for (int s = 0; s < NSEQ; s++)
        seqs[s] = (attnd_step_seq){w->ids[s], FILL};
    for (int t = 0; t < CTX && !w->failed; t += FILL)
        worker_step(w, seqs, NSEQ, 1, NULL);
    return NULL;
}

/* The measured steps (mode 0: decode, 1: mixed), ended with abort. */
static void *worker_measure(void *arg)
{
    worker *w = arg;
    attnd_step_seq seqs[NSEQ + NMIX];
    size_t n = 0;
    if (w->mode == 1) {
        for (int s = 0; s < NMIX; s++)
            seqs[n++] = (attnd_step_seq){w->ids[NSEQ + s], MIX_LEN};
        for (int s = 0; s < NSEQ - NMIX; s++)
            seqs[n++] = (attnd_step_seq){w->ids[s], 1};
    } else if (w->mode == 2) {
        seqs[n++] = (attnd_step_seq){w->ids[NSEQ], 1};
    } else {
        for (int s = 0; s < NSEQ; s++)
            seqs[n++] = (attnd_step_seq){w->ids[s], 1};
    }
    w->nrtt = 0;
    for (int i = 0; i < 3 && !w->failed; i++) /* warm-up */
        worker_step(w, seqs, n, 0, NULL);
    double t0 = now_s();
    for (int i = 0; i < w->steps && !w->failed; i++) {
        worker_step(w, seqs, n, 0, w->rtt_us + w->nrtt);
        w->nrtt += w->layers;
    }
    w->wall_s = now_s() - t0;
    return NULL;
}

static int run_threads(worker *w, int n, void *(*fn)(void *))
{
    pthread_t th[MAX_WORKERS];
    int failed = 0;
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, fn, &w[i]);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        failed |= w[i].failed;
    }
    return failed ? -1 : 0;
}

/* ---------------------------------------------------------------- kernels alone */

/* The daemon's pool for the benchmark's workers, and how its allocator lays a worker's blocks
 * out in it: sequences prefilled FILL tokens at a time take runs of FILL / BS consecutive blocks,
 * the 8 workers' fill steps interleave, and the decode token's block comes after all of them. */
#define POOL_BLOCKS (MAX_WORKERS * (NSEQ * (CTX / BS + 1) + NMIX * (MIX_LEN / BS)) + 1024)

typedef struct local {
    attnd_backend *gpu;
    cudaStream_t stream;
    int32_t units;
    void *kc, *vc, *q, *k, *v, *out, *index, *ws3d;
    void *big_k, *big_v; /* [POOL_BLOCKS] pools for the daemon-like layouts, NULL if no room */
    int32_t blocks[NSEQ + NMIX][SEQ_BLOCKS];
} local;

enum { LAYOUT_CONTIGUOUS, LAYOUT_DAEMON, LAYOUT_RANDOM };

static attnd_tensor t3(void *p, int64_t a, int64_t b, int64_t c)
{
    attnd_tensor t;
    int64_t s[3] = {a, b, c};
    attnd_tensor_init(&t, p, ATTND_DTYPE_BF16, 3, s);
    return t;
}

static attnd_tensor cache_t(void *p, int64_t blocks)
{
    attnd_tensor t;
    int64_t s[4] = {blocks, BS, HK, HD};
    attnd_tensor_init(&t, p, ATTND_DTYPE_BF16, 4, s);
    return t;
}

/* Big pools (as large as one layer's of the daemon) filled from the small random ones. */
static void local_big(local *lc)
{
    size_t bytes = (size_t)POOL_BLOCKS * BS * HK * HD * 2;
    size_t small = (size_t)(NSEQ + NMIX) * SEQ_BLOCKS * BS * HK * HD * 2;
    if (cudaMalloc(&lc->big_k, bytes) != cudaSuccess ||
        cudaMalloc(&lc->big_v, bytes) != cudaSuccess) {
        cudaGetLastError();
        printf("no room for the daemon-like layouts (%zu bytes)\n", 2 * bytes);
        return;
    }
    for (size_t off = 0; off < bytes; off += small) {
        size_t n = bytes - off < small ? bytes - off : small;
        CU(cudaMemcpy((char *)lc->big_k + off, lc->kc, n, cudaMemcpyDeviceToDevice));
        CU(cudaMemcpy((char *)lc->big_v + off, lc->vc, n, cudaMemcpyDeviceToDevice));
    }
}

/* Block ids of worker 0's decode sequences: as the daemon's allocator gives them (runs of
 * FILL / BS, fill steps of MAX_WORKERS workers interleaved), or a random permutation. */
static void local_layout(local *lc, int layout)
{
    const int32_t run = FILL / BS, nruns = CTX / FILL;
    uint64_t rs = 12345;
    for (int s = 0; s < NSEQ + NMIX; s++)
        for (int b = 0; b < SEQ_BLOCKS; b++) {
            int32_t id = s * SEQ_BLOCKS + b;
            if (layout == LAYOUT_DAEMON && s < NSEQ && b < CTX / BS)
                id = (((b / run) * MAX_WORKERS) * NSEQ + s) * run + b % run;
            else if (layout == LAYOUT_DAEMON && s < NSEQ)
                id = nruns * MAX_WORKERS * NSEQ * run + s * 2 + (b - CTX / BS);
            else if (layout == LAYOUT_RANDOM)
                id = (int32_t)(rng_next(&rs) % POOL_BLOCKS); /* collisions are harmless here */
            lc->blocks[s][b] = id;
        }
}

static void local_open(local *lc, const uint16_t *host_rand)
{
    attnd_backend_opts bo = {0, 0};
    attnd_device_info info;
    size_t cache = (size_t)(NSEQ + NMIX) * SEQ_BLOCKS * BS * HK * HD * 2;
    size_t chunk = (size_t)MAX_ROWS * HQ * HD * 2;
    CK(attnd_backend_open(&lc->gpu, "cuda", &bo));
    g_gpu = lc->gpu;
    CK(attnd_device_query(lc->gpu, &info));
    lc->units = info.num_sms;
    lc->stream = attnd_cuda_of(lc->gpu)->stream;
    CU(cudaMalloc(&lc->kc, cache));
    CU(cudaMalloc(&lc->vc, cache));
    /* random context: the random rows repeated over the pools */
    for (size_t off = 0; off < cache; off += chunk) {
        size_t n = cache - off < chunk ? cache - off : chunk;
        CU(cudaMemcpy((char *)lc->kc + off, host_rand, n, cudaMemcpyHostToDevice));
        CU(cudaMemcpy((char *)lc->vc + off, host_rand + 7, n, cudaMemcpyHostToDevice));
    }
    CU(cudaMalloc(&lc->q, chunk));
    CU(cudaMalloc(&lc->k, chunk));
    CU(cudaMalloc(&lc->v, chunk));
    CU(cudaMalloc(&lc->out, chunk));
    CU(cudaMemcpy(lc->q, host_rand, chunk, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(lc->k, host_rand + 3, chunk, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(lc->v, host_rand + 5, chunk, cudaMemcpyHostToDevice));
    CU(cudaMalloc(&lc->index, (size_t)4 << 20));
    CU(cudaMalloc(&lc->ws3d,
                  attnd_paged_3d_workspace_size(attnd_plan_split_rows(lc->units), HQ, HD, 1)));
    local_layout(lc, LAYOUT_CONTIGUOUS);
}

/* The daemon's plan for the decode (mode 0), mixed (1) or tiny (2) step over the local cache
 * (one_launch: the whole batch in one 2D launch instead), its index arrays uploaded. */
static void *local_plan(local *lc, int mode, int one_launch, attnd_plan *plan)
{
    attnd_plan_seq seqs[NSEQ + NMIX];
    attnd_plan_opts o = attnd_plan_opts_for(BS, HQ, HK, HD, lc->units);
    int n = 0;
    o.one_launch = one_launch;
    if (mode == 1)
        for (int s = 0; s < NMIX; s++)
            seqs[n++] = (attnd_plan_seq){0, MIX_LEN, lc->blocks[NSEQ + s], MIX_LEN / BS};
    if (mode == 2) seqs[n++] = (attnd_plan_seq){0, 1, lc->blocks[NSEQ], 1};
    for (int s = 0; mode != 2 && s < (mode == 1 ? NSEQ - NMIX : NSEQ); s++)
        seqs[n++] = (attnd_plan_seq){CTX, 1, lc->blocks[s], CTX / BS + 1};
    size_t bytes = attnd_plan_workspace_size(seqs, n, &o);
    void *ws = malloc(bytes);
    CK(attnd_plan_build(plan, seqs, n, &o, ws, bytes));
    CU(cudaMemcpy(lc->index, plan->slot_mapping, plan->index_bytes, cudaMemcpyHostToDevice));
    return ws;
}

static attnd_plan_layer local_layer(local *lc, int64_t T)
{
    attnd_plan_layer l;
    memset(&l, 0, sizeof l);
    l.q = t3(lc->q, T, HQ, HD);
    l.k_new = t3(lc->k, T, HK, HD);
    l.v_new = t3(lc->v, T, HK, HD);
    l.out = t3(lc->out, T, HQ, HD);
    l.k_cache = cache_t(lc->kc, (NSEQ + NMIX) * SEQ_BLOCKS);
    l.v_cache = cache_t(lc->vc, (NSEQ + NMIX) * SEQ_BLOCKS);
    l.scale = 1.0f / sqrtf((float)HD);
    l.k_scale = l.v_scale = 1.0f;
    return l;
}

static void local_run(local *lc, const attnd_plan *plan, const attnd_plan_layer *l)
{
    CK(attnd_plan_run_layer(lc->gpu, plan, lc->index, l, lc->ws3d));
}

/* Median device time (us) of one layer's launches, by CUDA events. */
static double local_time(local *lc, const attnd_plan *plan, const attnd_plan_layer *l, int reps)
{
    cudaEvent_t e0, e1;
    double *us = malloc(sizeof(double) * (size_t)reps);
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++)
        local_run(lc, plan, l);
    for (int r = 0; r < reps; r++) {
        float ms;
        CU(cudaEventRecord(e0, lc->stream));
        local_run(lc, plan, l);
        CU(cudaEventRecord(e1, lc->stream));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        us[r] = ms * 1e3;
    }
    double med = pct(us, reps, 0.5);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(us);
    return med;
}

/* Capture one layer's launches into an instantiated graph; 0 on success, else the error. */
static cudaError_t local_capture(local *lc, const attnd_plan *plan, const attnd_plan_layer *l,
                                 cudaGraph_t *g, cudaGraphExec_t *ge)
{
    cudaError_t e = cudaStreamBeginCapture(lc->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) return e;
    attnd_err rv = attnd_plan_run_layer(lc->gpu, plan, lc->index, l, lc->ws3d);
    e = cudaStreamEndCapture(lc->stream, g);
    if (rv != ATTND_ERR_OK) return cudaErrorStreamCaptureInvalidated;
    if (e == cudaSuccess) e = cudaGraphInstantiate(ge, *g, 0);
    return e;
}

/* Host wall time (us, median) of: launches + sync (mode 0), a captured graph's launch + sync
 * (mode 1), capture + instantiate + launch + sync every time (mode 2). NAN (and the reason
 * printed) when the launches cannot be captured. */
static double local_wall(local *lc, const attnd_plan *plan, const attnd_plan_layer *l, int mode,
                         int reps)
{
    double *us = malloc(sizeof(double) * (size_t)reps), med;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    for (int r = -5; r < reps; r++) {
        double t0 = now_s();
        if (mode == 0) {
            local_run(lc, plan, l);
        } else {
            if (mode == 2 || ge == NULL) {
                if (ge) cudaGraphExecDestroy(ge);
                if (g) cudaGraphDestroy(g);
                g = NULL;
                ge = NULL;
                cudaError_t e = local_capture(lc, plan, l, &g, &ge);
                if (e != cudaSuccess) {
                    printf("graph capture failed: %s\n", cudaGetErrorString(e));
                    cudaGetLastError();
                    free(us);
                    return NAN;
                }
                if (mode == 1) t0 = now_s();
            }
            CU(cudaGraphLaunch(ge, lc->stream));
        }
        CK(attnd_backend_sync(lc->gpu));
        if (r >= 0) us[r] = (now_s() - t0) * 1e6;
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    med = pct(us, reps, 0.5);
    free(us);
    return med;
}

typedef struct kernel_times {
    double decode_us, mixed_us, mixed_single_us, tiny_us;
    double decode_daemon_layout_us, decode_random_layout_us;
    double seg_us[4]; /* decode forced to 3D with 2, 4, 8, 16 segments */
    double wall_direct_us, wall_graph_us, wall_capture_us;
    int decode_launches, decode_segments, mixed_launches;
} kernel_times;

/* The decode batch with other segment counts than the planner's, to check its choice. */
static void local_segments(local *lc, attnd_plan *plan, const attnd_plan_layer *l, kernel_times *kt)
{
    attnd_launch saved = plan->launches[0];
    for (int i = 0; i < 4; i++) {
        plan->launches[0].kind = ATTND_LAUNCH_3D;
        plan->launches[0].num_segments = 2 << i;
        kt->seg_us[i] = local_time(lc, plan, l, 100);
    }
    plan->launches[0] = saved;
}

static void local_measure(local *lc, kernel_times *kt)
{
    attnd_plan plan;
    void *ws = local_plan(lc, 0, 0, &plan);
    attnd_plan_layer l = local_layer(lc, plan.num_tokens);
    kt->decode_launches = plan.num_launches;
    kt->decode_segments = plan.launches[0].num_segments;
    kt->decode_us = local_time(lc, &plan, &l, 200);
    kt->wall_direct_us = local_wall(lc, &plan, &l, 0, 200);
    if (plan.num_launches == 1) local_segments(lc, &plan, &l, kt);
    free(ws);
    ws = local_plan(lc, 1, 0, &plan);
    l = local_layer(lc, plan.num_tokens);
    kt->mixed_launches = plan.num_launches;
    kt->mixed_us = local_time(lc, &plan, &l, 100);
    free(ws);
    ws = local_plan(lc, 1, 1, &plan);
    kt->mixed_single_us = local_time(lc, &plan, &l, 100);
    free(ws);
    ws = local_plan(lc, 2, 0, &plan);
    l = local_layer(lc, plan.num_tokens);
    kt->tiny_us = local_time(lc, &plan, &l, 200);
    free(ws);
}

/* The decode step over a pool as large as the daemon's, blocks placed as its allocator places
 * them (and at random): what the daemon's kernels see. */
static void local_layouts(local *lc, kernel_times *kt)
{
    attnd_plan plan;
    kt->decode_daemon_layout_us = kt->decode_random_layout_us = NAN;
    local_big(lc);
    if (lc->big_k == NULL) return;
    for (int layout = LAYOUT_DAEMON; layout <= LAYOUT_RANDOM; layout++) {
        local_layout(lc, layout);
        void *ws = local_plan(lc, 0, 0, &plan);
        attnd_plan_layer l = local_layer(lc, plan.num_tokens);
        l.k_cache = cache_t(lc->big_k, POOL_BLOCKS);
        l.v_cache = cache_t(lc->big_v, POOL_BLOCKS);
        double us = local_time(lc, &plan, &l, 100);
        if (layout == LAYOUT_DAEMON)
            kt->decode_daemon_layout_us = us;
        else
            kt->decode_random_layout_us = us;
        free(ws);
    }
    local_layout(lc, LAYOUT_CONTIGUOUS);
    cudaFree(lc->big_k);
    cudaFree(lc->big_v);
    lc->big_k = lc->big_v = NULL;
}

/* ---------------------------------------------------------------- the daemon's /metrics */

typedef struct dmetrics {
    double attend_s, attend_n, kernel_s;
} dmetrics;

static double metric_value(const char *body, const char *name)
{
    const char *p = strstr(body, name);
    return p ? strtod(p + strlen(name), NULL) : 0.0;
}

/* GET /metrics from the daemon's HTTP endpoint; zeros when it cannot be read. */
static dmetrics http_metrics(int port)
{
    dmetrics m = {0, 0, 0};
    struct sockaddr_in a;
    struct timeval tv = {5, 0};
    static const char *kinds[] = {"2d", "3d", "cache_write", "other"};
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        const char *req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if (write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
            ssize_t n;
            while (len < cap && (n = read(fd, buf + len, cap - len)) > 0)
                len += (size_t)n;
        }
    }
    if (fd >= 0) close(fd);
    buf[len] = '\0';
    m.attend_s = metric_value(buf, "attnd_request_duration_seconds_sum{type=\"attend\"}");
    m.attend_n = metric_value(buf, "attnd_request_duration_seconds_count{type=\"attend\"}");
    for (int k = 0; k < 4; k++) {
        char name[96];
        snprintf(name, sizeof name, "attnd_kernel_seconds_total{kind=\"%s\"}", kinds[k]);
        m.kernel_s += metric_value(buf, name);
    }
    free(buf);
    return m;
}

/* Last (a failed capture must not cost the other figures): graph replay vs direct launches. */
static void local_graphs(local *lc, kernel_times *kt)
{
    attnd_plan plan;
    void *ws = local_plan(lc, 0, 0, &plan);
    attnd_plan_layer l = local_layer(lc, plan.num_tokens);
    kt->wall_graph_us = local_wall(lc, &plan, &l, 1, 200);
    kt->wall_capture_us = local_wall(lc, &plan, &l, 2, 100);
    free(ws);
}

/* ---------------------------------------------------------------- main */

static void parse(int argc, char **argv, opts *o)
{
    o->layers = 4;
    o->steps = 100;
    o->mixed = 40;
    o->workers = MAX_WORKERS;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--layers") == 0) o->layers = v;
        if (strcmp(argv[i], "--steps") == 0) o->steps = v;
        if (strcmp(argv[i], "--mixed") == 0) o->mixed = v;
        if (strcmp(argv[i], "--workers") == 0) o->workers = v;
    }
    if (o->workers < 1) o->workers = 1;
    if (o->workers > MAX_WORKERS) o->workers = MAX_WORKERS;
}

static int start_daemon(attnd_daemon_proc *d, const opts *o, int http_port)
{
    char cfg[1280];
    /* every worker's sequences (plus room for the decode token and the mixed step's prefills) */
    long blocks = POOL_BLOCKS;
    snprintf(cfg, sizeof cfg,
             "{\"backend\": \"cuda\", \"server\": {\"listen\": \"@URL@\", \"queue_depth\": 256},"
             " \"geometry\": {\"num_layers\": %d, \"num_q_heads\": %d, \"num_kv_heads\": %d,"
             " \"head_size\": %d, \"block_size\": %d, \"cache_dtype\": \"bf16\","
             " \"num_blocks\": %ld, \"max_blocks_per_seq\": 512},"
             " \"linear\": {\"slots\": 0},"
             " \"limits\": {\"max_seqs\": 128, \"max_step_tokens\": %d, \"max_sessions\": 16,"
             " \"request_timeout_ms\": 0},"
             " \"http\": {\"listen\": \"http://127.0.0.1:%d\"},"
             " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}",
             o->layers, HQ, HK, HD, BS, blocks, MAX_ROWS, http_port);
    return attnd_daemon_start(d, cfg);
}

static void print_events(const attnd_daemon_proc *d)
{
    char line[1024];
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL) return;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "event=backend") || strstr(line, "event=memory") ||
            strstr(line, "event=device_failed"))
            printf("daemon: %s", line);
    fclose(f);
}

static void measure_rtt(worker *w, int mode, int steps, double kernel_us, const char *name,
                        int port)
{
    w->mode = mode;
    w->steps = steps;
    dmetrics m0 = http_metrics(port);
    run_threads(w, 1, worker_measure);
    dmetrics m1 = http_metrics(port);
    double mean = 0;
    for (int i = 0; i < w->nrtt; i++)
        mean += w->rtt_us[i] / w->nrtt;
    double p50 = pct(w->rtt_us, w->nrtt, 0.5), p99 = pct(w->rtt_us, w->nrtt, 0.99);
    printf("%-7s 1 worker : Attend round trip p50 %8.1f us  p99 %8.1f us  (%d requests); "
           "kernels alone %8.1f us -> overhead p50 %6.1f us, p99 %6.1f us\n",
           name, p50, p99, w->nrtt, kernel_us, p50 - kernel_us, p99 - kernel_us);
    double n = m1.attend_n - m0.attend_n;
    if (n > 0)
        printf("%-7s   breakdown (means over %.0f Attends incl. warm-up): round trip %.1f us = "
               "daemon holds it %.1f us (its kernels, launch to sync: %.1f us; the rest %.1f us) "
               "+ client and transport %.1f us\n",
               name, n, mean, (m1.attend_s - m0.attend_s) / n * 1e6,
               (m1.kernel_s - m0.kernel_s) / n * 1e6,
               ((m1.attend_s - m0.attend_s) - (m1.kernel_s - m0.kernel_s)) / n * 1e6,
               mean - (m1.attend_s - m0.attend_s) / n * 1e6);
}

static void measure_workers(worker *w, int n, const opts *o, double kernel_us)
{
    for (int i = 0; i < n; i++) {
        w[i].mode = 0;
        w[i].steps = o->steps;
    }
    double t0 = now_s();
    run_threads(w, n, worker_measure);
    double wall = now_s() - t0, p50 = 0;
    int reqs = 0;
    for (int i = 0; i < n; i++)
        reqs += w[i].nrtt;
    p50 = pct(w[0].rtt_us, w[0].nrtt, 0.5);
    printf("decode  %d worker%s: %8.1f steps/s of %d layers (%7.1f Attend/s, = %6.1f steps/s of "
           "32 layers), GPU busy %5.1f%%, worker 0 round trip p50 %8.1f us\n",
           n, n > 1 ? "s" : " ", (double)n * o->steps / wall, o->layers, reqs / wall,
           reqs / wall / 32.0, 100.0 * reqs * kernel_us * 1e-6 / wall, p50);
}

/* Round trips (1 worker) and throughput (1, 4, 8 workers) over the workers' current transport. */
static void measure_transport(worker *w, const opts *o, const kernel_times *kt, int port,
                              const char *transport)
{
    printf("---- transport: %s\n", transport);
    measure_rtt(&w[0], 0, o->steps, kt->decode_us, "decode", port);
    measure_rtt(&w[0], 1, o->mixed, kt->mixed_us, "mixed", port);
    measure_rtt(&w[0], 2, o->steps, kt->tiny_us, "tiny", port);
    int counts[3] = {1, 4, 8};
    for (int i = 0; i < 3; i++)
        if (counts[i] <= o->workers) measure_workers(w, counts[i], o, kt->decode_us);
}

int main(int argc, char **argv)
{
    opts o;
    attnd_daemon_proc d;
    worker w[MAX_WORKERS];
    local lc;
    kernel_times kt;
    parse(argc, argv, &o);
    size_t nrand = (size_t)MAX_ROWS * (HQ + 2 * HK) * HD;
    uint16_t *host_rand = malloc(nrand * 2 + 64);
    fill_random(host_rand, nrand + 32, 42);
    int port = attnd_daemon_free_port();
    if (start_daemon(&d, &o, port) != 0) return 1;
    local_open(&lc, host_rand); /* after the fork: this process's CUDA context */
    memset(w, 0, sizeof w);
    for (int i = 0; i < o.workers; i++) {
        w[i] = (worker){.id = i, .layers = o.layers, .d = &d, .host_rand = host_rand};
        w[i].rtt_us = malloc(sizeof(double) * (size_t)(o.steps > o.mixed ? o.steps : o.mixed) *
                             (size_t)o.layers);
    }
    double t0 = now_s();
    if (run_threads(w, o.workers, worker_setup) != 0) {
        attnd_daemon_dump_log(&d);
        return 1;
    }
    printf("setup: %d workers x %d sequences x %d tokens prefilled through the daemon in %.1f s\n",
           o.workers, NSEQ, CTX, now_s() - t0);
    local_measure(&lc, &kt);
    printf("kernels alone (per layer, CUDA events, median): decode %.1f us (%d launch%s, %d "
           "segments); mixed %.1f us (%d launches: prefill 2D + decode) vs seed single 2D "
           "launch %.1f us (%.2fx)\n",
           kt.decode_us, kt.decode_launches, kt.decode_launches > 1 ? "es" : "", kt.decode_segments,
           kt.mixed_us, kt.mixed_launches, kt.mixed_single_us, kt.mixed_single_us / kt.mixed_us);
    printf("decode forced to 3D: 2 segments %.1f us, 4: %.1f us, 8: %.1f us, 16: %.1f us\n",
           kt.seg_us[0], kt.seg_us[1], kt.seg_us[2], kt.seg_us[3]);
    for (int i = 0; i < o.workers; i++)
        if (!attnd_client_channel_active(w[i].c)) {
            fprintf(stderr, "bench_e2e: worker %d has no channel\n", i);
            return 1;
        }
    measure_transport(w, &o, &kt, port, "channel");
    for (int i = 0; i < o.workers; i++)
        CK(attnd_client_channel_close(w[i].c));
    measure_transport(w, &o, &kt, port, "socket");
    local_graphs(&lc, &kt);
    local_layouts(&lc, &kt);
    printf("decode kernels alone over a pool as large as the daemon's: blocks as its allocator "
           "lays them out %.1f us, at random %.1f us (contiguous per sequence: %.1f us)\n",
           kt.decode_daemon_layout_us, kt.decode_random_layout_us, kt.decode_us);
    printf("launch path (decode layer, host wall incl. sync, median): direct %.1f us, graph "
           "replay %.1f us, capture+instantiate+replay %.1f us\n",
           kt.wall_direct_us, kt.wall_graph_us, kt.wall_capture_us);
    print_events(&d);
    for (int i = 0; i < o.workers; i++)
        attnd_client_free(w[i].c);
    int rc = attnd_daemon_stop(&d);
    printf("bench_e2e: done (daemon exit %d)\n", rc);
    return rc == 0 ? 0 : 1;
}
