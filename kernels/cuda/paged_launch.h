// Launch side of the paged-attention kernels: one launcher template per tile configuration,
// and the per-configuration dispatchers that paged_2d.cu (prefill tiles) and paged_3d.cu
// (decode tiles, segment reduce) instantiate. paged.cu builds the arguments and picks.
#ifndef ATTND_CUDA_PAGED_LAUNCH_H
#define ATTND_CUDA_PAGED_LAUNCH_H

#include <cuda_runtime.h>
#include <limits.h>

#include "paged_kernel.cuh"

#define ATTND_CUDA_MAX_DEVICES 64

// Launch Tr's kernel over every q-block of the batch (x), kv head (y) and segment (z).
// max_smem: the device's opt-in limit. Returns the launch status.
template <class Tr>
static cudaError_t attnd_paged_launch(attnd_paged_args a, int64_t num_tokens, int max_query_len,
                                      int device, int max_smem, cudaStream_t st)
{
    static int attr_set[ATTND_CUDA_MAX_DEVICES]; // benign race: every writer sets the same value
    if (Tr::SMEM_BYTES > max_smem) return cudaErrorInvalidConfiguration;
    if (device >= 0 && device < ATTND_CUDA_MAX_DEVICES && !attr_set[device]) {
        cudaError_t e = cudaFuncSetAttribute(
            attnd_paged_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::SMEM_BYTES);
        if (e != cudaSuccess) return e;
        attr_set[device] = 1;
    }
    a.direct = (int64_t)max_query_len * a.group <= Tr::BLOCK_M;
    int64_t gx = a.direct ? a.num_seqs : num_tokens * a.group / Tr::BLOCK_M + a.num_seqs;
    if (gx > INT_MAX || a.num_kv_heads > 65535 || a.num_segments > 65535)
        return cudaErrorInvalidConfiguration;
    attnd_paged_kernel<Tr><<<dim3((unsigned)gx, (unsigned)a.num_kv_heads, (unsigned)a.num_segments),
                             Tr::THREADS, Tr::SMEM_BYTES, st>>>(a);
    return cudaGetLastError();
}

// Run EXPR with Tr typedef'd to ATTND_CFG(d_pad, kv) (each .cu defines ATTND_CFG).
#define ATTND_SWITCH_CFG(d_pad, kv, EXPR)                                                          \
    switch ((d_pad)*4 + (kv)) {                                                                    \
    case 64 * 4 + ATTND_KV_F16: {                                                                  \
        typedef ATTND_CFG(64, ATTND_KV_F16) Tr;                                                    \
        EXPR;                                                                                      \
    }                                                                                              \
    case 64 * 4 + ATTND_KV_BF16: {                                                                 \
        typedef ATTND_CFG(64, ATTND_KV_BF16) Tr;                                                   \
        EXPR;                                                                                      \
    }                                                                                              \
    case 64 * 4 + ATTND_KV_FP8: {                                                                  \
        typedef ATTND_CFG(64, ATTND_KV_FP8) Tr;                                                    \
        EXPR;                                                                                      \
    }                                                                                              \
    case 128 * 4 + ATTND_KV_F16: {                                                                 \
        typedef ATTND_CFG(128, ATTND_KV_F16) Tr;                                                   \
        EXPR;                                                                                      \
    }                                                                                              \
    case 128 * 4 + ATTND_KV_BF16: {                                                                \
        typedef ATTND_CFG(128, ATTND_KV_BF16) Tr;                                                  \
        EXPR;                                                                                      \
    }                                                                                              \
    case 128 * 4 + ATTND_KV_FP8: {                                                                 \
        typedef ATTND_CFG(128, ATTND_KV_FP8) Tr;                                                   \
        EXPR;                                                                                      \
    }                                                                                              \
    case 256 * 4 + ATTND_KV_F16: {                                                                 \
        typedef ATTND_CFG(256, ATTND_KV_F16) Tr;                                                   \
        EXPR;                                                                                      \
    }                                                                                              \
    case 256 * 4 + ATTND_KV_BF16: {                                                                \
        typedef ATTND_CFG(256, ATTND_KV_BF16) Tr;                                                  \
        EXPR;                                                                                      \
    }                                                                                              \
    case 256 * 4 + ATTND_KV_FP8: {                                                                 \
        typedef ATTND_CFG(256, ATTND_KV_FP8) Tr;                                                   \
        EXPR;                                                                                      \
    }                                                                                              \
    default:                                                                                       \
        break;                                                                                     \
    }

// Shared memory (bytes) the configuration needs; 0 for an unknown one.
size_t attnd_paged_smem_prefill(int d_pad, int kv);
size_t attnd_paged_smem_decode(int d_pad, int kv);

// Prefill tiles (BLOCK_M = 128 or 64 packed rows), whole context, final output.
cudaError_t attnd_paged_run_prefill(const attnd_paged_args &a, int d_pad, int kv,
                                    int64_t num_tokens, int max_query_len, int device, int max_smem,
                                    cudaStream_t st);
// Decode tiles (16 packed rows, 4 warps over the tokens); a.num_segments > 1 writes partials.
cudaError_t attnd_paged_run_decode(const attnd_paged_args &a, int d_pad, int kv, int64_t num_tokens,
                                   int max_query_len, int device, int max_smem, cudaStream_t st);
// Merge a.num_segments partials per (token, q head) into the output (and LSE); on sm_90 as a
// programmatic dependent launch of the segment kernel (pdl != 0).
cudaError_t attnd_paged_run_reduce(const attnd_paged_args &a, int64_t num_tokens, int pdl,
                                   cudaStream_t st);

#endif
