// Segment merge of the 3D (split-KV) paged attention: the per-segment partials that the sm80 core
// wrote in partial mode (normalised outputs with their log2-domain max m and exp-sum l) merged
// into the final output and LSE. Two ways: the segment kernel's CTA that stores the last segment
// of its (q-block, kv head) merges the pair's rows, a warp per (token, q head) row
// (attnd_paged_merge_last, tickets in backend memory); or, without tickets, the reduce kernel
// of paged/launch.cu, a CTA per row (attnd_reduce_fold / attnd_reduce_store).
#ifndef ATTND_CUDA_PAGED_REDUCE_CUH
#define ATTND_CUDA_PAGED_REDUCE_CUH

#include "paged/args.h"
#include "paged/rows.cuh"
#include "prims/math.cuh"

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

// The merged row of (tok, head), lane's float4 columns d4 + 32 i (NI of them): unnormalised
// sums acc relative to the max Ms, exp-sum W; the sink folded in (once, never per segment),
// normalised and stored with its LSE. Both merges end here.
template <int NI>
__device__ __forceinline__ void attnd_merge_store_row(const attnd_paged_kargs &a, int tok, int head,
                                                      int D, int lane, float Ms, float W,
                                                      const float4 (&acc)[NI])
{
    float Mf = Ms;
    const float sink = attnd_paged_sink(a, head, &Mf, &W);
    const float inv = W > 0.0f ? sink / W : 0.0f;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int d = (lane + 32 * i) * 4;
        if (d >= D) continue;
        float v[4] = {acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv};
        attnd_stN<4>(a.p.out.data, a.p.out.dtype,
                     (int64_t)tok * a.p.out.strides[0] + (int64_t)head * a.p.out.strides[1] + d,
                     a.out_vec != 0, v);
    }
    if (a.p.out_lse.data && lane == 0)
        ((float *)a.p.out_lse.data)[(int64_t)head * a.p.out_lse.strides[0] +
                                    (int64_t)tok * a.p.out_lse.strides[1]] =
            attnd_softmax_lse(Mf, W);
}

// Warp 0: the 8 warps' states merged and the row of (tok, head) stored.
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
    float4 acc[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if ((lane + 32 * i) * 4 >= D) continue;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const float4 x = red_acc[w][lane + 32 * i];
            acc[i].x += wt[w] * x.x;
            acc[i].y += wt[w] * x.y;
            acc[i].z += wt[w] * x.z;
            acc[i].w += wt[w] * x.w;
        }
    }
    attnd_merge_store_row<2>(a, tok, head, D, lane, Ms, W, acc);
}

// Warp-wide: row (tok, head) merged from its a.num_segments partials (weight l * exp2(m - M)),
// the sink folded in once, normalised and stored with its LSE. Rounds of CH segments: lane s
// loads segment c + s's m and l and every lane its float4 columns (d4, d4 + 32, ...: NI of them)
// of all CH rows before any is used, so a round costs one trip to the L2 (.cg: other CTAs of the
// running grid wrote them); the sums are rescaled to each round's max.
template <int NI>
__device__ __forceinline__ void attnd_paged_merge_row(const attnd_paged_kargs &a, int tok, int head,
                                                      int lane)
{
    constexpr int CH = 16 / NI;
    const int S = a.num_segments, D = (int)a.p.q.shape[2];
    const int64_t R0 = ((int64_t)tok * a.p.q.shape[1] + head) * S;
    float M = attnd_neg_inf(), W = 0.0f;
    float4 acc[NI];
#pragma unroll
    for (int i = 0; i < NI; i++)
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = 0; c < S; c += CH) {
        const bool own = lane < CH && c + lane < S;
        const float m = own ? __ldcg(a.ws_m + R0 + c + lane) : attnd_neg_inf();
        const float l = own ? __ldcg(a.ws_l + R0 + c + lane) : 0.0f;
        float4 x[CH][NI];
#pragma unroll
        for (int j = 0; j < CH; j++)
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int d = (lane + 32 * i) * 4;
                x[j][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (c + j < S && d < D)
                    x[j][i] = __ldcg((const float4 *)(a.ws_o + (R0 + c + j) * D + d));
            }
        const float mn = fmaxf(M, attnd_warp_max(l > 0.0f ? m : attnd_neg_inf()));
        const float ms = attnd_softmax_safe_max(mn);
        const float al = attnd_exp2(M - ms); // M = -inf: 0
        const float w = l > 0.0f ? l * attnd_exp2(m - ms) : 0.0f;
        W = W * al + attnd_warp_sum(w);
        M = mn;
#pragma unroll
        for (int j = 0; j < CH; j++) {
            const float wj = __shfl_sync(0xffffffffu, w, j);
#pragma unroll
            for (int i = 0; i < NI; i++) {
                acc[i].x = (j == 0 ? acc[i].x * al : acc[i].x) + wj * x[j][i].x;
                acc[i].y = (j == 0 ? acc[i].y * al : acc[i].y) + wj * x[j][i].y;
                acc[i].z = (j == 0 ? acc[i].z * al : acc[i].z) + wj * x[j][i].z;
                acc[i].w = (j == 0 ? acc[i].w * al : acc[i].w) + wj * x[j][i].w;
            }
        }
    }
    attnd_merge_store_row<NI>(a, tok, head, D, lane, attnd_softmax_safe_max(M), W, acc);
}

// The segment kernel's CTA of (blockIdx.x, blockIdx.y), its partials of packed rows row0 ..
// min(row0 + rows, rows_total) - 1 stored: takes a ticket; the CTA holding the last one resets it
// and merges the rows. Every CTA of the pair takes exactly one (CTAs without rows leave before
// any), so between launches every ticket is 0 again: a launch that never starts leaves them
// so; one that faults mid-way leaves the CUDA context unusable (a sticky error), and with it the
// tickets (a new backend allocates new ones). Returns whether this CTA merged.
template <int NI>
__device__ __forceinline__ bool attnd_paged_merge_last(const attnd_paged_kargs &a, int row0,
                                                       int rows, int rows_total, int q_start,
                                                       int kvh, int tid, int nthreads)
{
    bool mine = false;
    __syncthreads(); // every partial of this CTA stored
    if (tid == 0) {
        unsigned *t = a.tickets + (size_t)blockIdx.y * gridDim.x + blockIdx.x, old;
        // release (cumulative over the barrier): this CTA's partials before its ticket; acquire:
        // the other CTAs' partials after their tickets. One trip to the L2, no separate fences.
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(old)
                     : "l"(t)
                     : "memory");
        mine = old == (unsigned)a.num_segments - 1u;
        // every other CTA of the pair has taken its ticket: the reset needs no fence (the next
        // launch on the stream starts after this grid's writes)
        if (mine) asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(t) : "memory");
    }
    const bool last = __syncthreads_or(mine);
    if (!last) return false;
    const int warp = tid >> 5, nwarps = nthreads >> 5;
    for (int r = warp; r < rows && row0 + r < rows_total; r += nwarps)
        attnd_paged_merge_row<NI>(a, q_start + (row0 + r) / a.group,
                                  kvh * a.group + (row0 + r) % a.group, tid & 31);
    return true;
}

#endif
