#include "server.h"

#include <grp.h>
#include <pthread.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "channel.h"
#include "observe.h"
#include "attnd_nng_err.h"

enum { SLOT_RECV, SLOT_WAIT, SLOT_SEND };

typedef struct srv_slot {
    attnd_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    int state; /* handed between the NNG callback and the executor through the queue */
    Attnd__Request *req;
    uint32_t pipe;
    uint64_t t_recv_ms;
    uint64_t t_recv_ns;         /* for the latency histogram */
    attnd_metrics_req req_type; /* for the request counters */
    attnd_ops_reply reply;
} srv_slot;

struct attnd_server {
    attnd_log *log;
    attnd_ops *ops;
    attnd_exec *ex;
    nng_socket sock;
    nng_listener listeners[2];
    int nlisteners;
    srv_slot *slots;
    uint32_t nslots, queue_depth;
    atomic_int draining, stopping;
    atomic_uint busy;
    pthread_mutex_t pipes_mu; /* live connections, sorted: NNG callbacks add and remove, the */
    uint32_t *pipes;          /* executor asks (a Hello from a closed one opens no session) */
    uint32_t npipes, pipes_cap;
    attnd_observe *obs; /* metrics and log rate limiting; NULL = none */
};

/* ---------------------------------------------------------------- live connections */

