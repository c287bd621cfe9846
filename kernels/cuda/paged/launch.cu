// Paged attention entry points of the cuda backend: check what the kernels additionally need
// (unit innermost strides, 16-byte rows), derive the kernel arguments from the caller's
// attnd_paged_params, pick a core and launch it on the backend's stream.
//
// Cores: the 3D op always uses the sm80 decode tiles (16 packed rows, warps split the tokens),
// one CTA per (q-block, kv head, segment); with num_segments > 1 the CTA that stores a pair's last
// segment merges its partials (the stream's tickets, paged/reduce.cuh), else the reduce kernel
// does. The 2D op uses the decode tiles with one segment when every sequence's packed rows
// (query_len * group) fit in 16; otherwise prefill tiles: the sm90 core (wgmma + TMA) on an sm_90
// device when this build has sm_90a code, the cache is 16-bit or fp8 (fp8: the core's converting
// producer) and the driver encodes the caches' tensor maps, else the sm80 prefill core (128
// packed rows; 64 above head size 128). An f32 cache takes the exact kernel of paged/f32.cu in
// both ops. Sinks join in the store of the final output (each core's epilogue, or the reduce
// after a split).
#include <stdint.h>
#include <string.h>

#include "cuda_backend.h"
#include "paged/launch.h"
#include "paged/reduce.cuh"
#include "prims/sm90.cuh"
#include "validate.h"

static int aligned(const void *ptr, int64_t bytes)
{
    return ((uintptr_t)ptr % (uintptr_t)bytes) == 0;
}

// An f32 cache: the exact kernel reads rows element by element, so no alignment is asked.
static attnd_err paged_prepare_f32(const attnd_paged_params *p, attnd_paged_kargs *a, int *kv)
{
    const int64_t bs = p->k_cache.shape[1];
    a->p = *p;
    a->group = (int32_t)(p->q.shape[1] / p->k_cache.shape[2]);
    a->bs_log2 = bs == 16 ? 4 : (bs == 32 ? 5 : 6);
    a->num_segments = 1;
    a->out_scale = 1.0f;
    *kv = ATTND_KV_F32;
    return ATTND_ERR_OK;
}

