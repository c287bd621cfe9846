// Paged attention on an f32 cache: exact f32 math on the CUDA cores, for engines that run in f32
// and must match their own reference. The tensor-core paths round K and V (and Q) to 16 bits,
// so none of them serves an f32 cache. One warp per (query token, q head): the row's query,
// times the scale, in shared memory; 32 keys at a time, one per lane (dot product, softcap,
// ALiBi), an online softmax over the warp, then P V with each lane owning head dimensions
// lane, lane + 32, ...; the head's sink last. The build's --use_fast_math would turn expf,
// tanhf, logf and '/' into approximations: this file computes exp, tanh and log in double and
// divides with __fdiv_rn, so every value is a correctly rounded f32 (denormals still flush to
// zero, which moves no result by more than 1e-38). The 3D op takes this path too, whole rows at
// once (the split is a schedule; the result is the same): the workspace is not used.
#include <limits.h>

#include "paged/launch.h"
#include "paged/rows.cuh"

#define F32_WARPS 4
#define F32_DIMS (ATTND_HEAD_SIZE_MAX / 32) // head dimensions per lane

// The sequence owning packed query token tok: the last s with query_start_loc[s] <= tok (the
// sequences without queries before it share that offset).
__device__ __forceinline__ int attnd_f32_seq_of(const attnd_paged_kargs &a, int64_t tok)
{
    const int32_t *qsl = (const int32_t *)a.p.query_start_loc.data;
    const int64_t qs = a.p.query_start_loc.strides[0];
    int lo = 0, hi = (int)a.p.seq_lens.shape[0];
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (qsl[mid * qs] <= tok)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

// Row (element offset) of key j of sequence seq in a cache, kv head kvh.
__device__ __forceinline__ int64_t attnd_f32_key(const attnd_paged_kargs &a, const attnd_tensor &c,
                                                 int seq, int j, int kvh)
{
    const attnd_tensor &bt = a.p.block_tables;
    const int64_t blk =
        ((const int32_t *)
             bt.data)[(int64_t)seq * bt.strides[0] + (int64_t)(j >> a.bs_log2) * bt.strides[1]];
    const int row = j & ((1 << a.bs_log2) - 1);
    return blk * c.strides[0] + (int64_t)row * c.strides[1] + (int64_t)kvh * c.strides[2];
}

// The logit of key j (-inf past the visible range [lo, hi)) for the query in q (scaled).
__device__ __forceinline__ float attnd_f32_logit(const attnd_paged_kargs &a, const float *q,
                                                 int seq, int j, int hi, int pos, int kvh,
                                                 float slope)
{
    if (j >= hi) return attnd_neg_inf();
    const float *k = (const float *)a.p.k_cache.data + attnd_f32_key(a, a.p.k_cache, seq, j, kvh);
    const int D = (int)a.p.q.shape[2];
    float x = 0.0f;
    for (int d = 0; d < D; d++)
        x += q[d] * k[d];
    if (a.p.softcap > 0.0f) x = a.p.softcap * (float)tanh((double)__fdiv_rn(x, a.p.softcap));
    return x + slope * (float)(j - pos);
}

// Fold 32 logits (one per lane) into the row: max m, sum l, unnormalised acc.
__device__ __forceinline__ void attnd_f32_chunk(const attnd_paged_kargs &a, int seq, int j0, int hi,
                                                int kvh, float x, float *m, float *l,
                                                float (&acc)[F32_DIMS])
{
    const int lane = threadIdx.x & 31, D = (int)a.p.q.shape[2];
    const float cm = attnd_warp_max(x);
    if (cm == attnd_neg_inf()) return;
    const float mn = fmaxf(*m, cm);
    const float alpha = *m == attnd_neg_inf() ? 0.0f : (float)exp((double)(*m - mn));
    const float p = x == attnd_neg_inf() ? 0.0f : (float)exp((double)(x - mn));
    *l = *l * alpha + attnd_warp_sum(p);
    *m = mn;
#pragma unroll
    for (int k = 0; k < F32_DIMS; k++)
        acc[k] *= alpha;
    for (int t = 0; t < 32 && j0 + t < hi; t++) {
        const float pt = __shfl_sync(0xffffffffu, p, t);
        if (pt == 0.0f) continue; // the same on every lane
        const float *v =
            (const float *)a.p.v_cache.data + attnd_f32_key(a, a.p.v_cache, seq, j0 + t, kvh);
#pragma unroll
        for (int k = 0; k < F32_DIMS; k++)
            if (lane + 32 * k < D) acc[k] += pt * v[lane + 32 * k];
    }
}

// The sink, then the row normalised into out and its LSE.
__device__ __forceinline__ void attnd_f32_store(const attnd_paged_kargs &a, int64_t tok, int head,
                                                float m, float l, float (&acc)[F32_DIMS])
{
    const int lane = threadIdx.x & 31, D = (int)a.p.q.shape[2];
    float alpha = 1.0f;
    if (a.p.sinks.data != NULL) {
        const float s = ((const float *)a.p.sinks.data)[(int64_t)head * a.p.sinks.strides[0]];
        if (s != attnd_neg_inf()) {
            const float mn = l > 0.0f ? fmaxf(m, s) : s;
            alpha = l > 0.0f ? (float)exp((double)(m - mn)) : 0.0f;
            l = l * alpha + (float)exp((double)(s - mn));
            m = mn;
        }
    }
    const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
    const int64_t o = tok * a.p.out.strides[0] + (int64_t)head * a.p.out.strides[1];
#pragma unroll
    for (int k = 0; k < F32_DIMS; k++)
        if (lane + 32 * k < D)
            attnd_st_elem(a.p.out.data, a.p.out.dtype, o + lane + 32 * k, acc[k] * alpha * inv);
    if (a.p.out_lse.data && lane == 0)
        ((float *)a.p.out_lse
             .data)[(int64_t)head * a.p.out_lse.strides[0] + tok * a.p.out_lse.strides[1]] =
            l > 0.0f ? m + (float)log((double)l) : attnd_neg_inf();
}

__global__ void __launch_bounds__(32 * F32_WARPS) attnd_paged_f32_kernel(const attnd_paged_kargs a)
{
    __shared__ float qrow[F32_WARPS][ATTND_HEAD_SIZE_MAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hq = (int)a.p.q.shape[1];
    const int64_t row = (int64_t)blockIdx.x * F32_WARPS + warp;
    if (row >= a.p.q.shape[0] * hq) return; // whole warps: only __syncwarp below
    const int64_t tok = row / hq;
    const int head = (int)(row % hq), kvh = head / a.group, D = (int)a.p.q.shape[2];
    const int seq = attnd_f32_seq_of(a, tok);
    const attnd_paged_seq s = attnd_paged_seq_at(a, seq);
    const int pos = s.ctx + (int)(tok - s.q_start);
    int lo, hi;
    attnd_paged_range(a, s.seq_len, pos, pos, 0, &lo, &hi);
    float *q = qrow[warp];
    for (int d = lane; d < D; d += 32)
        q[d] = attnd_ld_elem(a.p.q.data, a.p.q.dtype,
                             tok * a.p.q.strides[0] + (int64_t)head * a.p.q.strides[1] + d) *
               a.p.scale;
    __syncwarp();
    const float slope =
        a.p.alibi_slopes.data
            ? ((const float *)a.p.alibi_slopes.data)[(int64_t)head * a.p.alibi_slopes.strides[0]]
            : 0.0f;
    float m = attnd_neg_inf(), l = 0.0f, acc[F32_DIMS];
#pragma unroll
    for (int k = 0; k < F32_DIMS; k++)
        acc[k] = 0.0f;
    for (int j0 = lo; j0 < hi; j0 += 32) {
        const float x = attnd_f32_logit(a, q, seq, j0 + lane, hi, pos, kvh, slope);
        attnd_f32_chunk(a, seq, j0, hi, kvh, x, &m, &l, acc);
    }
    attnd_f32_store(a, tok, head, m, l, acc);
}

cudaError_t attnd_paged_f32_run(const attnd_paged_kargs &a, cudaStream_t stream)
{
    const int64_t rows = a.p.q.shape[0] * a.p.q.shape[1];
    const int64_t blocks = (rows + F32_WARPS - 1) / F32_WARPS;
    if (blocks == 0) return cudaSuccess;
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    attnd_paged_f32_kernel<<<(unsigned)blocks, 32 * F32_WARPS, 0, stream>>>(a);
    return cudaGetLastError();
}
