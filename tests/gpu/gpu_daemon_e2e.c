/* gpu_daemon_e2e: the daemon serving a real GPU worker, end to end.
 *
 * Starts $ATTND_BUILD_DIR/daemon/attnd ("backend": "auto", which must pick cuda here; the cache
 * sized by geometry.gpu_memory_fraction) as a child process. This process is the worker: it
 * cudaMallocs one buffer for Q/K/V/out/LSE, exports it with cudaIpcGetMemHandle, registers it
 * as a CUDA_IPC region and runs a prefill step and 100 decode steps over 32 layers (32 q / 8 kv
 * heads, head 128, bf16, block 16) for a mixed batch: prefills and one-token prefills together
 * in the first step, sequences joining with a prefill and a chunked prefill (with context) in
 * the middle of decode steps, so that every plan mixes decode runs and prefill runs.
 *
 * The layers differ (geometry.layers, a pattern of 4: none; window 100; softcap 30 with sinks;
 * given ALiBi slopes with sinks and window 77). For every layer of every step the daemon's output
 * (written into the worker's memory) is compared with
 *   - the CUDA ops called directly here on the same device tensors, replaying the daemon's plan
 *     (attnd_plan_run_layer, kernels/plan/): bit-identical, out and LSE;
 *   - the cpu backend on the same inputs: relative L2 within attnd_tol_for(bf16) (LSE 1e-3).
 * Steps 0..49 travel over the shared-memory channel the client opens on ipc://, steps 50..100
 * over the socket. Outputs are poisoned (NaN) before each request. One layer of step 30 goes
 * through host shm and INLINE outputs instead (staged by the daemon): the same bits. A bad IPC
 * handle, a region larger than its allocation, a reference past the region's end and an unknown
 * region get errors (and the daemon keeps serving); a cpu daemon refuses CUDA_IPC with UNSUPPORTED;
 * and several clients at once get bit for bit what one gets alone (e2e_concurrent.c). Before the
 * steps: varlen and block-sparse with cu_seqlens and layouts in device memory, read (copied to
 * the daemon's host, never dereferenced there), checked, and flipped by a thread with cudaMemcpy
 * during requests (e2e_indices.c). An f32 cache with per-layer options: a cuda daemon against a
 * cpu daemon on the same steps (e2e_f32.c).
 *
 * Prints "gpu_daemon_e2e: N passed, M failed"; exit status 1 on any failure. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/client.h"
#include "attnd/kernels.h"
#include "attnd/plan.h"
#include "check.h"
#include "daemon_proc.h"
#include "e2e_concurrent.h"
#include "e2e_f32.h"
#include "e2e_indices.h"
#include "testutil.h"

#define NL 32
#define HQ 32
#define HK 8
#define HD 128
#define BS 16
#define MAX_SEQS 8
#define SEQ_BLOCKS 64 /* the worker's own caches: sequence i owns blocks i*64 .. */
#define MAX_ROWS 1024
#define DECODE_STEPS 100

/* The daemon's configuration: "@LAYERS@" becomes geometry.layers (config_with_layers). */
#define CONFIG                                                                                     \
    "{\"backend\": \"auto\", \"device\": 0, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 32, \"num_q_heads\": 32, \"num_kv_heads\": 8,"                \
    " \"head_size\": 128, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 1024,"    \
    " \"max_blocks_per_seq\": 128, \"gpu_memory_fraction\": 0.08, \"layers\": @LAYERS@},"          \
    " \"linear\": {\"slots\": 0}, \"limits\": {\"max_step_tokens\": 4096},"                        \
    " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}"

/* Layer l's options, as the test writes them into the config (entry l % 4 of the pattern). */
typedef struct layer_opts {
    int32_t window;
    float softcap;
    int alibi; /* given slopes: g_slopes */
    int sinks; /* 0 none, 1 g_sinks[0], 2 g_sinks[1] */
} layer_opts;

static const layer_opts kLayerOpts[4] = {
    {0, 0, 0, 0}, {100, 0, 0, 0}, {0, 30, 0, 1}, {77, 0, 1, 2}};
static float g_slopes[HQ], g_sinks[2][HQ];

