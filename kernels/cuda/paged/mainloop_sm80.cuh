// The sm80 core of paged attention (mma.sync; also the fallback on sm_90 for what the sm90 core
// does not take): one kernel template with two tile configurations, prefill and decode. Rows are
// packed as paged/rows.cuh says; a CTA owns BLOCK_M packed rows of one sequence and one kv head
// (and, for 3D, one segment of the context).
//
// Warps. Prefill: 4 warps split 128 rows (32 each: two m16 tiles share every K/V fragment; head
// sizes above 128: 64 rows, 16 each), share each K/V tile, and store their rows from registers.
// Decode: BLOCK_M = 16 rows (narrow tiles: 8), 4 warps split each K/V tile's tokens (16 each),
// load them into their own rows of each stage (no CTA barrier per tile), keep their own softmax
// state, and are merged through shared memory at the end. Head sizes are padded to 64, 128 or
// 256: the padding is zero-filled (no memory traffic) and computed as zeros.
//
// Pipeline. K and V tiles of BLOCK_N tokens are gathered row by row through the block table
// with 16-byte cp.async into NSTAGES shared-memory stages (rows swizzled for ldmatrix); page ids
// of the next stage are fetched one stage ahead (decode: a warp's 16 tokens of a tile start at a
// multiple of 16 and so lie in one page: one page id per tile, rows at a fixed stride). fp8 values
// become f16 exactly (every e4m3 value is an f16), k_scale folded into the logit scale and v_scale
// into the output: prefill converts its K and V tiles in shared memory; decode reads K fragments
// straight from the fp8 stage, and V's too at head sizes >= 128 (each lane pairs the bytes of two
// V rows; at 64, V is converted for ldmatrix.trans). S = Q K^T and O += P V run on mma.sync
// m16n8k16 with f32 accumulators; fp8 decode of at most 8 rows (narrow tiles) transposes both
// (S^T = K Q^T, O^T = V^T P^T), the rows being the n8 columns. The softmax is online in the log2
// domain (exp2), masks are evaluated only on tiles that need them, and tiles a warp cannot see
// are skipped.
#ifndef ATTND_CUDA_PAGED_MAINLOOP_SM80_CUH
#define ATTND_CUDA_PAGED_MAINLOOP_SM80_CUH

#include <stdint.h>

#include "paged/epilogue.cuh"
#include "paged/reduce.cuh"
#include "prims/sm80.cuh"
#include "prims/sm90.cuh"

// Shared-memory loads by address (8 and 16 bytes).
__device__ __forceinline__ void attnd_lds64(uint32_t addr, uint32_t *a, uint32_t *b)
{
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(*a), "=r"(*b) : "r"(addr));
}

__device__ __forceinline__ uint4 attnd_lds128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

// ------------------------------------------------------------------ tile configuration

// Prefill: 4 warps x 32 rows (two m16 tiles per warp share every K/V fragment; 16 rows at head
// sizes above 128), 2 CTAs per SM. Decode: 16 rows, 4 warps over the tokens. Narrow decode (fp8
// caches, head sizes >= 128, at most 8 rows): the products transposed, the rows as the n8
// columns (S^T = K Q^T, O^T = V^T P^T), so that no MMA, exponential or accumulator is spent on
// the 8 rows of an m16 tile that would be padding.
template <int D_PAD_, int KV_, bool DECODE_, bool NARROW_ = false> struct attnd_paged_traits {
    static constexpr int D_PAD = D_PAD_; // head size padded: 64, 128 or 256
    static constexpr int KV = KV_;
    static constexpr bool DECODE = DECODE_;
    static constexpr bool NARROW = NARROW_;
    static constexpr bool FP8 = KV == ATTND_KV_FP8;
    // bf16 caches compute in bf16; f16 and fp8 caches in f16 (fp8 -> f16 is exact).
    typedef typename attnd_select<KV == ATTND_KV_BF16, __nv_bfloat16, __half>::type TC;

    static constexpr bool BIG = D_PAD >= 256;
    static constexpr int MT = DECODE || BIG ? 1 : 2; // m16 tiles per warp
    static constexpr int WARPS_M = DECODE ? 1 : 4;
    static constexpr int WARPS_N = DECODE ? 4 : 1;
    static constexpr int WARPS = WARPS_M * WARPS_N;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int WROWS = NARROW ? 8 : 16 * MT; // rows per warp
    static constexpr int BLOCK_M = WROWS * WARPS_M;
    static constexpr int BLOCK_N = DECODE ? 64 : (BIG ? 16 : 64);
    static constexpr int NW = BLOCK_N / WARPS_N; // tokens a warp handles per tile
    // ... in steps of SUB (one QK^T / softmax / PV round; two m-tiles keep S at 32 tokens)
    static constexpr int SUB = MT == 2 ? 32 : NW;
    static constexpr bool Q_IN_REGS = MT == 1 && D_PAD <= 128;
    static constexpr bool REVERSE = !DECODE; // prefill: heaviest (latest) q-blocks first
    // fp8 decode: K fragments straight from the fp8 stage, only V converted (for ldmatrix.trans)
    static constexpr bool K_DIRECT = FP8 && DECODE;
    // ... and V's B fragments too (head sizes >= 128): no f16 copy of V, no ldmatrix.trans;
    // O's columns come out permuted (o_dim)
    static constexpr bool V_DIRECT = K_DIRECT && D_PAD >= 128;
    // O's accumulator tiles per m-tile: n8 tiles of 8 columns, narrow: m16 tiles of 16 dims
    static constexpr int O_TILES = NARROW ? D_PAD / 16 : D_PAD / 8;
    // S's: n8 tiles of 8 keys, narrow: one m16 tile of 16 keys
    static constexpr int S_TILES = NARROW ? 1 : SUB / 8;
    // Element e of lane (g, t)'s S tile n: its key within the SUB and its row (of the lane's two)
    static __device__ __forceinline__ int s_key(int n, int e, int g8, int t4)
    {
        return NARROW ? 8 * (e >> 1) + g8 : n * 8 + 2 * t4 + (e & 1);
    }
    static __device__ __forceinline__ int s_row(int e)
    {
        return NARROW ? e & 1 : e >> 1;
    }
    // fp8 decode at head sizes <= 128 ("slim"): 3 stages and registers capped at 168 (the launch
    // bounds of three CTAs per SM), but launched with two CTAs' share of shared memory per SM
    // (SMEM_LAUNCH): three CTAs per SM measured slower where they move the wave boundaries
    static constexpr bool SLIM = K_DIRECT && D_PAD <= 128 && !NARROW;
    // narrow tiles need at most 128 registers: four CTAs per SM at head 128 (where shared memory
    // allows it), so that a batch of 64 sequences x 8 kv heads runs in one wave
    static constexpr int NARROW_CTAS = D_PAD <= 128 ? 4 : 2;
    static constexpr int MIN_BLOCKS = SLIM ? 3 : (NARROW ? NARROW_CTAS : 1); // __launch_bounds__

    static constexpr int KV_BYTES = FP8 ? 1 : 2;
    static constexpr int ROW_RAW = D_PAD * KV_BYTES; // bytes of a K/V row as loaded
    static constexpr int ROW16 = D_PAD * 2;          // bytes of a 16-bit row
    static constexpr int CPR = ROW_RAW / 16;         // 16-byte chunks per loaded row
    static constexpr int TILE_RAW = BLOCK_N * ROW_RAW;
    // decode: each warp loads its own NW tokens of a tile (no CTA barrier per tile); prefill:
    // the CTA loads the whole tile
    static constexpr int LOADERS = DECODE ? 32 : THREADS;
    static constexpr int LOAD_ROWS = DECODE ? NW : BLOCK_N;
    static constexpr int ROWS_PER_PASS = LOADERS / CPR;
    static constexpr int LOAD_ITERS = LOAD_ROWS / ROWS_PER_PASS;
    // fp8 tiles are converted to f16 copies (decode: each warp its own tokens, V only)
    static constexpr int CONV_BYTES = FP8 && !V_DIRECT ? (K_DIRECT ? 1 : 2) * BLOCK_N * ROW16 : 0;
    static constexpr int Q_BYTES = BLOCK_M * ROW16;
    // decode: fp8 as many stages as fit next to a second CTA on the SM (~113 KB each; narrow at
    // head 128: a fourth of the SM), slim tiles 3 (4 measured slower, bench/RESULTS.md); 16-bit
    // caches 2 (deeper pipelines measured slower: short CTAs wait longer for their first tile)
    static constexpr int SM_SHARE = (SLIM ? 74 : (NARROW_CTAS == 4 && NARROW ? 56 : 113)) * 1024;
    static constexpr int NSTAGES_FIT = (SM_SHARE - Q_BYTES - CONV_BYTES) / (2 * TILE_RAW);
    static constexpr int NSTAGES_FP8 = NSTAGES_FIT < 2 ? 2 : (NSTAGES_FIT > 6 ? 6 : NSTAGES_FIT);
    static constexpr int NSTAGES = DECODE && FP8 ? (SLIM && NSTAGES_FP8 > 3 ? 3 : NSTAGES_FP8) : 2;
    static constexpr int PIPE_OFF = Q_BYTES;
    static constexpr int PIPE_BYTES = NSTAGES * 2 * TILE_RAW;
    static constexpr int CONV_OFF = PIPE_OFF + PIPE_BYTES;
    static constexpr int MAIN_BYTES = CONV_OFF + CONV_BYTES;
    static constexpr int EPI_STRIDE = D_PAD + 8; // floats per row of the epilogue buffer
    static constexpr int EPI_BYTES = WARPS_N * BLOCK_M * (EPI_STRIDE + 2) * 4;
    static constexpr int SMEM_BYTES = MAIN_BYTES > EPI_BYTES ? MAIN_BYTES : EPI_BYTES;
    // what a launch asks for: slim tiles more than a third of the SM's 228 KB (two CTAs per SM)
    static constexpr int SMEM_LAUNCH = SLIM && SMEM_BYTES < 80 * 1024 ? 80 * 1024 : SMEM_BYTES;

    static_assert(D_PAD == 64 || D_PAD == 128 || D_PAD == 256, "padded head size");
    static_assert(WARPS_M == 1 || WARPS_N == 1, "warps split rows or tokens, not both");
    static_assert(NW % 16 == 0 && SUB % 16 == 0 && NW % SUB == 0, "whole k16 steps");
    static_assert(!(FP8 && WARPS_N > 1) || SUB == NW, "per-warp fp8 conversion covers SUB");
    static_assert(LOADERS % CPR == 0 && LOAD_ROWS % ROWS_PER_PASS == 0, "load slots tile exactly");
    static_assert(ROW16 % 128 == 0, "swizzle needs rows of >= 8 chunks");
    static_assert(NSTAGES >= 2, "pipeline depth");
    static_assert(!NARROW || (V_DIRECT && SUB == 16 && MT == 1), "narrow: fp8 decode, head >= 128");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA");
    static_assert(!SLIM || SMEM_BYTES <= SM_SHARE, "slim tiles fit their share");
    static_assert((Q_BYTES % 128) == 0 && (TILE_RAW % 128) == 0, "stage alignment");
    static_assert((ROWS_PER_PASS & (ROWS_PER_PASS - 1)) == 0, "loader rows: a power of two");

    // The XOR key of an fp8 stage's row r (rows of >= 8 chunks): bit 2 = r0 ^ r2, bit 1 = r1.
    // 16-byte reads in one quarter-warp then hit distinct banks both for the direct K fragments
    // (rows r, r + 1 at chunks c..c + 3) and the direct V fragments (rows 0, 2, 4, 6 or 1, 3, 5,
    // 7 at chunks c, c + 1). Linear in r's bits: key(a | b) = key(a) ^ key(b).
    static __host__ __device__ __forceinline__ constexpr int raw_key(int r)
    {
        return CPR >= 8 ? ((((r ^ (r >> 2)) & 1) << 2) | (r & 2)) : 0;
    }
    // Byte offset of 16-byte chunk ch of row r in an fp8 stage.
    static __device__ __forceinline__ int raw_off(int r, int ch)
    {
        return r * ROW_RAW + ((ch ^ raw_key(r)) << 4);
    }
    // The head dimension that column c (0..7) of O's n8 tile n holds: n * 8 + c, or with V's
    // fragments direct (lane g's B columns are bytes 16 g.. of each 128-byte half row) 16 c + n
    // within each 128 columns. Narrow (O^T): the dimension of row c of m16 tile n (row c + 8:
    // the next one), bytes 2n, 2n + 1 of lane c's 16 bytes of a 128-byte half row.
    static __device__ __forceinline__ int o_dim(int n, int c)
    {
        if (NARROW) return 128 * (n >> 3) + 16 * c + 2 * (n & 7);
        return V_DIRECT ? 128 * (n >> 4) + 16 * c + (n & 15) : n * 8 + c;
    }
};

