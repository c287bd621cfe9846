/* Kernel requests on client tensors: merge states, varlen attention, block-sparse attention,
 * linear attention prefill and decode (against the daemon-owned state of each sequence).
 *
 * Besides each reference's own bounds, the shapes of all tensors of a request are checked
 * against one another, and index tensors (cu_seqlens, the block-sparse layout) are read and
 * checked, so that whatever a client sends, no kernel indexes outside what it was given. Index
 * tensors resolve to daemon-owned copies (attnd_tref_spec.snapshot): the checks read the copy
 * and the kernels get the same copy, never the client's memory, wherever it lives. Seq ids and
 * slopes come from the decoded message, slots from the cache: daemon memory too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "handler.h"
#include "reply.h"
#include "serve.h"

#define DT(x) ATTND_DT(x)
#define DT_FLOAT ATTND_DT_FLOAT
#define ANY ATTND_DIM_ANY

/* Device backends: host views to device memory (attnd_devmem_stage_in); errors in the reply. */
static attnd_err stage_in(attnd_serve *sv, attnd_reply *r, attnd_handles_req *hr,
                          attnd_tensor *const *ts, size_t nts)
{
    attnd_err rv = attnd_devmem_stage_in(sv->dm, hr, ts, nts, r->msg, sizeof r->msg);
    return rv == ATTND_ERR_OK ? rv : attnd_reply_code(r, rv);
}

/* After the kernel call (rv its result, or the first error before it, in the reply): wait for
 * it, copy outputs back, hand INLINE outputs to the reply. An error not in the reply yet is the
 * kernel's, named by what. */
static attnd_err finish(attnd_serve *sv, attnd_reply *r, attnd_handles_req *hr, attnd_err rv,
                        const char *what)
{
    if (rv == ATTND_ERR_OK) rv = attnd_backend_sync(sv->be);
    if (rv == ATTND_ERR_OK && (rv = attnd_devmem_stage_out(sv->dm, hr, r->msg, sizeof r->msg)))
        attnd_reply_code(r, rv);
    if (rv == ATTND_ERR_OK)
        attnd_reply_take_outputs(r, hr);
    else if (r->reply.code == ATTND_ERR_OK)
        attnd_reply_code(r, attnd_devmem_kernel_err(sv->dm, rv, what, r->msg, sizeof r->msg));
    attnd_handles_req_fini(hr);
    return rv;
}

static int64_t idx_at(const attnd_tensor *t, int64_t i)
{
    return ((const int32_t *)t->data)[i * t->strides[0]];
}

/* cu_seqlens: [batch + 1] i32, starts at 0, non-decreasing, ends at total; the longest
 * sequence goes to *max_len. */
static attnd_err check_cu(attnd_reply *r, const char *field, const attnd_tensor *t, int64_t total,
                          int32_t *max_len)
{
    int64_t n = t->shape[0], longest = 0;
    if (n < 2)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s: needs batch + 1 >= 2 entries",
                                field);
    if (idx_at(t, 0) != 0)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s[0]: %lld, must be 0", field,
                                (long long)idx_at(t, 0));
    for (int64_t i = 1; i < n; i++) {
        int64_t len = idx_at(t, i) - idx_at(t, i - 1);
        if (len < 0)
            return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s[%lld]: decreases", field,
                                    (long long)i);
        if (len > longest) longest = len;
    }
    if (idx_at(t, n - 1) != total)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s[%lld]: %lld, must be %lld rows",
                                field, (long long)(n - 1), (long long)idx_at(t, n - 1),
                                (long long)total);
    *max_len = (int32_t)longest;
    return ATTND_ERR_OK;
}

/* A client's max_seqlen: 0 = the actual longest; otherwise at least it. */
static attnd_err check_max_len(attnd_reply *r, const char *field, int32_t given, int32_t actual,
                               int32_t *out)
{
    if (given < 0 || (given > 0 && given < actual))
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "%s: %d, the longest sequence has %d", field, given, actual);
    *out = given ? given : actual;
    return ATTND_ERR_OK;
}

