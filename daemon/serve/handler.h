/* A request handler and its table entry. Each serve/req_*.c exports one table of entries
 * {body, name, fn, flags} for one kind of request (session, sequence, step, tensor, channel);
 * serve/dispatch.c finds the entry by body and applies the flags in one place. */
#ifndef ATTND_SERVE_HANDLER_H
#define ATTND_SERVE_HANDLER_H

#include <stddef.h>
#include <stdint.h>

#include "../state/session.h"
#include "attnd.pb-c.h"
#include "attnd/err.h"

struct attnd_serve;
struct attnd_reply;

enum {
    ATTND_REQ_SESSION = 1u << 0, /* needs the request's session (bound to its connection) */
    ATTND_REQ_DEVICE = 1u << 1,  /* launches kernels or copies device memory: refused once the
                                    device failed */
    ATTND_REQ_TIMED = 1u << 2,   /* the handler's time is kernel time (kind "other") */
};

/* What a handler is called with. */
typedef struct attnd_req_ctx {
    const Attnd__Request *req;
    attnd_session *s; /* with ATTND_REQ_SESSION; NULL otherwise */
    uint32_t pipe;    /* the connection; 0 when it is already gone */
} attnd_req_ctx;

/* Validate the whole request before touching memory; fill r (attnd_reply_fail names the field
 * on error); return the code. */
typedef attnd_err (*attnd_req_fn)(struct attnd_serve *sv, const attnd_req_ctx *c,
                                  struct attnd_reply *r);

typedef struct attnd_req_entry {
    Attnd__Request__BodyCase body;
    const char *name; /* for logs */
    attnd_req_fn fn;
    unsigned flags; /* ATTND_REQ_* */
} attnd_req_entry;

typedef struct attnd_req_table {
    const attnd_req_entry *entries;
    size_t n;
} attnd_req_table;

extern const attnd_req_table attnd_req_session;  /* Hello, Status, (Un)RegisterRegion */
extern const attnd_req_table attnd_req_sequence; /* Create, Fork, Free, Query, List */
extern const attnd_req_table attnd_req_step;     /* BeginStep, Attend, EndStep */
extern const attnd_req_table attnd_req_tensor;   /* merge, varlen, block-sparse, linear */
extern const attnd_req_table attnd_req_channel;  /* Open/Close/WakeChannel */
extern const attnd_req_table attnd_req_stream;   /* OpenStream, StreamBegin/End, CloseStream */

#endif