static attnd_err paged_prepare(attnd_backend *b, const attnd_paged_params *p, attnd_paged_kargs *a,
                               int *kv)
{
    const attnd_tensor *q = &p->q, *k = &p->k_cache, *v = &p->v_cache, *o = &p->out;
    memset(a, 0, sizeof *a);
    if (q->strides[2] != 1 || o->strides[2] != 1 || k->strides[3] != 1 || v->strides[3] != 1)
        return attnd_fail(b, "cuda paged attention: q, out, k_cache and v_cache need a unit "
                             "innermost stride");
    const int64_t bs = k->shape[1];
    if (bs != 16 && bs != 32 && bs != 64)
        return attnd_fail(b, "k_cache: block size %lld not 16, 32 or 64", (long long)bs);
    if (k->dtype != v->dtype) return attnd_fail(b, "v_cache: dtype differs from k_cache");
    if (p->block_tables.dtype != ATTND_DTYPE_I32 || p->seq_lens.dtype != ATTND_DTYPE_I32 ||
        p->query_start_loc.dtype != ATTND_DTYPE_I32)
        return attnd_fail(b, "cuda paged attention: block_tables, seq_lens and query_start_loc "
                             "must be i32");
    if (p->alibi_slopes.data && p->alibi_slopes.dtype != ATTND_DTYPE_F32)
        return attnd_fail(b, "alibi_slopes: must be f32");
    if (p->out_lse.data && p->out_lse.dtype != ATTND_DTYPE_F32)
        return attnd_fail(b, "out_lse: must be f32");

    const int64_t D = q->shape[2];
    if (k->dtype == ATTND_DTYPE_F32) return paged_prepare_f32(p, a, kv);
    const int fp8 = k->dtype == ATTND_DTYPE_FP8_E4M3;
    // the kernels address within a page row in 32 bits (page * stride is 64-bit)
    for (int i = 0; i < 2; i++) {
        const attnd_tensor *t = i ? v : k;
        const int64_t es = fp8 ? 1 : 2;
        if (t->strides[0] * es > INT32_MAX ||
            (t->strides[1] * 64 + t->strides[2] * t->shape[2] + D) * es > INT32_MAX)
            return attnd_fail(b, "%s: strides too large for the cuda backend (2^31 elements)",
                              i ? "v_cache" : "k_cache");
    }
    if (p->block_tables.strides[1] * p->block_tables.shape[1] > INT32_MAX)
        return attnd_fail(b, "block_tables: row longer than 2^31 elements");
    *kv = fp8 ? ATTND_KV_FP8 : (k->dtype == ATTND_DTYPE_BF16 ? ATTND_KV_BF16 : ATTND_KV_F16);
    // cp.async copies 16-byte chunks (8 elements; fp8: 16, or two 8-byte halves)
    const int64_t es = fp8 ? 1 : 2;
    int vec16 = 1;
    const attnd_tensor *cs[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        const attnd_tensor *t = cs[i];
        int ok8 = aligned(t->data, 8) && (t->strides[0] * es) % 8 == 0 &&
                  (t->strides[1] * es) % 8 == 0 && (t->strides[2] * es) % 8 == 0;
        int ok16 = aligned(t->data, 16) && (t->strides[0] * es) % 16 == 0 &&
                   (t->strides[1] * es) % 16 == 0 && (t->strides[2] * es) % 16 == 0 &&
                   (D * es) % 16 == 0;
        if (fp8 ? !ok8 : !ok16)
            return attnd_fail(b,
                              "%s: rows must start on %d-byte boundaries for the cuda "
                              "backend (base and strides)",
                              i ? "v_cache" : "k_cache", fp8 ? 8 : 16);
        vec16 = vec16 && ok16;
    }

    a->p = *p;
    {
        int64_t qe = (int64_t)attnd_dtype_size(q->dtype);
        a->q_vec = aligned(q->data, 16) && (q->strides[0] * qe) % 16 == 0 &&
                   (q->strides[1] * qe) % 16 == 0;
        int64_t vb = (int64_t)attnd_dtype_size(o->dtype) * 4; /* bytes of a 4-element store */
        a->out_vec = aligned(o->data, vb) && o->strides[0] % 4 == 0 && o->strides[1] % 4 == 0;
    }
    const int64_t nb = k->shape[0] < v->shape[0] ? k->shape[0] : v->shape[0];
    a->nblocks32 = (int32_t)(nb < INT32_MAX ? nb : INT32_MAX);
    a->qk_scale = p->scale * (fp8 ? p->k_scale : 1.0f);
    a->qk_scale_log2 = a->qk_scale * 1.4426950408889634f;
    a->out_scale = fp8 ? p->v_scale : 1.0f;
    a->plain = p->softcap == 0.0f && p->alibi_slopes.data == NULL && a->qk_scale > 0.0f;
    a->group = (int32_t)(q->shape[1] / k->shape[2]);
    a->bs_log2 = bs == 16 ? 4 : (bs == 32 ? 5 : 6);
    a->kv_vec16 = vec16;
    a->kv_same = k->strides[0] == v->strides[0] && k->strides[1] == v->strides[1] &&
                 k->strides[2] == v->strides[2];
    a->num_segments = 1;
    return ATTND_ERR_OK;
}

// [core][head 64 / 128 / 256][cache f16 / bf16 / fp8]; NULL: not built.
static const attnd_paged_fn kPagedRun[4][3][3] = {
    {ATTND_PAGED_ROW(ATTND_CORE_SM80_PREFILL, 64), ATTND_PAGED_ROW(ATTND_CORE_SM80_PREFILL, 128),
     ATTND_PAGED_ROW(ATTND_CORE_SM80_PREFILL, 256)},
    {ATTND_PAGED_ROW(ATTND_CORE_SM80_DECODE, 64), ATTND_PAGED_ROW(ATTND_CORE_SM80_DECODE, 128),
     ATTND_PAGED_ROW(ATTND_CORE_SM80_DECODE, 256)},
    {ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL, 64), ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL, 128),
     ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL, 256)},
    {ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL_SINKS, 64),
     ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL_SINKS, 128),
     ATTND_PAGED_ROW(ATTND_CORE_SM90_PREFILL_SINKS, 256)},
};

