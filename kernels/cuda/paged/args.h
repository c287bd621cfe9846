// What every paged-attention kernel receives, by value: the caller's attnd_paged_params (device
// pointers, shapes, int64 strides; the one representation of the launch) and the few values the
// host derives from it once (scales folded for the log2 domain, the flags that pick fast paths,
// the 3D workspace split). Strides are read from p (elements), never copied.
#ifndef ATTND_CUDA_PAGED_ARGS_H
#define ATTND_CUDA_PAGED_ARGS_H

#include <stdint.h>

#include "attnd/kernels.h"

// cache types; F32 has its own exact kernel (paged/f32.cu), not one of the cores
enum { ATTND_KV_F16 = 0, ATTND_KV_BF16 = 1, ATTND_KV_FP8 = 2, ATTND_KV_F32 = 3 };

typedef struct attnd_paged_kargs {
    attnd_paged_params p;
    float qk_scale;      /* scale * k_scale (fp8): multiplies q.k into natural-log logits */
    float qk_scale_log2; /* qk_scale * log2(e) */
    float out_scale;     /* v_scale (fp8) or 1 */
    float p_descale;     /* varlen with fp8 inputs (sm90 core): P quantised as fp8(p * p_descale) */
    int32_t plain;       /* no softcap, no ALiBi, qk_scale > 0: the fused fast path */
    int32_t group;       /* q heads per kv head */
    int32_t bs_log2;
    int32_t nblocks32;      /* min(num_blocks, INT32_MAX): page ids at or past it read as zeros */
    int32_t q_vec, out_vec; /* rows aligned for 8-element loads / 4-element stores */
    int32_t kv_vec16;       /* fp8 cache: 16-byte copies allowed (else two 8-byte copies) */
    int32_t kv_same;        /* k_cache and v_cache have the same strides */
    int32_t direct;         /* sm80: blockIdx.x is the sequence (each has at most one q-block) */
    int32_t m_rounds;       /* sm90: q-blocks of the longest sequence (the tile enumeration) */
    int32_t section;        /* sm90: (sequence, kv head) pairs whose K/V share the L2 at a time */
    int32_t num_segments;
    float *ws_o, *ws_m, *ws_l; /* 3D partials when num_segments > 1 */
    unsigned *tickets; /* 3D: one per (q-block, kv head); the CTA that stores the last segment of
                          its pair merges the partials (NULL: the reduce kernel does) */
    int32_t q_tma;     /* sm90 plain core: work tiles and their Q rows (attnd_sm90_maps.q, by
                          TMA) published by the producer warpgroup's loader */
#ifdef ATTND_DECODE_TIMELINE
    unsigned long long *timeline; /* benches: per-CTA %globaltimer records (mainloop_sm80.cuh) */
#endif
} attnd_paged_kargs;

#endif
