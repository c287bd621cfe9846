#include "socket.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnd/clock.h"
#include "attnd_nng_err.h"
#include "listen.h"

enum { SLOT_RECV, SLOT_WAIT, SLOT_SEND };

/* A refusal for a connection over its in-flight bound waits this long to be sent: a client that
 * reads its replies takes it at once, one that does not is cut off. */
#define SOCKET_REFUSAL_SEND_MS 100

typedef struct sock_slot {
    attnd_wire_call call; /* first: the wire's view of the request in this slot */
    attnd_socket *sock;
    nng_ctx ctx;
    nng_aio *aio;
    int state; /* handed between the NNG callback and the executor through the queue */
    Attnd__Request *req;
    nng_msg *out; /* the reply being packed */
    uint32_t pipe;
    uint64_t t_recv_ms;
    int counted; /* counts in its connection's requests in flight */
    int refused; /* its reply refuses it for that bound */
} sock_slot;

typedef struct sock_pipe {
    uint32_t id;
    uint32_t inflight; /* requests received and not answered (their reply not sent) */
    int hello;         /* a Hello succeeded on it: messages up to server.max_message_bytes */
} sock_pipe;

struct attnd_socket {
    attnd_log *log;
    attnd_wire *wire;
    attnd_exec *ex;
    nng_socket nsock;
    attnd_listen *listeners[2]; /* server.listen, server.listen_tcp */
    sock_slot *slots;
    uint32_t nslots, queue_depth;
    atomic_int draining, stopping;
    uint32_t hello_max_bytes; /* largest message a connection may send before its Hello */
    uint32_t pipe_inflight;   /* requests one connection may have in flight */
    int32_t send_timeout_ms;  /* a reply not taken by then closes its connection */
    pthread_mutex_t pipes_mu; /* live connections, sorted: NNG callbacks add and remove, the */
    sock_pipe *pipes;         /* executor asks (a Hello from a closed one opens no session) */
    uint32_t npipes, pipes_cap;
};

/* ---------------------------------------------------------------- live connections */

