// Segment reduce of the 3D (split-KV) paged attention: merges the per-segment partials that
// attnd_paged_kernel wrote in partial mode (normalised outputs with their log2-domain max and
// exp-sum) into the final output and LSE.
#ifndef ATTND_CUDA_PAGED_REDUCE_KERNEL_CUH
#define ATTND_CUDA_PAGED_REDUCE_KERNEL_CUH

#include "paged_kernel.cuh"

// One CTA of 4 warps per (token, q head): merge num_segments partials (normalised outputs with
// their log2-domain max and exp-sum) by their weights l * exp2(m - M). Warp w takes segments
// w, w + 4, ...; lane d4 takes float4 d4 (and d4 + 32) of each row, so all the partial rows are
// requested at once (every one was written, empty segments as zeros: the loads need no branch).
// Launched as a programmatic dependent of the segment kernel: waits for it before reading.
__global__ void __launch_bounds__(128) attnd_paged_reduce_kernel(const attnd_paged_args p)
{
    __shared__ float red_m[4], red_w[4];
    __shared__ float4 red_acc[4][64];
    attnd_pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t item = blockIdx.x; // token * num_q_heads + head
    const int tok = (int)(item / p.num_q_heads), head = (int)(item % p.num_q_heads);
    const int S = p.num_segments, D = p.head_size;
    const int64_t R0 = item * S;

    float M = attnd_neg_inf();
    for (int s = threadIdx.x; s < S; s += 128) M = fmaxf(M, p.ws_m[R0 + s]);
    M = attnd_warp_max(M);
    if (lane == 0) red_m[warp] = M;
    __syncthreads();
    M = fmaxf(fmaxf(red_m[0], red_m[1]), fmaxf(red_m[2], red_m[3]));
    const float Ms = attnd_softmax_safe_max(M);

    float4 acc[2];
    acc[0] = acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float W = 0.0f;
#pragma unroll 4
    for (int s = warp; s < S; s += 4) {
        const float w = p.ws_l[R0 + s] * attnd_exp2(p.ws_m[R0 + s] - Ms);
        const float *src = p.ws_o + (R0 + s) * D;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int d = (lane + 32 * i) * 4;
            if (d < D) {
                const float4 x = *(const float4 *)(src + d);
                if (w > 0.0f) {
                    acc[i].x += w * x.x;
                    acc[i].y += w * x.y;
                    acc[i].z += w * x.z;
                    acc[i].w += w * x.w;
                }
            }
        }
        W += w;
    }
    if (lane == 0) red_w[warp] = W;
#pragma unroll
    for (int i = 0; i < 2; i++) red_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    W = red_w[0] + red_w[1] + red_w[2] + red_w[3];
    const float inv = W > 0.0f ? 1.0f / W : 0.0f;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int d = (lane + 32 * i) * 4;
        if (d < D) {
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const float4 x = red_acc[w][lane + 32 * i];
                v[0] += x.x;
                v[1] += x.y;
                v[2] += x.z;
                v[3] += x.w;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] *= inv;
            attnd_stN<4>(p.out, p.out_dt, (int64_t)tok * p.o_s0 + (int64_t)head * p.o_s1 + d,
                         p.out_vec != 0, v);
        }
    }
    if (p.lse && lane == 0)
        p.lse[(int64_t)head * p.lse_s0 + (int64_t)tok * p.lse_s1] = attnd_softmax_lse(M, W);
}

#endif
