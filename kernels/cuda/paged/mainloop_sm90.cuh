// The sm90 core of paged prefill (sm_90a): the FlashAttention-3 recipe on the block-table cache.
//
// One persistent CTA per SM, three warpgroups. Warpgroup 0 is the producer: its first warp reads
// the block table and issues one TMA box per (page, 64-column slab) of each K and V tile (one per
// slab where the tile's pages are one run of consecutive block ids) into a ring of shared-memory
// stages (128-byte swizzle, completion on mbarriers); V rows at or past the sequence's end are
// written by that warp itself (valid rows of a partial last page loaded, the rest zeros), so
// P = 0 never meets garbage. A paged 16-bit cache splits that work: warp 0 issues K, warp 1 V
// (with shuffled block tables one warp issuing 32 boxes a step limited the kernel). In the plain
// kernel warp 2 publishes each work tile (its descriptor, and its Q rows by TMA) into the Q
// buffers, and the consumers and the producer warps take their tiles from there instead of each
// walking the enumeration (the consumers do not copy Q either). Warpgroups 1 and 2 are consumers,
// 64 packed rows each (paged/rows.cuh): elsewhere they look their tiles up and load their Q rows
// into shared memory themselves (converted to the compute type); then per K/V tile they run
// S = Q K^T as wgmma from shared memory, the online softmax in registers (log2 domain, as the sm80
// core), and O += P V with P from registers. Each consumer overlaps the softmax of tile j with its
// own P V of tile j + 1 (issued together with Q K^T of tile j), and the two consumers take turns
// issuing their GEMMs (named barriers), so one warpgroup's softmax runs under the other's matrix
// work. Tiles go from the last K/V tile down, so the masked diagonal comes first. The producer's
// registers go to the consumers (setmaxnreg).
//
// Work: tiles of 128 packed rows x one kv head. The (sequence, kv head) pairs are cut into
// sections whose K/V fit two thirds of the L2 together; within a section tiles go heaviest first
// (the last q-block of every pair, then the one before, ...), and the whole order is dealt to the
// CTAs in a snake, so the CTAs running at once share their K/V through the L2.
//
// fp8 K/V (Tr::FP8: a paged fp8 cache, or varlen's fp8 inputs): the producer's TMA brings each K
// or V tile's e4m3 rows into a ring of raw tiles, with a descriptor (K or V, that ring's count,
// rows inside the sequence); the producer warpgroup's other three warps convert them into the
// same f16 stages the consumers read for a 16-bit cache (exact; rows past the sequence zeros), so
// the consumers run unchanged in f16 (k_scale in the logits' scale, v_scale in the output's;
// bf16 or fp8 Q converted to f16 in shared memory; varlen quantises P to fp8 as the seed does).
//
// The same core runs varlen and block-sparse prefill (paged/src_sm90.h, Tr::MODE): K/V rows of a
// contiguous tensor in TMA pages that start at any row (varlen: the sequence's keys; sparse: the
// key blocks the work tile's layout rows list, gathered by the producer into one virtual key
// sequence, each virtual key's position and layout-row mask handed to the consumers beside the
// K stage). A sparse work tile is 128 rows of one q head (layouts differ per q head).
#ifndef ATTND_CUDA_PAGED_MAINLOOP_SM90_CUH
#define ATTND_CUDA_PAGED_MAINLOOP_SM90_CUH

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "paged/epilogue.cuh"
#include "paged/launch.h"
#include "paged/src_sm90.h"
#include "prims/sm80.cuh"
#include "prims/sm90.cuh"

// One tile of work: 128 packed rows of a sequence (one kv head) and its K/V tiles jlo..jhi.
// kvh: the kv head (sparse: the q head; kv_src is the kv head K/V come from); k_start: the
// sequence's first key row (contiguous sources).
struct attnd_sm90_tile {
    int seq, kvh, kv_src, row0, rows_total, q_start, ctx, seq_len, jlo, jhi, k_start;
};

// DEEP: where shared memory has room for a third stage (head 128): 0 none, ATTND_SM90_DEEP_K a
// third K stage (the K tile a new work tile starts with in flight earlier), ATTND_SM90_DEEP_V a
// third V stage (a V stage is held until its P V is done, a K stage only until its Q K^T is).
// SINKS: the epilogue folds each head's sink in (an instantiation of its own, so that the core
// without sinks keeps its plain epilogue).
// MODE: where K/V come from (ATTND_SRC_*).
// PLAIN: no softcap, no ALiBi (kargs.plain) and none of the measurement switches that change the
// loop (exact mask, early P V wait, lower bound, slow epilogue, early store): their code left out
// of the loop body at compile time (the instantiation launched when they are all off), and no
// chained work tiles (each tile's rows stored after its main loop).
enum { ATTND_SM90_DEEP_NONE = 0, ATTND_SM90_DEEP_K = 1, ATTND_SM90_DEEP_V = 2 };
template <int D_PAD_, int KV_, int DEEP = ATTND_SM90_DEEP_V, bool SINKS = false,
          int MODE_ = ATTND_SRC_PAGED, bool PLAIN_ = false>
struct attnd_paged_sm90_traits {
    static constexpr int D_PAD = D_PAD_; // head size padded: 64, 128 or 256
    static constexpr int KV = KV_;
    static constexpr int MODE = MODE_;
    static constexpr bool SPARSE = MODE == ATTND_SRC_SPARSE;
    static constexpr bool HAS_SINKS = SINKS;
    static constexpr bool PLAIN = PLAIN_;
    // fp8 K/V (a paged cache, or varlen's inputs): TMA brings each K/V tile's e4m3 rows into a
    // raw ring, the producer warpgroup's other three warps convert them into the f16 stages the
    // consumers read
    static constexpr bool FP8 = KV == ATTND_KV_FP8;
    // varlen with fp8 inputs: P quantised to fp8 (p * p_descale) before P V, as the seed does
    // (the f16 P V of those values is the fp8 product, exactly)
    static constexpr bool QUANT_P = FP8 && MODE == ATTND_SRC_CONTIG;
    typedef typename attnd_select<KV == ATTND_KV_BF16, __nv_bfloat16, __half>::type TC;

    static constexpr int THREADS = 384; // producer warpgroup + two consumer warpgroups
    static constexpr int BLOCK_M = 128; // packed rows per tile, 64 per consumer
    static constexpr int BLOCK_N = attnd_sm90_block_n(D_PAD); // the run maps' boxes too
    static constexpr int BASE_STAGES = D_PAD <= 64 ? 4 : 2;
    static constexpr bool THIRD = !SPARSE && !FP8 && D_PAD == 128; // room for a third stage
    static constexpr int NSTAGES = BASE_STAGES + (THIRD && DEEP == ATTND_SM90_DEEP_V); // V stages
    static constexpr int KSTAGES = BASE_STAGES + (THIRD && DEEP == ATTND_SM90_DEEP_K);
    static constexpr int MSTAGES = KSTAGES > NSTAGES ? KSTAGES : NSTAGES; // barriers per kind
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
    static constexpr int RAW = FP8 ? 2 : 0;           // fp8: raw tiles in flight
    static constexpr int RAW_BYTES = BLOCK_N * D_PAD; // a tile's e4m3 rows, D_PAD bytes each
    static constexpr int CONVERTERS = 3;              // fp8: converting warps (full barriers)
    static constexpr int RAW_OFF = V_OFF + NSTAGES * STAGE_BYTES;
    static constexpr int BAR_OFF = RAW_OFF + RAW * RAW_BYTES;
    // sparse: per K stage, each virtual key's info (position | layout-row mask << 24) and a
    // header (tiles of the work tile, AND of the masks, largest position); the producer's
    // per-key-block row masks and gathered list (KB_MAX key blocks a sequence may have)
    static constexpr int KB_MAX = SPARSE ? 2048 : 0;
    static constexpr int KINFO_INTS = BLOCK_N + 4;
    static constexpr int KINFO_OFF = BAR_OFF + (4 * MSTAGES + 2 * RAW + 4) * 8; // + Q's (TMA_Q)
    static constexpr int KMASK_OFF = KINFO_OFF + (SPARSE ? KSTAGES * KINFO_INTS * 4 : 0);
    static constexpr int KLIST_OFF = KMASK_OFF + KB_MAX;
    static constexpr int ORDER_OFF = KLIST_OFF + KB_MAX * 4; // a word per consumer thread
    static constexpr int RDESC_OFF = ORDER_OFF + 256 * 4; // fp8: per raw tile (kind, count, rows)
    // Q by TMA (kargs.q_tma, the plain kernel with two Q buffers): warp 2 of the producer
    // warpgroup publishes each work tile (its descriptor and its Q rows) into the Q buffers in
    // turn; the consumers and the producer warps read the tile from there instead of looking it
    // up (the consumers instead of copying its rows too)
    static constexpr bool TMA_Q = PLAIN && !SPARSE && !FP8 && QBUF == 2;
    static constexpr int TDESC_OFF = RDESC_OFF + RAW * 16; // per Q buffer: its work tile
    static constexpr int SMEM_BYTES =
        TDESC_OFF + (TMA_Q ? 2 * (int)sizeof(attnd_sm90_tile) : 0) + 1024; // + alignment
    // the producer's page ids in registers (UNROLLED_TMA) spill at 24 registers; sparse keeps
    // the page loop and 24 / 240 (at 40 / 232 its kernels spilled 32-76 B)
    static constexpr bool UNROLLED_TMA = !SPARSE;
    // a K/V tile whose pages are one run (consecutive block ids, or contiguous rows) as one box
    // per slab from the run maps (sparse: the producer's 24 registers, the page loop kept)
    static constexpr bool RUNS = !SPARSE;
    // K and V issued by warps 0 and 1 (a paged 16-bit cache; contiguous K/V are two boxes a tile,
    // fp8's warps 1-3 convert, sparse's producer writes each K stage's key info)
    static constexpr bool SPLIT_KV = MODE == ATTND_SRC_PAGED && !FP8;
    // TMA_Q: the threads that read a Q buffer's tile descriptor, each arriving on its empty
    // barrier once done with it (every consumer thread, every lane of the producer warps)
    static constexpr int Q_READERS = 256 + 32 * (SPLIT_KV ? 2 : 1);
    // fp8: the producer warp and the converters at 40 spilled 24-68 B (the producer's values)
    static constexpr int PRODUCER_REGS = FP8 ? 56 : UNROLLED_TMA ? 40 : 24;
    static constexpr int CONSUMER_REGS = FP8 ? 224 : UNROLLED_TMA ? 232 : 240;