/* Index of id in the sorted set, or where it would go. Caller holds pipes_mu. */
static uint32_t pipes_find(const attnd_server *srv, uint32_t id)
{
    uint32_t lo = 0, hi = srv->npipes;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (srv->pipes[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The connections gauge follows the set (caller holds pipes_mu, so updates land in order). */
static void pipes_gauge(attnd_server *srv)
{
    if (srv->obs)
        attnd_metrics_gauge_set(attnd_observe_metrics(srv->obs), ATTND_METRICS_GAUGE_CONNECTIONS,
                                srv->npipes);
}

static void pipes_add(attnd_server *srv, uint32_t id)
{
    pthread_mutex_lock(&srv->pipes_mu);
    if (srv->npipes == srv->pipes_cap) {
        uint32_t cap = srv->pipes_cap ? srv->pipes_cap * 2 : 64;
        uint32_t *np = realloc(srv->pipes, (size_t)cap * sizeof *np);
        if (np == NULL) goto done; /* its Hello will be refused as from a closed connection */
        srv->pipes = np;
        srv->pipes_cap = cap;
    }
    uint32_t i = pipes_find(srv, id);
    memmove(srv->pipes + i + 1, srv->pipes + i, (size_t)(srv->npipes - i) * sizeof(uint32_t));
    srv->pipes[i] = id;
    srv->npipes++;
done:
    pipes_gauge(srv);
    pthread_mutex_unlock(&srv->pipes_mu);
}

static void pipes_remove(attnd_server *srv, uint32_t id)
{
    pthread_mutex_lock(&srv->pipes_mu);
    uint32_t i = pipes_find(srv, id);
    if (i < srv->npipes && srv->pipes[i] == id) {
        srv->npipes--;
        memmove(srv->pipes + i, srv->pipes + i + 1, (size_t)(srv->npipes - i) * sizeof(uint32_t));
    }
    pipes_gauge(srv);
    pthread_mutex_unlock(&srv->pipes_mu);
}

static int pipes_has(attnd_server *srv, uint32_t id)
{
    pthread_mutex_lock(&srv->pipes_mu);
    uint32_t i = pipes_find(srv, id);
    int has = i < srv->npipes && srv->pipes[i] == id;
    pthread_mutex_unlock(&srv->pipes_mu);
    return has;
}

/* ---------------------------------------------------------------- replies */

static void slot_recv(srv_slot *sl)
{
    sl->state = SLOT_RECV;
    nng_ctx_recv(sl->ctx, sl->aio);
}

/* Count a reply about to go out (any thread that answers: metrics are atomics). */
static void server_count_reply(attnd_server *srv, attnd_metrics_req type, uint32_t code,
                               uint64_t t_recv_ns, size_t bytes)
{
    attnd_ops_count(srv->ops, (attnd_err)code);
    if (srv->obs == NULL) return;
    attnd_metrics *mt = attnd_observe_metrics(srv->obs);
    attnd_metrics_request(mt, type, code, attnd_metrics_now_ns() - t_recv_ns);
    attnd_metrics_wire(mt, 0, bytes);
    attnd_metrics_gauge_add(mt, ATTND_METRICS_GAUGE_INFLIGHT, -1);
    if (type == ATTND_METRICS_REQ_HELLO && code == ATTND_ERR_OK)
        attnd_metrics_event(mt, ATTND_METRICS_EVENT_SESSIONS_OPENED);
    if (type == ATTND_METRICS_REQ_HELLO && code == ATTND_ERR_PERMISSION_DENIED)
        attnd_metrics_event(mt, ATTND_METRICS_EVENT_AUTH_FAILURES);
}

/* A request arrived (socket or channel): counted in flight until its reply is counted. */
static void server_count_request(attnd_server *srv, size_t bytes)
{
    atomic_fetch_add(&srv->busy, 1);
    if (srv->obs == NULL) return;
    attnd_metrics_gauge_add(attnd_observe_metrics(srv->obs), ATTND_METRICS_GAUGE_INFLIGHT, 1);
    attnd_metrics_wire(attnd_observe_metrics(srv->obs), bytes, 0);
}

/* Pack and send; a reply that cannot be allocated is replaced by a small NO_MEMORY one. */
static void slot_send(srv_slot *sl, Attnd__Reply *rep)
{
    attnd_server *srv = sl->srv;
    Attnd__Reply small = ATTND__REPLY__INIT;
    nng_msg *m = NULL;
    size_t n = attnd__reply__get_packed_size(rep);
    if (nng_msg_alloc(&m, n) != 0) {
        small.id = rep->id;
        small.code = ATTND_ERR_NO_MEMORY;
        small.message = (char *)"reply: out of memory";
        rep = &small;
        n = attnd__reply__get_packed_size(rep);
        if (nng_msg_alloc(&m, n) != 0) {
            /* nothing to send with: a new recv drops the request, the client times out */
            ATTND_LOG(srv->log, ATTND_LOG_ERROR, "event=reply_dropped id=%llu reason=no_memory",
                      (unsigned long long)rep->id);
            if (srv->obs) {
                attnd_metrics_gauge_add(attnd_observe_metrics(srv->obs),
                                        ATTND_METRICS_GAUGE_INFLIGHT, -1);
                attnd_metrics_event(attnd_observe_metrics(srv->obs),
                                    ATTND_METRICS_EVENT_DROPPED_MESSAGES);
            }
            atomic_fetch_sub(&srv->busy, 1);
            slot_recv(sl);
            return;
        }
    }
    attnd__reply__pack(rep, nng_msg_body(m));
    server_count_reply(srv, sl->req_type, rep->code, sl->t_recv_ns, n);
    sl->state = SLOT_SEND;
    nng_aio_set_msg(sl->aio, m);
    nng_ctx_send(sl->ctx, sl->aio);
}

static void slot_send_error(srv_slot *sl, uint64_t id, attnd_err code, const char *msg)
{
    Attnd__Reply rep = ATTND__REPLY__INIT;
    rep.id = id;
    rep.code = (uint32_t)code;
    rep.message = (char *)msg;
    char key[48];
    uint64_t suppressed = 0;
    /* a client sending garbage in a loop costs one line per second per code, not one per message */
    snprintf(key, sizeof key, "request:%s", attnd_err_name(code));
    if (sl->srv->obs == NULL || attnd_observe_log_allowed(sl->srv->obs, key, &suppressed))
        ATTND_LOG(sl->srv->log, ATTND_LOG_INFO,
                  "event=request id=%llu code=%s msg=\"%s\" suppressed=%llu",
                  (unsigned long long)id, attnd_err_name(code), msg,
                  (unsigned long long)suppressed);
    slot_send(sl, &rep);
}

/* ---------------------------------------------------------------- requests */

/* First unknown field anywhere in the message tree (0 when none). */
static uint32_t find_unknown(const ProtobufCMessage *m, const char **where)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    uint32_t tag;
    if (m->n_unknown_fields) {
        *where = d->name;
        return m->unknown_fields[0].tag;
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t cnt = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t j = 0; j < cnt; j++)
                if (arr[j] && (tag = find_unknown(arr[j], where))) return tag;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
        if (sub && (tag = find_unknown(sub, where))) return tag;
    }
    return 0;
}

/* A reply that waited for its kernels (attnd_ops_defer) goes out now. */
static void server_slot_done_cb(void *arg, attnd_ops_reply *r)
{
    srv_slot *sl = arg;
    slot_send(sl, &r->reply);
    attnd_ops_reply_fini(r);
}

static void server_exec_cb(void *arg, uint64_t value)
{
    srv_slot *sl = arg;
    attnd_server *srv = sl->srv;
    (void)value;
    attnd_ops_reply_init(&sl->reply, sl->req->id);
    /* control events run before queued requests: a connection may be gone already */
    uint32_t pipe = pipes_has(srv, sl->pipe) ? sl->pipe : 0;
    attnd_ops_handle(srv->ops, sl->req, pipe, attnd_ops_now_ms() - sl->t_recv_ms, &sl->reply);
    attnd__request__free_unpacked(sl->req, NULL);
    sl->req = NULL;
    if (sl->reply.fence != NULL)
        attnd_ops_defer(srv->ops, &sl->reply, server_slot_done_cb, sl);
    else
        server_slot_done_cb(sl, &sl->reply);
}

Attnd__Request *attnd_server_decode(const void *buf, size_t len, uint64_t *id, attnd_err *code,
                                    char *msg, size_t n)
{
    const char *where = "";
    uint32_t tag;
    *id = 0;
    *code = ATTND_ERR_PROTOCOL;
    Attnd__Request *req = attnd__request__unpack(NULL, len, buf);
    if (req == NULL) {
        snprintf(msg, n, "request: %zu bytes are not an attnd.Request", len);
        return NULL;
    }
    *id = req->id;
    if ((tag = find_unknown(&req->base, &where))) {
        attnd__request__free_unpacked(req, NULL);
        snprintf(msg, n, "request: unknown field %u in %s", tag, where);
        return NULL;
    }
    *code = ATTND_ERR_OK;
    return req;
}

static void slot_on_request(srv_slot *sl)
{
    attnd_server *srv = sl->srv;
    nng_msg *msg = nng_aio_get_msg(sl->aio);
    char text[160];
    uint64_t id;
    attnd_err code;
    sl->pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(msg));
    sl->t_recv_ms = attnd_ops_now_ms();
    sl->t_recv_ns = attnd_metrics_now_ns();
    size_t len = nng_msg_len(msg);
    server_count_request(srv, len);
    Attnd__Request *req =
        attnd_server_decode(nng_msg_body(msg), len, &id, &code, text, sizeof text);
    nng_msg_free(msg);
    /* every received message is answered by slot_send, which counts it out again */
    sl->req_type = attnd_metrics_req_from_field(req ? (uint32_t)req->body_case : 0);
    if (req == NULL) {
        slot_send_error(sl, id, code, text);
        return;
    }
    if (atomic_load(&srv->draining)) {
        attnd__request__free_unpacked(req, NULL);
        slot_send_error(sl, id, ATTND_ERR_UNAVAILABLE, "daemon: shutting down");
        return;
    }
    sl->req = req;
    sl->state = SLOT_WAIT; /* before submit: the executor may run it at once */
    if (attnd_exec_submit(srv->ex, server_exec_cb, sl) != ATTND_ERR_OK) {
        sl->req = NULL;
        attnd__request__free_unpacked(req, NULL);
        snprintf(text, sizeof text, "queue: full (server.queue_depth = %u), retry",
                 srv->queue_depth);
        slot_send_error(sl, id, ATTND_ERR_UNAVAILABLE, text);
    }
}