// fp8 rows [r0, r0 + NROWS) of the raw K and V tiles (Tr::raw_off) -> f16 rows (swizzled, ROW16
// bytes) of dk and dv (V_ONLY: of V alone), by NTHREADS threads (this one is i0). Up to MAXB
// 16-byte chunks per batch are loaded before any is converted, so their shared-memory latencies
// overlap (decode: 8). MAXB 0: one chunk at a time in a rolled loop (prefill, whose two m-tiles
// of O accumulators leave no registers for more).
template <class Tr, int NROWS, int NTHREADS, int MAXB, bool V_ONLY>
__device__ __forceinline__ void attnd_fp8_tiles_to_f16(const unsigned char *rk,
                                                       const unsigned char *rv, unsigned char *dk,
                                                       unsigned char *dv, int r0, int i0)
{
    constexpr int CPR = Tr::CPR, PER = NROWS * CPR, ALL = V_ONLY ? PER : 2 * PER;
    if (MAXB == 0) {
#pragma unroll 1
        for (int c = i0; c < ALL; c += NTHREADS) {
            const int which = V_ONLY || c >= PER, cc = c >= PER ? c - PER : c;
            const int r = r0 + cc / CPR, ch = cc % CPR;
            uint4 lo, hi;
            attnd_fp8x16_to_f16(*(const uint4 *)((which ? rv : rk) + Tr::raw_off(r, ch)), &lo, &hi);
            unsigned char *d = which ? dv : dk;
            *(uint4 *)(d + attnd_swz(r, 2 * ch, Tr::ROW16)) = lo;
            *(uint4 *)(d + attnd_swz(r, 2 * ch + 1, Tr::ROW16)) = hi;
        }
        return;
    }
    constexpr int ITER = ALL / NTHREADS, BATCH = MAXB < 1 ? 1 : (ITER < MAXB ? ITER : MAXB);
    static_assert(ITER * NTHREADS == ALL && ITER % BATCH == 0, "conversion slots tile exactly");
#pragma unroll
    for (int b0 = 0; b0 < ITER; b0 += BATCH) {
        uint4 w4[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int c = i0 + (b0 + b) * NTHREADS;
            const int which = V_ONLY || c >= PER, cc = c >= PER ? c - PER : c;
            w4[b] = *(const uint4 *)((which ? rv : rk) + Tr::raw_off(r0 + cc / CPR, cc % CPR));
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int c = i0 + (b0 + b) * NTHREADS;
            const int which = V_ONLY || c >= PER, cc = c >= PER ? c - PER : c;
            const int r = r0 + cc / CPR, ch = cc % CPR;
            uint4 lo, hi;
            attnd_fp8x16_to_f16(w4[b], &lo, &hi);
            unsigned char *d = which ? dv : dk;
            *(uint4 *)(d + attnd_swz(r, 2 * ch, Tr::ROW16)) = lo;
            *(uint4 *)(d + attnd_swz(r, 2 * ch + 1, Tr::ROW16)) = hi;
        }
    }
}

// The K/V tile loader: each thread copies 16-byte chunk `chunk` of rows row0 + i * ROWS_PER_PASS
// of a tile (K and V) from their cache pages into a pipeline stage.
template <class Tr> struct attnd_kv_loader {
    const unsigned char *kbase, *vbase;
    int32_t ks0, ks1, kcoff, vs0, vs1, vcoff; // byte strides / offsets
    uint32_t spipe, sdst;                     // stage 0's K tile; + this thread's first slot
    int row0, chunk, bs_mask, nbytes_ok;
    bool vec16;

    // slot: the thread's index among the LOADERS threads of its tile rows from rbase
    __device__ __forceinline__ void init(const attnd_paged_kargs &a, int slot, int rbase, int kvh,
                                         uint32_t spipe)
    {
        chunk = slot % Tr::CPR;
        row0 = rbase + slot / Tr::CPR;
        this->spipe = spipe;
        const int elems = Tr::FP8 ? 16 : 8, e0 = chunk * elems;
        const attnd_tensor &k = a.p.k_cache, &v = a.p.v_cache;
        nbytes_ok = min(max((int)a.p.q.shape[2] - e0, 0), elems) * Tr::KV_BYTES;
        kbase = (const unsigned char *)k.data;
        vbase = (const unsigned char *)v.data;
        ks0 = (int32_t)k.strides[0] * Tr::KV_BYTES;
        ks1 = (int32_t)k.strides[1] * Tr::KV_BYTES;
        kcoff = (kvh * (int32_t)k.strides[2] + e0) * Tr::KV_BYTES;
        vs0 = (int32_t)v.strides[0] * Tr::KV_BYTES;
        vs1 = (int32_t)v.strides[1] * Tr::KV_BYTES;
        vcoff = (kvh * (int32_t)v.strides[2] + e0) * Tr::KV_BYTES;
        bs_mask = (1 << a.bs_log2) - 1;
        vec16 = !Tr::FP8 || a.kv_vec16;
        sdst = spipe +
               (Tr::FP8 ? (uint32_t)Tr::raw_off(row0, chunk) : attnd_swz(row0, chunk, Tr::ROW_RAW));
    }

    // Row pass i's K slot in stage buffer buf (its V slot TILE_RAW on). fp8: the thread's first
    // row (row0 mod ROWS_PER_PASS) and i * ROWS_PER_PASS share no bits, so the slot is the first
    // one plus whole rows, its chunk XORed with raw_key(i * ROWS_PER_PASS) (both constants).
    __device__ __forceinline__ uint32_t slot(int i, int buf) const
    {
        const int r = row0 + i * Tr::ROWS_PER_PASS;
        const uint32_t key = (uint32_t)Tr::raw_key(i * Tr::ROWS_PER_PASS) << 4;
        return Tr::FP8 || Tr::ROWS_PER_PASS % 8 == 0
                   ? ((sdst + (uint32_t)(i * Tr::ROWS_PER_PASS * Tr::ROW_RAW)) ^ key) +
                         buf * 2 * Tr::TILE_RAW
                   : spipe + buf * 2 * Tr::TILE_RAW + attnd_swz(r, chunk, Tr::ROW_RAW);
    }

    // nbytes of the thread's chunk of a K row and a V row into K slot sk (the rest zero-filled).
    __device__ __forceinline__ void copy(uint32_t sk, const unsigned char *ks,
                                         const unsigned char *vs, int nbytes) const
    {
        const uint32_t sv = sk + Tr::TILE_RAW;
        if (vec16) {
            attnd_cp_async16(sk, ks, nbytes);
            attnd_cp_async16(sv, vs, nbytes);
        } else {
            const int n0 = min(nbytes, 8), n1 = max(nbytes - 8, 0);
            attnd_cp_async8(sk, ks, n0);
            attnd_cp_async8(sk + 8, n1 ? ks + 8 : ks, n1);
            attnd_cp_async8(sv, vs, n0);
            attnd_cp_async8(sv + 8, n1 ? vs + 8 : vs, n1);
        }
    }

    // Copy the tile of tokens t0.. into stage buffer buf; pages[i] < 0: zero-fill (past the range).
    template <bool SAME_STRIDES>
    __device__ __forceinline__ void issue(int t0, int buf, const int *pages) const
    {
#pragma unroll
        for (int i = 0; i < Tr::LOAD_ITERS; i++) {
            const int r = row0 + i * Tr::ROWS_PER_PASS;
            const int row = (t0 + r) & bs_mask;
            const bool ok = pages[i] >= 0;
            const int pgid = ok ? pages[i] : 0; // not read when !ok (0 bytes), a valid address
            const int64_t koff = attnd_mul_wide(pgid, ks0) + (row * ks1 + kcoff);
            const int64_t voff = SAME_STRIDES ? koff + (vcoff - kcoff)
                                              : attnd_mul_wide(pgid, vs0) + (row * vs1 + vcoff);
            const unsigned char *ks = kbase + koff, *vs = vbase + voff;
            copy(slot(i, buf), ks, vs, ok ? nbytes_ok : 0);
        }
    }
    // Decode: the NW tokens of a warp from tw, a multiple of 16 and so within one page pg (< 0:
    // none, zero-fill), into stage buffer buf; rows outside the keys [lo, hi) zero-filled (below
    // lo: a window's start rounded down; their pages may be reused). One page id per lane and
    // tile; the rows' addresses are the page's plus multiples of the row stride.
    template <bool SAME_STRIDES>
    __device__ __forceinline__ void issue_page(int tw, int lo, int hi, int buf, int pg) const
    {
        static_assert(Tr::DECODE, "decode tiles: a warp's tokens lie in one page");
        // rows i with skip <= i * RPP < rem hold keys (and the lane's chunk bytes of the head)
        const int lrow = row0 & (Tr::NW - 1);
        const int rem = pg >= 0 && nbytes_ok > 0 ? hi - tw - lrow : 0, skip = lo - tw - lrow;
        // 16-bit caches: rows of whole 16-byte chunks (the host checks), so always
        const bool whole = !Tr::FP8 || (vec16 && (nbytes_ok == 0 || nbytes_ok == 16));
        const int row = (tw & bs_mask) + lrow;
        const int pgid = pg >= 0 ? pg : 0; // not read when rem <= 0 (0 bytes), a valid address
        const int64_t koff = attnd_mul_wide(pgid, ks0) + (row * ks1 + kcoff);
        const int64_t voff =
            SAME_STRIDES ? koff + (vcoff - kcoff) : attnd_mul_wide(pgid, vs0) + (row * vs1 + vcoff);
        const unsigned char *ks = kbase + koff, *vs = vbase + voff;
#pragma unroll
        for (int i = 0; i < Tr::LOAD_ITERS; i++) {
            const bool ok = i * Tr::ROWS_PER_PASS < rem && i * Tr::ROWS_PER_PASS >= skip;
            const int nbytes = ok ? nbytes_ok : 0;
            const unsigned char *ki = ks + i * Tr::ROWS_PER_PASS * ks1;
            const unsigned char *vi = vs + i * Tr::ROWS_PER_PASS * (SAME_STRIDES ? ks1 : vs1);
            const uint32_t sk = slot(i, buf);
            if (whole) { // the lane's chunk is all in the head or all padding
                attnd_cp_async16_if(sk, ki, ok);
                attnd_cp_async16_if(sk + Tr::TILE_RAW, vi, ok);
            } else {
                copy(sk, ki, vi, nbytes);
            }
        }
    }
};

