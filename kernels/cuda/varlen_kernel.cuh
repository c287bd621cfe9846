// FA2-style forward attention over contiguous packed Q/K/V (mma.sync m16n8k16, f32 accumulation),
// shared by varlen attention and block-sparse attention.
//
// One CTA = 4 warps = up to 64 query rows of one (sequence, q head); each warp owns 16 rows. Keys
// come in tiles of 64 rows: for varlen the sequence's keys 0.., for block-sparse the listed key
// blocks of the CTA's layout row, gathered into one virtual key sequence (a tile may hold several
// 16/32-key blocks, or half of a 128-key block), with each tile row's key position kept in shared
// memory for the causal mask. The pipeline is FA2's: K(j) and V(j) each have one shared buffer;
// V(j) loads while S = Q K(j)^T and the softmax run, K(j+1) loads while O += P V(j) runs.
//
// Head sizes: tiles are D_PAD wide (128 or 256); a head size d (multiple of 8) uses only the
// k-steps and n-tiles below it, so 32..128 share one instantiation and 136..256 the other.
// KIND: 0 fp16, 1 bf16, 2 fp8-e4m3 inputs (converted exactly to fp16 in shared memory; P is
// quantised to fp8 as p / p_scale before P V, as the seed and the CPU backend do).
#ifndef ATTND_CUDA_VARLEN_KERNEL_CUH
#define ATTND_CUDA_VARLEN_KERNEL_CUH

#include <limits.h>

#include "ops_kernel.cuh"

#define ATTND_FA_THREADS 128
#define ATTND_FA_BM 64
#define ATTND_FA_BN 64

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
    int32_t bs_log2;   // log2(key block size)
    int32_t qbs;       // query (row) block size
    int32_t m_rows;    // query rows per CTA (min(64, qbs))
    int32_t n_row_blocks, n_cols;
} attnd_fa_kparams;

template <int D_PAD> struct attnd_fa_traits {
    static_assert(D_PAD == 128 || D_PAD == 256, "padded head sizes: 128, 256");
    enum {
        W = D_PAD / 8,                              // 16-byte chunks per tile row
        KSTEPS = D_PAD / 16,                        // k-steps of Q K^T
        NTILES_O = D_PAD / 8,                       // n8 tiles of O
        TILE_BYTES = ATTND_FA_BM * D_PAD * 2,       // one 64-row tile, 16-bit
        SMEM = 3 * TILE_BYTES + ATTND_FA_BN * 4 + 8 // Q, K, V tiles, key positions, tile maxima
    };
    static_assert(ATTND_FA_BM == ATTND_FA_BN, "Q and K/V tiles share one size");
};

// Chunk ch (8 elements) of a tile row into shared memory: cp.async for 16-bit inputs, a converting
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

// The A fragment of k-step kk of the warp's 16 Q rows and the B fragments of the 64 K rows.
template <int W>
static __device__ __forceinline__ void attnd_fa_ldsm_qk(uint32_t sQ, uint32_t sK, int warp, int lane,
                                                        int kk, uint32_t (&qa)[4], uint32_t (&kb)[4][4])
{
    attnd_ldsm_x4(sQ + attnd_swz_w<W>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), qa);
#pragma unroll
    for (int np = 0; np < 4; np++)
        attnd_ldsm_x4(sK + attnd_swz_w<W>(np * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)),
                      kb[np]);
}

// ATTND_FA_PIPE: prefetch the Q K^T fragments one k-step ahead (head sizes <= 128).
#ifndef ATTND_FA_PIPE
#define ATTND_FA_PIPE 1
#endif