static void server_slot_cb(void *arg)
{
    srv_slot *sl = arg;
    attnd_server *srv = sl->srv;
    int rv = nng_aio_result(sl->aio);
    if (sl->state == SLOT_SEND) {
        if (rv != 0) nng_msg_free(nng_aio_get_msg(sl->aio));
        atomic_fetch_sub(&srv->busy, 1);
        if (!atomic_load(&srv->stopping)) slot_recv(sl);
        return;
    }
    if (rv != 0) {
        /* closed or cancelled: we are stopping; anything else: keep serving */
        if (rv != NNG_ECLOSED && rv != NNG_ECANCELED && !atomic_load(&srv->stopping)) slot_recv(sl);
        return;
    }
    if (atomic_load(&srv->stopping)) {
        nng_msg_free(nng_aio_get_msg(sl->aio));
        return;
    }
    slot_on_request(sl);
}

/* ---------------------------------------------------------------- shared-memory channels */

/* One request taken from a channel slot, until its reply is written there. */
typedef struct chan_call {
    attnd_server *srv;
    uint32_t channel, slot;
    attnd_metrics_req req_type;
    uint64_t t_recv_ns;
    attnd_ops_reply reply;
} chan_call;

/* Count and pack rep into the slot; a reply past the slot's area becomes a small error that
 * says so (the request ran: the client must not resend it blindly). */