static cudaError_t paged_run(int core, int64_t head_size, int kv, const attnd_paged_kargs &a,
                             const attnd_paged_launch &l)
{
    attnd_paged_fn f = kPagedRun[core][attnd_paged_d_row(head_size)][kv];
    return f ? f(a, l) : cudaErrorInvalidConfiguration;
}

void attnd_paged_launch_init(attnd_paged_launch *l, attnd_cuda *c, int64_t num_tokens,
                             int max_query_len, int max_seq_len)
{
    memset(l, 0, sizeof *l);
    l->stream = c->stream;
    l->device = c->device;
    l->num_sms = c->num_sms;
    l->max_smem = c->max_smem_optin;
    l->num_tokens = num_tokens;
    l->max_query_len = max_query_len;
    l->sm90_off = c->sm90_off;
    l->l2_bytes = c->l2_bytes;
    l->max_seq_len = max_seq_len;
    l->optin = &c->optin;
}

// A tensor map of t (16-bit: 128-byte swizzle; fp8: unswizzled) with the given box.
static int encode_box(const attnd_cuda *c, const attnd_tensor *t, const cuuint64_t dims[4],
                      const cuuint64_t strides[3], const cuuint32_t box[4], CUtensorMap *m)
{
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    if (c->encode_tmap == NULL) return 0;
    const int fp8 = t->dtype == ATTND_DTYPE_FP8_E4M3;
    const cuuint32_t unit[4] = {1, 1, 1, 1};
    const CUtensorMapDataType dt = fp8                            ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : t->dtype == ATTND_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                  : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return ((encode_fn)c->encode_tmap)(
               m, dt, 4, t->data, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               fp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int attnd_sm90_encode_map(const attnd_cuda *c, const attnd_tensor *t, const cuuint64_t dims[4],
                          const cuuint64_t strides[3], cuuint32_t box_rows, cuuint32_t box_pages,
                          CUtensorMap *m)
{
    // 16-bit: 64-column slabs, 128-byte swizzle; fp8: whole rows of the padded head size in
    // bytes, unswizzled, for the converting warps (the columns past the head read as zeros)
    const int fp8 = t->dtype == ATTND_DTYPE_FP8_E4M3;
    const cuuint32_t box0 = fp8 ? (cuuint32_t)attnd_paged_d_pad((int64_t)dims[0]) : 64;
    const cuuint32_t box[4] = {box0, 1, box_rows, box_pages};
    return encode_box(c, t, dims, strides, box, m);
}

int attnd_sm90_q_map(const attnd_cuda *c, const attnd_paged_kargs *a, int kv, attnd_sm90_maps *maps)
{
    const attnd_tensor *q = &a->p.q;
    const int g = a->group;
    const attnd_dtype tc = kv == ATTND_KV_BF16 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16;
    if (kv == ATTND_KV_FP8 || q->dtype != tc || !a->q_vec || !a->plain || g < 1 || 64 % g != 0 ||
        attnd_paged_d_pad(q->shape[2]) > 128 || q->shape[0] >= INT32_MAX)
        return 0;
    const cuuint64_t dims[4] = {(cuuint64_t)q->shape[2], (cuuint64_t)q->shape[1],
                                (cuuint64_t)q->shape[0], 1};
    const cuuint64_t strides[3] = {(cuuint64_t)q->strides[1] * 2, (cuuint64_t)q->strides[0] * 2,
                                   (cuuint64_t)q->strides[0] * 2 * (cuuint64_t)q->shape[0]};
    const cuuint32_t box[4] = {64, (cuuint32_t)g, (cuuint32_t)(64 / g), 1}; // 64 packed rows
    return encode_box(c, q, dims, strides, box, &maps->q);
}

#ifdef ATTND_CUDA_SM90A
// A 16-bit or fp8 cache: dims (head, kv head, row in block, block), boxes of one page, or of
// the pages of a whole K/V tile (run: a run of consecutive block ids lands as its pages would).
static int encode_cache_map(const attnd_cuda *c, const attnd_tensor *t, int run, CUtensorMap *m)
{
    const cuuint64_t es = (cuuint64_t)attnd_dtype_size(t->dtype);
    const cuuint64_t dims[4] = {(cuuint64_t)t->shape[3], (cuuint64_t)t->shape[2],
                                (cuuint64_t)t->shape[1], (cuuint64_t)t->shape[0]};
    const cuuint64_t strides[3] = {(cuuint64_t)t->strides[2] * es, (cuuint64_t)t->strides[1] * es,
                                   (cuuint64_t)t->strides[0] * es};
    const int per_tile = attnd_sm90_block_n(attnd_paged_d_pad(t->shape[3])) / (int)t->shape[1];
    const cuuint32_t pages = run && per_tile > 1 ? (cuuint32_t)per_tile : 1;
    return attnd_sm90_encode_map(c, t, dims, strides, (cuuint32_t)t->shape[1], pages, m);
}
#endif

// The sm90 core can take this call: device, build, override, tensor maps.
static int sm90_usable(const attnd_cuda *c, const attnd_paged_params *p, attnd_sm90_maps *maps)
{
#ifdef ATTND_CUDA_SM90A
    if (c->cc != 90 || c->paged_core == 80) return 0;
    return encode_cache_map(c, &p->k_cache, 0, &maps->k) &&
           encode_cache_map(c, &p->v_cache, 0, &maps->v) &&
           encode_cache_map(c, &p->k_cache, 1, &maps->k_run) &&
           encode_cache_map(c, &p->v_cache, 1, &maps->v_run);
#else
    (void)c, (void)p, (void)maps;
    return 0;
#endif
}

// The merge as a kernel of its own (a stream without tickets): a CTA of 8 warps per (token, q
// head) row; on sm_90 a programmatic dependent launch of the segment kernel, waiting for it
// before reading.
__global__ void __launch_bounds__(256) attnd_paged_reduce_kernel(const attnd_paged_kargs a)
{
    __shared__ float red_m[8], red_l[8];
    __shared__ float4 red_acc[8][64];
    attnd_pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t item = blockIdx.x; // token * num_q_heads + head
    const int hq = (int)a.p.q.shape[1];
    const int D = (int)a.p.q.shape[2];
    float Mw, Lw;
    float4 acc[2];
    attnd_reduce_fold(a, item * a.num_segments, a.num_segments, D, warp, lane, &Mw, &Lw, acc);
    if (lane == 0) {
        red_m[warp] = Mw;
        red_l[warp] = Lw;
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
        red_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp == 0)
        attnd_reduce_store(a, (int)(item / hq), (int)(item % hq), D, lane, red_m, red_l, red_acc);
}

static cudaError_t paged_reduce(const attnd_paged_kargs &a, const attnd_cuda *c)
{
    const int64_t items = a.p.q.shape[0] * a.p.q.shape[1]; // one CTA each
    if (items > INT_MAX) return cudaErrorInvalidConfiguration;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)items);
    cfg.blockDim = dim3(256);
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c->cc >= 90 ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, attnd_paged_reduce_kernel, a);
    return e != cudaSuccess ? e : cudaGetLastError();
}

