// Linear (lightning) attention, decay lambda = exp(-slope) per head:
//   S_t = lambda S_{t-1} + k_t^T v_t,  o_t = q_t S_t   (S is d x e, float32)
//
// Prefill, chunked (fp16/bf16 inputs, tensor cores): one CTA owns one (batch, head, slice of e
// columns) and walks the sequence in chunks of C = 64 tokens, its slice of the state living in
// the warps' accumulator registers from the first chunk to the last (no workspace, one launch).
// For token i of a chunk that starts from state S0 (the seed's four kernels, fused):
//   o_i = lambda^(i+1) q_i S0 + sum_{j <= i} lambda^(i-j) (q_i . k_j) v_j
//   S0 <- lambda^len S0 + sum_j lambda^(len-1-j) k_j^T v_j
// with the off-diagonal exponent i+1 of the recurrence (the seed's prefill has i: DESIGN.md).
// Each chunk: O = Q S0 (S0 staged in shared memory as 16-bit), rows scaled by lambda^(i+1);
// A = Q K^T with the decay mask (warp w only computes its causal key tiles); O += A V; then the
// state update K^T V with the token decays folded into the K^T fragments.
//
// Prefill, plain (float32 inputs or unaligned rows): the recurrence token by token, float32
// throughout; lanes own state columns, warps own state rows.
//
// Decode: one step per (batch row, head) against kv_cache[slot]; slot -1 writes a zero row and
// leaves the cache alone.
#ifndef ATTND_CUDA_LINEAR_KERNEL_CUH
#define ATTND_CUDA_LINEAR_KERNEL_CUH

#include "ops_kernel.cuh"

#define ATTND_LIN_THREADS 128
#define ATTND_LIN_CHUNK 64

typedef struct attnd_lin_kparams {
    const void *q, *k, *v;
    void *out;
    int64_t q_sb, q_sh, q_sn; // batch, head, token strides (elements); innermost stride 1
    int64_t k_sb, k_sh, k_sn;
    int64_t v_sb, v_sh, v_sn;
    int64_t o_sb, o_sh, o_sn;
    const float *slopes;
    int64_t slope_st;
    float *state; // prefill: kv_state [batch, heads, d, e]; decode: kv_cache [slots, heads, d, e]
    int64_t st_s0, st_sh, st_sd;
    const void *slot_idx; // decode
    int32_t slot_dt;
    int64_t slot_st;
    int32_t n, d, e;
    int32_t in_dt, out_dt;
    int32_t e_slice; // state columns per CTA (prefill)
    int32_t o_pairs; // out allows two-element stores
} attnd_lin_kparams;

template <int D_PAD> struct attnd_lin_traits {
    static_assert(D_PAD == 128 || D_PAD == 256, "padded head sizes: 128, 256");
    enum {
        C = ATTND_LIN_CHUNK,
        ES = 8192 / D_PAD, // state columns per CTA at most: 64 (128) or 32 (256)
        WD = D_PAD / 8,    // 16-byte chunks per q/k row
        WE = ES / 8,       // 16-byte chunks per v row and per state row
        MT = D_PAD / 64,   // 16-row state tiles per warp (warp owns D_PAD/4 rows)
        NE = ES / 8,       // n8 tiles over the slice
        QK_BYTES = C * D_PAD * 2,
        V_BYTES = C * ES * 2,
        S_BYTES = D_PAD * ES * 2,
        SMEM = 4 * QK_BYTES + 2 * V_BYTES + S_BYTES + (C + 1) * 4
    };
};

