// Epilogue of the paged-attention cores: a warp's rows stored straight from accumulator
// fragments. mma.sync's m16n8 C fragment and wgmma's per-warp slice of an m64nN accumulator have
// the same layout (lane = 4 g + t holds rows g and g + 8, columns 8 n + 2 t and 8 n + 2 t + 1
// of chunk n), so both cores share this store.
#ifndef ATTND_CUDA_PAGED_EPILOGUE_CUH
#define ATTND_CUDA_PAGED_EPILOGUE_CUH

#include "paged/rows.cuh"
#include "prims/sm80.cuh"
#include "prims/sm90.cuh"

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

// Shared-memory address of 16-byte chunk ch of row `row` in a buffer of 64-column slabs of 64
// rows (128-byte swizzle).
__device__ __forceinline__ uint32_t attnd_paged_buf_at(uint32_t buf, int row, int ch)
{
    return buf + (ch >> 3) * (64 * 128) + (uint32_t)(row * 128) +
           ((uint32_t)((ch & 7) ^ (row & 7)) << 4);
}

// sm90 core, 16-bit out with 16-byte-aligned rows: a warp's 16 rows (from wrow0; lrow0: their
// first row in buf) through shared memory buf (the warpgroup's free Q buffer: 64-column slabs of
// 64 rows, 128-byte swizzle), then 16-byte global stores, consecutive lanes along a row, instead
// of 4-byte stores straight from the fragments. In two parts, so that the sm90 core can issue its
// next GEMMs between them: attnd_paged_stage_rows normalises the rows into buf (and writes their
// LSE), attnd_paged_flush_rows stores them from buf. NB chunks of 8 columns; o, m, l as above.
// fast: the fragments in by stmatrix (two chunks of both rows per instruction) and each lane's
// rows read back all at once before their stores (else 4-byte shared stores, a load and a store
// per step; measurements).
template <int NB, bool SINKS, class F>
__device__ __forceinline__ void
attnd_paged_stage_rows(const attnd_paged_kargs &a, F o, const float m[2], const float l[2],
                       int wrow0, int rows_total, int q_start, int kvh, int lane, uint32_t buf,
                       int lrow0, const attnd_divmod &gd, bool fast)
{
    const int t4 = lane & 3;
    const bool bf = a.p.out.dtype == ATTND_DTYPE_BF16;
    auto pack = [&](float x, float y) {
        return bf ? attnd_tc<__nv_bfloat16>::pack(x, y) : attnd_tc<__half>::pack(x, y);
    };
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        inv[r] = attnd_paged_row_end<SINKS>(a, m[r], l[r], wrow0 + (lane >> 2) + 8 * r, rows_total,
                                            q_start, kvh, t4, gd);
    if (fast) {
        const int mi = lane >> 3, row = lrow0 + (mi & 1) * 8 + (lane & 7); // this lane's address
#pragma unroll
        for (int n = 0; n < NB; n += 2)
            attnd_stmatrix_x4(attnd_paged_buf_at(buf, row, n + (mi >> 1)),
                              pack(o(n, 0) * inv[0], o(n, 1) * inv[0]),
                              pack(o(n, 2) * inv[1], o(n, 3) * inv[1]),
                              pack(o(n + 1, 0) * inv[0], o(n + 1, 1) * inv[0]),
                              pack(o(n + 1, 2) * inv[1], o(n + 1, 3) * inv[1]));
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int lr = lrow0 + (lane >> 2) + 8 * r;
#pragma unroll
        for (int n = 0; n < NB; n++) {
            const uint32_t u = pack(o(n, 2 * r) * inv[r], o(n, 2 * r + 1) * inv[r]);
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(attnd_paged_buf_at(buf, lr, n) + 4 * t4),
                         "r"(u)
                         : "memory");
        }
    }
}

template <int NB>
__device__ __forceinline__ void
attnd_paged_flush_rows(const attnd_paged_kargs &a, int wrow0, int rows_total, int q_start, int kvh,
                       int lane, uint32_t buf, int lrow0, const attnd_divmod &gd, bool fast)
{
    const int g = a.group, d_act = (int)a.p.q.shape[2];
    uint16_t *out = (uint16_t *)a.p.out.data;
    const int64_t s0 = a.p.out.strides[0], s1 = a.p.out.strides[1];
    __syncwarp(); // the warp's rows are in buf
    if (fast) {   // NB lanes along a row, 32 / NB rows per step
        constexpr int STEP = 32 / NB, PER = 16 / STEP;
        const int ch = lane % NB, rr0 = lane / NB;
        uint4 x[PER];
#pragma unroll
        for (int i = 0; i < PER; i++)
            x[i] = attnd_ld_shared16(attnd_paged_buf_at(buf, lrow0 + rr0 + STEP * i, ch));
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int idx = wrow0 + rr0 + STEP * i, qt = gd.div(idx);
            const uint16_t *dst = out + (int64_t)(q_start + qt) * s0 +
                                  (int64_t)(kvh * g + gd.mod(idx, qt)) * s1 + ch * 8;
            if (idx < rows_total && ch * 8 < d_act)
                asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(x[i].x),
                             "r"(x[i].y), "r"(x[i].z), "r"(x[i].w)
                             : "memory");
        }
        return;
    }
#pragma unroll 2
    for (int i = lane; i < 16 * NB; i += 32) {
        const int rr = i / NB, ch = i % NB, idx = wrow0 + rr, lr = lrow0 + rr;
        if (idx >= rows_total || ch * 8 >= d_act) continue;
        const uint4 x = attnd_ld_shared16(attnd_paged_buf_at(buf, lr, ch));
        const int qt = gd.div(idx), tok = q_start + qt, head = kvh * g + gd.mod(idx, qt);
        // one 16-byte store (a plain uint4 store compiled to four 4-byte ones)
        const uint16_t *dst = out + (int64_t)tok * s0 + (int64_t)head * s1 + ch * 8;
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(x.x), "r"(x.y),
                     "r"(x.z), "r"(x.w)
                     : "memory");
    }
}

#endif
