// The definition of attnd_paged_run, included by the generated instantiation files only.
#ifndef ATTND_CUDA_PAGED_LAUNCH_IMPL_CUH
#define ATTND_CUDA_PAGED_LAUNCH_IMPL_CUH

#include <limits.h>
#include <string.h>

#include "paged/launch.h"
#include "paged/mainloop_sm80.cuh"
#include "paged/mainloop_sm90.cuh"

// Raise the dynamic shared-memory limit of kernel to bytes (its traits' constant) unless the
// backend's record says it was raised already; recorded while the record has room.
template <class K>
static cudaError_t attnd_paged_smem_attr(K kernel, int bytes, attnd_smem_optin *optin)
{
    const void *fn = (const void *)kernel;
    if (optin)
        for (int i = 0; i < optin->n; i++)
            if (optin->fn[i] == fn) return cudaSuccess;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && optin && optin->n < ATTND_CUDA_SMEM_OPTIN_MAX)
        optin->fn[optin->n++] = fn;
    return e;
}

// sm80 cores: one CTA per q-block (x), kv head (y) and segment (z).
template <class Tr>
static cudaError_t attnd_paged_run_sm80(attnd_paged_kargs a, const attnd_paged_launch &l)
{
    if (Tr::SMEM_LAUNCH > l.max_smem) return cudaErrorInvalidConfiguration;
    cudaError_t e = attnd_paged_smem_attr(attnd_paged_kernel<Tr>, Tr::SMEM_LAUNCH, l.optin);
    if (e != cudaSuccess) return e;
    const int64_t S = a.p.seq_lens.shape[0], H = a.p.k_cache.shape[2];
    a.direct = (int64_t)l.max_query_len * a.group <= Tr::BLOCK_M;
    const int64_t gx = a.direct ? S : l.num_tokens * a.group / Tr::BLOCK_M + S;
    if (gx > INT_MAX || H > 65535 || a.num_segments > 65535) return cudaErrorInvalidConfiguration;
    static_assert(!Tr::DECODE || Tr::BLOCK_M == ATTND_DECODE_BLOCK_M || Tr::NARROW,
                  "decode q-blocks (narrow tiles: direct only, a CTA per sequence)");
    if (a.tickets && gx * H > ATTND_CUDA_TICKETS) return cudaErrorInvalidConfiguration;
    attnd_paged_kernel<Tr><<<dim3((unsigned)gx, (unsigned)H, (unsigned)a.num_segments), Tr::THREADS,
                             Tr::SMEM_LAUNCH, l.stream>>>(a);
    return cudaGetLastError();
}

// sm90 core: persistent CTAs over the tile enumeration (mainloop_sm90.cuh).
template <class Tr>
static cudaError_t attnd_paged_run_sm90(attnd_paged_kargs a, const attnd_paged_launch &l)
{
    if (Tr::SMEM_BYTES > l.max_smem || l.maps == NULL) return cudaErrorInvalidConfiguration;
    cudaError_t e = attnd_paged_smem_attr(attnd_paged_sm90_kernel<Tr>, Tr::SMEM_BYTES, l.optin);
    if (e != cudaSuccess) return e;
    const int64_t S = a.p.seq_lens.shape[0], H = a.p.k_cache.shape[2];
    const int64_t rounds = ((int64_t)l.max_query_len * a.group + Tr::BLOCK_M - 1) / Tr::BLOCK_M;
    const int64_t total = rounds * S * H;
    if (total > INT_MAX / 2) return cudaErrorInvalidConfiguration;
    if (total == 0) return cudaSuccess;
    a.m_rounds = (int32_t)rounds;
    // pairs whose K/V (16-bit, longest sequence) fit two thirds of the L2 run together
    const int64_t pair_bytes = (int64_t)l.max_seq_len * a.p.q.shape[2] * 4;
    int64_t z = pair_bytes > 0 ? l.l2_bytes * 2 / 3 / pair_bytes : S * H;
    a.section = (int32_t)(z < 1 ? 1 : (z > S * H ? S * H : z));
    if (l.sm90_off & ATTND_SM90_NO_SECTIONS) a.section = (int32_t)(S * H);
    int grid = (int)(total < l.num_sms ? total : l.num_sms);
    if ((l.sm90_off & ATTND_SM90_FEW_CTAS) && grid > 3) grid = 3;
    attnd_sm90_src src;
    memset(&src, 0, sizeof src);
    if (Tr::MODE != ATTND_SRC_PAGED) {
        if (l.src == NULL) return cudaErrorInvalidConfiguration;
        src = *l.src;
    }
    attnd_paged_sm90_kernel<Tr>
        <<<grid, Tr::THREADS, Tr::SMEM_BYTES, l.stream>>>(a, *l.maps, (int)total, l.sm90_off, src);
    return cudaGetLastError();
}