/* Index of id in the sorted set, or where it would go. Caller holds pipes_mu. */
static uint32_t pipes_find(const attnd_socket *sock, uint32_t id)
{
    uint32_t lo = 0, hi = sock->npipes;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sock->pipes[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The connections gauge follows the set (caller holds pipes_mu, so updates land in order). */
static void pipes_gauge(attnd_socket *sock)
{
    if (sock->wire->obs)
        attnd_metrics_gauge_set(attnd_observe_metrics(sock->wire->obs),
                                ATTND_METRICS_GAUGE_CONNECTIONS, sock->npipes);
}

static void pipes_add(attnd_socket *sock, uint32_t id)
{
    pthread_mutex_lock(&sock->pipes_mu);
    if (sock->npipes == sock->pipes_cap) {
        uint32_t cap = sock->pipes_cap ? sock->pipes_cap * 2 : 64;
        sock_pipe *np = realloc(sock->pipes, (size_t)cap * sizeof *np);
        if (np == NULL) goto done; /* its Hello will be refused as from a closed connection */
        sock->pipes = np;
        sock->pipes_cap = cap;
    }
    uint32_t i = pipes_find(sock, id);
    memmove(sock->pipes + i + 1, sock->pipes + i, (size_t)(sock->npipes - i) * sizeof *sock->pipes);
    sock->pipes[i] = (sock_pipe){id, 0, 0};
    sock->npipes++;
done:
    pipes_gauge(sock);
    pthread_mutex_unlock(&sock->pipes_mu);
}

static void pipes_remove(attnd_socket *sock, uint32_t id)
{
    pthread_mutex_lock(&sock->pipes_mu);
    uint32_t i = pipes_find(sock, id);
    if (i < sock->npipes && sock->pipes[i].id == id) {
        sock->npipes--;
        memmove(sock->pipes + i, sock->pipes + i + 1,
                (size_t)(sock->npipes - i) * sizeof *sock->pipes);
    }
    pipes_gauge(sock);
    pthread_mutex_unlock(&sock->pipes_mu);
}

/* The live connection id, or NULL. Caller holds pipes_mu. */
static sock_pipe *pipes_get(attnd_socket *sock, uint32_t id)
{
    uint32_t i = pipes_find(sock, id);
    return i < sock->npipes && sock->pipes[i].id == id ? &sock->pipes[i] : NULL;
}

static int pipes_has(attnd_socket *sock, uint32_t id)
{
    pthread_mutex_lock(&sock->pipes_mu);
    int has = pipes_get(sock, id) != NULL;
    pthread_mutex_unlock(&sock->pipes_mu);
    return has;
}

/* One more request on connection id: 1 counted in its requests in flight, 0 when it has
 * server.max_inflight_per_connection already, -1 when it is gone (nothing counted). *hello:
 * a Hello succeeded on it. */
static int pipes_admit(attnd_socket *sock, uint32_t id, int *hello)
{
    int rv = -1;
    pthread_mutex_lock(&sock->pipes_mu);
    sock_pipe *p = pipes_get(sock, id);
    *hello = p && p->hello;
    if (p && p->inflight < sock->pipe_inflight) {
        p->inflight++;
        rv = 1;
    } else if (p) {
        rv = 0;
    }
    pthread_mutex_unlock(&sock->pipes_mu);
    return rv;
}

static void pipes_release(attnd_socket *sock, uint32_t id)
{
    pthread_mutex_lock(&sock->pipes_mu);
    sock_pipe *p = pipes_get(sock, id);
    if (p && p->inflight) p->inflight--;
    pthread_mutex_unlock(&sock->pipes_mu);
}

static void pipes_set_hello(attnd_socket *sock, uint32_t id)
{
    pthread_mutex_lock(&sock->pipes_mu);
    sock_pipe *p = pipes_get(sock, id);
    if (p) p->hello = 1;
    pthread_mutex_unlock(&sock->pipes_mu);
}

/* ---------------------------------------------------------------- the transport's replies */

static void slot_recv(sock_slot *sl)
{
    sl->state = SLOT_RECV;
    nng_aio_set_timeout(sl->aio, NNG_DURATION_INFINITE);
    nng_ctx_recv(sl->ctx, sl->aio);
}

/* The slot's call ended (reply sent, failed or dropped): its connection has one less in flight. */
static void slot_done(sock_slot *sl)
{
    if (sl->counted) pipes_release(sl->sock, sl->pipe);
    sl->counted = 0;
    sl->refused = 0;
    attnd_wire_done(sl->sock->wire);
}

static size_t slot_reply_cap(attnd_wire_call *c)
{
    (void)c;
    return SIZE_MAX;
}

/* The reply is packed straight into a message's body. */
static void *slot_reply_buf(attnd_wire_call *c, size_t n)
{
    sock_slot *sl = (sock_slot *)c;
    if (nng_msg_alloc(&sl->out, n) != 0) return NULL;
    return nng_msg_body(sl->out);
}

static void slot_reply_send(attnd_wire_call *c, void *buf, size_t n)
{
    sock_slot *sl = (sock_slot *)c;
    (void)buf;
    (void)n;
    sl->state = SLOT_SEND;
    nng_aio_set_msg(sl->aio, sl->out);
    sl->out = NULL;
    /* a client that does not read its replies would hold this context for good */
    nng_aio_set_timeout(sl->aio, sl->refused ? SOCKET_REFUSAL_SEND_MS : sl->sock->send_timeout_ms);
    nng_ctx_send(sl->ctx, sl->aio);
}

/* A new recv drops the request: its client times out. */
static void slot_reply_drop(attnd_wire_call *c)
{
    sock_slot *sl = (sock_slot *)c;
    slot_done(sl);
    slot_recv(sl);
}

static void slot_hello_ok(attnd_wire_call *c)
{
    sock_slot *sl = (sock_slot *)c;
    pipes_set_hello(sl->sock, sl->pipe);
}

static const attnd_transport_ops socket_ops = {slot_reply_cap, slot_reply_buf, slot_reply_send,
                                               slot_reply_drop, slot_hello_ok};

/* ---------------------------------------------------------------- requests */

static void socket_exec_cb(void *arg, uint64_t value)
{
    sock_slot *sl = arg;
    Attnd__Request *req = sl->req;
    (void)value;
    sl->req = NULL;
    /* control events run before queued requests: a connection may be gone already */
    uint32_t pipe = pipes_has(sl->sock, sl->pipe) ? sl->pipe : 0;
    attnd_wire_deliver(&sl->call, req, pipe, attnd_clock_ms() - sl->t_recv_ms);
}

/* What the connection may send, checked before the message is decoded: its requests in flight
 * and, until a Hello succeeds on it, the message's size. 0 when refused (answered). */
static int slot_admit(sock_slot *sl, size_t len)
{
    attnd_socket *sock = sl->sock;
    char text[192];
    int hello, admit = pipes_admit(sock, sl->pipe, &hello);
    sl->counted = admit == 1;
    sl->refused = admit == 0;
    if (sl->refused) {
        snprintf(text, sizeof text,
                 "connection: %u requests in flight already (server.max_inflight_per_connection); "
                 "read the replies, then retry",
                 sock->pipe_inflight);
        attnd_wire_fail(&sl->call, 0, ATTND_ERR_UNAVAILABLE, text);
        return 0;
    }
    if (len > sock->hello_max_bytes && !hello) {
        snprintf(text, sizeof text,
                 "request: %zu bytes before a Hello succeeded on this connection (at most "
                 "server.max_message_bytes_before_hello = %u until then)",
                 len, sock->hello_max_bytes);
        attnd_wire_fail(&sl->call, 0, ATTND_ERR_PROTOCOL, text);
        return 0;
    }
    return 1;
}

static void slot_on_request(sock_slot *sl)
{
    attnd_socket *sock = sl->sock;
    nng_msg *msg = nng_aio_get_msg(sl->aio);
    char text[160];
    uint64_t id;
    attnd_err code;
    size_t len = nng_msg_len(msg);
    sl->pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(msg));
    sl->t_recv_ms = attnd_clock_ms();
    attnd_wire_received(sock->wire, &sl->call, &socket_ops, len);
    if (!slot_admit(sl, len)) {
        nng_msg_free(msg);
        return;
    }
    Attnd__Request *req = attnd_wire_decode_max(
        nng_msg_body(msg), len, attnd_wire_max_elements(sock->wire), &id, &code, text, sizeof text);
    nng_msg_free(msg);
    sl->call.req_type = attnd_metrics_req_from_field(req ? (uint32_t)req->body_case : 0);
    if (req == NULL) {
        attnd_wire_fail(&sl->call, id, code, text);
        return;
    }
    if (atomic_load(&sock->draining)) {
        attnd__request__free_unpacked(req, NULL);
        attnd_wire_fail(&sl->call, id, ATTND_ERR_UNAVAILABLE, "daemon: shutting down");
        return;
    }
    sl->req = req;
    sl->state = SLOT_WAIT; /* before submit: the executor may run it at once */
    if (attnd_exec_submit(sock->ex, socket_exec_cb, sl) != ATTND_ERR_OK) {
        sl->req = NULL;
        attnd__request__free_unpacked(req, NULL);
        snprintf(text, sizeof text, "queue: full (server.queue_depth = %u), retry",
                 sock->queue_depth);
        attnd_wire_fail(&sl->call, id, ATTND_ERR_UNAVAILABLE, text);
    }
}

/* Its client did not take the reply in time: it is not reading them, and every request it
 * sends would hold a context as long. Cut it off (its sessions are dropped as for any drop). */
static void slot_send_timed_out(sock_slot *sl)
{
    attnd_socket *sock = sl->sock;
    uint64_t suppressed = 0;
    nng_pipe p;
    p.id = sl->pipe;
    if (sock->wire->obs == NULL ||
        attnd_observe_log_allowed(sock->wire->obs, "send_timeout", &suppressed))
        ATTND_LOG(sock->log, ATTND_LOG_WARN,
                  "event=send_timeout pipe=%u timeout_ms=%d action=close "
                  "reason=\"the client does not read its replies\" suppressed=%llu",
                  sl->pipe, sl->refused ? SOCKET_REFUSAL_SEND_MS : sock->send_timeout_ms,
                  (unsigned long long)suppressed);
    if (sock->wire->obs)
        attnd_metrics_event(attnd_observe_metrics(sock->wire->obs),
                            ATTND_METRICS_EVENT_SEND_TIMEOUTS);
    nng_pipe_close(p);
}

static void socket_slot_cb(void *arg)
{
    sock_slot *sl = arg;
    attnd_socket *sock = sl->sock;
    int rv = nng_aio_result(sl->aio);
    if (sl->state == SLOT_SEND) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(sl->aio));
            if (rv == NNG_ETIMEDOUT) slot_send_timed_out(sl);
        }
        slot_done(sl);
        if (!atomic_load(&sock->stopping)) slot_recv(sl);
        return;
    }
    if (rv != 0) {
        /* closed or cancelled: we are stopping; anything else: keep serving */
        if (rv != NNG_ECLOSED && rv != NNG_ECANCELED && !atomic_load(&sock->stopping))
            slot_recv(sl);
        return;
    }
    if (atomic_load(&sock->stopping)) {
        nng_msg_free(nng_aio_get_msg(sl->aio));
        return;
    }
    slot_on_request(sl);
}

