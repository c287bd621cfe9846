/* The session: Hello (and what it returns), Status, connect (dial, Hello, then the channel on
 * ipc://). */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

void attnd_client_layers_free(attnd_client_layers *l)
{
    free(l->opts);
    free(l->values);
    l->opts = NULL;
    l->values = NULL;
}

static size_t floats_in(const Attnd__Geometry *pb)
{
    size_t n = 0;
    for (size_t i = 0; i < pb->n_layers; i++)
        n += pb->layers[i]->n_alibi_slopes + pb->layers[i]->n_sinks;
    return n;
}

/* The reply's layers into l (replacing what it held), g->layers pointing at them. PROTOCOL when
 * the reply lists another number of layers than num_layers. */
static attnd_err layers_from_pb(attnd_client *c, attnd_geometry *g, const Attnd__Geometry *pb,
                                attnd_client_layers *l)
{
    attnd_client_layers_free(l);
    if (pb->n_layers == 0) return ATTND_ERR_OK; /* a daemon older than per-layer options */
    if (pb->n_layers != pb->num_layers)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "geometry: %zu layers listed for %u",
                                 pb->n_layers, pb->num_layers);
    l->opts = calloc(pb->n_layers, sizeof *l->opts);
    l->values = malloc((floats_in(pb) + 1) * sizeof *l->values);
    if (l->opts == NULL || l->values == NULL) {
        attnd_client_layers_free(l);
        return attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "geometry: out of memory");
    }
    float *v = l->values;
    for (size_t i = 0; i < pb->n_layers; i++) {
        const Attnd__LayerOptions *o = pb->layers[i];
        attnd_layer_opts *d = &l->opts[i];
        *d = (attnd_layer_opts){o->sliding_window,
                                o->softcap,
                                o->scale,
                                o->k_scale,
                                o->v_scale,
                                o->alibi,
                                (uint32_t)o->n_alibi_slopes,
                                v,
                                (uint32_t)o->n_sinks,
                                v + o->n_alibi_slopes};
        if (o->n_alibi_slopes) memcpy(v, o->alibi_slopes, o->n_alibi_slopes * sizeof *v);
        if (o->n_sinks) memcpy(v + o->n_alibi_slopes, o->sinks, o->n_sinks * sizeof *v);
        if (o->n_sinks == 0) d->sinks = NULL;
        if (o->n_alibi_slopes == 0) d->alibi_slopes = NULL;
        v += o->n_alibi_slopes + o->n_sinks;
    }
    g->layers = l->opts;
    return ATTND_ERR_OK;
}

static attnd_err geometry_from_pb(attnd_client *c, attnd_geometry *g, const Attnd__Geometry *pb,
                                  attnd_client_layers *l)
{
    memset(g, 0, sizeof *g);
    if (pb == NULL) return ATTND_ERR_OK;
    g->num_layers = pb->num_layers;
    g->num_q_heads = pb->num_q_heads;
    g->num_kv_heads = pb->num_kv_heads;
    g->head_size = pb->head_size;
    g->block_size = pb->block_size;
    g->cache_dtype = (attnd_dtype)pb->cache_dtype;
    g->num_blocks = pb->num_blocks;
    g->max_blocks_per_seq = pb->max_blocks_per_seq;
    g->scale = pb->scale;
    g->linear_slots = pb->linear_slots;
    g->linear_heads = pb->linear_heads;
    g->linear_head_dim = pb->linear_head_dim;
    g->window_release = pb->window_release;
    return layers_from_pb(c, g, pb, l);
}

/* ---------------------------------------------------------------- the expected geometry */

void attnd_client_expect_free(attnd_client *c)
{
    free(c->expect_layers);
    free(c->expect_values);
    c->expect_layers = NULL;
    c->expect_values = NULL;
    c->have_expect = 0;
}

attnd_err attnd_client_set_expect(attnd_client *c, const attnd_expect *e)
{
    size_t nv = 0;
    attnd_client_expect_free(c);
    if (e == NULL) return ATTND_ERR_OK;
    for (uint32_t i = 0; i < e->num_layer_opts; i++) {
        const attnd_layer_opts *o = &e->layer_opts[i];
        if ((o->num_alibi_slopes && !o->alibi_slopes) || (o->num_sinks && !o->sinks))
            return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT,
                                     "expect: layer_opts[%u]: an array count without its values",
                                     i);
        nv += o->num_alibi_slopes + o->num_sinks;
    }
    c->expect_layers = calloc(e->num_layer_opts + 1, sizeof *c->expect_layers);
    c->expect_values = malloc((nv + 1) * sizeof *c->expect_values);
    if (c->expect_layers == NULL || c->expect_values == NULL) {
        attnd_client_expect_free(c);
        return attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "expect: out of memory");
    }
    float *v = c->expect_values;
    for (uint32_t i = 0; i < e->num_layer_opts; i++) {
        attnd_layer_opts *d = &c->expect_layers[i];
        *d = e->layer_opts[i];
        if (d->num_alibi_slopes) memcpy(v, d->alibi_slopes, d->num_alibi_slopes * sizeof *v);
        d->alibi_slopes = v;
        v += d->num_alibi_slopes;
        if (d->num_sinks) memcpy(v, d->sinks, d->num_sinks * sizeof *v);
        d->sinks = v;
        v += d->num_sinks;
    }
    c->expect = *e;
    c->expect.layer_opts = c->expect_layers;
    c->have_expect = 1;
    return ATTND_ERR_OK;
}

