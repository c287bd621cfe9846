// Device math shared by every CUDA attention kernel: element conversions (f32/f16/bf16/fp8-e4m3),
// runtime-dtype loads and stores, the online softmax in the log2 domain, LSE merging with the
// DESIGN.md conventions (+inf reads as -inf, all -inf gives zeros), quad/warp reductions and an
// accurate tanh for softcap. Header-only, C-like; include from *_kernel.cuh files.
#ifndef ATTND_CUDA_PRIMS_MATH_CUH
#define ATTND_CUDA_PRIMS_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "attnd/dtype.h"

#define ATTND_LOG2E 1.4426950408889634f
#define ATTND_LN2 0.6931471805599453f
#define ATTND_F16_MAX 65504.0f

// ------------------------------------------------------------------ scalar conversions

__device__ __forceinline__ float attnd_neg_inf(void)
{
    return __int_as_float(0xff800000);
}

__device__ __forceinline__ float attnd_pos_inf(void)
{
    return __int_as_float(0x7f800000);
}

// exp2 of x; -inf gives 0 (ex2.approx handles it). Fast-math: MUFU.EX2.
__device__ __forceinline__ float attnd_exp2(float x)
{
    return exp2f(x);
}

// tanh to ~1e-7 absolute (tanh.approx is only ~5e-4, too coarse for f16 outputs under softcap).
__device__ __forceinline__ float attnd_tanh(float x)
{
    float ax = fabsf(x);
    float e = exp2f(fminf(ax * (2.0f * ATTND_LOG2E), 126.0f)); // e^(2|x|), finite
    float t = 1.0f - __fdividef(2.0f, e + 1.0f);
    return copysignf(t, x);
}

// fp8 e4m3fn code -> float (exact; 0x7f/0xff are NaN).
__device__ __forceinline__ float attnd_fp8_to_float(uint8_t b)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}

// float -> fp8 e4m3fn, round to nearest even, saturating at +-448 (inf too), NaN stays NaN.
__device__ __forceinline__ uint8_t attnd_float_to_fp8(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// The two fp8 codes (low byte first) in half HI of w (0: bits 0-15, 1: bits 16-31) -> packed
// f16x2 (exact). From sm_89 the half is the conversion's operand selector (F2FP ... R.H1), not
// a shift before it (a shift per pair was 6% of the fp8 decode's instructions).
template <int HI> __device__ __forceinline__ uint32_t attnd_fp8x2_to_half2(uint32_t w)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t r;
    if (HI)
        asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}"
            : "=r"(r)
            : "r"(w));
    else
        asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}"
            : "=r"(r)
            : "r"(w));
    return r;
#else
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(HI ? w >> 16 : w & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
#endif
}

// Eight e4m3 codes (one 8-byte word) -> eight f16 values (16 bytes); exact.
__device__ __forceinline__ uint4 attnd_fp8x8_to_half8(uint2 w)
{
    return make_uint4(attnd_fp8x2_to_half2<0>(w.x), attnd_fp8x2_to_half2<1>(w.x),
                      attnd_fp8x2_to_half2<0>(w.y), attnd_fp8x2_to_half2<1>(w.y));
}

// One 16-byte chunk of e4m3 codes -> two 16-byte chunks of f16 (exact).
__device__ __forceinline__ void attnd_fp8x16_to_f16(uint4 w4, uint4 *lo, uint4 *hi)
{
    *lo = attnd_fp8x8_to_half8(make_uint2(w4.x, w4.y));
    *hi = attnd_fp8x8_to_half8(make_uint2(w4.z, w4.w));
}

// ------------------------------------------------------------------ the 16-bit compute types
// attnd_tc<T> packs pairs of floats into the 32-bit registers the tensor cores read.

template <typename T> struct attnd_tc;

template <> struct attnd_tc<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    // Inputs converted to f16 saturate at +-65504 instead of becoming inf.
    static __device__ __forceinline__ float clamp(float a)
    {
        return fminf(fmaxf(a, -ATTND_F16_MAX), ATTND_F16_MAX);
    }
};

