/* Session requests: Hello (opens a session), Status, RegisterRegion, UnregisterRegion. */
#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"
#include "handler.h"
#include "reply.h"
#include "serve.h"

#ifndef ATTND_VERSION_STRING
#define ATTND_VERSION_STRING "0.0.0"
#endif

/* Every layer's options, resolved, pointing into the model (which outlives every reply). */
static attnd_err fill_layers(const attnd_model *m, attnd_reply *r, Attnd__Geometry *g)
{
    uint32_t L = m->geo.num_layers, hq = m->geo.num_q_heads;
    r->layer_items = calloc(L, sizeof *r->layer_items);
    r->layer_ptrs = calloc(L, sizeof *r->layer_ptrs);
    if (r->layer_items == NULL || r->layer_ptrs == NULL)
        return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "geometry: out of memory");
    for (uint32_t l = 0; l < L; l++) {
        const attnd_model_layer *ml = &m->layers[l];
        Attnd__LayerOptions *o = &r->layer_items[l];
        attnd__layer_options__init(o);
        o->sliding_window = (uint32_t)ml->sliding_window;
        o->softcap = ml->softcap;
        o->scale = ml->scale;
        o->k_scale = ml->k_scale;
        o->v_scale = ml->v_scale;
        o->alibi = ml->alibi != ATTND_CFG_ALIBI_OFF;
        o->n_alibi_slopes = o->alibi ? hq : 0;
        o->alibi_slopes = (float *)ml->alibi_slopes;
        o->n_sinks = ml->sinks ? hq : 0;
        o->sinks = (float *)ml->sinks;
        r->layer_ptrs[l] = o;
    }
    g->n_layers = L;
    g->layers = r->layer_ptrs;
    return ATTND_ERR_OK;
}

static attnd_err fill_geometry(const attnd_serve *sv, attnd_reply *r)
{
    const attnd_model *m = &sv->model;
    Attnd__Geometry *g = &r->geometry;
    attnd__geometry__init(g);
    g->num_layers = m->geo.num_layers;
    g->num_q_heads = m->geo.num_q_heads;
    g->num_kv_heads = m->geo.num_kv_heads;
    g->head_size = m->geo.head_size;
    g->block_size = m->geo.block_size;
    g->cache_dtype = (Attnd__DType)m->geo.cache_dtype;
    g->num_blocks = m->geo.num_blocks;
    g->max_blocks_per_seq = m->geo.max_blocks_per_seq;
    g->scale = m->scale;
    g->linear_slots = m->lin.slots;
    g->linear_heads = m->lin.heads;
    g->linear_head_dim = m->lin.head_dim;
    g->window_release = m->window_all;
    return fill_layers(m, r, g);
}

/* Hello.expect against the model: FAILED_PRECONDITION naming the first difference. */
static attnd_err check_expect(const attnd_serve *sv, const Attnd__ExpectGeometry *x, attnd_reply *r)
{
    attnd_model_expect e = {.num_layers = x->num_layers,
                            .num_q_heads = x->num_q_heads,
                            .num_kv_heads = x->num_kv_heads,
                            .head_size = x->head_size,
                            .block_size = x->block_size,
                            .cache_dtype = (int)x->cache_dtype,
                            .num_layer_opts = (uint32_t)x->n_layers};
    e.set = (x->num_layers ? ATTND_EXPECT_NUM_LAYERS : 0) |
            (x->num_q_heads ? ATTND_EXPECT_NUM_Q_HEADS : 0) |
            (x->num_kv_heads ? ATTND_EXPECT_NUM_KV_HEADS : 0) |
            (x->head_size ? ATTND_EXPECT_HEAD_SIZE : 0) |
            (x->block_size ? ATTND_EXPECT_BLOCK_SIZE : 0) |
            (x->compare_cache_dtype ? ATTND_EXPECT_CACHE_DTYPE : 0);
    attnd_expect_layer *ls = calloc(x->n_layers ? x->n_layers : 1, sizeof *ls);
    if (ls == NULL) return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "expect: out of memory");
    for (size_t i = 0; i < x->n_layers; i++) {
        const Attnd__LayerOptions *o = x->layers[i];
        ls[i] = (attnd_expect_layer){o->sliding_window,
                                     o->softcap,
                                     o->scale,
                                     o->k_scale,
                                     o->v_scale,
                                     o->alibi,
                                     (uint32_t)o->n_alibi_slopes,
                                     (uint32_t)o->n_sinks,
                                     o->alibi_slopes,
                                     o->sinks};
    }
    e.layer_opts = ls;
    attnd_err rv = attnd_model_expect_check(&sv->model, &e, r->msg, sizeof r->msg);
    free(ls);
    return attnd_reply_code(r, rv);
}

