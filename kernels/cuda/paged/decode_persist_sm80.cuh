// Persistent decode tiles (measurement switch ATTND_DECODE_PERSIST): unsplit, direct decode
// launches with more (sequence, kv head) pairs than CTA slots. CTA (x, y) takes sequences x,
// x + gridDim.x, ... of kv head y. Each warp's copies run as one stream over the CTA's pairs,
// NSTAGES - 1 tiles ahead of its compute, so a pair's first tiles load under the previous pair's
// last ones instead of after a new CTA's start (the wave change of fp8 64x4096: ~5.5 us with
// most SMs waiting for first tiles); each pair's epilogue runs through its own shared memory
// behind the stages. Tiles, loader and epilogue are the decode kernel's (mainloop_sm80.cuh).
// Off by default: faster for 16-bit caches, slower for fp8 (bench/RESULTS.md, decode, sixth
// round); ATTND_DECODE_PERSIST_FILL puts CTAs on every slot (launch_impl.cuh).
#ifndef ATTND_CUDA_PAGED_DECODE_PERSIST_SM80_CUH
#define ATTND_CUDA_PAGED_DECODE_PERSIST_SM80_CUH

#include "paged/mainloop_sm80.cuh"

#define ATTND_SWZ_OFF(x, kk) ((x)[(kk)&3] + (uint32_t)(((kk) >> 2) << 7))

// The pairs a CTA visits: sequence seq (>= S: none left), its keys [0, hi) in nt tiles, its
// rows and block-table row.
struct attnd_persist_item {
    int seq, hi, nt, q_start, q_len;
    const int32_t *bt;
};

template <class Tr>
__device__ __forceinline__ void attnd_persist_item_at(const attnd_paged_kargs &a, int seq,
                                                      attnd_persist_item *it)
{
    it->seq = seq;
    it->hi = it->nt = it->q_start = it->q_len = 0;
    it->bt = (const int32_t *)a.p.block_tables.data;
    if (seq >= (int)a.p.seq_lens.shape[0]) return;
    const attnd_paged_seq s = attnd_paged_seq_at(a, seq);
    it->q_start = s.q_start;
    it->q_len = s.q_len;
    it->hi = s.seq_len; // direct rows: the last row's position is seq_len - 1; no window
    it->nt = s.q_len > 0 && s.seq_len > 0 ? (s.seq_len + Tr::BLOCK_N - 1) / Tr::BLOCK_N : 0;
    it->bt += (int64_t)seq * a.p.block_tables.strides[0];
}

