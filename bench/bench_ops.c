/* bench_ops: the CUDA backend's merge states, varlen, block-sparse and linear attention on the
 * shapes bench/anchors_ops.py times the seeds (and torch baselines) on; run both in one device
 * call and compare. Each case: warm-up, then per-call CUDA-event times on the backend's stream
 * with L2 cleared before every call (as triton.testing.do_bench does), median reported.
 * Inputs are random (never zeros). One line per case, same format as anchors_ops.py.
 *
 * usage: bench_ops [merge|varlen|blocksparse|linear|sm80]...   (default: all; sm80: the words
 * after it run varlen / block-sparse on the mma.sync kernel, labelled attnd-sm80; off=MASK: the
 * words after it with those sm90 features off, ATTND_SM90_NO_* of paged/launch.h) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnd/kernels.h"
#include "check.h"

#ifndef ATTND_HAVE_CUDA
int main(void)
{
    fprintf(stderr, "bench_ops: built without the CUDA backend\n");
    return 1;
}
#else
/* The backend's stream, for CUDA events around each call (bench only; ops never expose it). */
#include "../kernels/cuda/cuda_backend.h"

static attnd_backend *gpu;
static cudaStream_t stream;
static void *flush_buf;
static const char *who = "attnd"; /* the label of attnd's lines */
static const size_t flush_bytes = (size_t)256 << 20;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

#define CK(call) ATTND_CHECK(call, gpu)

#define CU(call) ATTND_CHECK_CUDA(call)

static double rnd(void) /* uniform [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 4503599627370496.0 - 1.0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A device tensor of the given shape (contiguous), filled with random values (scale * U(-1.7, 1.7),
 * about unit variance) or, for index dtypes, left for the caller. */
static attnd_tensor dev_tensor(attnd_dtype dt, int32_t ndim, const int64_t *shape, double scale)
{
    attnd_tensor t;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    size_t bytes = (size_t)n * attnd_dtype_size(dt);
    void *d = NULL;
    CK(attnd_backend_alloc(gpu, bytes, &d));
    attnd_tensor_init(&t, d, dt, ndim, shape);
    if (dt == ATTND_DTYPE_I32 || dt == ATTND_DTYPE_I64) return t;
    void *h = malloc(bytes);
    for (int64_t i = 0; i < n; i++)
        attnd_store_f32(h, dt, i, (float)(scale * 1.7 * rnd()));
    CK(attnd_backend_memcpy(gpu, d, h, bytes, ATTND_MEMCPY_H2D));
    free(h);
    return t;
}

static void dev_upload(attnd_tensor *t, const void *host, size_t bytes)
{
    CK(attnd_backend_memcpy(gpu, t->data, host, bytes, ATTND_MEMCPY_H2D));
}

static void dev_free(attnd_tensor *t)
{
    attnd_backend_free(gpu, t->data);
    t->data = NULL;
}

typedef attnd_err (*op_fn)(void *ctx);

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median ms of one call, L2 cleared before each. */
static double time_op(op_fn fn, void *ctx)
{
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++)
        CK(fn(ctx));
    CK(attnd_backend_sync(gpu));
    /* estimate, then ~200 ms of repetitions (10..500) */
    CU(cudaEventRecord(e0, stream));
    for (int i = 0; i < 5; i++)
        CK(fn(ctx));
    CU(cudaEventRecord(e1, stream));
    CU(cudaEventSynchronize(e1));
    float est = 0;
    CU(cudaEventElapsedTime(&est, e0, e1));
    est /= 5;
    int reps = est > 0 ? (int)(200.0 / est) : 500;
    reps = reps < 10 ? 10 : reps > 500 ? 500 : reps;
    float *ms = malloc(sizeof(float) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        CU(cudaMemsetAsync(flush_buf, r & 0xff, flush_bytes, stream));
        CU(cudaEventRecord(e0, stream));
        CK(fn(ctx));
        CU(cudaEventRecord(e1, stream));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, (size_t)reps, sizeof(float), cmp_f);
    double med = ms[reps / 2];
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}

/* ---------------------------------------------------------------- merge states */

static attnd_err merge_fn(void *ctx)
{
    return attnd_merge_states(gpu, (const attnd_merge_params *)ctx);
}

typedef struct copy_ctx {
    void *dst, *src;
    size_t bytes;
} copy_ctx;

static attnd_err copy_fn(void *ctx)
{
    copy_ctx *c = ctx;
    return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream) ==
                   cudaSuccess
               ? ATTND_ERR_OK
               : ATTND_ERR_INTERNAL;
}

