/* Connection and session: the client object, the REQ socket, one round trip per call (through
 * the shared-memory channel when it carries the request, channel.c), Hello, Status, error
 * messages. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "client_int.h"
#include "attnd_nng_err.h"

/* One call: its own REQ context (so threads can share the socket) and aio. Idle slots wait in
 * free_slots; in-flight ones sit in busy, where a dropped connection cancels them. */
typedef struct call_slot {
    nng_ctx ctx;
    nng_aio *aio;
    struct call_slot *next, **prevp;
} call_slot;

struct attnd_client {
    nng_socket sock;
    int dialed;
    int64_t ipc_gid; /* group of the daemon's ipc:// socket file, -1 when unknown */
    char name[64];
    char token[256];
    char tls_ca_file[512];
    char tls_server_name[256];
    _Atomic int32_t timeout_ms;
    _Atomic uint64_t next_id;
    _Atomic uint32_t next_region;
    uint64_t session;
    int have_server;
    attnd_server_info server;
    pthread_mutex_t mu; /* guards free_slots, busy, lost, last_error and last_remote */
    call_slot *free_slots, *busy;
    int lost; /* the connection dropped: the session is gone, every call fails */
    char last_error[512];
    int last_remote; /* last_error came from the daemon */
    int32_t channel_slots, spin_us;
    attnd_client_chan *chan; /* set and cleared only while no call is in flight */
    char chan_error[512];    /* why attnd_client_connect's channel did not open */
};

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

static void set_error(attnd_client *c, const char *msg, int remote)
{
    pthread_mutex_lock(&c->mu);
    copy_str(c->last_error, sizeof c->last_error, msg);
    c->last_remote = remote;
    pthread_mutex_unlock(&c->mu);
}

attnd_err attnd_client_fail(attnd_client *c, attnd_err err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_error(c, msg, 0);
    return err;
}

/* The connection dropped (the daemon exited or closed it): the session died with it, so fail
 * the calls in flight now and every later one, rather than let REQ redial and resend. */
static void pipe_removed_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    attnd_client *c = arg;
    (void)p;
    (void)ev;
    pthread_mutex_lock(&c->mu);
    c->lost = 1;
    for (call_slot *s = c->busy; s != NULL; s = s->next)
        nng_aio_cancel(s->aio);
    pthread_mutex_unlock(&c->mu);
}

attnd_err attnd_client_alloc(attnd_client **cp, const attnd_client_opts *opts)
{
    attnd_client *c = calloc(1, sizeof *c);
    int rv;
    *cp = NULL;
    if (c == NULL) return ATTND_ERR_NO_MEMORY;
    c->ipc_gid = -1;
    pthread_mutex_init(&c->mu, NULL);
    copy_str(c->name, sizeof c->name, opts && opts->name ? opts->name : "attnd-client");
    copy_str(c->token, sizeof c->token, opts ? opts->token : NULL);
    atomic_init(&c->timeout_ms, opts ? opts->timeout_ms : 0);
    c->channel_slots = opts ? opts->channel_slots : 0;
    c->spin_us = opts ? opts->spin_us : 0;
    atomic_init(&c->next_id, 1);
    atomic_init(&c->next_region, 1);
    if ((rv = nng_req0_open(&c->sock)) != 0) goto fail;
    /* Requests are not idempotent: never resend one. Replies may carry large inline outputs. */
    if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_removed_cb, c)) != 0) {
        nng_close(c->sock);
        goto fail;
    }
    *cp = c;
    return ATTND_ERR_OK;
fail:
    pthread_mutex_destroy(&c->mu);
    free(c);
    return attnd_err_from_nng(rv);
}

void attnd_client_free(attnd_client *c)
{
    if (c == NULL) return;
    /* no CloseChannel: the daemon drops the channel with the connection, closed just below (a
     * round trip less, and no request the caller did not make) */
    attnd_client_chan_close(c, c->chan, 0);
    c->chan = NULL;
    while (c->free_slots != NULL) {
        call_slot *s = c->free_slots;
        c->free_slots = s->next;
        nng_aio_free(s->aio);
        nng_ctx_close(s->ctx);
        free(s);
    }
    nng_close(c->sock);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

attnd_err attnd_client_set_tls(attnd_client *c, const char *ca_file, const char *server_name)
{
    if ((ca_file && strlen(ca_file) >= sizeof c->tls_ca_file) ||
        (server_name && strlen(server_name) >= sizeof c->tls_server_name))
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "set_tls: path or name too long");
    copy_str(c->tls_ca_file, sizeof c->tls_ca_file, ca_file);
    copy_str(c->tls_server_name, sizeof c->tls_server_name, server_name);
    return ATTND_ERR_OK;
}