static attnd_err check_heads(attnd_reply *r, int64_t hq, int64_t hk, int64_t d)
{
    if (hq == 0 || hk == 0 || hq % hk)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "q.shape[1]: %lld heads not a positive multiple of k's %lld",
                                (long long)hq, (long long)hk);
    if (d < ATTND_HEAD_SIZE_MIN || d > ATTND_HEAD_SIZE_MAX || d % 8)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "q.shape[2]: head size %lld not in 32..256 or not a multiple of 8",
                                (long long)d);
    return ATTND_ERR_OK;
}

static float or_default(float v, float def)
{
    return v != 0.0f && isfinite(v) ? v : def;
}

/* ---------------------------------------------------------------- merge */

static attnd_err req_merge(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__MergeStates *m = c->req->merge;
    attnd_session *s = c->s;
    attnd_handles_req hr;
    attnd_merge_params p = {0};
    attnd_err rv;
    const Attnd__TensorRef *refs[] = {m->out,        m->out_lse,    m->prefix_out,
                                      m->prefix_lse, m->suffix_out, m->suffix_lse};
    if ((rv = attnd_reply_handles_begin(r, &hr, s, sv->limits.max_inline_bytes, refs, 6)))
        return rv;
    const attnd_tref_spec spo = {"prefix_out", DT_FLOAT, 3, {ANY, ANY, ANY}, 0, 0, 0};
    if ((rv = attnd_reply_resolve(r, &hr, m->prefix_out, &spo, &p.prefix_out))) goto done;
    int64_t T = p.prefix_out.shape[0], H = p.prefix_out.shape[1], D = p.prefix_out.shape[2];
    const attnd_tref_spec sso = {"suffix_out", DT_FLOAT, 3, {T, H, D}, 0, 0, 0};
    const attnd_tref_spec spl = {"prefix_lse", DT(F32), 2, {H, T}, 0, 0, 0};
    const attnd_tref_spec ssl = {"suffix_lse", DT(F32), 2, {H, T}, 0, 0, 0};
    const attnd_tref_spec so = {"out", DT_FLOAT, 3, {T, H, D}, 1, 0, 0};
    const attnd_tref_spec sol = {"out_lse", DT(F32), 2, {H, T}, 1, 1, 0};
    if ((rv = attnd_reply_resolve(r, &hr, m->suffix_out, &sso, &p.suffix_out)) ||
        (rv = attnd_reply_resolve(r, &hr, m->prefix_lse, &spl, &p.prefix_lse)) ||
        (rv = attnd_reply_resolve(r, &hr, m->suffix_lse, &ssl, &p.suffix_lse)) ||
        (rv = attnd_reply_resolve(r, &hr, m->out, &so, &p.out)) ||
        (rv = attnd_reply_resolve(r, &hr, m->out_lse, &sol, &p.out_lse)))
        goto done;
    attnd_tensor *const staged[] = {&p.out,        &p.out_lse,    &p.prefix_out,
                                    &p.prefix_lse, &p.suffix_out, &p.suffix_lse};
    if ((rv = stage_in(sv, r, &hr, staged, 6)) == ATTND_ERR_OK) rv = attnd_merge_states(sv->be, &p);
done:
    return finish(sv, r, &hr, rv, "merge_states");
}

/* ---------------------------------------------------------------- varlen */

/* q, k, v, out and the cu_seqlens of a varlen-shaped request (varlen and block-sparse). */
typedef struct varlen_io {
    attnd_tensor q, k, v, out, cu_q, cu_k;
    int32_t max_q, max_k; /* longest sequences */
} varlen_io;

