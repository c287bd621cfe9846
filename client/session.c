/* The session: Hello (and what it returns), Status, connect (dial, Hello, then the channel on
 * ipc://). */
#include <string.h>

#include "client_int.h"

static void geometry_from_pb(attnd_geometry *g, const Attnd__Geometry *pb)
{
    memset(g, 0, sizeof *g);
    if (pb == NULL) return;
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

attnd_err attnd_client_hello(attnd_client *c, attnd_server_info *info)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello hello = ATTND__HELLO__INIT;
    Attnd__Reply *rep;
    const Attnd__HelloReply *h;
    attnd_server_info si;
    attnd_err rv;
    hello.protocol_version = ATTND_CLIENT_PROTOCOL_VERSION;
    hello.client_name = c->name;
    hello.token = c->token;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &hello;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
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
    geometry_from_pb(&si.geometry, h->geometry);
    limits_from_pb(&si.limits, h->limits);
    si.blocks_free = h->blocks_free;
    attnd__reply__free_unpacked(rep, NULL);
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
    geometry_from_pb(&st->geometry, s->geometry);
    st->blocks_free = s->blocks_free;
    st->num_sequences = s->num_sequences;
    st->num_sessions = s->num_sessions;
    st->requests = s->requests;
    st->errors = s->errors;
    st->uptime_s = s->uptime_s;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}
