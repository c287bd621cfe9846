// The sm90 core of paged prefill (sm_90a): the FlashAttention-3 recipe on the block-table cache.
//
// One persistent CTA per SM, three warpgroups. Warpgroup 0 is the producer: its first warp reads
// the block table and issues one TMA box per (page, 64-column slab) of each K and V tile into a
// ring of shared-memory stages (128-byte swizzle, completion on mbarriers); V rows at or
// past the sequence's end are written by that warp itself (valid rows of a partial last page
// loaded, the rest zeros), so P = 0 never meets garbage. Warpgroups 1 and 2 are consumers, 64
// packed rows each (paged/rows.cuh): they load their Q rows into shared memory (converted to the
// compute type), then per K/V tile run S = Q K^T as wgmma from shared memory, the online softmax
// in registers (log2 domain, as the sm80 core), and O += P V with P from registers. Each
// consumer overlaps the softmax of tile j with its own P V of tile j + 1 (issued together with
// Q K^T of tile j), and the two consumers take turns issuing their GEMMs (named barriers), so one
// warpgroup's softmax runs under the other's matrix work. Tiles go from the last K/V tile down,
// so the masked diagonal comes first. The producer's registers go to the consumers (setmaxnreg).
//
// Work: tiles of 128 packed rows x one kv head. The (sequence, kv head) pairs are cut into
// sections whose K/V fit two thirds of the L2 together; within a section tiles go heaviest first
// (the last q-block of every pair, then the one before, ...), and the whole order is dealt to the
// CTAs in a snake, so the CTAs running at once share their K/V through the L2.
#ifndef ATTND_CUDA_PAGED_MAINLOOP_SM90_CUH
#define ATTND_CUDA_PAGED_MAINLOOP_SM90_CUH

#include <cuda.h>
#include <stdint.h>

#include "paged/epilogue.cuh"
#include "paged/launch.h"
#include "prims/sm80.cuh"
#include "prims/sm90.cuh"

// DEEP_K: one more K stage than V stages where shared memory allows (head 128), so the K tile a
// new work tile starts with is in flight earlier.
// SINKS: the epilogue folds each head's sink in (an instantiation of its own, so that the core
// without sinks keeps its plain epilogue).
template <int D_PAD_, int KV_, bool DEEP_K = true, bool SINKS = false>
struct attnd_paged_sm90_traits {
    static constexpr int D_PAD = D_PAD_; // head size padded: 64, 128 or 256
    static constexpr int KV = KV_;
    static constexpr bool HAS_SINKS = SINKS;
    typedef typename attnd_select<KV == ATTND_KV_BF16, __nv_bfloat16, __half>::type TC;

    static constexpr int THREADS = 384; // producer warpgroup + two consumer warpgroups
    static constexpr int BLOCK_M = 128; // packed rows per tile, 64 per consumer
    static constexpr int BLOCK_N = D_PAD <= 128 ? 128 : 64;
    static constexpr int NSTAGES = D_PAD <= 64 ? 4 : 2;                        // V stages
    static constexpr int KSTAGES = NSTAGES + (DEEP_K && D_PAD == 128 ? 1 : 0); // K stages
    static constexpr int SLABS = D_PAD / 64;       // 64-column slabs of a row
    static constexpr int KSTEPS = D_PAD / 16;      // k16 steps of Q K^T
    static constexpr int SR = BLOCK_N / 8;         // S chunks of 8 columns
    static constexpr int OH = D_PAD > 128 ? 2 : 1; // P V products of n <= 128 per k step
    static constexpr int ON = D_PAD / 8 / OH;      // O chunks of 8 columns per product
    static constexpr int Q_WG_BYTES = 64 * D_PAD * 2;
    static constexpr int QBUF = D_PAD <= 128 ? 2 : 1; // Q buffers: the next tile's loads early
    static constexpr int SLAB_BYTES = BLOCK_N * 128;
    static constexpr int STAGE_BYTES = SLABS * SLAB_BYTES;
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + 2 * QBUF * Q_WG_BYTES;
    static constexpr int V_OFF = K_OFF + KSTAGES * STAGE_BYTES;
    static constexpr int BAR_OFF = V_OFF + NSTAGES * STAGE_BYTES;
    static constexpr int SMEM_BYTES = BAR_OFF + 4 * KSTAGES * 8 + 1024; // + base alignment
    static constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;

