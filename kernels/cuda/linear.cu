// Linear (lightning) attention on the GPU. Prefill is one launch: the chunked tensor-core kernel
// for fp16/bf16 inputs with 16-byte aligned rows, else the float32 recurrence kernel; both carry
// the state in registers from the first token to the last, so no workspace is needed. The
// chunk length is the kernel's own (64): the result does not depend on it (block_size is
// accepted and ignored). Decode is one launch over (heads, batch rows).
#include <string.h>

#include "cuda_backend.h"
#include "linear_kernel.cuh"
#include "ops_util.h"

static void lin_common(attnd_lin_kparams *k, const attnd_tensor *q, const attnd_tensor *kt,
                       const attnd_tensor *v, const attnd_tensor *out, const attnd_tensor *slopes,
                       const attnd_tensor *state, int nd)
{
    memset(k, 0, sizeof *k);
    k->q = q->data;
    k->k = kt->data;
    k->v = v->data;
    k->out = out->data;
    k->q_sb = q->strides[0];
    k->q_sh = q->strides[1];
    k->k_sb = kt->strides[0];
    k->k_sh = kt->strides[1];
    k->v_sb = v->strides[0];
    k->v_sh = v->strides[1];
    k->o_sb = out->strides[0];
    k->o_sh = out->strides[1];
    if (nd == 4) {
        k->q_sn = q->strides[2];
        k->k_sn = kt->strides[2];
        k->v_sn = v->strides[2];
        k->o_sn = out->strides[2];
    }
    k->slopes = (const float *)slopes->data;
    k->slope_st = slopes->strides[0];
    k->state = (float *)state->data;
    k->st_s0 = state->strides[0];
    k->st_sh = state->strides[1];
    k->st_sd = state->strides[2];
    k->d = (int32_t)q->shape[nd - 1];
    k->e = (int32_t)v->shape[nd - 1];
    k->in_dt = q->dtype;
    k->out_dt = out->dtype;
    k->o_pairs =
        attnd_aligned(out, attnd_dtype_size(out->dtype), 2 * attnd_dtype_size(out->dtype), nd - 1);
}

template <int D_PAD, bool BF>
static attnd_err lin_launch_mma(attnd_backend *b, attnd_lin_kparams &k, int64_t batch,
                                int64_t heads)
{
    typedef attnd_lin_traits<D_PAD> Tr;
    void (*kern)(const attnd_lin_kparams) = attnd_lin_prefill_mma_kernel<D_PAD, BF>;
    attnd_err rv = attnd_smem_opt_in(b, kern, Tr::SMEM, "linear prefill: cudaFuncSetAttribute");
    if (rv != ATTND_ERR_OK) return rv;
    /* split e into equal slices of at most ES columns (multiples of 8) */
    const int slices = (k.e + Tr::ES - 1) / Tr::ES;
    k.e_slice = ((k.e + slices - 1) / slices + 7) / 8 * 8;
    dim3 grid((unsigned)((k.e + k.e_slice - 1) / k.e_slice), (unsigned)heads, (unsigned)batch);
    kern<<<grid, ATTND_LIN_THREADS, Tr::SMEM, attnd_cuda_of(b)->stream>>>(k);
    return attnd_cuda_check_launch(b, "attnd_lin_prefill_mma_kernel");
}

template <int RPT>
static attnd_err lin_launch_plain(attnd_backend *b, attnd_lin_kparams &k, int64_t batch,
                                  int64_t heads)
{
    void (*kern)(const attnd_lin_kparams) = attnd_lin_prefill_plain_kernel<RPT>;
    const size_t smem = (size_t)(2 * ATTND_LIN_ST * k.d + 5 * ATTND_LIN_ST * 32) * sizeof(float);
    attnd_err rv = attnd_smem_opt_in(b, kern, smem, "linear prefill: cudaFuncSetAttribute");
    if (rv != ATTND_ERR_OK) return rv;
    dim3 grid((unsigned)((k.e + 31) / 32), (unsigned)heads, (unsigned)batch);
    kern<<<grid, ATTND_LIN_THREADS, smem, attnd_cuda_of(b)->stream>>>(k);
    return attnd_cuda_check_launch(b, "attnd_lin_prefill_plain_kernel");
}

extern "C" attnd_err attnd_cuda_linear_prefill(attnd_backend *b,
                                               const attnd_linear_prefill_params *p)
{
    attnd_lin_kparams k;
    lin_common(&k, &p->q, &p->k, &p->v, &p->out, &p->slopes, &p->kv_state, 4);
    const int64_t batch = p->q.shape[0], heads = p->q.shape[1], n = p->q.shape[2];
    if (batch == 0 || heads == 0 || n == 0) return ATTND_ERR_OK;
    if (batch > 65535 || heads > 65535 || n > INT32_MAX)
        return attnd_fail_unsupported(
            b, "linear prefill: more than 65535 rows or heads, or 2^31 tokens");
    k.n = (int32_t)n;
    const int half = p->q.dtype == ATTND_DTYPE_F16 || p->q.dtype == ATTND_DTYPE_BF16;
    const int aligned = attnd_aligned(&p->q, 2, 16, 3) && attnd_aligned(&p->k, 2, 16, 3) &&
                        attnd_aligned(&p->v, 2, 16, 3);
    if (half && aligned) {
        const int bf = p->q.dtype == ATTND_DTYPE_BF16;
        if (k.d <= 128)
            return bf ? lin_launch_mma<128, true>(b, k, batch, heads)
                      : lin_launch_mma<128, false>(b, k, batch, heads);
        return bf ? lin_launch_mma<256, true>(b, k, batch, heads)
                  : lin_launch_mma<256, false>(b, k, batch, heads);
    }
    return k.d <= 128 ? lin_launch_plain<32>(b, k, batch, heads)
                      : lin_launch_plain<64>(b, k, batch, heads);
}

extern "C" attnd_err attnd_cuda_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p)
{
    attnd_lin_kparams k;
    lin_common(&k, &p->q, &p->k, &p->v, &p->out, &p->slopes, &p->kv_cache, 3);
    k.slot_idx = p->slot_idx.data;
    k.slot_dt = p->slot_idx.dtype;
    k.slot_st = p->slot_idx.strides[0];
    const int64_t batch = p->q.shape[0], heads = p->q.shape[1];
    if (batch == 0 || heads == 0) return ATTND_ERR_OK;
    if (batch > 65535 || heads > INT32_MAX)
        return attnd_fail_unsupported(b, "linear decode: more than 65535 batch rows");
    dim3 grid((unsigned)heads, (unsigned)batch);
    cudaStream_t s = attnd_cuda_of(b)->stream;
    if (attnd_aligned(&p->kv_cache, 4, 16, 3)) {
        attnd_lin_decode_kernel<4><<<grid, ATTND_LIN_THREADS, 0, s>>>(k);
    } else {
        attnd_lin_decode_kernel<1><<<grid, ATTND_LIN_THREADS, 0, s>>>(k);
    }
    return attnd_cuda_check_launch(b, "attnd_lin_decode_kernel");
}