static void put_floats(char *buf, size_t n, const char *key, const float *x)
{
    size_t k = strlen(buf);
    k += (size_t)snprintf(buf + k, n - k, "\"%s\": [", key);
    for (int h = 0; h < HQ; h++)
        k += (size_t)snprintf(buf + k, n - k, "%s%.9g", h ? ", " : "", (double)x[h]);
    snprintf(buf + k, n - k, "]");
}

/* The options' values, and CONFIG with its "@LAYERS@" filled, into buf. */
static void config_with_layers(char *buf, size_t n)
{
    char layers[4096] = "[{}, {\"sliding_window\": 100}, {\"softcap\": 30, ";
    for (int h = 0; h < HQ; h++) {
        g_slopes[h] = powf(2.0f, -(float)(h + 1) / 4.0f);
        g_sinks[0][h] = 0.25f * (float)(h % 9) - 0.5f;
        g_sinks[1][h] = h % 3 == 0 ? 4.0f : -1.5f;
    }
    put_floats(layers, sizeof layers, "sinks", g_sinks[0]);
    strncat(layers, "}, {\"sliding_window\": 77, ", sizeof layers - strlen(layers) - 1);
    put_floats(layers, sizeof layers, "alibi_slopes", g_slopes);
    strncat(layers, ", ", sizeof layers - strlen(layers) - 1);
    put_floats(layers, sizeof layers, "sinks", g_sinks[1]);
    strncat(layers, "}]", sizeof layers - strlen(layers) - 1);
    const char *at = strstr(CONFIG, "@LAYERS@");
    snprintf(buf, n, "%.*s%s%s", (int)(at - CONFIG), CONFIG, layers, at + 8);
}

typedef struct worker {
    attnd_client *c;
    attnd_backend *gpu, *cpu;
    int32_t units; /* SMs: what the daemon's planner fills */
    /* the exported buffer: q, k, v, out, lse at fixed offsets */
    char *dbuf;
    size_t dbytes;
    uint64_t off_q, off_k, off_v, off_out, off_lse;
    cudaIpcMemHandle_t handle;
    uint32_t region; /* its region id (from the client, so attnd_client_shm_create picks others) */
    void *dout, *dlse; /* direct-call outputs */
    void *dk[NL], *dv[NL];
    void *dindex, *ws3d, *hws3d;
    float *dslopes, *dsinks[2]; /* device copies of g_slopes and g_sinks */
    size_t ws3d_bytes;
    uint16_t *hq, *hk, *hv, *hout, *hout_direct, *hout_cpu; /* host rows, MAX_ROWS */
    float *hlse, *hlse_direct, *hlse_cpu;
    uint16_t *ck[NL], *cv[NL]; /* cpu backend caches */
    int nseqs;
    uint64_t ids[MAX_SEQS];
    int32_t len[MAX_SEQS];
    int32_t blocks[MAX_SEQS][SEQ_BLOCKS];
    attnd_rng rng;
    int pass, fail;
} worker;

typedef struct step_in {
    int n;
    int seq[MAX_SEQS];
    uint32_t new_tokens[MAX_SEQS];
} step_in;

static void check(worker *w, int ok, const char *what)
{
    if (ok)
        w->pass++;
    else
        w->fail++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    fflush(stdout);
}

#define CU(call) ATTND_CHECK_CUDA(call)

#define AK(call, be) ATTND_CHECK(call, be)

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "gpu_daemon_e2e: out of memory\n");
        exit(1);
    }
    return p;
}

static size_t cache_bytes(void)
{
    return (size_t)MAX_SEQS * SEQ_BLOCKS * BS * HK * HD * 2;
}

/* ---------------------------------------------------------------- setup */

