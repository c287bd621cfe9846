/* A plan + one layer's tensors -> kernel params and launches (attnd/plan.h). */
#include <string.h>

#include "attnd/plan.h"

/* A plan array at its place in index (the arrays keep their workspace offsets there). */
static attnd_tensor index_tensor(const attnd_plan *p, const void *index, const void *host,
                                 attnd_dtype dt, int32_t ndim, const int64_t *shape)
{
    attnd_tensor t;
    size_t off = (size_t)((const char *)host - (const char *)p->slot_mapping);
    attnd_tensor_init(&t, (char *)index + off, dt, ndim, shape);
    return t;
}

/* Sub-view of dimension d: [first, first + n). */
static attnd_tensor slice(attnd_tensor t, int32_t d, int64_t first, int64_t n)
{
    if (t.data == NULL) return t;
    t.data = (char *)t.data + first * t.strides[d] * (int64_t)attnd_dtype_size(t.dtype);
    t.shape[d] = n;
    return t;
}

void attnd_plan_cache_write_params(const attnd_plan *plan, const void *index,
                                   const attnd_plan_layer *layer, attnd_cache_write_params *p)
{
    int64_t nt[1] = {plan->num_tokens};
    memset(p, 0, sizeof *p);
    p->key = layer->k_new;
    p->value = layer->v_new;
    p->k_cache = layer->k_cache;
    p->v_cache = layer->v_cache;
    p->slot_mapping = index_tensor(plan, index, plan->slot_mapping, ATTND_DTYPE_I64, 1, nt);
    p->k_scale = layer->k_scale;
    p->v_scale = layer->v_scale;
}

void attnd_plan_paged_params(const attnd_plan *plan, const void *index, int32_t i,
                             const attnd_plan_layer *layer, attnd_paged_params *p)
{
    const attnd_launch *l = &plan->launches[i];
    int64_t bt[2] = {l->nseqs, plan->table_width}, ns[1] = {l->nseqs}, nq[1] = {l->nseqs + 1};
    memset(p, 0, sizeof *p);
    p->q = slice(layer->q, 0, l->row0, l->nrows);
    p->out = slice(layer->out, 0, l->row0, l->nrows);
    p->out_lse = slice(layer->lse, 1, l->row0, l->nrows);
    p->k_cache = layer->k_cache;
    p->v_cache = layer->v_cache;
    p->block_tables =
        index_tensor(plan, index, plan->block_tables + (size_t)l->seq0 * plan->table_width,
                     ATTND_DTYPE_I32, 2, bt);
    p->seq_lens = index_tensor(plan, index, plan->seq_lens + l->seq0, ATTND_DTYPE_I32, 1, ns);
    p->query_start_loc =
        index_tensor(plan, index, plan->qsl_local + l->qsl_off, ATTND_DTYPE_I32, 1, nq);
    p->alibi_slopes = layer->alibi_slopes;
    p->sinks = layer->sinks;
    p->scale = layer->scale;
    p->k_scale = layer->k_scale;
    p->v_scale = layer->v_scale;
    p->softcap = layer->softcap;
    p->sliding_window = layer->sliding_window;
    p->max_query_len = l->max_query_len;
    p->max_seq_len = l->max_seq_len;
}

attnd_err attnd_plan_write_kv(attnd_backend *be, const attnd_plan *plan, const void *index,
                              const attnd_plan_layer *layer)
{
    attnd_cache_write_params cw;
    attnd_plan_cache_write_params(plan, index, layer, &cw);
    return attnd_cache_write(be, &cw);
}

attnd_err attnd_plan_launch(attnd_backend *be, const attnd_plan *plan, const void *index, int32_t i,
                            const attnd_plan_layer *layer, void *ws3d)
{
    attnd_paged_params p;
    const attnd_launch *l = &plan->launches[i];
    attnd_plan_paged_params(plan, index, i, layer, &p);
    if (l->kind == ATTND_LAUNCH_3D) return attnd_paged_attention_3d(be, &p, l->num_segments, ws3d);
    return attnd_paged_attention_2d(be, &p);
}

attnd_err attnd_plan_run_layer(attnd_backend *be, const attnd_plan *plan, const void *index,
                               const attnd_plan_layer *layer, void *ws3d)
{
    attnd_err rv = attnd_plan_write_kv(be, plan, index, layer);
    for (int32_t i = 0; i < plan->num_launches && rv == ATTND_ERR_OK; i++)
        rv = attnd_plan_launch(be, plan, index, i, layer, ws3d);
    return rv;
}