// The Q rows row0.. of a CTA -> shared memory at sq (compute type, swizzled), zero outside the
// rows and the head size.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_load_q(const attnd_paged_kargs &a, unsigned char *sq,
                                                  int row0, int rows_total, int q_start, int kvh,
                                                  int tid)
{
    typedef typename Tr::TC TC;
    const attnd_paged_params &p = a.p;
    const int g = a.group;
    constexpr int QCPR = Tr::D_PAD / 8;
#pragma unroll
    for (int c = tid; c < Tr::BLOCK_M * QCPR; c += Tr::THREADS) {
        const int r = c / QCPR, ch = c % QCPR;
        const int idx = row0 + r;
        float f[8];
        if (idx < rows_total && ch * 8 < (int)p.q.shape[2]) {
            const int tok = q_start + idx / g, head = kvh * g + idx % g;
            const int64_t e =
                (int64_t)tok * p.q.strides[0] + (int64_t)head * p.q.strides[1] + ch * 8;
            attnd_ld8(p.q.data, p.q.dtype, e, a.q_vec != 0, f);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                f[k] = 0.0f;
        }
        uint4 w;
        w.x = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f[0]), attnd_tc<TC>::clamp(f[1]));
        w.y = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f[2]), attnd_tc<TC>::clamp(f[3]));
        w.z = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f[4]), attnd_tc<TC>::clamp(f[5]));
        w.w = attnd_tc<TC>::pack(attnd_tc<TC>::clamp(f[6]), attnd_tc<TC>::clamp(f[7]));
        *(uint4 *)(sq + attnd_swz(r, ch, Tr::ROW16)) = w;
    }
}

// Scores s of keys t0.. (SUB per m-tile) -> logits in the log2 domain, masked where need_mask;
// returns the factor that still multiplies s on the way into exp2 (the scale on the fast path).
template <class Tr>
__device__ __forceinline__ float
attnd_sm80_logits(const attnd_paged_kargs &a, float (&s)[Tr::MT][Tr::S_TILES][4],
                  const int (&pos)[Tr::MT][2], const float (&slope2)[Tr::MT][2], int t0, int hi,
                  int g8, int t4, bool need_mask)
{
    const int sw = a.p.sliding_window;
    const float cap = a.p.softcap;
    if (!a.plain) {
        const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
#pragma unroll
        for (int mt = 0; mt < Tr::MT; mt++)
#pragma unroll
            for (int n = 0; n < Tr::S_TILES; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = Tr::s_row(e), ps = pos[mt][r];
                    const int t = t0 + Tr::s_key(n, e, g8, t4);
                    float x = s[mt][n][e] * a.qk_scale;
                    if (cap > 0.0f) x = cap * attnd_tanh(x * inv_cap);
                    x = x * ATTND_LOG2E + slope2[mt][r] * (float)(t - ps);
                    if (need_mask && !attnd_paged_visible(t, ps, hi, sw)) x = attnd_neg_inf();
                    s[mt][n][e] = x;
                }
        return 1.0f;
    }
    if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < Tr::MT; mt++)
#pragma unroll
            for (int n = 0; n < Tr::S_TILES; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = t0 + Tr::s_key(n, e, g8, t4);
                    if (!attnd_paged_visible(t, pos[mt][Tr::s_row(e)], hi, sw))
                        s[mt][n][e] = attnd_neg_inf();
                }
    }
    return a.qk_scale_log2;
}

// Online softmax of logits s (times c) into probabilities; the rows' maxima m and sums l
// updated, O rescaled (skipped when no row max of the warp moved).
template <class Tr>
__device__ __forceinline__ void attnd_sm80_softmax(float (&s)[Tr::MT][Tr::S_TILES][4], float c,
                                                   float (&m_r)[Tr::MT][2], float (&l_r)[Tr::MT][2],
                                                   float (&o)[Tr::MT][Tr::O_TILES][4])
{
#pragma unroll
    for (int mt = 0; mt < Tr::MT; mt++) {
        float mx[2] = {attnd_neg_inf(), attnd_neg_inf()};
#pragma unroll
        for (int n = 0; n < Tr::SUB / 8; n++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[mt][n][0], s[mt][n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[mt][n][2], s[mt][n][3]));
        }
        float ms[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_new = fmaxf(m_r[mt][r], attnd_quad_max(mx[r]) * c);
            ms[r] = attnd_softmax_safe_max(m_new);
            // a row with nothing visible yet has o = 0 and l = 0: 1 keeps it so and lets padded
            // rows (decode) skip the rescale below
            alpha[r] = m_r[mt][r] == attnd_neg_inf() ? 1.0f : attnd_exp2(m_r[mt][r] - ms[r]);
            m_r[mt][r] = m_new;
        }
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < Tr::SUB / 8; n++) {
            s[mt][n][0] = attnd_exp2(fmaf(s[mt][n][0], c, -ms[0]));
            s[mt][n][1] = attnd_exp2(fmaf(s[mt][n][1], c, -ms[0]));
            s[mt][n][2] = attnd_exp2(fmaf(s[mt][n][2], c, -ms[1]));
            s[mt][n][3] = attnd_exp2(fmaf(s[mt][n][3], c, -ms[1]));
            rs[0] += s[mt][n][0] + s[mt][n][1];
            rs[1] += s[mt][n][2] + s[mt][n][3];
        }
        l_r[mt][0] = l_r[mt][0] * alpha[0] + rs[0];
        l_r[mt][1] = l_r[mt][1] * alpha[1] + rs[1];
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < Tr::D_PAD / 8; n++) {
                o[mt][n][0] *= alpha[0];
                o[mt][n][1] *= alpha[0];
                o[mt][n][2] *= alpha[1];
                o[mt][n][3] *= alpha[1];
            }
        }
    }
}

