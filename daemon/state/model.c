#include "model.h"

#include <math.h>
#include <string.h>

void attnd_model_init(attnd_model *m, const attnd_config *cfg)
{
    m->geo = cfg->geometry;
    m->lin = cfg->linear;
    m->scale = attnd_config_scale(cfg);
}

size_t attnd_model_block_bytes(const attnd_model *m)
{
    return (size_t)m->geo.block_size * m->geo.num_kv_heads * m->geo.head_size *
           attnd_dtype_size((attnd_dtype)m->geo.cache_dtype);
}

size_t attnd_model_linear_slot_bytes(const attnd_model *m)
{
    return (size_t)m->lin.heads * m->lin.head_dim * m->lin.head_dim * sizeof(float);
}

/* 2^(-8i/n) for a power of two n, interleaved from the next power of two otherwise. */
void attnd_model_alibi_slopes(const attnd_model *m, float *out)
{
    uint32_t n = m->geo.num_q_heads, p = 1;
    while (p * 2 <= n)
        p *= 2;
    for (uint32_t i = 0; i < p; i++)
        out[i] = powf(2.0f, -8.0f * (float)(i + 1) / (float)p);
    for (uint32_t i = 0; i < n - p; i++)
        out[p + i] = powf(2.0f, -8.0f * (float)(2 * i + 1) / (float)(2 * p));
}

attnd_tensor attnd_model_cache_tensor(const attnd_model *m, void *base)
{
    attnd_tensor t;
    int64_t shape[4] = {m->geo.num_blocks, m->geo.block_size, m->geo.num_kv_heads,
                        m->geo.head_size};
    attnd_tensor_init(&t, base, (attnd_dtype)m->geo.cache_dtype, 4, shape);
    return t;
}

void attnd_model_layer_opts(const attnd_model *m, uint32_t layer, void *alibi, attnd_plan_layer *pl)
{
    int64_t hq[1] = {m->geo.num_q_heads};
    (void)layer; /* every layer alike until geometry.layers (per-layer options) lands */
    memset(&pl->alibi_slopes, 0, sizeof pl->alibi_slopes);
    if (alibi) attnd_tensor_init(&pl->alibi_slopes, alibi, ATTND_DTYPE_F32, 1, hq);
    pl->scale = m->scale;
    pl->k_scale = m->geo.k_scale;
    pl->v_scale = m->geo.v_scale;
    pl->softcap = m->geo.softcap;
    pl->sliding_window = (int32_t)m->geo.sliding_window;
}