template <int D_PAD, bool BF>
__global__ void __launch_bounds__(ATTND_LIN_THREADS)
    attnd_lin_prefill_mma_kernel(const attnd_lin_kparams p)
{
    typedef attnd_lin_traits<D_PAD> Tr;
    constexpr int C = Tr::C, WD = Tr::WD, WE = Tr::WE, MT = Tr::MT, NE = Tr::NE;

    extern __shared__ __align__(128) uint8_t attnd_lin_smem[];
    const uint32_t sQ0 = attnd_smem_addr(attnd_lin_smem);
    const uint32_t sK0 = sQ0 + 2 * Tr::QK_BYTES;
    const uint32_t sV0 = sK0 + 2 * Tr::QK_BYTES;
    const uint32_t sS = sV0 + 2 * Tr::V_BYTES;
    float *pw = (float *)(attnd_lin_smem + 4 * Tr::QK_BYTES + 2 * Tr::V_BYTES + Tr::S_BYTES);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int bidx = blockIdx.z, h = blockIdx.y;
    const int e0 = blockIdx.x * p.e_slice;
    const int ew = min(p.e_slice, p.e - e0); // this CTA's columns (a multiple of 8)
    const int n = p.n, d = p.d;
    const int dch = ((d + 15) >> 4) * 2;  // q/k chunks loaded (zeros past d)
    const int ech = ((ew + 15) >> 4) * 2; // v chunks loaded (zeros past ew)

    const float slope = p.slopes[h * p.slope_st];
    for (int i = tid; i <= C; i += ATTND_LIN_THREADS)
        pw[i] = (float)exp(-(double)slope * i);

    const char *qb = (const char *)p.q + (bidx * p.q_sb + h * p.q_sh) * 2;
    const char *kb = (const char *)p.k + (bidx * p.k_sb + h * p.k_sh) * 2;
    const char *vb = (const char *)p.v + (bidx * p.v_sb + h * p.v_sh + e0) * 2;
    float *state = p.state + bidx * p.st_s0 + h * p.st_sh + e0;

    auto load_chunk = [&](int c, int buf) {
        const int t0 = c * C;
        const uint32_t sQ = sQ0 + buf * Tr::QK_BYTES, sK = sK0 + buf * Tr::QK_BYTES;
        const uint32_t sV = sV0 + buf * Tr::V_BYTES;
        for (int i = tid; i < C * WD; i += ATTND_LIN_THREADS) {
            const int r = i / WD, ch = i % WD;
            if (ch >= dch) continue;
            const bool ok = t0 + r < n && ch * 8 < d;
            const int64_t tok = ok ? t0 + r : 0;
            attnd_cp_async16(sQ + attnd_swz_w<WD>(r, ch), qb + (tok * p.q_sn + ch * 8) * 2,
                             ok ? 16 : 0);
            attnd_cp_async16(sK + attnd_swz_w<WD>(r, ch), kb + (tok * p.k_sn + ch * 8) * 2,
                             ok ? 16 : 0);
        }
        for (int i = tid; i < C * WE; i += ATTND_LIN_THREADS) {
            const int r = i / WE, ch = i % WE;
            if (ch >= ech) continue;
            const bool ok = t0 + r < n && ch * 8 < ew;
            const int64_t tok = ok ? t0 + r : 0;
            attnd_cp_async16(sV + attnd_swz_w<WE>(r, ch), vb + (tok * p.v_sn + ch * 8) * 2,
                             ok ? 16 : 0);
        }
    };

    // This warp's rows of the state slice: d rows warp * D_PAD/4 + mt*16 + {g, g+8}.
    float st[MT][NE][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = warp * (D_PAD / 4) + mt * 16 + g;
#pragma unroll
        for (int nt = 0; nt < NE; nt++) {
            const int col = nt * 8 + 2 * t4;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + (e >> 1) * 8, cc = col + (e & 1);
                st[mt][nt][e] = (r < d && cc < ew) ? state[(int64_t)r * p.st_sd + cc] : 0.0f;
            }
        }
    }

    const int n_chunks = (n + C - 1) / C;
    if (n_chunks > 0) load_chunk(0, 0);
    attnd_cp_async_commit();

    for (int c = 0; c < n_chunks; c++) {
        const int buf = c & 1;
        const int len = min(C, n - c * C);
        if (c + 1 < n_chunks) load_chunk(c + 1, buf ^ 1);
        attnd_cp_async_commit();
        // stage S0 (16-bit) for O = Q S0
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int r0 = warp * (D_PAD / 4) + mt * 16;
            if (r0 >= d) continue;
#pragma unroll
            for (int nt = 0; nt < NE; nt++) {
                attnd_st_shared32(sS + attnd_swz_w<WE>(r0 + g, nt) + 4 * t4,
                                  attnd_pack2<BF>(st[mt][nt][0], st[mt][nt][1]));
                attnd_st_shared32(sS + attnd_swz_w<WE>(r0 + g + 8, nt) + 4 * t4,
                                  attnd_pack2<BF>(st[mt][nt][2], st[mt][nt][3]));
            }
        }
        attnd_cp_async_wait<1>();
        __syncthreads(); // chunk c and S0 visible to every warp

        const uint32_t sQ = sQ0 + buf * Tr::QK_BYTES, sK = sK0 + buf * Tr::QK_BYTES;
        const uint32_t sV = sV0 + buf * Tr::V_BYTES;

        // O = Q S0 and A = Q K^T (warp w: chunk rows 16w..16w+15, key tiles <= w)
        float o[NE][4], s[8][4];