/* TLS settings of a tls+tcp:// dialer: the CA that must have signed the daemon's certificate. */
static int dialer_tls(attnd_client *c, nng_dialer d, const char *url)
{
    int rv;
    if (strncmp(url, "tls+", 4) != 0) return 0;
    if (c->tls_ca_file[0] == '\0') return NNG_EINVAL;
    if ((rv = nng_dialer_set_string(d, NNG_OPT_TLS_CA_FILE, c->tls_ca_file)) != 0) return rv;
    if (c->tls_server_name[0] != '\0')
        rv = nng_dialer_set_string(d, NNG_OPT_TLS_SERVER_NAME, c->tls_server_name);
    return rv;
}

attnd_err attnd_client_dial(attnd_client *c, const char *url)
{
    nng_dialer d;
    int rv;
    if (url == NULL || url[0] == '\0')
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "dial: empty url");
    if (c->dialed)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "dial %s: already dialed", url);
    if ((rv = nng_dialer_create(&d, c->sock, url)) != 0)
        return attnd_client_fail(c, attnd_err_from_nng(rv), "dial %s: %s", url, nng_strerror(rv));
    if ((rv = dialer_tls(c, d, url)) != 0) {
        nng_dialer_close(d);
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "dial %s: TLS: %s", url,
                                 rv == NNG_EINVAL && c->tls_ca_file[0] == '\0'
                                     ? "tls_ca_file is required"
                                     : nng_strerror(rv));
    }
    if ((rv = nng_dialer_start(d, 0)) != 0) {
        nng_dialer_close(d);
        return attnd_client_fail(c, attnd_err_from_nng(rv), "dial %s: %s", url, nng_strerror(rv));
    }
    struct stat st;
    c->ipc_gid =
        strncmp(url, "ipc://", 6) == 0 && stat(url + 6, &st) == 0 ? (int64_t)st.st_gid : -1;
    c->dialed = 1;
    return ATTND_ERR_OK;
}

void attnd_client_set_timeout(attnd_client *c, int32_t timeout_ms)
{
    atomic_store(&c->timeout_ms, timeout_ms);
}

const char *attnd_client_last_error(const attnd_client *c)
{
    return c->last_error;
}

int attnd_client_last_error_remote(const attnd_client *c)
{
    attnd_client *m = (attnd_client *)c; /* the lock is not part of the logical state */
    int remote;
    pthread_mutex_lock(&m->mu);
    remote = c->last_remote;
    pthread_mutex_unlock(&m->mu);
    return remote;
}

size_t attnd_client_last_error_copy(const attnd_client *c, char *buf, size_t len)
{
    attnd_client *m = (attnd_client *)c; /* the lock is not part of the logical state */
    size_t n;
    pthread_mutex_lock(&m->mu);
    n = strlen(c->last_error);
    if (len > 0) copy_str(buf, len, c->last_error);
    pthread_mutex_unlock(&m->mu);
    return n;
}

const attnd_server_info *attnd_client_server(const attnd_client *c)
{
    return c->have_server ? &c->server : NULL;
}

uint64_t attnd_client_session(const attnd_client *c)
{
    return c->session;
}

uint32_t attnd_client_region_next_id(attnd_client *c)
{
    return atomic_fetch_add(&c->next_region, 1);
}

/* ---------------------------------------------------------------- one round trip */

