/* The model the daemon serves, fixed for its life: geometry (layers, heads, head size, block
 * size, cache dtype, blocks), the linear-attention state shape, and what each layer's attention
 * applies (softmax scale, fp8 scales, softcap, sliding window, ALiBi slopes, sinks), resolved
 * from geometry.layers over the global keys. Also the check of a client's expected geometry
 * (Hello.expect): the first difference, named. */
#ifndef ATTND_STATE_MODEL_H
#define ATTND_STATE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/config.h"
#include "attnd/plan.h"

/* One layer's attention as the daemon applies it. */
typedef struct attnd_model_layer {
    float scale;   /* effective softmax scale */
    float softcap; /* 0 = off */
    float k_scale, v_scale;
    int32_t sliding_window;    /* 0 = off */
    int alibi;                 /* ATTND_CFG_ALIBI_*; the slopes are in alibi_slopes either way */
    const float *alibi_slopes; /* [num_q_heads] unless alibi is OFF */
    const float *sinks;        /* [num_q_heads] sink logits, NULL = none */
} attnd_model_layer;

typedef struct attnd_model {
    attnd_cfg_geometry geo; /* num_blocks as sized at start (geometry.gpu_memory_fraction);
                               geo.layers NULL: resolved into `layers` */
    attnd_cfg_linear lin;
    float scale;               /* the global softmax scale (geometry.scale, effective) */
    attnd_model_layer *layers; /* [num_layers] */
    float *values;       /* [num_layers][2][num_q_heads]: each layer's ALiBi slopes, then sinks */
    uint32_t needs;      /* ATTND_FEATURE_* some layer needs (sinks, an f32 cache) */
    int per_layer;       /* 1 when some layer's values (slopes, sinks) live in `values` */
    uint32_t pattern;    /* entries of geometry.layers (0 = none): layer l is entry l % pattern */
    uint32_t window_all; /* every layer windowed: the largest window (blocks wholly before it
                            can go); 0 otherwise */
} attnd_model;

/* A client's expectation (Hello.expect): what it sets is compared. */
enum {
    ATTND_EXPECT_NUM_LAYERS = 1u << 0,
    ATTND_EXPECT_NUM_Q_HEADS = 1u << 1,
    ATTND_EXPECT_NUM_KV_HEADS = 1u << 2,
    ATTND_EXPECT_HEAD_SIZE = 1u << 3,
    ATTND_EXPECT_BLOCK_SIZE = 1u << 4,
    ATTND_EXPECT_CACHE_DTYPE = 1u << 5,
};

/* One expected layer; floats compare within 1e-6 relative. scale 0 = 1/sqrt(head_size);
 * k_scale / v_scale 0 = not compared; alibi on with no slopes = the standard slopes. */
typedef struct attnd_expect_layer {
    uint32_t sliding_window;
    float softcap, scale, k_scale, v_scale;
    int alibi;
    uint32_t num_alibi_slopes, num_sinks;
    const float *alibi_slopes, *sinks;
} attnd_expect_layer;

typedef struct attnd_model_expect {
    uint32_t set; /* ATTND_EXPECT_* */
    uint32_t num_layers, num_q_heads, num_kv_heads, head_size, block_size;
    int cache_dtype;
    uint32_t num_layer_opts; /* 0 = per-layer options not compared; else it divides num_layers
                                and entry i % num_layer_opts is layer i's */
    const attnd_expect_layer *layer_opts;
} attnd_model_expect;

/* Resolve cfg's model. NO_MEMORY (err says so). */
attnd_err attnd_model_init(attnd_model *m, const attnd_config *cfg, char *err, size_t n);
void attnd_model_fini(attnd_model *m);
/* UNSUPPORTED naming the first key (geometry.layers[i].sinks, geometry.cache_dtype) whose
 * option the backend does not implement; OK otherwise. */
attnd_err attnd_model_check_backend(const attnd_model *m, const attnd_backend *be, char *err,
                                    size_t n);
/* FAILED_PRECONDITION naming the first field where m differs from what the client expects
 * ("geometry.layers[3].softcap: the daemon serves 0, the client expects 50"); INVALID_ARGUMENT
 * for an expectation that cannot describe this model's layers (a count that does not divide,
 * arrays of the wrong length). */
attnd_err attnd_model_expect_check(const attnd_model *m, const attnd_model_expect *e, char *err,
                                   size_t n);
/* Bytes of one layer's K (or V) block. */
size_t attnd_model_block_bytes(const attnd_model *m);
/* Bytes of one linear state slot (heads x dim x dim f32). */
size_t attnd_model_linear_slot_bytes(const attnd_model *m);
/* ALiBi's standard slopes (Press et al.) for n heads, into out[n]. */
void attnd_model_alibi_standard(uint32_t n, float *out);
/* A layer's K (or V) pool at base as a tensor [num_blocks, block_size, kv_heads, head_size]. */
attnd_tensor attnd_model_cache_tensor(const attnd_model *m, void *base);
/* The options of layer `layer` in pl (scale, fp8 scales, softcap, window; the ALiBi slopes and
 * sinks at their place in `values`, the backend's copy of m->values, when the layer has them);
 * pl's tensors are the caller's. */
void attnd_model_layer_opts(const attnd_model *m, uint32_t layer, const float *values,
                            attnd_plan_layer *pl);

#endif
