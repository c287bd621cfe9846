// Rows of a paged-attention tile, shared by the sm80 and sm90 cores. The q heads of one kv group
// are packed with the query tokens into rows, as the seed does: packed row i of a sequence is
// query token i / group, q head kv_head * group + i % group, at position context_len + i / group.
// A CTA tile owns consecutive packed rows of one sequence and one kv head, so every K/V tile it
// loads serves all q heads of the group. Here: the sequence's extent, the context range a tile of
// rows sees (causal, sliding window, 3D segment), each row's position and ALiBi slope, and the
// per-key visibility test.
#ifndef ATTND_CUDA_PAGED_ROWS_CUH
#define ATTND_CUDA_PAGED_ROWS_CUH

#include "paged/args.h"
#include "prims/math.cuh"

// One sequence as the kernels see it.
struct attnd_paged_seq {
    int q_start, q_len, seq_len, ctx; // ctx = seq_len - q_len: cached tokens before the queries
};

__device__ __forceinline__ attnd_paged_seq attnd_paged_seq_at(const attnd_paged_kargs &a, int seq)
{
    const int64_t qs = a.p.query_start_loc.strides[0];
    const int32_t *qsl = (const int32_t *)a.p.query_start_loc.data;
    attnd_paged_seq s;
    s.q_start = qsl[seq * qs];
    s.q_len = qsl[(seq + 1) * qs] - s.q_start;
    s.seq_len = ((const int32_t *)a.p.seq_lens.data)[seq * a.p.seq_lens.strides[0]];
    s.ctx = s.seq_len - s.q_len;
    return s;
}

// n / d and n % d for 0 <= n < 2^31 by a multiply-high and a shift, d fixed per launch (the
// packed rows' token and head: a run-time integer division is ~20 instructions).
struct attnd_divmod {
    uint32_t d, mul, shift;
    __device__ __forceinline__ void init(int d_)
    {
        d = (uint32_t)d_;
        const uint32_t l = 32 - __clz(d - 1); // ceil(log2 d)
        mul = d == 1 ? 0u : (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
        shift = d == 1 ? 0u : l - 1;
    }
    __device__ __forceinline__ int div(int n) const
    {
        return d == 1 ? n : (int)(__umulhi((uint32_t)n, mul) >> shift);
    }
    __device__ __forceinline__ int mod(int n, int q) const
    {
        return n - q * (int)d;
    }
};

// Keys [lo, hi) that rows at positions pos_min..pos_max may see: causal, the sliding window and,
// with num_segments > 1, segment seg of the context (whole blocks, cdiv(blocks, segments) each).
__device__ __forceinline__ void attnd_paged_range(const attnd_paged_kargs &a, int seq_len,
                                                  int pos_min, int pos_max, int seg, int *lo,
                                                  int *hi)
{
    const int sw = a.p.sliding_window;
    int l = 0, h = min(seq_len, pos_max + 1);
    if (sw > 0) l = max(l, pos_min - sw + 1);
    if (a.num_segments > 1) {
        const int bs = 1 << a.bs_log2;
        const int nblk = (seq_len + bs - 1) >> a.bs_log2;
        const int bps = (nblk + a.num_segments - 1) / a.num_segments;
        const int seg_lo = seg * bps * bs;
        l = max(l, seg_lo);
        h = min(h, seg_lo + bps * bs);
    }
    *lo = l;
    *hi = h;
}

// Position of packed row idx (-1: past the sequence's rows, sees nothing) and its ALiBi slope
// in the log2 domain (0 without ALiBi).
__device__ __forceinline__ void attnd_paged_row(const attnd_paged_kargs &a, int idx, int rows_total,
                                                int ctx, int kvh, int *pos, float *slope2)
{
    const bool ok = idx < rows_total;
    const int g = a.group;
    *pos = ok ? ctx + idx / g : -1;
    *slope2 = (ok && a.p.alibi_slopes.data)
                  ? ((const float *)a.p.alibi_slopes
                         .data)[(int64_t)(kvh * g + idx % g) * a.p.alibi_slopes.strides[0]] *
                        ATTND_LOG2E
                  : 0.0f;
}

// Head `head`'s sink folded into a finished row: one more term exp2(sink * log2 e - m) of the
// denominator, with no value row. m: the row's log2-domain max (or the max its L and output are
// relative to), L: its sum. Returns the factor the row's unnormalised output is multiplied by
// (the rescale to the new max); m and L become the row's with the sink. No sinks: 1, unchanged.
__device__ __forceinline__ float attnd_paged_sink(const attnd_paged_kargs &a, int head, float *m,
                                                  float *L)
{
    if (a.p.sinks.data == NULL) return 1.0f;
    const float s =
        ((const float *)a.p.sinks.data)[(int64_t)head * a.p.sinks.strides[0]] * ATTND_LOG2E;
    if (s == attnd_neg_inf()) return 1.0f;
    const float mn = *L > 0.0f ? fmaxf(*m, s) : s; // nothing visible: the sink alone
    const float alpha = *L > 0.0f ? attnd_exp2(*m - mn) : 0.0f;
    *L = *L * alpha + attnd_exp2(s - mn);
    *m = mn;
    return alpha;
}

// Key t is visible to a row at position ps (ps < 0: none is) of a sequence of hi keys.
__device__ __forceinline__ bool attnd_paged_visible(int t, int ps, int hi, int sw)
{
    return t < hi && t <= ps && (sw <= 0 || ps - t < sw);
}

// Keys [t0, t1) need no per-key test for rows at positions pmin..pmax (all of them see all).
__device__ __forceinline__ bool attnd_paged_unmasked(int t0, int t1, int hi, int pmin, int pmax,
                                                     int sw)
{
    return t1 <= hi && t1 - 1 <= pmin && (sw <= 0 || pmax - t0 < sw);
}

#endif
