// Epilogue of the paged-attention cores: a warp's rows stored straight from accumulator
// fragments. mma.sync's m16n8 C fragment and wgmma's per-warp slice of an m64nN accumulator have
// the same layout (lane = 4 g + t holds rows g and g + 8, columns 8 n + 2 t and 8 n + 2 t + 1
// of chunk n), so both cores share this store.
#ifndef ATTND_CUDA_PAGED_EPILOGUE_CUH
#define ATTND_CUDA_PAGED_EPILOGUE_CUH

#include "paged/rows.cuh"

// Rows idx0 and idx0 + 8 of a sequence's packed rows (this lane's pair), from fragment values
// o(n, e) over NB chunks of 8 columns: normalised by out_scale / l (l summed over the quad here),
// written to out, and their LSE to out_lse when asked. SINKS: each head's sink, when the op has
// sinks, folded in first (the sm90 core instantiates both forms, so that its epilogue without
// sinks stays the plain one: it runs beside the other warpgroup's mainloop); m: the rows'
// log2-domain maxima.
template <int NB, bool SINKS, class F>
__device__ __forceinline__ void
attnd_paged_store_rows_as(const attnd_paged_kargs &a, F o, const float m[2], const float l[2],
                          int idx0, int rows_total, int q_start, int kvh, int t4)
{
    const int ot = a.p.out.dtype, g = a.group, d_act = (int)a.p.q.shape[2];
    const bool vec = a.out_vec != 0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float L = attnd_quad_sum(l[r]), M = m[r];
        const int idx = idx0 + 8 * r;
        float inv = L > 0.0f ? a.out_scale / L : 0.0f;
        if (idx >= rows_total) continue;
        const int tok = q_start + idx / g, head = kvh * g + idx % g;
        if constexpr (SINKS) {
            const float sink = attnd_paged_sink(a, head, &M, &L);
            inv = L > 0.0f ? sink * a.out_scale / L : 0.0f;
        }
        const int64_t e0 =
            (int64_t)tok * a.p.out.strides[0] + (int64_t)head * a.p.out.strides[1] + 2 * t4;
#pragma unroll
        for (int n = 0; n < NB; n++)
            if (n * 8 < d_act)
                attnd_st2(a.p.out.data, ot, e0 + 8 * n, vec, o(n, 2 * r) * inv,
                          o(n, 2 * r + 1) * inv);
        if (a.p.out_lse.data && t4 == 0)
            ((float *)a.p.out_lse.data)[(int64_t)head * a.p.out_lse.strides[0] +
                                        (int64_t)tok * a.p.out_lse.strides[1]] =
                attnd_softmax_lse(M, L);
    }
}

// sm90 core: a row's normaliser (out_scale / L, sink folded in) and its LSE, written when asked.
template <bool SINKS>
__device__ __forceinline__ float attnd_paged_row_end(const attnd_paged_kargs &a, float m, float l,
                                                     int idx, int rows_total, int q_start, int kvh,
                                                     int t4, const attnd_divmod &gd)
{
    float L = attnd_quad_sum(l), M = m;
    if (idx >= rows_total) return 0.0f;
    const int qt = gd.div(idx), tok = q_start + qt, head = kvh * a.group + gd.mod(idx, qt);
    float f = 1.0f;
    if constexpr (SINKS) f = attnd_paged_sink(a, head, &M, &L);
    if (a.p.out_lse.data && t4 == 0)
        ((float *)a.p.out_lse.data)[(int64_t)head * a.p.out_lse.strides[0] +
                                    (int64_t)tok * a.p.out_lse.strides[1]] =
            attnd_softmax_lse(M, L);
    return L > 0.0f ? f * a.out_scale / L : 0.0f;
}

// sm90 core, 16-bit out with 16-byte-aligned rows: a warp's 16 rows (from wrow0; lrow0: their
// first row in buf) through shared memory buf (the warpgroup's free Q buffer: 64-column slabs of
// 64 rows, 128-byte swizzle), then 16-byte global stores, consecutive lanes along a row, instead
// of 4-byte stores straight from the fragments. NB chunks of 8 columns; o, m, l as above.
template <int NB, bool SINKS, class F>
__device__ __forceinline__ void
attnd_paged_store_rows_smem(const attnd_paged_kargs &a, F o, const float m[2], const float l[2],
                            int wrow0, int rows_total, int q_start, int kvh, int lane, uint32_t buf,
                            int lrow0, const attnd_divmod &gd)
{
    const int t4 = lane & 3, g = a.group, d_act = (int)a.p.q.shape[2];
    const bool bf = a.p.out.dtype == ATTND_DTYPE_BF16;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int lr = (lane >> 2) + 8 * r;
        const float inv =
            attnd_paged_row_end<SINKS>(a, m[r], l[r], wrow0 + lr, rows_total, q_start, kvh, t4, gd);
#pragma unroll
        for (int n = 0; n < NB; n++) {
            const float x = o(n, 2 * r) * inv, y = o(n, 2 * r + 1) * inv;
            const uint32_t u =
                bf ? attnd_tc<__nv_bfloat16>::pack(x, y) : attnd_tc<__half>::pack(x, y);
            const uint32_t at = buf + (n >> 3) * (64 * 128) + (uint32_t)((lrow0 + lr) * 128) +
                                ((uint32_t)((n & 7) ^ ((lrow0 + lr) & 7)) << 4) + 4 * t4;
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(u) : "memory");
        }
    }
    __syncwarp();
#pragma unroll 2
    for (int i = lane; i < 16 * NB; i += 32) {
        const int rr = i / NB, ch = i % NB, idx = wrow0 + rr, lr = lrow0 + rr;
        if (idx >= rows_total || ch * 8 >= d_act) continue;
        uint4 x;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                     : "r"(buf + (ch >> 3) * (64 * 128) + (uint32_t)(lr * 128) +
                           ((uint32_t)((ch & 7) ^ (lr & 7)) << 4))
                     : "memory");
        const int qt = gd.div(idx), tok = q_start + qt, head = kvh * g + gd.mod(idx, qt);
        // one 16-byte store (a plain uint4 store compiled to four 4-byte ones)
        const uint16_t *dst = (const uint16_t *)a.p.out.data + (int64_t)tok * a.p.out.strides[0] +
                              (int64_t)head * a.p.out.strides[1] + ch * 8;
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(x.x), "r"(x.y),
                     "r"(x.z), "r"(x.w)
                     : "memory");
    }
}

#endif
