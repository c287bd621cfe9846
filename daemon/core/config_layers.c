/* geometry.layers: per-layer overrides of the attention keys, parsed, validated against the rest
 * of the geometry (messages name "geometry.layers[3].softcap"), resolved per layer and compared
 * (a reload that changes them needs a restart). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define LAYERS_MAX 1024 /* entries, and numbers in one array: geometry.num_layers / num_q_heads */
#define I31 2147483647.0

#define LKEY(nm, ty, f, lo, hi, d)                                                                 \
    {                                                                                              \
        .name = nm, .type = ty, .offset = offsetof(attnd_cfg_layer, f), .min = lo, .max = hi,      \
        .doc = d                                                                                   \
    }

/* Every layer key needs a restart, like the global geometry keys; layer_bits: each key's bit. */
static const attnd_cfg_key layer_keys[] = {
    LKEY("sliding_window", ATTND_CFG_U32, sliding_window, 0, I31, "0 = off"),
    LKEY("softcap", ATTND_CFG_F32, softcap, 0, 1e6, "logit softcap, 0 = off"),
    LKEY("scale", ATTND_CFG_F32, scale, 0, 1000, "softmax scale, 0 = 1/sqrt(head)"),
    LKEY("alibi_slopes", ATTND_CFG_ALIBI, alibi_slopes, 0, 0,
         "true: the standard slopes, false: none, or one slope per q head"),
    LKEY("sinks", ATTND_CFG_FLOATS, sinks, 0, 0, "one sink logit per q head"),
    LKEY("k_scale", ATTND_CFG_F32, k_scale, 1e-30, 1e30, "fp8 key scale"),
    LKEY("v_scale", ATTND_CFG_F32, v_scale, 1e-30, 1e30, "fp8 value scale"),
};
static const uint32_t layer_bits[] = {
    ATTND_CFG_LAYER_WINDOW, ATTND_CFG_LAYER_SOFTCAP, ATTND_CFG_LAYER_SCALE,  ATTND_CFG_LAYER_ALIBI,
    ATTND_CFG_LAYER_SINKS,  ATTND_CFG_LAYER_K_SCALE, ATTND_CFG_LAYER_V_SCALE};
#define NLAYER_KEYS (sizeof layer_keys / sizeof layer_keys[0])

const attnd_cfg_key *attnd_config_layer_keys(size_t *count)
{
    *count = NLAYER_KEYS;
    return layer_keys;
}

/* ---------------------------------------------------------------- lifetime */

static void layers_free(attnd_cfg_layers *ls)
{
    if (ls == NULL) return;
    for (uint32_t i = 0; i < ls->count; i++) {
        free(ls->entries[i].alibi_slopes);
        free(ls->entries[i].sinks);
    }
    free(ls->entries);
    free(ls);
}

void attnd_config_fini(attnd_config *c)
{
    layers_free(c->geometry.layers);
    c->geometry.layers = NULL;
}

/* ---------------------------------------------------------------- parsing */

/* An array of at most LAYERS_MAX finite numbers into a fresh float array. */
static attnd_err parse_floats(const json_t *v, const char *name, float **out, uint32_t *count,
                              char *e, size_t n)
{
    size_t len = json_array_size(v), i;
    json_t *x;
    if (!json_is_array(v))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected an array of numbers",
                          name);
    if (len == 0 || len > LAYERS_MAX)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %zu entries (1..%d)", name, len,
                          LAYERS_MAX);
    if ((*out = malloc(len * sizeof **out)) == NULL)
        return attnd_errf(e, n, ATTND_ERR_NO_MEMORY, "%s: out of memory", name);
    *count = (uint32_t)len;
    json_array_foreach(v, i, x)
    {
        double d = json_is_number(x) ? json_number_value(x) : NAN;
        if (!isfinite(d) || fabs(d) > 3.4e38)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s[%zu]: not a finite number",
                              name, i);
        (*out)[i] = (float)d;
    }
    return ATTND_ERR_OK;
}

/* One key of an entry into it. */
static attnd_err parse_key(attnd_cfg_layer *l, const attnd_cfg_key *k, const json_t *v,
                           const char *name, char *e, size_t n)
{
    double d;
    attnd_err rv;
    if (k->type == ATTND_CFG_FLOATS) return parse_floats(v, name, &l->sinks, &l->num_sinks, e, n);
    if (k->type == ATTND_CFG_ALIBI) {
        if (json_is_boolean(v)) {
            l->alibi = json_is_true(v) ? ATTND_CFG_ALIBI_STANDARD : ATTND_CFG_ALIBI_OFF;
            return ATTND_ERR_OK;
        }
        l->alibi = ATTND_CFG_ALIBI_GIVEN;
        return parse_floats(v, name, &l->alibi_slopes, &l->num_alibi_slopes, e, n);
    }
    if ((rv = attnd_config_number(k, name, v, &d, e, n)) != ATTND_ERR_OK) return rv;
    if (k->type == ATTND_CFG_U32)
        *(uint32_t *)((char *)l + k->offset) = (uint32_t)d;
    else
        *(float *)((char *)l + k->offset) = (float)d;
    return ATTND_ERR_OK;
}