template <int D_PAD, int KIND, bool SPARSE>
__global__ void __launch_bounds__(ATTND_FA_THREADS, D_PAD <= 128 ? (ATTND_FA_PIPE ? 2 : 3) : 2)
    attnd_fa_fwd_kernel(const attnd_fa_kparams p)
{
    constexpr bool PIPE = ATTND_FA_PIPE && D_PAD <= 128;
    typedef attnd_fa_traits<D_PAD> Tr;
    constexpr bool BF = KIND == 1;
    constexpr bool FP8 = KIND == 2;
    constexpr int W = Tr::W, BN = ATTND_FA_BN;
    constexpr int ESZ = FP8 ? 1 : 2; // bytes per input element

    extern __shared__ __align__(128) uint8_t attnd_fa_smem[];
    const uint32_t sQ = attnd_smem_addr(attnd_fa_smem);
    const uint32_t sK = sQ + Tr::TILE_BYTES, sV = sK + Tr::TILE_BYTES;
    int *kpos = (int *)(attnd_fa_smem + 3 * Tr::TILE_BYTES);
    int *kmax = kpos + BN; // sparse: [2] largest key position of a tile (INT_MAX: a hole)

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
    const int dchunks = ((d + 15) >> 4) * 2; // chunks loaded per row (zeros past d)
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
        const void *row = qbase + ((int64_t)(q_start + m0 + r) * p.q_sr + (int64_t)h * p.q_sh) * ESZ;
        attnd_fa_chunk<KIND>(sQ + attnd_swz_w<W>(r, ch), ok ? row : p.q, ch, ok, p.q);
    }

    // K rows of tile j (sparse: also records each row's key position, INT_MAX = none)
    auto load_k = [&](int j) {
        for (int i = tid; i < BN * W; i += ATTND_FA_THREADS) {
            const int r = i / W, ch = i % W;
            if (ch >= dchunks) continue;
            int key;
            bool ok;
            if (SPARSE) {
                const int vk = j * BN + r;
                key = INT_MAX;
                if (vk < nvirt) {
                    const int blk =
                        __ldg(p.col + h * p.col_sh + (int64_t)(c_begin + (vk >> p.bs_log2)) * p.col_sm);
                    const int pos = (blk << p.bs_log2) + (vk & ((1 << p.bs_log2) - 1));
                    if (blk >= 0 && pos < Lk) key = pos;
                }
                ok = key != INT_MAX;
                if (ch == 0) {
                    kpos[r] = key;
                    atomicMax(&kmax[j & 1], key);
                }
            } else {
                key = j * BN + r;
                ok = key < Lk;
            }
            ok = ok && ch * 8 < d;
            const void *row =
                kbase + ((int64_t)(k_start + (ok ? key : 0)) * p.k_sr + (int64_t)hk * p.k_sh) * ESZ;
            attnd_fa_chunk<KIND>(sK + attnd_swz_w<W>(r, ch), row, ch, ok, p.k);
        }
    };
    auto load_v = [&](int j) {
        for (int i = tid; i < BN * W; i += ATTND_FA_THREADS) {
            const int r = i / W, ch = i % W;
            if (ch >= dchunks) continue;
            int key;
            bool ok;
            if (SPARSE) {
                key = kpos[r];
                ok = key != INT_MAX;
            } else {
                key = j * BN + r;
                ok = key < Lk;
            }
            ok = ok && ch * 8 < d;
            const void *row =
                vbase + ((int64_t)(k_start + (ok ? key : 0)) * p.v_sr + (int64_t)hk * p.v_sh) * ESZ;
            attnd_fa_chunk<KIND>(sV + attnd_swz_w<W>(r, ch), row, ch, ok, p.v);
        }
    };

    if (SPARSE) {
        if (tid < 2) kmax[tid] = INT_MIN;
        __syncthreads();
    }
    if (n_tiles > 0) load_k(0);
    attnd_cp_async_commit();

    const bool warp_active = warp * 16 < rows_valid;
    const int g = lane >> 2, t4 = lane & 3;
    const int rowA = m0 + warp * 16 + g, rowB = rowA + 8; // rows within the sequence
    float o[Tr::NTILES_O][4];