/* Hello.expect from the client's copy; items[num_layer_opts] and ptrs are the caller's. */
static void expect_to_pb(const attnd_client *c, Attnd__ExpectGeometry *x,
                         Attnd__LayerOptions *items, Attnd__LayerOptions **ptrs)
{
    const attnd_expect *e = &c->expect;
    attnd__expect_geometry__init(x);
    x->num_layers = e->num_layers;
    x->num_q_heads = e->num_q_heads;
    x->num_kv_heads = e->num_kv_heads;
    x->head_size = e->head_size;
    x->block_size = e->block_size;
    x->compare_cache_dtype = e->compare_cache_dtype != 0;
    x->cache_dtype = (Attnd__DType)e->cache_dtype;
    for (uint32_t i = 0; i < e->num_layer_opts; i++) {
        const attnd_layer_opts *o = &e->layer_opts[i];
        attnd__layer_options__init(&items[i]);
        items[i].sliding_window = o->sliding_window;
        items[i].softcap = o->softcap;
        items[i].scale = o->scale;
        items[i].k_scale = o->k_scale;
        items[i].v_scale = o->v_scale;
        items[i].alibi = o->alibi != 0;
        items[i].n_alibi_slopes = o->num_alibi_slopes;
        items[i].alibi_slopes = (float *)o->alibi_slopes;
        items[i].n_sinks = o->num_sinks;
        items[i].sinks = (float *)o->sinks;
        ptrs[i] = &items[i];
    }
    x->n_layers = e->num_layer_opts;
    x->layers = ptrs;
}

static void limits_from_pb(attnd_limits *l, const Attnd__Limits *pb)
{
    memset(l, 0, sizeof *l);
    if (pb == NULL) return;
    l->max_seqs = pb->max_seqs;
    l->max_step_tokens = pb->max_step_tokens;
    l->max_regions = pb->max_regions;
    l->max_inline_bytes = pb->max_inline_bytes;
    l->request_timeout_ms = pb->request_timeout_ms;
}

/* The Hello round trip, with the expectation when one is set. */
static attnd_err hello_call(attnd_client *c, Attnd__Reply **rep)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello hello = ATTND__HELLO__INIT;
    Attnd__ExpectGeometry x;
    uint32_t n = c->have_expect ? c->expect.num_layer_opts : 0;
    Attnd__LayerOptions *items = calloc(n + 1, sizeof *items);
    Attnd__LayerOptions **ptrs = calloc(n + 1, sizeof *ptrs);
    attnd_err rv;
    if (items == NULL || ptrs == NULL) {
        rv = attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "hello: out of memory");
        goto out;
    }
    hello.protocol_version = ATTND_CLIENT_PROTOCOL_VERSION;
    hello.client_name = c->name;
    hello.token = c->token;
    if (c->have_expect) {
        expect_to_pb(c, &x, items, ptrs);
        hello.expect = &x;
    }
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &hello;
    rv = attnd_client_rpc(c, &req, rep);
out:
    free(items);
    free(ptrs);
    return rv;
}

attnd_err attnd_client_hello(attnd_client *c, attnd_server_info *info)
{
    Attnd__Reply *rep;
    const Attnd__HelloReply *h;
    attnd_server_info si;
    attnd_err rv;
    if ((rv = hello_call(c, &rep)) != ATTND_ERR_OK) return rv;
    if (rep->body_case != ATTND__REPLY__BODY_HELLO || rep->hello->session == 0) {
        attnd__reply__free_unpacked(rep, NULL);
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "hello: reply without a session");
    }
    h = rep->hello;
    memset(&si, 0, sizeof si);
    si.protocol_version = h->protocol_version;
    si.session = h->session;
    attnd_client_copy_str(si.version, sizeof si.version, h->version);
    attnd_client_copy_str(si.backend, sizeof si.backend, h->backend);
    rv = geometry_from_pb(c, &si.geometry, h->geometry, &c->hello_layers);
    limits_from_pb(&si.limits, h->limits);
    si.blocks_free = h->blocks_free;
    attnd__reply__free_unpacked(rep, NULL);
    if (rv != ATTND_ERR_OK) return rv;
    c->server = si;
    c->session = si.session;
    c->have_server = 1;
    if (info != NULL) *info = si;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_connect(attnd_client *c, const char *url, attnd_server_info *info)
{
    attnd_err rv;
    if ((rv = attnd_client_dial(c, url)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_client_hello(c, info)) != ATTND_ERR_OK) return rv;
    if (strncmp(c->url, "ipc://", 6) == 0 && c->channel_slots >= 0) attnd_client_channel_connect(c);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_status(attnd_client *c, attnd_status *st)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    Attnd__Reply *rep;
    const Attnd__StatusReply *s;
    attnd_err rv;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    if (rep->body_case != ATTND__REPLY__BODY_STATUS) {
        attnd__reply__free_unpacked(rep, NULL);
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "status: reply without a status");
    }
    s = rep->status;
    memset(st, 0, sizeof *st);
    attnd_client_copy_str(st->version, sizeof st->version, s->version);
    attnd_client_copy_str(st->backend, sizeof st->backend, s->backend);
    rv = geometry_from_pb(c, &st->geometry, s->geometry, &c->status_layers);
    st->blocks_free = s->blocks_free;
    st->num_sequences = s->num_sequences;
    st->num_sessions = s->num_sessions;
    st->requests = s->requests;
    st->errors = s->errors;
    st->uptime_s = s->uptime_s;
    st->mps = s->mps == ATTND__MPS_STATE__MPS_ON ? 1 : s->mps == ATTND__MPS_STATE__MPS_OFF ? 0 : -1;
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}
