/* The call layer: one round trip per call through the transport that carries it (the channel
 * when it takes the request, else the socket), and the session's channel: opened with
 * OpenChannel, woken with WakeChannel, closed with CloseChannel, all on the socket. The
 * transports reach back only through the callbacks given here (reply_decode_cb, the channel's
 * hooks). */
#include <stdatomic.h>
#include <string.h>

#include "client_int.h"

/* A call's budget in ms (< 0: no limit). */
static int32_t call_timeout(attnd_client *c)
{
    int32_t timeout = atomic_load(&c->timeout_ms);
    return timeout == 0 ? ATTND_CLIENT_DEFAULT_TIMEOUT_MS : timeout;
}

static int is_lost(attnd_client *c)
{
    return !attnd_client_socket_transport.active(c->socket);
}

/* What a call's reply became, filled by reply_decode_cb. */
typedef struct reply_sink {
    attnd_client *c;
    const Attnd__Request *req;
    Attnd__Reply *rep;
    attnd_err rv;
} reply_sink;

static void reply_decode_cb(void *arg, const void *buf, size_t len)
{
    reply_sink *sink = arg;
    sink->rv = attnd_client_decode(sink->c, sink->req, buf, len, &sink->rep);
}

/* Offer the call to each transport in turn; 1 when one carried it. */
static int call_carry(attnd_client *c, attnd_client_transport_call *call)
{
    const attnd_client_transport via[] = {
        {&attnd_client_chan_transport, c->chan},
        {&attnd_client_socket_transport, c->socket},
    };
    for (size_t i = 0; i < sizeof via / sizeof via[0]; i++)
        if (via[i].self != NULL && via[i].ops->active(via[i].self) &&
            via[i].ops->call(via[i].self, call))
            return 1;
    return 0;
}

attnd_err attnd_client_rpc(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep)
{
    return attnd_client_rpc_timeout(c, req, rep, call_timeout(c));
}

attnd_err attnd_client_rpc_timeout(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep,
                                   int32_t timeout_ms)
{
    const char *what = attnd_client_body_name(req->body_case);
    reply_sink sink = {.c = c, .req = req};
    char err[sizeof c->last_error];
    attnd_client_transport_call call = {.req = req,
                                        .reply_cb = reply_decode_cb,
                                        .reply_arg = &sink,
                                        .err = err,
                                        .err_cap = sizeof err};
    *rep = NULL;
    err[0] = '\0';
    if (!c->dialed)
        return attnd_client_fail(c, ATTND_ERR_UNAVAILABLE, "%s: not connected (dial first)", what);
    req->id = atomic_fetch_add(&c->next_id, 1);
    /* Hello travels without a session; Status with one when there is one (a daemon with a
     * token answers Status only in a session). */
    if (req->body_case != ATTND__REQUEST__BODY_HELLO) req->session = c->session;
    /* the session lives on the socket's connection: without it no transport may carry a call */
    if (is_lost(c)) return attnd_client_fail_lost(c, req);
    call.req_len = attnd__request__get_packed_size(req);
    call.timeout_ms = timeout_ms;
    if (!call_carry(c, &call) || call.lost) return attnd_client_fail_lost(c, req);
    if (call.rv != ATTND_ERR_OK) return attnd_client_fail(c, call.rv, "%s: %s", what, err);
    *rep = sink.rep;
    return sink.rv;
}

/* ---------------------------------------------------------------- the session's channel */

/* A request without a reply body worth keeping, on the socket (the channel carries none of
 * these). */
static attnd_err call_plain(attnd_client *c, Attnd__Request *req)
{
    Attnd__Reply *rep;
    attnd_err rv = attnd_client_rpc(c, req, &rep);
    if (rv == ATTND_ERR_OK) attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

/* WakeChannel: its reply means the daemon polls again. Only a hint: whatever it gets (a daemon
 * draining may refuse it and still serve the slot), the call waits for its slot's reply, and a
 * lost connection, a closed channel or the deadline ends that wait. */
static void chan_wake_hook(void *arg, uint32_t channel)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__WakeChannel m = ATTND__WAKE_CHANNEL__INIT;
    m.channel = channel;
    req.body_case = ATTND__REQUEST__BODY_WAKE_CHANNEL;
    req.wake_channel = &m;
    (void)call_plain(arg, &req);
}

static int chan_lost_hook(void *arg)
{
    return is_lost(arg);
}

