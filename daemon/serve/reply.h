/* A reply being built: the wire Reply and the storage its sub-messages point to, filled by one
 * handler (serve/req_*.c) and sent by the wire once (now, or when its kernels pass:
 * serve/inflight.h). Also the two steps every tensor-taking handler shares: a per-request handle
 * context under the INLINE budget, and references resolved with the error in the reply. */
#ifndef ATTND_SERVE_REPLY_H
#define ATTND_SERVE_REPLY_H

#include <stdint.h>

#include "../state/handles.h"
#include "../state/session.h"
#include "../state/step.h"
#include "attnd.pb-c.h"
#include "attnd/err.h"

struct attnd_reply;
/* Where a held reply goes once its owner answered it. */
typedef void (*attnd_reply_done_fn)(void *arg, struct attnd_reply *r);

typedef struct attnd_reply {
    Attnd__Reply reply;
    char msg[512];
    Attnd__HelloReply hello;
    Attnd__Geometry geometry;
    Attnd__LayerOptions *layer_items; /* heap: geometry.layers */
    Attnd__LayerOptions **layer_ptrs; /* heap */
    Attnd__Limits limits;
    Attnd__SequenceInfo seq;
    Attnd__SequenceList seqs;
    Attnd__SequenceInfo *seq_items; /* heap */
    Attnd__SequenceInfo **seq_ptrs; /* heap */
    Attnd__BeginStepReply step;
    Attnd__InlineOutputs outputs;
    ProtobufCBinaryData out_data[ATTND_HANDLES_MAX_OUT]; /* heap data */
    Attnd__StatusReply status;
    Attnd__OpenChannelReply channel;
    Attnd__OpenStreamReply stream;
    /* Set by a handler whose kernels still run and whose reply needs nothing else from the
     * host: the reply waits for wait.fence (serve/inflight.h) instead of leaving now. */
    attnd_kernel_wait wait;
    /* A reply its handler holds (held 1): a stream channel answers it later (serve/req_stream.c)
     * through hold_done(hold_arg, r), which the wire's handler sets before dispatch (NULL: this
     * caller cannot wait, and no handler holds the reply). */
    attnd_reply_done_fn hold_done;
    void *hold_arg;
    int held;
} attnd_reply;

void attnd_reply_init(attnd_reply *r, uint64_t id);
/* Free what the reply owns (lists, step offsets, INLINE outputs). */
void attnd_reply_fini(attnd_reply *r);

/* Set r's code (its message already written); returns code. */
static inline attnd_err attnd_reply_code(attnd_reply *r, attnd_err code)
{
    r->reply.code = (uint32_t)code;
    return code;
}
/* Set r's code and message (printf); evaluates to code. r is evaluated twice. */
#define attnd_reply_fail(r, code, ...)                                                             \
    attnd_reply_code((r), attnd_errf((r)->msg, sizeof((r)->msg), (code), __VA_ARGS__))

/* A BeginStepReply for st (its id, token count and row offsets) as r's body. */
attnd_err attnd_reply_step(const attnd_step *st, attnd_reply *r);
/* Move hr's INLINE outputs into the reply (body outputs), in the order they were resolved. */
void attnd_reply_take_outputs(attnd_reply *r, attnd_handles_req *hr);
/* Start a per-request handle context over s's regions; INVALID_ARGUMENT when the INLINE input
 * bytes of refs exceed max_inline_bytes. */
attnd_err attnd_reply_handles_begin(attnd_reply *r, attnd_handles_req *hr, const attnd_session *s,
                                    uint64_t max_inline_bytes, const Attnd__TensorRef *const *refs,
                                    size_t nrefs);
/* Resolve a reference; on error the reply carries it. */
attnd_err attnd_reply_resolve(attnd_reply *r, attnd_handles_req *hr, const Attnd__TensorRef *ref,
                              const attnd_tref_spec *spec, attnd_tensor *t);

#endif