    static_assert(D_PAD == 64 || D_PAD == 128 || D_PAD == 256, "padded head size");
    static_assert(ON == 8 || ON == 16, "wgmma n64 / n128");
    static_assert(SR == 8 || SR == 16, "wgmma n64 / n128");
    static_assert(BLOCK_N % 64 == 0 && BLOCK_N / 16 <= 32, "whole pages, one lane each");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 65536, "register file");
};

// One tile of work: 128 packed rows of a sequence (one kv head) and its K/V tiles jlo..jhi.
struct attnd_sm90_tile {
    int seq, kvh, row0, rows_total, q_start, ctx, seq_len, jlo, jhi;
};

// Tile t of the enumeration: section t / (section * m_rounds), then round r (the r-th q-block
// from the end of each pair), then the pair. False when that sequence has fewer q-blocks.
template <class Tr>
__device__ __forceinline__ bool attnd_sm90_tile_at(const attnd_paged_kargs &a, int t,
                                                   attnd_sm90_tile *w)
{
    const int H = (int)a.p.k_cache.shape[2], S = (int)a.p.seq_lens.shape[0], g = a.group;
    const int Z = a.section, per = Z * a.m_rounds, sec = t / per;
    const int zs = min(Z, S * H - sec * Z), within = t - sec * per;
    const int r = within / zs, pair = sec * Z + within % zs;
    w->seq = pair / H;
    w->kvh = pair % H;
    const attnd_paged_seq s = attnd_paged_seq_at(a, w->seq);
    w->rows_total = s.q_len * g;
    const int qb = (w->rows_total + Tr::BLOCK_M - 1) / Tr::BLOCK_M - 1 - r;
    if (qb < 0) return false;
    w->row0 = qb * Tr::BLOCK_M;
    w->q_start = s.q_start;
    w->ctx = s.ctx;
    w->seq_len = s.seq_len;
    const int row_last = min(w->row0 + Tr::BLOCK_M, w->rows_total) - 1;
    int lo, hi;
    attnd_paged_range(a, s.seq_len, s.ctx + w->row0 / g, s.ctx + row_last / g, 0, &lo, &hi);
    w->jlo = lo < hi ? lo / Tr::BLOCK_N : 0;
    w->jhi = lo < hi ? (hi - 1) / Tr::BLOCK_N : -1;
    return true;
}

// The k-th tile index of this CTA (snake order over rounds of gridDim.x), or -1 past the end.
__device__ __forceinline__ int attnd_sm90_tile_index(int k, int total)
{
    const int G = gridDim.x, b = blockIdx.x;
    const int t = k * G + ((k & 1) ? G - 1 - b : b);
    return t < total ? t : -1;
}

#ifdef ATTND_SM90A_DEVICE

