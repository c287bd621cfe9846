// FA2-style forward attention over contiguous packed Q/K/V (mma.sync m16n8k16, f32 accumulation),
// shared by varlen attention and block-sparse attention.
//
// One CTA = 4 warps = up to 64 query rows of one (sequence, q head); each warp owns 16 rows. Keys
// come in tiles of 32 rows: for varlen the sequence's keys 0.., for block-sparse the listed key
// blocks of the CTA's layout row, gathered into one virtual key sequence (a tile may hold two
// 16-key blocks, or a part of a 64/128-key block), with each tile row's key position kept in
// shared memory for the causal mask. K and V tiles go through a ring of STAGES shared buffers
// filled by cp.async: while tile j is computed (S = Q K^T, online softmax, O += P V), tiles
// j+1 .. j+STAGES-1 are in flight, and one barrier per tile orders the ring. (The FA2 pipeline,
// one K and one V buffer, left one tile in flight and measured 100-109 TFLOP/s on an H100 at
// 8 x 2048 causal; see bench/RESULTS.md.)
//
// Head sizes: tiles are D_PAD wide (128 or 256); a head size d (multiple of 8) uses only the
// k-steps and n-tiles below it, so 32..128 share one instantiation and 136..256 the other.
// KIND: 0 fp16, 1 bf16, 2 fp8-e4m3 inputs (converted exactly to fp16 on the way to shared memory;
// P is quantised to fp8 as p / p_scale before P V, as the seed and the CPU backend do).
#ifndef ATTND_CUDA_VARLEN_KERNEL_CUH
#define ATTND_CUDA_VARLEN_KERNEL_CUH

#include <limits.h>

#include "ops_kernel.cuh"

#define ATTND_FA_THREADS 128
#define ATTND_FA_BM 64 // query rows per CTA
#define ATTND_FA_BN 32 // keys per tile

typedef struct attnd_fa_kparams {
    const void *q, *k, *v;
    void *out;
    int64_t q_sr, q_sh, k_sr, k_sh, v_sr, v_sh, o_sr, o_sh; // row and head strides (elements)
    const int32_t *cu_q, *cu_k;
    int64_t cu_q_st, cu_k_st;
    int32_t group; // q heads per kv head
    int32_t d;     // head size
    int32_t out_dt;
    int32_t o_pairs; // out rows allow two-element stores
    int32_t causal;
    float scale_log2; // softmax scale * log2(e) (fp8: * q_scale * k_scale)
    float p_descale;  // fp8: 1 / p_scale
    float out_mul;    // fp8: p_scale * v_scale; fp8 out: / out_scale; else 1
    // optional bias [batch, q heads, max_seqlen_q, max_seqlen_k]
    const void *bias;
    int32_t bias_dt;
    int64_t b_sb, b_sh, b_sm, b_sn;
    // block-sparse layout (CSR per q head)
    const int32_t *crow, *col;
    int64_t crow_sh, crow_sm, col_sh, col_sm;
    int32_t bs_log2; // log2(key block size)
    int32_t qbs;     // query (row) block size
    int32_t m_rows;  // query rows per CTA (min(64, qbs))
    int32_t n_row_blocks, n_cols;
} attnd_fa_kparams;

template <int D_PAD> struct attnd_fa_traits {
    static_assert(D_PAD == 128 || D_PAD == 256, "padded head sizes: 128, 256");
    enum {
        W = D_PAD / 8,                     // 16-byte chunks per tile row
        KSTEPS = D_PAD / 16,               // k-steps of Q K^T
        NTILES_O = D_PAD / 8,              // n8 tiles of O
        STAGES = D_PAD <= 128 ? 3 : 2,     // K/V ring depth (3 CTAs/SM, resp. 2)
        Q_BYTES = ATTND_FA_BM * D_PAD * 2, // 16-bit tiles
        KV_BYTES = ATTND_FA_BN * D_PAD * 2,
        CPT = ATTND_FA_BN * W / ATTND_FA_THREADS, // chunks per thread of a K (or V) tile
        SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + STAGES * ATTND_FA_BN * 4
    };
    static_assert(CPT * ATTND_FA_THREADS == ATTND_FA_BN * W, "tile chunks split evenly");
};