#pragma unroll
        for (int i = 0; i < NE; i++)
            o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D_PAD / 16; kk++) {
            if (kk * 16 >= d) continue;
            uint32_t a[4];
            attnd_ldsm_x4(sQ + attnd_swz_w<WD>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), a);
#pragma unroll
            for (int np = 0; np < NE / 2; np++) {
                if (np * 16 >= ew) continue;
                uint32_t bb[4];
                attnd_ldsm_x4_trans(
                    sS + attnd_swz_w<WE>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                         2 * np + (lane >> 4)),
                    bb);
                attnd_mma16816<BF>(o[2 * np], a, bb[0], bb[1]);
                attnd_mma16816<BF>(o[2 * np + 1], a, bb[2], bb[3]);
            }
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (np > warp) continue;
                uint32_t bb[4];
                attnd_ldsm_x4(sK + attnd_swz_w<WD>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                   2 * kk + ((lane >> 3) & 1)),
                              bb);
                attnd_mma16816<BF>(s[2 * np], a, bb[0], bb[1]);
                attnd_mma16816<BF>(s[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        const int iA = warp * 16 + g, iB = iA + 8; // chunk rows of this thread
        {
            const float fa = pw[iA + 1], fb = pw[iB + 1];
#pragma unroll
            for (int i = 0; i < NE; i++) {
                o[i][0] *= fa;
                o[i][1] *= fa;
                o[i][2] *= fb;
                o[i][3] *= fb;
            }
        }
        uint32_t pf[4][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e < 2 ? iA : iB, j = nt * 8 + 2 * t4 + (e & 1);
                s[nt][e] = j <= i ? s[nt][e] * pw[i - j] : 0.0f;
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            pf[kk][0] = attnd_pack2<BF>(s[2 * kk][0], s[2 * kk][1]);
            pf[kk][1] = attnd_pack2<BF>(s[2 * kk][2], s[2 * kk][3]);
            pf[kk][2] = attnd_pack2<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pf[kk][3] = attnd_pack2<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
        // O += A V
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (kk > warp) continue;
#pragma unroll
            for (int np = 0; np < NE / 2; np++) {
                if (np * 16 >= ew) continue;
                uint32_t bb[4];
                attnd_ldsm_x4_trans(
                    sV + attnd_swz_w<WE>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                         2 * np + (lane >> 4)),
                    bb);
                attnd_mma16816<BF>(o[2 * np], pf[kk], bb[0], bb[1]);
                attnd_mma16816<BF>(o[2 * np + 1], pf[kk], bb[2], bb[3]);
            }
        }
        // store the chunk's output rows
#pragma unroll
        for (int nt = 0; nt < NE; nt++) {
            const int col = nt * 8 + 2 * t4;
            if (col >= ew) continue;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int i = hf ? iB : iA;
                if (i >= len) continue;
                const int64_t off =
                    bidx * p.o_sb + h * p.o_sh + (int64_t)(c * C + i) * p.o_sn + e0 + col;
                if (p.o_pairs) {
                    attnd_st2_elem(p.out, p.out_dt, off, o[nt][2 * hf], o[nt][2 * hf + 1]);
                } else {
                    attnd_st_elem(p.out, p.out_dt, off, o[nt][2 * hf]);
                    attnd_st_elem(p.out, p.out_dt, off + 1, o[nt][2 * hf + 1]);
                }
            }
        }
        // S0 <- lambda^len S0 + (K * lambda^(len-1-j))^T V
        {
            const float f = pw[len];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NE; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        st[mt][nt][e] *= f;
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (kk * 16 >= len) continue;
            const int j0 = kk * 16 + 2 * t4, j1 = j0 + 8;
            const float k00 = j0 < len ? pw[len - 1 - j0] : 0.0f;
            const float k01 = j0 + 1 < len ? pw[len - 2 - j0] : 0.0f;
            const float k10 = j1 < len ? pw[len - 1 - j1] : 0.0f;
            const float k11 = j1 + 1 < len ? pw[len - 2 - j1] : 0.0f;
            uint32_t vb4[NE / 2][4];
#pragma unroll
            for (int np = 0; np < NE / 2; np++)
                if (np * 16 < ew)
                    attnd_ldsm_x4_trans(
                        sV + attnd_swz_w<WE>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                             2 * np + (lane >> 4)),
                        vb4[np]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int r0 = warp * (D_PAD / 4) + mt * 16;
                if (r0 >= d) continue;
                uint32_t a[4];
                attnd_ldsm_x4_trans(sK + attnd_swz_w<WD>(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                         (r0 >> 3) + ((lane >> 3) & 1)),
                                    a);
                float2 x;
                x = attnd_unpack2<BF>(a[0]);
                a[0] = attnd_pack2<BF>(x.x * k00, x.y * k01);
                x = attnd_unpack2<BF>(a[1]);
                a[1] = attnd_pack2<BF>(x.x * k00, x.y * k01);
                x = attnd_unpack2<BF>(a[2]);
                a[2] = attnd_pack2<BF>(x.x * k10, x.y * k11);
                x = attnd_unpack2<BF>(a[3]);
                a[3] = attnd_pack2<BF>(x.x * k10, x.y * k11);
#pragma unroll
                for (int np = 0; np < NE / 2; np++) {
                    if (np * 16 >= ew) continue;
                    attnd_mma16816<BF>(st[mt][2 * np], a, vb4[np][0], vb4[np][1]);
                    attnd_mma16816<BF>(st[mt][2 * np + 1], a, vb4[np][2], vb4[np][3]);
                }
            }
        }
        __syncthreads(); // every warp is done with this chunk's buffers and with S0
    }
    attnd_cp_async_wait<0>();

    // final state
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = warp * (D_PAD / 4) + mt * 16 + g;
#pragma unroll
        for (int nt = 0; nt < NE; nt++) {
            const int col = nt * 8 + 2 * t4;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + (e >> 1) * 8, cc = col + (e & 1);
                if (r < d && cc < ew) state[(int64_t)r * p.st_sd + cc] = st[mt][nt][e];
            }
        }
    }
}