// The selected stream's merge tickets, allocated and zeroed (in stream order) at its first split
// launch; NULL (the reduce kernel merges) when the launch has more (q-block, kv head) pairs than
// tickets, when tests or benches ask for the reduce, while the stream is being captured (a graph
// keeps the buffer a launch names), or when the allocation fails.
static unsigned *split_tickets(attnd_cuda *c, const attnd_paged_params *p, int group)
{
    const int64_t S = p->seq_lens.shape[0], H = p->k_cache.shape[2];
    const int direct = (int64_t)p->max_query_len * group <= ATTND_DECODE_BLOCK_M;
    const int64_t pairs = (direct ? S : p->q.shape[0] * group / ATTND_DECODE_BLOCK_M + S) * H;
    unsigned **slot = c->stream_tickets ? c->stream_tickets : &c->tickets;
    if (c->split_reduce || pairs > ATTND_CUDA_TICKETS) return NULL;
    if (*slot != NULL) return *slot;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    void *t = NULL;
    const size_t bytes = ATTND_CUDA_TICKETS * sizeof(unsigned);
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
        cudaMalloc(&t, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemsetAsync(t, 0, bytes, c->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(t);
        return NULL;
    }
    *slot = (unsigned *)t;
    return *slot;
}

static attnd_err launch_status(attnd_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaErrorInvalidConfiguration) {
        snprintf(b->last_error, sizeof b->last_error,
                 "%s: shapes exceed the launch limits of this device", what);
        cudaGetLastError();
        return ATTND_ERR_UNSUPPORTED;
    }
    return attnd_cuda_check(b, e, what);
}