static void chan_send(chan_call *cc, Attnd__Reply *rep)
{
    attnd_server *srv = cc->srv;
    uint8_t stack[1024], *buf = stack;
    char msg[160];
    Attnd__Reply small = ATTND__REPLY__INIT;
    size_t n = attnd__reply__get_packed_size(rep);
    uint32_t cap = attnd_channels_rep_bytes(srv->ops->channels, cc->channel);
    if (n > cap || (n > sizeof stack && (buf = malloc(n)) == NULL)) {
        snprintf(msg, sizeof msg, "reply: %zu bytes %s (the request ran)", n,
                 n > cap ? "exceed the channel's reply area" : "cannot be allocated");
        small.id = rep->id;
        small.code = n > cap ? ATTND_ERR_INTERNAL : ATTND_ERR_NO_MEMORY;
        small.message = msg;
        rep = &small;
        n = attnd__reply__get_packed_size(rep);
        buf = stack;
    }
    attnd__reply__pack(rep, buf);
    server_count_reply(srv, cc->req_type, rep->code, cc->t_recv_ns, n);
    if (attnd_channels_reply(srv->ops->channels, cc->channel, cc->slot, buf, n) != ATTND_ERR_OK)
        ATTND_LOG(srv->log, ATTND_LOG_DEBUG, "event=channel_reply_lost channel=%u slot=%u",
                  cc->channel, cc->slot);
    if (buf != stack) free(buf);
    atomic_fetch_sub(&srv->busy, 1);
}

static void chan_done_cb(void *arg, attnd_ops_reply *r)
{
    chan_call *cc = arg;
    chan_send(cc, &r->reply);
    attnd_ops_reply_fini(r);
    free(cc);
}

static void chan_fail(chan_call *cc, uint64_t id, attnd_err code, const char *msg)
{
    Attnd__Reply rep = ATTND__REPLY__INIT;
    rep.id = id;
    rep.code = (uint32_t)code;
    rep.message = (char *)msg;
    chan_send(cc, &rep);
    free(cc);
}

