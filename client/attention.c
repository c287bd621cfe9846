/* The attention calls: Attend, MergeStates, VarlenAttention, BlocksparseAttention,
 * LinearPrefill / LinearDecode (encode the tensor fields, one round trip, inline outputs back). */
#include <string.h>

#include "client_int.h"

#define MAX_REF_FIELDS 8

/* One TensorRef field of a request: where its pointer goes and what fills it (NULL = absent). */
typedef struct ref_field {
    const char *name;
    const attnd_ref *ref;
    int is_output;
    Attnd__TensorRef **slot;
} ref_field;

static attnd_err encode_refs(attnd_client *c, const ref_field *f, size_t n, Attnd__TensorRef *store)
{
    attnd_err rv;
    for (size_t i = 0; i < n; i++) {
        *f[i].slot = NULL;
        if (f[i].ref == NULL) continue;
        if ((rv = attnd_client_ref_to_pb(c, f[i].name, f[i].ref, f[i].is_output, &store[i])) !=
            ATTND_ERR_OK)
            return rv;
        *f[i].slot = &store[i];
    }
    return ATTND_ERR_OK;
}

/* Encode the fields, make the round trip, copy inline outputs (outs, in field order) back. */
static attnd_err call_with_refs(attnd_client *c, Attnd__Request *req, const ref_field *f, size_t nf,
                                attnd_ref *const *outs, size_t nouts)
{
    Attnd__TensorRef store[MAX_REF_FIELDS];
    Attnd__Reply *rep;
    attnd_err rv;
    if ((rv = encode_refs(c, f, nf, store)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_client_rpc(c, req, &rep)) != ATTND_ERR_OK) return rv;
    rv = attnd_client_take_outputs(c, rep, outs, nouts);
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

attnd_err attnd_client_attend(attnd_client *c, uint64_t step, uint32_t layer, const attnd_ref *q,
                              const attnd_ref *k_new, const attnd_ref *v_new, attnd_ref *out,
                              attnd_ref *out_lse)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend m = ATTND__ATTEND__INIT;
    const ref_field f[] = {
        {"q", q, 0, &m.q},       {"k_new", k_new, 0, &m.k_new},       {"v_new", v_new, 0, &m.v_new},
        {"out", out, 1, &m.out}, {"out_lse", out_lse, 1, &m.out_lse},
    };
    attnd_ref *const outs[] = {out, out_lse};
    m.step = step;
    m.layer = layer;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &m;
    return call_with_refs(c, &req, f, sizeof f / sizeof f[0], outs, 2);
}

attnd_err attnd_client_merge(attnd_client *c, const attnd_merge_args *a)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__MergeStates m = ATTND__MERGE_STATES__INIT;
    const ref_field f[] = {
        {"out", a->out, 1, &m.out},
        {"out_lse", a->out_lse, 1, &m.out_lse},
        {"prefix_out", a->prefix_out, 0, &m.prefix_out},
        {"prefix_lse", a->prefix_lse, 0, &m.prefix_lse},
        {"suffix_out", a->suffix_out, 0, &m.suffix_out},
        {"suffix_lse", a->suffix_lse, 0, &m.suffix_lse},
    };
    attnd_ref *const outs[] = {a->out, a->out_lse};
    req.body_case = ATTND__REQUEST__BODY_MERGE;
    req.merge = &m;
    return call_with_refs(c, &req, f, sizeof f / sizeof f[0], outs, 2);
}

attnd_err attnd_client_varlen(attnd_client *c, const attnd_varlen_args *a)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__VarlenAttention m = ATTND__VARLEN_ATTENTION__INIT;
    const ref_field f[] = {
        {"q", a->q, 0, &m.q},
        {"k", a->k, 0, &m.k},
        {"v", a->v, 0, &m.v},
        {"out", a->out, 1, &m.out},
        {"cu_seqlens_q", a->cu_seqlens_q, 0, &m.cu_seqlens_q},
        {"cu_seqlens_k", a->cu_seqlens_k, 0, &m.cu_seqlens_k},
        {"bias", a->bias, 0, &m.bias},
    };
    attnd_ref *const outs[] = {a->out};
    m.max_seqlen_q = a->max_seqlen_q;
    m.max_seqlen_k = a->max_seqlen_k;
    m.causal = a->causal != 0;
    m.scale = a->scale;
    m.q_scale = a->q_scale;
    m.k_scale = a->k_scale;
    m.v_scale = a->v_scale;
    m.p_scale = a->p_scale;
    m.out_scale = a->out_scale;
    req.body_case = ATTND__REQUEST__BODY_VARLEN;
    req.varlen = &m;
    return call_with_refs(c, &req, f, sizeof f / sizeof f[0], outs, 1);
}

