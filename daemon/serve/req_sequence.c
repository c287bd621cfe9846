/* Sequence requests: CreateSequence, ForkSequence (the linear state copied too), FreeSequence,
 * TruncateSequence, QuerySequence, ListSequences. The cache keys sequences by session: no other
 * session can name them. */
#include <stdlib.h>

#include "handler.h"
#include "reply.h"
#include "serve.h"

static void fill_seq_info(const attnd_seq *q, uint32_t block_size, Attnd__SequenceInfo *info)
{
    attnd__sequence_info__init(info);
    info->seq_id = q->id;
    info->num_tokens = q->num_tokens;
    info->num_blocks = q->nblocks;
    info->step = q->step;
    info->released_tokens = q->base * block_size;
}

static attnd_err reply_seq(const attnd_serve *sv, attnd_reply *r, const attnd_seq *q)
{
    fill_seq_info(q, sv->model.geo.block_size, &r->seq);
    r->reply.body_case = ATTND__REPLY__BODY_SEQ;
    r->reply.seq = &r->seq;
    return ATTND_ERR_OK;
}

static attnd_err find_seq(attnd_serve *sv, const attnd_session *s, uint64_t id, const char *field,
                          attnd_reply *r, attnd_seq **out)
{
    *out = id ? attnd_cache_find(sv->cache, s->id, id) : NULL;
    if (*out == NULL)
        return attnd_reply_fail(r, id ? ATTND_ERR_NOT_FOUND : ATTND_ERR_INVALID_ARGUMENT,
                                "%s: %llu %s", field, (unsigned long long)id,
                                id ? "not found in this session" : "is reserved");
    return ATTND_ERR_OK;
}

static attnd_err check_new_seq(attnd_serve *sv, const attnd_session *s, uint64_t id,
                               const char *field, attnd_reply *r)
{
    if (id == 0) return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s: 0 is reserved", field);
    if (attnd_cache_find(sv->cache, s->id, id))
        return attnd_reply_fail(r, ATTND_ERR_ALREADY_EXISTS, "%s: %llu already exists", field,
                                (unsigned long long)id);
    if (s->nseqs >= sv->limits.max_seqs)
        return attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE, "%s: session holds limits.max_seqs (%u)",
                                field, sv->limits.max_seqs);
    return ATTND_ERR_OK;
}

static attnd_err req_create(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    uint64_t id = c->req->create->seq_id;
    attnd_seq *q;
    attnd_err rv;
    if ((rv = check_new_seq(sv, c->s, id, "seq_id", r)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cache_create(sv->cache, c->s->id, id, &q)) != ATTND_ERR_OK)
        return attnd_reply_fail(r, rv, "seq_id: %s", attnd_strerror(rv));
    c->s->nseqs++;
    return reply_seq(sv, r, q);
}

static attnd_err req_fork(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__ForkSequence *m = c->req->fork;
    attnd_seq *parent, *child;
    attnd_cache_copy lc;
    attnd_err rv;
    if ((rv = find_seq(sv, c->s, m->parent, "parent", r, &parent)) != ATTND_ERR_OK) return rv;
    if ((rv = check_new_seq(sv, c->s, m->child, "child", r)) != ATTND_ERR_OK) return rv;
    if (parent->step)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "parent: %llu is in open step %llu",
                                (unsigned long long)parent->id, (unsigned long long)parent->step);
    if ((rv = attnd_cache_fork(sv->cache, parent, m->child, &child, &lc)) != ATTND_ERR_OK)
        return attnd_reply_fail(r, rv, "child: %s",
                                rv == ATTND_ERR_OUT_OF_BLOCKS ? "no free linear state slot"
                                                              : attnd_strerror(rv));
    if (lc.src >= 0 && (rv = attnd_devmem_copy_linear(sv->dm, lc.src, lc.dst)) != ATTND_ERR_OK) {
        attnd_cache_release(sv->cache, child);
        return attnd_reply_code(r, attnd_devmem_kernel_err(sv->dm, rv,
                                                           "child: copying the linear state",
                                                           r->msg, sizeof r->msg));
    }
    c->s->nseqs++;
    return reply_seq(sv, r, child);
}

static attnd_err req_free(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    attnd_seq *q;
    attnd_err rv;
    if ((rv = find_seq(sv, c->s, c->req->free->seq_id, "seq_id", r, &q)) != ATTND_ERR_OK) return rv;
    if (q->step)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "seq_id: %llu is in open step %llu (end it first)",
                                (unsigned long long)q->id, (unsigned long long)q->step);
    attnd_cache_release(sv->cache, q);
    c->s->nseqs--;
    return ATTND_ERR_OK;
}

static attnd_err req_truncate(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__TruncateSequence *m = c->req->truncate;
    attnd_seq *q;
    attnd_err rv;
    if ((rv = find_seq(sv, c->s, m->seq_id, "seq_id", r, &q)) != ATTND_ERR_OK) return rv;
    if (q->step)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "seq_id: %llu is in open step %llu (end it first)",
                                (unsigned long long)q->id, (unsigned long long)q->step);
    rv = attnd_cache_truncate(sv->cache, q, m->tokens, "tokens", r->msg, sizeof r->msg);
    if (rv != ATTND_ERR_OK) return attnd_reply_code(r, rv);
    return reply_seq(sv, r, q);
}

static attnd_err req_query(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    attnd_seq *q;
    attnd_err rv;
    if ((rv = find_seq(sv, c->s, c->req->query->seq_id, "seq_id", r, &q)) != ATTND_ERR_OK)
        return rv;
    return reply_seq(sv, r, q);
}

typedef struct list_ctx {
    attnd_reply *r;
    uint32_t block_size;
} list_ctx;

static void list_one(attnd_seq *q, void *arg)
{
    list_ctx *lc = arg;
    attnd_reply *r = lc->r;
    fill_seq_info(q, lc->block_size, &r->seq_items[r->seqs.n_seqs]);
    r->seq_ptrs[r->seqs.n_seqs] = &r->seq_items[r->seqs.n_seqs];
    r->seqs.n_seqs++;
}

static attnd_err req_list(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    attnd__sequence_list__init(&r->seqs);
    size_t n = c->s->nseqs ? c->s->nseqs : 1;
    r->seq_items = calloc(n, sizeof *r->seq_items);
    r->seq_ptrs = calloc(n, sizeof *r->seq_ptrs);
    if (r->seq_items == NULL || r->seq_ptrs == NULL)
        return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "seqs: out of memory");
    list_ctx lc = {r, sv->model.geo.block_size};
    attnd_cache_foreach(sv->cache, c->s->id, list_one, &lc);
    r->seqs.seqs = r->seq_ptrs;
    r->reply.body_case = ATTND__REPLY__BODY_SEQS;
    r->reply.seqs = &r->seqs;
    return ATTND_ERR_OK;
}

static const attnd_req_entry sequence_entries[] = {
    {ATTND__REQUEST__BODY_CREATE, "create", req_create, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_FORK, "fork", req_fork, ATTND_REQ_SESSION | ATTND_REQ_DEVICE},
    {ATTND__REQUEST__BODY_FREE, "free", req_free, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_TRUNCATE, "truncate", req_truncate, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_QUERY, "query", req_query, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_LIST, "list", req_list, ATTND_REQ_SESSION},
};

const attnd_req_table attnd_req_sequence = {sequence_entries,
                                            sizeof sequence_entries / sizeof sequence_entries[0]};
