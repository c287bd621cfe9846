/* Sequences (create, fork, free, query, list) and steps (begin, end). */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

static void seq_from_pb(attnd_seq_info *info, const Attnd__SequenceInfo *pb)
{
    info->seq_id = pb->seq_id;
    info->num_tokens = pb->num_tokens;
    info->num_blocks = pb->num_blocks;
    info->step = pb->step;
    info->released_tokens = pb->released_tokens;
}

/* Round trip for a request whose reply may carry a SequenceInfo; info (may be NULL) gets it.
 * `want` makes a missing SequenceInfo a PROTOCOL error. */
static attnd_err seq_call(attnd_client *c, Attnd__Request *req, const char *what, uint64_t seq_id,
                          attnd_seq_info *info, int want)
{
    Attnd__Reply *rep;
    attnd_err rv;
    if ((rv = attnd_client_rpc(c, req, &rep)) != ATTND_ERR_OK) return rv;
    if (info != NULL) {
        memset(info, 0, sizeof *info);
        info->seq_id = seq_id;
        if (rep->body_case == ATTND__REPLY__BODY_SEQ)
            seq_from_pb(info, rep->seq);
        else if (want)
            rv = attnd_client_fail(c, ATTND_ERR_PROTOCOL, "%s: reply without a SequenceInfo", what);
    }
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

attnd_err attnd_client_seq_create(attnd_client *c, uint64_t seq_id, attnd_seq_info *info)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CreateSequence m = ATTND__CREATE_SEQUENCE__INIT;
    m.seq_id = seq_id;
    req.body_case = ATTND__REQUEST__BODY_CREATE;
    req.create = &m;
    return seq_call(c, &req, "create", seq_id, info, 0);
}

attnd_err attnd_client_seq_fork(attnd_client *c, uint64_t parent, uint64_t child,
                                attnd_seq_info *info)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__ForkSequence m = ATTND__FORK_SEQUENCE__INIT;
    m.parent = parent;
    m.child = child;
    req.body_case = ATTND__REQUEST__BODY_FORK;
    req.fork = &m;
    return seq_call(c, &req, "fork", child, info, 0);
}

attnd_err attnd_client_seq_free(attnd_client *c, uint64_t seq_id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__FreeSequence m = ATTND__FREE_SEQUENCE__INIT;
    m.seq_id = seq_id;
    req.body_case = ATTND__REQUEST__BODY_FREE;
    req.free = &m;
    return seq_call(c, &req, "free", seq_id, NULL, 0);
}

attnd_err attnd_client_seq_truncate(attnd_client *c, uint64_t seq_id, uint32_t tokens,
                                    attnd_seq_info *info)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__TruncateSequence m = ATTND__TRUNCATE_SEQUENCE__INIT;
    m.seq_id = seq_id;
    m.tokens = tokens;
    req.body_case = ATTND__REQUEST__BODY_TRUNCATE;
    req.truncate = &m;
    return seq_call(c, &req, "truncate", seq_id, info, 0);
}

attnd_err attnd_client_seq_query(attnd_client *c, uint64_t seq_id, attnd_seq_info *info)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__QuerySequence m = ATTND__QUERY_SEQUENCE__INIT;
    attnd_seq_info tmp;
    m.seq_id = seq_id;
    req.body_case = ATTND__REQUEST__BODY_QUERY;
    req.query = &m;
    return seq_call(c, &req, "query", seq_id, info != NULL ? info : &tmp, 1);
}

attnd_err attnd_client_seq_list(attnd_client *c, attnd_seq_info *seqs, size_t cap, size_t *n)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__ListSequences m = ATTND__LIST_SEQUENCES__INIT;
    Attnd__Reply *rep;
    attnd_err rv;
    size_t total = 0;
    req.body_case = ATTND__REQUEST__BODY_LIST;
    req.list = &m;
    *n = 0;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    /* An empty list may arrive as an absent body (proto3 drops empty messages' contents). */
    if (rep->body_case == ATTND__REPLY__BODY_SEQS) total = rep->seqs->n_seqs;
    for (size_t i = 0; i < total && i < cap; i++)
        seq_from_pb(&seqs[i], rep->seqs->seqs[i]);
    *n = total;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}

/* Copy the step reply out, checking it covers the n sequences asked for. */
attnd_err attnd_client_step_from_pb(attnd_client *c, const Attnd__Reply *rep, size_t n,
                                    attnd_step *step, uint32_t *query_start_loc)
{
    const Attnd__BeginStepReply *s;
    if (rep->body_case != ATTND__REPLY__BODY_STEP || rep->step->step == 0)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "begin_step: reply without a step");
    s = rep->step;
    step->id = s->step;
    step->num_tokens = s->num_tokens;
    if (query_start_loc == NULL) return ATTND_ERR_OK;
    if (s->n_query_start_loc != n + 1)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL,
                                 "begin_step: %zu query_start_loc entries for %zu sequences",
                                 s->n_query_start_loc, n);
    memcpy(query_start_loc, s->query_start_loc, (n + 1) * sizeof *query_start_loc);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_step_begin(attnd_client *c, const attnd_step_seq *seqs, size_t n,
                                  attnd_step *step, uint32_t *query_start_loc)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep m = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq *items = NULL, **ptrs = NULL;
    Attnd__Reply *rep = NULL;
    attnd_err rv;
    memset(step, 0, sizeof *step);
    if (n > 0) {
        items = calloc(n, sizeof *items);
        ptrs = calloc(n, sizeof *ptrs);
        if (items == NULL || ptrs == NULL) {
            rv = attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "begin_step: %zu sequences", n);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        Attnd__StepSeq init = ATTND__STEP_SEQ__INIT;
        items[i] = init;
        items[i].seq_id = seqs[i].seq_id;
        items[i].new_tokens = seqs[i].new_tokens;
        ptrs[i] = &items[i];
    }
    m.n_seqs = n;
    m.seqs = ptrs;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &m;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) goto out;
    rv = attnd_client_step_from_pb(c, rep, n, step, query_start_loc);
out:
    if (rep != NULL) attnd__reply__free_unpacked(rep, NULL);
    free(items);
    free(ptrs);
    return rv;
}

attnd_err attnd_client_step_end(attnd_client *c, uint64_t step, int abort)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__EndStep m = ATTND__END_STEP__INIT;
    Attnd__Reply *rep;
    attnd_err rv;
    m.step = step;
    m.abort = abort != 0;
    req.body_case = ATTND__REQUEST__BODY_END_STEP;
    req.end_step = &m;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}