template <> struct attnd_tc<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float clamp(float a)
    {
        return a;
    }
};

// A if C else B (a compile-time type choice, e.g. the compute type of a cache dtype).
template <bool C, typename A, typename B> struct attnd_select {
    typedef A type;
};
template <typename A, typename B> struct attnd_select<false, A, B> {
    typedef B type;
};

// ------------------------------------------------------------------ runtime-dtype loads / stores
// dt is an attnd_dtype (F32, F16, BF16, FP8_E4M3). Pointers are element pointers.

__device__ __forceinline__ float attnd_ld_elem(const void *base, int dt, int64_t i)
{
    switch (dt) {
    case ATTND_DTYPE_F32:
        return ((const float *)base)[i];
    case ATTND_DTYPE_F16:
        return __half2float(((const __half *)base)[i]);
    case ATTND_DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case ATTND_DTYPE_FP8_E4M3:
        return attnd_fp8_to_float(((const uint8_t *)base)[i]);
    default:
        return 0.0f;
    }
}

__device__ __forceinline__ void attnd_st_elem(void *base, int dt, int64_t i, float v)
{
    switch (dt) {
    case ATTND_DTYPE_F32:
        ((float *)base)[i] = v;
        break;
    case ATTND_DTYPE_F16:
        ((__half *)base)[i] = __float2half_rn(v);
        break;
    case ATTND_DTYPE_BF16:
        ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(v);
        break;
    case ATTND_DTYPE_FP8_E4M3:
        ((uint8_t *)base)[i] = attnd_float_to_fp8(v);
        break;
    default:
        break;
    }
}

// A packed pair of 16-bit values (low half first) as two floats (bf16: f32's upper half).
template <bool IS_BF16> __device__ __forceinline__ float2 attnd_unpack2(uint32_t u)
{
    if (IS_BF16) return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
    return __half22float2(*reinterpret_cast<__half2 *>(&u));
}

// Eight consecutive elements starting at element offset i into f[]. vec: the address is aligned
// to the vector width (16 bytes for 16-bit and f32, 8 for fp8) so one or two wide loads suffice.
__device__ __forceinline__ void attnd_ld8(const void *base, int dt, int64_t i, bool vec, float f[8])
{
    if (vec) {
        if (dt == ATTND_DTYPE_F32) {
            const float4 *p = (const float4 *)((const float *)base + i);
            float4 a = p[0], b = p[1];
            f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
            f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
            return;
        }
        if (dt == ATTND_DTYPE_F16 || dt == ATTND_DTYPE_BF16) {
            uint4 u = *(const uint4 *)((const uint16_t *)base + i);
            uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 t =
                    dt == ATTND_DTYPE_F16 ? attnd_unpack2<false>(w[k]) : attnd_unpack2<true>(w[k]);
                f[2 * k] = t.x, f[2 * k + 1] = t.y;
            }
            return;
        }
        if (dt == ATTND_DTYPE_FP8_E4M3) {
            const uint4 h = attnd_fp8x8_to_half8(*(const uint2 *)((const uint8_t *)base + i));
            const uint32_t w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 a = attnd_unpack2<false>(w[k]);
                f[2 * k] = a.x, f[2 * k + 1] = a.y;
            }
            return;
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        f[k] = attnd_ld_elem(base, dt, i + k);
}