// The online softmax of narrow tiles (S^T: lane (g, t) holds keys g, g + 8 of rows 2t, 2t + 1),
// as attnd_sm80_softmax: each row's maximum over the 8 lanes of its column.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_softmax_narrow(float (&s)[1][1][4], float c,
                                                          float (&m_r)[1][2], float (&l_r)[1][2],
                                                          float (&o)[1][Tr::O_TILES][4])
{
    float ms[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float m_new = fmaxf(m_r[0][r], attnd_col_max(fmaxf(s[0][0][r], s[0][0][r + 2])) * c);
        ms[r] = attnd_softmax_safe_max(m_new);
        alpha[r] = m_r[0][r] == attnd_neg_inf() ? 1.0f : attnd_exp2(m_r[0][r] - ms[r]);
        m_r[0][r] = m_new;
    }
#pragma unroll
    for (int e = 0; e < 4; e++)
        s[0][0][e] = attnd_exp2(fmaf(s[0][0][e], c, -ms[e & 1]));
    l_r[0][0] = l_r[0][0] * alpha[0] + (s[0][0][0] + s[0][0][2]);
    l_r[0][1] = l_r[0][1] * alpha[1] + (s[0][0][1] + s[0][0][3]);
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < Tr::O_TILES; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[0][n][e] *= alpha[e & 1];
    }
}

// Epilogue through shared memory (warps that split the tokens, partial 3D outputs, unaligned
// outputs): per-warp O, m, l -> smem (attnd_sm80_stash), then per row the warps' states merged
// (attnd_sm80_combine), normalised and stored (attnd_sm80_store_row: final output and LSE, or
// the segment's partial). eo: WARPS_N x BLOCK_M rows of EPI_STRIDE floats; eml: (m, l) pairs.
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_stash(float *eo, float *eml, const float (&o)[Tr::MT][Tr::O_TILES][4],
                 const float (&m_r)[Tr::MT][2], const float (&l_r)[Tr::MT][2], int wm, int wn,
                 int lane)
{
    const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < Tr::MT; mt++) {
        const float lq0 = attnd_quad_sum(l_r[mt][0]), lq1 = attnd_quad_sum(l_r[mt][1]);
        const int rbase = wn * Tr::BLOCK_M + wm * Tr::WROWS + mt * 16 + g8;
#pragma unroll
        for (int n = 0; n < Tr::D_PAD / 8; n++) {
            const int col = Tr::o_dim(n, 2 * t4);
            if (Tr::V_DIRECT) { // the pair's columns lie 16 apart
                const int col1 = Tr::o_dim(n, 2 * t4 + 1);
                eo[rbase * Tr::EPI_STRIDE + col] = o[mt][n][0];
                eo[rbase * Tr::EPI_STRIDE + col1] = o[mt][n][1];
                eo[(rbase + 8) * Tr::EPI_STRIDE + col] = o[mt][n][2];
                eo[(rbase + 8) * Tr::EPI_STRIDE + col1] = o[mt][n][3];
            } else {
                *(float2 *)(eo + rbase * Tr::EPI_STRIDE + col) =
                    make_float2(o[mt][n][0], o[mt][n][1]);
                *(float2 *)(eo + (rbase + 8) * Tr::EPI_STRIDE + col) =
                    make_float2(o[mt][n][2], o[mt][n][3]);
            }
        }
        if (t4 == 0) {
            eml[2 * rbase] = m_r[mt][0];
            eml[2 * rbase + 1] = lq0;
            eml[2 * (rbase + 8)] = m_r[mt][1];
            eml[2 * (rbase + 8) + 1] = lq1;
        }
    }
}

// attnd_sm80_stash for narrow tiles (O^T: lane (g, t) holds rows 2t, 2t + 1 of the dimensions
// o_dim(mt, g) and o_dim(mt, g) + 1; the sums l over the column's 8 lanes).
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_stash_narrow(float *eo, float *eml, const float (&o)[1][Tr::O_TILES][4],
                        const float (&m_r)[1][2], const float (&l_r)[1][2], int wn, int lane)
{
    const int g8 = lane >> 2, t4 = lane & 3;
    const float lq0 = attnd_col_sum(l_r[0][0]), lq1 = attnd_col_sum(l_r[0][1]);
    const int rbase = wn * Tr::BLOCK_M + 2 * t4;
#pragma unroll
    for (int mt = 0; mt < Tr::O_TILES; mt++) {
        const int col = Tr::o_dim(mt, g8);
        *(float2 *)(eo + rbase * Tr::EPI_STRIDE + col) = make_float2(o[0][mt][0], o[0][mt][2]);
        *(float2 *)(eo + (rbase + 1) * Tr::EPI_STRIDE + col) =
            make_float2(o[0][mt][1], o[0][mt][3]);
    }
    if (g8 == 0) {
        eml[2 * rbase] = m_r[0][0];
        eml[2 * rbase + 1] = lq0;
        eml[2 * (rbase + 1)] = m_r[0][1];
        eml[2 * (rbase + 1) + 1] = lq1;
    }
}

// Row r, columns c4 * 4 .. + 3: the warps' states merged. M: the row's max; Ms: the max v and
// L are relative to (attnd_softmax_safe_max of M); v: the unnormalised output.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_combine(const float *eo, const float *eml, int r, int c4,
                                                   float *M, float *Ms, float *L, float (&v)[4])
{
    float m = attnd_neg_inf();
#pragma unroll
    for (int w = 0; w < Tr::WARPS_N; w++)
        m = fmaxf(m, eml[2 * (w * Tr::BLOCK_M + r)]);
    const float ms = attnd_softmax_safe_max(m);
    float l = 0.0f;
    v[0] = v[1] = v[2] = v[3] = 0.0f;
#pragma unroll
    for (int w = 0; w < Tr::WARPS_N; w++) {
        const float wt = attnd_exp2(eml[2 * (w * Tr::BLOCK_M + r)] - ms);
        l += wt * eml[2 * (w * Tr::BLOCK_M + r) + 1];
        const float4 x = *(const float4 *)(eo + (w * Tr::BLOCK_M + r) * Tr::EPI_STRIDE + c4 * 4);
        v[0] += wt * x.x;
        v[1] += wt * x.y;
        v[2] += wt * x.z;
        v[3] += wt * x.w;
    }
    *M = m;
    *Ms = ms;
    *L = l;
}

// Store columns c4 * 4 .. + 3 of packed row idx, merged (M, Ms, L, v as attnd_sm80_combine
// gives them): normalised into the output (the sink folded in) and its LSE, or as segment
// seg's partial (normalised, with its max and sum) when the op splits the context.
__device__ __forceinline__ void attnd_sm80_store_row(const attnd_paged_kargs &a, int idx, int c4,
                                                     float M, float Ms, float L, float (&v)[4],
                                                     int q_start, int kvh, int seg)
{
    const attnd_paged_params &p = a.p;
    const bool partial = a.num_segments > 1;
    const int tok = q_start + idx / a.group, head = kvh * a.group + idx % a.group;
    float Mf = Ms; // the final row's max (the sink folded in), what v and L are relative to
    const float sink = partial ? 1.0f : attnd_paged_sink(a, head, &Mf, &L);
    const float inv = L > 0.0f ? sink * a.out_scale / L : 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++)
        v[k] *= inv;
    if (!partial) {
        attnd_stN<4>(p.out.data, p.out.dtype,
                     (int64_t)tok * p.out.strides[0] + (int64_t)head * p.out.strides[1] + c4 * 4,
                     a.out_vec != 0, v);
        if (p.out_lse.data && c4 == 0)
            ((float *)p.out_lse.data)[(int64_t)head * p.out_lse.strides[0] +
                                      (int64_t)tok * p.out_lse.strides[1]] =
                attnd_softmax_lse(Mf, L);
    } else {
        const int64_t R = ((int64_t)tok * p.q.shape[1] + head) * a.num_segments + seg;
        *(float4 *)(a.ws_o + R * p.q.shape[2] + c4 * 4) = make_float4(v[0], v[1], v[2], v[3]);
        if (c4 == 0) {
            a.ws_m[R] = L > 0.0f ? M : attnd_neg_inf();
            a.ws_l[R] = L;
        }
    }
}

template <class Tr>
__device__ __forceinline__ void
attnd_sm80_merge_store(const attnd_paged_kargs &a, unsigned char *smem,
                       const float (&o)[Tr::MT][Tr::O_TILES][4], const float (&m_r)[Tr::MT][2],
                       const float (&l_r)[Tr::MT][2], int wm, int wn, int row0, int rows_total,
                       int q_start, int kvh, int seg, int tid)
{
    constexpr int C4 = Tr::D_PAD / 4;
    const int d_act = (int)a.p.q.shape[2];
    float *eo = (float *)smem;
    float *eml = eo + Tr::WARPS_N * Tr::BLOCK_M * Tr::EPI_STRIDE;
    __syncthreads();
    if constexpr (Tr::NARROW)
        attnd_sm80_stash_narrow<Tr>(eo, eml, o, m_r, l_r, wn, tid & 31);
    else
        attnd_sm80_stash<Tr>(eo, eml, o, m_r, l_r, wm, wn, tid & 31);
    __syncthreads();
#pragma unroll 1
    for (int c = tid; c < Tr::BLOCK_M * C4; c += Tr::THREADS) {
        const int r = c / C4, c4 = c % C4;
        if (row0 + r >= rows_total || c4 * 4 >= d_act) continue;
        float M, Ms, L, v[4];
        attnd_sm80_combine<Tr>(eo, eml, r, c4, &M, &Ms, &L, v);
        attnd_sm80_store_row(a, row0 + r, c4, M, Ms, L, v, q_start, kvh, seg);
    }
}

// Which rows this CTA owns (blockIdx.x = q-block qb of the flattened batch): its sequence and
// q-block within it; false when qb lies past the last sequence.
template <class Tr>
__device__ __forceinline__ bool attnd_sm80_cta_rows(const attnd_paged_kargs &a, int qb, int *seq,
                                                    int *qb_local)
{
    if (a.direct) {
        *seq = qb;
        *qb_local = 0;
        return true;
    }
    const int32_t *qsl = (const int32_t *)a.p.query_start_loc.data;
    const int64_t qsl_s0 = a.p.query_start_loc.strides[0];
    const int g = a.group;
    int lo_s = 0, hi_s = (int)a.p.seq_lens.shape[0];
    while (lo_s < hi_s) {
        int mid = (lo_s + hi_s) >> 1;
        int64_t start = (int64_t)qsl[mid * qsl_s0] * g / Tr::BLOCK_M + mid;
        if (start <= qb)
            lo_s = mid + 1;
        else
            hi_s = mid;
    }
    *seq = lo_s - 1;
    if (*seq < 0) return false;
    *qb_local = qb - (int)((int64_t)qsl[*seq * qsl_s0] * g / Tr::BLOCK_M + *seq);
    return true;
}

