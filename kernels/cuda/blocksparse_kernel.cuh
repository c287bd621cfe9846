// Block-sparse decode (every sequence has one query, at position k_len - 1): memory-bound, so no
// tensor cores and no shared-memory tiles; many small CTAs keep many loads in flight.
//
// One CTA = 4 warps = one (q head, sequence). The listed key blocks of the query's layout row
// form one virtual key sequence; warp w takes its chunks of 32 keys w, w+4, ... . For Q.K a lane
// owns a key (its row read with 16-byte loads, q broadcast from shared memory); the warp then
// updates its online softmax (log2 domain, float32 P: no rounding of P); for P.V a lane owns 8
// output columns (lanes split over keys when a row needs 16 lanes or fewer). The four warps' states
// are merged at the end. Masks as the CPU backend: a key is visible iff it is < k_len (and so
// <= the query's position); an empty row gives zeros.
#ifndef ATTND_CUDA_BLOCKSPARSE_KERNEL_CUH
#define ATTND_CUDA_BLOCKSPARSE_KERNEL_CUH

#include "varlen_kernel.cuh"

#define ATTND_BSD_THREADS 128

// Eight 16-bit values (16 bytes) as floats.
template <bool BF> static __device__ __forceinline__ void attnd_unpack8(const uint4 &w, float *f)
{
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 v = attnd_unpack2<BF>(u[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

template <int KIND>
__global__ void __launch_bounds__(ATTND_BSD_THREADS)
    attnd_bs_decode_kernel(const attnd_fa_kparams p)
{
    constexpr bool BF = KIND == 1;
    __shared__ __align__(16) float qs[ATTND_HEAD_SIZE_MAX];
    __shared__ __align__(16) float red_o[ATTND_BSD_THREADS / 32][ATTND_HEAD_SIZE_MAX];
    __shared__ float red_m[ATTND_BSD_THREADS / 32], red_l[ATTND_BSD_THREADS / 32];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.x, bidx = blockIdx.y;
    const int q_start = p.cu_q[bidx * p.cu_q_st];
    const int Lq = p.cu_q[(bidx + 1) * p.cu_q_st] - q_start;
    const int k_start = p.cu_k[bidx * p.cu_k_st];
    const int Lk = p.cu_k[(bidx + 1) * p.cu_k_st] - k_start;
    if (Lq <= 0) return;
    const int d = p.d, nch = d >> 3; // 8-column chunks per row (d is a multiple of 8)
    const int hk = h / p.group;
    const int64_t qrow = (int64_t)q_start * p.q_sr + (int64_t)h * p.q_sh;
    for (int i = tid; i < d; i += ATTND_BSD_THREADS)
        qs[i] = attnd_ld_elem(p.q, KIND == 1 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16, qrow + i);

    // the query's layout row (position Lk - 1); past the layout or no keys: sees nothing
    int c_begin = 0, nvirt = 0;
    const int pos = Lk - 1, r = pos >= 0 ? pos / p.qbs : -1;
    if (r >= 0 && r < p.n_row_blocks) {
        int c0 = p.crow[h * p.crow_sh + (int64_t)r * p.crow_sm];
        int c1 = p.crow[h * p.crow_sh + (int64_t)(r + 1) * p.crow_sm];
        c0 = max(0, min(c0, p.n_cols));
        c1 = max(c0, min(c1, p.n_cols));
        c_begin = c0;
        nvirt = (c1 - c0) << p.bs_log2;
    }
    __syncthreads();

    const uint16_t *kb = (const uint16_t *)p.k + (int64_t)k_start * p.k_sr + (int64_t)hk * p.k_sh;
    const uint16_t *vb = (const uint16_t *)p.v + (int64_t)k_start * p.v_sr + (int64_t)hk * p.v_sh;
    // P.V lanes: LPR lanes per value row (a power of two >= nch), 32 / LPR keys at a time
    const int LPR = nch <= 4 ? 4 : nch <= 8 ? 8 : nch <= 16 ? 16 : 32;
    const int grp = lane / LPR, cl = lane % LPR, KG = 32 / LPR;
    float m = -INFINITY, l = 0.0f, o[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        o[i] = 0.0f;

    for (int base = warp * 32; base < nvirt; base += ATTND_BSD_THREADS) {
        const int vk = base + lane;
        int key = -1;
        if (vk < nvirt) {
            const int blk =
                __ldg(p.col + h * p.col_sh + (int64_t)(c_begin + (vk >> p.bs_log2)) * p.col_sm);
            const int kp = (blk << p.bs_log2) + (vk & ((1 << p.bs_log2) - 1));
            if (blk >= 0 && kp < Lk) key = kp;
        }
        // Q.K: this lane's key row, 8 chunks (128 bytes) in flight at a time
        float sc = -INFINITY;
        {
            const uint4 *kr = (const uint4 *)(kb + (int64_t)(key >= 0 ? key : 0) * p.k_sr);
            float acc = 0.0f;
#pragma unroll
            for (int c0 = 0; c0 < 32; c0 += 8) {
                if (c0 >= nch) break;
                uint4 w[8];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    w[i] = (key >= 0 && c0 + i < nch) ? __ldg(kr + c0 + i) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (c0 + i >= nch) break;
                    float f[8];
                    attnd_unpack8<BF>(w[i], f);
                    const float4 qa = *(const float4 *)&qs[(c0 + i) * 8];
                    const float4 qb = *(const float4 *)&qs[(c0 + i) * 8 + 4];
                    acc = fmaf(qa.x, f[0], acc);
                    acc = fmaf(qa.y, f[1], acc);
                    acc = fmaf(qa.z, f[2], acc);
                    acc = fmaf(qa.w, f[3], acc);
                    acc = fmaf(qb.x, f[4], acc);
                    acc = fmaf(qb.y, f[5], acc);
                    acc = fmaf(qb.z, f[6], acc);
                    acc = fmaf(qb.w, f[7], acc);
                }
            }
            if (key >= 0) sc = acc * p.scale_log2;
        }
        // online softmax over the warp's 32 keys
        const float mx = fmaxf(m, attnd_warp_max(sc));
        const float mu = attnd_softmax_safe_max(mx);
        const float alpha = attnd_exp2(m - mu);
        const float pj = attnd_exp2(sc - mu); // 0 for a masked key
        l = l * alpha + attnd_warp_sum(pj);
        m = mx;
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[i] *= alpha;
            // P.V: key j of the chunk goes to lane group j % KG
#pragma unroll 4
        for (int j0 = 0; j0 < 32; j0 += KG) {
            const int src = j0 + grp;
            const float pw = __shfl_sync(0xffffffffu, pj, src);
            const int kj = __shfl_sync(0xffffffffu, key, src);
            if (kj >= 0 && cl < nch) {
                const uint4 w = __ldg((const uint4 *)(vb + (int64_t)kj * p.v_sr) + cl);
                float f[8];
                attnd_unpack8<BF>(w, f);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    o[i] = fmaf(pw, f[i], o[i]);
            }
        }
    }
    // lane groups -> lanes 0..LPR-1, then the four warps
    for (int off = LPR; off < 32; off <<= 1)
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[i] += __shfl_xor_sync(0xffffffffu, o[i], off);
    if (lane == 0) {
        red_m[warp] = m;
        red_l[warp] = l;
    }
    if (grp == 0 && cl < nch)
#pragma unroll
        for (int i = 0; i < 8; i++)
            red_o[warp][cl * 8 + i] = o[i];
    __syncthreads();
    float mall = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTND_BSD_THREADS / 32; w++)
        mall = fmaxf(mall, red_m[w]);
    const float mu = attnd_softmax_safe_max(mall);
    float fw[ATTND_BSD_THREADS / 32], lall = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTND_BSD_THREADS / 32; w++) {
        fw[w] = attnd_exp2(red_m[w] - mu);
        lall += fw[w] * red_l[w];
    }
    const float inv = lall > 0.0f ? p.out_mul / lall : 0.0f;
    const int64_t orow = (int64_t)q_start * p.o_sr + (int64_t)h * p.o_sh;
    for (int c = tid; c < d; c += ATTND_BSD_THREADS) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTND_BSD_THREADS / 32; w++)
            acc = fmaf(fw[w], red_o[w][c], acc);
        attnd_st_elem(p.out, p.out_dt, orow + c, acc * inv);
    }
}

#endif