// Plain prefill: the recurrence in float32, any input dtype and strides. CTA = (32 state columns,
// head, batch); lane = column, warp w = rows w, w+4, ...; tokens staged LIN_ST at a time.
#define ATTND_LIN_ST 32
template <int RPT>
__global__ void __launch_bounds__(ATTND_LIN_THREADS)
    attnd_lin_prefill_plain_kernel(const attnd_lin_kparams p)
{
    extern __shared__ __align__(16) float attnd_lin_fsmem[];
    const int d = p.d, e = p.e, n = p.n;
    float *qs = attnd_lin_fsmem;         // [ST][d]
    float *ks = qs + ATTND_LIN_ST * d;   // [ST][d]
    float *vs = ks + ATTND_LIN_ST * d;   // [ST][32]
    float *red = vs + ATTND_LIN_ST * 32; // [4][ST][32]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int bidx = blockIdx.z, h = blockIdx.y, col = blockIdx.x * 32 + lane;
    const bool col_ok = col < e;
    const float lam = (float)exp(-(double)p.slopes[h * p.slope_st]);
    float *state = p.state + bidx * p.st_s0 + h * p.st_sh;
    float st[RPT];
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        const int i = warp + 4 * r;
        st[r] = (i < d && col_ok) ? state[(int64_t)i * p.st_sd + col] : 0.0f;
    }
    const int64_t qo = bidx * p.q_sb + h * p.q_sh, ko = bidx * p.k_sb + h * p.k_sh;
    const int64_t vo = bidx * p.v_sb + h * p.v_sh, oo = bidx * p.o_sb + h * p.o_sh;
    for (int t0 = 0; t0 < n; t0 += ATTND_LIN_ST) {
        const int len = min(ATTND_LIN_ST, n - t0);
        for (int i = tid; i < len * d; i += ATTND_LIN_THREADS) {
            const int t = i / d, c = i % d;
            qs[i] = attnd_ld_elem(p.q, p.in_dt, qo + (int64_t)(t0 + t) * p.q_sn + c);
            ks[i] = attnd_ld_elem(p.k, p.in_dt, ko + (int64_t)(t0 + t) * p.k_sn + c);
        }
        for (int i = tid; i < len * 32; i += ATTND_LIN_THREADS) {
            const int t = i >> 5, c = blockIdx.x * 32 + (i & 31);
            vs[i] = c < e ? attnd_ld_elem(p.v, p.in_dt, vo + (int64_t)(t0 + t) * p.v_sn + c) : 0.0f;
        }
        __syncthreads();
        for (int t = 0; t < len; t++) {
            const float vv = vs[t * 32 + lane];
            float part = 0.0f;
#pragma unroll
            for (int r = 0; r < RPT; r++) {
                const int i = warp + 4 * r;
                if (i < d) {
                    st[r] = fmaf(lam, st[r], ks[t * d + i] * vv);
                    part = fmaf(qs[t * d + i], st[r], part);
                }
            }
            red[(warp * ATTND_LIN_ST + t) * 32 + lane] = part;
        }
        __syncthreads();
        for (int i = tid; i < len * 32; i += ATTND_LIN_THREADS) {
            const int t = i >> 5, l = i & 31, c = blockIdx.x * 32 + l;
            const float o =
                red[(0 * ATTND_LIN_ST + t) * 32 + l] + red[(1 * ATTND_LIN_ST + t) * 32 + l] +
                red[(2 * ATTND_LIN_ST + t) * 32 + l] + red[(3 * ATTND_LIN_ST + t) * 32 + l];
            if (c < e) attnd_st_elem(p.out, p.out_dt, oo + (int64_t)(t0 + t) * p.o_sn + c, o);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        const int i = warp + 4 * r;
        if (i < d && col_ok) state[(int64_t)i * p.st_sd + col] = st[r];
    }
}

