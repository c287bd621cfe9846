/* Stream requests: OpenStream, StreamBegin, StreamEnd, CloseStream (the channels and their
 * protocol: state/stream.h, state/stream_fsm.h). A StreamEnd whose step is still running is held
 * and answered by the channel later (attnd_serve_stream_reply). */
#include <stdlib.h>

#include "handler.h"
#include "reply.h"
#include "serve.h"

void attnd_serve_stream_reply(void *arg, void *owed, attnd_err code, const char *msg)
{
    attnd_reply *r = owed;
    (void)arg;
    attnd_errf(r->msg, sizeof r->msg, code, "%s", code == ATTND_ERR_OK ? "" : msg);
    attnd_reply_code(r, code);
    r->held = 0;
    r->hold_done(r->hold_arg, r);
}

/* Tensors of a stream step live in registered regions: never INLINE (the step outlives the
 * message), never host memory on a device backend (nothing stages them on the stream). */
static attnd_err stream_refs_check(attnd_serve *sv, const Attnd__TensorRef *const *refs, size_t n,
                                   const char *const *names, attnd_reply *r)
{
    for (size_t i = 0; i < n; i++)
        if (refs[i] != NULL && refs[i]->region == 0)
            return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                    "%s: INLINE is not taken by stream steps (use a region)",
                                    names[i]);
    (void)sv;
    return ATTND_ERR_OK;
}

static attnd_err stream_host_check(attnd_serve *sv, const attnd_handles_req *hr, attnd_reply *r)
{
    if (hr->nhost == 0 || !attnd_backend_is_device(sv->be)) return ATTND_ERR_OK;
    return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                            "stream: tensors and flags must be device memory (CUDA_IPC regions) "
                            "on a %s daemon",
                            attnd_backend_name(sv->be));
}

static attnd_err req_open(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__OpenStream *m = c->req->open_stream;
    const attnd_tref_spec spec = {"o_flags", ATTND_DT(I32), 1, {sv->model.geo.num_layers}, 1, 0, 0};
    const Attnd__TensorRef *refs[] = {m->o_flags};
    const char *names[] = {"o_flags"};
    attnd_handles_req hr;
    attnd_stream_chan *ch;
    attnd_tensor t;
    attnd_err rv;
    if ((rv = stream_refs_check(sv, refs, 1, names, r))) return rv;
    if ((rv = attnd_reply_handles_begin(r, &hr, c->s, 0, refs, 1))) return rv;
    if ((rv = attnd_reply_resolve(r, &hr, m->o_flags, &spec, &t)) == ATTND_ERR_OK &&
        (rv = stream_host_check(sv, &hr, r)) == ATTND_ERR_OK)
        rv = attnd_reply_code(r, attnd_stream_open(&sv->streams, c->s, t.data, m->o_flags->region,
                                                   &ch, r->msg, sizeof r->msg));
    attnd_handles_req_fini(&hr);
    if (rv != ATTND_ERR_OK) return rv;
    Attnd__OpenStreamReply *o = &r->stream;
    attnd__open_stream_reply__init(o);
    o->stream = ch->id;
    o->num_layers = ch->layers;
    o->qkv_bytes = ch->qkv_bytes;
    o->timeout_ms = (uint32_t)sv->streams.t.step_ms;
    o->qkv_shm_name = ch->shm_name;
    if (attnd_backend_is_device(sv->be)) {
        o->qkv_ipc_handle.data = ch->ipc_handle;
        o->qkv_ipc_handle.len = sizeof ch->ipc_handle;
    }
    r->reply.body_case = ATTND__REPLY__BODY_STREAM;
    r->reply.stream = o;
    return ATTND_ERR_OK;
}

static attnd_err stream_find(attnd_serve *sv, const attnd_req_ctx *c, uint32_t id,
                             attnd_stream_chan **ch, attnd_reply *r)
{
    return attnd_reply_code(
        r, attnd_stream_find(&sv->streams, c->s->id, id, ch, r->msg, sizeof r->msg));
}

/* One StreamLayer's tensors for a step of T rows, in a handle context of its own (layers may
 * share buffers with each other, never within one). */
static attnd_err layer_resolve(attnd_serve *sv, const attnd_req_ctx *c, const Attnd__StreamLayer *m,
                               int64_t T, attnd_attend_io *io, attnd_reply *r)
{
    int64_t Hq = sv->model.geo.num_q_heads, Hk = sv->model.geo.num_kv_heads;
    int64_t D = sv->model.geo.head_size;
    const attnd_tref_spec sp[] = {
        {"q", ATTND_DT_FLOAT, 3, {T, Hq, D}, 0, 0, 0},
        {"k_new", ATTND_DT_FLOAT, 3, {T, Hk, D}, 0, 0, 0},
        {"v_new", ATTND_DT_FLOAT, 3, {T, Hk, D}, 0, 0, 0},
        {"out", ATTND_DT_FLOAT, 3, {T, Hq, D}, 1, 0, 0},
        {"out_lse", ATTND_DT(F32), 2, {Hq, T}, 1, 1, 0},
    };
    const Attnd__TensorRef *refs[] = {m->q, m->k_new, m->v_new, m->out, m->out_lse};
    const char *names[] = {"q", "k_new", "v_new", "out", "out_lse"};
    attnd_tensor *ts[] = {&io->q, &io->k, &io->v, &io->out, &io->lse};
    attnd_handles_req hr;
    attnd_err rv;
    if ((rv = stream_refs_check(sv, refs, 5, names, r))) return rv;
    if ((rv = attnd_reply_handles_begin(r, &hr, c->s, 0, refs, 5))) return rv;
    for (int i = 0; i < 5 && rv == ATTND_ERR_OK; i++)
        rv = attnd_reply_resolve(r, &hr, refs[i], &sp[i], ts[i]);
    if (rv == ATTND_ERR_OK) rv = stream_host_check(sv, &hr, r);
    attnd_handles_req_fini(&hr);
    return rv;
}