// Chunk ch (8 elements) of a Q row into shared memory: cp.async for 16-bit inputs, a converting
// load for fp8. !ok writes zeros (rows past the end, columns past the head size).
template <int KIND>
static __device__ __forceinline__ void attnd_fa_chunk(uint32_t dst, const void *row, int ch,
                                                      bool ok, const void *any_valid)
{
    if (KIND == 2) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (ok) v = attnd_fp8x8_to_half8(__ldg((const uint2 *)((const uint8_t *)row + ch * 8)));
        attnd_st_shared16(dst, v);
    } else {
        const void *src = ok ? (const void *)((const uint16_t *)row + ch * 8) : any_valid;
        attnd_cp_async16(dst, src, ok ? 16 : 0);
    }
}

template <int D_PAD, int KIND, bool SPARSE>
__global__ void __launch_bounds__(ATTND_FA_THREADS, D_PAD <= 128 && KIND != 2 ? 3 : 2)
    attnd_fa_fwd_kernel(const attnd_fa_kparams p)
{
    typedef attnd_fa_traits<D_PAD> Tr;
    constexpr bool BF = KIND == 1;
    constexpr bool FP8 = KIND == 2;
    constexpr int W = Tr::W, BN = ATTND_FA_BN, STAGES = Tr::STAGES, CPT = Tr::CPT;
    constexpr int ESZ = FP8 ? 1 : 2; // bytes per input element

    extern __shared__ __align__(128) uint8_t attnd_fa_smem[];
    const uint32_t sQ = attnd_smem_addr(attnd_fa_smem);
    const uint32_t sK0 = sQ + Tr::Q_BYTES, sV0 = sK0 + STAGES * Tr::KV_BYTES;
    int *kpos = (int *)(attnd_fa_smem + Tr::Q_BYTES + 2 * STAGES * Tr::KV_BYTES); // [STAGES][BN]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int bidx = blockIdx.z, h = blockIdx.y;
    const int q_start = p.cu_q[bidx * p.cu_q_st];
    const int Lq = p.cu_q[(bidx + 1) * p.cu_q_st] - q_start;
    const int k_start = p.cu_k[bidx * p.cu_k_st];
    const int Lk = p.cu_k[(bidx + 1) * p.cu_k_st] - k_start;
    const int m_rows = SPARSE ? p.m_rows : ATTND_FA_BM;
    // varlen: the longest causal tiles (highest rows) first
    const int mblk = SPARSE ? (int)blockIdx.x : (int)(gridDim.x - 1 - blockIdx.x);
    const int m0 = mblk * m_rows;
    if (m0 >= Lq) return;
    const int rows_valid = min(m_rows, Lq - m0);
    const int hk = h / p.group;
    const int d = p.d;
    const int dchunks = ((d + 15) >> 4) * 2; // chunks written per row (zeros past d)
    const int past = Lk - Lq;                // causal offset: row i sees keys <= i + past

    // Key tiles this CTA visits.
    int n_tiles, c_begin = 0, nvirt = 0;
    if (SPARSE) {
        // a row past the layout (which the host-side validation rejects) sees no key
        const int r = (past + m0) / p.qbs;
        if (past + m0 >= 0 && r < p.n_row_blocks) {
            int c0 = p.crow[h * p.crow_sh + (int64_t)r * p.crow_sm];
            int c1 = p.crow[h * p.crow_sh + (int64_t)(r + 1) * p.crow_sm];
            c0 = max(0, min(c0, p.n_cols));
            c1 = max(c0, min(c1, p.n_cols));
            c_begin = c0;
            nvirt = (c1 - c0) << p.bs_log2;
        }
        n_tiles = (nvirt + BN - 1) / BN;
    } else {
        int kend = Lk;
        if (p.causal) kend = min(Lk, m0 + rows_valid + past); // the last row's keys
        n_tiles = kend > 0 ? (kend + BN - 1) / BN : 0;
    }

    const char *qbase = (const char *)p.q, *kbase = (const char *)p.k, *vbase = (const char *)p.v;

    // Q tile
    for (int i = tid; i < ATTND_FA_BM * W; i += ATTND_FA_THREADS) {
        const int r = i / W, ch = i % W;
        if (ch >= dchunks) continue;
        const bool ok = r < rows_valid && ch * 8 < d;
        const void *row =
            qbase + ((int64_t)(q_start + m0 + r) * p.q_sr + (int64_t)h * p.q_sh) * ESZ;
        attnd_fa_chunk<KIND>(sQ + attnd_swz_w<W>(r, ch), ok ? row : p.q, ch, ok, p.q);
    }

    // K and V rows of tile t into stage buf: cp.async for 16-bit inputs; fp8 rows go through
    // registers (kr/vr) and are converted and stored by store_tile (at the end of an iteration:
    // stage nbuf is free from the iteration's barrier on). Sparse: records each
    // row's key position (INT_MAX: a hole past the listed blocks or past k_len).
    uint2 kr[FP8 ? CPT : 1], vr[FP8 ? CPT : 1];
    auto issue_tile = [&](int t, int buf) {
#pragma unroll
        for (int it = 0; it < CPT; it++) {
            const int i = tid + it * ATTND_FA_THREADS;
            const int r = i / W, ch = i % W;
            int key;
            bool ok;
            if (SPARSE) {
                const int vk = t * BN + r;
                key = INT_MAX;
                if (vk < nvirt) {
                    const int blk = __ldg(p.col + h * p.col_sh +
                                          (int64_t)(c_begin + (vk >> p.bs_log2)) * p.col_sm);
                    const int pos = (blk << p.bs_log2) + (vk & ((1 << p.bs_log2) - 1));
                    if (blk >= 0 && pos < Lk) key = pos;
                }
                ok = key != INT_MAX;
                if (ch == 0) kpos[buf * BN + r] = key;
            } else {
                key = t * BN + r;
                ok = key < Lk;
            }
            if (ch >= dchunks) continue;
            ok = ok && ch * 8 < d;
            const int64_t row = k_start + (ok ? key : 0);
            const char *krow = kbase + (row * p.k_sr + (int64_t)hk * p.k_sh) * ESZ;
            const char *vrow = vbase + (row * p.v_sr + (int64_t)hk * p.v_sh) * ESZ;
            if (FP8) {
                kr[FP8 ? it : 0] = ok ? __ldg((const uint2 *)(krow + ch * 8)) : make_uint2(0, 0);
                vr[FP8 ? it : 0] = ok ? __ldg((const uint2 *)(vrow + ch * 8)) : make_uint2(0, 0);
            } else {
                const uint32_t off = buf * Tr::KV_BYTES + attnd_swz_w<W>(r, ch);
                attnd_cp_async16(sK0 + off, ok ? (const void *)(krow + ch * 16) : p.k, ok ? 16 : 0);
                attnd_cp_async16(sV0 + off, ok ? (const void *)(vrow + ch * 16) : p.v, ok ? 16 : 0);
            }
        }
    };
    auto store_tile = [&](int buf) { // fp8 only
#pragma unroll
        for (int it = 0; it < CPT; it++) {
            const int i = tid + it * ATTND_FA_THREADS;
            const int r = i / W, ch = i % W;
            if (ch >= dchunks) continue;
            const uint32_t off = buf * Tr::KV_BYTES + attnd_swz_w<W>(r, ch);
            attnd_st_shared16(sK0 + off, attnd_fp8x8_to_half8(kr[FP8 ? it : 0]));
            attnd_st_shared16(sV0 + off, attnd_fp8x8_to_half8(vr[FP8 ? it : 0]));
        }
    };

    // prologue: tiles 0 .. STAGES-2 in flight (one commit group each, empty ones too)
#pragma unroll
    for (int t = 0; t < STAGES - 1; t++) {
        if (t < n_tiles) {
            issue_tile(t, t);
            if (FP8) store_tile(t);
        }
        attnd_cp_async_commit();
    }

    const bool warp_active = warp * 16 < rows_valid;
    const int g = lane >> 2, t4 = lane & 3;
    const int rowA = m0 + warp * 16 + g, rowB = rowA + 8; // rows within the sequence
    float o[Tr::NTILES_O][4];
#pragma unroll
    for (int i = 0; i < Tr::NTILES_O; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const bool has_bias = p.bias != NULL;

    int buf = 0, nbuf = STAGES - 1; // stage of tile j, stage of tile j + STAGES - 1
    for (int j = 0; j < n_tiles; j++) {
        attnd_cp_async_wait<STAGES - 2>();
        __syncthreads(); // tile j landed; every warp is done with tile j - 1 (stage nbuf)
        const int jn = j + STAGES - 1;
        if (!FP8 && jn < n_tiles) issue_tile(jn, nbuf);
        attnd_cp_async_commit();

        if (warp_active) {
            const uint32_t sK = sK0 + buf * Tr::KV_BYTES, sV = sV0 + buf * Tr::KV_BYTES;
            const int *kp = kpos + buf * BN;
            // S = Q K^T (16 rows x 32 keys per warp); per k-step one Q and two K fragments
            float s[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < Tr::KSTEPS; kk++) {
                if (kk * 16 >= d) continue;
                uint32_t qa[4], kb[2][4];
                attnd_ldsm_x4(sQ + attnd_swz_w<W>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)),
                              qa);
#pragma unroll
                for (int np = 0; np < 2; np++)
                    attnd_ldsm_x4(sK + attnd_swz_w<W>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                      2 * kk + ((lane >> 3) & 1)),
                                  kb[np]);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    attnd_mma16816<BF>(s[2 * np], qa, kb[np][0], kb[np][1]);
                    attnd_mma16816<BF>(s[2 * np + 1], qa, kb[np][2], kb[np][3]);
                }
            }
            // scale (log2 units), masks, bias. Sparse: no mask when the tile has no hole and its
            // largest position is visible to the CTA's first row.
            bool need_mask;
            if (SPARSE)
                need_mask = __reduce_max_sync(0xffffffffu, kp[lane]) > past + m0;
            else
                need_mask =
                    has_bias || j * BN + BN > Lk || (p.causal && j * BN + BN - 1 > m0 + past);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[nt][e] * p.scale_log2;
                    if (need_mask) {
                        const int row = e < 2 ? rowA : rowB;
                        const int c = nt * 8 + 2 * t4 + (e & 1);
                        int key;
                        bool ok;
                        if (SPARSE) {
                            key = kp[c];
                            ok = key <= past + row;
                        } else {
                            key = j * BN + c;
                            ok = key < Lk && (!p.causal || key <= row + past);
                        }
                        if (ok && has_bias && row < Lq)
                            x += ATTND_LOG2E *
                                 attnd_ld_elem(p.bias, p.bias_dt,
                                               bidx * p.b_sb + h * p.b_sh + (int64_t)row * p.b_sm +
                                                   (int64_t)key * p.b_sn);
                        x = ok ? x : -INFINITY;
                    }
                    s[nt][e] = x;
                }
            }
            // online softmax (FA2): one rescale of O per tile
            float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
            }
            float alpha[2], mu[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = attnd_quad_max(mx[i]);
                mu[i] = attnd_softmax_safe_max(mx[i]); // nothing seen yet: p = 0, no NaN
                alpha[i] = attnd_exp2(m_run[i] - mu[i]);
                m_run[i] = mx[i];
            }
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                s[nt][0] = attnd_exp2(s[nt][0] - mu[0]);
                s[nt][1] = attnd_exp2(s[nt][1] - mu[0]);
                s[nt][2] = attnd_exp2(s[nt][2] - mu[1]);
                s[nt][3] = attnd_exp2(s[nt][3] - mu[1]);
                rs[0] += s[nt][0] + s[nt][1];
                rs[1] += s[nt][2] + s[nt][3];
            }
            l_run[0] = l_run[0] * alpha[0] + rs[0];
            l_run[1] = l_run[1] * alpha[1] + rs[1];