// The sm90 core's plain instantiation applies: no softcap or ALiBi, no switch it lacks.
static inline bool attnd_sm90_plain(const attnd_paged_kargs &a, const attnd_paged_launch &l)
{
    return a.plain && !(l.sm90_off & ATTND_SM90_NOT_PLAIN);
}

template <int CORE, int D_PAD, int KV>
cudaError_t attnd_paged_run(attnd_paged_kargs a, const attnd_paged_launch &l)
{
    if constexpr (CORE == ATTND_CORE_SM90_VARLEN) {
        // the plain instantiation only: a scale <= 0 (or a measurement switch) runs on the
        // mma.sync kernel (varlen has no softcap or ALiBi; one kernel per unit to compile)
        if (!attnd_sm90_plain(a, l)) return cudaErrorInvalidConfiguration;
        return attnd_paged_run_sm90<
            attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_V, false, ATTND_SRC_CONTIG, true>>(
            a, l);
    } else if constexpr (CORE == ATTND_CORE_SM90_SPARSE) {
        return attnd_paged_run_sm90<
            attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_NONE, false, ATTND_SRC_SPARSE>>(a,
                                                                                               l);
    } else if constexpr (CORE == ATTND_CORE_SM90_PREFILL_SINKS) {
        return attnd_paged_run_sm90<attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_V, true>>(a,
                                                                                                 l);
    } else if constexpr (CORE == ATTND_CORE_SM90_PREFILL) {
        if constexpr (D_PAD == 128 && KV != ATTND_KV_FP8) { // fp8: no third stage
            typedef attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_NONE> none;
            typedef attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_K> deep_k;
            if (l.sm90_off & ATTND_SM90_NO_DEEP) return attnd_paged_run_sm90<none>(a, l);
            if (l.sm90_off & ATTND_SM90_DEEP_K_NOT_V) return attnd_paged_run_sm90<deep_k>(a, l);
        }
        if (attnd_sm90_plain(a, l))
            return attnd_paged_run_sm90<attnd_paged_sm90_traits<D_PAD, KV, ATTND_SM90_DEEP_V, false,
                                                                ATTND_SRC_PAGED, true>>(a, l);
        return attnd_paged_run_sm90<attnd_paged_sm90_traits<D_PAD, KV>>(a, l);
    } else if constexpr (CORE == ATTND_CORE_SM80_DECODE && KV == ATTND_KV_FP8 && D_PAD >= 128) {
        if ((int64_t)l.max_query_len * a.group <= 8) // the rows fit the narrow tiles' n8 columns
            return attnd_paged_run_sm80<attnd_paged_traits<D_PAD, KV, true, true>>(a, l);
        return attnd_paged_run_sm80<attnd_paged_traits<D_PAD, KV, true>>(a, l);
    } else
        return attnd_paged_run_sm80<attnd_paged_traits<D_PAD, KV, CORE == ATTND_CORE_SM80_DECODE>>(
            a, l);
}

#endif