static attnd_err varlen_resolve(attnd_reply *r, attnd_handles_req *hr, uint32_t in_dtypes,
                                uint32_t out_dtypes, const Attnd__TensorRef *const *refs,
                                varlen_io *io)
{
    attnd_err rv;
    const attnd_tref_spec sq = {"q", in_dtypes, 3, {ANY, ANY, ANY}, 0, 0, 0};
    if ((rv = attnd_reply_resolve(r, hr, refs[0], &sq, &io->q))) return rv;
    int64_t Tq = io->q.shape[0], Hq = io->q.shape[1], D = io->q.shape[2];
    uint32_t same = 1u << io->q.dtype;
    const attnd_tref_spec sk = {"k", same, 3, {ANY, ANY, D}, 0, 0, 0};
    if ((rv = attnd_reply_resolve(r, hr, refs[1], &sk, &io->k))) return rv;
    int64_t Tk = io->k.shape[0], Hk = io->k.shape[1];
    const attnd_tref_spec sval = {"v", same, 3, {Tk, Hk, D}, 0, 0, 0};
    const attnd_tref_spec scq = {"cu_seqlens_q", DT(I32), 1, {ANY}, 0, 0, 1};
    if ((rv = attnd_reply_resolve(r, hr, refs[2], &sval, &io->v)) ||
        (rv = check_heads(r, Hq, Hk, D)) ||
        (rv = attnd_reply_resolve(r, hr, refs[4], &scq, &io->cu_q)))
        return rv;
    const attnd_tref_spec sck = {"cu_seqlens_k", DT(I32), 1, {io->cu_q.shape[0]}, 0, 0, 1};
    const attnd_tref_spec so = {"out", out_dtypes, 3, {Tq, Hq, D}, 1, 0, 0};
    if ((rv = attnd_reply_resolve(r, hr, refs[5], &sck, &io->cu_k)) ||
        (rv = check_cu(r, "cu_seqlens_q", &io->cu_q, Tq, &io->max_q)) ||
        (rv = check_cu(r, "cu_seqlens_k", &io->cu_k, Tk, &io->max_k)))
        return rv;
    return attnd_reply_resolve(r, hr, refs[3], &so, &io->out);
}

static attnd_err req_varlen(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__VarlenAttention *m = c->req->varlen;
    attnd_session *s = c->s;
    attnd_handles_req hr;
    attnd_varlen_params p = {0};
    varlen_io io;
    attnd_err rv;
    const Attnd__TensorRef *refs[] = {m->q,   m->k, m->v, m->out, m->cu_seqlens_q, m->cu_seqlens_k,
                                      m->bias};
    if ((rv = attnd_reply_handles_begin(r, &hr, s, sv->limits.max_inline_bytes, refs, 7)))
        return rv;
    rv = varlen_resolve(r, &hr, DT(F16) | DT(BF16) | DT(FP8_E4M3), DT_FLOAT | DT(FP8_E4M3), refs,
                        &io);
    if (rv == ATTND_ERR_OK &&
        (rv = check_max_len(r, "max_seqlen_q", m->max_seqlen_q, io.max_q, &p.max_seqlen_q)) == 0)
        rv = check_max_len(r, "max_seqlen_k", m->max_seqlen_k, io.max_k, &p.max_seqlen_k);
    if (rv != ATTND_ERR_OK) goto done;
    const attnd_tref_spec sb = {
        "bias", DT_FLOAT, 4, {io.cu_q.shape[0] - 1, io.q.shape[1], p.max_seqlen_q, p.max_seqlen_k},
        0,      1,        0};
    if ((rv = attnd_reply_resolve(r, &hr, m->bias, &sb, &p.bias))) goto done;
    p.q = io.q, p.k = io.k, p.v = io.v, p.out = io.out;
    p.cu_seqlens_q = io.cu_q, p.cu_seqlens_k = io.cu_k;
    p.causal = m->causal;
    p.scale = or_default(m->scale, 1.0f / sqrtf((float)io.q.shape[2]));
    p.q_scale = or_default(m->q_scale, 1.0f);
    p.k_scale = or_default(m->k_scale, 1.0f);
    p.v_scale = or_default(m->v_scale, 1.0f);
    p.p_scale = or_default(m->p_scale, 1.0f);
    p.out_scale = or_default(m->out_scale, 1.0f);
    attnd_tensor *const staged[] = {&p.q,   &p.k, &p.v, &p.out, &p.cu_seqlens_q, &p.cu_seqlens_k,
                                    &p.bias};
    if ((rv = stage_in(sv, r, &hr, staged, 7)) == ATTND_ERR_OK)
        rv = attnd_varlen_attention(sv->be, &p);
done:
    return finish(sv, r, &hr, rv, "varlen_attention");
}

/* ---------------------------------------------------------------- block-sparse */

/* Each sequence is prefill (q_len == k_len) or decode (q_len == 1). */
static attnd_err check_bs_lengths(attnd_reply *r, const varlen_io *io)
{
    for (int64_t b = 0; b + 1 < io->cu_q.shape[0]; b++) {
        int64_t lq = idx_at(&io->cu_q, b + 1) - idx_at(&io->cu_q, b);
        int64_t lk = idx_at(&io->cu_k, b + 1) - idx_at(&io->cu_k, b);
        if (lq != lk && lq != 1)
            return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                    "cu_seqlens_q: sequence %lld has %lld queries for %lld keys "
                                    "(need equal, or 1)",
                                    (long long)b, (long long)lq, (long long)lk);
    }
    return ATTND_ERR_OK;
}