// Chunk kk of a swizzled 16-bit row: four lane-dependent offsets x (kk % 4) plus an immediate.
#define ATTND_SWZ_OFF(x, kk) ((x)[(kk)&3] + (uint32_t)(((kk) >> 2) << 7))

// S = Q K^T for this warp's MT m-tiles and SUB keys: Q from registers (qf) or shared memory
// (q_a: this lane's ldmatrix row), K rows at k_a; qx / kx: the lanes' swizzled chunk offsets.
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_qk(float (&s)[Tr::MT][Tr::S_TILES][4],
              const uint32_t (&qf)[Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1][4], uint32_t q_a,
              const uint32_t (&qx)[4], uint32_t k_a, const uint32_t (&kx)[4])
{
    typedef typename Tr::TC TC;
#pragma unroll
    for (int mt = 0; mt < Tr::MT; mt++)
#pragma unroll
        for (int n = 0; n < Tr::SUB / 8; n++)
            s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Tr::D_PAD / 16; kk++) {
        uint32_t af[Tr::MT][4];
#pragma unroll
        for (int mt = 0; mt < Tr::MT; mt++) {
            if (Tr::Q_IN_REGS) {
#pragma unroll
                for (int x = 0; x < 4; x++)
                    af[mt][x] = qf[Tr::Q_IN_REGS ? kk : 0][x];
            } else {
                attnd_ldsm_x4(q_a + mt * 16 * Tr::ROW16 + ATTND_SWZ_OFF(qx, kk), af[mt]);
            }
        }
#pragma unroll
        for (int n2 = 0; n2 < Tr::SUB / 16; n2++) {
            uint32_t bf[4];
            attnd_ldsm_x4(k_a + n2 * 16 * Tr::ROW16 + ATTND_SWZ_OFF(kx, kk), bf);
#pragma unroll
            for (int mt = 0; mt < Tr::MT; mt++) {
                attnd_mma<TC>::run(s[mt][2 * n2], af[mt], bf[0], bf[1]);
                attnd_mma<TC>::run(s[mt][2 * n2 + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

// Direct fp8 K fragments. Q K^T sums over the head dimension, so any order of it serves if Q
// and K agree: k-step kk = 4c + s of 64-column group c takes, in lane (g, t), the K columns
// 64c + 16t + 4s + 0..3 (4 bytes of the 16 the lane reads at once) as B[2t..][g] and
// B[2t+8..][g], and the same Q columns as A.
// Row r's pairs of k-step kk in lane t, in that order, from Q (swizzled, compute type, at
// sq_a): k 2t, 2t + 1 into lo, k 2t + 8, 2t + 9 into hi.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_q_row_k8(uint32_t sq_a, int r, int kk, int t4,
                                                    uint32_t *lo, uint32_t *hi)
{
    const int c = kk >> 2, s = kk & 3, ch = 8 * c + 2 * t4 + (s >> 1);
    attnd_lds64(sq_a + attnd_swz(r, ch, Tr::ROW16) + 8 * (s & 1), lo, hi);
}

// The A fragment of k-step kk for rows g and g + 8 of Q.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_q_frag_k8(uint32_t sq_a, int kk, int lane,
                                                     uint32_t (&af)[4])
{
    attnd_sm80_q_row_k8<Tr>(sq_a, lane >> 2, kk, lane & 3, &af[0], &af[2]);
    attnd_sm80_q_row_k8<Tr>(sq_a, (lane >> 2) + 8, kk, lane & 3, &af[1], &af[3]);
}

// Word q (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t attnd_u4_word(const uint4 &x, int q)
{
    return q == 0 ? x.x : (q == 1 ? x.y : (q == 2 ? x.z : x.w));
}

// This lane's fp8 K chunks of SUB keys from the stage: k_a is its K row (g, in n-tile 0), kx
// the byte offset of its chunk t there, swizzled (Tr::raw_off); chunk 4c + t lies at kx ^ 64 c.
// Loaded before the warp's other shared-memory work, so that their latency hides under it (the
// first conversion of K waited for them: 6.5% of the fp8 decode's stall samples).
template <class Tr>
__device__ __forceinline__ void attnd_sm80_k8_load(uint4 (&wk)[Tr::D_PAD / 64][Tr::SUB / 8],
                                                   uint32_t k_a, uint32_t kx)
{
#pragma unroll
    for (int c = 0; c < Tr::D_PAD / 64; c++)
#pragma unroll
        for (int n = 0; n < Tr::SUB / 8; n++)
            wk[c][n] = attnd_lds128(k_a + n * 8 * Tr::ROW_RAW + 128 * (c >> 1) +
                                    (kx ^ (uint32_t)(64 * (c & 1))));
}

// S = Q K^T for SUB keys from the K chunks above; Q from registers (qf, in the order above) or
// from sq_a.
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_qk_k8(float (&s)[Tr::MT][Tr::S_TILES][4],
                 const uint32_t (&qf)[Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1][4], uint32_t sq_a,
                 int lane, const uint4 (&wk)[Tr::D_PAD / 64][Tr::SUB / 8])
{
    typedef typename Tr::TC TC;
    static_assert(Tr::MT == 1 && Tr::K_DIRECT, "decode tiles");
#pragma unroll
    for (int n = 0; n < Tr::SUB / 8; n++)
        s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < Tr::D_PAD / 64; c++) {
        const uint4(&w)[Tr::SUB / 8] = wk[c];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int kk = 4 * c + q;
            uint32_t af[4];
            if (Tr::Q_IN_REGS) {
#pragma unroll
                for (int x = 0; x < 4; x++)
                    af[x] = qf[Tr::Q_IN_REGS ? kk : 0][x];
            } else {
                attnd_sm80_q_frag_k8<Tr>(sq_a, kk, lane, af);
            }
#pragma unroll
            for (int n = 0; n < Tr::SUB / 8; n++) {
                const uint32_t x = attnd_u4_word(w[n], q);
                attnd_mma<TC>::run(s[0][n], af, attnd_fp8x2_to_half2<0>(x),
                                   attnd_fp8x2_to_half2<1>(x));
            }
        }
    }
}

// A of P V for keys 16 kk.. of m-tile mt: the probabilities s packed to the compute type.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_p_frag(const float (&s)[Tr::MT][Tr::S_TILES][4], int mt,
                                                  int kk, uint32_t (&pa)[4])
{
    typedef typename Tr::TC TC;
    pa[0] = attnd_tc<TC>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
    pa[1] = attnd_tc<TC>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
    pa[2] = attnd_tc<TC>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
    pa[3] = attnd_tc<TC>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
}

// O += P V: P from the probabilities s (compute type), V rows at v_a (ldmatrix.trans).
template <class Tr>
__device__ __forceinline__ void attnd_sm80_pv(float (&o)[Tr::MT][Tr::O_TILES][4],
                                              const float (&s)[Tr::MT][Tr::S_TILES][4],
                                              uint32_t v_a, const uint32_t (&vx)[4])
{
    typedef typename Tr::TC TC;
#pragma unroll
    for (int kk = 0; kk < Tr::SUB / 16; kk++) {
        uint32_t pa[Tr::MT][4];
#pragma unroll
        for (int mt = 0; mt < Tr::MT; mt++)
            attnd_sm80_p_frag<Tr>(s, mt, kk, pa[mt]);
#pragma unroll
        for (int n2 = 0; n2 < Tr::D_PAD / 16; n2++) {
            uint32_t bf[4];
            attnd_ldsm_x4_trans(v_a + kk * 16 * Tr::ROW16 + ATTND_SWZ_OFF(vx, n2), bf);
#pragma unroll
            for (int mt = 0; mt < Tr::MT; mt++) {
                attnd_mma<TC>::run(o[mt][2 * n2], pa[mt], bf[0], bf[1]);
                attnd_mma<TC>::run(o[mt][2 * n2 + 1], pa[mt], bf[2], bf[3]);
            }
        }
    }
}

// This lane's V bytes of 128-column half h from the fp8 stage, paired for direct fragments:
// lane (g, t) reads 16 bytes at chunk g of rows 2t, 2t + 1 (x) and 2t + 8, 2t + 9 (y) (v_a: the
// warp's first V row); word w's bytes b = 4w + 0, 1 as (row 2t, row 2t + 1) pairs in xl[w] (b = 4w
// + 2, 3 in xh[w]), rows 2t + 8, 2t + 9 in yl, yh.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_v8_pairs(uint32_t v_a, int lane, int h,
                                                    uint32_t (&xl)[4], uint32_t (&xh)[4],
                                                    uint32_t (&yl)[4], uint32_t (&yh)[4])
{
    const int g8 = lane >> 2, t4 = lane & 3;
    const uint32_t r0 = 2 * t4, r1 = 2 * t4 + 1;
    const uint32_t a0 = v_a + r0 * Tr::ROW_RAW + ((g8 ^ Tr::raw_key(r0)) << 4) + 128 * h;
    const uint32_t a1 = v_a + r1 * Tr::ROW_RAW + ((g8 ^ Tr::raw_key(r1)) << 4) + 128 * h;
    const uint4 x0 = attnd_lds128(a0), x1 = attnd_lds128(a1);
    const uint4 y0 = attnd_lds128(a0 + 8 * Tr::ROW_RAW), y1 = attnd_lds128(a1 + 8 * Tr::ROW_RAW);
    const uint32_t xw0[4] = {x0.x, x0.y, x0.z, x0.w}, xw1[4] = {x1.x, x1.y, x1.z, x1.w};
    const uint32_t yw0[4] = {y0.x, y0.y, y0.z, y0.w}, yw1[4] = {y1.x, y1.y, y1.z, y1.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        xl[w] = __byte_perm(xw0[w], xw1[w], 0x5140);
        xh[w] = __byte_perm(xw0[w], xw1[w], 0x7362);
        yl[w] = __byte_perm(yw0[w], yw1[w], 0x5140);
        yh[w] = __byte_perm(yw0[w], yw1[w], 0x7362);
    }
}

