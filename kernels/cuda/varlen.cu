// varlen attention on the GPU, one launch, nothing read back to the host, nothing allocated: on
// an sm_90 device with 16-bit or fp8 inputs, no bias and a positive scale the sm90 core
// (varlen_sm90.cu); otherwise the FA2 kernel (varlen_kernel.cuh) over (query tiles of
// max_seqlen_q, q heads, sequences), tiles past a sequence's length exiting at once.
#include <string.h>

#include "cuda_backend.h"
#include "ops_util.h"
#include "varlen_kernel.cuh"
#include "varlen_sm90.h"

template <int D_PAD, int KIND>
static attnd_err varlen_launch(attnd_backend *b, const attnd_fa_kparams &k, dim3 grid)
{
    typedef attnd_fa_traits<D_PAD> Tr;
    void (*kern)(const attnd_fa_kparams) = attnd_fa_fwd_kernel<D_PAD, KIND, false>;
    attnd_err rv = attnd_smem_opt_in(b, kern, Tr::SMEM, "varlen: cudaFuncSetAttribute");
    if (rv != ATTND_ERR_OK) return rv;
    kern<<<grid, ATTND_FA_THREADS, Tr::SMEM, attnd_cuda_of(b)->stream>>>(k);
    return attnd_cuda_check_launch(b, "attnd_fa_fwd_kernel (varlen)");
}

/* Fill the parts of the kernel parameters that varlen and block-sparse share. */
extern "C" attnd_err attnd_cuda_fa_common(attnd_backend *b, attnd_fa_kparams *k,
                                          const attnd_tensor *q, const attnd_tensor *kt,
                                          const attnd_tensor *v, const attnd_tensor *out,
                                          const attnd_tensor *cu_q, const attnd_tensor *cu_k)
{
    memset(k, 0, sizeof *k);
    const size_t es = attnd_dtype_size(q->dtype);
    const size_t align = q->dtype == ATTND_DTYPE_FP8_E4M3 ? 8 : 16;
    if (!attnd_aligned(q, es, align, 2))
        return attnd_fail_unsupported(b, "q: data and row/head strides must be %zu-byte aligned",
                                      align);
    if (!attnd_aligned(kt, es, align, 2))
        return attnd_fail_unsupported(b, "k: data and row/head strides must be %zu-byte aligned",
                                      align);
    if (!attnd_aligned(v, es, align, 2))
        return attnd_fail_unsupported(b, "v: data and row/head strides must be %zu-byte aligned",
                                      align);
    if (q->shape[1] > 65535 || cu_q->shape[0] - 1 > 65535)
        return attnd_fail_unsupported(b, "more than 65535 q heads or sequences");
    k->q = q->data;
    k->k = kt->data;
    k->v = v->data;
    k->out = out->data;
    k->q_sr = q->strides[0];
    k->q_sh = q->strides[1];
    k->k_sr = kt->strides[0];
    k->k_sh = kt->strides[1];
    k->v_sr = v->strides[0];
    k->v_sh = v->strides[1];
    k->o_sr = out->strides[0];
    k->o_sh = out->strides[1];
    k->o_pairs =
        attnd_aligned(out, attnd_dtype_size(out->dtype), 2 * attnd_dtype_size(out->dtype), 2);
    k->cu_q = (const int32_t *)cu_q->data;
    k->cu_k = (const int32_t *)cu_k->data;
    k->cu_q_st = cu_q->strides[0];
    k->cu_k_st = cu_k->strides[0];
    k->group = (int32_t)(q->shape[1] / kt->shape[1]);
    k->d = (int32_t)q->shape[2];
    k->out_dt = out->dtype;
    k->causal = 1;
    k->p_descale = 1.0f;
    k->out_mul = 1.0f;
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_cuda_varlen(attnd_backend *b, const attnd_varlen_params *p)
{
    attnd_fa_kparams k;
    attnd_err rv = attnd_cuda_fa_common(b, &k, &p->q, &p->k, &p->v, &p->out, &p->cu_seqlens_q,
                                        &p->cu_seqlens_k);
    if (rv != ATTND_ERR_OK) return rv;
    const int fp8_in = p->q.dtype == ATTND_DTYPE_FP8_E4M3;
    k.causal = p->causal != 0;
    k.scale_log2 = p->scale * ATTND_LOG2E * (fp8_in ? p->q_scale * p->k_scale : 1.0f);
    k.p_descale = fp8_in ? 1.0f / p->p_scale : 1.0f;
    k.out_mul = (fp8_in ? p->p_scale * p->v_scale : 1.0f) *
                (p->out.dtype == ATTND_DTYPE_FP8_E4M3 ? 1.0f / p->out_scale : 1.0f);
    if (p->bias.data != NULL) {
        k.bias = p->bias.data;
        k.bias_dt = p->bias.dtype;
        k.b_sb = p->bias.strides[0];
        k.b_sh = p->bias.strides[1];
        k.b_sm = p->bias.strides[2];
        k.b_sn = p->bias.strides[3];
    }
    const int64_t batch = p->cu_seqlens_q.shape[0] - 1;
    if (batch <= 0 || p->max_seqlen_q <= 0 || p->q.shape[1] == 0) return ATTND_ERR_OK;
    int ran;
    rv = attnd_varlen_sm90(b, p, &ran);
    if (rv != ATTND_ERR_OK || ran) return rv;
    dim3 grid((unsigned)((p->max_seqlen_q + ATTND_FA_BM - 1) / ATTND_FA_BM),
              (unsigned)p->q.shape[1], (unsigned)batch);
    const int big = k.d > 128;
    switch (p->q.dtype) {
    case ATTND_DTYPE_F16:
        return big ? varlen_launch<256, 0>(b, k, grid) : varlen_launch<128, 0>(b, k, grid);
    case ATTND_DTYPE_BF16:
        return big ? varlen_launch<256, 1>(b, k, grid) : varlen_launch<128, 1>(b, k, grid);
    default:
        return big ? varlen_launch<256, 2>(b, k, grid) : varlen_launch<128, 2>(b, k, grid);
    }
}
