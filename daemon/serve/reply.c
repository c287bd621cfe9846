#include "reply.h"

#include <stdlib.h>
#include <string.h>

void attnd_reply_init(attnd_reply *r, uint64_t id)
{
    memset(r, 0, sizeof *r);
    attnd__reply__init(&r->reply);
    r->reply.id = id;
    r->reply.message = r->msg;
}

void attnd_reply_fini(attnd_reply *r)
{
    free(r->seq_items);
    free(r->seq_ptrs);
    free(r->layer_items);
    free(r->layer_ptrs);
    r->layer_items = NULL;
    r->layer_ptrs = NULL;
    free(r->step.query_start_loc);
    for (size_t i = 0; i < r->outputs.n_data; i++)
        free(r->out_data[i].data);
    r->seq_items = NULL;
    r->seq_ptrs = NULL;
    r->step.query_start_loc = NULL;
    r->outputs.n_data = 0;
}

void attnd_reply_take_outputs(attnd_reply *r, attnd_handles_req *hr)
{
    attnd__inline_outputs__init(&r->outputs);
    for (uint32_t i = 0; i < hr->nout; i++) {
        r->out_data[i].data = hr->out[i];
        r->out_data[i].len = hr->out_bytes[i];
    }
    r->outputs.n_data = hr->nout;
    r->outputs.data = r->out_data;
    hr->nout = 0; /* the reply owns them now */
    if (r->outputs.n_data) {
        r->reply.body_case = ATTND__REPLY__BODY_OUTPUTS;
        r->reply.outputs = &r->outputs;
    }
}

attnd_err attnd_reply_handles_begin(attnd_reply *r, attnd_handles_req *hr, const attnd_session *s,
                                    uint64_t max_inline_bytes, const Attnd__TensorRef *const *refs,
                                    size_t nrefs)
{
    attnd_handles_req_init(hr, s->regions, s->nregions, max_inline_bytes);
    uint64_t in = attnd_handles_inline_in(refs, nrefs);
    if (in > max_inline_bytes)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "data: %llu INLINE bytes exceed limits.max_inline_bytes (%llu)",
                                (unsigned long long)in, (unsigned long long)max_inline_bytes);
    return ATTND_ERR_OK;
}

attnd_err attnd_reply_resolve(attnd_reply *r, attnd_handles_req *hr, const Attnd__TensorRef *ref,
                              const attnd_tref_spec *spec, attnd_tensor *t)
{
    attnd_err rv = attnd_handles_resolve(hr, ref, spec, t, r->msg, sizeof r->msg);
    return rv == ATTND_ERR_OK ? rv : attnd_reply_code(r, rv);
}

attnd_err attnd_reply_step(const attnd_step *st, attnd_reply *r)
{
    Attnd__BeginStepReply *b = &r->step;
    attnd__begin_step_reply__init(b);
    b->query_start_loc = malloc((size_t)(st->nseqs + 1) * sizeof(uint32_t));
    if (b->query_start_loc == NULL)
        return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
    for (uint32_t i = 0; i <= st->nseqs; i++)
        b->query_start_loc[i] = (uint32_t)st->plan.query_start_loc[i];
    b->n_query_start_loc = st->nseqs + 1;
    b->step = st->id;
    b->num_tokens = (uint32_t)st->plan.num_tokens;
    r->reply.body_case = ATTND__REPLY__BODY_STEP;
    r->reply.step = b;
    return ATTND_ERR_OK;
}
