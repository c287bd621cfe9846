/* daemon/wire: how requests arrive and replies leave. Transports (wire/socket.c: the NNG REP
 * socket; wire/channel_transport.c: same-host shared-memory channels) move bytes; this module
 * is what they share, written once: decoding a Request (unknown fields refused), packing a
 * Reply with the "exactly one reply" fallbacks, and counting requests and replies.
 *
 * A transport is the table below plus its own constructor. It hands each decoded request up
 * through the one handler it was given (attnd_wire_handler: the request callback and the
 * connection-gone callback); it never calls the layer above any other way. Every received
 * message is answered exactly once, by attnd_wire_reply or attnd_wire_fail on its call. */
#ifndef ATTND_WIRE_WIRE_H
#define ATTND_WIRE_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/log.h"
#include "../obs/metrics.h"
#include "../obs/observe.h"
#include "attnd.pb-c.h"
#include "attnd/err.h"

typedef struct attnd_wire attnd_wire;
typedef struct attnd_wire_call attnd_wire_call;

/* A transport's side of one call's reply (wire.c packs, falls back and counts). */
typedef struct attnd_transport_ops {
    /* Largest packed reply the call can carry (SIZE_MAX: no limit of its own). */
    size_t (*reply_cap)(attnd_wire_call *c);
    /* A buffer for n bytes of packed reply, or NULL when there is no memory for it. */
    void *(*reply_buf)(attnd_wire_call *c, size_t n);
    /* Send the n packed bytes in buf (from reply_buf; the transport takes it back). */
    void (*reply_send)(attnd_wire_call *c, void *buf, size_t n);
    /* Not even a small error reply could be had: the call ends unanswered. */
    void (*reply_drop)(attnd_wire_call *c);
    /* A Hello succeeded on the call's connection (its reply is about to go out); NULL = the
     * transport carries no Hello. */
    void (*hello_ok)(attnd_wire_call *c);
} attnd_transport_ops;

/* One received request until its reply leaves; the first member of a transport's own record. */
struct attnd_wire_call {
    const attnd_transport_ops *ops;
    attnd_wire *wire;
    attnd_metrics_req req_type; /* for the request counters */
    uint64_t t_recv_ns;         /* for the latency histogram */
};

/* The layer above: what a transport calls, and nothing else. */
typedef struct attnd_wire_handler {
    void *arg;
    /* A decoded request from connection pipe (0: already gone), queued for age_ms (executor
     * thread). req is freed when this returns; the handler answers c (now or later) with
     * attnd_wire_reply. */
    void (*request)(void *arg, attnd_wire_call *c, const Attnd__Request *req, uint32_t pipe,
                    uint64_t age_ms);
    /* Connection pipe dropped (executor thread). */
    void (*pipe_closed)(void *arg, uint32_t pipe);
} attnd_wire_handler;

/* Fields and repeated elements one request may decode into when nothing set another bound
 * (attnd_wire_decode; the daemon's follows limits.max_seqs: attnd_wire_set_max_elements). */
#define ATTND_WIRE_MAX_ELEMENTS_DEFAULT (8u * 256u + 65536u)

struct attnd_wire {
    attnd_log *log;
    attnd_wire_handler handler;
    attnd_observe *obs;                       /* metrics and log rate limiting; NULL = none */
    atomic_uint busy;                         /* requests received and not answered yet */
    atomic_uint_fast64_t replies, replies_ok; /* sent, and those with code OK */
    atomic_uint max_elements;                 /* the decode bound transports apply */
};

void attnd_wire_init(attnd_wire *w, const attnd_wire_handler *handler, attnd_log *lg);
/* Count requests, latency, bytes in obs's metrics and rate-limit the error log lines through it
 * (before any transport starts; obs outlives the wire). */
void attnd_wire_set_observe(attnd_wire *w, attnd_observe *obs);
/* Requests received and not yet answered. */
uint32_t attnd_wire_busy(attnd_wire *w);
/* Replies sent in all, and those with code OK. */
void attnd_wire_counts(attnd_wire *w, uint64_t *replies, uint64_t *ok);

/* Bound the fields and repeated elements a request may decode into (any thread; the next
 * message decoded sees it). */
void attnd_wire_set_max_elements(attnd_wire *w, uint32_t max_elements);
uint32_t attnd_wire_max_elements(attnd_wire *w);

/* The decode step of every received message, apart so tests and fuzzers share it: the
 * Request, or NULL with *code (PROTOCOL) and a message; *id is the request's id when it
 * decoded or only its size was refused (0 otherwise). The fields and repeated elements (packed ones
 * too, unknown fields too) are counted on the bytes first, and a message of more than max_elements
 * is refused before protobuf-c allocates anything for it: 2 bytes on the wire can decode into a
 * 60-byte struct. A Request with unknown fields anywhere is refused. */
Attnd__Request *attnd_wire_decode_max(const void *buf, size_t len, uint32_t max_elements,
                                      uint64_t *id, attnd_err *code, char *msg, size_t n);
/* attnd_wire_decode_max with ATTND_WIRE_MAX_ELEMENTS_DEFAULT. */
Attnd__Request *attnd_wire_decode(const void *buf, size_t len, uint64_t *id, attnd_err *code,
                                  char *msg, size_t n);

/* A message of len bytes arrived for call c of a transport with ops: counted in flight until
 * its reply is counted. */
void attnd_wire_received(attnd_wire *w, attnd_wire_call *c, const attnd_transport_ops *ops,
                         size_t len);
/* Hand a decoded request up (the handler answers it); frees req. */
void attnd_wire_deliver(attnd_wire_call *c, Attnd__Request *req, uint32_t pipe, uint64_t age_ms);
/* Pack and send rep as c's reply, and count it. A reply over the transport's cap becomes a
 * small INTERNAL error saying so, one that cannot be allocated a small NO_MEMORY one (the
 * request ran: the client must not resend it blindly); with no memory even for that, the call
 * is dropped (logged, counted) and its client times out. */
void attnd_wire_reply(attnd_wire_call *c, const Attnd__Reply *rep);
/* Answer c with an error before it reached the handler (undecodable, refused, queue full),
 * logged at a limited rate. */
void attnd_wire_fail(attnd_wire_call *c, uint64_t id, attnd_err code, const char *msg);
/* The transport finished with a call (its reply went out or was dropped): no longer busy. */
void attnd_wire_done(attnd_wire *w);

#endif
