/* Element types and host-side conversions (bf16, fp16, fp8-e4m3fn <-> float).
 * The CPU backend, the daemon and the tests share these; CUDA has its own device twins. */
#ifndef ATTND_DTYPE_H
#define ATTND_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum attnd_dtype {
    ATTND_DTYPE_F32 = 0,
    ATTND_DTYPE_F16 = 1,
    ATTND_DTYPE_BF16 = 2,
    ATTND_DTYPE_FP8_E4M3 = 3, /* e4m3fn: no inf, max 448, saturating conversion */
    ATTND_DTYPE_I32 = 4,
    ATTND_DTYPE_I64 = 5,
    ATTND_DTYPE_COUNT
} attnd_dtype;

/* Bytes per element (0 for an unknown dtype). */
static inline size_t attnd_dtype_size(attnd_dtype dt)
{
    switch (dt) {
    case ATTND_DTYPE_F32: return 4;
    case ATTND_DTYPE_F16: return 2;
    case ATTND_DTYPE_BF16: return 2;
    case ATTND_DTYPE_FP8_E4M3: return 1;
    case ATTND_DTYPE_I32: return 4;
    case ATTND_DTYPE_I64: return 8;
    default: return 0;
    }
}

/* Lower-case name ("bf16", "fp8_e4m3"...), "?" for unknown. */
const char *attnd_dtype_name(attnd_dtype dt);
/* Parse a name as attnd_dtype_name prints it; returns -1 when unknown. */
int attnd_dtype_parse(const char *name, attnd_dtype *out);

static inline uint32_t attnd_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float attnd_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float attnd_bf16_to_f32(uint16_t h)
{
    return attnd_bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t attnd_f32_to_bf16(float f)
{
    uint32_t u = attnd_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float attnd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return attnd_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
        return sign ? -v : v;
    }
    return attnd_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Round to nearest even; overflow to inf; NaN stays NaN. */
static inline uint16_t attnd_f32_to_f16(float f)
{
    uint32_t u = attnd_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: subnormal */
        float v = attnd_bits_f32(a) * 16777216.0f;          /* in units of 2^-24 */
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}

static inline float attnd_fp8_to_f32(uint8_t b)
{
    uint32_t exp = (b >> 3) & 0xfu, mant = b & 7u;
    float v;
    if (exp == 0xf && mant == 7) return attnd_bits_f32(0x7fc00000u);
    if (exp == 0)
        v = (float)mant * (1.0f / 512.0f);
    else
        v = attnd_bits_f32(((exp + 120u) << 23) | (mant << 20));
    return (b & 0x80u) ? -v : v;
}

/* e4m3fn, round to nearest even, saturating at +-448 (inf too); NaN -> NaN. */
static inline uint8_t attnd_f32_to_fp8(float f)
{
    uint32_t u = attnd_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 */
    if (a < 0x3c800000u) {                                /* below 2^-6: subnormal */
        float v = attnd_bits_f32(a) * 512.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint8_t)(sign | m);
    }
    a += 0x7ffffu + ((a >> 20) & 1u);
    return (uint8_t)(sign | ((((a >> 23) - 120u) << 3) | ((a >> 20) & 7u)));
}

/* Element i of a buffer of dtype dt, as float (integers converted). */
static inline float attnd_load_f32(const void *base, attnd_dtype dt, int64_t i)
{
    switch (dt) {
    case ATTND_DTYPE_F32: return ((const float *)base)[i];
    case ATTND_DTYPE_F16: return attnd_f16_to_f32(((const uint16_t *)base)[i]);
    case ATTND_DTYPE_BF16: return attnd_bf16_to_f32(((const uint16_t *)base)[i]);
    case ATTND_DTYPE_FP8_E4M3: return attnd_fp8_to_f32(((const uint8_t *)base)[i]);
    case ATTND_DTYPE_I32: return (float)((const int32_t *)base)[i];
    case ATTND_DTYPE_I64: return (float)((const int64_t *)base)[i];
    default: return 0.0f;
    }
}

/* Store v as element i of a float buffer of dtype dt (fp8: v is already divided by its scale). */
static inline void attnd_store_f32(void *base, attnd_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case ATTND_DTYPE_F32: ((float *)base)[i] = v; break;
    case ATTND_DTYPE_F16: ((uint16_t *)base)[i] = attnd_f32_to_f16(v); break;
    case ATTND_DTYPE_BF16: ((uint16_t *)base)[i] = attnd_f32_to_bf16(v); break;
    case ATTND_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = attnd_f32_to_fp8(v); break;
    default: break;
    }
}

#ifdef __cplusplus
}
#endif
#endif