static void worker_buffers(worker *w)
{
    size_t q = (size_t)MAX_ROWS * HQ * HD * 2, kv = (size_t)MAX_ROWS * HK * HD * 2;
    size_t lse = (size_t)HQ * MAX_ROWS * 4;
    w->off_q = 0;
    w->off_k = q;
    w->off_v = w->off_k + kv;
    w->off_out = w->off_v + kv;
    w->off_lse = w->off_out + q;
    w->dbytes = w->off_lse + lse;
    CU(cudaMalloc((void **)&w->dbuf, w->dbytes));
    CU(cudaIpcGetMemHandle(&w->handle, w->dbuf));
    CU(cudaMalloc(&w->dout, q));
    CU(cudaMalloc(&w->dlse, lse));
    for (int l = 0; l < NL; l++) {
        CU(cudaMalloc(&w->dk[l], cache_bytes()));
        CU(cudaMalloc(&w->dv[l], cache_bytes()));
        w->ck[l] = xmalloc(cache_bytes());
        w->cv[l] = xmalloc(cache_bytes());
    }
    w->ws3d_bytes = attnd_paged_3d_workspace_size(attnd_plan_split_rows(w->units), HQ, HD, 1);
    CU(cudaMalloc(&w->ws3d, w->ws3d_bytes));
    w->hws3d = xmalloc(w->ws3d_bytes);
    CU(cudaMalloc(&w->dindex, (size_t)1 << 20));
    CU(cudaMalloc((void **)&w->dslopes, sizeof g_slopes));
    CU(cudaMemcpy(w->dslopes, g_slopes, sizeof g_slopes, cudaMemcpyHostToDevice));
    for (int i = 0; i < 2; i++) {
        CU(cudaMalloc((void **)&w->dsinks[i], sizeof g_sinks[i]));
        CU(cudaMemcpy(w->dsinks[i], g_sinks[i], sizeof g_sinks[i], cudaMemcpyHostToDevice));
    }
    w->hq = xmalloc(q);
    w->hout = xmalloc(q);
    w->hout_direct = xmalloc(q);
    w->hout_cpu = xmalloc(q);
    w->hk = xmalloc(kv);
    w->hv = xmalloc(kv);
    w->hlse = xmalloc(lse);
    w->hlse_direct = xmalloc(lse);
    w->hlse_cpu = xmalloc(lse);
    for (int s = 0; s < MAX_SEQS; s++)
        for (int b = 0; b < SEQ_BLOCKS; b++)
            w->blocks[s][b] = s * SEQ_BLOCKS + b;
}

static int worker_open(worker *w, const attnd_daemon_proc *d)
{
    attnd_server_info info;
    attnd_device_info dev;
    attnd_backend_opts bo = {0, 0};
    AK(attnd_backend_open(&w->gpu, "cuda", &bo), w->gpu);
    AK(attnd_backend_open(&w->cpu, "cpu", &bo), w->cpu);
    AK(attnd_device_query(w->gpu, &dev), w->gpu);
    w->units = dev.num_sms;
    printf("device: %s, %d SMs, %.1f GiB free\n", dev.name, dev.num_sms,
           (double)dev.free_bytes / (1 << 30));
    worker_buffers(w);
    attnd_rng_seed(&w->rng, 20240611);
    if ((w->c = attnd_daemon_connect(d, 60000)) == NULL) return -1;
    info = *attnd_client_server(w->c);
    check(w, strcmp(info.backend, "cuda") == 0, "backend auto picks cuda on a GPU machine");
    printf("daemon: backend %s, num_blocks %u (geometry.gpu_memory_fraction 0.08), free %u\n",
           info.backend, info.geometry.num_blocks, info.blocks_free);
    check(w, info.geometry.num_blocks != 1024 && info.geometry.num_blocks >= 128,
          "gpu_memory_fraction sizes num_blocks (reported in Hello)");
    check(w, attnd_client_channel_active(w->c),
          "the client opened a shared-memory channel on ipc:// (steps 0..49 use it)");
    w->region = attnd_client_region_next_id(w->c);
    attnd_err rv = attnd_client_region_register_cuda(w->c, w->region, &w->handle, w->dbytes, 0);
    check(w, rv == ATTND_ERR_OK, "register the worker's cudaMalloc'd buffer (CUDA_IPC)");
    return rv == ATTND_ERR_OK ? 0 : -1;
}

/* ---------------------------------------------------------------- one step */

static void fill_bf16(worker *w, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = attnd_f32_to_bf16((float)attnd_rng_normal(&w->rng));
}