// O += P V with V's B fragments straight from the fp8 stage (Tr::V_DIRECT, SUB == 16 keys):
// lane (g, t) reads 16 bytes at chunk g (+ 8 per 128 columns) of V rows 2t, 2t + 1, 2t + 8 and
// 2t + 9 and pairs their bytes (PRMT), byte n of the chunk being column g of n8 tile n (o_dim).
// v_a: the warp's first V row in the stage.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_pv_v8(float (&o)[Tr::MT][Tr::O_TILES][4],
                                                 const float (&s)[Tr::MT][Tr::S_TILES][4],
                                                 uint32_t v_a, int lane)
{
    typedef typename Tr::TC TC;
    static_assert(Tr::V_DIRECT && Tr::MT == 1 && Tr::SUB == 16, "decode tiles");
    uint32_t pa[4];
    attnd_sm80_p_frag<Tr>(s, 0, 0, pa);
#pragma unroll
    for (int h = 0; h < Tr::D_PAD / 128; h++) {
        uint32_t xl[4], xh[4], yl[4], yh[4]; // B's k 2t, 2t + 1 (x) and k + 8 (y)
        attnd_sm80_v8_pairs<Tr>(v_a, lane, h, xl, xh, yl, yh);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float(&oo)[Tr::O_TILES][4] = o[0];
            const int n = 16 * h + 4 * w;
            attnd_mma<TC>::run(oo[n], pa, attnd_fp8x2_to_half2<0>(xl[w]),
                               attnd_fp8x2_to_half2<0>(yl[w]));
            attnd_mma<TC>::run(oo[n + 1], pa, attnd_fp8x2_to_half2<1>(xl[w]),
                               attnd_fp8x2_to_half2<1>(yl[w]));
            attnd_mma<TC>::run(oo[n + 2], pa, attnd_fp8x2_to_half2<0>(xh[w]),
                               attnd_fp8x2_to_half2<0>(yh[w]));
            attnd_mma<TC>::run(oo[n + 3], pa, attnd_fp8x2_to_half2<1>(xh[w]),
                               attnd_fp8x2_to_half2<1>(yh[w]));
        }
    }
}

// Narrow tiles: S^T = K Q^T for the warp's 16 keys, K (A, rows = keys g and g + 8) from this
// lane's fp8 chunks (attnd_sm80_k8_load, the k order of attnd_sm80_qk_k8), Q (B) row g from
// registers (qf[kk][0..1]) or shared memory. Even and odd k-steps accumulate apart (two chains).
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_qk_narrow(float (&s)[1][1][4],
                     const uint32_t (&qf)[Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1][4], uint32_t sq_a,
                     int lane, const uint4 (&wk)[Tr::D_PAD / 64][2])
{
    typedef typename Tr::TC TC;
    static_assert(Tr::NARROW && Tr::SUB == 16, "narrow decode tiles");
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int c = 0; c < Tr::D_PAD / 64; c++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int kk = 4 * c + q;
            uint32_t b0, b1;
            if (Tr::Q_IN_REGS) {
                b0 = qf[Tr::Q_IN_REGS ? kk : 0][0];
                b1 = qf[Tr::Q_IN_REGS ? kk : 0][1];
            } else {
                attnd_sm80_q_row_k8<Tr>(sq_a, lane >> 2, kk, lane & 3, &b0, &b1);
            }
            const uint32_t xw = attnd_u4_word(wk[c][0], q), yw = attnd_u4_word(wk[c][1], q);
            const uint32_t af[4] = {attnd_fp8x2_to_half2<0>(xw), attnd_fp8x2_to_half2<0>(yw),
                                    attnd_fp8x2_to_half2<1>(xw), attnd_fp8x2_to_half2<1>(yw)};
            attnd_mma<TC>::run(acc[kk & 1], af, b0, b1);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++)
        s[0][0][e] = acc[0][e] + acc[1][e];
}

// Narrow tiles: O^T += V^T P^T. P^T (B) from the probabilities by two transposes (keys 0..7,
// 8..15); V^T (A) from the fp8 stage as attnd_sm80_pv_v8 reads it, lane (g, t) pairing rows 2t,
// 2t + 1 (and 2t + 8, 2t + 9) at each byte of its 16: bytes 2n, 2n + 1 are rows g, g + 8 of m16
// tile n (o_dim). v_a: the warp's first V row in the stage.
template <class Tr>
__device__ __forceinline__ void attnd_sm80_pv_narrow(float (&o)[1][Tr::O_TILES][4],
                                                     const float (&s)[1][1][4], uint32_t v_a,
                                                     int lane)
{
    typedef typename Tr::TC TC;
    static_assert(Tr::NARROW && Tr::SUB == 16, "narrow decode tiles");
    const uint32_t b0 = attnd_movm_trans(attnd_tc<TC>::pack(s[0][0][0], s[0][0][1]));
    const uint32_t b1 = attnd_movm_trans(attnd_tc<TC>::pack(s[0][0][2], s[0][0][3]));
#pragma unroll
    for (int h = 0; h < Tr::D_PAD / 128; h++) {
        uint32_t xl[4], xh[4], yl[4], yh[4];
        attnd_sm80_v8_pairs<Tr>(v_a, lane, h, xl, xh, yl, yh);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t al[4] = {attnd_fp8x2_to_half2<0>(xl[w]), attnd_fp8x2_to_half2<1>(xl[w]),
                                    attnd_fp8x2_to_half2<0>(yl[w]), attnd_fp8x2_to_half2<1>(yl[w])};
            const uint32_t ah[4] = {attnd_fp8x2_to_half2<0>(xh[w]), attnd_fp8x2_to_half2<1>(xh[w]),
                                    attnd_fp8x2_to_half2<0>(yh[w]), attnd_fp8x2_to_half2<1>(yh[w])};
            attnd_mma<TC>::run(o[0][8 * h + 2 * w], al, b0, b1);
            attnd_mma<TC>::run(o[0][8 * h + 2 * w + 1], ah, b0, b1);
        }
    }
}

// The lane's places in shared memory: ldmatrix row offsets (bytes) of Q, K and V and their
// swizzled chunk offsets (chunk c = 2 * kk + cadd sits at ((c & 7) ^ (lane & 7)) + (c & ~7): four
// lane-dependent offsets per operand, kk % 4; the rest are immediates), and for fp8 decode the
// lane's K row (g of the warp's first n-tile) in a stage and its chunk's swizzled offset.
template <class Tr> struct attnd_sm80_lane {
    uint32_t sq_a, q_lane, k_lane, v_lane, k8_lane, k8_x;
    uint32_t qx[4], kx[4], vx[4];
    int lane, g8, t4, wn;

    __device__ __forceinline__ void init(uint32_t sq_a_, int wm, int wn_, int lane_)
    {
        sq_a = sq_a_;
        lane = lane_;
        wn = wn_;
        g8 = lane >> 2;
        t4 = lane & 3;
        const int xk = lane & 7, q_cadd = lane >> 4, k_cadd = (lane >> 3) & 1, v_cadd = lane >> 4;
        q_lane = (uint32_t)((wm * Tr::WROWS + (lane & 7) + (((lane >> 3) & 1) << 3)) * Tr::ROW16);
        k_lane = (uint32_t)((wn * Tr::NW + (lane & 7) + ((lane >> 4) << 3)) * Tr::ROW16);
        v_lane = (uint32_t)((wn * Tr::NW + (lane & 7) + (((lane >> 3) & 1) << 3)) * Tr::ROW16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qx[i] = (uint32_t)(((2 * i + q_cadd) ^ xk) << 4);
            kx[i] = (uint32_t)(((2 * i + k_cadd) ^ xk) << 4);
            vx[i] = (uint32_t)(((2 * i + v_cadd) ^ xk) << 4);
        }
        k8_lane = (uint32_t)((wn * Tr::NW + g8) * Tr::ROW_RAW);
        k8_x = (uint32_t)(t4 ^ Tr::raw_key(g8)) << 4;
    }

    // Q's fragments for every k-step into registers (Tr::Q_IN_REGS): A of Q K^T, in the k order
    // of the direct fp8 K fragments where K is direct; narrow tiles: B of S^T = K Q^T (row g's A
    // pairs of attnd_sm80_q_frag_k8)
    __device__ __forceinline__ void
    q_frags(uint32_t (&qf)[Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1][4]) const
    {
#pragma unroll
        for (int kk = 0; kk < (Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1); kk++) {
            if (Tr::NARROW) {
                attnd_sm80_q_row_k8<Tr>(sq_a, g8, kk, t4, &qf[kk][0], &qf[kk][1]);
                qf[kk][2] = qf[kk][3] = 0u;
            } else if (Tr::K_DIRECT)
                attnd_sm80_q_frag_k8<Tr>(sq_a, kk, lane, qf[kk]);
            else
                attnd_ldsm_x4(sq_a + q_lane + ATTND_SWZ_OFF(qx, kk), qf[kk]);
        }
    }
};