    static_assert(D_PAD == 64 || D_PAD == 128 || D_PAD == 256, "padded head size");
    static_assert(!FP8 || !SPARSE, "fp8: paged or varlen");
    static_assert(ON == 8 || ON == 16, "wgmma n64 / n128");
    static_assert(SR == 8 || SR == 16, "wgmma n64 / n128");
    static_assert(BLOCK_N % 64 == 0 && BLOCK_N / 16 <= 32, "whole pages, one lane each");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    // setmaxnreg moves registers within the CTA's launch allocation, at most 168 per thread at 384
    // threads (__launch_bounds__(384, 1)): 24 + 2 x 240 and 40 + 2 x 232 fit it exactly; 32 + 2 x
    // 240 would ask for more than the pool holds (the consumers' increase could not be granted)
    static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 65536 / THREADS / 8 * 8 * THREADS,
                  "register pool of the CTA");
};

// Sequence seq as the source gives it: contiguous keys from cu_k (bottom-right causal, or every
// key visible: ctx = seq_len), else the paged sequence.
template <class Tr>
__device__ __forceinline__ attnd_paged_seq attnd_sm90_seq_at(const attnd_paged_kargs &a,
                                                             const attnd_sm90_src &src, int seq,
                                                             int *k_start)
{
    *k_start = 0;
    if constexpr (Tr::MODE == ATTND_SRC_PAGED) {
        return attnd_paged_seq_at(a, seq);
    } else {
        const int64_t qs = a.p.query_start_loc.strides[0];
        const int32_t *qsl = (const int32_t *)a.p.query_start_loc.data;
        attnd_paged_seq s;
        s.q_start = qsl[seq * qs];
        s.q_len = qsl[(seq + 1) * qs] - s.q_start;
        *k_start = src.cu_k[seq * src.cu_k_st];
        s.seq_len = src.cu_k[(seq + 1) * src.cu_k_st] - *k_start;
        s.ctx = src.causal ? s.seq_len - s.q_len : s.seq_len;
        return s;
    }
}

// Tile t of the enumeration: section t / (section * m_rounds), then round r (the r-th q-block
// from the end of each pair), then the pair. False when that sequence has fewer q-blocks.
template <class Tr>
__device__ __forceinline__ bool
attnd_sm90_tile_at(const attnd_paged_kargs &a, const attnd_sm90_src &src, int t, attnd_sm90_tile *w)
{
    const int H = (int)a.p.k_cache.shape[2], S = (int)a.p.seq_lens.shape[0], g = a.group;
    const int Z = a.section, per = Z * a.m_rounds, sec = t / per;
    const int zs = min(Z, S * H - sec * Z), within = t - sec * per;
    const int r = within / zs, pair = sec * Z + within % zs;
    w->seq = pair / H;
    w->kvh = pair % H;
    w->kv_src = Tr::SPARSE ? w->kvh / src.kv_group : w->kvh;
    const attnd_paged_seq s = attnd_sm90_seq_at<Tr>(a, src, w->seq, &w->k_start);
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
    if (Tr::SPARSE) w->jlo = w->jhi = 0; // one K stage at least; its header says how many
    return true;
}

// The k-th tile index of this CTA (snake order over rounds of gridDim.x), or -1 past the end.
__device__ __forceinline__ int attnd_sm90_tile_index(int k, int total)
{
    const int G = gridDim.x, b = blockIdx.x;
    const int t = k * G + ((k & 1) ? G - 1 - b : b);
    return t < total ? t : -1;
}

// The next tile of this CTA with work, from enumeration position *k on (left at the one after
// it); false past the end.
template <class Tr>
__device__ __forceinline__ bool attnd_sm90_next_tile(const attnd_paged_kargs &a,
                                                     const attnd_sm90_src &src, int *k, int total,
                                                     attnd_sm90_tile *w)
{
    for (;;) {
        const int t = attnd_sm90_tile_index((*k)++, total);
        if (t < 0) return false;
        if (attnd_sm90_tile_at<Tr>(a, src, t, w)) return true;
    }
}

#ifdef ATTND_SM90A_DEVICE

