/* Row and tile helpers shared by the CPU attention ops: strided rows to and from float32, dot
 * products, and one FA2 key-block step (logits, online softmax, P times V). */
#ifndef ATTND_CPU_TILE_H
#define ATTND_CPU_TILE_H

#include <math.h>
#include <stdint.h>

#include "attnd/dtype.h"
#include "softmax.h"

/* dst[i] = element (off + i) of base, as float, times scale (an fp8 dequantisation scale, or 1).
 * One switch per row rather than per element keeps the loops vectorisable. */
static inline void attnd_row_load(float *dst, const void *base, attnd_dtype dt, int64_t off,
                                  int64_t n, float scale)
{
    switch (dt) {
    case ATTND_DTYPE_F32: {
        const float *s = (const float *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = s[i] * scale;
        break;
    }
    case ATTND_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = attnd_f16_to_f32(s[i]) * scale;
        break;
    }
    case ATTND_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = attnd_bf16_to_f32(s[i]) * scale;
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            dst[i] = attnd_load_f32(base, dt, off + i) * scale;
        break;
    }
}

/* Element (off + i) of base = src[i] * mul, converted (fp8 saturates at +-448). */
static inline void attnd_row_store(void *base, attnd_dtype dt, int64_t off, const float *src,
                                   int64_t n, float mul)
{
    for (int64_t i = 0; i < n; i++)
        attnd_store_f32(base, dt, off + i, src[i] * mul);
}

/* Float32 dot product. Eight partial sums let the compiler vectorise without -ffast-math. */
static inline float attnd_dot(const float *a, const float *b, int64_t n)
{
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            part[k] += a[i + k] * b[i + k];
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int k = 0; k < 8; k++)
        s += part[k];
    return s;
}

/* y += a * x */
static inline void attnd_axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* x[j] = scale * q . k_j for the n key rows of kb (row stride d); keys j >= lim are masked. */
static inline void attnd_block_logits(float *x, const float *q, const float *kb, int64_t n,
                                      int64_t lim, int64_t d, float scale)
{
    for (int64_t j = 0; j < n; j++)
        x[j] = j < lim ? scale * attnd_dot(q, kb + j * d, d) : -INFINITY;
}

/* Weight p as the PV product sees it: with p_scale > 0, quantised to fp8 as p / p_scale and read
 * back times p_scale (the seed's fp8 path); the softmax sum keeps the unquantised p. */
static inline float attnd_p_weight(float p, float p_scale)
{
    if (p_scale <= 0.0f) return p;
    return attnd_fp8_to_f32(attnd_f32_to_fp8(p / p_scale)) * p_scale;
}

/* One key block for one query row: fold logits x[0..n) into the state and add P V to acc.
 * vb holds the n value rows (row stride d); x is overwritten. p_scale <= 0: P stays float32. */
static inline void attnd_block_accumulate(attnd_softmax *s, float *acc, float *x, const float *vb,
                                          int64_t n, int64_t d, float p_scale)
{
    attnd_softmax_push_block(s, acc, d, x, n);
    for (int64_t j = 0; j < n; j++) {
        float w = attnd_p_weight(x[j], p_scale);
        if (w != 0.0f) attnd_axpy(acc, w, vb + j * d, d);
    }
}

#endif
