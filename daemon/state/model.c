#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 2^(-8i/n) for a power of two n, interleaved from the next power of two otherwise. */
void attnd_model_alibi_standard(uint32_t n, float *out)
{
    uint32_t p = 1;
    while (p * 2 <= n)
        p *= 2;
    for (uint32_t i = 0; i < p; i++)
        out[i] = powf(2.0f, -8.0f * (float)(i + 1) / (float)p);
    for (uint32_t i = 0; i < n - p; i++)
        out[p + i] = powf(2.0f, -8.0f * (float)(2 * i + 1) / (float)(2 * p));
}

/* Layer l of the config into m->layers[l], its slopes and sinks copied into m->values. */
static void model_layer(attnd_model *m, const attnd_cfg_geometry *g, uint32_t l)
{
    attnd_cfg_layer c;
    uint32_t hq = g->num_q_heads;
    float *slopes = m->values + (size_t)l * 2 * hq, *sinks = slopes + hq;
    attnd_model_layer *ml = &m->layers[l];
    attnd_config_layer(g, l, &c);
    ml->scale = c.scale;
    ml->softcap = c.softcap;
    ml->k_scale = c.k_scale;
    ml->v_scale = c.v_scale;
    ml->sliding_window = (int32_t)c.sliding_window;
    ml->alibi = c.alibi;
    if (c.alibi == ATTND_CFG_ALIBI_STANDARD) attnd_model_alibi_standard(hq, slopes);
    if (c.alibi == ATTND_CFG_ALIBI_GIVEN) memcpy(slopes, c.alibi_slopes, hq * sizeof *slopes);
    ml->alibi_slopes = c.alibi != ATTND_CFG_ALIBI_OFF ? slopes : NULL;
    if (c.sinks != NULL) {
        memcpy(sinks, c.sinks, hq * sizeof *sinks);
        ml->sinks = sinks;
        m->needs |= ATTND_FEATURE_SINKS;
    }
    if (ml->alibi_slopes != NULL || ml->sinks != NULL) m->per_layer = 1;
}

attnd_err attnd_model_init(attnd_model *m, const attnd_config *cfg, char *err, size_t n)
{
    const attnd_cfg_geometry *g = &cfg->geometry;
    memset(m, 0, sizeof *m);
    m->geo = *g;
    m->geo.layers = NULL;
    m->pattern = g->layers ? g->layers->count : 0;
    m->lin = cfg->linear;
    m->scale = attnd_config_scale(cfg);
    m->layers = calloc(g->num_layers, sizeof *m->layers);
    m->values = calloc((size_t)g->num_layers * 2 * g->num_q_heads, sizeof *m->values);
    if (m->layers == NULL || m->values == NULL) {
        attnd_model_fini(m);
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "geometry.layers: out of memory");
    }
    if (g->cache_dtype == ATTND_DTYPE_F32) m->needs |= ATTND_FEATURE_F32_CACHE;
    for (uint32_t l = 0; l < g->num_layers; l++)
        model_layer(m, g, l);
    m->window_all = attnd_config_window_all(g);
    return ATTND_ERR_OK;
}

void attnd_model_fini(attnd_model *m)
{
    free(m->layers);
    free(m->values);
    m->layers = NULL;
    m->values = NULL;
}

attnd_err attnd_model_check_backend(const attnd_model *m, const attnd_backend *be, char *err,
                                    size_t n)
{
    const char *name = attnd_backend_name(be);
    if ((m->needs & ATTND_FEATURE_F32_CACHE) && !attnd_backend_has(be, ATTND_FEATURE_F32_CACHE))
        return attnd_errf(err, n, ATTND_ERR_UNSUPPORTED,
                          "geometry.cache_dtype: f32 is not implemented by backend %s", name);
    for (uint32_t l = 0; l < m->geo.num_layers; l++)
        if (m->layers[l].sinks != NULL && !attnd_backend_has(be, ATTND_FEATURE_SINKS))
            return attnd_errf(err, n, ATTND_ERR_UNSUPPORTED,
                              "geometry.layers[%u].sinks: not implemented by backend %s",
                              m->pattern ? l % m->pattern : l, name);
    return ATTND_ERR_OK;
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

attnd_tensor attnd_model_cache_tensor(const attnd_model *m, void *base)
{
    attnd_tensor t;
    int64_t shape[4] = {m->geo.num_blocks, m->geo.block_size, m->geo.num_kv_heads,
                        m->geo.head_size};
    attnd_tensor_init(&t, base, (attnd_dtype)m->geo.cache_dtype, 4, shape);
    return t;
}

void attnd_model_layer_opts(const attnd_model *m, uint32_t layer, const float *values,
                            attnd_plan_layer *pl)
{
    const attnd_model_layer *ml = &m->layers[layer];
    int64_t hq[1] = {m->geo.num_q_heads};
    size_t at = (size_t)layer * 2 * m->geo.num_q_heads;
    memset(&pl->alibi_slopes, 0, sizeof pl->alibi_slopes);
    memset(&pl->sinks, 0, sizeof pl->sinks);
    if (ml->alibi_slopes != NULL)
        attnd_tensor_init(&pl->alibi_slopes, (void *)(values + at), ATTND_DTYPE_F32, 1, hq);
    if (ml->sinks != NULL)
        attnd_tensor_init(&pl->sinks, (void *)(values + at + hq[0]), ATTND_DTYPE_F32, 1, hq);
    pl->scale = ml->scale;
    pl->k_scale = ml->k_scale;
    pl->v_scale = ml->v_scale;
    pl->softcap = ml->softcap;
    pl->sliding_window = ml->sliding_window;
}
