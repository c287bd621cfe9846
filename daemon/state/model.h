/* The model the daemon serves, fixed for its life: geometry (layers, heads, head size, block
 * size, cache dtype, blocks), the linear-attention state shape, and what each layer's attention
 * uses (softmax scale, fp8 scales, softcap, sliding window, ALiBi). */
#ifndef ATTND_STATE_MODEL_H
#define ATTND_STATE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/config.h"
#include "attnd/plan.h"

typedef struct attnd_model {
    attnd_cfg_geometry geo; /* num_blocks as sized at start (geometry.gpu_memory_fraction) */
    attnd_cfg_linear lin;
    float scale; /* softmax scale */
} attnd_model;

void attnd_model_init(attnd_model *m, const attnd_config *cfg);
/* Bytes of one layer's K (or V) block. */
size_t attnd_model_block_bytes(const attnd_model *m);
/* Bytes of one linear state slot (heads x dim x dim f32). */
size_t attnd_model_linear_slot_bytes(const attnd_model *m);
/* ALiBi's standard slopes (Press et al.) for the q heads, into out[num_q_heads]. */
void attnd_model_alibi_slopes(const attnd_model *m, float *out);
/* A layer's K (or V) pool at base as a tensor [num_blocks, block_size, kv_heads, head_size]. */
attnd_tensor attnd_model_cache_tensor(const attnd_model *m, void *base);
/* The options of layer `layer` in pl (scale, fp8 scales, softcap, window; ALiBi slopes at
 * alibi, in backend memory, when the model uses them); pl's tensors are the caller's. */
void attnd_model_layer_opts(const attnd_model *m, uint32_t layer, void *alibi,
                            attnd_plan_layer *pl);

#endif
