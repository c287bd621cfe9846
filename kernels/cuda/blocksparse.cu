// block-sparse attention on the GPU, one launch, no host round trip (the seed copies the lengths
// to the host to build its tile list on every call):
// - max_seqlen_q == 1 (a decode batch): the memory-bound decode kernel (blocksparse_kernel.cuh),
//   one CTA per (q head, sequence);
// - otherwise, on an sm_90 device, the sm90 core (varlen_sm90.cu: per work tile of one q head the
//   key blocks its layout rows list, gathered into one virtual key sequence);
// - else the FA2 kernel of varlen_kernel.cuh over the listed key blocks of each CTA's layout
//   row, grid (query tiles of max_seqlen_q, q heads, sequences): each CTA finds its sequence, its
//   rows and its layout row on the device and exits when it has no rows, so prefill and mixed
//   batches take the same launch.
#include <string.h>

#include "cuda_backend.h"
#include "ops_util.h"
#include "blocksparse_kernel.cuh"
#include "varlen_sm90.h"

extern "C" attnd_err attnd_cuda_fa_common(attnd_backend *b, attnd_fa_kparams *k,
                                          const attnd_tensor *q, const attnd_tensor *kt,
                                          const attnd_tensor *v, const attnd_tensor *out,
                                          const attnd_tensor *cu_q, const attnd_tensor *cu_k);

template <int D_PAD, int KIND>
static attnd_err bs_launch(attnd_backend *b, const attnd_fa_kparams &k, dim3 grid)
{
    typedef attnd_fa_traits<D_PAD> Tr;
    void (*kern)(const attnd_fa_kparams) = attnd_fa_fwd_kernel<D_PAD, KIND, true>;
    attnd_err rv = attnd_smem_opt_in(b, kern, Tr::SMEM, "blocksparse: cudaFuncSetAttribute");
    if (rv != ATTND_ERR_OK) return rv;
    kern<<<grid, ATTND_FA_THREADS, Tr::SMEM, attnd_cuda_of(b)->stream>>>(k);
    return attnd_cuda_check_launch(b, "attnd_fa_fwd_kernel (blocksparse)");
}

static int ilog2(int v)
{
    int l = 0;
    while ((1 << (l + 1)) <= v)
        l++;
    return l;
}

extern "C" attnd_err attnd_cuda_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p)
{
    attnd_fa_kparams k;
    attnd_err rv = attnd_cuda_fa_common(b, &k, &p->q, &p->k, &p->v, &p->out, &p->cu_seqlens_q,
                                        &p->cu_seqlens_k);
    if (rv != ATTND_ERR_OK) return rv;
    const int qbs = p->q_block_size > 0 ? p->q_block_size : p->block_size;
    k.scale_log2 = p->scale * ATTND_LOG2E;
    k.crow = (const int32_t *)p->layout_crow.data;
    k.col = (const int32_t *)p->layout_col.data;
    k.crow_sh = p->layout_crow.strides[0];
    k.crow_sm = p->layout_crow.strides[1];
    k.col_sh = p->layout_col.strides[0];
    k.col_sm = p->layout_col.strides[1];
    k.bs_log2 = ilog2(p->block_size);
    k.qbs = qbs;
    k.m_rows = qbs < ATTND_FA_BM ? qbs : ATTND_FA_BM;
    k.n_row_blocks = (int32_t)(p->layout_crow.shape[1] - 1);
    k.n_cols = (int32_t)p->layout_col.shape[1];
    const int64_t batch = p->cu_seqlens_q.shape[0] - 1;
    if (batch <= 0 || p->max_seqlen_q <= 0 || p->q.shape[1] == 0) return ATTND_ERR_OK;
    dim3 grid((unsigned)((p->max_seqlen_q + k.m_rows - 1) / k.m_rows), (unsigned)p->q.shape[1],
              (unsigned)batch);
    if (p->max_seqlen_q == 1) {
        dim3 dgrid((unsigned)p->q.shape[1], (unsigned)batch);
        cudaStream_t st = attnd_cuda_of(b)->stream;
        if (p->q.dtype == ATTND_DTYPE_F16)
            attnd_bs_decode_kernel<0><<<dgrid, ATTND_BSD_THREADS, 0, st>>>(k);
        else
            attnd_bs_decode_kernel<1><<<dgrid, ATTND_BSD_THREADS, 0, st>>>(k);
        return attnd_cuda_check_launch(b, "attnd_bs_decode_kernel");
    }
    int ran;
    rv = attnd_blocksparse_sm90(b, p, &ran);
    if (rv != ATTND_ERR_OK || ran) return rv;
    const int big = k.d > 128;
    if (p->q.dtype == ATTND_DTYPE_F16)
        return big ? bs_launch<256, 0>(b, k, grid) : bs_launch<128, 0>(b, k, grid);
    return big ? bs_launch<256, 1>(b, k, grid) : bs_launch<128, 1>(b, k, grid);
}
