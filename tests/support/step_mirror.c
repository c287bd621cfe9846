#include "step_mirror.h"

#include <string.h>

attnd_sched_opts attnd_step_mirror_opts(int32_t block_size, int32_t num_q_heads,
                                        int32_t num_kv_heads, int32_t head_size, int32_t units)
{
    attnd_sched_opts o = {block_size, num_q_heads, num_kv_heads,
                          head_size,  units,       attnd_sched_split_rows(units)};
    return o;
}

/* A plan array at its place in index. */
static attnd_tensor index_tensor(const attnd_plan *p, void *index, const void *host, attnd_dtype dt,
                                 int32_t ndim, const int64_t *shape)
{
    attnd_tensor t;
    size_t off = (size_t)((const char *)host - (const char *)p->slot_mapping);
    attnd_tensor_init(&t, (char *)index + off, dt, ndim, shape);
    return t;
}

static attnd_tensor slice(attnd_tensor t, int32_t d, int64_t first, int64_t n)
{
    if (t.data == NULL) return t;
    t.data = (char *)t.data + first * t.strides[d] * (int64_t)attnd_dtype_size(t.dtype);
    t.shape[d] = n;
    return t;
}

static void launch_params(const attnd_plan *pl, void *index, const attnd_launch *ln,
                          const attnd_step_layer *l, attnd_paged_params *p)
{
    int64_t bt[2] = {ln->nseqs, pl->table_width}, ns[1] = {ln->nseqs}, nq[1] = {ln->nseqs + 1};
    memset(p, 0, sizeof *p);
    p->q = slice(l->q, 0, ln->row0, ln->nrows);
    p->out = slice(l->out, 0, ln->row0, ln->nrows);
    p->out_lse = slice(l->lse, 1, ln->row0, ln->nrows);
    p->k_cache = l->k_cache;
    p->v_cache = l->v_cache;
    p->block_tables = index_tensor(pl, index, pl->block_tables + (size_t)ln->seq0 * pl->table_width,
                                   ATTND_DTYPE_I32, 2, bt);
    p->seq_lens = index_tensor(pl, index, pl->seq_lens + ln->seq0, ATTND_DTYPE_I32, 1, ns);
    p->query_start_loc =
        index_tensor(pl, index, pl->qsl_local + ln->qsl_off, ATTND_DTYPE_I32, 1, nq);
    p->scale = l->scale;
    p->k_scale = p->v_scale = 1.0f;
    p->max_query_len = ln->max_query_len;
    p->max_seq_len = ln->max_seq_len;
}

attnd_err attnd_step_mirror_layer(attnd_backend *be, const attnd_plan *plan, void *index,
                                  const attnd_step_layer *l, void *ws3d, int which)
{
    attnd_err rv = ATTND_ERR_OK;
    if (which & 1) {
        attnd_cache_write_params cw;
        int64_t nt[1] = {plan->num_tokens};
        memset(&cw, 0, sizeof cw);
        cw.key = l->k_new;
        cw.value = l->v_new;
        cw.k_cache = l->k_cache;
        cw.v_cache = l->v_cache;
        cw.slot_mapping = index_tensor(plan, index, plan->slot_mapping, ATTND_DTYPE_I64, 1, nt);
        cw.k_scale = cw.v_scale = 1.0f;
        if ((rv = attnd_cache_write(be, &cw)) != ATTND_ERR_OK) return rv;
    }
    for (int32_t i = 0; (which & 2) && i < plan->num_launches && rv == ATTND_ERR_OK; i++) {
        const attnd_launch *ln = &plan->launches[i];
        attnd_paged_params p;
        launch_params(plan, index, ln, l, &p);
        if (ln->kind == ATTND_LAUNCH_3D)
            rv = attnd_paged_attention_3d(be, &p, ln->num_segments, ws3d);
        else
            rv = attnd_paged_attention_2d(be, &p);
    }
    return rv;
}

attnd_err attnd_step_mirror_single_2d(attnd_backend *be, const attnd_plan *plan, void *index,
                                      const attnd_step_layer *l)
{
    attnd_paged_params p;
    attnd_launch all;
    memset(&all, 0, sizeof all);
    all.kind = ATTND_LAUNCH_2D;
    all.nseqs = plan->num_seqs;
    all.nrows = plan->num_tokens;
    all.num_segments = 1;
    for (int32_t s = 0; s < plan->num_seqs; s++) {
        int32_t ql = plan->query_start_loc[s + 1] - plan->query_start_loc[s];
        if (ql > all.max_query_len) all.max_query_len = ql;
        if (plan->seq_lens[s] > all.max_seq_len) all.max_seq_len = plan->seq_lens[s];
    }
    launch_params(plan, index, &all, l, &p);
    /* the whole batch's offsets are query_start_loc itself */
    int64_t nq[1] = {plan->num_seqs + 1};
    p.query_start_loc = index_tensor(plan, index, plan->query_start_loc, ATTND_DTYPE_I32, 1, nq);
    return attnd_paged_attention_2d(be, &p);
}