// Shared-memory addresses of a CTA's stages and barriers.
template <class Tr> struct attnd_sm90_smem {
    uint32_t base;
    __device__ __forceinline__ uint32_t q(int wg, int buf) const
    {
        return base + Tr::Q_OFF + (buf * 2 + wg) * Tr::Q_WG_BYTES;
    }
    __device__ __forceinline__ uint32_t k(int st) const
    {
        return base + Tr::K_OFF + st * Tr::STAGE_BYTES;
    }
    __device__ __forceinline__ uint32_t v(int st) const
    {
        return base + Tr::V_OFF + st * Tr::STAGE_BYTES;
    }
    __device__ __forceinline__ uint32_t full_k(int st) const
    {
        return base + Tr::BAR_OFF + 8 * st;
    }
    __device__ __forceinline__ uint32_t full_v(int st) const
    {
        return full_k(Tr::KSTAGES + st);
    }
    __device__ __forceinline__ uint32_t empty_k(int st) const
    {
        return full_k(2 * Tr::KSTAGES + st);
    }
    __device__ __forceinline__ uint32_t empty_v(int st) const
    {
        return full_k(3 * Tr::KSTAGES + st);
    }
};

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled slab.
__device__ __forceinline__ uint32_t attnd_slab_off(int r, int c)
{
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

// ------------------------------------------------------------------ producer (one warp)

template <class Tr> struct attnd_sm90_producer {
    const attnd_paged_kargs &a;
    const CUtensorMap *tk, *tv;
    attnd_sm90_smem<Tr> sm;
    int lane;
    uint32_t nk = 0, nv = 0; // K and V tiles issued so far (ring position and phase)

    // This lane's page of tile j: present (it holds keys of the sequence) and its id (ids
    // outside the pool read as zeros: the TMA fills out-of-bounds boxes).
    __device__ __forceinline__ bool page(const attnd_sm90_tile &w, const int32_t *bt, int j,
                                         int *pid) const
    {
        const int tok0 = j * Tr::BLOCK_N + (lane << a.bs_log2);
        *pid = 0;
        if (lane >= (Tr::BLOCK_N >> a.bs_log2) || tok0 >= w.seq_len) return false;
        *pid = __ldg(bt + (int64_t)(tok0 >> a.bs_log2) * a.p.block_tables.strides[1]);
        return true;
    }

    // TMA of this lane's page (all slabs) into stage buffer dst, completing on bar.
    __device__ __forceinline__ void issue(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                          int kvh, int pid) const
    {
        const uint32_t d = dst + (uint32_t)(lane << a.bs_log2) * 128;
#pragma unroll
        for (int s = 0; s < Tr::SLABS; s++)
            attnd_tma_load4(d + s * Tr::SLAB_BYTES, tm, bar, 64 * s, kvh, 0, pid);
    }

    __device__ __forceinline__ void load_k(const attnd_sm90_tile &w, const int32_t *bt, int j)
    {
        const int st = nk % Tr::KSTAGES, ph = (nk / Tr::KSTAGES) & 1;
        nk++;
        attnd_mbar_wait(sm.empty_k(st), ph ^ 1);
        int pid;
        const bool present = page(w, bt, j, &pid);
        const int n = __popc(__ballot_sync(0xffffffffu, present));
        if (lane == 0)
            attnd_mbar_arrive_tx(sm.full_k(st), (uint32_t)(n * Tr::SLABS * 128) << a.bs_log2);
        __syncwarp();
        if (present) issue(tk, sm.k(st), sm.full_k(st), w.kvh, pid);
    }

    // V rows from r0 on (r0: the first row of the first page not wholly inside the sequence):
    // the partial page's valid rows from memory, everything else zeros.
    __device__ __forceinline__ void fill_v_tail(const attnd_sm90_tile &w, uint32_t dst, int j,
                                                int r0, int pid_partial) const
    {
        const attnd_tensor &v = a.p.v_cache;
        const int t0 = j * Tr::BLOCK_N, valid = min(w.seq_len - t0 - r0, 1 << a.bs_log2);
        const bool ok = (unsigned)pid_partial < (unsigned)a.nblocks32;
        const int d_act = (int)a.p.q.shape[2];
        const int chunks = (Tr::BLOCK_N - r0) * Tr::SLABS * 8;
#pragma unroll 1
        for (int c = lane; c < chunks; c += 32) {
            const int r = r0 + c / (Tr::SLABS * 8), rem = c % (Tr::SLABS * 8);
            const int s = rem >> 3, cc = rem & 7, col = 64 * s + 8 * cc;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (ok && r - r0 < valid && col < d_act)
                x = __ldg((const uint4 *)((const uint16_t *)v.data +
                                          (int64_t)pid_partial * v.strides[0] +
                                          (int64_t)(r - r0) * v.strides[1] +
                                          (int64_t)w.kvh * v.strides[2] + col));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst + s * Tr::SLAB_BYTES +
                                                                          attnd_slab_off(r, cc)),
                         "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w)
                         : "memory");
        }
        attnd_fence_proxy_async();
    }

    __device__ __forceinline__ void load_v(const attnd_sm90_tile &w, const int32_t *bt, int j)
    {
        const int st = nv % Tr::NSTAGES, ph = (nv / Tr::NSTAGES) & 1;
        nv++;
        attnd_mbar_wait(sm.empty_v(st), ph ^ 1);
        const int t0 = j * Tr::BLOCK_N, bs = 1 << a.bs_log2;
        int pid;
        const bool whole = page(w, bt, j, &pid) && t0 + (lane + 1) * bs <= w.seq_len;
        const int n = __popc(__ballot_sync(0xffffffffu, whole));
        const int r0 = n * bs; // pages before r0 lie wholly inside the sequence
        const int pid_partial = __shfl_sync(0xffffffffu, pid, n & 31);
        if (r0 < Tr::BLOCK_N) fill_v_tail(w, sm.v(st), j, r0, pid_partial);
        __syncwarp();
        if (lane == 0)
            attnd_mbar_arrive_tx(sm.full_v(st), (uint32_t)(n * Tr::SLABS * 128) << a.bs_log2);
        __syncwarp();
        if (whole) issue(tv, sm.v(st), sm.full_v(st), w.kvh, pid);
    }

    // K of tile jhi first, then K of j - 1 ahead of V of j (the consumers' order).
    __device__ __forceinline__ void run(int total)
    {
        for (int k = 0;; k++) {
            const int t = attnd_sm90_tile_index(k, total);
            if (t < 0) break;
            attnd_sm90_tile w;
            if (!attnd_sm90_tile_at<Tr>(a, t, &w) || w.jhi < w.jlo) continue;
            const int32_t *bt = (const int32_t *)a.p.block_tables.data +
                                (int64_t)w.seq * a.p.block_tables.strides[0];
            load_k(w, bt, w.jhi);
            for (int j = w.jhi - 1; j >= w.jlo; j--) {
                load_k(w, bt, j);
                load_v(w, bt, j + 1);
            }
            load_v(w, bt, w.jlo);
        }
    }
};

