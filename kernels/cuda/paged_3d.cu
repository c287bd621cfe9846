// Instantiations of the decode tile configuration (3 padded head sizes x 3 cache types) and the
// segment reduce.
#include <string.h>

#include "paged_launch.h"
#include "paged_reduce_kernel.cuh"

#define ATTND_CFG(D, KV) attnd_paged_traits<D, KV, true>

size_t attnd_paged_smem_decode(int d_pad, int kv)
{
    ATTND_SWITCH_CFG(d_pad, kv, return Tr::SMEM_BYTES)
    return 0;
}

cudaError_t attnd_paged_run_decode(const attnd_paged_args &a, int d_pad, int kv, int64_t num_tokens,
                                   int max_query_len, int device, int max_smem, cudaStream_t st)
{
    ATTND_SWITCH_CFG(
        d_pad, kv,
        return attnd_paged_launch<Tr>(a, num_tokens, max_query_len, device, max_smem, st))
    return cudaErrorInvalidValue;
}

cudaError_t attnd_paged_run_reduce(const attnd_paged_args &a, int64_t num_tokens, int pdl,
                                   cudaStream_t st)
{
    const int64_t items = num_tokens * a.num_q_heads; // one CTA each
    if (items > INT_MAX) return cudaErrorInvalidConfiguration;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)items);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, attnd_paged_reduce_kernel, a);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}