/* Compare without an early exit so the time taken says nothing about the token. */
static int token_equal(const char *want, const char *got)
{
    size_t lw = strlen(want), lg = strlen(got);
    unsigned diff = (unsigned)(lw != lg);
    for (size_t i = 0; i < lw; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? got[i] : 0);
    return diff == 0;
}

static attnd_err reply_hello(attnd_serve *sv, const attnd_session *s, attnd_reply *r)
{
    Attnd__HelloReply *h = &r->hello;
    attnd__hello_reply__init(h);
    attnd_err rv = fill_geometry(sv, r);
    if (rv != ATTND_ERR_OK) return rv;
    attnd__limits__init(&r->limits);
    r->limits.max_seqs = sv->limits.max_seqs;
    r->limits.max_step_tokens = sv->limits.max_step_tokens;
    r->limits.max_regions = sv->limits.max_regions;
    r->limits.max_inline_bytes = sv->limits.max_inline_bytes;
    r->limits.request_timeout_ms = sv->limits.request_timeout_ms;
    h->protocol_version = ATTND_PROTOCOL_VERSION;
    h->session = s->id;
    h->version = (char *)ATTND_VERSION_STRING;
    h->backend = (char *)attnd_backend_name(sv->be);
    h->geometry = &r->geometry;
    h->limits = &r->limits;
    h->blocks_free = attnd_cache_blocks_free(sv->cache);
    r->reply.body_case = ATTND__REPLY__BODY_HELLO;
    r->reply.hello = h;
    return ATTND_ERR_OK;
}

static attnd_err req_hello(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__Hello *m = c->req->hello;
    attnd_session *s;
    attnd_err rv;
    if (c->pipe == 0)
        return attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE, "connection: closed before Hello ran");
    if (m->protocol_version != ATTND_PROTOCOL_VERSION)
        return attnd_reply_fail(r, ATTND_ERR_UNSUPPORTED,
                                "protocol_version: %u not supported (this daemon speaks %d)",
                                m->protocol_version, ATTND_PROTOCOL_VERSION);
    if (sv->token[0] && !token_equal(sv->token, m->token ? m->token : ""))
        return attnd_reply_fail(r, ATTND_ERR_PERMISSION_DENIED, "token: %s",
                                m->token && m->token[0] ? "invalid" : "required");
    if (m->expect && (rv = check_expect(sv, m->expect, r)) != ATTND_ERR_OK) return rv;
    if ((rv =
             attnd_session_open(&sv->sessions, c->pipe, m->client_name, sv->limits.max_sessions,
                                sv->limits.max_sessions_per_connection, &s, r->msg, sizeof r->msg)))
        return attnd_reply_code(r, rv);
    ATTND_LOG(sv->log, ATTND_LOG_INFO, "event=hello session=%llu pipe=%u client=\"%s\"",
              (unsigned long long)s->id, c->pipe, s->name);
    return reply_hello(sv, s, r);
}

