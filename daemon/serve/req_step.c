/* Step requests: BeginStep, Attend, EndStep (the state they work on: state/step.h). */
#include <stdlib.h>

#include "handler.h"
#include "reply.h"
#include "serve.h"

/* A step a stream channel runs takes no Attend or EndStep (serve/req_stream.c ends it). */
static attnd_err step_not_streamed(const attnd_step *st, attnd_reply *r)
{
    if (st->stream == 0) return ATTND_ERR_OK;
    return attnd_reply_fail(r, ATTND_ERR_FAILED_PRECONDITION,
                            "step: %llu runs on stream %u: its layers are queued there, and "
                            "StreamEnd ends it",
                            (unsigned long long)st->id, st->stream);
}

static attnd_err req_begin(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__BeginStep *m = c->req->begin_step;
    attnd_step_req *seqs;
    attnd_step *st;
    attnd_err rv;
    if (m->n_seqs == 0) return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seqs: empty");
    if (m->n_seqs > sv->limits.max_seqs)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "seqs: %zu entries, over limits.max_seqs (%u)", m->n_seqs,
                                sv->limits.max_seqs);
    if (c->s->nsteps >= sv->limits.max_steps)
        return attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE,
                                "step: session has limits.max_steps (%u) open",
                                sv->limits.max_steps);
    if ((seqs = malloc(m->n_seqs * sizeof *seqs)) == NULL)
        return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
    for (size_t i = 0; i < m->n_seqs; i++)
        seqs[i] = (attnd_step_req){m->seqs[i]->seq_id, m->seqs[i]->new_tokens};
    rv = attnd_step_begin(&sv->steps, c->s, seqs, (uint32_t)m->n_seqs, sv->limits.max_step_tokens,
                          &st, r->msg, sizeof r->msg);
    free(seqs);
    if (rv != ATTND_ERR_OK) return attnd_reply_code(r, rv);
    if ((rv = attnd_reply_step(st, r)) != ATTND_ERR_OK)
        attnd_step_end(&sv->steps, c->s, st, 1, NULL, 0); /* nothing to tell the client of */
    return rv;
}

static attnd_err attend_resolve(attnd_serve *sv, const attnd_step *st, const Attnd__Attend *m,
                                attnd_handles_req *hr, attnd_attend_io *io, attnd_reply *r)
{
    int64_t T = st->plan.num_tokens, Hq = sv->model.geo.num_q_heads;
    int64_t Hk = sv->model.geo.num_kv_heads, D = sv->model.geo.head_size;
    const attnd_tref_spec sq = {"q", ATTND_DT_FLOAT, 3, {T, Hq, D}, 0, 0, 0};
    const attnd_tref_spec sk = {"k_new", ATTND_DT_FLOAT, 3, {T, Hk, D}, 0, 0, 0};
    const attnd_tref_spec sval = {"v_new", ATTND_DT_FLOAT, 3, {T, Hk, D}, 0, 0, 0};
    const attnd_tref_spec so = {"out", ATTND_DT_FLOAT, 3, {T, Hq, D}, 1, 0, 0};
    const attnd_tref_spec sl = {"out_lse", ATTND_DT(F32), 2, {Hq, T}, 1, 1, 0};
    attnd_err rv;
    if ((rv = attnd_reply_resolve(r, hr, m->q, &sq, &io->q))) return rv;
    if ((rv = attnd_reply_resolve(r, hr, m->k_new, &sk, &io->k))) return rv;
    if ((rv = attnd_reply_resolve(r, hr, m->v_new, &sval, &io->v))) return rv;
    if ((rv = attnd_reply_resolve(r, hr, m->out, &so, &io->out))) return rv;
    return attnd_reply_resolve(r, hr, m->out_lse, &sl, &io->lse);
}

/* Resolve, stage, run one layer, stage back: every step an error reply names. */
static attnd_err attend_layer(attnd_serve *sv, attnd_step *st, const Attnd__Attend *m,
                              attnd_handles_req *hr, attnd_reply *r)
{
    attnd_attend_io io;
    attnd_tensor *const staged[] = {&io.q, &io.k, &io.v, &io.out, &io.lse};
    attnd_err rv;
    if ((rv = attend_resolve(sv, st, m, hr, &io, r)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_step_index(&sv->steps, st, r->msg, sizeof r->msg)) != ATTND_ERR_OK ||
        (rv = attnd_devmem_stage_in(sv->dm, hr, staged, 5, r->msg, sizeof r->msg)) !=
            ATTND_ERR_OK ||
        (rv = attnd_step_attend(&sv->steps, st, m->layer, &io, hr->nhost != 0, &r->wait, r->msg,
                                sizeof r->msg)) != ATTND_ERR_OK)
        return attnd_reply_code(r, rv);
    if ((rv = attnd_devmem_stage_out(sv->dm, hr, r->msg, sizeof r->msg)) != ATTND_ERR_OK) {
        attnd_step_layer_void(st, m->layer); /* the client is told it failed: not attended */
        return attnd_reply_code(r, rv);
    }
    attnd_reply_take_outputs(r, hr);
    return ATTND_ERR_OK;
}

static attnd_err req_attend(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__Attend *m = c->req->attend;
    attnd_handles_req hr;
    attnd_step *st;
    attnd_err rv;
    if ((rv = attnd_step_find(&sv->steps, c->s, m->step, &st, r->msg, sizeof r->msg)) ||
        (rv = step_not_streamed(st, r)))
        return attnd_reply_code(r, rv);
    if (m->layer >= sv->model.geo.num_layers)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "layer: %u out of range (%u layers)",
                                m->layer, sv->model.geo.num_layers);
    if ((rv = attnd_step_layer_check(st, m->layer, r->msg, sizeof r->msg)))
        return attnd_reply_code(r, rv);
    const Attnd__TensorRef *refs[] = {m->q, m->k_new, m->v_new, m->out, m->out_lse};
    if ((rv = attnd_reply_handles_begin(r, &hr, c->s, sv->limits.max_inline_bytes, refs, 5)))
        return rv;
    rv = attend_layer(sv, st, m, &hr, r);
    attnd_handles_req_fini(&hr);
    return rv;
}

static attnd_err req_end(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__EndStep *m = c->req->end_step;
    attnd_step *st;
    attnd_err rv;
    /* an EndStep that aborts touches no device memory; a commit trusts what the kernels wrote */
    if (!m->abort && (rv = attnd_devmem_usable(sv->dm, r->msg, sizeof r->msg)) != ATTND_ERR_OK)
        return attnd_reply_code(r, rv);
    if ((rv = attnd_step_find(&sv->steps, c->s, m->step, &st, r->msg, sizeof r->msg)) ||
        (rv = step_not_streamed(st, r)))
        return attnd_reply_code(r, rv);
    return attnd_reply_code(r,
                            attnd_step_end(&sv->steps, c->s, st, m->abort, r->msg, sizeof r->msg));
}

static const attnd_req_entry step_entries[] = {
    {ATTND__REQUEST__BODY_BEGIN_STEP, "begin_step", req_begin,
     ATTND_REQ_SESSION | ATTND_REQ_DEVICE},
    {ATTND__REQUEST__BODY_ATTEND, "attend", req_attend, ATTND_REQ_SESSION | ATTND_REQ_DEVICE},
    {ATTND__REQUEST__BODY_END_STEP, "end_step", req_end, ATTND_REQ_SESSION},
};

const attnd_req_table attnd_req_step = {step_entries, sizeof step_entries / sizeof step_entries[0]};
