// Instantiations of the prefill tile configuration (3 padded head sizes x 3 cache types).
#include "paged_launch.h"

#define ATTND_CFG(D, KV) attnd_paged_traits<D, KV, false>

size_t attnd_paged_smem_prefill(int d_pad, int kv)
{
    ATTND_SWITCH_CFG(d_pad, kv, return Tr::SMEM_BYTES)
    return 0;
}

cudaError_t attnd_paged_run_prefill(const attnd_paged_args &a, int d_pad, int kv,
                                    int64_t num_tokens, int max_query_len, int device, int max_smem,
                                    cudaStream_t st)
{
    ATTND_SWITCH_CFG(
        d_pad, kv,
        return attnd_paged_launch<Tr>(a, num_tokens, max_query_len, device, max_smem, st))
    return cudaErrorInvalidValue;
}