/* What a channel may carry: everything but the socket's own business. */
static const char *chan_refused(const Attnd__Request *req, const attnd_channel_req *cr, char *msg,
                                size_t n)
{
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_HELLO:
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
    case ATTND__REQUEST__BODY_WAKE_CHANNEL:
        snprintf(msg, n, "body: %u is served on the socket only", (unsigned)req->body_case);
        return msg;
    default:
        break;
    }
    if (req->session != cr->session) {
        snprintf(msg, n, "session: %llu is not the channel's (%llu)",
                 (unsigned long long)req->session, (unsigned long long)cr->session);
        return msg;
    }
    return NULL;
}

static void server_channel_req_cb(void *arg, const attnd_channel_req *cr)
{
    attnd_server *srv = arg;
    char text[160];
    uint64_t id = 0;
    attnd_err code = ATTND_ERR_PROTOCOL;
    Attnd__Request *req = NULL;
    chan_call *cc = calloc(1, sizeof *cc);
    server_count_request(srv, cr->len);
    if (cc == NULL) {
        chan_call tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.srv = srv;
        tmp.channel = cr->channel;
        tmp.slot = cr->slot;
        Attnd__Reply rep = ATTND__REPLY__INIT;
        rep.code = ATTND_ERR_NO_MEMORY;
        rep.message = (char *)"request: out of memory";
        chan_send(&tmp, &rep);
        return;
    }
    cc->srv = srv;
    cc->channel = cr->channel;
    cc->slot = cr->slot;
    cc->req_type = ATTND_METRICS_REQ_INVALID;
    cc->t_recv_ns = attnd_metrics_now_ns();
    if (cr->bytes == NULL) {
        snprintf(text, sizeof text, "request: req_len %zu out of 1..req_bytes", cr->len);
        chan_fail(cc, 0, ATTND_ERR_PROTOCOL, text);
        return;
    }
    if ((req = attnd_server_decode(cr->bytes, cr->len, &id, &code, text, sizeof text)) == NULL) {
        chan_fail(cc, id, code, text);
        return;
    }
    cc->req_type = attnd_metrics_req_from_field((uint32_t)req->body_case);
    /* draining serves what channels carry: a posted request was sent, as one the socket
     * received before the drain; the executor stops once nothing is in flight */
    const char *refused = chan_refused(req, cr, text, sizeof text);
    if (refused) {
        attnd__request__free_unpacked(req, NULL);
        chan_fail(cc, id, ATTND_ERR_INVALID_ARGUMENT, refused);
        return;
    }
    attnd_ops_reply_init(&cc->reply, id);
    attnd_ops_handle(srv->ops, req, cr->pipe, 0, &cc->reply);
    attnd__request__free_unpacked(req, NULL);
    if (cc->reply.fence != NULL)
        attnd_ops_defer(srv->ops, &cc->reply, chan_done_cb, cc);
    else
        chan_done_cb(cc, &cc->reply);
}

/* The executor's poller: replies whose kernels finished, then requests posted in channels. */
static uint32_t server_poll_cb(void *arg, int *inflight)
{
    attnd_server *srv = arg;
    uint32_t n = attnd_ops_poll(srv->ops);
    if (srv->ops->channels)
        n += attnd_channels_poll(srv->ops->channels, server_channel_req_cb, srv);
    *inflight = attnd_ops_inflight(srv->ops) != 0;
    return n;
}

static int server_idle_cb(void *arg, int awake)
{
    attnd_server *srv = arg;
    if (srv->ops->channels == NULL) return 0;
    return attnd_channels_set_polling(srv->ops->channels, awake) && !awake;
}

/* ---------------------------------------------------------------- connections */

static void server_pipe_gone_exec(void *arg, uint64_t pipe)
{
    attnd_server *srv = arg;
    attnd_ops_pipe_closed(srv->ops, (uint32_t)pipe);
}