// Shared-memory addresses of a CTA's stages and barriers.
template <class Tr> struct attnd_sm90_smem {
    uint32_t base;      // shared-state-space address (1024-aligned)
    unsigned char *gen; // the same byte as a generic pointer
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
        return full_k(Tr::MSTAGES + st);
    }
    __device__ __forceinline__ uint32_t empty_k(int st) const
    {
        return full_k(2 * Tr::MSTAGES + st);
    }
    __device__ __forceinline__ uint32_t empty_v(int st) const
    {
        return full_k(3 * Tr::MSTAGES + st);
    }
    // fp8: raw tile r, its barriers (full: the TMA's bytes; empty: the converters done with it)
    // and its descriptor
    __device__ __forceinline__ uint32_t raw(int r) const
    {
        return base + Tr::RAW_OFF + r * Tr::RAW_BYTES;
    }
    __device__ __forceinline__ uint32_t full_raw(int r) const
    {
        return full_k(4 * Tr::MSTAGES + r);
    }
    __device__ __forceinline__ uint32_t empty_raw(int r) const
    {
        return full_k(4 * Tr::MSTAGES + Tr::RAW + r);
    }
    __device__ __forceinline__ int4 *rdesc(int r) const
    {
        return (int4 *)(gen + Tr::RDESC_OFF) + r;
    }
    // TMA_Q: Q buffer b's barriers (full: its rows and work tile published; empty: its readers,
    // Tr::Q_READERS, done with them) and its work tile
    __device__ __forceinline__ uint32_t full_q(int b) const
    {
        return full_k(4 * Tr::MSTAGES + 2 * Tr::RAW + b);
    }
    __device__ __forceinline__ uint32_t empty_q(int b) const
    {
        return full_k(4 * Tr::MSTAGES + 2 * Tr::RAW + 2 + b);
    }
    __device__ __forceinline__ attnd_sm90_tile *tdesc(int b) const
    {
        return (attnd_sm90_tile *)(gen + Tr::TDESC_OFF) + b;
    }
    // sparse: generic pointers to the key info of K stage st, the block masks, the list
    __device__ __forceinline__ int32_t *kinfo(int st) const
    {
        return (int32_t *)(gen + Tr::KINFO_OFF) + st * Tr::KINFO_INTS;
    }
    __device__ __forceinline__ uint8_t *kmask(void) const
    {
        return (uint8_t *)(gen + Tr::KMASK_OFF);
    }
    __device__ __forceinline__ int32_t *klist(void) const
    {
        return (int32_t *)(gen + Tr::KLIST_OFF);
    }
};

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled slab.
__device__ __forceinline__ uint32_t attnd_slab_off(int r, int c)
{
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

// ------------------------------------------------------------------ producer (one warp)

static_assert(offsetof(attnd_sm90_maps, k_run) == 2 * sizeof(CUtensorMap) &&
                  offsetof(attnd_sm90_maps, v_run) == 3 * sizeof(CUtensorMap),
              "a map's run map two maps on");

template <class Tr> struct attnd_sm90_producer {
    const attnd_paged_kargs &a;
    const attnd_sm90_src &src;
    const CUtensorMap *tk, *tv; // K and V by page (each map's run map two maps on)
    attnd_sm90_smem<Tr> sm;
    int lane;
    uint32_t nk = 0, nv = 0;     // K and V tiles issued so far (ring position and phase)
    uint32_t nr = 0;             // fp8: raw tiles issued so far
    const int32_t *bt = nullptr; // paged: the work tile's block-table row
    int nvirt = 0;               // sparse: virtual keys of the work tile (gathered blocks x size)
    int kpid = 0, kvalid = 0;    // this lane's page of the last K tile (load_v of that tile)

    // Position of virtual key vk (sparse: through the gathered list; else vk itself).
    __device__ __forceinline__ int key_pos(int vk) const
    {
        if constexpr (Tr::SPARSE) {
            const int kb = sm.klist()[vk >> src.kb_log2] & 0xffffff;
            return (kb << src.kb_log2) + (vk & ((1 << src.kb_log2) - 1));
        } else {
            return vk;
        }
    }

    // This lane's page of tile j: present (it holds keys of the sequence), the id the TMA box
    // and the V tail take (paged: the block, ids outside the pool read as zeros; contiguous: the
    // first row) and its valid rows.
    __device__ __forceinline__ bool page(const attnd_sm90_tile &w, int j, int *pid,
                                         int *valid) const
    {
        const int v0 = j * Tr::BLOCK_N + (lane << a.bs_log2);
        *pid = 0;
        *valid = 0;
        if (lane >= (Tr::BLOCK_N >> a.bs_log2)) return false;
        if (Tr::SPARSE && v0 >= nvirt) return false;
        const int pos0 = key_pos(v0);
        if (pos0 >= w.seq_len) return false;
        *valid = min(1 << a.bs_log2, w.seq_len - pos0);
        if constexpr (Tr::MODE == ATTND_SRC_PAGED)
            *pid = __ldg(bt + (int64_t)(pos0 >> a.bs_log2) * a.p.block_tables.strides[1]);
        else
            *pid = w.k_start + pos0;
        return true;
    }

    // TMA of the tile's pages in mask (bit p: page p, its id in lane p's pid), all slabs, into
    // stage buffer dst, completing on bar. One elected lane issues every box, the ids broadcast
    // to the warp first, so the copy's operands are warp-uniform and sit in uniform registers;
    // each lane issuing its own page made ptxas serialise the lanes (per box an ELECT, two R2UR
    // and a branch), which kept the producer warp busy nearly all the time.
    // The ids of the first NP pages are all shuffled before the first box (lanes known at compile
    // time, so they stay in registers): in a loop over the mask each box waited on its own
    // SHFL -> R2UR chain. Pages past NP (contiguous pages under 16 rows) take the loop.
    // A tile whose pages are all present and one run (ascending block ids; contiguous rows page
    // after page) is one box per slab of the run map, tm + 2 (attnd_sm90_maps): 16 boxes of 16
    // rows per K or V tile at head 128 and block 16 become 2. The test runs in the elected lane
    // on the ids it holds anyway (a warp vote before it, or a runtime switch for it, made the
    // producer spill at 40 registers).
    __device__ __forceinline__ void issue(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                          int kvh, int pid, uint32_t mask) const
    {
        constexpr int NP = Tr::BLOCK_N / 16;
        if (Tr::UNROLLED_TMA && (mask >> NP) == 0) {
            int ids[NP];
#pragma unroll
            for (int p = 0; p < NP; p++)
                ids[p] = __shfl_sync(0xffffffffu, pid, p);
            if (attnd_elect_one()) {
                const int np = Tr::BLOCK_N >> a.bs_log2;
                bool run = Tr::RUNS && mask == (1u << np) - 1u; // contiguous: rows in order
#pragma unroll
                for (int p = 1; p < NP && Tr::MODE == ATTND_SRC_PAGED; p++)
                    run = run && (p >= np || ids[p] == ids[0] + p);
                if (run) {
                    issue_page(tm + 2, dst, bar, kvh, ids[0], 0);
                    return;
                }
#pragma unroll
                for (int p = 0; p < NP; p++)
                    if ((mask >> p) & 1) issue_page(tm, dst, bar, kvh, ids[p], p);
            }
            return;
        }
        while (mask) {
            const int p = __ffs(mask) - 1;
            mask &= mask - 1;
            const int id = __shfl_sync(0xffffffffu, pid, p);
            if (attnd_elect_one()) issue_page(tm, dst, bar, kvh, id, p);
        }
    }

    // Page p of the tile (id pid), every slab (fp8: one box of whole raw rows).
    __device__ __forceinline__ void issue_page(const CUtensorMap *tm, uint32_t dst, uint32_t bar,
                                               int kvh, int pid, int p) const
    {
        const int c2 = Tr::MODE == ATTND_SRC_PAGED ? 0 : pid;
        const int c3 = Tr::MODE == ATTND_SRC_PAGED ? pid : 0;
        if constexpr (Tr::FP8) {
            attnd_tma_load4(dst + (uint32_t)(p << a.bs_log2) * Tr::D_PAD, tm, bar, 0, kvh, c2, c3);
            return;
        }
        const uint32_t d = dst + (uint32_t)(p << a.bs_log2) * 128;
#pragma unroll
        for (int s = 0; s < Tr::SLABS; s++)
            attnd_tma_load4(d + s * Tr::SLAB_BYTES, tm, bar, 64 * s, kvh, c2, c3);
    }

    // fp8: K (is_v false) or V of tile j as e4m3 rows into the next raw tile, and its descriptor
    // for the converters: K or V, that ring's count, the tile's rows inside the sequence.
    __device__ __forceinline__ void load_raw(const attnd_sm90_tile &w, int j, bool is_v,
                                             bool same_k)
    {
        const int r = nr % Tr::RAW, ph = (nr / Tr::RAW) & 1;
        nr++;
        attnd_mbar_wait(sm.empty_raw(r), ph ^ 1);
        int pid = kpid, valid = kvalid;
        if (!is_v || !same_k) page(w, j, &pid, &valid);
        if (!is_v) kpid = pid, kvalid = valid;
        const uint32_t mask = __ballot_sync(0xffffffffu, valid > 0);
        const uint32_t cnt = is_v ? nv++ : nk++;
        if (lane == 0) {
            *sm.rdesc(r) =
                make_int4(is_v, (int)cnt, min(Tr::BLOCK_N, w.seq_len - j * Tr::BLOCK_N), 0);
            attnd_mbar_arrive_tx(sm.full_raw(r), (uint32_t)(__popc(mask) * Tr::D_PAD) << a.bs_log2);
        }
        __syncwarp();
        issue(is_v ? tv : tk, sm.raw(r), sm.full_raw(r), w.kv_src, pid, mask);
    }

    // fp8: the converters' end (a descriptor of kind -1, no bytes).
    __device__ __forceinline__ void end_raw(void)
    {
        const int r = nr % Tr::RAW, ph = (nr / Tr::RAW) & 1;
        attnd_mbar_wait(sm.empty_raw(r), ph ^ 1);
        if (lane == 0) {
            *sm.rdesc(r) = make_int4(-1, 0, 0, 0);
            attnd_mbar_arrive(sm.full_raw(r));
        }
    }

    __device__ __forceinline__ void load_k(const attnd_sm90_tile &w, int j, int ntiles)
    {
        if constexpr (Tr::FP8) return load_raw(w, j, false, false);
        const int st = nk % Tr::KSTAGES, ph = (nk / Tr::KSTAGES) & 1;
        nk++;
        attnd_mbar_wait(sm.empty_k(st), ph ^ 1);
        if constexpr (Tr::SPARSE) write_kinfo(w, st, j, ntiles);
        const bool present = page(w, j, &kpid, &kvalid);
        const uint32_t mask = __ballot_sync(0xffffffffu, present);
        const int n = __popc(mask);
        if (lane == 0)
            attnd_mbar_arrive_tx(sm.full_k(st), (uint32_t)(n * Tr::SLABS * 128) << a.bs_log2);
        __syncwarp();
        if (Tr::SPARSE && lane != 0) attnd_mbar_arrive(sm.full_k(st)); // each after its key info
        issue(tk, sm.k(st), sm.full_k(st), w.kv_src, kpid, mask);
    }

    // V rows from r0 on (r0: the first row of the first page not wholly inside the sequence):
    // the partial page's valid rows from memory, everything else zeros.
    __device__ __forceinline__ void fill_v_tail(const attnd_sm90_tile &w, uint32_t dst, int r0,
                                                int pid_partial, int valid) const
    {
        const attnd_tensor &v = a.p.v_cache;
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
                                          (int64_t)w.kv_src * v.strides[2] + col));
            attnd_st_shared16(dst + s * Tr::SLAB_BYTES + attnd_slab_off(r, cc), x);
        }
        attnd_fence_proxy_async();
    }

    // V of tile j; same_k: K of j was the last K issued, so its page ids (kpid, kvalid) stand
    // (valid 0: no page), and the block table is not read again.
    __device__ __forceinline__ void load_v(const attnd_sm90_tile &w, int j, bool same_k)
    {
        if constexpr (Tr::FP8) return load_raw(w, j, true, same_k);
        const int st = nv % Tr::NSTAGES, ph = (nv / Tr::NSTAGES) & 1;
        nv++;
        attnd_mbar_wait(sm.empty_v(st), ph ^ 1);
        int pid = kpid, valid = kvalid;
        if (!same_k) page(w, j, &pid, &valid);
        const bool whole = valid == (1 << a.bs_log2);
        const uint32_t mask = __ballot_sync(0xffffffffu, whole);
        const int n = __popc(mask);
        const int r0 = n << a.bs_log2; // pages before r0 lie wholly inside the sequence
        const int pid_partial = __shfl_sync(0xffffffffu, pid, n & 31);
        const int valid_partial = __shfl_sync(0xffffffffu, valid, n & 31);
        if (r0 < Tr::BLOCK_N) fill_v_tail(w, sm.v(st), r0, pid_partial, valid_partial);
        __syncwarp();
        if (lane == 0)
            attnd_mbar_arrive_tx(sm.full_v(st), (uint32_t)(n * Tr::SLABS * 128) << a.bs_log2);
        __syncwarp();
        issue(tv, sm.v(st), sm.full_v(st), w.kv_src, pid, mask);
    }

    __device__ __forceinline__ void write_kinfo(const attnd_sm90_tile &w, int st, int j,
                                                int ntiles);
    __device__ __forceinline__ int gather(const attnd_sm90_tile &w);

    // Per tile j, last first: K of j then V of j (V takes K's page ids), or (SPLIT_KV) this
    // warp's half, K (WHICH 1) or V (WHICH 2). Sparse: K of j - 1 ahead of V of j (the order the
    // consumers wait for them in), over the tiles of the gathered keys (none: one K stage whose
    // header says so, no V). PUB: the tiles the loader publishes (attnd_sm90_qloader: tile k in
    // Q buffer k % 2, read once its rows are in), else this warp's own walk of the enumeration.
    template <int WHICH = 0, bool PUB = false> __device__ __forceinline__ void run(int total)
    {
        for (int k = 0;; k++) {
            attnd_sm90_tile w;
            if constexpr (PUB) {
                const int b = k & 1;
                attnd_mbar_wait(sm.full_q(b), (k >> 1) & 1);
                w = *sm.tdesc(b);
                if (w.seq < 0) break;
                attnd_mbar_arrive(sm.empty_q(b));
                if (w.jhi < w.jlo) continue;
            } else {
                const int t = attnd_sm90_tile_index(k, total);
                if (t < 0) break;
                if (!attnd_sm90_tile_at<Tr>(a, src, t, &w) || w.jhi < w.jlo) continue;
            }
            bt = (const int32_t *)a.p.block_tables.data +
                 (int64_t)w.seq * a.p.block_tables.strides[0];
            int ntiles = w.jhi - w.jlo + 1;
            if constexpr (Tr::SPARSE) {
                ntiles = gather(w);
                w.jhi = ntiles - 1;
                if (ntiles == 0) {
                    load_k(w, 0, 0);
                    continue;
                }
                load_k(w, w.jhi, ntiles);
                for (int j = w.jhi - 1; j >= w.jlo; j--) {
                    load_k(w, j, ntiles);
                    load_v(w, j + 1, false);
                }
                load_v(w, w.jlo, false);
            } else {
#pragma unroll 1
                for (int j = w.jhi; j >= w.jlo; j--) {
                    if constexpr (WHICH != 2) load_k(w, j, ntiles);
                    if constexpr (WHICH != 1) load_v(w, j, WHICH == 0);
                }
            }
        }
        if constexpr (Tr::FP8) end_raw();
    }
};