const char *attnd_client_body_name(Attnd__Request__BodyCase k)
{
    switch (k) {
    case ATTND__REQUEST__BODY_HELLO:
        return "hello";
    case ATTND__REQUEST__BODY_REGISTER_REGION:
        return "register_region";
    case ATTND__REQUEST__BODY_UNREGISTER_REGION:
        return "unregister_region";
    case ATTND__REQUEST__BODY_CREATE:
        return "create";
    case ATTND__REQUEST__BODY_FORK:
        return "fork";
    case ATTND__REQUEST__BODY_FREE:
        return "free";
    case ATTND__REQUEST__BODY_QUERY:
        return "query";
    case ATTND__REQUEST__BODY_LIST:
        return "list";
    case ATTND__REQUEST__BODY_BEGIN_STEP:
        return "begin_step";
    case ATTND__REQUEST__BODY_ATTEND:
        return "attend";
    case ATTND__REQUEST__BODY_END_STEP:
        return "end_step";
    case ATTND__REQUEST__BODY_MERGE:
        return "merge";
    case ATTND__REQUEST__BODY_VARLEN:
        return "varlen";
    case ATTND__REQUEST__BODY_BLOCKSPARSE:
        return "blocksparse";
    case ATTND__REQUEST__BODY_LINEAR_PREFILL:
        return "linear_prefill";
    case ATTND__REQUEST__BODY_LINEAR_DECODE:
        return "linear_decode";
    case ATTND__REQUEST__BODY_STATUS:
        return "status";
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
        return "open_channel";
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
        return "close_channel";
    case ATTND__REQUEST__BODY_WAKE_CHANNEL:
        return "wake_channel";
    default:
        return "request";
    }
}

static void busy_add(attnd_client *c, call_slot *s)
{
    s->next = c->busy;
    s->prevp = &c->busy;
    if (c->busy != NULL) c->busy->prevp = &s->next;
    c->busy = s;
}

static void busy_remove(call_slot *s)
{
    *s->prevp = s->next;
    if (s->next != NULL) s->next->prevp = s->prevp;
}

static attnd_err slot_new(attnd_client *c, call_slot **out)
{
    call_slot *s = calloc(1, sizeof *s);
    int rv;
    if (s == NULL) return ATTND_ERR_NO_MEMORY;
    if ((rv = nng_aio_alloc(&s->aio, NULL, NULL)) != 0) {
        free(s);
        return attnd_err_from_nng(rv);
    }
    if ((rv = nng_ctx_open(&s->ctx, c->sock)) != 0) {
        nng_aio_free(s->aio);
        free(s);
        return attnd_err_from_nng(rv);
    }
    *out = s;
    return ATTND_ERR_OK;
}

/* A slot for one call, registered as in flight; UNAVAILABLE once the connection is lost. */
static attnd_err slot_get(attnd_client *c, call_slot **out)
{
    call_slot *s;
    attnd_err rv;
    pthread_mutex_lock(&c->mu);
    if ((s = c->free_slots) != NULL) c->free_slots = s->next;
    pthread_mutex_unlock(&c->mu);
    if (s == NULL && (rv = slot_new(c, &s)) != ATTND_ERR_OK) return rv;
    pthread_mutex_lock(&c->mu);
    if (c->lost) {
        s->next = c->free_slots;
        c->free_slots = s;
        pthread_mutex_unlock(&c->mu);
        return ATTND_ERR_UNAVAILABLE;
    }
    busy_add(c, s);
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return ATTND_ERR_OK;
}

static void slot_put(attnd_client *c, call_slot *s)
{
    pthread_mutex_lock(&c->mu);
    busy_remove(s);
    s->next = c->free_slots;
    c->free_slots = s;
    pthread_mutex_unlock(&c->mu);
}

int attnd_client_is_lost(attnd_client *c)
{
    int lost;
    pthread_mutex_lock(&c->mu);
    lost = c->lost;
    pthread_mutex_unlock(&c->mu);
    return lost;
}

attnd_err attnd_client_fail_lost(attnd_client *c, const Attnd__Request *req)
{
    return attnd_client_fail(
        c, ATTND_ERR_UNAVAILABLE, "%s: connection to the daemon lost (session %llu is gone)",
        attnd_client_body_name(req->body_case), (unsigned long long)c->session);
}

/* A failed send or receive: a lost connection says so, whatever NNG reported. A reset or
 * closed connection is lost too (its session with it), even before the pipe callback ran. */