// ------------------------------------------------------------------ consumers

// This lane's two rows of a tile: positions, ALiBi slopes, and its warp's position range.
struct attnd_sm90_rows {
    int idx0, pos[2], wpos_min, wpos_max;
    float slope2[2];
    bool warp_rows;
};

// The accumulator and online-softmax state of this lane's rows.
template <class Tr> struct attnd_sm90_acc {
    float o[Tr::OH][Tr::ON][4];
    float m[2], l[2], alpha[2];
};

template <class Tr> struct attnd_sm90_consumer {
    typedef typename Tr::TC TC;
    const attnd_paged_kargs &a;
    attnd_sm90_smem<Tr> sm;
    int wg, wq, lane, ctid; // warpgroup (0, 1), warp in it, lane, thread in it
    uint32_t nk = 0, nv = 0;

    // This warpgroup's 64 Q rows -> Q buffer buf (compute type, zero past the rows / head).
    __device__ __forceinline__ void load_q(const attnd_sm90_tile &w, int buf) const
    {
        const int g = a.group, d_act = (int)a.p.q.shape[2];
        const uint32_t dst = sm.q(wg, buf);
        constexpr int QC = Tr::D_PAD / 8;
#pragma unroll 4
        for (int c = ctid; c < 64 * QC; c += 128) {
            const int r = c / QC, ch = c % QC, idx = w.row0 + wg * 64 + r;
            float f[8];
            if (idx < w.rows_total && ch * 8 < d_act) {
                const int tok = w.q_start + idx / g, head = w.kvh * g + idx % g;
                attnd_ld8(a.p.q.data, a.p.q.dtype,
                          (int64_t)tok * a.p.q.strides[0] + (int64_t)head * a.p.q.strides[1] +
                              ch * 8,
                          a.q_vec != 0, f);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++)
                    f[k] = 0.0f;
            }
            uint32_t u[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                u[k] = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f[2 * k]),
                                          attnd_tc<TC>::clamp(f[2 * k + 1]));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(
                             dst + (ch >> 3) * (64 * 128) + attnd_slab_off(r, ch & 7)),
                         "r"(u[0]), "r"(u[1]), "r"(u[2]), "r"(u[3])
                         : "memory");
        }
        attnd_fence_proxy_async();
    }

    // The same rows copied as they are (Q already in the compute type, 16-byte rows) with
    // cp.async: issued now, waited for when the tile starts.
    __device__ __forceinline__ void load_q_async(const attnd_sm90_tile &w, int buf) const
    {
        const int g = a.group, d_act = (int)a.p.q.shape[2];
        const uint32_t dst = sm.q(wg, buf);
        constexpr int QC = Tr::D_PAD / 8;
#pragma unroll 4
        for (int c = ctid; c < 64 * QC; c += 128) {
            const int r = c / QC, ch = c % QC, idx = w.row0 + wg * 64 + r;
            const bool ok = idx < w.rows_total && ch * 8 < d_act;
            const int tok = ok ? w.q_start + idx / g : 0, head = ok ? w.kvh * g + idx % g : 0;
            const uint16_t *src = (const uint16_t *)a.p.q.data + (int64_t)tok * a.p.q.strides[0] +
                                  (int64_t)head * a.p.q.strides[1] + (ok ? ch * 8 : 0);
            attnd_cp_async16(dst + (ch >> 3) * (64 * 128) + attnd_slab_off(r, ch & 7), src,
                             ok ? 16 : 0);
        }
    }

    // The next tile of this CTA with work, from enumeration position *k on (left at the one
    // after it); false past the end.
    __device__ __forceinline__ bool next_tile(int *k, int total, attnd_sm90_tile *w) const
    {
        for (;;) {
            const int t = attnd_sm90_tile_index((*k)++, total);
            if (t < 0) return false;
            if (attnd_sm90_tile_at<Tr>(a, t, w)) return true;
        }
    }

    // S = Q K^T over stage st with Q buffer qb (issued, not waited).
    __device__ __forceinline__ void gemm_qk(float (&s)[Tr::SR][4], int st, int qb) const
    {
#pragma unroll
        for (int kk = 0; kk < Tr::KSTEPS; kk++) {
            const uint32_t off = (uint32_t)(kk & 3) * 32; // k16 step within the slab's row
            const uint64_t da =
                attnd_wgmma_desc(sm.q(wg, qb) + (kk >> 2) * (64 * 128) + off, 16, 1024);
            const uint64_t db =
                attnd_wgmma_desc(sm.k(st) + (kk >> 2) * Tr::SLAB_BYTES + off, 16, 1024);
            attnd_wgmma<TC, Tr::SR>::ss(s, da, db, kk > 0);
        }
        attnd_wgmma_commit();
    }

    // O (+)= P V over stage st (issued, not waited); first: the tile's first product.
    __device__ __forceinline__ void gemm_pv(float (&o)[Tr::OH][Tr::ON][4],
                                            const uint32_t (&p)[Tr::BLOCK_N / 16][4], int st,
                                            bool first) const
    {
#pragma unroll
        for (int kk = 0; kk < Tr::BLOCK_N / 16; kk++)
#pragma unroll
            for (int h = 0; h < Tr::OH; h++) {
                const uint64_t db = attnd_wgmma_desc(
                    sm.v(st) + h * 2 * Tr::SLAB_BYTES + kk * 16 * 128, Tr::SLAB_BYTES, 1024);
                attnd_wgmma<TC, Tr::ON>::rs(o[h], p[kk], db, (first && kk == 0) ? 0 : 1);
            }
        attnd_wgmma_commit();
    }

    // One warp's lane-0 arrival (the barriers count 8 consumer warps).
    __device__ __forceinline__ void release(uint32_t bar) const
    {
        if (lane == 0) attnd_mbar_arrive(bar);
    }

    // This lane's rows of tile w (idx0 and idx0 + 8) and its warp's position range.
    __device__ __forceinline__ void rows_of(const attnd_sm90_tile &w, attnd_sm90_rows &r) const
    {
        const int g = a.group, wrow0 = w.row0 + wg * 64 + wq * 16;
        r.idx0 = wrow0 + (lane >> 2);
#pragma unroll
        for (int i = 0; i < 2; i++)
            attnd_paged_row(a, r.idx0 + 8 * i, w.rows_total, w.ctx, w.kvh, &r.pos[i], &r.slope2[i]);
        r.warp_rows = wrow0 < w.rows_total;
        r.wpos_min = w.ctx + wrow0 / g;
        r.wpos_max = w.ctx + min(wrow0 + 15, w.rows_total - 1) / g;
    }

    // Scores of K/V tile j -> logits (log2 domain, masked where needed) -> probabilities in s;
    // the rows' maxima and sums updated, acc.alpha: the factor O still has to be rescaled by.
    __device__ __forceinline__ void softmax(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                            int j, float (&s)[Tr::SR][4], attnd_sm90_acc<Tr> &acc)
    {
        constexpr int SR = Tr::SR;
        const int t0 = j * Tr::BLOCK_N, t4 = lane & 3, sw = a.p.sliding_window;
        const bool need_mask =
            !r.warp_rows ||
            !attnd_paged_unmasked(t0, t0 + Tr::BLOCK_N, w.seq_len, r.wpos_min, r.wpos_max, sw);
        float c = a.qk_scale_log2;
        if (!a.plain) {
            c = 1.0f;
            const float cap = a.p.softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
#pragma unroll
            for (int n = 0; n < SR; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int ps = r.pos[e >> 1], tt = t0 + n * 8 + 2 * t4 + (e & 1);
                    float x = s[n][e] * a.qk_scale;
                    if (cap > 0.0f) x = cap * attnd_tanh(x * inv_cap);
                    x = x * ATTND_LOG2E + r.slope2[e >> 1] * (float)(tt - ps);
                    if (need_mask && !attnd_paged_visible(tt, ps, w.seq_len, sw))
                        x = attnd_neg_inf();
                    s[n][e] = x;
                }
        } else if (need_mask) {
#pragma unroll
            for (int n = 0; n < SR; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tt = t0 + n * 8 + 2 * t4 + (e & 1);
                    if (!attnd_paged_visible(tt, r.pos[e >> 1], w.seq_len, sw))
                        s[n][e] = attnd_neg_inf();
                }
        }
        float mx[2] = {attnd_neg_inf(), attnd_neg_inf()}, ms[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < SR; n++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float m_new = fmaxf(acc.m[i], attnd_quad_max(mx[i]) * c);
            ms[i] = attnd_softmax_safe_max(m_new);
            acc.alpha[i] = acc.m[i] == attnd_neg_inf() ? 1.0f : attnd_exp2(acc.m[i] - ms[i]);
            acc.m[i] = m_new;
        }
#pragma unroll
        for (int n = 0; n < SR; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = attnd_exp2(fmaf(s[n][e], c, -ms[e >> 1]));
                rs[e >> 1] += s[n][e];
            }
        acc.l[0] = acc.l[0] * acc.alpha[0] + rs[0];
        acc.l[1] = acc.l[1] * acc.alpha[1] + rs[1];
    }

    // Probabilities -> the A fragments of P V (compute type).
    static __device__ __forceinline__ void to_p(const float (&s)[Tr::SR][4],
                                                uint32_t (&pf)[Tr::BLOCK_N / 16][4])
    {
#pragma unroll
        for (int kk = 0; kk < Tr::BLOCK_N / 16; kk++) {
            pf[kk][0] = attnd_tc<TC>::pack(s[2 * kk][0], s[2 * kk][1]);
            pf[kk][1] = attnd_tc<TC>::pack(s[2 * kk][2], s[2 * kk][3]);
            pf[kk][2] = attnd_tc<TC>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pf[kk][3] = attnd_tc<TC>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    }

    // O *= alpha, skipped when no row of the warp moved its maximum.
    static __device__ __forceinline__ void rescale_o(attnd_sm90_acc<Tr> &acc)
    {
        if (!__any_sync(0xffffffffu, acc.alpha[0] != 1.0f || acc.alpha[1] != 1.0f)) return;
#pragma unroll
        for (int h = 0; h < Tr::OH; h++)
#pragma unroll
            for (int n = 0; n < Tr::ON; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc.o[h][n][e] *= acc.alpha[e >> 1];
    }

    __device__ __forceinline__ void fence_o(attnd_sm90_acc<Tr> &acc) const
    {
#pragma unroll
        for (int h = 0; h < Tr::OH; h++)
            attnd_fence_regs(acc.o[h]);
    }

    // The K/V tiles of w, last first, with Q buffer qb: the first tile's Q K^T and softmax, then
    // per tile Q K^T of j with P V of j + 1 in flight, then the last P V.
    __device__ __forceinline__ void mainloop(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                             int qb, bool pingpong, attnd_sm90_acc<Tr> &acc)
    {
        float s[Tr::SR][4];
        uint32_t pf[Tr::BLOCK_N / 16][4];
        {
            const int st = nk % Tr::KSTAGES;
            attnd_mbar_wait(sm.full_k(st), (nk / Tr::KSTAGES) & 1);
            attnd_wgmma_fence();
            gemm_qk(s, st, qb);
            attnd_wgmma_wait<0>();
            attnd_fence_regs(s);
            release(sm.empty_k(st));
            nk++;
            softmax(w, r, w.jhi, s, acc);
            to_p(s, pf);
        }
        bool first_pv = true;
        for (int j = w.jhi - 1; j >= w.jlo; j--) {
            const int sk = nk % Tr::KSTAGES, sv = nv % Tr::NSTAGES;
            attnd_mbar_wait(sm.full_k(sk), (nk / Tr::KSTAGES) & 1);
            if (pingpong) attnd_bar_sync(1 + wg, 256); // this warpgroup's turn
            attnd_wgmma_fence();
            gemm_qk(s, sk, qb);
            attnd_mbar_wait(sm.full_v(sv), (nv / Tr::NSTAGES) & 1);
            gemm_pv(acc.o, pf, sv, first_pv);
            if (pingpong) attnd_bar_arrive(2 - wg, 256); // the other's turn
            first_pv = false;
            attnd_wgmma_wait<1>();
            attnd_fence_regs(s);
            release(sm.empty_k(sk));
            nk++;
            softmax(w, r, j, s, acc);
            attnd_wgmma_wait<0>();
            fence_o(acc);
            attnd_fence_regs(pf);
            release(sm.empty_v(sv));
            nv++;
            rescale_o(acc);
            to_p(s, pf);
        }
        const int sv = nv % Tr::NSTAGES;
        attnd_mbar_wait(sm.full_v(sv), (nv / Tr::NSTAGES) & 1);
        attnd_wgmma_fence();
        gemm_pv(acc.o, pf, sv, first_pv);
        attnd_wgmma_wait<0>();
        fence_o(acc);
        release(sm.empty_v(sv));
        nv++;
    }

    __device__ __forceinline__ void run(int total, int off);
};

// Every tile of this CTA: Q rows in (copied a tile ahead where they are in the compute type),
// the main loop, the rows out.
template <class Tr> __device__ __forceinline__ void attnd_sm90_consumer<Tr>::run(int total, int off)
{
    const bool pingpong = !(off & ATTND_SM90_NO_PINGPONG);
    const int tc_dt = Tr::KV == ATTND_KV_BF16 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16;
    const bool qpf =
        Tr::QBUF == 2 && a.p.q.dtype == tc_dt && a.q_vec && !(off & ATTND_SM90_NO_QPREFETCH);
    if (pingpong && wg == 0) attnd_bar_arrive(1, 256); // warpgroup 0 issues first

    int k = 0, qb = 0;
    attnd_sm90_tile w, wn;
    bool have = next_tile(&k, total, &w);
    if (have && qpf) {
        load_q_async(w, 0);
        attnd_cp_async_commit();
    }
    for (; have; w = wn, qb = qpf ? qb ^ 1 : 0) {
        const bool have_next = next_tile(&k, total, &wn);
        attnd_sm90_rows r;
        rows_of(w, r);
        attnd_sm90_acc<Tr> acc;
#pragma unroll
        for (int h = 0; h < Tr::OH; h++)
#pragma unroll
            for (int n = 0; n < Tr::ON; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc.o[h][n][e] = 0.0f;
        acc.m[0] = acc.m[1] = attnd_neg_inf();
        acc.l[0] = acc.l[1] = 0.0f;
        // this warpgroup's last Q K^T of the previous tile is done: its Q buffer is free
        attnd_bar_sync(3 + wg, 128);
        if (qpf) {
            if (have_next) load_q_async(wn, qb ^ 1);
            attnd_cp_async_commit();
        }
        have = have_next;
        if (w.jhi >= w.jlo) { // else no key to see (inconsistent lengths): zeros, LSE -inf
            if (qpf) {
                attnd_cp_async_wait<1>(); // this tile's rows (the next tile's may be in flight)
                attnd_fence_proxy_async();
            } else {
                load_q(w, qb);
            }
            attnd_bar_sync(3 + wg, 128);
            mainloop(w, r, qb, pingpong, acc);
        }
        attnd_paged_store_rows_as<Tr::OH * Tr::ON, Tr::HAS_SINKS>(
            a, [&](int n, int e) { return acc.o[n / Tr::ON][n % Tr::ON][e]; }, acc.m, acc.l, r.idx0,
            w.rows_total, w.q_start, w.kvh, lane & 3);
    }
}

#endif // ATTND_SM90A_DEVICE

// The kernel: grid = persistent CTAs (at most one per SM), THREADS threads, SMEM_BYTES dynamic
// shared memory; tk / tv: 4D tensor maps of k_cache / v_cache (launch.cu).
template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, 1)
    attnd_paged_sm90_kernel(const __grid_constant__ attnd_paged_kargs a,
                            const __grid_constant__ CUtensorMap tk,
                            const __grid_constant__ CUtensorMap tv, int total, int off)
{
#ifdef ATTND_SM90A_DEVICE
    extern __shared__ __align__(1024) unsigned char attnd_smem[];
    attnd_sm90_smem<Tr> sm;
    sm.base = (attnd_smem_addr(attnd_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int st = 0; st < Tr::KSTAGES; st++) {
            attnd_mbar_init(sm.full_k(st), 1);
            attnd_mbar_init(sm.empty_k(st), 8);
        }
        for (int st = 0; st < Tr::NSTAGES; st++) {
            attnd_mbar_init(sm.full_v(st), 1);
            attnd_mbar_init(sm.empty_v(st), 8);
        }
        attnd_mbar_init_fence();
    }
    __syncthreads();
    if (warp < 4) {
        attnd_regs_dealloc<Tr::PRODUCER_REGS>();
        if (warp == 0) {
            if (lane == 0) {
                attnd_tma_prefetch(&tk);
                attnd_tma_prefetch(&tv);
            }
            attnd_sm90_producer<Tr> pr{a, &tk, &tv, sm, lane};
            pr.run(total);
        }
    } else {
        attnd_regs_alloc<Tr::CONSUMER_REGS>();
        const int ct = tid - 128;
        attnd_sm90_consumer<Tr> co{a, sm, ct >> 7, (ct >> 5) & 3, lane, ct & 127};
        co.run(total, off);
    }
#else
    __trap(); // not built for sm_90a: the host never launches this
#endif
}

#endif