extern "C" attnd_err attnd_cuda_paged_2d(attnd_backend *b, const attnd_paged_params *p)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_paged_kargs a;
    int kv;
    attnd_err rv = paged_prepare(b, p, &a, &kv);
    if (rv != ATTND_ERR_OK) return rv;
    if (p->q.shape[0] == 0 || p->seq_lens.shape[0] == 0) return ATTND_ERR_OK;
    if (kv == ATTND_KV_F32)
        return launch_status(b, attnd_paged_f32_run(a, c->stream), "paged_attention_2d");
    attnd_paged_launch l;
    attnd_paged_launch_init(&l, c, p->q.shape[0], p->max_query_len, p->max_seq_len);
    attnd_sm90_maps maps;
    memset(&maps, 0, sizeof maps);
    int core = ATTND_CORE_SM80_PREFILL;
    if ((int64_t)p->max_query_len * a.group <= 16)
        core = ATTND_CORE_SM80_DECODE;
    else if (sm90_usable(c, p, &maps)) {
        core = p->sinks.data ? ATTND_CORE_SM90_PREFILL_SINKS : ATTND_CORE_SM90_PREFILL;
        l.maps = &maps;
        a.q_tma = !p->sinks.data && attnd_sm90_q_map(c, &a, kv, &maps);
    }
    return launch_status(b, paged_run(core, p->q.shape[2], kv, a, l), "paged_attention_2d");
}

extern "C" attnd_err attnd_cuda_paged_3d(attnd_backend *b, const attnd_paged_params *p,
                                         int32_t num_segments, void *workspace)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_paged_kargs a;
    int kv;
    attnd_err rv = paged_prepare(b, p, &a, &kv);
    if (rv != ATTND_ERR_OK) return rv;
    // a bad workspace is refused even when there is nothing to compute (no query token)
    if (num_segments > 1 && kv != ATTND_KV_F32 && !aligned(workspace, 16))
        return attnd_fail(b, "workspace: must be 16-byte aligned");
    const int64_t T = p->q.shape[0];
    if (T == 0 || p->seq_lens.shape[0] == 0) return ATTND_ERR_OK;
    if (kv == ATTND_KV_F32) /* whole rows: the same result as any split */
        return launch_status(b, attnd_paged_f32_run(a, c->stream), "paged_attention_3d");
    a.num_segments = num_segments;
    if (num_segments > 1) {
        const int64_t rows = T * p->q.shape[1] * num_segments;
        a.ws_o = (float *)workspace;
        a.ws_m = a.ws_o + rows * p->q.shape[2];
        a.ws_l = a.ws_m + rows;
        a.tickets = split_tickets(c, p, a.group);
    }
#ifdef ATTND_DECODE_TIMELINE
    a.timeline = c->decode_timeline;
#endif
    attnd_paged_launch l;
    attnd_paged_launch_init(&l, c, p->q.shape[0], p->max_query_len, p->max_seq_len);
    cudaError_t e = paged_run(ATTND_CORE_SM80_DECODE, p->q.shape[2], kv, a, l);
    if (e == cudaSuccess && num_segments > 1 && a.tickets == NULL) e = paged_reduce(a, c);
    return launch_status(b, e, "paged_attention_3d");
}