/* Every row a query can fall in exists; each head's row ranges lie inside layout_col and list
 * key blocks that exist. */
static attnd_err check_layout(attnd_reply *r, const attnd_tensor *crow, const attnd_tensor *col,
                              int64_t rows_needed, int64_t kblocks)
{
    int64_t H = crow->shape[0], R = crow->shape[1] - 1, C = col->shape[1];
    if (R < rows_needed)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "layout_crow.shape[1]: %lld rows, "
                                "the longest sequence needs %lld + 1",
                                (long long)R + 1, (long long)rows_needed);
    for (int64_t h = 0; h < H; h++) {
        const int32_t *cr = (const int32_t *)crow->data + h * crow->strides[0];
        const int32_t *cl = (const int32_t *)col->data + h * col->strides[0];
        for (int64_t i = 0; i <= R; i++)
            if (cr[i] < 0 || cr[i] > C || (i && cr[i] < cr[i - 1]))
                return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                        "layout_crow[%lld][%lld]: %d "
                                        "out of order or outside 0..%lld",
                                        (long long)h, (long long)i, cr[i], (long long)C);
        for (int64_t j = 0; j < cr[R]; j++)
            if (cl[j] < 0 || cl[j] >= kblocks)
                return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                        "layout_col[%lld][%lld]: %d "
                                        "not a key block (0..%lld)",
                                        (long long)h, (long long)j, cl[j], (long long)kblocks - 1);
    }
    return ATTND_ERR_OK;
}

static attnd_err bs_layout(attnd_reply *r, attnd_handles_req *hr,
                           const Attnd__BlocksparseAttention *m, const varlen_io *io,
                           attnd_blocksparse_params *p)
{
    attnd_err rv;
    int32_t bs = m->block_size, qbs = m->q_block_size ? m->q_block_size : m->block_size;
    if (bs != 16 && bs != 32 && bs != 64 && bs != 128)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "block_size: %d not 16, 32, 64 or 128", bs);
    if (qbs <= 0 || qbs > 4096)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "q_block_size: %d out of range",
                                qbs);
    const attnd_tref_spec sc = {"layout_crow", DT(I32), 2, {io->q.shape[1], ANY}, 0, 0, 1};
    const attnd_tref_spec sl = {"layout_col", DT(I32), 2, {io->q.shape[1], ANY}, 0, 0, 1};
    if ((rv = attnd_reply_resolve(r, hr, m->layout_crow, &sc, &p->layout_crow)) ||
        (rv = attnd_reply_resolve(r, hr, m->layout_col, &sl, &p->layout_col)))
        return rv;
    if (p->layout_crow.shape[1] < 1)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "layout_crow.shape[1]: 0");
    p->block_size = bs;
    p->q_block_size = qbs;
    return check_layout(r, &p->layout_crow, &p->layout_col, (io->max_k + qbs - 1) / qbs,
                        (io->max_k + bs - 1) / bs);
}

static attnd_err req_blocksparse(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__BlocksparseAttention *m = c->req->blocksparse;
    attnd_session *s = c->s;
    attnd_handles_req hr;
    attnd_blocksparse_params p = {0};
    varlen_io io;
    attnd_err rv;
    const Attnd__TensorRef *refs[] = {
        m->q, m->k, m->v, m->out, m->cu_seqlens_q, m->cu_seqlens_k, m->layout_crow, m->layout_col};
    if ((rv = attnd_reply_handles_begin(r, &hr, s, sv->limits.max_inline_bytes, refs, 8)))
        return rv;
    if ((rv = varlen_resolve(r, &hr, DT(F16) | DT(BF16), DT_FLOAT, refs, &io)) ||
        (rv = check_bs_lengths(r, &io)) || (rv = bs_layout(r, &hr, m, &io, &p)) ||
        (rv = check_max_len(r, "max_seqlen_q", m->max_seqlen_q, io.max_q, &p.max_seqlen_q)) ||
        (rv = check_max_len(r, "max_seqlen_k", m->max_seqlen_k, io.max_k, &p.max_seqlen_k)))
        goto done;
    p.q = io.q, p.k = io.k, p.v = io.v, p.out = io.out;
    p.cu_seqlens_q = io.cu_q, p.cu_seqlens_k = io.cu_k;
    p.scale = or_default(m->scale, 1.0f / sqrtf((float)io.q.shape[2]));
    attnd_tensor *const staged[] = {
        &p.q, &p.k, &p.v, &p.out, &p.cu_seqlens_q, &p.cu_seqlens_k, &p.layout_crow, &p.layout_col};
    if ((rv = stage_in(sv, r, &hr, staged, 8)) == ATTND_ERR_OK)
        rv = attnd_blocksparse_attention(sv->be, &p);
done:
    return finish(sv, r, &hr, rv, "blocksparse_attention");
}