/* ---------------------------------------------------------------- connections */

static void socket_pipe_gone_exec(void *arg, uint64_t pipe)
{
    attnd_wire *w = arg;
    w->handler.pipe_closed(w->handler.arg, (uint32_t)pipe);
}

/* The listeners keep their connections' count (which one accepted it: nng_pipe_listener). */
static void socket_listen_pipe(attnd_socket *sock, nng_pipe p, int added)
{
    for (int i = 0; i < 2; i++)
        if (sock->listeners[i]) attnd_listen_pipe(sock->listeners[i], p, added);
}

static void socket_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    attnd_socket *sock = arg;
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        /* draining: refuse new connections here, not by closing the listeners, which would
         * also close the connections whose replies are still on their way */
        if (atomic_load(&sock->draining)) {
            nng_pipe_close(p);
            return;
        }
        pipes_add(sock, (uint32_t)nng_pipe_id(p)); /* before it can deliver anything */
        socket_listen_pipe(sock, p, 1);
        return;
    }
    if (ev != NNG_PIPE_EV_REM_POST) return;
    socket_listen_pipe(sock, p, 0);
    /* out of the set before the event is posted: whatever the executor runs after this sees
     * the connection gone, and the event itself comes after any request it let through */
    pipes_remove(sock, (uint32_t)nng_pipe_id(p));
    if (attnd_exec_post(sock->ex, socket_pipe_gone_exec, sock->wire, (uint64_t)nng_pipe_id(p)) !=
        ATTND_ERR_OK)
        ATTND_LOG(sock->log, ATTND_LOG_WARN, "event=pipe_gone_lost pipe=%d", nng_pipe_id(p));
}