static attnd_err parse_entry(attnd_cfg_layer *l, const json_t *obj, size_t idx, char *e, size_t n)
{
    const char *key;
    json_t *v;
    char name[96];
    if (!json_is_object(obj))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.layers[%zu]: expected an object", idx);
    json_object_foreach((json_t *)obj, key, v)
    {
        size_t k = 0;
        while (k < NLAYER_KEYS && strcmp(layer_keys[k].name, key) != 0)
            k++;
        snprintf(name, sizeof name, "geometry.layers[%zu].%.40s", idx, key);
        if (k == NLAYER_KEYS)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "unknown key: %s", name);
        attnd_err rv = parse_key(l, &layer_keys[k], v, name, e, n);
        if (rv != ATTND_ERR_OK) return rv;
        l->set |= layer_bits[k];
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_config_layers_parse(attnd_config *c, const json_t *v, char *e, size_t n)
{
    size_t len = json_array_size(v), i;
    json_t *x;
    attnd_err rv = ATTND_ERR_OK;
    if (!json_is_array(v))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.layers: expected an array of objects");
    if (len > LAYERS_MAX)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.layers: %zu entries, more than %d", len, LAYERS_MAX);
    if (len == 0) return ATTND_ERR_OK; /* [] = no overrides */
    attnd_cfg_layers *ls = calloc(1, sizeof *ls);
    if (ls == NULL || (ls->entries = calloc(len, sizeof *ls->entries)) == NULL) {
        free(ls);
        return attnd_errf(e, n, ATTND_ERR_NO_MEMORY, "geometry.layers: out of memory");
    }
    ls->count = (uint32_t)len;
    c->geometry.layers = ls; /* owned by c from here: freed with it on any failure */
    json_array_foreach(v, i, x)
    {
        if ((rv = parse_entry(&ls->entries[i], x, i, e, n)) != ATTND_ERR_OK) break;
    }
    return rv;
}

/* ---------------------------------------------------------------- checks */

attnd_err attnd_config_layers_check(const attnd_cfg_geometry *g, char *e, size_t n)
{
    const attnd_cfg_layers *ls = g->layers;
    if (ls == NULL) return ATTND_ERR_OK;
    if (ls->count > g->num_layers || g->num_layers % ls->count)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.layers: %u entries do not divide geometry.num_layers (%u): "
                          "give one per layer, or a pattern that repeats",
                          ls->count, g->num_layers);
    for (uint32_t i = 0; i < ls->count; i++) {
        const attnd_cfg_layer *l = &ls->entries[i];
        if (l->alibi == ATTND_CFG_ALIBI_GIVEN && l->num_alibi_slopes != g->num_q_heads)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                              "geometry.layers[%u].alibi_slopes: %u entries, geometry.num_q_heads "
                              "is %u",
                              i, l->num_alibi_slopes, g->num_q_heads);
        if (l->sinks != NULL && l->num_sinks != g->num_q_heads)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                              "geometry.layers[%u].sinks: %u entries, geometry.num_q_heads is %u",
                              i, l->num_sinks, g->num_q_heads);
    }
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- per layer */