/* ---------------------------------------------------------------- linear attention */

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* Look every seq_id up (0 = padding when allowed), refuse duplicates, assign state slots
 * (a fresh slot is zeroed in every layer). slots[b] = -1 for padding. */
static attnd_err linear_slots(attnd_serve *sv, attnd_session *s, const uint64_t *ids, size_t n,
                              int padding, int64_t *slots, attnd_reply *r)
{
    attnd_seq **seen = calloc(n ? n : 1, sizeof *seen);
    size_t nseen = 0;
    attnd_err rv = ATTND_ERR_OK;
    if (seen == NULL) return attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "seq_ids: out of memory");
    for (size_t b = 0; b < n && rv == ATTND_ERR_OK; b++) {
        slots[b] = -1;
        if (ids[b] == 0 && padding) continue;
        attnd_seq *q = ids[b] ? attnd_cache_find(sv->cache, s->id, ids[b]) : NULL;
        if (q == NULL)
            rv = attnd_reply_fail(r, ids[b] ? ATTND_ERR_NOT_FOUND : ATTND_ERR_INVALID_ARGUMENT,
                                  "seq_ids[%zu]: %llu %s", b, (unsigned long long)ids[b],
                                  ids[b] ? "not found in this session" : "is padding, decode only");
        else
            seen[nseen++] = q;
    }
    qsort(seen, nseen, sizeof *seen, cmp_ptr);
    for (size_t i = 1; i < nseen && rv == ATTND_ERR_OK; i++)
        if (seen[i] == seen[i - 1])
            rv = attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seq_ids: %llu listed twice",
                                  (unsigned long long)seen[i]->id);
    free(seen);
    for (size_t b = 0; b < n && rv == ATTND_ERR_OK; b++) {
        attnd_seq *q = ids[b] ? attnd_cache_find(sv->cache, s->id, ids[b]) : NULL;
        int32_t slot;
        int fresh;
        if (q == NULL) continue;
        if ((rv = attnd_cache_linear_slot(sv->cache, q, &slot, &fresh)) != ATTND_ERR_OK)
            return attnd_reply_fail(r, rv,
                                    "seq_ids[%zu]: no free linear state slot (linear.slots "
                                    "= %u)",
                                    b, sv->model.lin.slots);
        slots[b] = slot;
        if (fresh) rv = attnd_devmem_zero_linear(sv->dm, slot);
    }
    return rv;
}

static attnd_err linear_common(attnd_serve *sv, uint32_t layer, size_t nslopes, size_t batch,
                               size_t max_batch, attnd_reply *r)
{
    if (sv->model.lin.slots == 0)
        return attnd_reply_fail(r, ATTND_ERR_UNSUPPORTED,
                                "linear: no state cache (linear.slots = 0)");
    if (layer >= sv->model.geo.num_layers)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "layer: %u out of range (%u layers)",
                                layer, sv->model.geo.num_layers);
    if (batch == 0 || batch > max_batch)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seq_ids: %zu entries (1..%zu)",
                                batch, max_batch);
    if (nslopes != sv->model.lin.heads)
        return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                "slopes: %zu values, expected %u "
                                "(linear.heads)",
                                nslopes, sv->model.lin.heads);
    return ATTND_ERR_OK;
}

static attnd_tensor slopes_tensor(attnd_serve *sv, const float *slopes, void *dev)
{
    attnd_tensor t;
    int64_t h[1] = {sv->model.lin.heads};
    attnd_tensor_init(&t, dev ? dev : (void *)slopes, ATTND_DTYPE_F32, 1, h);
    return t;
}