/* ---------------------------------------------------------------- lifecycle */

static attnd_err socket_open(attnd_socket *sock, const attnd_config *cfg, char *err, size_t n)
{
    const attnd_cfg_server *c = &cfg->server;
    attnd_err rv;
    int nrv = nng_rep0_open(&sock->nsock);
    if (nrv == 0)
        nrv = nng_socket_set_size(sock->nsock, NNG_OPT_RECVMAXSZ, (size_t)c->max_message_bytes);
    if (nrv == 0) nrv = nng_pipe_notify(sock->nsock, NNG_PIPE_EV_ADD_PRE, socket_pipe_cb, sock);
    if (nrv == 0) nrv = nng_pipe_notify(sock->nsock, NNG_PIPE_EV_REM_POST, socket_pipe_cb, sock);
    if (nrv != 0)
        return attnd_errf(err, n, attnd_err_from_nng(nrv), "server: socket: %s", nng_strerror(nrv));
    for (uint32_t i = 0; i < sock->nslots; i++) {
        sock_slot *sl = &sock->slots[i];
        sl->sock = sock;
        if ((nrv = nng_aio_alloc(&sl->aio, socket_slot_cb, sl)) != 0 ||
            (nrv = nng_ctx_open(&sl->ctx, sock->nsock)) != 0)
            return attnd_errf(err, n, attnd_err_from_nng(nrv), "server.workers: context %u: %s", i,
                              nng_strerror(nrv));
    }
    attnd_metrics *mt = sock->wire->obs ? attnd_observe_metrics(sock->wire->obs) : NULL;
    if ((rv = attnd_listen_open(&sock->listeners[0], sock->nsock, "server.listen", c->listen, c,
                                sock->log, mt, err, n)) != ATTND_ERR_OK)
        return rv;
    if (c->listen_tcp[0])
        return attnd_listen_open(&sock->listeners[1], sock->nsock, "server.listen_tcp",
                                 c->listen_tcp, c, sock->log, mt, err, n);
    return ATTND_ERR_OK;
}