// Store n (4 or 8) consecutive floats at element offset i. vec: aligned to n elements.
template <int N>
__device__ __forceinline__ void attnd_stN(void *base, int dt, int64_t i, bool vec, const float *f)
{
    static_assert(N == 4 || N == 8, "attnd_stN stores 4 or 8 elements");
    if (vec) {
        if (dt == ATTND_DTYPE_F32) {
            float4 *p = (float4 *)((float *)base + i);
#pragma unroll
            for (int k = 0; k < N / 4; k++)
                p[k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
            return;
        }
        if (dt == ATTND_DTYPE_F16 || dt == ATTND_DTYPE_BF16) {
            uint32_t w[N / 2];
#pragma unroll
            for (int k = 0; k < N / 2; k++)
                w[k] = dt == ATTND_DTYPE_F16
                           ? attnd_tc<__half>::pack(f[2 * k], f[2 * k + 1])
                           : attnd_tc<__nv_bfloat16>::pack(f[2 * k], f[2 * k + 1]);
            if constexpr (N == 8)
                *(uint4 *)((uint16_t *)base + i) = make_uint4(w[0], w[1], w[2], w[3]);
            else
                *(uint2 *)((uint16_t *)base + i) = make_uint2(w[0], w[1]);
            return;
        }
    }
#pragma unroll
    for (int k = 0; k < N; k++)
        attnd_st_elem(base, dt, i + k, f[k]);
}

// Store two consecutive floats at element offset i (even); vec: aligned for one 2-element store.
__device__ __forceinline__ void attnd_st2(void *base, int dt, int64_t i, bool vec, float a, float b)
{
    if (vec) {
        if (dt == ATTND_DTYPE_F32) {
            *(float2 *)((float *)base + i) = make_float2(a, b);
            return;
        }
        if (dt == ATTND_DTYPE_BF16) {
            *(uint32_t *)((uint16_t *)base + i) = attnd_tc<__nv_bfloat16>::pack(a, b);
            return;
        }
        if (dt == ATTND_DTYPE_F16) {
            *(uint32_t *)((uint16_t *)base + i) = attnd_tc<__half>::pack(a, b);
            return;
        }
    }
    attnd_st_elem(base, dt, i, a);
    attnd_st_elem(base, dt, i + 1, b);
}

// ------------------------------------------------------------------ reductions

// Over the 4 threads of an mma quad (lanes 4g..4g+3), which share a row of a C fragment.
__device__ __forceinline__ float attnd_quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float attnd_quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Over the 8 threads sharing t = lane % 4 (lanes t, t + 4, ..), which share a column of a C
// fragment.
__device__ __forceinline__ float attnd_col_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

__device__ __forceinline__ float attnd_col_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

__device__ __forceinline__ float attnd_warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float attnd_warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ------------------------------------------------------------------ online softmax (log2 domain)
// A row's state: running max m of the log2-scaled logits and sum l of exp2(x - m). Logits enter
// already multiplied by log2(e); -inf marks a masked logit.

// The max to subtract: m itself, or 0 while nothing is visible (keeps exp2(-inf - m) = 0, never
// NaN).
__device__ __forceinline__ float attnd_softmax_safe_max(float m)
{
    return m == attnd_neg_inf() ? 0.0f : m;
}

// Natural-log LSE of a finished row (m log2 domain, l its sum); -inf when nothing was visible.
__device__ __forceinline__ float attnd_softmax_lse(float m, float l)
{
    return l > 0.0f ? (m + __log2f(l)) * ATTND_LN2 : attnd_neg_inf();
}

// ------------------------------------------------------------------ LSE merge (natural log)
// Weights of two partial outputs given their natural-log LSEs: +inf reads as -inf (FA2's empty
// input), both -inf gives weights 0, 0 and returns -inf. Returns the merged LSE.
__device__ __forceinline__ float attnd_lse_merge2(float lse_a, float lse_b, float *wa, float *wb)
{
    if (lse_a == attnd_pos_inf()) lse_a = attnd_neg_inf();
    if (lse_b == attnd_pos_inf()) lse_b = attnd_neg_inf();
    float mx = fmaxf(lse_a, lse_b);
    if (mx == attnd_neg_inf()) {
        *wa = 0.0f;
        *wb = 0.0f;
        return attnd_neg_inf();
    }
    float ea = attnd_exp2((lse_a - mx) * ATTND_LOG2E), eb = attnd_exp2((lse_b - mx) * ATTND_LOG2E);
    float inv = 1.0f / (ea + eb);
    *wa = ea * inv;
    *wb = eb * inv;
    return mx + __logf(ea + eb);
}

#endif