/* OpenChannel: the daemon maps the object and names the channel (*id). */
static attnd_err chan_register(attnd_client *c, const attnd_client_chan *ch, uint32_t *id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__OpenChannel m = ATTND__OPEN_CHANNEL__INIT;
    Attnd__Reply *rep;
    attnd_err rv;
    m.shm_name = (char *)attnd_client_chan_shm_name(ch);
    m.size = attnd_client_chan_size(ch);
    req.body_case = ATTND__REQUEST__BODY_OPEN_CHANNEL;
    req.open_channel = &m;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    if (rep->body_case != ATTND__REPLY__BODY_CHANNEL || rep->channel->channel == 0)
        rv = attnd_client_fail(c, ATTND_ERR_PROTOCOL, "open_channel: reply without a channel");
    else
        *id = rep->channel->channel;
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

/* Make a channel of `slots` slots sized for the session's limits, register it and unlink its
 * name. On failure nothing is left and the error is recorded. */
static attnd_err chan_open(attnd_client *c, int32_t slots, attnd_client_chan **out)
{
    const attnd_server_info *si = attnd_client_server(c);
    attnd_client_chan_config cfg = {
        .slots = slots,
        .spin_us = c->spin_us,
        .shm_gid = c->shm_gid,
        .hooks = {.arg = c, .wake = chan_wake_hook, .lost = chan_lost_hook},
    };
    attnd_client_chan *ch;
    char err[256];
    uint32_t id = 0;
    attnd_err rv;
    *out = NULL;
    if (si == NULL)
        return attnd_client_fail(c, ATTND_ERR_UNAVAILABLE, "channel: no session (hello first)");
    cfg.limits = &si->limits;
    if ((rv = attnd_client_chan_alloc(&ch, &cfg, err, sizeof err)) != ATTND_ERR_OK)
        return attnd_client_fail(c, rv, "%s", err);
    rv = chan_register(c, ch, &id);
    /* mapped by both sides now (or refused): drop the name, so nothing outlives the processes */
    attnd_client_chan_unlink(ch);
    if (rv != ATTND_ERR_OK) {
        attnd_client_chan_transport.free(ch);
        return rv;
    }
    attnd_client_chan_start(ch, id);
    *out = ch;
    return ATTND_ERR_OK;
}

/* CloseChannel when tell and the daemon still has the channel (its result returned), then unmap
 * and free it. */
static attnd_err chan_close(attnd_client *c, attnd_client_chan *ch, int tell)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CloseChannel m = ATTND__CLOSE_CHANNEL__INIT;
    attnd_err rv = ATTND_ERR_OK;
    if (ch == NULL) return ATTND_ERR_OK;
    if (tell && attnd_client_chan_transport.active(ch)) {
        m.channel = attnd_client_chan_id(ch);
        req.body_case = ATTND__REQUEST__BODY_CLOSE_CHANNEL;
        req.close_channel = &m;
        rv = call_plain(c, &req);
    }
    attnd_client_chan_transport.free(ch);
    return rv;
}

void attnd_client_channel_connect(attnd_client *c)
{
    attnd_client_error saved;
    attnd_client_error_save(c, &saved);
    if (chan_open(c, c->channel_slots, &c->chan) == ATTND_ERR_OK) return;
    pthread_mutex_lock(&c->mu);
    attnd_client_copy_str(c->chan_error, sizeof c->chan_error, c->last_error);
    pthread_mutex_unlock(&c->mu);
    attnd_client_error_restore(c, &saved);
}

void attnd_client_channel_drop(attnd_client *c)
{
    chan_close(c, c->chan, 0);
    c->chan = NULL;
}

attnd_err attnd_client_channel_open(attnd_client *c, int32_t slots)
{
    attnd_client_chan *ch;
    attnd_err rv;
    if (attnd_client_chan_transport.active(c->chan))
        return attnd_client_fail(c, ATTND_ERR_ALREADY_EXISTS, "channel: already open");
    if ((rv = chan_open(c, slots, &ch)) != ATTND_ERR_OK) return rv;
    /* one the daemon closed: unmap it now */
    chan_close(c, c->chan, 0);
    c->chan = ch;
    c->chan_error[0] = '\0';
    return ATTND_ERR_OK;
}

attnd_err attnd_client_channel_close(attnd_client *c)
{
    attnd_client_chan *ch = c->chan;
    c->chan = NULL;
    return chan_close(c, ch, !is_lost(c));
}

int attnd_client_channel_active(const attnd_client *c)
{
    return attnd_client_chan_transport.active(c->chan);
}

const char *attnd_client_channel_error(const attnd_client *c)
{
    return c->chan_error;
}