static void server_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    attnd_server *srv = arg;
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        /* draining: refuse new connections here, not by closing the listeners, which would
         * also close the connections whose replies are still on their way */
        if (atomic_load(&srv->draining))
            nng_pipe_close(p);
        else
            pipes_add(srv, (uint32_t)nng_pipe_id(p)); /* before it can deliver anything */
        return;
    }
    if (ev != NNG_PIPE_EV_REM_POST) return;
    /* out of the set before the event is posted: whatever the executor runs after this sees
     * the connection gone, and the event itself comes after any request it let through */
    pipes_remove(srv, (uint32_t)nng_pipe_id(p));
    if (attnd_exec_post(srv->ex, server_pipe_gone_exec, srv, (uint64_t)nng_pipe_id(p)) !=
        ATTND_ERR_OK)
        ATTND_LOG(srv->log, ATTND_LOG_WARN, "event=pipe_gone_lost pipe=%d", nng_pipe_id(p));
}

static attnd_err ipc_apply_group(const char *url, const attnd_cfg_server *c, char *err, size_t n)
{
    struct group gr, *res = NULL;
    char buf[4096];
    if (c->ipc_group[0] == '\0') return ATTND_ERR_OK;
    if (getgrnam_r(c->ipc_group, &gr, buf, sizeof buf, &res) != 0 || res == NULL) {
        snprintf(err, n, "server.ipc_group: \"%s\" is not a group", c->ipc_group);
        return ATTND_ERR_INVALID_ARGUMENT;
    }
    if (chown(url + 6, (uid_t)-1, gr.gr_gid) != 0) {
        snprintf(err, n, "server.ipc_group: cannot chown %s to %s", url + 6, c->ipc_group);
        return ATTND_ERR_PERMISSION_DENIED;
    }
    return ATTND_ERR_OK;
}

/* TLS for a tls+tcp:// listener: NNG's engine (mbedTLS in Debian's build) with the configured
 * certificate chain and key. On a bad file err names the key. */
static int server_tls(nng_listener l, const attnd_cfg_server *c, char *err, size_t n)
{
    nng_tls_config *tls = NULL;
    int rv = nng_tls_config_alloc(&tls, NNG_TLS_MODE_SERVER);
    if (rv == 0) rv = nng_tls_config_cert_key_file(tls, c->tls_cert_key_file, NULL);
    if (rv != 0 && tls != NULL)
        snprintf(err, n, "server.tls_cert_key_file: %s: %s", c->tls_cert_key_file,
                 nng_strerror(rv));
    if (rv == 0) rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tls);
    if (tls != NULL) nng_tls_config_free(tls); /* the listener holds its own reference */
    return rv != 0 && err[0] ? NNG_EINVAL : rv;
}

static attnd_err server_listen(attnd_server *srv, const char *key, const char *url,
                               const attnd_cfg_server *c, char *err, size_t n)
{
    nng_listener *l = &srv->listeners[srv->nlisteners];
    int ipc = strncmp(url, "ipc://", 6) == 0;
    int rv = nng_listener_create(l, srv->sock, url);
    if (rv == 0 && ipc)
        rv = nng_listener_set_int(*l, NNG_OPT_IPC_PERMISSIONS, (int)strtol(c->ipc_mode, NULL, 8));
    if (rv == 0 && strncmp(url, "tls+tcp://", 10) == 0) rv = server_tls(*l, c, err, n);
    if (rv == NNG_EINVAL && err[0]) return ATTND_ERR_INVALID_ARGUMENT;
    if (rv == 0) rv = nng_listener_start(*l, 0);
    if (rv != 0) {
        snprintf(err, n, "%s: cannot listen on %s: %s", key, url, nng_strerror(rv));
        return attnd_err_from_nng(rv);
    }
    srv->nlisteners++;
    ATTND_LOG(srv->log, ATTND_LOG_INFO, "event=listen url=%s", url);
    return ipc ? ipc_apply_group(url, c, err, n) : ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- lifecycle */

static attnd_err server_open(attnd_server *srv, const attnd_config *cfg, char *err, size_t n)
{
    const attnd_cfg_server *c = &cfg->server;
    attnd_err rv;
    int nrv = nng_rep0_open(&srv->sock);
    if (nrv == 0)
        nrv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, (size_t)c->max_message_bytes);
    if (nrv == 0) nrv = nng_pipe_notify(srv->sock, NNG_PIPE_EV_ADD_PRE, server_pipe_cb, srv);
    if (nrv == 0) nrv = nng_pipe_notify(srv->sock, NNG_PIPE_EV_REM_POST, server_pipe_cb, srv);
    if (nrv != 0) {
        snprintf(err, n, "server: socket: %s", nng_strerror(nrv));
        return attnd_err_from_nng(nrv);
    }
    for (uint32_t i = 0; i < srv->nslots; i++) {
        srv_slot *sl = &srv->slots[i];
        sl->srv = srv;
        if ((nrv = nng_aio_alloc(&sl->aio, server_slot_cb, sl)) != 0 ||
            (nrv = nng_ctx_open(&sl->ctx, srv->sock)) != 0) {
            snprintf(err, n, "server.workers: context %u: %s", i, nng_strerror(nrv));
            return attnd_err_from_nng(nrv);
        }
    }
    if ((rv = server_listen(srv, "server.listen", c->listen, c, err, n)) != ATTND_ERR_OK) return rv;
    if (c->listen_tcp[0]) return server_listen(srv, "server.listen_tcp", c->listen_tcp, c, err, n);
    return ATTND_ERR_OK;
}