// One step of the main loop: this warp's SUB keys from t0 (step h of its tokens in the tile)
// against its rows. rk / rv (kt_a / vt_a): the tile's K and V stages; sconv: the f16 copies of
// fp8 tiles (the decode tiles' V).
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_step(const attnd_paged_kargs &a, const attnd_sm80_lane<Tr> &ln,
                const uint32_t (&qf)[Tr::Q_IN_REGS ? Tr::D_PAD / 16 : 1][4],
                const int (&pos)[Tr::MT][2], const float (&slope2)[Tr::MT][2], int t0, int hi,
                bool need_mask, int h, const unsigned char *rk, const unsigned char *rv,
                unsigned char *sconv, uint32_t sconv_a, uint32_t kt_a, uint32_t vt_a,
                float (&o)[Tr::MT][Tr::O_TILES][4], float (&m_r)[Tr::MT][2],
                float (&l_r)[Tr::MT][2])
{
    constexpr int D_PAD = Tr::D_PAD, SUB = Tr::SUB, NW = Tr::NW, ROW16 = Tr::ROW16;
    const int lane = ln.lane, g8 = ln.g8, t4 = ln.t4, wn = ln.wn;
    const uint32_t sq_a = ln.sq_a;
    float s[Tr::MT][Tr::S_TILES][4];
    if constexpr (Tr::NARROW) { // transposed: S^T, softmax by columns, O^T
        uint4 wk[D_PAD / 64][SUB / 8];
        attnd_sm80_k8_load<Tr>(wk, kt_a + ln.k8_lane, ln.k8_x);
        attnd_sm80_qk_narrow<Tr>(s, qf, sq_a, lane, wk);
        const float c = attnd_sm80_logits<Tr>(a, s, pos, slope2, t0, hi, g8, t4, need_mask);
        attnd_sm80_softmax_narrow<Tr>(s, c, m_r, l_r, o);
        attnd_sm80_pv_narrow<Tr>(o, s, vt_a + wn * NW * Tr::ROW_RAW, lane);
    } else {
        // S = Q K^T (MT x 16 rows x SUB tokens)
        if constexpr (Tr::V_DIRECT) { // decode: K and V straight from the fp8 stage
            uint4 wk[D_PAD / 64][SUB / 8];
            attnd_sm80_k8_load<Tr>(wk, kt_a + ln.k8_lane, ln.k8_x);
            attnd_sm80_qk_k8<Tr>(s, qf, sq_a, lane, wk);
        } else if constexpr (Tr::K_DIRECT) {
            // decode: K straight from the fp8 stage; the warp converts its own V rows
            // (SUB == NW) for ldmatrix.trans
            uint4 wk[D_PAD / 64][SUB / 8];
            attnd_sm80_k8_load<Tr>(wk, kt_a + ln.k8_lane, ln.k8_x);
            __syncwarp();
            attnd_fp8_tiles_to_f16<Tr, NW, 32, 8, true>(rk, rv, sconv, sconv, wn * NW, lane);
            attnd_sm80_qk_k8<Tr>(s, qf, sq_a, lane, wk);
            __syncwarp();
            vt_a = sconv_a;
        } else {
            attnd_sm80_qk<Tr>(s, qf, sq_a + ln.q_lane, ln.qx, kt_a + ln.k_lane + h * SUB * ROW16,
                              ln.kx);
        }

        // logits (log2 domain) with masks, then the online softmax
        const float c = attnd_sm80_logits<Tr>(a, s, pos, slope2, t0, hi, g8, t4, need_mask);
        attnd_sm80_softmax<Tr>(s, c, m_r, l_r, o);

        // O += P V
        if constexpr (Tr::V_DIRECT)
            attnd_sm80_pv_v8<Tr>(o, s, vt_a + wn * NW * Tr::ROW_RAW, lane);
        else
            attnd_sm80_pv<Tr>(o, s, vt_a + ln.v_lane + h * SUB * ROW16, ln.vx);
    }
}

// ------------------------------------------------------------------ kernel

// Decode: the first stages' page ids, loaded before the sequence's length for the range a
// sequence of max_seq_len keys would have (reads within the block table's row), to be used where
// the real range starts at the same key (a batch of equal lengths: always), so the first K/V
// copies wait for one trip to memory, not two. Returns that range's first key (-1: none loaded).
template <class Tr, bool PAGE_PER_WARP>
__device__ __forceinline__ int attnd_sm80_first_pages(const attnd_paged_kargs &a, int seg, int wn,
                                                      const int32_t *bt, int32_t bt_s1,
                                                      int (&pg)[Tr::NSTAGES])
{
    const attnd_paged_params &p = a.p;
    int first = -1;
#pragma unroll
    for (int s = 0; s < Tr::NSTAGES; s++)
        pg[s] = -1;
    if (PAGE_PER_WARP && a.direct && p.sliding_window <= 0 && p.max_seq_len > 0) {
        int lo = 0;
        if (a.num_segments > 1) {
            const int nblk = (p.max_seq_len + (1 << a.bs_log2) - 1) >> a.bs_log2;
            lo = seg * ((nblk + a.num_segments - 1) / a.num_segments) << a.bs_log2;
        }
        first = lo;
#pragma unroll
        for (int s = 0; s < Tr::NSTAGES; s++) {
            const int b = (lo + s * Tr::BLOCK_N + wn * Tr::NW) >> a.bs_log2;
            pg[s] = b < (int)p.block_tables.shape[1] ? __ldg(bt + b * bt_s1) : -1;
        }
    }
    return first;
}

// Bench-only timeline (builds with ATTND_DECODE_TIMELINE): thread 0 of each decode CTA writes 8
// words at CTA (z * gridDim.y + y) * gridDim.x + x: 0 SM id, 1 start, 2 first tile in, 3 its
// warp's loop done, 4 every warp's partial stored, 5 end, 6 1 if it merged its pair.
#ifdef ATTND_DECODE_TIMELINE
__device__ __forceinline__ void attnd_timeline(const attnd_paged_kargs &a, int slot,
                                               unsigned long long v, bool stamp)
{
    if (a.timeline == NULL || threadIdx.x != 0) return;
    if (stamp) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    const size_t cta = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    a.timeline[cta * 8 + slot] = v;
}
#define ATTND_TIMELINE(slot, v, stamp)                                                             \
    do {                                                                                           \
        if (Tr::DECODE) attnd_timeline(a, slot, v, stamp);                                         \
    } while (0)
#else
#define ATTND_TIMELINE(slot, v, stamp)                                                             \
    do {                                                                                           \
    } while (0)
#endif