/* One batch row of a prefill tensor. */
static attnd_tensor row_of(attnd_tensor t, int64_t b)
{
    t.data = (char *)t.data + b * t.strides[0] * (int64_t)attnd_dtype_size(t.dtype);
    t.shape[0] = 1;
    return t;
}

static attnd_err linear_prefill_rows(attnd_serve *sv, const Attnd__LinearPrefill *m,
                                     attnd_linear_prefill_params *p, const int64_t *slots)
{
    int64_t H = sv->model.lin.heads, d = sv->model.lin.head_dim, st[4] = {1, H, d, d};
    attnd_linear_prefill_params row = *p;
    attnd_err rv = ATTND_ERR_OK;
    size_t sb = attnd_model_linear_slot_bytes(&sv->model);
    /* states of a batch are not adjacent slots: one call per row, each on its own state */
    for (size_t b = 0; b < m->n_seq_ids && rv == ATTND_ERR_OK; b++) {
        row.q = row_of(p->q, (int64_t)b);
        row.k = row_of(p->k, (int64_t)b);
        row.v = row_of(p->v, (int64_t)b);
        row.out = row_of(p->out, (int64_t)b);
        attnd_tensor_init(&row.kv_state,
                          (char *)sv->dm->lin_state[m->layer] + (size_t)slots[b] * sb,
                          ATTND_DTYPE_F32, 4, st);
        rv = attnd_linear_prefill(sv->be, &row);
    }
    return rv;
}

static attnd_err req_linear_prefill(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__LinearPrefill *m = c->req->linear_prefill;
    attnd_session *s = c->s;
    attnd_handles_req hr;
    attnd_linear_prefill_params p = {0};
    int64_t B = (int64_t)m->n_seq_ids, H = sv->model.lin.heads, d = sv->model.lin.head_dim,
            *slots = NULL;
    void *dev = NULL;
    attnd_err rv;
    const Attnd__TensorRef *refs[] = {m->q, m->k, m->v, m->out};
    if ((rv = linear_common(sv, m->layer, m->n_slopes, m->n_seq_ids, sv->limits.max_seqs, r)))
        return rv;
    if ((rv = attnd_reply_handles_begin(r, &hr, s, sv->limits.max_inline_bytes, refs, 4)))
        return rv;
    const attnd_tref_spec sq = {"q", DT_FLOAT, 4, {B, H, ANY, d}, 0, 0, 0};
    if ((rv = attnd_reply_resolve(r, &hr, m->q, &sq, &p.q))) goto done;
    int64_t n = p.q.shape[2];
    const attnd_tref_spec sk = {"k", DT_FLOAT, 4, {B, H, n, d}, 0, 0, 0};
    const attnd_tref_spec sval = {"v", DT_FLOAT, 4, {B, H, n, d}, 0, 0, 0};
    const attnd_tref_spec so = {"out", DT_FLOAT, 4, {B, H, n, d}, 1, 0, 0};
    if ((rv = attnd_reply_resolve(r, &hr, m->k, &sk, &p.k)) ||
        (rv = attnd_reply_resolve(r, &hr, m->v, &sval, &p.v)) ||
        (rv = attnd_reply_resolve(r, &hr, m->out, &so, &p.out)))
        goto done;
    if (m->block_size < 0 || m->block_size > 65536) {
        rv = attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "block_size: %d out of range",
                              m->block_size);
        goto done;
    }
    if ((slots = malloc((size_t)B * sizeof *slots)) == NULL) {
        rv = attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "seq_ids: out of memory");
        goto done;
    }
    if ((rv = linear_slots(sv, s, m->seq_ids, m->n_seq_ids, 0, slots, r))) goto done;
    if ((rv = attnd_devmem_upload(sv->dm, m->slopes, (size_t)H * sizeof(float), &dev))) goto done;
    p.slopes = slopes_tensor(sv, m->slopes, dev);
    p.block_size = m->block_size;
    attnd_tensor *const staged[] = {&p.q, &p.k, &p.v, &p.out};
    if ((rv = stage_in(sv, r, &hr, staged, 4)) == ATTND_ERR_OK)
        rv = linear_prefill_rows(sv, m, &p, slots);
done:
    attnd_devmem_release(sv->dm, dev, m->slopes);
    free(slots);
    return finish(sv, r, &hr, rv, "linear_prefill");
}