static attnd_err transport_fail(attnd_client *c, const Attnd__Request *req, const char *stage,
                                int rv)
{
    if (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECLOSED) {
        pthread_mutex_lock(&c->mu);
        c->lost = 1;
        pthread_mutex_unlock(&c->mu);
    }
    if (attnd_client_is_lost(c)) return attnd_client_fail_lost(c, req);
    return attnd_client_fail(c, attnd_err_from_nng(rv), "%s: %s: %s",
                             attnd_client_body_name(req->body_case), stage, nng_strerror(rv));
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What is left of a call's budget (timeout_ms < 0: no limit). */
static nng_duration remaining(int32_t timeout_ms, int64_t start)
{
    int64_t left;
    if (timeout_ms < 0) return NNG_DURATION_INFINITE;
    left = (int64_t)timeout_ms - (now_ms() - start);
    return left > 0 ? (nng_duration)left : 1;
}

/* A call's budget in ms (< 0: no limit). */
static int32_t call_timeout(attnd_client *c)
{
    int32_t timeout = atomic_load(&c->timeout_ms);
    return timeout == 0 ? ATTND_CLIENT_DEFAULT_TIMEOUT_MS : timeout;
}

/* Send the packed request on the slot's context and wait for the raw reply message. */
static attnd_err exchange(attnd_client *c, call_slot *s, const Attnd__Request *req, nng_msg **rep)
{
    int32_t timeout = call_timeout(c);
    int64_t start = now_ms();
    nng_msg *m;
    int rv;
    if ((rv = nng_msg_alloc(&m, attnd__request__get_packed_size(req))) != 0)
        return attnd_client_fail(c, attnd_err_from_nng(rv), "%s: %s",
                                 attnd_client_body_name(req->body_case), nng_strerror(rv));
    attnd__request__pack(req, nng_msg_body(m));
    nng_aio_set_msg(s->aio, m);
    nng_aio_set_timeout(s->aio, remaining(timeout, start));
    nng_ctx_send(s->ctx, s->aio);
    nng_aio_wait(s->aio);
    if ((rv = nng_aio_result(s->aio)) != 0) {
        nng_msg_free(nng_aio_get_msg(s->aio));
        return transport_fail(c, req, "send", rv);
    }
    if (attnd_client_is_lost(c)) return transport_fail(c, req, "no reply", NNG_ECLOSED);
    nng_aio_set_timeout(s->aio, remaining(timeout, start));
    nng_ctx_recv(s->ctx, s->aio);
    nng_aio_wait(s->aio);
    if ((rv = nng_aio_result(s->aio)) != 0) return transport_fail(c, req, "no reply", rv);
    *rep = nng_aio_get_msg(s->aio);
    return ATTND_ERR_OK;
}

/* Decode a reply and turn an error reply into its code and message. */
attnd_err attnd_client_decode(attnd_client *c, const Attnd__Request *req, const void *buf,
                              size_t len, Attnd__Reply **out)
{
    Attnd__Reply *rep = attnd__reply__unpack(NULL, len, buf);
    const char *what = attnd_client_body_name(req->body_case);
    attnd_err code;
    if (rep == NULL)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "%s: reply of %zu bytes does not decode",
                                 what, len);
    if (rep->id != req->id) {
        code = attnd_client_fail(c, ATTND_ERR_PROTOCOL, "%s: reply id %llu for request %llu", what,
                                 (unsigned long long)rep->id, (unsigned long long)req->id);
        attnd__reply__free_unpacked(rep, NULL);
        return code;
    }
    if (rep->code != 0) {
        code = (attnd_err)rep->code;
        if (rep->message != NULL && rep->message[0] != '\0')
            set_error(c, rep->message, 1);
        else
            set_error(c, attnd_strerror(code), 1);
        attnd__reply__free_unpacked(rep, NULL);
        return code;
    }
    *out = rep;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_rpc(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep)
{
    call_slot *s = NULL;
    nng_msg *m = NULL;
    attnd_err rv;
    *rep = NULL;
    if (!c->dialed)
        return attnd_client_fail(c, ATTND_ERR_UNAVAILABLE, "%s: not connected (dial first)",
                                 attnd_client_body_name(req->body_case));
    req->id = atomic_fetch_add(&c->next_id, 1);
    /* Hello and Status travel without a session (the contract's "0 for Hello and Status"). */
    if (req->body_case != ATTND__REQUEST__BODY_HELLO &&
        req->body_case != ATTND__REQUEST__BODY_STATUS)
        req->session = c->session;
    if (c->chan != NULL && !attnd_client_is_lost(c) &&
        attnd_client_chan_rpc(c, c->chan, req, call_timeout(c), &rv, rep))
        return rv;
    if ((rv = slot_get(c, &s)) == ATTND_ERR_UNAVAILABLE)
        return transport_fail(c, req, "lost", NNG_ECLOSED);
    if (rv != ATTND_ERR_OK)
        return attnd_client_fail(c, rv, "%s: cannot open a context",
                                 attnd_client_body_name(req->body_case));
    rv = exchange(c, s, req, &m);
    slot_put(c, s);
    if (rv != ATTND_ERR_OK) return rv;
    rv = attnd_client_decode(c, req, nng_msg_body(m), nng_msg_len(m), rep);
    nng_msg_free(m);
    return rv;
}

/* ---------------------------------------------------------------- Hello and Status */

void attnd_client_geometry_from_pb(attnd_geometry *g, const Attnd__Geometry *pb)
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
    copy_str(si.version, sizeof si.version, h->version);
    copy_str(si.backend, sizeof si.backend, h->backend);
    attnd_client_geometry_from_pb(&si.geometry, h->geometry);
    limits_from_pb(&si.limits, h->limits);
    si.blocks_free = h->blocks_free;
    attnd__reply__free_unpacked(rep, NULL);
    c->server = si;
    c->session = si.session;
    c->have_server = 1;
    if (info != NULL) *info = si;
    return ATTND_ERR_OK;
}

