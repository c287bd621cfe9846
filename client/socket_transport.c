/* The NNG REQ socket transport (socket_transport.h). */
#include "socket_transport.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "attnd/clock.h"
#include "attnd_nng_err.h"

/* One call: its own REQ context and aio. Idle slots wait in free_slots; in-flight ones sit in
 * busy, where a dropped connection cancels them. */
typedef struct call_slot {
    nng_ctx ctx;
    nng_aio *aio;
    struct call_slot *next, **prevp;
} call_slot;

struct attnd_client_socket {
    nng_socket sock;
    pthread_mutex_t mu; /* guards free_slots, busy and lost */
    call_slot *free_slots, *busy;
    int lost;    /* the connection dropped: the session is gone, every call fails */
    int closing; /* socket_free began: lost_cb is not called any more */
    attnd_client_socket_lost_cb lost_cb;
    void *lost_arg;
};

/* The connection dropped (the daemon exited or closed it): the session died with it, so fail
 * the calls in flight now and every later one, rather than let REQ redial and resend. */
static void socket_pipe_removed_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    attnd_client_socket *s = arg;
    (void)p;
    (void)ev;
    pthread_mutex_lock(&s->mu);
    s->lost = 1;
    for (call_slot *slot = s->busy; slot != NULL; slot = slot->next)
        nng_aio_cancel(slot->aio);
    /* under mu, so that socket_free cannot run past it while the owner is told */
    if (!s->closing && s->lost_cb != NULL) s->lost_cb(s->lost_arg);
    pthread_mutex_unlock(&s->mu);
}

attnd_err attnd_client_socket_alloc(attnd_client_socket **out, attnd_client_socket_lost_cb lost,
                                    void *arg)
{
    attnd_client_socket *s = calloc(1, sizeof *s);
    int rv;
    *out = NULL;
    if (s == NULL) return ATTND_ERR_NO_MEMORY;
    s->lost_cb = lost;
    s->lost_arg = arg;
    pthread_mutex_init(&s->mu, NULL);
    if ((rv = nng_req0_open(&s->sock)) != 0) goto fail;
    /* Requests are not idempotent: never resend one. Replies may carry large inline outputs. */
    if ((rv = nng_socket_set_ms(s->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 0)) != 0 ||
        (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, socket_pipe_removed_cb, s)) != 0) {
        nng_close(s->sock);
        goto fail;
    }
    *out = s;
    return ATTND_ERR_OK;
fail:
    pthread_mutex_destroy(&s->mu);
    free(s);
    return attnd_err_from_nng(rv);
}

static void socket_free(void *self)
{
    attnd_client_socket *s = self;
    if (s == NULL) return;
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_mutex_unlock(&s->mu);
    while (s->free_slots != NULL) {
        call_slot *slot = s->free_slots;
        s->free_slots = slot->next;
        nng_aio_free(slot->aio);
        nng_ctx_close(slot->ctx);
        free(slot);
    }
    nng_close(s->sock);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* TLS settings of a tls+tcp:// dialer: the CA that must have signed the daemon's certificate. */
static int dialer_tls(nng_dialer d, const char *url, const char *ca_file, const char *server_name)
{
    int rv;
    if (strncmp(url, "tls+", 4) != 0) return 0;
    if (ca_file[0] == '\0') return NNG_EINVAL;
    if ((rv = nng_dialer_set_string(d, NNG_OPT_TLS_CA_FILE, ca_file)) != 0) return rv;
    if (server_name[0] != '\0') rv = nng_dialer_set_string(d, NNG_OPT_TLS_SERVER_NAME, server_name);
    return rv;
}

attnd_err attnd_client_socket_dial(attnd_client_socket *s, const char *url, const char *ca_file,
                                   const char *server_name, char *err, size_t errlen)
{
    nng_dialer d;
    int rv;
    if ((rv = nng_dialer_create(&d, s->sock, url)) != 0)
        return attnd_errf(err, errlen, attnd_err_from_nng(rv), "%s", nng_strerror(rv));
    if ((rv = dialer_tls(d, url, ca_file, server_name)) != 0) {
        nng_dialer_close(d);
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "TLS: %s",
                          rv == NNG_EINVAL && ca_file[0] == '\0' ? "tls_ca_file is required"
                                                                 : nng_strerror(rv));
    }
    if ((rv = nng_dialer_start(d, 0)) != 0) {
        nng_dialer_close(d);
        return attnd_errf(err, errlen, attnd_err_from_nng(rv), "%s", nng_strerror(rv));
    }
    return ATTND_ERR_OK;
}

static int socket_active(const void *self)
{
    attnd_client_socket *s = (attnd_client_socket *)self; /* the lock is not logical state */
    int lost;
    pthread_mutex_lock(&s->mu);
    lost = s->lost;
    pthread_mutex_unlock(&s->mu);
    return !lost;
}

/* ---------------------------------------------------------------- call slots */

static void busy_add(attnd_client_socket *s, call_slot *slot)
{
    slot->next = s->busy;
    slot->prevp = &s->busy;
    if (s->busy != NULL) s->busy->prevp = &slot->next;
    s->busy = slot;
}

static void busy_remove(call_slot *slot)
{
    *slot->prevp = slot->next;
    if (slot->next != NULL) slot->next->prevp = slot->prevp;
}

