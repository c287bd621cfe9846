// Device helpers of the merge / varlen / block-sparse / linear kernels that the shared headers
// (prims/math.cuh: conversions, runtime-dtype loads/stores, softmax and LSE-merge math;
// prims/sm80.cuh: cp.async, ldmatrix, mma.sync, swizzle for 128-byte rows) do not have:
// the mma operand type by flag, unpacking, pair stores, 64-byte-row swizzle, fp8x8 -> f16x8.
#ifndef ATTND_CUDA_OPS_KERNEL_CUH
#define ATTND_CUDA_OPS_KERNEL_CUH

#include "prims/math.cuh"
#include "prims/sm80.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attnd CUDA kernels need sm_80 or newer"
#endif

// 16-bit operand type of the tensor-core products: IS_BF16 ? bf16 : f16.
template <bool IS_BF16> struct attnd_t16 {
    typedef __half T;
};
template <> struct attnd_t16<true> {
    typedef __nv_bfloat16 T;
};

template <bool IS_BF16> static __device__ __forceinline__ uint32_t attnd_pack2(float lo, float hi)
{
    return attnd_tc<typename attnd_t16<IS_BF16>::T>::pack(lo, hi);
}

template <bool IS_BF16>
static __device__ __forceinline__ void attnd_mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                                      uint32_t b1)
{
    attnd_mma<typename attnd_t16<IS_BF16>::T>::run(c, a, b0, b1);
}

// Two consecutive elements i, i+1 of a float buffer of dtype dt (the pair is aligned).
static __device__ __forceinline__ void attnd_st2_elem(void *base, int dt, int64_t i, float a,
                                                      float b)
{
    switch (dt) {
    case ATTND_DTYPE_F32:
        *(float2 *)((float *)base + i) = make_float2(a, b);
        break;
    case ATTND_DTYPE_F16:
        *(uint32_t *)((__half *)base + i) = attnd_tc<__half>::pack(a, b);
        break;
    case ATTND_DTYPE_BF16:
        *(uint32_t *)((__nv_bfloat16 *)base + i) = attnd_tc<__nv_bfloat16>::pack(a, b);
        break;
    case ATTND_DTYPE_FP8_E4M3:
        *(uint16_t *)((uint8_t *)base + i) =
            (uint16_t)(attnd_float_to_fp8(a) | ((uint16_t)attnd_float_to_fp8(b) << 8));
        break;
    default:
        break;
    }
}

static __device__ __forceinline__ void attnd_st_shared32(uint32_t addr, uint32_t v)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Byte offset of 16-byte chunk c of row r in a tile of W chunks per row: prims/sm80.cuh's swizzle
// (chunk ^ r % 8) for rows of 128 bytes or more, and chunk ^ (r / 2) % 4 for 64-byte rows (two
// rows share a 128-byte bank line), so the eight rows one ldmatrix reads never share banks.
template <int W> static __device__ __forceinline__ uint32_t attnd_swz_w(int r, int c)
{
    static_assert(W == 4 || W % 8 == 0, "tile rows must be 64 bytes or a multiple of 128");
    if (W >= 8) return attnd_swz(r, c, W * 16);
    return (uint32_t)((r * W + (c ^ ((r >> 1) & 3))) * 16);
}

#endif