#pragma unroll
            for (int i = 0; i < Tr::NTILES_O; i++) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
            if (FP8) { // P as the PV product sees it: fp8(p / p_scale), exact in fp16
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[nt][e] = attnd_fp8_to_float(attnd_float_to_fp8(s[nt][e] * p.p_descale));
            }
            uint32_t pf[2][4];
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                pf[kk][0] = attnd_pack2<BF>(s[2 * kk][0], s[2 * kk][1]);
                pf[kk][1] = attnd_pack2<BF>(s[2 * kk][2], s[2 * kk][3]);
                pf[kk][2] = attnd_pack2<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[kk][3] = attnd_pack2<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            // O += P V: per 16 keys, the V fragments of PVG x 16 columns are loaded together,
            // then their independent mma's run
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
            // sm_80's register allocation spills the fp8 x 256 kernel with groups of 4
            constexpr int PVG = D_PAD <= 128 ? 8 : (FP8 ? 2 : 4);
#else
            constexpr int PVG = D_PAD <= 128 ? 8 : 4;
#endif
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
#pragma unroll
                for (int dg = 0; dg < D_PAD / (16 * PVG); dg++) {
                    uint32_t vb[PVG][4];
#pragma unroll
                    for (int i = 0; i < PVG; i++)
                        if ((dg * PVG + i) * 16 < d)
                            attnd_ldsm_x4_trans(
                                sV + attnd_swz_w<W>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                    2 * (dg * PVG + i) + (lane >> 4)),
                                vb[i]);