static attnd_err req_status(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    Attnd__StatusReply *st = &r->status;
    attnd_session *s;
    /* with a token, what Status tells is for clients that gave it: the session of such a Hello
     * on this very connection */
    if (sv->token[0] &&
        attnd_session_get(&sv->sessions, c->req->session, c->pipe, &s, r->msg, sizeof r->msg))
        return attnd_reply_fail(r, ATTND_ERR_PERMISSION_DENIED,
                                "token: server.token is set; Status needs the session of a Hello "
                                "that gave it, on this connection (session %llu)",
                                (unsigned long long)c->req->session);
    attnd__status_reply__init(st);
    attnd_err rv = fill_geometry(sv, r);
    if (rv != ATTND_ERR_OK) return rv;
    st->version = (char *)ATTND_VERSION_STRING;
    st->backend = (char *)attnd_backend_name(sv->be);
    st->geometry = &r->geometry;
    st->blocks_free = attnd_cache_blocks_free(sv->cache);
    st->num_sequences = attnd_cache_num_seqs(sv->cache);
    st->num_sessions = sv->sessions.count;
    attnd_serve_counts(sv, &st->requests, &st->errors);
    st->uptime_s = (double)(attnd_clock_ms() - sv->start_ms) / 1000.0;
    st->mps = sv->mps < 0 ? ATTND__MPS_STATE__MPS_UNKNOWN
                          : (sv->mps ? ATTND__MPS_STATE__MPS_ON : ATTND__MPS_STATE__MPS_OFF);
    r->reply.body_case = ATTND__REPLY__BODY_STATUS;
    r->reply.status = st;
    return ATTND_ERR_OK;
}

static attnd_err req_register(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__RegisterRegion *m = c->req->register_region;
    attnd_session *s = c->s;
    attnd_err rv;
    if (m->kind == ATTND__REGION_KIND__CUDA_IPC && !attnd_backend_is_device(sv->be))
        return attnd_reply_fail(r, ATTND_ERR_UNSUPPORTED,
                                "kind: CUDA_IPC needs the cuda backend (this daemon runs %s)",
                                attnd_backend_name(sv->be));
    if (m->kind == ATTND__REGION_KIND__CUDA_IPC) {
        rv = attnd_session_region_add_ipc(s, m->region, sv->be, m->ipc_handle.data,
                                          m->ipc_handle.len, m->size, sv->limits.max_regions,
                                          r->msg, sizeof r->msg);
        if (rv == ATTND_ERR_OK)
            ATTND_LOG(sv->log, ATTND_LOG_DEBUG,
                      "event=region session=%llu region=%u kind=cuda_ipc bytes=%llu",
                      (unsigned long long)s->id, m->region, (unsigned long long)m->size);
    } else if (m->kind == ATTND__REGION_KIND__HOST_SHM) {
        rv = attnd_session_region_add(s, m->region, sv->guard, m->shm_name ? m->shm_name : "",
                                      m->size, sv->limits.max_regions, r->msg, sizeof r->msg);
    } else {
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "kind: %d unknown", (int)m->kind);
    }
    return attnd_reply_code(r, rv);
}

static attnd_err req_unregister(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    uint32_t id = c->req->unregister_region->region;
    if (attnd_streams_holds_region(&sv->streams, c->s->id, id))
        return attnd_reply_fail(r, ATTND_ERR_FAILED_PRECONDITION,
                                "region: %u is in use by a stream channel (end its step, or "
                                "close it, first)",
                                id);
    attnd_inflight_drain(&sv->inflight); /* kernels still reading a CUDA_IPC region finish
                                            before it closes */
    return attnd_reply_code(r, attnd_session_region_remove(c->s, c->req->unregister_region->region,
                                                           r->msg, sizeof r->msg));
}

static const attnd_req_entry session_entries[] = {
    {ATTND__REQUEST__BODY_HELLO, "hello", req_hello, 0},
    {ATTND__REQUEST__BODY_STATUS, "status", req_status, 0},
    {ATTND__REQUEST__BODY_REGISTER_REGION, "register_region", req_register, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_UNREGISTER_REGION, "unregister_region", req_unregister,
     ATTND_REQ_SESSION},
};

const attnd_req_table attnd_req_session = {session_entries,
                                           sizeof session_entries / sizeof session_entries[0]};