static attnd_err req_linear_decode(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__LinearDecode *m = c->req->linear_decode;
    attnd_session *s = c->s;
    attnd_handles_req hr;
    attnd_linear_decode_params p = {0};
    int64_t B = (int64_t)m->n_seq_ids, H = sv->model.lin.heads, d = sv->model.lin.head_dim,
            *slots = NULL;
    int64_t cs[4] = {sv->model.lin.slots, H, d, d}, bs[1] = {B};
    void *dev_slopes = NULL, *dev_slots = NULL;
    attnd_err rv;
    const Attnd__TensorRef *refs[] = {m->q, m->k, m->v, m->out};
    if ((rv =
             linear_common(sv, m->layer, m->n_slopes, m->n_seq_ids, sv->limits.max_step_tokens, r)))
        return rv;
    if ((rv = attnd_reply_handles_begin(r, &hr, s, sv->limits.max_inline_bytes, refs, 4)))
        return rv;
    const attnd_tref_spec sq = {"q", DT_FLOAT, 3, {B, H, d}, 0, 0, 0};
    const attnd_tref_spec sk = {"k", DT_FLOAT, 3, {B, H, d}, 0, 0, 0};
    const attnd_tref_spec sval = {"v", DT_FLOAT, 3, {B, H, d}, 0, 0, 0};
    const attnd_tref_spec so = {"out", DT_FLOAT, 3, {B, H, d}, 1, 0, 0};
    if ((rv = attnd_reply_resolve(r, &hr, m->q, &sq, &p.q)) ||
        (rv = attnd_reply_resolve(r, &hr, m->k, &sk, &p.k)) ||
        (rv = attnd_reply_resolve(r, &hr, m->v, &sval, &p.v)) ||
        (rv = attnd_reply_resolve(r, &hr, m->out, &so, &p.out)))
        goto done;
    if ((slots = malloc((size_t)B * sizeof *slots)) == NULL) {
        rv = attnd_reply_fail(r, ATTND_ERR_NO_MEMORY, "seq_ids: out of memory");
        goto done;
    }
    if ((rv = linear_slots(sv, s, m->seq_ids, m->n_seq_ids, 1, slots, r)) ||
        (rv = attnd_devmem_upload(sv->dm, m->slopes, (size_t)H * sizeof(float), &dev_slopes)) ||
        (rv = attnd_devmem_upload(sv->dm, slots, (size_t)B * sizeof *slots, &dev_slots)))
        goto done;
    p.slopes = slopes_tensor(sv, m->slopes, dev_slopes);
    attnd_tensor_init(&p.kv_cache, sv->dm->lin_state[m->layer], ATTND_DTYPE_F32, 4, cs);
    attnd_tensor_init(&p.slot_idx, dev_slots, ATTND_DTYPE_I64, 1, bs);
    attnd_tensor *const staged[] = {&p.q, &p.k, &p.v, &p.out};
    if ((rv = stage_in(sv, r, &hr, staged, 4)) == ATTND_ERR_OK)
        rv = attnd_linear_decode(sv->be, &p);
done:
    attnd_devmem_release(sv->dm, dev_slopes, m->slopes);
    attnd_devmem_release(sv->dm, dev_slots, slots);
    free(slots);
    return finish(sv, r, &hr, rv, "linear_decode");
}

#define TENSOR_FLAGS (ATTND_REQ_SESSION | ATTND_REQ_DEVICE | ATTND_REQ_TIMED)

static const attnd_req_entry tensor_entries[] = {
    {ATTND__REQUEST__BODY_MERGE, "merge", req_merge, TENSOR_FLAGS},
    {ATTND__REQUEST__BODY_VARLEN, "varlen", req_varlen, TENSOR_FLAGS},
    {ATTND__REQUEST__BODY_BLOCKSPARSE, "blocksparse", req_blocksparse, TENSOR_FLAGS},
    {ATTND__REQUEST__BODY_LINEAR_PREFILL, "linear_prefill", req_linear_prefill, TENSOR_FLAGS},
    {ATTND__REQUEST__BODY_LINEAR_DECODE, "linear_decode", req_linear_decode, TENSOR_FLAGS},
};

const attnd_req_table attnd_req_tensor = {tensor_entries,
                                          sizeof tensor_entries / sizeof tensor_entries[0]};