#pragma unroll
                    for (int i = 0; i < PVG; i++) {
                        const int dp = dg * PVG + i;
                        if (dp * 16 < d) {
                            attnd_mma16816<BF>(o[2 * dp], pf[kk], vb[i][0], vb[i][1]);
                            attnd_mma16816<BF>(o[2 * dp + 1], pf[kk], vb[i][2], vb[i][3]);
                        }
                    }
                }
            }
        }
        if (FP8 &&
            jn < n_tiles) { // fp8: load, convert, store after the math (fewer live registers)
            issue_tile(jn, nbuf);
            store_tile(nbuf);
        }
        buf = buf + 1 == STAGES ? 0 : buf + 1;
        nbuf = nbuf + 1 == STAGES ? 0 : nbuf + 1;
    }
    attnd_cp_async_wait<0>();

    if (!warp_active) return;
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float l = attnd_quad_sum(l_run[i]);
        inv[i] = l > 0.0f ? p.out_mul / l : 0.0f; // a row that saw no key is zeros
    }
#pragma unroll
    for (int i = 0; i < Tr::NTILES_O; i++) {
        const int col = i * 8 + 2 * t4;
        if (col >= d) continue;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = half ? rowB : rowA;
            if (row - m0 >= rows_valid) continue;
            const int64_t off = (int64_t)(q_start + row) * p.o_sr + (int64_t)h * p.o_sh + col;
            const float a = o[i][2 * half] * inv[half], b = o[i][2 * half + 1] * inv[half];
            if (p.o_pairs) {
                attnd_st2_elem(p.out, p.out_dt, off, a, b);
            } else {
                attnd_st_elem(p.out, p.out_dt, off, a);
                attnd_st_elem(p.out, p.out_dt, off + 1, b);
            }
        }
    }
}

#endif
