// Segment reduce of the 3D (split-KV) paged attention: merges the per-segment partials that
// attnd_paged_kernel wrote in partial mode (normalised outputs with their log2-domain max and
// exp-sum) into the final output and LSE.
#ifndef ATTND_CUDA_PAGED_REDUCE_KERNEL_CUH
#define ATTND_CUDA_PAGED_REDUCE_KERNEL_CUH

#include "paged_kernel.cuh"

// One warp per (token, q head): merge num_segments partials (normalised outputs with their
// log2-domain max and exp-sum) by their weights l * exp2(m - M). Lane s holds segment s's weight
// (32 at a time); the partial rows are then read back to back (every one was written, empty
// segments as zeros, so the loads need no branch). Launched as a programmatic dependent of the
// segment kernel: it waits for that grid before reading the workspace.
__global__ void __launch_bounds__(128) attnd_paged_reduce_kernel(const attnd_paged_args p,
                                                                 int num_tokens)
{
    attnd_pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (item >= (int64_t)num_tokens * p.num_q_heads) return;
    const int tok = (int)(item / p.num_q_heads), head = (int)(item % p.num_q_heads);
    const int S = p.num_segments, D = p.head_size;
    const int64_t R0 = item * S;

    float M = attnd_neg_inf();
    for (int s = lane; s < S; s += 32) M = fmaxf(M, p.ws_m[R0 + s]);
    M = attnd_warp_max(M);
    const float Ms = attnd_softmax_safe_max(M);

    float acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float W = 0.0f;
    for (int s0 = 0; s0 < S; s0 += 32) {
        const int s = s0 + lane;
        const float wl = s < S ? p.ws_l[R0 + s] * attnd_exp2(p.ws_m[R0 + s] - Ms) : 0.0f;
        W += wl;
        const int n = min(32, S - s0);
#pragma unroll 8
        for (int k = 0; k < n; k++) {
            const float w = __shfl_sync(0xffffffffu, wl, k);
            const float *src = p.ws_o + (R0 + s0 + k) * D;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int d = (lane + 32 * i) * 4;
                if (d < D) {
                    float4 x = *(const float4 *)(src + d);
                    if (w > 0.0f) {
                        acc[i][0] += w * x.x;
                        acc[i][1] += w * x.y;
                        acc[i][2] += w * x.z;
                        acc[i][3] += w * x.w;
                    }
                }
            }
        }
    }
    W = attnd_warp_sum(W);
    const float inv = W > 0.0f ? 1.0f / W : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = (lane + 32 * i) * 4;
        if (d < D) {
            float v[4] = {acc[i][0] * inv, acc[i][1] * inv, acc[i][2] * inv, acc[i][3] * inv};
            attnd_stN<4>(p.out, p.out_dt, (int64_t)tok * p.o_s0 + (int64_t)head * p.o_s1 + d,
                         p.out_vec != 0, v);
        }
    }
    if (p.lse && lane == 0)
        p.lse[(int64_t)head * p.lse_s0 + (int64_t)tok * p.lse_s1] = attnd_softmax_lse(M, W);
}

#endif
