/* The one interface every client transport implements (the NNG socket, socket.h; the
 * shared-memory channel, channel.h): carry one packed request, hand its reply to a callback,
 * report whether it is usable, free it. A transport never calls back into the client that owns
 * it except through the callbacks it was given (as NNG's transport.h: no recursive entry). */
#ifndef ATTND_CLIENT_TRANSPORT_H
#define ATTND_CLIENT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "attnd.pb-c.h"
#include "attnd/err.h"

/* Receives the reply bytes of a call (valid only during the callback) and keeps what it makes
 * of them: decoding is the caller's business, not the transport's. */
typedef void (*attnd_client_reply_cb)(void *arg, const void *buf, size_t len);

/* One request on its way: filled by the caller, the result (rv, err, lost) by the transport. */
typedef struct attnd_client_transport_call {
    const Attnd__Request *req; /* id and session stamped */
    size_t req_len;            /* attnd__request__get_packed_size(req) */
    int32_t timeout_ms;        /* budget of the whole call; < 0: none */
    attnd_client_reply_cb reply_cb;
    void *reply_arg;
    attnd_err rv; /* OK once reply_cb had the reply; else the transport's failure */
    char *err;    /* the failure's message, without the request's name */
    size_t err_cap;
    int lost; /* the failure is the lost connection (err then says nothing) */
} attnd_client_transport_call;

/* A transport's operations (self is the transport object its constructor made). */
typedef struct attnd_client_transport_ops {
    /* Carry call->req: 0 when this transport declines it, having done nothing (another must
     * carry it); 1 when it carried it, call->rv its result. */
    int (*call)(void *self, attnd_client_transport_call *call);
    /* 1 while the transport can carry requests. */
    int (*active)(const void *self);
    /* Release everything (no call may be using self; NULL is ignored). */
    void (*free)(void *self);
} attnd_client_transport_ops;

/* A transport object with its operations. */
typedef struct attnd_client_transport {
    const attnd_client_transport_ops *ops;
    void *self;
} attnd_client_transport;

#endif