// Sparse: the key blocks that the layout rows of w's rows list, as a list in increasing order
// (each entry: block | mask of the rows listing it << 24, rows counted from the tile's first
// layout row, at most 8); returns the K/V tiles of the gathered keys.
template <class Tr>
__device__ __forceinline__ int attnd_sm90_producer<Tr>::gather(const attnd_sm90_tile &w)
{
    uint8_t *mask = sm.kmask();
    int32_t *list = sm.klist();
    const int nkb = min((w.seq_len + (1 << src.kb_log2) - 1) >> src.kb_log2, Tr::KB_MAX);
    for (int i = lane; i < nkb; i += 32)
        mask[i] = 0;
    __syncwarp();
    const int last = min(w.row0 + Tr::BLOCK_M, w.rows_total) - 1;
    const int r_a = max(w.ctx + w.row0, 0) >> src.qb_log2, r_b = (w.ctx + last) >> src.qb_log2;
    const int32_t *crow = src.crow + (int64_t)w.kvh * src.crow_sh;
    for (int r = r_a; r <= min(r_b, r_a + 7) && r < src.n_row_blocks && w.ctx + last >= 0; r++) {
        const int c0 = max(0, min(crow[(int64_t)r * src.crow_sm], src.n_cols));
        const int c1 = max(c0, min(crow[(int64_t)(r + 1) * src.crow_sm], src.n_cols));
        for (int c = c0 + lane; c < c1; c += 32) {
            const int kb = __ldg(src.col + (int64_t)w.kvh * src.col_sh + (int64_t)c * src.col_sm);
            if ((unsigned)kb < (unsigned)nkb) mask[kb] |= (uint8_t)(1u << (r - r_a));
        }
        __syncwarp(); // distinct blocks within a row; rows one after the other
    }
    int n = 0;
    for (int base = 0; base < nkb; base += 32) {
        const int kb = base + lane;
        const uint32_t m = kb < nkb ? mask[kb] : 0u;
        const uint32_t bal = __ballot_sync(0xffffffffu, m != 0);
        if (m) list[n + __popc(bal & ((1u << lane) - 1))] = kb | (int)(m << 24);
        n += __popc(bal);
    }
    __syncwarp();
    nvirt = n << src.kb_log2;
    return (nvirt + Tr::BLOCK_N - 1) / Tr::BLOCK_N;
}

// Sparse: K stage st's key info for tile j (position | row mask << 24; holes: mask 0) and its
// header: the work tile's tile count, the AND of the masks, the largest position.
template <class Tr>
__device__ __forceinline__ void attnd_sm90_producer<Tr>::write_kinfo(const attnd_sm90_tile &w,
                                                                     int st, int j, int ntiles)
{
    int32_t *info = sm.kinfo(st);
    uint32_t all = 0xffu;
    int pmax = -1;
    for (int k = lane; k < Tr::BLOCK_N; k += 32) {
        const int vk = j * Tr::BLOCK_N + k;
        int32_t e = 0xffffff; // a hole: mask 0
        if (vk < nvirt) {
            const int pos = key_pos(vk);
            const uint32_t m = (uint32_t)sm.klist()[vk >> src.kb_log2] >> 24;
            if (pos < w.seq_len) e = pos | (int)(m << 24);
            pmax = max(pmax, pos < w.seq_len ? pos : -1);
        }
        all &= (uint32_t)e >> 24;
        info[k] = e;
    }
    all = __reduce_and_sync(0xffffffffu, all);
    pmax = __reduce_max_sync(0xffffffffu, pmax);
    if (lane == 0) {
        info[Tr::BLOCK_N] = ntiles;
        info[Tr::BLOCK_N + 1] = (int)all;
        info[Tr::BLOCK_N + 2] = pmax;
    }
    __syncwarp();
}

// Tiles and Q published by the loader (TMA_Q): the loader, the producer warps and the consumers
// each ask (the same answer on every side, else a deadlock).
template <class Tr>
__device__ __forceinline__ bool attnd_sm90_tma_q(const attnd_paged_kargs &a, int off)
{
    return Tr::TMA_Q && a.q_tma && !(off & ATTND_SM90_NO_QPREFETCH);
}

// TMA_Q: lane 0 of the producer warpgroup's warp 2. Each work tile of this CTA, in the consumers'
// order, into Q buffer n % 2 once its readers (the consumers, the producer warps) are done with
// its previous tile: the descriptor, then the rows (a box of 64 packed rows, g heads x 64 / g
// tokens, per consumer and slab; rows past the sequence are other sequences' (never stored), past
// the tensor zeros). Then a tile of sequence -1: the end.
template <class Tr> struct attnd_sm90_qloader {
    const attnd_paged_kargs &a;
    const attnd_sm90_src &src;
    const CUtensorMap *tq;
    attnd_sm90_smem<Tr> sm;

    __device__ __forceinline__ void publish(uint32_t n, const attnd_sm90_tile &w) const
    {
        const int b = n & 1, g = a.group;
        const int head = w.kvh * g, tok = w.q_start + w.row0 / g;
        attnd_mbar_wait(sm.empty_q(b), ((n >> 1) & 1) ^ 1);
        *sm.tdesc(b) = w;
        attnd_mbar_arrive_tx(sm.full_q(b), 2u * Tr::SLABS * 64 * 128);
#pragma unroll
        for (int wg = 0; wg < 2; wg++)
#pragma unroll
            for (int s = 0; s < Tr::SLABS; s++)
                attnd_tma_load4(sm.q(wg, b) + s * 64 * 128, tq, sm.full_q(b), 64 * s, head,
                                tok + wg * (64 / g), 0);
    }

    __device__ __forceinline__ void run(int total) const
    {
        uint32_t n = 0;
        attnd_sm90_tile w;
        for (int k = 0; attnd_sm90_next_tile<Tr>(a, src, &k, total, &w);)
            publish(n++, w);
        const int b = n & 1;
        attnd_mbar_wait(sm.empty_q(b), ((n >> 1) & 1) ^ 1);
        sm.tdesc(b)->seq = -1;
        attnd_mbar_arrive(sm.full_q(b));
    }
};

// fp8: three warps of the producer warpgroup turn each raw tile's e4m3 rows into the f16 stage
// its descriptor names (128-byte-swizzled slabs, as the TMA lays out a 16-bit cache), exact; rows
// past the sequence's end become zeros (a stale page's bytes may decode to NaN, and P = 0 times
// NaN is NaN).
template <class Tr> struct attnd_sm90_converter {
    attnd_sm90_smem<Tr> sm;
    int lane, t; // t: this thread among the converters

    __device__ __forceinline__ void run(void)
    {
        // this thread's 16-byte column chunk ch of rows r0, r0 + RPP, ... (a pass: RPP rows)
        constexpr int CPR = Tr::D_PAD / 16, RPP = Tr::CONVERTERS * 32 / CPR;
        constexpr int PASSES = (Tr::BLOCK_N + RPP - 1) / RPP;
        static_assert(Tr::CONVERTERS * 32 % CPR == 0, "whole rows per pass");
        const int ch = t % CPR, r0 = t / CPR;
        const uint32_t col_off = (uint32_t)(ch >> 2) * Tr::SLAB_BYTES; // its slab
        const int cc = (ch & 3) * 2;                                   // its first f16 chunk
        for (uint32_t nr = 0;; nr++) {
            const int r = nr % Tr::RAW;
            attnd_mbar_wait(sm.full_raw(r), (nr / Tr::RAW) & 1);
            const int4 d = *sm.rdesc(r);
            if (d.x < 0) return;
            const bool is_v = d.x != 0;
            const int ns = is_v ? Tr::NSTAGES : Tr::KSTAGES, st = d.y % ns;
            attnd_mbar_wait(is_v ? sm.empty_v(st) : sm.empty_k(st), ((d.y / ns) & 1) ^ 1);
            const uint32_t src = sm.raw(r) + r0 * Tr::D_PAD + ch * 16;
            const uint32_t dst = (is_v ? sm.v(st) : sm.k(st)) + col_off;
#pragma unroll
            for (int k = 0; k < PASSES; k++) {
                const int row = r0 + k * RPP;
                if (PASSES * RPP > Tr::BLOCK_N && row >= Tr::BLOCK_N) break;
                uint4 x = make_uint4(0u, 0u, 0u, 0u), lo, hi;
                if (row < d.z) x = attnd_ld_shared16(src + k * RPP * Tr::D_PAD);
                attnd_fp8x16_to_f16(x, &lo, &hi);
                attnd_st_shared16(dst + attnd_slab_off(row, cc), lo);
                attnd_st_shared16(dst + attnd_slab_off(row, cc + 1), hi);
            }
            attnd_mbar_arrive(sm.empty_raw(r)); // each thread after its reads of the raw tile
            attnd_fence_proxy_async();          // the stage is read by wgmma (the async proxy)
            __syncwarp();
            if (lane == 0) attnd_mbar_arrive(is_v ? sm.full_v(st) : sm.full_k(st));
        }
    }
};