static int slot_new(attnd_client_socket *s, call_slot **out)
{
    call_slot *slot = calloc(1, sizeof *slot);
    int rv;
    if (slot == NULL) return NNG_ENOMEM;
    if ((rv = nng_aio_alloc(&slot->aio, NULL, NULL)) != 0) {
        free(slot);
        return rv;
    }
    if ((rv = nng_ctx_open(&slot->ctx, s->sock)) != 0) {
        nng_aio_free(slot->aio);
        free(slot);
        return rv;
    }
    *out = slot;
    return 0;
}

/* A slot for one call, registered as in flight; NNG_ECLOSED once the connection is lost. */
static int slot_get(attnd_client_socket *s, call_slot **out)
{
    call_slot *slot;
    int rv;
    pthread_mutex_lock(&s->mu);
    if ((slot = s->free_slots) != NULL) s->free_slots = slot->next;
    pthread_mutex_unlock(&s->mu);
    if (slot == NULL && (rv = slot_new(s, &slot)) != 0) return rv;
    pthread_mutex_lock(&s->mu);
    if (s->lost) {
        slot->next = s->free_slots;
        s->free_slots = slot;
        pthread_mutex_unlock(&s->mu);
        return NNG_ECLOSED;
    }
    busy_add(s, slot);
    pthread_mutex_unlock(&s->mu);
    *out = slot;
    return 0;
}

static void slot_put(attnd_client_socket *s, call_slot *slot)
{
    pthread_mutex_lock(&s->mu);
    busy_remove(slot);
    slot->next = s->free_slots;
    s->free_slots = slot;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- one call */

/* A failed send or receive: a lost connection says so, whatever NNG reported. A reset or
 * closed connection is lost too (its session with it), even before the pipe callback ran. */
static attnd_err socket_fail(attnd_client_socket *s, attnd_client_transport_call *call,
                             const char *stage, int rv)
{
    if (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT || rv == NNG_ECLOSED) {
        pthread_mutex_lock(&s->mu);
        s->lost = 1;
        pthread_mutex_unlock(&s->mu);
    }
    if (!socket_active(s)) {
        call->lost = 1;
        return ATTND_ERR_UNAVAILABLE;
    }
    return attnd_errf(call->err, call->err_cap, attnd_err_from_nng(rv), "%s: %s", stage,
                      nng_strerror(rv));
}

/* What is left of a call's budget (timeout_ms < 0: no limit). */
static nng_duration remaining(int32_t timeout_ms, uint64_t start)
{
    int64_t left;
    if (timeout_ms < 0) return NNG_DURATION_INFINITE;
    left = (int64_t)timeout_ms - (int64_t)(attnd_clock_ms() - start);
    return left > 0 ? (nng_duration)left : 1;
}

/* Send the packed request on the slot's context and wait for the raw reply message. */
static attnd_err exchange(attnd_client_socket *s, call_slot *slot,
                          attnd_client_transport_call *call, nng_msg **rep)
{
    uint64_t start = attnd_clock_ms();
    nng_msg *m;
    int rv;
    if ((rv = nng_msg_alloc(&m, call->req_len)) != 0)
        return attnd_errf(call->err, call->err_cap, attnd_err_from_nng(rv), "%s", nng_strerror(rv));
    attnd__request__pack(call->req, nng_msg_body(m));
    nng_aio_set_msg(slot->aio, m);
    nng_aio_set_timeout(slot->aio, remaining(call->timeout_ms, start));
    nng_ctx_send(slot->ctx, slot->aio);
    nng_aio_wait(slot->aio);
    if ((rv = nng_aio_result(slot->aio)) != 0) {
        nng_msg_free(nng_aio_get_msg(slot->aio));
        return socket_fail(s, call, "send", rv);
    }
    if (!socket_active(s)) return socket_fail(s, call, "no reply", NNG_ECLOSED);
    nng_aio_set_timeout(slot->aio, remaining(call->timeout_ms, start));
    nng_ctx_recv(slot->ctx, slot->aio);
    nng_aio_wait(slot->aio);
    if ((rv = nng_aio_result(slot->aio)) != 0) return socket_fail(s, call, "no reply", rv);
    *rep = nng_aio_get_msg(slot->aio);
    return ATTND_ERR_OK;
}

static int socket_call(void *self, attnd_client_transport_call *call)
{
    attnd_client_socket *s = self;
    call_slot *slot = NULL;
    nng_msg *m = NULL;
    int rv;
    if ((rv = slot_get(s, &slot)) == NNG_ECLOSED) {
        call->rv = socket_fail(s, call, "lost", rv);
        return 1;
    }
    if (rv != 0) {
        call->rv =
            attnd_errf(call->err, call->err_cap, attnd_err_from_nng(rv), "cannot open a context");
        return 1;
    }
    call->rv = exchange(s, slot, call, &m);
    slot_put(s, slot);
    if (call->rv != ATTND_ERR_OK) return 1;
    call->reply_cb(call->reply_arg, nng_msg_body(m), nng_msg_len(m));
    nng_msg_free(m);
    return 1;
}

const attnd_client_transport_ops attnd_client_socket_transport = {
    .call = socket_call,
    .active = socket_active,
    .free = socket_free,
};