static int32_t plan_step(worker *w, const step_in *in, attnd_plan *plan, void **ws)
{
    attnd_plan_seq seqs[MAX_SEQS];
    attnd_plan_opts o = attnd_plan_opts_for(BS, HQ, HK, HD, w->units);
    for (int i = 0; i < in->n; i++) {
        int s = in->seq[i];
        uint32_t total = (uint32_t)w->len[s] + in->new_tokens[i];
        seqs[i] = (attnd_plan_seq){(uint32_t)w->len[s], in->new_tokens[i], w->blocks[s],
                                   (total + BS - 1) / BS};
    }
    size_t bytes = attnd_plan_workspace_size(seqs, in->n, &o);
    *ws = xmalloc(bytes);
    if (attnd_plan_build(plan, seqs, in->n, &o, *ws, bytes) != ATTND_ERR_OK) return -1;
    CU(cudaMemcpy(w->dindex, plan->slot_mapping, plan->index_bytes, cudaMemcpyHostToDevice));
    return plan->num_tokens;
}

static attnd_tensor tensor3(void *p, attnd_dtype dt, int64_t a, int64_t b, int64_t c)
{
    attnd_tensor t;
    int64_t shape[3] = {a, b, c};
    attnd_tensor_init(&t, p, dt, 3, shape);
    return t;
}

static attnd_tensor tensor2(void *p, attnd_dtype dt, int64_t a, int64_t b)
{
    attnd_tensor t;
    int64_t shape[2] = {a, b};
    attnd_tensor_init(&t, p, dt, 2, shape);
    return t;
}

static attnd_tensor cache_tensor(void *p)
{
    attnd_tensor t;
    int64_t shape[4] = {MAX_SEQS * SEQ_BLOCKS, BS, HK, HD};
    attnd_tensor_init(&t, p, ATTND_DTYPE_BF16, 4, shape);
    return t;
}

/* The daemon's Attend on the IPC region (outputs poisoned first). */
static attnd_err daemon_attend(worker *w, uint64_t step, int layer, int64_t T, uint64_t out_off)
{
    attnd_ref q, k, v, out, lse;
    int64_t sq[3] = {T, HQ, HD}, sk[3] = {T, HK, HD}, sl[2] = {HQ, T};
    attnd_ref_region(&q, w->region, w->off_q, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_region(&k, w->region, w->off_k, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&v, w->region, w->off_v, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&out, w->region, out_off, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_region(&lse, w->region, w->off_lse, ATTND_DTYPE_F32, 2, sl);
    return attnd_client_attend(w->c, step, (uint32_t)layer, &q, &k, &v, &out, &lse);
}

static double rel_err_bf16(const uint16_t *a, const uint16_t *b, size_t n)
{
    double *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) {
        x[i] = attnd_bf16_to_f32(a[i]);
        y[i] = attnd_bf16_to_f32(b[i]);
    }
    double e = attnd_rel_l2(x, y, (int64_t)n);
    free(x);
    free(y);
    return e;
}

static double rel_err_f32(const float *a, const float *b, size_t n)
{
    double *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) {
        x[i] = a[i];
        y[i] = b[i];
    }
    double e = attnd_rel_l2(x, y, (int64_t)n);
    free(x);
    free(y);
    return e;
}

typedef struct layer_result {
    int identical;
    double err_out, err_lse;
} layer_result;

/* One bf16 layer of T rows over q/k/v/out/lse buffers and a layer's caches, unit fp8 scales. */
static attnd_plan_layer bf16_layer(void *q, void *k, void *v, void *out, void *lse, void *kc,
                                   void *vc, int64_t T, float scale)
{
    attnd_plan_layer l = {.q = tensor3(q, ATTND_DTYPE_BF16, T, HQ, HD),
                          .k_new = tensor3(k, ATTND_DTYPE_BF16, T, HK, HD),
                          .v_new = tensor3(v, ATTND_DTYPE_BF16, T, HK, HD),
                          .out = tensor3(out, ATTND_DTYPE_BF16, T, HQ, HD),
                          .lse = tensor2(lse, ATTND_DTYPE_F32, HQ, T),
                          .k_cache = cache_tensor(kc),
                          .v_cache = cache_tensor(vc),
                          .scale = scale,
                          .k_scale = 1.0f,
                          .v_scale = 1.0f};
    return l;
}

/* Layer `layer`'s options into l, its slopes and sinks from device memory or the host's. */
static void layer_options(const worker *w, int layer, int device, attnd_plan_layer *l)
{
    const layer_opts *o = &kLayerOpts[layer % 4];
    int64_t hq = HQ;
    l->sliding_window = o->window;
    l->softcap = o->softcap;
    if (o->alibi)
        attnd_tensor_init(&l->alibi_slopes, device ? (void *)w->dslopes : (void *)g_slopes,
                          ATTND_DTYPE_F32, 1, &hq);
    if (o->sinks)
        attnd_tensor_init(&l->sinks,
                          device ? (void *)w->dsinks[o->sinks - 1] : (void *)g_sinks[o->sinks - 1],
                          ATTND_DTYPE_F32, 1, &hq);
}