// ------------------------------------------------------------------ consumers

// This lane's two rows of a tile: positions, ALiBi slopes, and its warp's position range.
// Sparse: each row's bit among the tile's layout rows, and the OR over the warp's rows.
struct attnd_sm90_rows {
    int idx0, pos[2], wpos_min, wpos_max;
    int jfree_hi, jfree_lo; // not sparse: tiles jfree_lo < j < jfree_hi need no per-key test
    float slope2[2];
    bool warp_rows;
    uint32_t lbit[2], wbits;
};

// The accumulator and online-softmax state of this lane's rows.
template <class Tr> struct attnd_sm90_acc {
    float o[Tr::OH][Tr::ON][4];
    float m[2], l[2], alpha[2];
};

template <class Tr> struct attnd_sm90_consumer {
    typedef typename Tr::TC TC;
    const attnd_paged_kargs &a;
    const attnd_sm90_src &src;
    attnd_sm90_smem<Tr> sm;
    int wg, wq, lane, ctid; // warpgroup (0, 1), warp in it, lane, thread in it
    uint32_t nk = 0, nv = 0;
    bool exact_mask = false; // masked tiles through visible() per logit (measurements)
    bool late_wait = true;   // P V waited for after the softmax, not before (measurements)
    bool hi_only = true;     // unwindowed masked tiles test the upper bound alone (measurements)
    bool fast_epi = true;    // stmatrix epilogue, the rows' loads together (measurements)
    bool late_store = true;  // chained: a tile's rows stored under the next step's GEMMs
    bool chain = false;      // a work tile's first K/V tile under the previous one's last P V
    bool smem_epi = false;   // rows out through the Q buffer (16-bit out, 16-byte rows)
    bool q_conv = false;     // fp8: Q in bf16 or fp8, copied as it is, converted in shared memory
    attnd_divmod gd;         // by the group: packed row -> (token, head)

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
                const int qt = gd.div(idx), tok = w.q_start + qt,
                          head = w.kvh * g + gd.mod(idx, qt);
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
            attnd_st_shared16(attnd_paged_buf_at(dst, r, ch), make_uint4(u[0], u[1], u[2], u[3]));
        }
        attnd_fence_proxy_async();
    }

    // The same rows copied as they are with cp.async (Q in the compute type, or fp8 (f16
    // compute) with bf16 or fp8 Q: converted by convert_q; fp8 Q: 8 bytes into the low half of
    // each chunk): issued now, waited for when the tile starts.
    __device__ __forceinline__ void load_q_async(const attnd_sm90_tile &w, int buf) const
    {
        const int g = a.group, d_act = (int)a.p.q.shape[2];
        const bool q8 = Tr::FP8 && a.p.q.dtype == ATTND_DTYPE_FP8_E4M3;
        const uint32_t dst = sm.q(wg, buf);
        constexpr int QC = Tr::D_PAD / 8;
#pragma unroll 4
        for (int c = ctid; c < 64 * QC; c += 128) {
            const int r = c / QC, ch = c % QC, idx = w.row0 + wg * 64 + r;
            const bool ok = idx < w.rows_total && ch * 8 < d_act;
            const int qt = gd.div(idx);
            const int tok = ok ? w.q_start + qt : 0, head = ok ? w.kvh * g + gd.mod(idx, qt) : 0;
            const int64_t e = (int64_t)tok * a.p.q.strides[0] + (int64_t)head * a.p.q.strides[1] +
                              (ok ? ch * 8 : 0);
            if (q8)
                attnd_cp_async8(attnd_paged_buf_at(dst, r, ch), (const uint8_t *)a.p.q.data + e,
                                ok ? 8 : 0);
            else
                attnd_cp_async16(attnd_paged_buf_at(dst, r, ch), (const uint16_t *)a.p.q.data + e,
                                 ok ? 16 : 0);
        }
    }

    // fp8 (f16 compute) with bf16 or fp8 Q: the chunks this thread copied into Q buffer buf
    // (load_q_async's loop) converted to f16 in place (bf16 saturating, as load_q would have;
    // fp8 exact).
    __device__ __forceinline__ void convert_q(int buf) const
    {
        const uint32_t dst = sm.q(wg, buf);
        const bool q8 = a.p.q.dtype == ATTND_DTYPE_FP8_E4M3;
        constexpr int QC = Tr::D_PAD / 8;
#pragma unroll 4
        for (int c = ctid; c < 64 * QC; c += 128) {
            const uint32_t at = attnd_paged_buf_at(dst, c / QC, c % QC);
            if (q8) {
                attnd_st_shared16(at, attnd_fp8x8_to_half8(attnd_ld_shared8(at)));
                continue;
            }
            const uint4 x = attnd_ld_shared16(at);
            uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = attnd_unpack2<true>(w[k]);
                w[k] = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f.x), attnd_tc<TC>::clamp(f.y));
            }
            attnd_st_shared16(at, make_uint4(w[0], w[1], w[2], w[3]));
        }
    }

    // S = Q K^T over stage st with Q buffer qb (issued, not waited).
    __device__ __forceinline__ void gemm_qk(float (&s)[Tr::SR][4], int st, int qb) const
    {
        const uint64_t qd = attnd_wgmma_desc(sm.q(wg, qb), 16, 1024);
        const uint64_t kd = attnd_wgmma_desc(sm.k(st), 16, 1024);
#pragma unroll
        for (int kk = 0; kk < Tr::KSTEPS; kk++) {
            const uint32_t off = (uint32_t)(kk & 3) * 32; // k16 step within the slab's row
            const uint64_t da = attnd_wgmma_desc_add(qd, (kk >> 2) * (64 * 128) + off);
            const uint64_t db = attnd_wgmma_desc_add(kd, (kk >> 2) * Tr::SLAB_BYTES + off);
            attnd_wgmma<TC, Tr::SR>::ss(s, da, db, kk > 0);
        }
        attnd_wgmma_commit();
    }

    // O (+)= P V over stage st (issued, not waited); first: the tile's first product.
    __device__ __forceinline__ void gemm_pv(float (&o)[Tr::OH][Tr::ON][4],
                                            const uint32_t (&p)[Tr::BLOCK_N / 16][4], int st,
                                            bool first) const
    {
        const uint64_t vd = attnd_wgmma_desc(sm.v(st), Tr::SLAB_BYTES, 1024);
#pragma unroll
        for (int kk = 0; kk < Tr::BLOCK_N / 16; kk++)
#pragma unroll
            for (int h = 0; h < Tr::OH; h++) {
                const uint64_t db =
                    attnd_wgmma_desc_add(vd, h * 2 * Tr::SLAB_BYTES + kk * 16 * 128);
                attnd_wgmma<TC, Tr::ON>::rs(o[h], p[kk], db, (first && kk == 0) ? 0 : 1);
            }
        attnd_wgmma_commit();
    }

    // One warp's lane-0 arrival (the barriers count 8 consumer warps).
    __device__ __forceinline__ void release(uint32_t bar) const
    {
        if (lane == 0) attnd_mbar_arrive(bar);
    }

    // K stage st released. Sparse: by every lane (the barrier counts 8 x 32), each after its own
    // reads of the stage's key info.
    __device__ __forceinline__ void release_k(int st) const
    {
        if (Tr::SPARSE)
            attnd_mbar_arrive(sm.empty_k(st));
        else
            release(sm.empty_k(st));
    }

    // This lane's rows of tile w (idx0 and idx0 + 8) and its warp's position range.
    __device__ __forceinline__ void rows_of(const attnd_sm90_tile &w, attnd_sm90_rows &r) const
    {
        const int wrow0 = w.row0 + wg * 64 + wq * 16;
        r.idx0 = wrow0 + (lane >> 2);
        const float *slopes = (const float *)a.p.alibi_slopes.data;
#pragma unroll
        for (int i = 0; i < 2; i++) { // attnd_paged_row with the division by the group folded
            const int idx = r.idx0 + 8 * i, qt = gd.div(idx);
            const bool ok = idx < w.rows_total;
            r.pos[i] = ok ? w.ctx + qt : -1;
            const int64_t h = (int64_t)(w.kvh * a.group + gd.mod(idx, qt));
            r.slope2[i] =
                ok && slopes ? slopes[h * a.p.alibi_slopes.strides[0]] * ATTND_LOG2E : 0.0f;
        }
        r.warp_rows = wrow0 < w.rows_total;
        r.wpos_min = w.ctx + gd.div(wrow0);
        r.wpos_max = w.ctx + gd.div(min(wrow0 + 15, w.rows_total - 1));
        // attnd_paged_unmasked as bounds on j, once per tile: (j + 1) BLOCK_N <= min(seq_len,
        // wpos_min + 1) and, with a window, j BLOCK_N > wpos_max - window (floors by shifts)
        constexpr int LN = Tr::BLOCK_N == 128 ? 7 : 6;
        static_assert(Tr::BLOCK_N == 1 << LN, "tile width a power of two");
        const int sw = a.p.sliding_window;
        r.jfree_hi = r.warp_rows ? min(w.seq_len, r.wpos_min + 1) >> LN : -1;
        r.jfree_lo = sw > 0 ? (r.wpos_max - sw) >> LN : -1;
        r.wbits = 0;
        if constexpr (Tr::SPARSE) { // the producer's numbering (gather)
            const int r_a = max(w.ctx + w.row0, 0) >> src.qb_log2;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int lr = r.pos[i] >= 0 ? (r.pos[i] >> src.qb_log2) - r_a : -1;
                r.lbit[i] = lr >= 0 && lr < 8 ? 1u << lr : 0u;
            }
            r.wbits = __reduce_or_sync(0xffffffffu, r.lbit[0] | r.lbit[1]);
        }
    }

    // Logit e of S chunk n (tile j, K stage st) is visible to this lane's row.
    __device__ __forceinline__ bool visible(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                            int j, int st, int n, int e) const
    {
        const int col = n * 8 + 2 * (lane & 3) + (e & 1);
        if constexpr (Tr::SPARSE) {
            const uint32_t info = (uint32_t)sm.kinfo(st)[col];
            return ((info >> 24) & r.lbit[e >> 1]) && (int)(info & 0xffffffu) <= r.pos[e >> 1];
        } else {
            return attnd_paged_visible(j * Tr::BLOCK_N + col, r.pos[e >> 1], w.seq_len,
                                       a.p.sliding_window);
        }
    }

    // Columns of tile j this lane's rows see, as a range per row relative to its first column
    // (2 (lane & 3)): visible iff lo <= n * 8 + (e & 1) <= hi (the test of visible() folded
    // into one range per row, so a masked tile costs two compares per logit).
    __device__ __forceinline__ void col_range(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                              int j, int (&lo)[2], int (&hi)[2]) const
    {
        const int c0 = j * Tr::BLOCK_N + 2 * (lane & 3), sw = a.p.sliding_window;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            hi[i] = min(w.seq_len - 1, r.pos[i]) - c0; // pos -1 (no row): nothing visible
            lo[i] = (sw > 0 ? r.pos[i] - sw + 1 : 0) - c0;
        }
    }

    // The tile needs no per-key test for this warp's rows.
    __device__ __forceinline__ bool unmasked(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                             int j, int st) const
    {
        if constexpr (Tr::SPARSE) {
            const int32_t *h = sm.kinfo(st) + Tr::BLOCK_N;
            return r.warp_rows && ((uint32_t)h[1] & r.wbits) == r.wbits && h[2] <= r.wpos_min;
        } else {
            return j < r.jfree_hi && j > r.jfree_lo; // attnd_paged_unmasked, folded in rows_of
        }
    }

    // t[.][n] = max(t[.][n], t[.][n + W]) for n < W: one level of row_max's tree.
    template <int W> static __device__ __forceinline__ void max_half(float (&t)[2][Tr::SR])
    {
#pragma unroll
        for (int n = 0; n < W; n++) {
            t[0][n] = fmaxf(t[0][n], t[0][n + W]);
            t[1][n] = fmaxf(t[1][n], t[1][n + W]);
        }
    }

    // This lane's maxima of its two rows' scores, as a tree (depth 5 at 32 values a row instead
    // of a chain of 16 dependent max operations on the softmax's critical path).
    static __device__ __forceinline__ void row_max(const float (&s)[Tr::SR][4], float (&mx)[2])
    {
        float t[2][Tr::SR];
#pragma unroll
        for (int n = 0; n < Tr::SR; n++) {
            t[0][n] = fmaxf(s[n][0], s[n][1]);
            t[1][n] = fmaxf(s[n][2], s[n][3]);
        }
        static_assert(Tr::SR == 8 || Tr::SR == 16, "S chunks");
        if constexpr (Tr::SR == 16) max_half<8>(t);
        max_half<4>(t);
        max_half<2>(t);
        max_half<1>(t);
        mx[0] = t[0][0];
        mx[1] = t[1][0];
    }

    // Scores of K/V tile j -> logits (log2 domain, masked where needed) -> probabilities in s;
    // the rows' maxima and sums updated, acc.alpha: the factor O still has to be rescaled by.
    __device__ __forceinline__ void softmax(const attnd_sm90_tile &w, const attnd_sm90_rows &r,
                                            int j, int st, float (&s)[Tr::SR][4],
                                            attnd_sm90_acc<Tr> &acc)
    {
        constexpr int SR = Tr::SR;
        const int t0 = j * Tr::BLOCK_N, t4 = lane & 3;
        const bool need_mask = !unmasked(w, r, j, st);
        const bool exact = !Tr::PLAIN && exact_mask;
        const bool windowed = a.p.sliding_window > 0 || (!Tr::PLAIN && !hi_only);
        int lo[2] = {0, 0}, hi[2] = {0, 0};
        if (!Tr::SPARSE && need_mask) col_range(w, r, j, lo, hi);
        auto sees = [&](int n, int e) {
            if (Tr::SPARSE || exact) return visible(w, r, j, st, n, e);
            const int k = n * 8 + (e & 1);
            return k >= lo[e >> 1] && k <= hi[e >> 1];
        };
        float c = a.qk_scale_log2;
        if (!Tr::PLAIN && !a.plain) {
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
                    if (need_mask && !sees(n, e)) x = attnd_neg_inf();
                    s[n][e] = x;
                }
        } else if (need_mask && !Tr::SPARSE && !exact && !windowed) {
#pragma unroll
            for (int n = 0; n < SR; n++) // no window: the range's upper bound alone
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (n * 8 + (e & 1) > hi[e >> 1]) s[n][e] = attnd_neg_inf();
        } else if (need_mask) {
#pragma unroll
            for (int n = 0; n < SR; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!sees(n, e)) s[n][e] = attnd_neg_inf();
        }
        float mx[2], ms[2], rs[2] = {0.0f, 0.0f};
        row_max(s, mx);
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

    // Probabilities -> the A fragments of P V (compute type; QUANT_P: fp8(p * p_descale) as f16).
    __device__ __forceinline__ void to_p(const float (&s)[Tr::SR][4],
                                         uint32_t (&pf)[Tr::BLOCK_N / 16][4]) const
    {
        auto pack = [&](float x, float y) {
            if constexpr (Tr::QUANT_P)
                return attnd_fp8x2_to_half2<0>(__nv_cvt_float2_to_fp8x2(
                    make_float2(x * a.p_descale, y * a.p_descale), __NV_SATFINITE, __NV_E4M3));
            else
                return attnd_tc<TC>::pack(x, y);
        };
#pragma unroll
        for (int kk = 0; kk < Tr::BLOCK_N / 16; kk++) {
            pf[kk][0] = pack(s[2 * kk][0], s[2 * kk][1]);
            pf[kk][1] = pack(s[2 * kk][2], s[2 * kk][3]);
            pf[kk][2] = pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pf[kk][3] = pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    }

    // f(x, i) for every O accumulator x of this lane (i: its row, 0 or 1).
    template <class F> static __device__ __forceinline__ void each_o(attnd_sm90_acc<Tr> &acc, F f)
    {
#pragma unroll
        for (int h = 0; h < Tr::OH; h++)
#pragma unroll
            for (int n = 0; n < Tr::ON; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    f(acc.o[h][n][e], e >> 1);
    }

    // O *= alpha, skipped when no row of the warp moved its maximum.
    static __device__ __forceinline__ void rescale_o(attnd_sm90_acc<Tr> &acc)
    {
        if (!__any_sync(0xffffffffu, acc.alpha[0] != 1.0f || acc.alpha[1] != 1.0f)) return;
        each_o(acc, [&](float &x, int i) { x *= acc.alpha[i]; });
    }

    __device__ __forceinline__ void fence_o(attnd_sm90_acc<Tr> &acc) const
    {
#pragma unroll
        for (int h = 0; h < Tr::OH; h++)
            attnd_fence_regs(acc.o[h]);
    }

    // The first (last-indexed) K/V tile of w: Q K^T and softmax into the first P. Returns that
    // tile's index (sparse: from the K stage's header; -1: no key, the stage released).
    // under_qk runs once either way, while the Q K^T is in flight where there is one (the plain
    // loop looks up its next tile there: it must run even when the tile has no key).
    template <class F>
    __device__ __forceinline__ int
    first_tile(const attnd_sm90_tile &w, const attnd_sm90_rows &r, int qb, float (&s)[Tr::SR][4],
               uint32_t (&pf)[Tr::BLOCK_N / 16][4], attnd_sm90_acc<Tr> &acc, F &&under_qk)
    {
        const int st = nk % Tr::KSTAGES;
        attnd_mbar_wait(sm.full_k(st), (nk / Tr::KSTAGES) & 1);
        const int jhi = Tr::SPARSE ? sm.kinfo(st)[Tr::BLOCK_N] - 1 : w.jhi;
        if (jhi < w.jlo) {
            release_k(st);
            nk++;
            under_qk();
            return -1;
        }
        attnd_wgmma_fence();
        gemm_qk(s, st, qb);
        under_qk();
        attnd_wgmma_wait<0>();
        attnd_fence_regs(s);
        if (!Tr::SPARSE) release_k(st); // sparse: softmax reads the key info
        softmax(w, r, jhi, st, s, acc);
        if (Tr::SPARSE) release_k(st);
        nk++;
        to_p(s, pf);
        return jhi;
    }

    // The K/V tiles of w, last first, with Q buffer qb: the first tile's Q K^T and softmax, then
    // per tile Q K^T of j with P V of j + 1 in flight, then the last P V. Chained (chain): when
    // w's last Q K^T is done and the next work tile wn has keys, its first Q K^T and softmax run
    // in the same step as w's last P V, w's rows go out after that P V, and the loop goes on
    // with wn (w, r, qb, wn, have_next and k advance), so a work tile's masked first K/V tile
    // runs under the previous tile's last P V. Returns with w's last P V done, w not stored.
    // under_first_qk: first_tile's under_qk.
    template <class F>
    __device__ __forceinline__ void
    mainloop(attnd_sm90_tile &w, attnd_sm90_rows &r, int &qb, attnd_sm90_tile &wn, bool &have_next,
             int &k, int total, bool pingpong, attnd_sm90_acc<Tr> &acc, F &&under_first_qk)
    {
        float s[Tr::SR][4];
        uint32_t pf[Tr::BLOCK_N / 16][4];
        int j = first_tile(w, r, qb, s, pf, acc, under_first_qk);
        if (j < w.jlo) return;
        bool first_pv = true, pend = false;
        attnd_sm90_tile pe; // pend: the tile whose rows wait in buffer qb ^ 1 for their stores
        // pe's rows out of its buffer, which then takes the next tile's Q rows
        auto flush_pending = [&]() {
            flush(pe, qb ^ 1);
            attnd_bar_sync(3 + wg, 128); // every warp's reads of that buffer are done
            if (have_next) load_q_async(wn, qb ^ 1);
            attnd_cp_async_commit();
            pend = false;
        };
        for (;;) {
            // the next Q K^T: tile j - 1 of w, or (chained) the first of the next work tile
            const bool next_w = j == w.jlo;
            if (next_w && pend) flush_pending(); // a one-tile work tile: its buffer is needed
            attnd_sm90_tile e = w; // next_w: the tile whose rows go out after this step
            float m_old[2] = {acc.m[0], acc.m[1]}, l_old[2] = {acc.l[0], acc.l[1]};
            if (next_w) {
                if (Tr::SPARSE || Tr::PLAIN || !chain || !have_next || wn.jhi < wn.jlo) break;
                w = wn;
                qb ^= 1;
                acc.m[0] = acc.m[1] = attnd_neg_inf();
                acc.l[0] = acc.l[1] = 0.0f;
                attnd_cp_async_wait<0>(); // w's Q rows (the previous step's copy)
                attnd_fence_proxy_async();
                attnd_bar_sync(3 + wg, 128);
                j = w.jhi + 1;
            }
            const int sk = nk % Tr::KSTAGES, sv = nv % Tr::NSTAGES;
            attnd_mbar_wait(sm.full_k(sk), (nk / Tr::KSTAGES) & 1);
            if (pingpong) attnd_bar_sync(1 + wg, 256); // this warpgroup's turn
            attnd_wgmma_fence();
            gemm_qk(s, sk, qb);
            attnd_mbar_wait(sm.full_v(sv), (nv / Tr::NSTAGES) & 1);
            attnd_wgmma_fence(); // after the wait's loop (else ptxas injects it: C7519)
            gemm_pv(acc.o, pf, sv, first_pv);
            if (pingpong) attnd_bar_arrive(2 - wg, 256); // the other's turn
            first_pv = false;
            if (pend) flush_pending(); // under this step's GEMMs
            if (next_w) {              // under the GEMMs: the new tile's rows, the tile after it
                rows_of(w, r);
                have_next = attnd_sm90_next_tile<Tr>(a, src, &k, total, &wn);
            }
            attnd_wgmma_wait<1>();
            attnd_fence_regs(s);
            if (!Tr::SPARSE) release_k(sk);
            if (!Tr::PLAIN && !late_wait) attnd_wgmma_wait<0>(); // the order ptxas chose before
            softmax(w, r, j - 1, sk, s, acc);
            if (Tr::SPARSE) release_k(sk);
            nk++;
            attnd_order_before_wait(sm.base + Tr::ORDER_OFF + 4 * (wg * 128 + ctid),
                                    acc.l[0] + acc.l[1]);
            attnd_wgmma_wait<0>();
            fence_o(acc);
            attnd_fence_regs(pf);
            release(sm.empty_v(sv));
            nv++;
            if (next_w) { // e's rows into its Q buffer; stored under the next step's GEMMs
                attnd_bar_sync(3 + wg, 128); // every warp's wgmma reads of the buffer are done
                stage(e, acc.o, m_old, l_old, qb ^ 1);
                pe = e;
                pend = true;
                if (!Tr::PLAIN && !late_store) flush_pending();
                first_pv = true;
            }
            rescale_o(acc); // alpha 1 after next_w: nothing to do
            to_p(s, pf);
            j--;
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
    __device__ __forceinline__ void run_prefetched(bool have, attnd_sm90_tile w, int k, int total,
                                                   bool pingpong);
    __device__ __forceinline__ void run_tma_q(bool pingpong);

    // A work tile's start: O zero, no maximum, no sum.
    static __device__ __forceinline__ void reset(attnd_sm90_acc<Tr> &acc)
    {
        each_o(acc, [](float &x, int) { x = 0.0f; });
        acc.m[0] = acc.m[1] = attnd_neg_inf();
        acc.l[0] = acc.l[1] = 0.0f;
    }
    __device__ __forceinline__ void store(const attnd_sm90_tile &w,
                                          const float (&o)[Tr::OH][Tr::ON][4], const float m[2],
                                          const float l[2], int qb, bool via_smem) const;

    // This warp's rows of w normalised into Q buffer qb (its LSE written), then stored from it.
    __device__ __forceinline__ void stage(const attnd_sm90_tile &w,
                                          const float (&o)[Tr::OH][Tr::ON][4], const float m[2],
                                          const float l[2], int qb) const
    {
        auto of = [&](int n, int e) { return o[n / Tr::ON][n % Tr::ON][e]; };
        attnd_paged_stage_rows<Tr::OH * Tr::ON, Tr::HAS_SINKS>(
            a, of, m, l, w.row0 + wg * 64 + wq * 16, w.rows_total, w.q_start, w.kvh, lane,
            sm.q(wg, qb), wq * 16, gd, Tr::PLAIN || fast_epi);
    }
    __device__ __forceinline__ void flush(const attnd_sm90_tile &w, int qb) const
    {
        attnd_paged_flush_rows<Tr::OH * Tr::ON>(a, w.row0 + wg * 64 + wq * 16, w.rows_total,
                                                w.q_start, w.kvh, lane, sm.q(wg, qb), wq * 16, gd,
                                                Tr::PLAIN || fast_epi);
    }
};

// Every tile of this CTA: Q rows in (copied a tile ahead where they are in the compute type),
// the main loop (which may run on into the following tiles), the rows out.
template <class Tr> __device__ __forceinline__ void attnd_sm90_consumer<Tr>::run(int total, int off)
{
    const bool pingpong = !(off & ATTND_SM90_NO_PINGPONG);
    exact_mask = (off & ATTND_SM90_NO_RANGE_MASK) != 0;
    late_wait = !(off & ATTND_SM90_NO_LATE_WAIT);
    hi_only = !(off & ATTND_SM90_NO_HI_ONLY);
    fast_epi = !(off & ATTND_SM90_NO_FAST_EPI);
    late_store = !(off & ATTND_SM90_NO_LATE_STORE);
    gd.init(a.group);
    const int tc_dt = Tr::KV == ATTND_KV_BF16 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F16;
    q_conv = Tr::FP8 && (a.p.q.dtype == ATTND_DTYPE_BF16 || a.p.q.dtype == ATTND_DTYPE_FP8_E4M3);
    const bool qpf = Tr::QBUF == 2 && (a.p.q.dtype == tc_dt || q_conv) && a.q_vec &&
                     !(off & ATTND_SM90_NO_QPREFETCH);
    if (pingpong && wg == 0) attnd_bar_arrive(1, 256); // warpgroup 0 issues first
    const int ot = a.p.out.dtype, os0 = (int)(a.p.out.strides[0] & 7),
              os1 = (int)(a.p.out.strides[1] & 7);
    smem_epi = !(off & ATTND_SM90_NO_SMEM_EPI) &&
               (ot == ATTND_DTYPE_BF16 || ot == ATTND_DTYPE_F16) &&
               ((uintptr_t)a.p.out.data & 15) == 0 && os0 == 0 && os1 == 0;
    // chained tiles: the next tile's Q already there, the rows out through shared memory (the
    // one epilogue inlined in the loop); not in the plain instantiation (at fixed clocks the
    // chained step cost 3% at 8x2048, bench/RESULTS.md, fifth round)
    chain = !Tr::PLAIN && qpf && !q_conv && smem_epi && !(off & ATTND_SM90_NO_CHAIN);

    if (attnd_sm90_tma_q<Tr>(a, off)) {
        run_tma_q(pingpong);
        return;
    }
    int k = 0, qb = 0;
    attnd_sm90_tile w, wn;
    bool have = attnd_sm90_next_tile<Tr>(a, src, &k, total, &w);
    if (have && qpf) {
        load_q_async(w, 0);
        attnd_cp_async_commit();
    }
    if (Tr::PLAIN && !Tr::SPARSE && qpf) {
        run_prefetched(have, w, k, total, pingpong);
        return;
    }
    for (; have; w = wn, qb = qpf ? qb ^ 1 : 0) {
        bool have_next = attnd_sm90_next_tile<Tr>(a, src, &k, total, &wn);
        attnd_sm90_rows r;
        rows_of(w, r);
        attnd_sm90_acc<Tr> acc;
        reset(acc);
        // this warpgroup's last Q K^T of the previous tile is done: its Q buffer is free
        attnd_bar_sync(3 + wg, 128);
        if (qpf) {
            if (have_next) load_q_async(wn, qb ^ 1);
            attnd_cp_async_commit();
        }
        const bool keys = w.jhi >= w.jlo; // else (inconsistent lengths) zeros, LSE -inf
        if (qpf) { // this tile's rows (the next tile's may be in flight); waited for even when
                   // unused, else that copy could land after the next one into the same buffer
            attnd_cp_async_wait<1>();
            if (Tr::FP8 && q_conv) convert_q(qb);
            attnd_fence_proxy_async();
        }
        if (keys) {
            if (!qpf) load_q(w, qb);
            attnd_bar_sync(3 + wg, 128);
            mainloop(w, r, qb, wn, have_next, k, total, pingpong, acc, [] {});
        }
        store(w, acc.o, acc.m, acc.l, qb, smem_epi && keys);
        have = have_next;
    }
}

// The plain kernel's tiles, Q always copied a tile ahead: the next tile is looked up and its Q
// copy issued while the tile's first Q K^T runs (at the top of the tile they held the tensor
// pipe idle: ~6% of the 8x2048 profile's samples; bench/RESULTS.md, H200 session).
template <class Tr>
__device__ __forceinline__ void attnd_sm90_consumer<Tr>::run_prefetched(bool have,
                                                                        attnd_sm90_tile w, int k,
                                                                        int total, bool pingpong)
{
    int qb = 0; // w: the CTA's first tile, its Q copied to buffer 0; k: the position after it
    attnd_sm90_tile wn;
    for (; have; w = wn, qb ^= 1) {
        attnd_sm90_rows r;
        rows_of(w, r);
        attnd_sm90_acc<Tr> acc;
        reset(acc);
        attnd_cp_async_wait<0>(); // w's rows (copied during the previous tile)
        if (Tr::FP8 && q_conv) convert_q(qb);
        attnd_fence_proxy_async();
        attnd_bar_sync(3 + wg, 128); // ... and every warp's stores from buffer qb ^ 1 done
        bool have_next = false;
        auto setup_next = [&]() {
            have_next = attnd_sm90_next_tile<Tr>(a, src, &k, total, &wn);
            if (have_next) load_q_async(wn, qb ^ 1);
            attnd_cp_async_commit();
        };
        const bool keys = w.jhi >= w.jlo; // else (inconsistent lengths) zeros, LSE -inf
        if (keys)
            mainloop(w, r, qb, wn, have_next, k, total, pingpong, acc, setup_next);
        else
            setup_next();
        store(w, acc.o, acc.m, acc.l, qb, smem_epi && keys);
        have = have_next;
    }
}

// The plain kernel's tiles as the Q loader publishes them (attnd_sm90_qloader): tile n in Q buffer
// n % 2, descriptor and rows; the buffer handed back after the tile's rows are stored through it.
template <class Tr>
__device__ __forceinline__ void attnd_sm90_consumer<Tr>::run_tma_q(bool pingpong)
{
    attnd_sm90_tile wn; // no chained tiles in the plain kernel: mainloop's next tile unused
    bool have_next = false;
    int k = 0;
    for (uint32_t n = 0;; n++) {
        const int b = n & 1;
        attnd_mbar_wait(sm.full_q(b), (n >> 1) & 1);
        attnd_sm90_tile w = *sm.tdesc(b);
        if (w.seq < 0) return;
        attnd_sm90_rows r;
        rows_of(w, r);
        attnd_sm90_acc<Tr> acc;
        reset(acc);
        const bool keys = w.jhi >= w.jlo; // else (inconsistent lengths) zeros, LSE -inf
        int qb = b; // mainloop's in-out buffer (unchanged without chained tiles)
        if (keys) mainloop(w, r, qb, wn, have_next, k, 0, pingpong, acc, [] {});
        store(w, acc.o, acc.m, acc.l, b, smem_epi && keys);
        // every thread after its reads of the descriptor and of the rows it staged there (generic
        // accesses, before the next tile's TMA write)
        attnd_fence_proxy_async();
        attnd_mbar_arrive(sm.empty_q(b));
    }
}

// The tile's rows out: through this warpgroup's Q buffer qb (free once its last Q K^T is done;
// not when the mainloop did not run: a prefetched Q may still be landing there), or straight
// from the fragments.
template <class Tr>
__device__ __forceinline__ void
attnd_sm90_consumer<Tr>::store(const attnd_sm90_tile &w, const float (&o)[Tr::OH][Tr::ON][4],
                               const float m[2], const float l[2], int qb, bool via_smem) const
{
    auto of = [&](int n, int e) { return o[n / Tr::ON][n % Tr::ON][e]; };
    const int wrow0 = w.row0 + wg * 64 + wq * 16;
    if (via_smem) {
        attnd_bar_sync(3 + wg, 128); // every warp's wgmma reads of the buffer are done
        stage(w, o, m, l, qb);
        flush(w, qb);
    } else {
        attnd_paged_store_rows_as<Tr::OH * Tr::ON, Tr::HAS_SINKS>(
            a, of, m, l, wrow0 + (lane >> 2), w.rows_total, w.q_start, w.kvh, lane & 3);
    }
}

#endif // ATTND_SM90A_DEVICE

// The kernel: grid = persistent CTAs (at most one per SM), THREADS threads, SMEM_BYTES dynamic
// shared memory; maps: 4D tensor maps of k_cache and v_cache (launch.cu; contiguous sources:
// (head, kv head, row, 1)), boxes of a page and of a whole K/V tile; src: the contiguous source
// (unused when paged).
template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, 1)
    attnd_paged_sm90_kernel(const __grid_constant__ attnd_paged_kargs a,
                            const __grid_constant__ attnd_sm90_maps maps, int total, int off,
                            const __grid_constant__ attnd_sm90_src src)
{
#ifdef ATTND_SM90A_DEVICE
    extern __shared__ __align__(1024) unsigned char attnd_smem[];
    attnd_sm90_smem<Tr> sm;
    sm.base = (attnd_smem_addr(attnd_smem) + 1023u) & ~1023u;
    sm.gen = attnd_smem + (sm.base - attnd_smem_addr(attnd_smem));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        // full: the TMA's one arrival (sparse: every producer lane; fp8: each converter warp)
        const int full = Tr::SPARSE ? 32 : (Tr::FP8 ? Tr::CONVERTERS : 1);
        for (int st = 0; st < Tr::KSTAGES; st++) {
            attnd_mbar_init(sm.full_k(st), full);
            attnd_mbar_init(sm.empty_k(st), Tr::SPARSE ? 256 : 8);
        }
        for (int st = 0; st < Tr::NSTAGES; st++) {
            attnd_mbar_init(sm.full_v(st), Tr::FP8 ? Tr::CONVERTERS : 1);
            attnd_mbar_init(sm.empty_v(st), 8);
        }
        for (int r = 0; r < Tr::RAW; r++) {
            attnd_mbar_init(sm.full_raw(r), 1);
            attnd_mbar_init(sm.empty_raw(r), Tr::CONVERTERS * 32);
        }
        for (int b = 0; b < 2 && Tr::TMA_Q; b++) {
            attnd_mbar_init(sm.full_q(b), 1);
            attnd_mbar_init(sm.empty_q(b), Tr::Q_READERS);
        }
        attnd_mbar_init_fence();
    }
    __syncthreads();
    if (warp < 4) {
        attnd_regs_dealloc<Tr::PRODUCER_REGS>();
        if (warp == 0) {
            if (lane == 0) {
                attnd_tma_prefetch(&maps.k);
                attnd_tma_prefetch(&maps.v);
                if (Tr::RUNS) {
                    attnd_tma_prefetch(&maps.k_run);
                    attnd_tma_prefetch(&maps.v_run);
                }
                if (attnd_sm90_tma_q<Tr>(a, off)) attnd_tma_prefetch(&maps.q);
            }
            attnd_sm90_producer<Tr> pr{a, src, &maps.k, &maps.v, sm, lane};
            if (attnd_sm90_tma_q<Tr>(a, off)) // the loader's tiles (warp 2, below)
                pr.template run<Tr::SPLIT_KV ? 1 : 0, Tr::TMA_Q>(total);
            else
                pr.template run<Tr::SPLIT_KV ? 1 : 0>(total);
        } else if (Tr::SPLIT_KV && warp == 1) {
            attnd_sm90_producer<Tr> pr{a, src, &maps.k, &maps.v, sm, lane};
            if (attnd_sm90_tma_q<Tr>(a, off))
                pr.template run<2, Tr::TMA_Q>(total);
            else
                pr.template run<2>(total);
        } else if constexpr (Tr::FP8) {
            attnd_sm90_converter<Tr>{sm, lane, tid - 32}.run();
        } else if (warp == 2 && lane == 0 && attnd_sm90_tma_q<Tr>(a, off)) {
            attnd_sm90_qloader<Tr>{a, src, &maps.q, sm}.run(total);
        }
    } else {
        attnd_regs_alloc<Tr::CONSUMER_REGS>();
        const int ct = tid - 128;
        // the warpgroup from lane 0: the compiler then knows it warp-uniform, and the Q buffer's
        // wgmma descriptors stay in uniform registers (not rebuilt with R2UR per k step); the
        // warp index broadcast too made the head-256 general kernel spill
        const int wg = __shfl_sync(0xffffffffu, ct >> 7, 0);
        const int wq = (ct >> 5) & 3;
        attnd_sm90_consumer<Tr> co{a, src, sm, wg, wq, lane, ct & 127};
        co.run(total, off);
    }
#else
    __trap(); // not built for sm_90a: the host never launches this
#endif
}

#endif