void attnd_config_layer(const attnd_cfg_geometry *g, uint32_t layer, attnd_cfg_layer *out)
{
    memset(out, 0, sizeof *out);
    out->sliding_window = g->sliding_window;
    out->softcap = g->softcap;
    out->scale = g->scale;
    out->k_scale = g->k_scale;
    out->v_scale = g->v_scale;
    out->alibi = g->alibi ? ATTND_CFG_ALIBI_STANDARD : ATTND_CFG_ALIBI_OFF;
    if (g->layers != NULL) {
        const attnd_cfg_layer *l = &g->layers->entries[layer % g->layers->count];
        if (l->set & ATTND_CFG_LAYER_WINDOW) out->sliding_window = l->sliding_window;
        if (l->set & ATTND_CFG_LAYER_SOFTCAP) out->softcap = l->softcap;
        if (l->set & ATTND_CFG_LAYER_SCALE) out->scale = l->scale;
        if (l->set & ATTND_CFG_LAYER_K_SCALE) out->k_scale = l->k_scale;
        if (l->set & ATTND_CFG_LAYER_V_SCALE) out->v_scale = l->v_scale;
        if (l->set & ATTND_CFG_LAYER_ALIBI) {
            out->alibi = l->alibi;
            out->alibi_slopes = l->alibi_slopes;
            out->num_alibi_slopes = l->num_alibi_slopes;
        }
        out->sinks = l->sinks;
        out->num_sinks = l->num_sinks;
    }
    if (out->scale <= 0) out->scale = 1.0f / sqrtf((float)g->head_size);
    out->set = ATTND_CFG_LAYER_WINDOW | ATTND_CFG_LAYER_SOFTCAP | ATTND_CFG_LAYER_SCALE |
               ATTND_CFG_LAYER_ALIBI | ATTND_CFG_LAYER_SINKS | ATTND_CFG_LAYER_K_SCALE |
               ATTND_CFG_LAYER_V_SCALE;
}

static int floats_equal(const float *a, uint32_t na, const float *b, uint32_t nb)
{
    if (na != nb || (a == NULL) != (b == NULL)) return 0;
    return na == 0 || memcmp(a, b, na * sizeof *a) == 0;
}

static int entry_equal(const attnd_cfg_layer *a, const attnd_cfg_layer *b)
{
    return a->set == b->set && a->sliding_window == b->sliding_window && a->softcap == b->softcap &&
           a->scale == b->scale && a->k_scale == b->k_scale && a->v_scale == b->v_scale &&
           a->alibi == b->alibi &&
           floats_equal(a->alibi_slopes, a->num_alibi_slopes, b->alibi_slopes,
                        b->num_alibi_slopes) &&
           floats_equal(a->sinks, a->num_sinks, b->sinks, b->num_sinks);
}

int attnd_config_layers_equal(const attnd_cfg_layers *a, const attnd_cfg_layers *b)
{
    if (a == NULL || b == NULL) return a == b;
    if (a->count != b->count) return 0;
    for (uint32_t i = 0; i < a->count; i++)
        if (!entry_equal(&a->entries[i], &b->entries[i])) return 0;
    return 1;
}

uint32_t attnd_config_window_all(const attnd_cfg_geometry *g)
{
    uint32_t w = 0;
    attnd_cfg_layer l;
    for (uint32_t i = 0; i < g->num_layers; i++) {
        attnd_config_layer(g, i, &l);
        if (l.sliding_window == 0) return 0;
        if (l.sliding_window > w) w = l.sliding_window;
    }
    return w;
}

/* ---------------------------------------------------------------- JSON */

/* snprintf appending at *k of buf[cap], *k counting what the whole text needs. */
static void put(char *buf, size_t cap, size_t *k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(*k < cap ? buf + *k : NULL, *k < cap ? cap - *k : 0, fmt, ap);
    va_end(ap);
    if (w > 0) *k += (size_t)w;
}

static void put_floats(char *buf, size_t cap, size_t *k, const char *key, const float *x,
                       uint32_t n)
{
    put(buf, cap, k, ",\"%s\":[", key);
    for (uint32_t i = 0; i < n; i++)
        put(buf, cap, k, "%s%.9g", i ? "," : "", (double)x[i]);
    put(buf, cap, k, "]");
}

size_t attnd_config_layers_json(const attnd_cfg_geometry *g, char *buf, size_t cap)
{
    size_t k = 0;
    attnd_cfg_layer l;
    if (cap) buf[0] = '\0';
    put(buf, cap, &k, "[");
    for (uint32_t i = 0; i < g->num_layers; i++) {
        attnd_config_layer(g, i, &l);
        put(buf, cap, &k, "%s{\"sliding_window\":%u,\"softcap\":%.9g,\"scale\":%.9g", i ? "," : "",
            l.sliding_window, (double)l.softcap, (double)l.scale);
        if (l.alibi == ATTND_CFG_ALIBI_GIVEN)
            put_floats(buf, cap, &k, "alibi_slopes", l.alibi_slopes, l.num_alibi_slopes);
        else
            put(buf, cap, &k, ",\"alibi_slopes\":%s",
                l.alibi == ATTND_CFG_ALIBI_STANDARD ? "true" : "false");
        if (l.sinks) put_floats(buf, cap, &k, "sinks", l.sinks, l.num_sinks);
        put(buf, cap, &k, ",\"k_scale\":%.9g,\"v_scale\":%.9g}", (double)l.k_scale,
            (double)l.v_scale);
    }
    put(buf, cap, &k, "]");
    return k;
}
