// Segment reduce of the 3D (split-KV) paged attention: merges the per-segment partials that
// the sm80 core wrote in partial mode (normalised outputs with their log2-domain max and
// exp-sum) into the final output and LSE.
#ifndef ATTND_CUDA_PAGED_REDUCE_CUH
#define ATTND_CUDA_PAGED_REDUCE_CUH

#include "paged/args.h"
#include "paged/rows.cuh"
#include "prims/math.cuh"
#include "prims/sm90.cuh"

// One CTA of 8 warps per (token, q head) merges num_segments partials (normalised outputs with
// their log2-domain max m and exp-sum l; weight l * exp2(m - M)). Warp w folds segments w, w + 8,
// ... into its own running max / sum / sum of weighted rows (lane d4: float4 d4 and d4 + 32 of a
// row), so every load is issued up front in one round trip; warp 0 merges the 8 states.

// Warp `warp`'s share of the partials of rows R0 .. R0 + S - 1 folded into (Mw, Lw, acc).
__device__ __forceinline__ void attnd_reduce_fold(const attnd_paged_kargs &a, int64_t R0, int S,
                                                  int D, int warp, int lane, float *Mw, float *Lw,
                                                  float4 (&acc)[2])
{
    float M = attnd_neg_inf(), L = 0.0f;
    acc[0] = acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int s = warp; s < S; s += 8) {
        const float m = a.ws_m[R0 + s], l = a.ws_l[R0 + s];
        const float *src = a.ws_o + (R0 + s) * D;
        float4 x[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int d = (lane + 32 * i) * 4;
            x[i] = d < D ? *(const float4 *)(src + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        if (l > 0.0f) {
            const float mn = fmaxf(M, m);
            const float al = attnd_exp2(M - mn), bw = l * attnd_exp2(m - mn); // M = -inf: al = 0
            L = L * al + bw;
            M = mn;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                acc[i].x = acc[i].x * al + bw * x[i].x;
                acc[i].y = acc[i].y * al + bw * x[i].y;
                acc[i].z = acc[i].z * al + bw * x[i].z;
                acc[i].w = acc[i].w * al + bw * x[i].w;
            }
        }
    }
    *Mw = M;
    *Lw = L;
}

// Warp 0: the 8 warps' states merged, the sink folded in (once, never per segment), the row of
// (tok, head) normalised and stored with its LSE.
__device__ __forceinline__ void attnd_reduce_store(const attnd_paged_kargs &a, int tok, int head,
                                                   int D, int lane, const float (&red_m)[8],
                                                   const float (&red_l)[8],
                                                   const float4 (&red_acc)[8][64])
{
    float M = attnd_neg_inf();
#pragma unroll
    for (int w = 0; w < 8; w++)
        M = fmaxf(M, red_m[w]);
    const float Ms = attnd_softmax_safe_max(M);
    float wt[8], W = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; w++) {
        wt[w] = red_l[w] > 0.0f ? attnd_exp2(red_m[w] - Ms) : 0.0f;
        W += wt[w] * red_l[w];
    }
    float Mf = Ms;
    const float sink = attnd_paged_sink(a, head, &Mf, &W);
    const float inv = W > 0.0f ? sink / W : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = (lane + 32 * i) * 4;
        if (d >= D) continue;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const float4 x = red_acc[w][lane + 32 * i];
            v[0] += wt[w] * x.x;
            v[1] += wt[w] * x.y;
            v[2] += wt[w] * x.z;
            v[3] += wt[w] * x.w;
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[k] *= inv;
        attnd_stN<4>(a.p.out.data, a.p.out.dtype,
                     (int64_t)tok * a.p.out.strides[0] + (int64_t)head * a.p.out.strides[1] + d,
                     a.out_vec != 0, v);
    }
    if (a.p.out_lse.data && lane == 0)
        ((float *)a.p.out_lse.data)[(int64_t)head * a.p.out_lse.strides[0] +
                                    (int64_t)tok * a.p.out_lse.strides[1]] =
            attnd_softmax_lse(Mf, W);
}

// Launched as a programmatic dependent of the segment kernel: waits for it before reading.
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

#endif