// The rows out: normalised straight from the registers (one warp per row, final output), or
// through shared memory where warps split the tokens (the decode tiles' partial states merged,
// the 3D op's partials stored and, with tickets, the last segment's CTA merging its pair).
template <class Tr>
__device__ __forceinline__ void
attnd_sm80_epilogue(const attnd_paged_kargs &a, const float (&o)[Tr::MT][Tr::O_TILES][4],
                    const float (&m_r)[Tr::MT][2], const float (&l_r)[Tr::MT][2], int wm, int wn,
                    int row0, int rows_total, int q_start, int kvh, int seg, int tid)
{
    const bool partial = a.num_segments > 1;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    constexpr bool kDirectEpilogue = Tr::WARPS_N == 1;
#else
    // sm_80's allocation of the two-m-tile kernel spills with the direct store; use shared memory
    constexpr bool kDirectEpilogue = Tr::WARPS_N == 1 && Tr::MT == 1;
#endif
    if (kDirectEpilogue && !partial && a.out_vec) {
        const int lane = tid & 31, wrow0 = row0 + wm * Tr::WROWS;
#pragma unroll
        for (int mt = 0; mt < Tr::MT; mt++)
            attnd_paged_store_rows_as<Tr::D_PAD / 8, true>(
                a, [&](int n, int e) { return o[mt][n][e]; }, m_r[mt], l_r[mt],
                wrow0 + mt * 16 + (lane >> 2), rows_total, q_start, kvh, lane & 3);
        return;
    }
    extern __shared__ __align__(128) unsigned char attnd_smem[];
    attnd_sm80_merge_store<Tr>(a, attnd_smem, o, m_r, l_r, wm, wn, row0, rows_total, q_start, kvh,
                               seg, tid);
    ATTND_TIMELINE(4, 0, true);
    bool merged = false;
    if (Tr::DECODE && partial && a.tickets)
        merged = attnd_paged_merge_last<(Tr::D_PAD + 127) / 128>(a, row0, Tr::BLOCK_M, rows_total,
                                                                 q_start, kvh, tid, Tr::THREADS);
    ATTND_TIMELINE(5, 0, true);
    ATTND_TIMELINE(6, merged, false);
    (void)merged;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS)
    attnd_paged_kernel(const attnd_paged_kargs a)
{
    typedef typename Tr::TC TC;
    constexpr int D_PAD = Tr::D_PAD, BLOCK_M = Tr::BLOCK_M, BLOCK_N = Tr::BLOCK_N;
    constexpr int NW = Tr::NW, ROW16 = Tr::ROW16;
    constexpr int NSTAGES = Tr::NSTAGES, LOAD_ITERS = Tr::LOAD_ITERS, MT = Tr::MT, SUB = Tr::SUB;
    constexpr int KSTEPS = D_PAD / 16;
    extern __shared__ __align__(128) unsigned char attnd_smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    ATTND_TIMELINE(1, 0, true);
#ifdef ATTND_DECODE_TIMELINE
    {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        ATTND_TIMELINE(0, smid, false);
    }
#endif
    const int wm = Tr::WARPS_N == 1 ? warp : 0;
    const int wn = Tr::WARPS_N == 1 ? 0 : warp;
    const int g = a.group;
    const attnd_paged_params &p = a.p;

    // ---- which rows: sequence, q-block, kv head, segment
    int qb = Tr::REVERSE ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int kvh = blockIdx.y, seg = blockIdx.z;
    int seq, qb_local;
    if (!attnd_sm80_cta_rows<Tr>(a, qb, &seq, &qb_local)) return;
#ifdef ATTND_DECODE_ROW_PAGES
    constexpr bool kPagePerWarp = false; // the row-by-row page lookup (measurements only)
#else
    constexpr bool kPagePerWarp = Tr::DECODE;
#endif
    const int32_t *bt =
        (const int32_t *)p.block_tables.data + (int64_t)seq * p.block_tables.strides[0];
    const int32_t bt_s1 = (int32_t)p.block_tables.strides[1];
    int spec_pg[Tr::NSTAGES];
    const int spec_lo = attnd_sm80_first_pages<Tr, kPagePerWarp>(a, seg, wn, bt, bt_s1, spec_pg);
    const attnd_paged_seq sq_ = attnd_paged_seq_at(a, seq);
    const int q_start = sq_.q_start, ctx = sq_.ctx, seq_len = sq_.seq_len;
    const int rows_total = sq_.q_len * g;
    const int row0 = qb_local * BLOCK_M;
    if (row0 >= rows_total) return;
    const int sw = p.sliding_window;
    const int row_last = min(row0 + BLOCK_M, rows_total) - 1;

    // ---- context range [lo, hi) of this CTA: causal, window, segment
    int lo, hi;
    attnd_paged_range(a, seq_len, ctx + row0 / g, ctx + row_last / g, seg, &lo, &hi);
    const int lo_keys = lo; // decode loads zero-fill keys below it
    // decode: tiles from a multiple of 16 (segments start at whole blocks; a window's lower end
    // is rounded down, the keys below it zero-filled and masked), so each warp's 16 tokens of a
    // tile lie in one page
    static_assert(!kPagePerWarp || Tr::NW == 16, "a warp's tokens of a tile: one page");
    if (kPagePerWarp) lo &= ~15;
    const int ntiles = lo_keys < hi ? (hi - lo + BLOCK_N - 1) / BLOCK_N : 0;

    // ---- this thread's rows: m-tile mt, rows g8 and g8 + 8 of it
    const int g8 = lane >> 2, t4 = lane & 3;
    const int wrow0 = row0 + wm * Tr::WROWS;
    int pos[MT][2];
    float slope2[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) // narrow: rows 2t, 2t + 1 (S^T's columns)
            attnd_paged_row(a, wrow0 + (Tr::NARROW ? 2 * t4 + r : mt * 16 + g8 + r * 8), rows_total,
                            ctx, kvh, &pos[mt][r], &slope2[mt][r]);
    const bool warp_has_rows = wrow0 < rows_total;
    const int wpos_min = ctx + wrow0 / g;
    const int wpos_max = ctx + (min(wrow0 + Tr::WROWS - 1, rows_total - 1)) / g;

    // ---- shared memory
    unsigned char *sq = attnd_smem;
    unsigned char *spipe = attnd_smem + Tr::PIPE_OFF;
    unsigned char *sconv = attnd_smem + Tr::CONV_OFF;
    const uint32_t sq_a = attnd_smem_addr(sq);
    const uint32_t spipe_a = attnd_smem_addr(spipe);
    const uint32_t sconv_a = attnd_smem_addr(sconv);

    // ---- K/V loader: thread's slots are chunk slot % CPR of rows slot / CPR + i * ROWS_PER_PASS
    // (decode: slot = lane, from the warp's first row; prefill: slot = tid).
    // Byte offsets within a page fit 32 bits (checked by the host); page * stride is 32x32->64.
    attnd_kv_loader<Tr> ld;
    ld.init(a, Tr::DECODE ? lane : tid, Tr::DECODE ? wn * NW : 0, kvh, spipe_a);
    const int bs_log2 = a.bs_log2;
    const int32_t nblocks32 = a.nblocks32;
    const bool kv_same = a.kv_same != 0;
    // page ids as read (-1: none); checked against the pool only when a stage is issued, a tile
    // later, so that no instruction waits for the block table's read (it did, 12% of the fp8
    // decode's stall samples)
    int pg[LOAD_ITERS];
    auto fetch_pages = [&](int stage, int *out) {
        const int t0 = lo + stage * BLOCK_N;
        if constexpr (kPagePerWarp) { // one page per warp and tile (every lane the same id)
            const int tw = t0 + wn * NW;
            out[0] = stage < ntiles && tw < hi ? __ldg(bt + (tw >> bs_log2) * bt_s1) : -1;
        } else {
#pragma unroll
            for (int i = 0; i < LOAD_ITERS; i++) {
                const int tok = t0 + ld.row0 + i * Tr::ROWS_PER_PASS;
                out[i] = stage < ntiles && tok < hi ? __ldg(bt + (tok >> bs_log2) * bt_s1) : -1;
            }
        }
    };
    // the prologue's stages (s unrolled): the page ids loaded ahead where the range agrees
    auto fetch_first = [&](int s, int *out) {
        if (kPagePerWarp && lo == spec_lo) {
            const int tw = lo + s * BLOCK_N + wn * NW;
            out[0] = s < ntiles && tw < hi ? spec_pg[s] : -1;
        } else {
            fetch_pages(s, out);
        }
    };
    auto issue_stage = [&](int stage, int buf, const int *raw) {
        int pages[LOAD_ITERS]; // ids outside the pool (and -1) zero-fill
#pragma unroll
        for (int i = 0; i < (kPagePerWarp ? 1 : LOAD_ITERS); i++)
            pages[i] = (unsigned)raw[i] < (unsigned)nblocks32 ? raw[i] : -1;
        if constexpr (kPagePerWarp) {
            const int tw = lo + stage * BLOCK_N + wn * NW;
            if (kv_same)
                ld.template issue_page<true>(tw, lo_keys, hi, buf, pages[0]);
            else
                ld.template issue_page<false>(tw, lo_keys, hi, buf, pages[0]);
        } else if (kv_same) {
            ld.template issue<true>(lo + stage * BLOCK_N, buf, pages);
        } else {
            ld.template issue<false>(lo + stage * BLOCK_N, buf, pages);
        }
    };

    // ---- prologue: page ids and copies for the first NSTAGES-1 stages
    {
        int pro[NSTAGES - 1][LOAD_ITERS];
#pragma unroll
        for (int s = 0; s < NSTAGES - 1; s++)
            fetch_first(s, pro[s]);
#pragma unroll
        for (int s = 0; s < NSTAGES - 1; s++) {
            if (s < ntiles) issue_stage(s, s, pro[s]);
            attnd_cp_async_commit();
        }
        fetch_first(NSTAGES - 1, pg);
    }

    // ---- Q tile -> shared (compute type, swizzled), zero outside rows / head size
    attnd_sm80_load_q<Tr>(a, sq, row0, rows_total, q_start, kvh, tid);
    __syncthreads();

    attnd_sm80_lane<Tr> ln;
    ln.init(sq_a, wm, wn, lane);
    uint32_t qf[Tr::Q_IN_REGS ? KSTEPS : 1][4];
    if (Tr::Q_IN_REGS) ln.q_frags(qf);

    float o[MT][Tr::O_TILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < Tr::O_TILES; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m_r[mt][0] = m_r[mt][1] = attnd_neg_inf();
        l_r[mt][0] = l_r[mt][1] = 0.0f;
    }

    // ---- main loop over K/V tiles
    int buf = 0, ibuf = NSTAGES - 1; // stage buffers of tile j and of tile j + NSTAGES - 1
    for (int j = 0; j < ntiles; j++) {
        attnd_cp_async_wait<NSTAGES - 2>();
        if (Tr::DECODE)
            __syncwarp(); // the warp's own rows: loaded by it, read by it
        else
            __syncthreads();
        if (j == 0) ATTND_TIMELINE(2, 0, true);
        if (j + NSTAGES - 1 < ntiles) issue_stage(j + NSTAGES - 1, ibuf, pg);
        attnd_cp_async_commit();
        fetch_pages(j + NSTAGES, pg);
        ibuf = buf; // tile j + NSTAGES reuses tile j's buffer
        const unsigned char *rk = spipe + buf * 2 * Tr::TILE_RAW, *rv = rk + Tr::TILE_RAW;
        uint32_t kt_a = spipe_a + buf * 2 * Tr::TILE_RAW, vt_a = kt_a + Tr::TILE_RAW;
        if (Tr::FP8 && Tr::WARPS_N == 1) {
            // prefill: the CTA converts the whole K and V tiles (every warp reads all of them)
            attnd_fp8_tiles_to_f16<Tr, BLOCK_N, Tr::THREADS, 0, false>(
                rk, rv, sconv, sconv + BLOCK_N * ROW16, 0, tid);
            __syncthreads();
            kt_a = sconv_a;
            vt_a = sconv_a + BLOCK_N * ROW16;
        }

        // this warp's tokens [t0, t1) of the tile, SUB at a time
#pragma unroll 1
        for (int h = 0; h < NW / SUB; h++) {
            const int t0 = lo + j * BLOCK_N + wn * NW + h * SUB, t1 = t0 + SUB;
            if (!warp_has_rows || t0 >= hi || t0 > wpos_max ||
                (sw > 0 && t1 - 1 < wpos_min - sw + 1))
                continue; // nothing visible to this warp's rows
            const bool need_mask = !attnd_paged_unmasked(t0, t1, hi, wpos_min, wpos_max, sw);

            attnd_sm80_step<Tr>(a, ln, qf, pos, slope2, t0, hi, need_mask, h, rk, rv, sconv,
                                sconv_a, kt_a, vt_a, o, m_r, l_r);
        } // h
        buf = buf + 1 == NSTAGES ? 0 : buf + 1;
    }

    // ---- epilogue
    ATTND_TIMELINE(3, 0, true);
    attnd_cp_async_wait<0>();
    attnd_pdl_trigger(); // the reduce kernel (no tickets) may launch; it waits for this grid
    attnd_sm80_epilogue<Tr>(a, o, m_r, l_r, wm, wn, row0, rows_total, q_start, kvh, seg, tid);
}

#undef ATTND_SWZ_OFF

#endif