/* The same layer with the CUDA ops called directly, and with the cpu backend. */
static void direct_layer(worker *w, const attnd_plan *plan, int layer, int64_t T, float scale)
{
    attnd_plan_layer g = bf16_layer(w->dbuf + w->off_q, w->dbuf + w->off_k, w->dbuf + w->off_v,
                                    w->dout, w->dlse, w->dk[layer], w->dv[layer], T, scale);
    layer_options(w, layer, 1, &g);
    CU(cudaMemset(w->dout, 0xff, (size_t)T * HQ * HD * 2));
    CU(cudaMemset(w->dlse, 0xff, (size_t)T * HQ * 4));
    CU(cudaDeviceSynchronize()); /* the poison lands before the backend's (non-blocking) stream */
    AK(attnd_plan_run_layer(w->gpu, plan, w->dindex, &g, w->ws3d), w->gpu);
    AK(attnd_backend_sync(w->gpu), w->gpu);
    attnd_plan_layer c = bf16_layer(w->hq, w->hk, w->hv, w->hout_cpu, w->hlse_cpu, w->ck[layer],
                                    w->cv[layer], T, scale);
    layer_options(w, layer, 0, &c);
    AK(attnd_plan_run_layer(w->cpu, plan, plan->slot_mapping, &c, w->hws3d), w->cpu);
}

/* The Attend with Q/K/V in host shm and INLINE outputs (the daemon stages them), its outputs
 * into w->hout and w->hlse: a layer of its own (a layer is attended once per step). */