template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS)
    attnd_paged_decode_persist_kernel(const attnd_paged_kargs a)
{
    static_assert(Tr::DECODE && Tr::Q_IN_REGS && Tr::MT == 1 && Tr::SUB == Tr::NW, "decode tiles");
    constexpr int D_PAD = Tr::D_PAD, BLOCK_N = Tr::BLOCK_N, NW = Tr::NW, ROW16 = Tr::ROW16;
    constexpr int NSTAGES = Tr::NSTAGES, KSTEPS = D_PAD / 16;
    extern __shared__ __align__(128) unsigned char attnd_smem[];
    const int tid = threadIdx.x, lane = tid & 31, wn = tid >> 5;
    const int g = a.group, kvh = blockIdx.y, step = gridDim.x;
    const int g8 = lane >> 2, t4 = lane & 3;

    unsigned char *sq = attnd_smem, *spipe = attnd_smem + Tr::PIPE_OFF;
    unsigned char *sconv = attnd_smem + Tr::CONV_OFF, *sepi = attnd_smem + Tr::PERSIST_EPI_OFF;
    const uint32_t sq_a = attnd_smem_addr(sq), spipe_a = attnd_smem_addr(spipe);
    const uint32_t sconv_a = attnd_smem_addr(sconv);

    attnd_kv_loader<Tr> ld;
    ld.init(a, lane, wn * NW, kvh, spipe_a);
    const int bs_log2 = a.bs_log2;
    const int32_t nblocks32 = a.nblocks32, bt_s1 = (int32_t)a.p.block_tables.strides[1];
    const bool kv_same = a.kv_same != 0;

    // the loader's stream: tile lt of pair li; ln: the pair after it, loaded ahead
    attnd_persist_item li, ln;
    attnd_persist_item_at<Tr>(a, blockIdx.x, &li);
    attnd_persist_item_at<Tr>(a, blockIdx.x + step, &ln);
    int lt = 0;
    auto l_settle = [&]() { // past the pair's last tile: on to the next pair that has tiles
        while (lt >= li.nt && li.seq < (int)a.p.seq_lens.shape[0]) {
            li = ln;
            lt = 0;
            attnd_persist_item_at<Tr>(a, li.seq + step, &ln);
        }
    };
    auto l_page = [&]() { // the warp's page of the loader's current tile (-1: none)
        const int tw = lt * BLOCK_N + wn * NW;
        int pg = -1;
        if (lt < li.nt && tw < li.hi) {
            pg = __ldg(li.bt + (tw >> bs_log2) * bt_s1);
            if ((unsigned)pg >= (unsigned)nblocks32) pg = -1;
        }
        return pg;
    };
    auto l_issue = [&](int buf, int pg) { // the loader's current tile into buf, then advance
        if (lt < li.nt) {
            const int tw = lt * BLOCK_N + wn * NW;
            if (kv_same)
                ld.template issue_page<true>(tw, 0, li.hi, buf, pg);
            else
                ld.template issue_page<false>(tw, 0, li.hi, buf, pg);
            lt++;
            l_settle();
        }
        attnd_cp_async_commit();
    };

    // ---- prologue: the stream's first NSTAGES - 1 tiles
    l_settle();
#pragma unroll
    for (int s = 0; s < NSTAGES - 1; s++)
        l_issue(s, l_page());
    int pg = l_page();

    const int xk = lane & 7;
    const uint32_t v_lane = (uint32_t)((wn * NW + (lane & 7) + (((lane >> 3) & 1) << 3)) * ROW16);
    const int v_cadd = lane >> 4;
    uint32_t vx[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        vx[i] = (uint32_t)(((2 * i + v_cadd) ^ xk) << 4);
    const int k_cadd = (lane >> 3) & 1, q_cadd = lane >> 4;
    const uint32_t k_lane = (uint32_t)((wn * NW + (lane & 7) + ((lane >> 4) << 3)) * ROW16);
    const uint32_t q_lane = (uint32_t)(((lane & 7) + (((lane >> 3) & 1) << 3)) * ROW16);
    uint32_t kx[4], qx[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        kx[i] = (uint32_t)(((2 * i + k_cadd) ^ xk) << 4);
        qx[i] = (uint32_t)(((2 * i + q_cadd) ^ xk) << 4);
    }
    const uint32_t k8_lane = (uint32_t)((wn * NW + g8) * Tr::ROW_RAW + 16 * t4);
    const uint32_t k8_x = (uint32_t)(Tr::CPR >= 8 ? (g8 & 1) << 6 : 0);

    int buf = 0, ibuf = NSTAGES - 1;
    attnd_persist_item ci;
    attnd_persist_item_at<Tr>(a, blockIdx.x, &ci);
    for (; ci.seq < (int)a.p.seq_lens.shape[0]; attnd_persist_item_at<Tr>(a, ci.seq + step, &ci)) {
        const int rows_total = ci.q_len * g;
        if (rows_total == 0) continue; // no rows, no tiles (the loader skipped it too)
        const int ctx = ci.hi - ci.q_len;
        int pos[1][2];
        float slope2[1][2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            attnd_paged_row(a, g8 + r * 8, rows_total, ctx, kvh, &pos[0][r], &slope2[0][r]);
        const int wpos_min = ctx, wpos_max = ctx + (min(15, rows_total - 1)) / g;

        // Q -> shared -> registers (every warp is past the previous pair's reads of sq)
        attnd_sm80_load_q<Tr>(a, sq, 0, rows_total, ci.q_start, kvh, tid);
        __syncthreads();
        uint32_t qf[KSTEPS][4];
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            if (Tr::K_DIRECT)
                attnd_sm80_q_frag_k8<Tr>(sq_a, kk, lane, qf[kk]);
            else
                attnd_ldsm_x4(sq_a + q_lane + ATTND_SWZ_OFF(qx, kk), qf[kk]);
        }
        float o[1][D_PAD / 8][4];
#pragma unroll
        for (int n = 0; n < D_PAD / 8; n++)
            o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.0f;
        float m_r[1][2] = {{attnd_neg_inf(), attnd_neg_inf()}}, l_r[1][2] = {{0.0f, 0.0f}};

        for (int j = 0; j < ci.nt; j++) {
            attnd_cp_async_wait<NSTAGES - 2>();
            __syncwarp(); // the warp's own rows: loaded by it, read by it
            l_issue(ibuf, pg);
            pg = l_page();
            ibuf = buf;
            const unsigned char *rk = spipe + buf * 2 * Tr::TILE_RAW, *rv = rk + Tr::TILE_RAW;
            const uint32_t kt_a = spipe_a + buf * 2 * Tr::TILE_RAW;
            uint32_t vt_a = kt_a + Tr::TILE_RAW;
            buf = buf + 1 == NSTAGES ? 0 : buf + 1;
            const int t0 = j * BLOCK_N + wn * NW, t1 = t0 + NW;
            if (t0 >= ci.hi || t0 > wpos_max) continue; // nothing visible to this warp's rows
            const bool need_mask = !attnd_paged_unmasked(t0, t1, ci.hi, wpos_min, wpos_max, 0);
            float s[1][NW / 8][4];
            if constexpr (Tr::K_DIRECT) {
                __syncwarp();
                attnd_fp8_tiles_to_f16<Tr, NW, 32, 8, true>(rk, rv, sconv, sconv, wn * NW, lane);
                attnd_sm80_qk_k8<Tr>(s, qf, sq_a, lane, kt_a + k8_lane, k8_x);
                __syncwarp();
                vt_a = sconv_a;
            } else {
                attnd_sm80_qk<Tr>(s, qf, sq_a + q_lane, qx, kt_a + k_lane, kx);
            }
            const float c = attnd_sm80_logits<Tr>(a, s, pos, slope2, t0, ci.hi, t4, need_mask);
            attnd_sm80_softmax<Tr>(s, c, m_r, l_r, o);
            attnd_sm80_pv<Tr>(o, s, vt_a + v_lane, vx);
        }
        // the pair's rows: through the epilogue's own shared memory (the next pair's first
        // tiles may be landing in the stages)
        attnd_sm80_merge_store<Tr>(a, sepi, o, m_r, l_r, 0, wn, 0, rows_total, ci.q_start, kvh, 0,
                                   tid);
    }
    attnd_cp_async_wait<0>();
}

#undef ATTND_SWZ_OFF

#endif