static void merge_params(attnd_merge_params *p, int64_t T, int64_t H, int64_t D)
{
    int64_t os[3] = {T, H, D}, ls[2] = {H, T};
    p->out = dev_tensor(ATTND_DTYPE_BF16, 3, os, 1.0);
    p->prefix_out = dev_tensor(ATTND_DTYPE_BF16, 3, os, 1.0);
    p->suffix_out = dev_tensor(ATTND_DTYPE_BF16, 3, os, 1.0);
    p->out_lse = dev_tensor(ATTND_DTYPE_F32, 2, ls, 1.0);
    p->prefix_lse = dev_tensor(ATTND_DTYPE_F32, 2, ls, 3.0);
    p->suffix_lse = dev_tensor(ATTND_DTYPE_F32, 2, ls, 3.0);
}

static void merge_free(attnd_merge_params *p)
{
    dev_free(&p->out);
    dev_free(&p->prefix_out);
    dev_free(&p->suffix_out);
    dev_free(&p->out_lse);
    dev_free(&p->prefix_lse);
    dev_free(&p->suffix_lse);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench_merge(void)
{
    const int64_t H = 32, D = 128;
    const int64_t Ts[2] = {4096, 65536};
    for (int i = 0; i < 2; i++) {
        attnd_merge_params p;
        merge_params(&p, Ts[i], H, D);
        double nbytes = 3.0 * (double)(Ts[i] * H * D) * 2 + 3.0 * (double)(H * Ts[i]) * 4;
        double ms = time_op(merge_fn, &p);
        printf("case=merge attnd T=%lld bf16 | ms=%.4g | GBps=%.4g\n", (long long)Ts[i], ms,
               nbytes / ms / 1e6);
        copy_ctx c = {NULL, NULL, (size_t)(nbytes / 2)};
        CK(attnd_backend_alloc(gpu, c.bytes, &c.src));
        CK(attnd_backend_alloc(gpu, c.bytes, &c.dst));
        CU(cudaMemsetAsync(c.src, 1, c.bytes, stream));
        double cms = time_op(copy_fn, &c);
        printf("case=merge cudaMemcpy-same-bytes T=%lld | ms=%.4g | GBps=%.4g | merge/copy=%.3f\n",
               (long long)Ts[i], cms, nbytes / cms / 1e6, ms / cms);
        attnd_backend_free(gpu, c.src);
        attnd_backend_free(gpu, c.dst);
        merge_free(&p);
    }
    /* host cost per call (tiny shape) and call + sync latency */
    attnd_merge_params p;
    merge_params(&p, 1, H, D);
    for (int i = 0; i < 100; i++)
        CK(merge_fn(&p));
    CK(attnd_backend_sync(gpu));
    enum { N = 2000 };
    static double per[N];
    for (int i = 0; i < N; i++) {
        double t0 = now_s();
        CK(merge_fn(&p));
        per[i] = now_s() - t0;
        if (i % 200 == 199) CK(attnd_backend_sync(gpu));
    }
    CK(attnd_backend_sync(gpu));
    qsort(per, N, sizeof(double), cmp_d);
    printf("case=merge attnd host-per-call T=1 | us=%.4g\n", per[N / 2] * 1e6);
    for (int i = 0; i < 500; i++) {
        double t0 = now_s();
        CK(merge_fn(&p));
        CK(attnd_backend_sync(gpu));
        per[i] = now_s() - t0;
    }
    qsort(per, 500, sizeof(double), cmp_d);
    printf("case=merge attnd call+sync T=1 | us=%.4g\n", per[250] * 1e6);
    merge_free(&p);
}

/* ---------------------------------------------------------------- varlen */

static attnd_err varlen_fn(void *ctx)
{
    return attnd_varlen_attention(gpu, (const attnd_varlen_params *)ctx);
}

static attnd_tensor cu_uniform(int64_t batch, int32_t len)
{
    int64_t s[1] = {batch + 1};
    attnd_tensor t = dev_tensor(ATTND_DTYPE_I32, 1, s, 0);
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    for (int64_t i = 0; i <= batch; i++)
        h[i] = (int32_t)(i * len);
    dev_upload(&t, h, sizeof(int32_t) * (size_t)(batch + 1));
    free(h);
    return t;
}

static void bench_varlen(void)
{
    const int64_t B = 8, L = 2048, HQ = 32, HK = 8;
    struct {
        attnd_dtype dt;
        int64_t d;
        int bias; /* a bf16 bias [B, HQ, L, L] */
        const char *name;
    } cases[5] = {{ATTND_DTYPE_BF16, 128, 0, "bf16"},
                  {ATTND_DTYPE_F16, 128, 0, "fp16"},
                  {ATTND_DTYPE_BF16, 96, 0, "bf16"},
                  {ATTND_DTYPE_FP8_E4M3, 128, 0, "fp8"},
                  {ATTND_DTYPE_BF16, 128, 1, "bf16 bias"}};
    for (int i = 0; i < 5; i++) {
        const int64_t d = cases[i].d;
        int64_t qs[3] = {B * L, HQ, d}, ks[3] = {B * L, HK, d};
        attnd_varlen_params p;
        memset(&p, 0, sizeof p);
        p.q = dev_tensor(cases[i].dt, 3, qs, 1.0);
        p.k = dev_tensor(cases[i].dt, 3, ks, 1.0);
        p.v = dev_tensor(cases[i].dt, 3, ks, 1.0);
        p.out = dev_tensor(cases[i].dt == ATTND_DTYPE_FP8_E4M3 ? ATTND_DTYPE_BF16 : cases[i].dt, 3,
                           qs, 1.0);
        p.cu_seqlens_q = cu_uniform(B, (int32_t)L);
        p.cu_seqlens_k = cu_uniform(B, (int32_t)L);
        p.max_seqlen_q = p.max_seqlen_k = (int32_t)L;
        p.causal = 1;
        p.scale = 1.0f / sqrtf((float)d);
        p.q_scale = p.k_scale = p.v_scale = 1.0f;
        p.p_scale = cases[i].dt == ATTND_DTYPE_FP8_E4M3 ? 1.0f / 448.0f : 1.0f;
        p.out_scale = 1.0f;
        int64_t bs[4] = {B, HQ, L, L};
        if (cases[i].bias) p.bias = dev_tensor(ATTND_DTYPE_BF16, 4, bs, 1.0);
        double ms = time_op(varlen_fn, &p);
        double flops = 4.0 * (double)(B * HQ * d) * (double)(L * L) / 2;
        printf("case=varlen %s b=%lld L=%lld d=%lld %s causal | ms=%.4g | TFLOPs=%.4g\n", who,
               (long long)B, (long long)L, (long long)d, cases[i].name, ms, flops / ms / 1e9);
        dev_free(&p.q);
        dev_free(&p.k);
        dev_free(&p.v);
        dev_free(&p.out);
        dev_free(&p.cu_seqlens_q);
        dev_free(&p.cu_seqlens_k);
        if (cases[i].bias) dev_free(&p.bias);
    }
}

/* ---------------------------------------------------------------- block-sparse */

static attnd_err bs_fn(void *ctx)
{
    return attnd_blocksparse_attention(gpu, (const attnd_blocksparse_params *)ctx);
}

#define BS_BLK 64
#define BS_LOCAL 16
#define BS_VERT 8

/* The anchors' layout (local blocks + vertical stride, per-head offset) over nrows row blocks;
 * returns the number of listed blocks in all rows (per head summed) and in the last row. */
static void bs_layout(attnd_blocksparse_params *p, int64_t heads, int64_t nrows, double *listed,
                      double *listed_last)
{
    int32_t *crow = calloc((size_t)(heads * (nrows + 1)), sizeof(int32_t));
    int64_t cap = nrows * (nrows + 1) / 2 + 1;
    int32_t *cols = calloc((size_t)(heads * cap), sizeof(int32_t));
    int64_t width = 1;
    *listed = *listed_last = 0;
    for (int64_t h = 0; h < heads; h++) {
        int64_t n = 0;
        for (int64_t qb = 0; qb < nrows; qb++) {
            crow[h * (nrows + 1) + qb] = (int32_t)n;
            for (int64_t kb = 0; kb <= qb; kb++)
                if (qb - kb < BS_LOCAL || (kb + h + 1) % BS_VERT == 0) {
                    cols[h * cap + n++] = (int32_t)kb;
                    if (qb == nrows - 1) *listed_last += 1;
                }
        }
        crow[h * (nrows + 1) + nrows] = (int32_t)n;
        *listed += (double)n;
        if (n > width) width = n;
    }
    int32_t *col = calloc((size_t)(heads * width), sizeof(int32_t));
    for (int64_t h = 0; h < heads; h++)
        for (int64_t c = 0; c < crow[h * (nrows + 1) + nrows]; c++)
            col[h * width + c] = cols[h * cap + c];
    int64_t cs[2] = {heads, nrows + 1}, ws[2] = {heads, width};
    p->layout_crow = dev_tensor(ATTND_DTYPE_I32, 2, cs, 0);
    p->layout_col = dev_tensor(ATTND_DTYPE_I32, 2, ws, 0);
    dev_upload(&p->layout_crow, crow, sizeof(int32_t) * (size_t)(heads * (nrows + 1)));
    dev_upload(&p->layout_col, col, sizeof(int32_t) * (size_t)(heads * width));
    free(crow);
    free(cols);
    free(col);
}

static void bs_free(attnd_blocksparse_params *p)
{
    attnd_tensor *all[] = {
        &p->q,           &p->k,         &p->v, &p->out, &p->cu_seqlens_q, &p->cu_seqlens_k,
        &p->layout_crow, &p->layout_col};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dev_free(all[i]);
}

static void bench_blocksparse(void)
{
    const int64_t HQ = 32, HK = 8, D = 128;
    { /* prefill 8 x 2048 */
        const int64_t B = 8, L = 2048, nrows = L / BS_BLK;
        attnd_blocksparse_params p;
        memset(&p, 0, sizeof p);
        int64_t qs[3] = {B * L, HQ, D}, ks[3] = {B * L, HK, D};
        p.q = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.k = dev_tensor(ATTND_DTYPE_BF16, 3, ks, 1.0);
        p.v = dev_tensor(ATTND_DTYPE_BF16, 3, ks, 1.0);
        p.out = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.cu_seqlens_q = cu_uniform(B, (int32_t)L);
        p.cu_seqlens_k = cu_uniform(B, (int32_t)L);
        p.max_seqlen_q = p.max_seqlen_k = (int32_t)L;
        p.block_size = BS_BLK;
        p.scale = 1.0f / sqrtf((float)D);
        double listed, last;
        bs_layout(&p, HQ, nrows, &listed, &last);
        double density = listed / ((double)HQ * (double)(nrows * (nrows + 1)) / 2);
        double ms = time_op(bs_fn, &p);
        double flops = 4.0 * (double)(B * HQ * D) * (double)(L * L) / 2;
        printf("case=blocksparse %s prefill b=%lld L=%lld bf16 density=%.3f | ms=%.4g | "
               "TFLOPs=%.4g\n",
               who, (long long)B, (long long)L, density, ms, flops * density / ms / 1e9);
        bs_free(&p);
    }
    { /* decode: 64 sequences x 4096 context */
        const int64_t NB = 64, CTX = 4096, nrows = CTX / BS_BLK;
        attnd_blocksparse_params p;
        memset(&p, 0, sizeof p);
        int64_t qs[3] = {NB, HQ, D}, ks[3] = {NB * CTX, HK, D};
        p.q = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.k = dev_tensor(ATTND_DTYPE_BF16, 3, ks, 1.0);
        p.v = dev_tensor(ATTND_DTYPE_BF16, 3, ks, 1.0);
        p.out = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.cu_seqlens_q = cu_uniform(NB, 1);
        p.cu_seqlens_k = cu_uniform(NB, (int32_t)CTX);
        p.max_seqlen_q = 1;
        p.max_seqlen_k = (int32_t)CTX;
        p.block_size = BS_BLK;
        p.scale = 1.0f / sqrtf((float)D);
        double listed, last;
        bs_layout(&p, HQ, nrows, &listed, &last);
        double ms = time_op(bs_fn, &p);
        double kv_bytes = (double)NB * last * BS_BLK * D * 2 * 2;
        printf("case=blocksparse attnd decode b=%lld ctx=%lld bf16 | ms=%.4g | GBps=%.4g\n",
               (long long)NB, (long long)CTX, ms, kv_bytes / ms / 1e6);
        bs_free(&p);
    }
}

/* ---------------------------------------------------------------- linear attention */

static attnd_err lin_prefill_fn(void *ctx)
{
    return attnd_linear_prefill(gpu, (const attnd_linear_prefill_params *)ctx);
}

static attnd_err lin_decode_fn(void *ctx)
{
    return attnd_linear_decode(gpu, (const attnd_linear_decode_params *)ctx);
}

static attnd_tensor slopes_tensor(int64_t H)
{
    int64_t s[1] = {H};
    attnd_tensor t = dev_tensor(ATTND_DTYPE_F32, 1, s, 0);
    float *h = malloc(sizeof(float) * (size_t)H);
    for (int64_t i = 0; i < H; i++)
        h[i] = (float)pow(2.0, -8.0 * (double)(i + 1) / (double)H);
    dev_upload(&t, h, sizeof(float) * (size_t)H);
    free(h);
    return t;
}

static void bench_linear(void)
{
    const int64_t H = 64, N = 8192;
    const int64_t ds[2] = {96, 128};
    for (int i = 0; i < 2; i++) {
        const int64_t d = ds[i];
        int64_t qs[4] = {1, H, N, d}, ss[4] = {1, H, d, d};
        attnd_linear_prefill_params p;
        memset(&p, 0, sizeof p);
        p.q = dev_tensor(ATTND_DTYPE_BF16, 4, qs, 1.0);
        p.k = dev_tensor(ATTND_DTYPE_BF16, 4, qs, 1.0);
        p.v = dev_tensor(ATTND_DTYPE_BF16, 4, qs, 1.0);
        p.out = dev_tensor(ATTND_DTYPE_BF16, 4, qs, 1.0);
        p.kv_state = dev_tensor(ATTND_DTYPE_F32, 4, ss, 0.0);
        p.slopes = slopes_tensor(H);
        double ms = time_op(lin_prefill_fn, &p);
        double nominal = (double)H * (double)N * (double)(64 * (d + d) + 4 * d * d);
        printf(
            "case=linear attnd prefill b=1 h=%lld n=%lld d=e=%lld bf16 | ms=%.4g | TFLOPs=%.4g\n",
            (long long)H, (long long)N, (long long)d, ms, nominal / ms / 1e9);
        attnd_tensor *all[] = {&p.q, &p.k, &p.v, &p.out, &p.kv_state, &p.slopes};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
            dev_free(all[j]);
    }
    for (int i = 0; i < 2; i++) {
        const int64_t d = ds[i], R = 64, SLOTS = 128;
        int64_t qs[3] = {R, H, d}, cs[4] = {SLOTS, H, d, d}, ss[1] = {R};
        attnd_linear_decode_params p;
        memset(&p, 0, sizeof p);
        p.q = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.k = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.v = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.out = dev_tensor(ATTND_DTYPE_BF16, 3, qs, 1.0);
        p.kv_cache = dev_tensor(ATTND_DTYPE_F32, 4, cs, 1.0);
        p.slopes = slopes_tensor(H);
        p.slot_idx = dev_tensor(ATTND_DTYPE_I64, 1, ss, 0);
        int64_t perm[128];
        for (int j = 0; j < SLOTS; j++)
            perm[j] = j;
        for (int j = SLOTS - 1; j > 0; j--) {
            int k = (int)((rnd() + 1.0) * 0.5 * (j + 1));
            if (k > j) k = j;
            int64_t t = perm[j];
            perm[j] = perm[k];
            perm[k] = t;
        }
        dev_upload(&p.slot_idx, perm, sizeof(int64_t) * (size_t)R);
        double ms = time_op(lin_decode_fn, &p);
        double nbytes = 2.0 * (double)(R * H * d * d) * 4;
        printf("case=linear attnd decode rows=%lld h=%lld d=e=%lld bf16 | ms=%.4g | GBps=%.4g\n",
               (long long)R, (long long)H, (long long)d, ms, nbytes / ms / 1e6);
        attnd_tensor *all[] = {&p.q, &p.k, &p.v, &p.out, &p.kv_cache, &p.slopes, &p.slot_idx};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
            dev_free(all[j]);
    }
}

int main(int argc, char **argv)
{
    attnd_err rv = attnd_backend_open(&gpu, "cuda", NULL);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "bench_ops: cuda backend: %s\n", attnd_strerror(rv));
        return 1;
    }
    stream = attnd_cuda_of(gpu)->stream;
    CK(attnd_backend_alloc(gpu, flush_bytes, &flush_buf));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, attnd_cuda_of(gpu)->device));
    printf("bench_ops: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    int all = argc < 2;
    for (int i = 0; i < (all ? 1 : argc - 1); i++) {
        const char *w = all ? NULL : argv[i + 1];
        if (!all && strcmp(w, "sm80") == 0) {
            attnd_cuda_of(gpu)->paged_core = 80;
            who = "attnd-sm80";
        }
        if (!all && strncmp(w, "off=", 4) == 0) { /* sm90 features off (ATTND_SM90_NO_*) */
            static char tag[32];
            attnd_cuda_of(gpu)->sm90_off = atoi(w + 4);
            snprintf(tag, sizeof tag, "attnd-off%d", attnd_cuda_of(gpu)->sm90_off);
            who = tag;
        }
        if (all || strcmp(w, "merge") == 0) bench_merge();
        if (all || strcmp(w, "varlen") == 0) bench_varlen();
        if (all || strcmp(w, "blocksparse") == 0) bench_blocksparse();
        if (all || strcmp(w, "linear") == 0) bench_linear();
        fflush(stdout);
    }
    attnd_backend_free(gpu, flush_buf);
    attnd_backend_close(gpu);
    return 0;
}
#endif