/* connect's channel: on failure the calls take the socket; the reason goes to chan_error, not
 * to last_error (the connect succeeded). */
static void connect_channel(attnd_client *c)
{
    char saved[sizeof c->last_error];
    int saved_remote;
    pthread_mutex_lock(&c->mu);
    copy_str(saved, sizeof saved, c->last_error);
    saved_remote = c->last_remote;
    pthread_mutex_unlock(&c->mu);
    if (attnd_client_chan_open(c, c->channel_slots, c->spin_us, &c->chan) == ATTND_ERR_OK) return;
    pthread_mutex_lock(&c->mu);
    copy_str(c->chan_error, sizeof c->chan_error, c->last_error);
    copy_str(c->last_error, sizeof c->last_error, saved);
    c->last_remote = saved_remote;
    pthread_mutex_unlock(&c->mu);
}

attnd_err attnd_client_connect(attnd_client *c, const char *url, attnd_server_info *info)
{
    attnd_err rv;
    if ((rv = attnd_client_dial(c, url)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_client_hello(c, info)) != ATTND_ERR_OK) return rv;
    if (strncmp(url, "ipc://", 6) == 0 && c->channel_slots >= 0) connect_channel(c);
    return ATTND_ERR_OK;
}

void attnd_client_shm_share(const attnd_client *c, int fd)
{
    /* EPERM when we are not in that group: the object keeps our group, as before */
    if (c->ipc_gid >= 0 && (gid_t)c->ipc_gid != getegid())
        (void)!fchown(fd, (uid_t)-1, (gid_t)c->ipc_gid);
}

/* ---------------------------------------------------------------- channel */

attnd_err attnd_client_channel_open(attnd_client *c, int32_t slots)
{
    attnd_client_chan *ch;
    attnd_err rv;
    if (attnd_client_chan_active(c->chan))
        return attnd_client_fail(c, ATTND_ERR_ALREADY_EXISTS, "channel: already open");
    if ((rv = attnd_client_chan_open(c, slots, c->spin_us, &ch)) != ATTND_ERR_OK) return rv;
    /* one the daemon closed: unmap it now */
    attnd_client_chan_close(c, c->chan, 0);
    c->chan = ch;
    c->chan_error[0] = '\0';
    return ATTND_ERR_OK;
}

attnd_err attnd_client_channel_close(attnd_client *c)
{
    attnd_client_chan *ch = c->chan;
    c->chan = NULL;
    return attnd_client_chan_close(c, ch, !attnd_client_is_lost(c));
}

int attnd_client_channel_active(const attnd_client *c)
{
    return attnd_client_chan_active(c->chan);
}

const char *attnd_client_channel_error(const attnd_client *c)
{
    return c->chan_error;
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
    copy_str(st->version, sizeof st->version, s->version);
    copy_str(st->backend, sizeof st->backend, s->backend);
    attnd_client_geometry_from_pb(&st->geometry, s->geometry);
    st->blocks_free = s->blocks_free;
    st->num_sequences = s->num_sequences;
    st->num_sessions = s->num_sessions;
    st->requests = s->requests;
    st->errors = s->errors;
    st->uptime_s = s->uptime_s;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}
