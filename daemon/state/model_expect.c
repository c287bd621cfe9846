/* A client's expected geometry (Hello.expect) against the model: the first difference, named as
 * the config names it, so that a daemon configured for another model never serves silently
 * wrong results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

#define EXPECT_REL 1e-6

static int close_enough(double have, double want)
{
    return fabs(have - want) <= EXPECT_REL * fmax(fabs(have), fabs(want)) + 1e-30;
}

static attnd_err differ_u(char *e, size_t n, const char *field, uint32_t have, uint32_t want)
{
    return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                      "geometry.%s: the daemon serves %u, the client expects %u", field, have,
                      want);
}

/* The whole-model fields the client set. */
static attnd_err expect_shape(const attnd_model *m, const attnd_model_expect *x, char *e, size_t n)
{
    const attnd_cfg_geometry *g = &m->geo;
    const struct {
        uint32_t bit;
        const char *name;
        uint32_t have, want;
    } f[] = {{ATTND_EXPECT_NUM_LAYERS, "num_layers", g->num_layers, x->num_layers},
             {ATTND_EXPECT_NUM_Q_HEADS, "num_q_heads", g->num_q_heads, x->num_q_heads},
             {ATTND_EXPECT_NUM_KV_HEADS, "num_kv_heads", g->num_kv_heads, x->num_kv_heads},
             {ATTND_EXPECT_HEAD_SIZE, "head_size", g->head_size, x->head_size},
             {ATTND_EXPECT_BLOCK_SIZE, "block_size", g->block_size, x->block_size}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if ((x->set & f[i].bit) && f[i].have != f[i].want)
            return differ_u(e, n, f[i].name, f[i].have, f[i].want);
    if ((x->set & ATTND_EXPECT_CACHE_DTYPE) && x->cache_dtype != g->cache_dtype)
        return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                          "geometry.cache_dtype: the daemon serves %s, the client expects %s",
                          attnd_dtype_name((attnd_dtype)g->cache_dtype),
                          attnd_dtype_name((attnd_dtype)x->cache_dtype));
    return ATTND_ERR_OK;
}

static attnd_err differ_f(char *e, size_t n, uint32_t l, const char *field, double have,
                          double want)
{
    return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                      "geometry.layers[%u].%s: the daemon serves %.9g, the client expects %.9g", l,
                      field, have, want);
}

/* An array of the model (NULL = none) against the expected one: which index differs. */
static attnd_err expect_array(uint32_t l, const char *field, const float *have, const float *want,
                              uint32_t nwant, uint32_t hq, char *e, size_t n)
{
    if ((have == NULL) != (want == NULL))
        return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                          "geometry.layers[%u].%s: the daemon applies %s, the client expects %s", l,
                          field, have ? "them" : "none", want ? "them" : "none");
    if (want == NULL) return ATTND_ERR_OK;
    if (nwant != hq)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "expect.layers[%u].%s: %u entries, the daemon has %u q heads", l, field,
                          nwant, hq);
    for (uint32_t h = 0; h < hq; h++)
        if (!close_enough(have[h], want[h]))
            return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                              "geometry.layers[%u].%s[%u]: the daemon serves %.9g, the client "
                              "expects %.9g",
                              l, field, h, have[h], want[h]);
    return ATTND_ERR_OK;
}

static attnd_err expect_alibi(const attnd_model *m, uint32_t l, const attnd_expect_layer *x,
                              char *e, size_t n)
{
    const attnd_model_layer *ml = &m->layers[l];
    uint32_t hq = m->geo.num_q_heads;
    float std[1024];
    if ((ml->alibi != ATTND_CFG_ALIBI_OFF) != (x->alibi != 0))
        return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                          "geometry.layers[%u].alibi_slopes: the daemon applies %s, the client "
                          "expects %s",
                          l, ml->alibi ? "ALiBi" : "none", x->alibi ? "ALiBi" : "none");
    if (!x->alibi) return ATTND_ERR_OK;
    if (x->num_alibi_slopes == 0) { /* the standard slopes, whatever the daemon computed */
        attnd_model_alibi_standard(hq, std);
        return expect_array(l, "alibi_slopes", ml->alibi_slopes, std, hq, hq, e, n);
    }
    return expect_array(l, "alibi_slopes", ml->alibi_slopes, x->alibi_slopes, x->num_alibi_slopes,
                        hq, e, n);
}

static attnd_err expect_layer(const attnd_model *m, uint32_t l, const attnd_expect_layer *x,
                              char *e, size_t n)
{
    const attnd_model_layer *ml = &m->layers[l];
    float scale = x->scale > 0 ? x->scale : 1.0f / sqrtf((float)m->geo.head_size);
    attnd_err rv;
    if ((uint32_t)ml->sliding_window != x->sliding_window)
        return attnd_errf(e, n, ATTND_ERR_FAILED_PRECONDITION,
                          "geometry.layers[%u].sliding_window: the daemon serves %d, the client "
                          "expects %u",
                          l, ml->sliding_window, x->sliding_window);
    if (!close_enough(ml->softcap, x->softcap))
        return differ_f(e, n, l, "softcap", ml->softcap, x->softcap);
    if (!close_enough(ml->scale, scale)) return differ_f(e, n, l, "scale", ml->scale, scale);
    if (x->k_scale > 0 && !close_enough(ml->k_scale, x->k_scale))
        return differ_f(e, n, l, "k_scale", ml->k_scale, x->k_scale);
    if (x->v_scale > 0 && !close_enough(ml->v_scale, x->v_scale))
        return differ_f(e, n, l, "v_scale", ml->v_scale, x->v_scale);
    if ((rv = expect_alibi(m, l, x, e, n)) != ATTND_ERR_OK) return rv;
    return expect_array(l, "sinks", ml->sinks, x->num_sinks ? x->sinks : NULL, x->num_sinks,
                        m->geo.num_q_heads, e, n);
}

attnd_err attnd_model_expect_check(const attnd_model *m, const attnd_model_expect *x, char *e,
                                   size_t n)
{
    attnd_err rv;
    uint32_t L = m->geo.num_layers, k = x->num_layer_opts;
    if ((rv = expect_shape(m, x, e, n)) != ATTND_ERR_OK) return rv;
    if (k == 0) return ATTND_ERR_OK;
    if (k > L || L % k)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "expect.layers: %u entries do not divide the daemon's %u layers", k, L);
    for (uint32_t l = 0; l < L; l++)
        if ((rv = expect_layer(m, l, &x->layer_opts[l % k], e, n)) != ATTND_ERR_OK) return rv;
    return ATTND_ERR_OK;
}
