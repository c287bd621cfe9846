// Cache write: new K/V rows into their cache slots (vLLM's reshape_and_cache), converting to the
// cache dtype: f16/bf16 round to nearest even; fp8 e4m3 stores x / scale (IEEE division, as the
// CPU backend) rounded to nearest even and saturated at +-448. Negative slots are padding.
#ifndef ATTND_CUDA_CACHE_WRITE_KERNEL_CUH
#define ATTND_CUDA_CACHE_WRITE_KERNEL_CUH

#include <stdint.h>

#include "prims/math.cuh"

typedef struct attnd_cache_write_args {
    const void *key, *value;
    int64_t key_s0, key_s1, value_s0, value_s1;
    int32_t key_dt, value_dt;
    int32_t key_vec, value_vec; /* rows aligned for 8-element loads */
    void *k_cache, *v_cache;
    int64_t kc_s0, kc_s1, kc_s2, vc_s0, vc_s1, vc_s2;
    int32_t cache_dt;
    int32_t cache_vec; /* cache rows aligned for 8-element stores */
    const void *slots;
    int64_t slot_s0;
    int32_t slot_i64;
    int64_t num_tokens, num_blocks;
    int32_t num_kv_heads, head_size, block_size;
    float k_scale, v_scale;
} attnd_cache_write_args;

// Store eight floats as cache elements at element offset i (fp8: already divided by the scale).
__device__ __forceinline__ void attnd_cache_st8(void *base, int dt, int64_t i, bool vec,
                                                const float f[8])
{
    if (dt == ATTND_DTYPE_FP8_E4M3) {
        uint8_t b[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            b[k] = attnd_float_to_fp8(f[k]);
        if (vec) {
            uint2 w;
            w.x = b[0] | (b[1] << 8) | (b[2] << 16) | ((uint32_t)b[3] << 24);
            w.y = b[4] | (b[5] << 8) | (b[6] << 16) | ((uint32_t)b[7] << 24);
            *(uint2 *)((uint8_t *)base + i) = w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                ((uint8_t *)base)[i + k] = b[k];
        }
        return;
    }
    attnd_stN<8>(base, dt, i, vec, f);
}

// One thread per (token, kv head, 8-element chunk), grid-strided.
__global__ void __launch_bounds__(256) attnd_cache_write_kernel(const attnd_cache_write_args a)
{
    const int chunks = a.head_size / 8;
    const int64_t total = a.num_tokens * a.num_kv_heads * chunks;
    const bool fp8 = a.cache_dt == ATTND_DTYPE_FP8_E4M3;
    for (int64_t item = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; item < total;
         item += (int64_t)gridDim.x * blockDim.x) {
        const int64_t tok = item / ((int64_t)a.num_kv_heads * chunks);
        const int rem = (int)(item % ((int64_t)a.num_kv_heads * chunks));
        const int h = rem / chunks, c = rem % chunks;
        const int64_t slot = a.slot_i64 ? ((const int64_t *)a.slots)[tok * a.slot_s0]
                                        : (int64_t)((const int32_t *)a.slots)[tok * a.slot_s0];
        if (slot < 0) continue;
        const int64_t blk = slot / a.block_size, row = slot % a.block_size;
        if (blk >= a.num_blocks) continue;
        float f[8];
        attnd_ld8(a.key, a.key_dt, tok * a.key_s0 + h * a.key_s1 + c * 8, a.key_vec != 0, f);
        if (fp8)
#pragma unroll
            for (int k = 0; k < 8; k++)
                f[k] = __fdiv_rn(f[k], a.k_scale);
        attnd_cache_st8(a.k_cache, a.cache_dt, blk * a.kc_s0 + row * a.kc_s1 + h * a.kc_s2 + c * 8,
                        a.cache_vec != 0, f);
        attnd_ld8(a.value, a.value_dt, tok * a.value_s0 + h * a.value_s1 + c * 8, a.value_vec != 0,
                  f);
        if (fp8)
#pragma unroll
            for (int k = 0; k < 8; k++)
                f[k] = __fdiv_rn(f[k], a.v_scale);
        attnd_cache_st8(a.v_cache, a.cache_dt, blk * a.vc_s0 + row * a.vc_s1 + h * a.vc_s2 + c * 8,
                        a.cache_vec != 0, f);
    }
}

#endif