attnd_err attnd_socket_alloc(attnd_socket **out, const attnd_config *cfg, attnd_wire *w,
                             attnd_exec *ex, attnd_log *lg, char *err, size_t n)
{
    attnd_err rv;
    *out = NULL;
    attnd_socket *sock = calloc(1, sizeof *sock);
    if (sock == NULL) return ATTND_ERR_NO_MEMORY;
    sock->log = lg;
    sock->wire = w;
    sock->ex = ex;
    pthread_mutex_init(&sock->pipes_mu, NULL);
    sock->nslots = cfg->server.workers;
    sock->queue_depth = cfg->server.queue_depth;
    sock->hello_max_bytes = (uint32_t)cfg->server.max_message_bytes_before_hello;
    sock->pipe_inflight = cfg->server.max_inflight_per_connection;
    sock->send_timeout_ms = (int32_t)cfg->server.send_timeout_ms;
    sock->slots = calloc(sock->nslots, sizeof *sock->slots);
    if (sock->slots == NULL) {
        pthread_mutex_destroy(&sock->pipes_mu);
        free(sock);
        return ATTND_ERR_NO_MEMORY;
    }
    if ((rv = socket_open(sock, cfg, err, n)) != ATTND_ERR_OK) {
        attnd_socket_free(sock);
        return rv;
    }
    *out = sock;
    return ATTND_ERR_OK;
}

void attnd_socket_start(attnd_socket *sock)
{
    for (uint32_t i = 0; i < sock->nslots; i++)
        slot_recv(&sock->slots[i]);
}

void attnd_socket_drain(attnd_socket *sock)
{
    atomic_store(&sock->draining, 1);
}

void attnd_socket_tick(attnd_socket *sock)
{
    for (int i = 0; i < 2; i++)
        if (sock->listeners[i]) attnd_listen_tick(sock->listeners[i], atomic_load(&sock->draining));
}

void attnd_socket_free(attnd_socket *sock)
{
    if (sock == NULL) return;
    atomic_store(&sock->draining, 1);
    atomic_store(&sock->stopping, 1);
    for (uint32_t i = 0; i < sock->nslots; i++)
        if (sock->slots[i].aio) nng_aio_stop(sock->slots[i].aio);
    for (uint32_t i = 0; i < sock->nslots; i++) {
        sock_slot *sl = &sock->slots[i];
        if (sl->req) attnd__request__free_unpacked(sl->req, NULL); /* queued, never run */
        if (nng_ctx_id(sl->ctx) > 0) nng_ctx_close(sl->ctx);
        if (sl->aio) nng_aio_free(sl->aio);
    }
    for (int i = 0; i < 2; i++)
        attnd_listen_stop(sock->listeners[i]);
    if (nng_socket_id(sock->nsock) > 0) nng_close(sock->nsock);
    for (int i = 0; i < 2; i++)
        attnd_listen_free(sock->listeners[i]);
    pthread_mutex_destroy(&sock->pipes_mu);
    free(sock->pipes);
    free(sock->slots);
    free(sock);
}