// Decode: CTA = (head, batch row). VEC = 4: 16-byte state accesses (aligned rows), else 1.
template <int VEC>
__global__ void __launch_bounds__(ATTND_LIN_THREADS)
    attnd_lin_decode_kernel(const attnd_lin_kparams p)
{
    __shared__ float qs[ATTND_HEAD_SIZE_MAX], ks[ATTND_HEAD_SIZE_MAX], vs[ATTND_HEAD_SIZE_MAX];
    __shared__ float red[ATTND_LIN_THREADS * VEC];
    __shared__ float lam_s;
    const int tid = threadIdx.x;
    const int h = blockIdx.x, bidx = blockIdx.y;
    const int d = p.d, e = p.e;
    const int64_t slot = p.slot_dt == ATTND_DTYPE_I64
                             ? ((const int64_t *)p.slot_idx)[bidx * p.slot_st]
                             : (int64_t)((const int32_t *)p.slot_idx)[bidx * p.slot_st];
    const int64_t oo = bidx * p.o_sb + h * p.o_sh;
    if (slot < 0) { // padding row: zeros, cache untouched
        for (int c = tid; c < e; c += ATTND_LIN_THREADS)
            attnd_st_elem(p.out, p.out_dt, oo + c, 0.0f);
        return;
    }
#pragma unroll 1
    for (int i = tid; i < d; i += ATTND_LIN_THREADS) {
        qs[i] = attnd_ld_elem(p.q, p.in_dt, bidx * p.q_sb + h * p.q_sh + i);
        ks[i] = attnd_ld_elem(p.k, p.in_dt, bidx * p.k_sb + h * p.k_sh + i);
    }
#pragma unroll 1
    for (int i = tid; i < e; i += ATTND_LIN_THREADS)
        vs[i] = attnd_ld_elem(p.v, p.in_dt, bidx * p.v_sb + h * p.v_sh + i);
    if (tid == 0) lam_s = (float)exp(-(double)p.slopes[h * p.slope_st]); // accurate: it compounds
    float *state = p.state + slot * p.st_s0 + h * p.st_sh;
    __syncthreads();
    const float lam = lam_s;
    const int ncol = e / VEC; // vectors per state row
    const int ncol_t = ncol < ATTND_LIN_THREADS ? ncol : ATTND_LIN_THREADS;
    const int nty = ATTND_LIN_THREADS / ncol_t;
    const int tx = tid % ncol_t, ty = tid / ncol_t;
    for (int cb = 0; cb < ncol; cb += ncol_t) {
        const int cv = cb + tx;
        const bool active = ty < nty && cv < ncol;
        float part[VEC];
#pragma unroll
        for (int u = 0; u < VEC; u++)
            part[u] = 0.0f;
        if (active) {
            float vv[VEC];
#pragma unroll
            for (int u = 0; u < VEC; u++)
                vv[u] = vs[cv * VEC + u];
            for (int i = ty; i < d; i += nty) {
                float *row = state + (int64_t)i * p.st_sd + cv * VEC;
                float x[VEC];
                if constexpr (VEC == 4) {
                    const float4 f = *(const float4 *)row;
                    x[0] = f.x;
                    x[1] = f.y;
                    x[2] = f.z;
                    x[3] = f.w;
                } else {
                    x[0] = row[0];
                }
                const float ki = ks[i], qi = qs[i];
#pragma unroll
                for (int u = 0; u < VEC; u++) {
                    x[u] = fmaf(lam, x[u], ki * vv[u]);
                    part[u] = fmaf(qi, x[u], part[u]);
                }
                if constexpr (VEC == 4)
                    *(float4 *)row = make_float4(x[0], x[1], x[2], x[3]);
                else
                    row[0] = x[0];
            }
        }
#pragma unroll
        for (int u = 0; u < VEC; u++)
            red[tid * VEC + u] = part[u];
        __syncthreads();
        if (ty == 0 && cv < ncol) {
#pragma unroll
            for (int u = 0; u < VEC; u++) {
                float acc = 0.0f;
                for (int y = 0; y < nty; y++)
                    acc += red[(y * ncol_t + tx) * VEC + u];
                attnd_st_elem(p.out, p.out_dt, oo + cv * VEC + u, acc);
            }
        }
        __syncthreads();
    }
}

#endif