static attnd_err staged_attend(worker *w, uint64_t step, int layer, int64_t T)
{
    attnd_shm shm;
    attnd_ref q, k, v, out, lse;
    size_t nq = (size_t)T * HQ * HD, nkv = (size_t)T * HK * HD;
    int64_t sq[3] = {T, HQ, HD}, sk[3] = {T, HK, HD}, sl[2] = {HQ, T};
    attnd_err rv = attnd_client_shm_create(w->c, (nq + 2 * nkv) * 2, &shm);
    if (rv != ATTND_ERR_OK) return rv;
    memcpy(shm.base, w->hq, nq * 2);
    memcpy((char *)shm.base + nq * 2, w->hk, nkv * 2);
    memcpy((char *)shm.base + (nq + nkv) * 2, w->hv, nkv * 2);
    attnd_ref_shm(&q, &shm, 0, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_shm(&k, &shm, nq * 2, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_shm(&v, &shm, (nq + nkv) * 2, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_inline_out(&out, w->hout, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_inline_out(&lse, w->hlse, ATTND_DTYPE_F32, 2, sl);
    rv = attnd_client_attend(w->c, step, (uint32_t)layer, &q, &k, &v, &out, &lse);
    attnd_client_shm_destroy(w->c, &shm);
    return rv;
}

/* One layer through the daemon (Q/K/V/out/LSE in the IPC region, or staged: host shm and INLINE
 * outputs) against the direct CUDA ops and the cpu backend on the same inputs. */
static layer_result run_layer(worker *w, const attnd_plan *plan, uint64_t step, int layer,
                              float scale, int staged)
{
    layer_result res = {0, INFINITY, INFINITY};
    int64_t T = plan->num_tokens;
    size_t nq = (size_t)T * HQ * HD, nkv = (size_t)T * HK * HD, nl = (size_t)T * HQ;
    fill_bf16(w, w->hq, nq);
    fill_bf16(w, w->hk, nkv);
    fill_bf16(w, w->hv, nkv);
    CU(cudaMemcpy(w->dbuf + w->off_q, w->hq, nq * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(w->dbuf + w->off_k, w->hk, nkv * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(w->dbuf + w->off_v, w->hv, nkv * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(w->dbuf + w->off_out, 0xff, nq * 2));
    CU(cudaMemset(w->dbuf + w->off_lse, 0xff, nl * 4));
    CU(cudaDeviceSynchronize()); /* ... and before the daemon's kernels, in another process */
    attnd_err rv =
        staged ? staged_attend(w, step, layer, T) : daemon_attend(w, step, layer, T, w->off_out);
    if (rv != ATTND_ERR_OK) {
        printf("attend step %llu layer %d: %s: %s\n", (unsigned long long)step, layer,
               attnd_err_name(rv), attnd_client_last_error(w->c));
        return res;
    }
    direct_layer(w, plan, layer, T, scale);
    if (!staged) {
        CU(cudaMemcpy(w->hout, w->dbuf + w->off_out, nq * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(w->hlse, w->dbuf + w->off_lse, nl * 4, cudaMemcpyDeviceToHost));
    }
    CU(cudaMemcpy(w->hout_direct, w->dout, nq * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(w->hlse_direct, w->dlse, nl * 4, cudaMemcpyDeviceToHost));
    res.identical = memcmp(w->hout, w->hout_direct, nq * 2) == 0 &&
                    memcmp(w->hlse, w->hlse_direct, nl * 4) == 0;
    res.err_out = rel_err_bf16(w->hout, w->hout_cpu, nq);
    res.err_lse = rel_err_f32(w->hlse, w->hlse_cpu, nl);
    return res;
}

/* ---------------------------------------------------------------- extra checks in a step */

/* References the daemon must refuse, in an open step; it keeps serving afterwards. */
static void check_bad_refs(worker *w, uint64_t step, int64_t T)
{
    attnd_err rv = daemon_attend(w, step, 0, T, w->dbytes - 256);
    check(w, rv == ATTND_ERR_INVALID_ARGUMENT,
          "out past the end of the IPC region: INVALID_ARGUMENT");
    printf("      (%s)\n", attnd_client_last_error(w->c));
    attnd_ref q, k, v, out;
    int64_t sq[3] = {T, HQ, HD}, sk[3] = {T, HK, HD};
    attnd_ref_region(&q, 999, 0, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_region(&k, w->region, w->off_k, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&v, w->region, w->off_v, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&out, w->region, w->off_out, ATTND_DTYPE_BF16, 3, sq);
    rv = attnd_client_attend(w->c, step, 0, &q, &k, &v, &out, NULL);
    check(w, rv == ATTND_ERR_NOT_FOUND, "a region never registered: NOT_FOUND");
}

static void check_bad_handles(worker *w)
{
    unsigned char junk[ATTND_IPC_HANDLE_BYTES];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)attnd_rng_next(&w->rng);
    attnd_err rv = attnd_client_region_register_cuda(w->c, attnd_client_region_next_id(w->c), junk,
                                                     1 << 20, 0);
    check(w, rv == ATTND_ERR_INVALID_ARGUMENT, "a junk IPC handle: INVALID_ARGUMENT");
    printf("      (%s)\n", attnd_client_last_error(w->c));
    rv = attnd_client_region_register_cuda(w->c, attnd_client_region_next_id(w->c), &w->handle,
                                           w->dbytes + ((size_t)64 << 20), 0);
    check(w, rv == ATTND_ERR_INVALID_ARGUMENT,
          "a region larger than the allocation: INVALID_ARGUMENT");
    printf("      (%s)\n", attnd_client_last_error(w->c));
    /* the same allocation twice (another id) opens, and closes on unregister */
    uint32_t again = attnd_client_region_next_id(w->c);
    rv = attnd_client_region_register_cuda(w->c, again, &w->handle, 4096, 0);
    check(w, rv == ATTND_ERR_OK && attnd_client_region_unregister(w->c, again) == ATTND_ERR_OK,
          "the same handle under a second id registers and unregisters");
}

static void worker_check(void *arg, int ok, const char *what)
{
    check(arg, ok, what);
}

/* ---------------------------------------------------------------- the run */

static void step_plan_in(worker *w, int step, step_in *in)
{
    static const int32_t prefill[6] = {300, 17, 128, 1, 64, 250};
    in->n = 0;
    if (step == 0) {
        for (int s = 0; s < 6; s++) {
            in->seq[in->n] = s;
            in->new_tokens[in->n++] = (uint32_t)prefill[s];
        }
        return;
    }
    if (step == 50) { /* a new sequence's prefill first, then the decodes */
        in->seq[in->n] = 7;
        in->new_tokens[in->n++] = 33;
    }
    /* step 21: sequence 6 goes mid-batch (decode, prefill, decode runs) */
    static const int mid[7] = {0, 1, 2, 6, 3, 4, 5};
    for (int i = 0; i < w->nseqs; i++) {
        int s = step == 21 ? mid[i] : i;
        if (s == 7 && step == 50) continue;
        uint32_t nt = 1;
        if (s == 6 && step == 20) nt = 200; /* joins last with a prefill */
        if (s == 6 && step == 21) nt = 100; /* chunked prefill on its context */
        in->seq[in->n] = s;
        in->new_tokens[in->n++] = nt;
    }
}

static int begin_step(worker *w, const step_in *in, attnd_step *st, const attnd_plan *plan)
{
    attnd_step_seq seqs[MAX_SEQS];
    uint32_t qsl[MAX_SEQS + 1];
    for (int i = 0; i < in->n; i++)
        seqs[i] = (attnd_step_seq){w->ids[in->seq[i]], in->new_tokens[i]};
    attnd_err rv = attnd_client_step_begin(w->c, seqs, (size_t)in->n, st, qsl);
    if (rv != ATTND_ERR_OK) {
        printf("begin_step: %s\n", attnd_client_last_error(w->c));
        return -1;
    }
    if ((int32_t)st->num_tokens != plan->num_tokens) return -1;
    for (int i = 0; i <= in->n; i++)
        if ((int32_t)qsl[i] != plan->query_start_loc[i]) return -1;
    return 0;
}

static void run_step(worker *w, int step, float scale, double *worst)
{
    step_in in;
    attnd_plan plan;
    attnd_step st;
    void *ws = NULL;
    char what[160];
    int identical = 1;
    double eo = 0, el = 0;
    if (step == 20) w->nseqs = 7;
    if (step == 50) w->nseqs = 8;
    if (step == 50)
        check(w, attnd_client_channel_close(w->c) == ATTND_ERR_OK,
              "channel closed: steps 50..100 go over the socket");
    step_plan_in(w, step, &in);
    if (plan_step(w, &in, &plan, &ws) < 0 || begin_step(w, &in, &st, &plan) != 0) {
        check(w, 0, "begin step (daemon and local plan agree)");
        free(ws);
        return;
    }
    /* refused Attends do not count: the layers are attended once after them */
    if (step == 40) check_bad_refs(w, st.id, plan.num_tokens);
    for (int l = 0; l < NL; l++) {
        int staged = step == 30 && l == 5;
        layer_result r = run_layer(w, &plan, st.id, l, scale, staged);
        identical = identical && r.identical;
        eo = fmax(eo, r.err_out);
        el = fmax(el, r.err_lse);
        if (staged)
            check(w, r.identical,
                  "host shm + INLINE outputs on the cuda backend (staged): same bits as the "
                  "direct CUDA ops");
    }
    attnd_err rv = attnd_client_step_end(w->c, st.id, 0);
    for (int i = 0; i < in.n; i++)
        w->len[in.seq[i]] += (int32_t)in.new_tokens[i];
    int launches3d = 0;
    for (int i = 0; i < plan.num_launches; i++)
        launches3d += plan.launches[i].kind == ATTND_LAUNCH_3D;
    snprintf(what, sizeof what,
             "step %3d: %d seqs, %d tokens, %d launches (%d 3D): daemon == direct CUDA ops "
             "(bits, %d layers)",
             step, in.n, plan.num_tokens, plan.num_launches, launches3d, NL);
    if (step == 0 || step % 10 == 0 || step == 21 || !identical)
        check(w, identical, what);
    else if (identical)
        w->pass++;
    else
        w->fail++;
    int ok = eo <= attnd_tol_for(ATTND_DTYPE_BF16) && el <= 1e-3 && rv == ATTND_ERR_OK;
    snprintf(what, sizeof what, "step %3d: daemon vs cpu backend: out err %.2e, lse err %.2e", step,
             eo, el);
    if (step == 0 || step % 10 == 0 || step == 21 || !ok)
        check(w, ok, what);
    else
        w->pass++;
    worst[0] = fmax(worst[0], eo);
    worst[1] = fmax(worst[1], el);
    free(ws);
}

static void run_steps(worker *w)
{
    double worst[2] = {0, 0};
    float scale = 1.0f / sqrtf((float)HD);
    w->nseqs = 6;
    for (int s = 0; s < MAX_SEQS; s++) {
        w->ids[s] = 1000 + (uint64_t)s;
        if (attnd_client_seq_create(w->c, w->ids[s], NULL) != ATTND_ERR_OK) {
            check(w, 0, "create sequences");
            return;
        }
    }
    for (int step = 0; step <= DECODE_STEPS; step++)
        run_step(w, step, scale, worst);
    printf("worst over %d steps x %d layers: out rel err %.3e (tol %.1e), lse %.3e\n",
           DECODE_STEPS + 1, NL, worst[0], attnd_tol_for(ATTND_DTYPE_BF16), worst[1]);
}

/* A cpu daemon has no device to open IPC handles on. */
static void check_cpu_daemon(worker *w, const attnd_daemon_proc *cpu)
{
    attnd_client *c = attnd_daemon_connect(cpu, 10000);
    attnd_err rv =
        c ? attnd_client_region_register_cuda(c, 1, &w->handle, 4096, 0) : ATTND_ERR_UNAVAILABLE;
    check(w, rv == ATTND_ERR_UNSUPPORTED, "a cpu daemon refuses CUDA_IPC: UNSUPPORTED");
    attnd_client_free(c);
}

/* The daemon's own account of its backend and memory (and any device failure). */
static void print_daemon_events(const attnd_daemon_proc *d)
{
    char line[1024];
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL) return;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "event=backend") || strstr(line, "event=memory") ||
            strstr(line, "event=device_failed") || strstr(line, "event=ready"))
            printf("daemon: %s", line);
    fclose(f);
}

/* The layers' options as Hello reports them: the per-layer geometry the test configured. */
static void check_reported_layers(worker *w)
{
    const attnd_geometry *g = &attnd_client_server(w->c)->geometry;
    int ok = g->layers != NULL;
    for (uint32_t l = 0; ok && l < g->num_layers; l++) {
        const layer_opts *o = &kLayerOpts[l % 4];
        const attnd_layer_opts *r = &g->layers[l];
        ok = (int32_t)r->sliding_window == o->window && r->softcap == o->softcap &&
             (r->num_alibi_slopes != 0) == o->alibi && (r->num_sinks != 0) == (o->sinks != 0) &&
             (!o->sinks || memcmp(r->sinks, g_sinks[o->sinks - 1], sizeof g_sinks[0]) == 0);
    }
    check(w, ok, "Hello reports every layer's options as configured");
}

int main(void)
{
    attnd_daemon_proc gpu_d, cpu_d, f32_cuda, f32_cpu;
    worker w;
    static char config[16384];
    memset(&w, 0, sizeof w);
    config_with_layers(config, sizeof config);
    /* the daemons first: fork before this process initialises CUDA */
    if (attnd_daemon_start(&gpu_d, config) != 0) return 1;
    if (attnd_daemon_start(&cpu_d, ATTND_TEST_CONFIG_SMALL) != 0) return 1;
    if (attnd_e2e_f32_start(&f32_cuda, &f32_cpu) != 0) return 1;
    if (worker_open(&w, &gpu_d) == 0) {
        char report[320];
        check_bad_handles(&w);
        check_reported_layers(&w);
        attnd_e2e_device_indices(&gpu_d, w.cpu, worker_check, &w);
        run_steps(&w);
        check_cpu_daemon(&w, &cpu_d);
        check(&w, attnd_e2e_concurrent(&gpu_d, report, sizeof report) == 0, report);
        check(&w, attnd_e2e_f32_run(&f32_cuda, &f32_cpu, report, sizeof report) == 0, report);
    }
    attnd_client_free(w.c);
    print_daemon_events(&gpu_d);
    if (w.fail) attnd_daemon_dump_log(&gpu_d);
    int st = attnd_daemon_stop(&cpu_d) | attnd_daemon_stop(&f32_cpu) | attnd_daemon_stop(&f32_cuda);
    check(&w, attnd_daemon_stop(&gpu_d) == 0 && st == 0, "both daemons exit cleanly on SIGTERM");
    printf("gpu_daemon_e2e: %d passed, %d failed\n", w.pass, w.fail);
    return w.fail ? 1 : 0;
}