attnd_err attnd_server_alloc(attnd_server **out, const attnd_config *cfg, attnd_ops *ops,
                             attnd_exec *ex, attnd_log *lg, char *err, size_t n)
{
    attnd_err rv;
    *out = NULL;
    attnd_server *srv = calloc(1, sizeof *srv);
    if (srv == NULL) return ATTND_ERR_NO_MEMORY;
    srv->log = lg;
    srv->ops = ops;
    srv->ex = ex;
    pthread_mutex_init(&srv->pipes_mu, NULL);
    srv->nslots = cfg->server.workers;
    srv->queue_depth = cfg->server.queue_depth;
    attnd_exec_poller poller = {srv, server_poll_cb, server_idle_cb};
    attnd_exec_set_poller(ex, &poller, cfg->server.spin_us);
    srv->slots = calloc(srv->nslots, sizeof *srv->slots);
    if (srv->slots == NULL) {
        pthread_mutex_destroy(&srv->pipes_mu);
        free(srv);
        return ATTND_ERR_NO_MEMORY;
    }
    if ((rv = server_open(srv, cfg, err, n)) != ATTND_ERR_OK) {
        attnd_server_free(srv);
        return rv;
    }
    *out = srv;
    return ATTND_ERR_OK;
}

void attnd_server_set_observe(attnd_server *srv, attnd_observe *obs)
{
    srv->obs = obs;
}

void attnd_server_start(attnd_server *srv)
{
    for (uint32_t i = 0; i < srv->nslots; i++)
        slot_recv(&srv->slots[i]);
}

void attnd_server_drain(attnd_server *srv)
{
    atomic_store(&srv->draining, 1);
}

uint32_t attnd_server_busy(attnd_server *srv)
{
    return atomic_load(&srv->busy);
}

void attnd_server_free(attnd_server *srv)
{
    if (srv == NULL) return;
    atomic_store(&srv->draining, 1);
    atomic_store(&srv->stopping, 1);
    for (uint32_t i = 0; i < srv->nslots; i++)
        if (srv->slots[i].aio) nng_aio_stop(srv->slots[i].aio);
    for (uint32_t i = 0; i < srv->nslots; i++) {
        srv_slot *sl = &srv->slots[i];
        if (sl->req) attnd__request__free_unpacked(sl->req, NULL); /* queued, never run */
        if (nng_ctx_id(sl->ctx) > 0) nng_ctx_close(sl->ctx);
        if (sl->aio) nng_aio_free(sl->aio);
    }
    if (nng_socket_id(srv->sock) > 0) nng_close(srv->sock);
    pthread_mutex_destroy(&srv->pipes_mu);
    free(srv->pipes);
    free(srv->slots);
    free(srv);
}