attnd_err attnd_client_blocksparse(attnd_client *c, const attnd_blocksparse_args *a)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BlocksparseAttention m = ATTND__BLOCKSPARSE_ATTENTION__INIT;
    const ref_field f[] = {
        {"q", a->q, 0, &m.q},
        {"k", a->k, 0, &m.k},
        {"v", a->v, 0, &m.v},
        {"out", a->out, 1, &m.out},
        {"cu_seqlens_q", a->cu_seqlens_q, 0, &m.cu_seqlens_q},
        {"cu_seqlens_k", a->cu_seqlens_k, 0, &m.cu_seqlens_k},
        {"layout_crow", a->layout_crow, 0, &m.layout_crow},
        {"layout_col", a->layout_col, 0, &m.layout_col},
    };
    attnd_ref *const outs[] = {a->out};
    m.block_size = a->block_size;
    m.q_block_size = a->q_block_size;
    m.max_seqlen_q = a->max_seqlen_q;
    m.max_seqlen_k = a->max_seqlen_k;
    m.scale = a->scale;
    req.body_case = ATTND__REQUEST__BODY_BLOCKSPARSE;
    req.blocksparse = &m;
    return call_with_refs(c, &req, f, sizeof f / sizeof f[0], outs, 1);
}

/* LinearPrefill and LinearDecode share their fields but not their message types. */
typedef struct linear_fields {
    uint32_t *layer;
    size_t *n_seq_ids;
    uint64_t **seq_ids;
    size_t *n_slopes;
    float **slopes;
    Attnd__TensorRef **q, **k, **v, **out;
} linear_fields;

static attnd_err linear_call(attnd_client *c, Attnd__Request *req, const linear_fields *lf,
                             const attnd_linear_args *a)
{
    const ref_field f[] = {
        {"q", a->q, 0, lf->q},
        {"k", a->k, 0, lf->k},
        {"v", a->v, 0, lf->v},
        {"out", a->out, 1, lf->out},
    };
    attnd_ref *const outs[] = {a->out};
    *lf->layer = a->layer;
    *lf->n_seq_ids = a->batch;
    *lf->seq_ids = (uint64_t *)a->seq_ids;
    *lf->n_slopes = a->num_slopes;
    *lf->slopes = (float *)a->slopes;
    return call_with_refs(c, req, f, sizeof f / sizeof f[0], outs, 1);
}

attnd_err attnd_client_linear_prefill(attnd_client *c, const attnd_linear_args *a)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__LinearPrefill m = ATTND__LINEAR_PREFILL__INIT;
    const linear_fields lf = {&m.layer, &m.n_seq_ids, &m.seq_ids, &m.n_slopes, &m.slopes,
                              &m.q,     &m.k,         &m.v,       &m.out};
    m.block_size = a->block_size;
    req.body_case = ATTND__REQUEST__BODY_LINEAR_PREFILL;
    req.linear_prefill = &m;
    return linear_call(c, &req, &lf, a);
}

attnd_err attnd_client_linear_decode(attnd_client *c, const attnd_linear_args *a)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__LinearDecode m = ATTND__LINEAR_DECODE__INIT;
    const linear_fields lf = {&m.layer, &m.n_seq_ids, &m.seq_ids, &m.n_slopes, &m.slopes,
                              &m.q,     &m.k,         &m.v,       &m.out};
    req.body_case = ATTND__REQUEST__BODY_LINEAR_DECODE;
    req.linear_decode = &m;
    return linear_call(c, &req, &lf, a);
}