/* The step's sequences, checked against the limits; T their new tokens (the rows of every
 * tensor). NULL with the error in r. */
static attnd_step_req *begin_seqs(attnd_serve *sv, const attnd_req_ctx *c,
                                  const Attnd__StreamBegin *m, int64_t *T, attnd_reply *r)
{
    attnd_step_req *seqs;
    uint64_t total = 0;
    if (m->n_seqs == 0) {
        attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seqs: empty");
        return NULL;
    }
    if (m->n_seqs > sv->limits.max_seqs) {
        attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                         "seqs: %zu entries, over limits.max_seqs (%u)", m->n_seqs,
                         sv->limits.max_seqs);
        return NULL;
    }
    if (c->s->nsteps >= sv->limits.max_steps) {
        attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE, "step: session has limits.max_steps (%u) open",
                         sv->limits.max_steps);
        return NULL;
    }
    for (size_t i = 0; i < m->n_seqs; i++)
        total += m->seqs[i]->new_tokens;
    if (total == 0 || total > sv->limits.max_step_tokens) {
        attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                         "seqs: %llu new tokens (1 to limits.max_step_tokens, %u)",
                         (unsigned long long)total, sv->limits.max_step_tokens);
        return NULL;
    }
    if ((seqs = malloc(m->n_seqs * sizeof *seqs)) == NULL) {
        attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < m->n_seqs; i++)
        seqs[i] = (attnd_step_req){m->seqs[i]->seq_id, m->seqs[i]->new_tokens};
    *T = (int64_t)total;
    return seqs;
}

static attnd_err begin_layers(attnd_serve *sv, const attnd_req_ctx *c, const Attnd__StreamBegin *m,
                              int64_t T, attnd_attend_io *io, attnd_reply *r)
{
    uint32_t L = sv->model.geo.num_layers;
    if (m->n_layers != 1 && m->n_layers != L)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "layers: %zu entries (1 for every layer, or %u: one per layer)",
                                m->n_layers, L);
    for (size_t l = 0; l < m->n_layers; l++) {
        attnd_err rv = layer_resolve(sv, c, m->layers[l], T, &io[l], r);
        if (rv != ATTND_ERR_OK) {
            if (m->n_layers > 1) {
                char inner[sizeof r->msg];
                snprintf(inner, sizeof inner, "%s", r->msg);
                attnd_reply_fail(r, rv, "layers[%zu].%s", l, inner);
            }
            return rv;
        }
    }
    return ATTND_ERR_OK;
}

static attnd_err req_begin(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__StreamBegin *m = c->req->stream_begin;
    attnd_stream_chan *ch;
    attnd_attend_io *io = NULL;
    attnd_step_req *seqs;
    attnd_step *st;
    int64_t T = 0;
    attnd_err rv;
    if ((rv = stream_find(sv, c, m->stream, &ch, r))) return rv;
    if ((seqs = begin_seqs(sv, c, m, &T, r)) == NULL) return (attnd_err)r->reply.code;
    if ((io = calloc(m->n_layers ? m->n_layers : 1, sizeof *io)) == NULL) {
        free(seqs);
        return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
    }
    if ((rv = begin_layers(sv, c, m, T, io, r)) == ATTND_ERR_OK)
        rv = attnd_reply_code(r, attnd_stream_begin(&sv->streams, ch, seqs, (uint32_t)m->n_seqs,
                                                    sv->limits.max_step_tokens, io,
                                                    (uint32_t)m->n_layers, &st, r->msg,
                                                    sizeof r->msg));
    free(seqs);
    free(io);
    if (rv != ATTND_ERR_OK) return rv;
    return attnd_reply_step(st, r); /* no memory for the offsets: the step runs, the client
                                       learns of an error and aborts it */
}

static attnd_err req_end(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__StreamEnd *m = c->req->stream_end;
    attnd_stream_chan *ch;
    int taken = 0;
    attnd_err rv;
    if ((rv = stream_find(sv, c, m->stream, &ch, r))) return rv;
    if (r->hold_done == NULL)
        return attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE, "stream_end: this caller cannot wait");
    rv = attnd_stream_end(&sv->streams, ch, m->step, m->abort, r, &taken, r->msg, sizeof r->msg);
    r->held = taken;
    return attnd_reply_code(r, rv);
}

static attnd_err req_close(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    attnd_stream_chan *ch;
    attnd_err rv = stream_find(sv, c, c->req->close_stream->stream, &ch, r);
    if (rv == ATTND_ERR_OK) attnd_stream_close(&sv->streams, ch);
    return rv;
}

static const attnd_req_entry stream_entries[] = {
    {ATTND__REQUEST__BODY_OPEN_STREAM, "open_stream", req_open,
     ATTND_REQ_SESSION | ATTND_REQ_DEVICE},
    {ATTND__REQUEST__BODY_STREAM_BEGIN, "stream_begin", req_begin,
     ATTND_REQ_SESSION | ATTND_REQ_DEVICE},
    {ATTND__REQUEST__BODY_STREAM_END, "stream_end", req_end, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_CLOSE_STREAM, "close_stream", req_close, ATTND_REQ_SESSION},
};

const attnd_req_table attnd_req_stream = {stream_entries,
                                          sizeof stream_entries / sizeof stream_entries[0]};