#pragma unroll
    for (int i = 0; i < Tr::NTILES_O; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const bool has_bias = p.bias != NULL;

    for (int j = 0; j < n_tiles; j++) {
        attnd_cp_async_wait<0>();
        __syncthreads(); // K(j) landed; every warp is done with V(j-1)
        // sparse: every row of this CTA sees all of tile j when its largest position is at most
        // the first row's; the other slot is reset for tile j + 1 (filled after the next barrier)
        bool sparse_full = false;
        if (SPARSE) {
            sparse_full = kmax[j & 1] <= past + m0;
            if (tid == 0) kmax[(j + 1) & 1] = INT_MIN;
        }
        load_v(j);
        attnd_cp_async_commit();

        uint32_t pf[4][4];
        if (warp_active) {
            float s[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            // S = Q K^T. Per k-step the Q fragment and the four K fragments (16 keys each) are
            // loaded together; with PIPE they are loaded one k-step ahead (more registers, 2 CTAs
            // per SM), so no ldmatrix latency sits in front of the mma's.
            if (PIPE) {
                uint32_t qa[2][4], kb[2][4][4];
                attnd_fa_ldsm_qk<W>(sQ, sK, warp, lane, 0, qa[0], kb[0]);
#pragma unroll
                for (int kk = 0; kk < Tr::KSTEPS; kk++) {
                    if (kk * 16 >= d) continue;
                    if (kk + 1 < Tr::KSTEPS && (kk + 1) * 16 < d)
                        attnd_fa_ldsm_qk<W>(sQ, sK, warp, lane, kk + 1, qa[(kk + 1) & 1], kb[(kk + 1) & 1]);
#pragma unroll
                    for (int np = 0; np < 4; np++) {
                        attnd_mma16816<BF>(s[2 * np], qa[kk & 1], kb[kk & 1][np][0], kb[kk & 1][np][1]);
                        attnd_mma16816<BF>(s[2 * np + 1], qa[kk & 1], kb[kk & 1][np][2], kb[kk & 1][np][3]);
                    }
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < Tr::KSTEPS; kk++) {
                    if (kk * 16 >= d) continue;
                    uint32_t qa[4], kb[4][4];
                    attnd_fa_ldsm_qk<W>(sQ, sK, warp, lane, kk, qa, kb);
#pragma unroll
                    for (int np = 0; np < 4; np++) {
                        attnd_mma16816<BF>(s[2 * np], qa, kb[np][0], kb[np][1]);
                        attnd_mma16816<BF>(s[2 * np + 1], qa, kb[np][2], kb[np][3]);
                    }
                }
            }
            // scale (log2 units), masks, bias
            const bool need_mask = SPARSE ? !sparse_full
                                          : (has_bias || j * BN + BN > Lk ||
                                             (p.causal && j * BN + BN - 1 > m0 + past));
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[nt][e] * p.scale_log2;
                    if (need_mask) {
                        const int row = e < 2 ? rowA : rowB;
                        const int c = nt * 8 + 2 * t4 + (e & 1);
                        int key;
                        bool ok;
                        if (SPARSE) {
                            key = kpos[c];
                            ok = key <= past + row;
                        } else {
                            key = j * BN + c;
                            ok = key < Lk && (!p.causal || key <= row + past);
                        }
                        if (ok && has_bias && row < Lq)
                            x += ATTND_LOG2E * attnd_ld_elem(p.bias, p.bias_dt,
                                                        bidx * p.b_sb + h * p.b_sh +
                                                            (int64_t)row * p.b_sm +
                                                            (int64_t)key * p.b_sn);
                        x = ok ? x : -INFINITY;
                    }
                    s[nt][e] = x;
                }
            }
            // online softmax (FA2): one rescale of O per tile
            float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
            }
            float alpha[2], mu[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = attnd_quad_max(mx[i]);
                mu[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; // nothing seen yet: p = 0, no NaN
                alpha[i] = exp2f(m_run[i] - mu[i]);
                m_run[i] = mx[i];
            }
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[nt][0] = exp2f(s[nt][0] - mu[0]);
                s[nt][1] = exp2f(s[nt][1] - mu[0]);
                s[nt][2] = exp2f(s[nt][2] - mu[1]);
                s[nt][3] = exp2f(s[nt][3] - mu[1]);
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
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[nt][e] = attnd_fp8_to_float(attnd_float_to_fp8(s[nt][e] * p.p_descale));
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                pf[kk][0] = attnd_pack2<BF>(s[2 * kk][0], s[2 * kk][1]);
                pf[kk][1] = attnd_pack2<BF>(s[2 * kk][2], s[2 * kk][3]);
                pf[kk][2] = attnd_pack2<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[kk][3] = attnd_pack2<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
        }

        attnd_cp_async_wait<0>();
        __syncthreads(); // V(j) landed; every warp is done with K(j) (and kpos of tile j)
        if (j + 1 < n_tiles) load_k(j + 1);
        attnd_cp_async_commit();

        if (warp_active) {
            // O += P V: per 16 keys, the V fragments of up to 128 columns are loaded together,
            // then their 16 independent mma's run
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
#pragma unroll
                for (int dg = 0; dg < D_PAD / 128; dg++) {
                    uint32_t vb[8][4];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if ((dg * 8 + i) * 16 < d)
                            attnd_ldsm_x4_trans(sV + attnd_swz_w<W>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                                    2 * (dg * 8 + i) + (lane >> 4)),
                                                vb[i]);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const int dp = dg * 8 + i;
                        if (dp * 16 < d) {
                            attnd_mma16816<BF>(o[2 * dp], pf[kk], vb[i][0], vb[i][1]);
                            attnd_mma16816<BF>(o[2 * dp + 1], pf[kk], vb[i][2], vb[i][3]);
                        }
                    }
                }
            }
        }
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
