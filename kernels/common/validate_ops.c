/* Descriptor checks for merge states, varlen, block-sparse and linear attention. Every failure
 * names the field (and the value) in last_error and returns ATTND_ERR_INVALID_ARGUMENT; index
 * contents (cu_seqlens, layouts, slots) are read only when host_contents says they are host
 * memory. */
#include <math.h>
#include <stdlib.h>

#include "validate.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        attnd_err rv_ = (call);                                                                    \
        if (rv_ != ATTND_ERR_OK) return rv_;                                                       \
    } while (0)

#define DT_VARLEN_IN (ATTND_DT(F16) | ATTND_DT(BF16) | ATTND_DT(FP8_E4M3))
#define DT_HALF (ATTND_DT(F16) | ATTND_DT(BF16))

/* t has ref's dims from first to last-1 (names say which tensors disagree). */
static attnd_err check_dims_like(attnd_backend *b, const char *name, const attnd_tensor *t,
                                 const attnd_tensor *ref, int32_t first, int32_t last)
{
    for (int32_t d = first; d < last; d++)
        CHECK(attnd_check_dim(b, name, t, d, ref->shape[d]));
    return ATTND_ERR_OK;
}

static attnd_err check_same_dtype(attnd_backend *b, const char *name, const attnd_tensor *t,
                                  const char *ref_name, const attnd_tensor *ref)
{
    if (t->dtype != ref->dtype)
        return attnd_fail(b, "%s: dtype %s differs from %s (%s)", name, attnd_dtype_name(t->dtype),
                          ref_name, attnd_dtype_name(ref->dtype));
    return ATTND_ERR_OK;
}

/* A scale that divides or multiplies data: finite and > 0. */
static attnd_err check_scale(attnd_backend *b, const char *name, float v)
{
    if (!isfinite(v) || v <= 0.0f) return attnd_fail(b, "%s: %g must be finite and > 0", name, v);
    return ATTND_ERR_OK;
}

static attnd_err check_softmax_scale(attnd_backend *b, float v)
{
    if (!isfinite(v)) return attnd_fail(b, "scale: %g is not finite", v);
    return ATTND_ERR_OK;
}

static attnd_err check_max_len(attnd_backend *b, const char *name, int32_t v)
{
    if (v < 0) return attnd_fail(b, "%s: %d is negative", name, v);
    return ATTND_ERR_OK;
}

/* A tensor the op writes must not alias itself (e.g. a stride of 0): taken by increasing stride,
 * each dim of extent > 1 must step past everything the smaller dims span. Otherwise two work items
 * would write one element concurrently. */
static attnd_err check_no_overlap(attnd_backend *b, const char *name, const attnd_tensor *t)
{
    int32_t order[ATTND_MAX_DIMS], n = 0;
    if (t->data == NULL || attnd_tensor_numel(t) == 0) return ATTND_ERR_OK;
    for (int32_t d = 0; d < t->ndim; d++) { /* insertion sort of the dims by stride */
        if (t->shape[d] <= 1) continue;
        int32_t i = n++;
        for (; i > 0 && t->strides[order[i - 1]] > t->strides[d]; i--)
            order[i] = order[i - 1];
        order[i] = d;
    }
    int64_t span = 0; /* largest offset the dims taken so far reach */
    for (int32_t i = 0; i < n; i++) {
        int32_t d = order[i];
        if (t->strides[d] <= span)
            return attnd_fail(b,
                              "%s: strides overlap (dim %d, stride %lld): written tensors need "
                              "distinct elements",
                              name, d, (long long)t->strides[d]);
        span += (t->shape[d] - 1) * t->strides[d];
    }
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- merge states */

static attnd_err check_lse(attnd_backend *b, const char *name, const attnd_tensor *t, int64_t heads,
                           int64_t tokens, int optional)
{
    if (optional && t->data == NULL) return ATTND_ERR_OK;
    CHECK(attnd_check_tensor(b, name, t, 2, ATTND_DT(F32), 1));
    CHECK(attnd_check_dim(b, name, t, 0, heads));
    return attnd_check_dim(b, name, t, 1, tokens);
}

attnd_err attnd_validate_merge(attnd_backend *b, const attnd_merge_params *p)
{
    const attnd_tensor *o = &p->out;
    CHECK(attnd_check_tensor(b, "out", o, 3, ATTND_DT_FLOAT, 1));
    CHECK(attnd_check_head_size(b, "out", o->shape[2]));
    CHECK(attnd_check_tensor(b, "prefix_out", &p->prefix_out, 3, ATTND_DT_FLOAT, 1));
    CHECK(check_dims_like(b, "prefix_out", &p->prefix_out, o, 0, 3));
    CHECK(attnd_check_tensor(b, "suffix_out", &p->suffix_out, 3, ATTND_DT_FLOAT, 1));
    CHECK(check_dims_like(b, "suffix_out", &p->suffix_out, o, 0, 3));
    CHECK(check_lse(b, "prefix_lse", &p->prefix_lse, o->shape[1], o->shape[0], 0));
    CHECK(check_lse(b, "suffix_lse", &p->suffix_lse, o->shape[1], o->shape[0], 0));
    CHECK(check_lse(b, "out_lse", &p->out_lse, o->shape[1], o->shape[0], 1));
    CHECK(check_no_overlap(b, "out", o));
    return check_no_overlap(b, "out_lse", &p->out_lse);
}

/* ---------------------------------------------------------------- shared by varlen and sparse */

/* q, k, v, out of a packed varlen op: [total, heads, head_size], k/v/q one dtype, GQA heads. */
static attnd_err check_packed_qkv(attnd_backend *b, const attnd_tensor *q, const attnd_tensor *k,
                                  const attnd_tensor *v, uint32_t in_mask)
{
    CHECK(attnd_check_tensor(b, "q", q, 3, in_mask, 1));
    CHECK(attnd_check_head_size(b, "q", q->shape[2]));
    CHECK(attnd_check_tensor(b, "k", k, 3, in_mask, 1));
    CHECK(check_same_dtype(b, "k", k, "q", q));
    CHECK(attnd_check_dim(b, "k", k, 2, q->shape[2]));
    CHECK(attnd_check_tensor(b, "v", v, 3, in_mask, 1));
    CHECK(check_same_dtype(b, "v", v, "q", q));
    CHECK(check_dims_like(b, "v", v, k, 0, 3));
    return attnd_check_gqa(b, q->shape[1], k->shape[1]);
}

static attnd_err check_cu_shapes(attnd_backend *b, const attnd_tensor *cu_q,
                                 const attnd_tensor *cu_k)
{
    CHECK(attnd_check_tensor(b, "cu_seqlens_q", cu_q, 1, ATTND_DT(I32), 1));
    if (cu_q->shape[0] < 1)
        return attnd_fail(b, "cu_seqlens_q: needs batch + 1 >= 1 entries, has 0");
    CHECK(attnd_check_tensor(b, "cu_seqlens_k", cu_k, 1, ATTND_DT(I32), 1));
    return attnd_check_dim(b, "cu_seqlens_k", cu_k, 0, cu_q->shape[0]);
}

/* Offsets start >= 0, never decrease, end within total rows; lengths within max_len. */
static attnd_err check_cu_contents(attnd_backend *b, const char *name, const attnd_tensor *t,
                                   int64_t total, int64_t max_len, const char *max_name)
{
    int64_t prev = attnd_index_at(t, 0);
    if (prev < 0) return attnd_fail(b, "%s[0]: %lld is negative", name, (long long)prev);
    for (int64_t i = 1; i < t->shape[0]; i++) {
        int64_t cur = attnd_index_at(t, i);
        if (cur < prev)
            return attnd_fail(b, "%s[%lld]: %lld is below the previous entry %lld", name,
                              (long long)i, (long long)cur, (long long)prev);
        if (cur - prev > max_len)
            return attnd_fail(b, "%s: sequence %lld has length %lld > %s %lld", name,
                              (long long)i - 1, (long long)(cur - prev), max_name,
                              (long long)max_len);
        prev = cur;
    }
    if (prev > total)
        return attnd_fail(b, "%s: last entry %lld exceeds the %lld packed rows", name,
                          (long long)prev, (long long)total);
    return ATTND_ERR_OK;
}

static attnd_err check_cu_both(attnd_backend *b, const attnd_tensor *cu_q, const attnd_tensor *cu_k,
                               const attnd_tensor *q, const attnd_tensor *k, int32_t max_q,
                               int32_t max_k)
{
    CHECK(check_cu_contents(b, "cu_seqlens_q", cu_q, q->shape[0], max_q, "max_seqlen_q"));
    return check_cu_contents(b, "cu_seqlens_k", cu_k, k->shape[0], max_k, "max_seqlen_k");
}

/* ---------------------------------------------------------------- varlen */

static attnd_err varlen_check_tensors(attnd_backend *b, const attnd_varlen_params *p)
{
    CHECK(check_packed_qkv(b, &p->q, &p->k, &p->v, DT_VARLEN_IN));
    CHECK(attnd_check_tensor(b, "out", &p->out, 3, ATTND_DT_FLOAT | ATTND_DT(FP8_E4M3), 1));
    CHECK(check_dims_like(b, "out", &p->out, &p->q, 0, 3));
    CHECK(check_no_overlap(b, "out", &p->out));
    CHECK(check_cu_shapes(b, &p->cu_seqlens_q, &p->cu_seqlens_k));
    CHECK(attnd_check_optional(b, "bias", &p->bias, 4, ATTND_DT_FLOAT, 1));
    if (p->bias.data == NULL) return ATTND_ERR_OK;
    CHECK(attnd_check_dim(b, "bias", &p->bias, 0, p->cu_seqlens_q.shape[0] - 1));
    CHECK(attnd_check_dim(b, "bias", &p->bias, 1, p->q.shape[1]));
    CHECK(attnd_check_dim(b, "bias", &p->bias, 2, p->max_seqlen_q));
    return attnd_check_dim(b, "bias", &p->bias, 3, p->max_seqlen_k);
}

static attnd_err varlen_check_scalars(attnd_backend *b, const attnd_varlen_params *p)
{
    CHECK(check_max_len(b, "max_seqlen_q", p->max_seqlen_q));
    CHECK(check_max_len(b, "max_seqlen_k", p->max_seqlen_k));
    CHECK(check_softmax_scale(b, p->scale));
    if (p->q.dtype == ATTND_DTYPE_FP8_E4M3) {
        CHECK(check_scale(b, "q_scale", p->q_scale));
        CHECK(check_scale(b, "k_scale", p->k_scale));
        CHECK(check_scale(b, "v_scale", p->v_scale));
        CHECK(check_scale(b, "p_scale", p->p_scale));
    }
    if (p->out.dtype == ATTND_DTYPE_FP8_E4M3) CHECK(check_scale(b, "out_scale", p->out_scale));
    return ATTND_ERR_OK;
}

attnd_err attnd_validate_varlen(attnd_backend *b, const attnd_varlen_params *p, int host_contents)
{
    CHECK(varlen_check_scalars(b, p));
    CHECK(varlen_check_tensors(b, p));
    if (!host_contents) return ATTND_ERR_OK;
    return check_cu_both(b, &p->cu_seqlens_q, &p->cu_seqlens_k, &p->q, &p->k, p->max_seqlen_q,
                         p->max_seqlen_k);
}

/* ---------------------------------------------------------------- block-sparse */

static int64_t i32_2d(const attnd_tensor *t, int64_t i, int64_t j)
{
    return ((const int32_t *)t->data)[i * t->strides[0] + j * t->strides[1]];
}

static int is_sparse_block(int32_t v, int allow_zero)
{
    return (allow_zero && v == 0) || v == 16 || v == 32 || v == 64 || v == 128;
}

static attnd_err bs_check_tensors(attnd_backend *b, const attnd_blocksparse_params *p)
{
    CHECK(check_packed_qkv(b, &p->q, &p->k, &p->v, DT_HALF));
    CHECK(attnd_check_tensor(b, "out", &p->out, 3, ATTND_DT_FLOAT, 1));
    CHECK(check_dims_like(b, "out", &p->out, &p->q, 0, 3));
    CHECK(check_no_overlap(b, "out", &p->out));
    CHECK(check_cu_shapes(b, &p->cu_seqlens_q, &p->cu_seqlens_k));
    CHECK(attnd_check_tensor(b, "layout_crow", &p->layout_crow, 2, ATTND_DT(I32), 1));
    CHECK(attnd_check_dim(b, "layout_crow", &p->layout_crow, 0, p->q.shape[1]));
    if (p->layout_crow.shape[1] < 1)
        return attnd_fail(b, "layout_crow: needs num_row_blocks + 1 >= 1 columns, has 0");
    CHECK(attnd_check_tensor(b, "layout_col", &p->layout_col, 2, ATTND_DT(I32), 1));
    return attnd_check_dim(b, "layout_col", &p->layout_col, 0, p->q.shape[1]);
}

static attnd_err bs_check_scalars(attnd_backend *b, const attnd_blocksparse_params *p)
{
    if (!is_sparse_block(p->block_size, 0))
        return attnd_fail(b, "block_size: %d is not 16, 32, 64 or 128", p->block_size);
    if (!is_sparse_block(p->q_block_size, 1))
        return attnd_fail(b, "q_block_size: %d is not 0, 16, 32, 64 or 128", p->q_block_size);
    CHECK(check_max_len(b, "max_seqlen_q", p->max_seqlen_q));
    CHECK(check_max_len(b, "max_seqlen_k", p->max_seqlen_k));
    return check_softmax_scale(b, p->scale);
}

/* Each sequence is prefill (q_len == k_len) or decode (q_len == 1, k_len >= 1) and its last
 * position lies in a layout row. */
static attnd_err bs_check_seqs(attnd_backend *b, const attnd_blocksparse_params *p, int64_t qbs)
{
    int64_t rows = p->layout_crow.shape[1] - 1;
    for (int64_t s = 0; s + 1 < p->cu_seqlens_q.shape[0]; s++) {
        int64_t lq = attnd_index_at(&p->cu_seqlens_q, s + 1) - attnd_index_at(&p->cu_seqlens_q, s);
        int64_t lk = attnd_index_at(&p->cu_seqlens_k, s + 1) - attnd_index_at(&p->cu_seqlens_k, s);
        if (lq != lk && (lq != 1 || lk < 1)) /* a decode query is one of its own keys */
            return attnd_fail(b,
                              "cu_seqlens_q: sequence %lld has q_len %lld and k_len %lld "
                              "(need q_len == k_len, or q_len == 1 <= k_len)",
                              (long long)s, (long long)lq, (long long)lk);
        if (lk > 0 && (lk - 1) / qbs >= rows)
            return attnd_fail(b,
                              "layout_crow: %lld row blocks do not cover sequence %lld "
                              "(%lld keys, q_block_size %lld)",
                              (long long)rows, (long long)s, (long long)lk, (long long)qbs);
    }
    return ATTND_ERR_OK;
}

/* Row r of head h lists key blocks in strictly increasing order, each below num_col_blocks. */
static attnd_err bs_check_row(attnd_backend *b, const attnd_blocksparse_params *p, int64_t h,
                              int64_t r, int64_t num_col_blocks)
{
    int64_t c0 = i32_2d(&p->layout_crow, h, r), c1 = i32_2d(&p->layout_crow, h, r + 1), prev = -1;
    for (int64_t c = c0; c < c1; c++) {
        int64_t kb = i32_2d(&p->layout_col, h, c);
        if (kb < 0 || kb >= num_col_blocks)
            return attnd_fail(b, "layout_col[%lld][%lld]: block %lld out of range [0, %lld)",
                              (long long)h, (long long)c, (long long)kb, (long long)num_col_blocks);
        if (kb <= prev)
            return attnd_fail(b, "layout_col[%lld][%lld]: block %lld not above %lld (row %lld)",
                              (long long)h, (long long)c, (long long)kb, (long long)prev,
                              (long long)r);
        prev = kb;
    }
    return ATTND_ERR_OK;
}

/* CSR per head: crow starts >= 0, never decreases, ends within layout_col's columns. Key blocks
 * must lie within the positions the layout's rows cover. */
static attnd_err bs_check_layout(attnd_backend *b, const attnd_blocksparse_params *p, int64_t qbs)
{
    int64_t rows = p->layout_crow.shape[1] - 1, cols = p->layout_col.shape[1];
    int64_t num_col_blocks = (rows * qbs + p->block_size - 1) / p->block_size;
    for (int64_t h = 0; h < p->layout_crow.shape[0]; h++) {
        for (int64_t r = 0; r <= rows; r++) {
            int64_t c = i32_2d(&p->layout_crow, h, r);
            int64_t prev = r > 0 ? i32_2d(&p->layout_crow, h, r - 1) : 0;
            if (c < prev || c > cols)
                return attnd_fail(b,
                                  "layout_crow[%lld][%lld]: %lld out of range (previous %lld, "
                                  "layout_col has %lld columns)",
                                  (long long)h, (long long)r, (long long)c, (long long)prev,
                                  (long long)cols);
        }
        for (int64_t r = 0; r < rows; r++)
            CHECK(bs_check_row(b, p, h, r, num_col_blocks));
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_validate_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p,
                                     int host_contents)
{
    CHECK(bs_check_scalars(b, p));
    CHECK(bs_check_tensors(b, p));
    if (!host_contents) return ATTND_ERR_OK;
    int64_t qbs = p->q_block_size > 0 ? p->q_block_size : p->block_size;
    CHECK(check_cu_both(b, &p->cu_seqlens_q, &p->cu_seqlens_k, &p->q, &p->k, p->max_seqlen_q,
                        p->max_seqlen_k));
    CHECK(bs_check_seqs(b, p, qbs));
    return bs_check_layout(b, p, qbs);
}

/* ---------------------------------------------------------------- linear attention */

/* q, k, v, out of either form: nd dims, q/k/v one float dtype, v and out sharing the leading
 * nd-1 dims of q, head sizes d (q) and e (v) in range. */
static attnd_err linear_check_qkvo(attnd_backend *b, const attnd_tensor *q, const attnd_tensor *k,
                                   const attnd_tensor *v, const attnd_tensor *out, int32_t nd)
{
    CHECK(attnd_check_tensor(b, "q", q, nd, ATTND_DT_FLOAT, 1));
    CHECK(attnd_check_head_size(b, "q", q->shape[nd - 1]));
    CHECK(attnd_check_tensor(b, "k", k, nd, ATTND_DT_FLOAT, 1));
    CHECK(check_same_dtype(b, "k", k, "q", q));
    CHECK(check_dims_like(b, "k", k, q, 0, nd));
    CHECK(attnd_check_tensor(b, "v", v, nd, ATTND_DT_FLOAT, 1));
    CHECK(check_same_dtype(b, "v", v, "q", q));
    CHECK(check_dims_like(b, "v", v, q, 0, nd - 1));
    CHECK(attnd_check_head_size(b, "v", v->shape[nd - 1]));
    CHECK(attnd_check_tensor(b, "out", out, nd, ATTND_DT_FLOAT, 1));
    CHECK(check_dims_like(b, "out", out, v, 0, nd));
    return check_no_overlap(b, "out", out);
}

/* slopes [heads] f32; state [lead, heads, d, e] f32 (lead checked by the caller). */
static attnd_err linear_check_state(attnd_backend *b, const char *name, const attnd_tensor *state,
                                    const attnd_tensor *slopes, int64_t heads, int64_t d, int64_t e)
{
    CHECK(attnd_check_tensor(b, "slopes", slopes, 1, ATTND_DT(F32), 1));
    CHECK(attnd_check_dim(b, "slopes", slopes, 0, heads));
    CHECK(attnd_check_tensor(b, name, state, 4, ATTND_DT(F32), 1));
    CHECK(attnd_check_dim(b, name, state, 1, heads));
    CHECK(attnd_check_dim(b, name, state, 2, d));
    CHECK(attnd_check_dim(b, name, state, 3, e));
    return check_no_overlap(b, name, state);
}

attnd_err attnd_validate_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p)
{
    CHECK(linear_check_qkvo(b, &p->q, &p->k, &p->v, &p->out, 4));
    CHECK(linear_check_state(b, "kv_state", &p->kv_state, &p->slopes, p->q.shape[1], p->q.shape[3],
                             p->v.shape[3]));
    CHECK(attnd_check_dim(b, "kv_state", &p->kv_state, 0, p->q.shape[0]));
    if (p->block_size != 0 && (p->block_size < 16 || p->block_size > 1024 || p->block_size % 16))
        return attnd_fail(b, "block_size: %d is not 0 or a multiple of 16 in 16..1024",
                          p->block_size);
    return ATTND_ERR_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Each slot is -1 (padding) or a cache slot, and no slot serves two rows (their updates would
 * race). */
static attnd_err linear_check_slots(attnd_backend *b, const attnd_tensor *slot_idx,
                                    int64_t num_slots)
{
    int64_t n = slot_idx->shape[0], used = 0;
    int64_t *seen = malloc((size_t)(n > 0 ? n : 1) * sizeof *seen);
    if (seen == NULL) return ATTND_ERR_NO_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = attnd_index_at(slot_idx, i);
        if (s == -1) continue;
        if (s < 0 || s >= num_slots) {
            free(seen);
            return attnd_fail(b, "slot_idx[%lld]: %lld is neither -1 nor in [0, %lld)",
                              (long long)i, (long long)s, (long long)num_slots);
        }
        seen[used++] = s;
    }
    qsort(seen, (size_t)used, sizeof *seen, cmp_i64);
    for (int64_t i = 1; i < used; i++) {
        if (seen[i] == seen[i - 1]) {
            int64_t s = seen[i];
            free(seen);
            return attnd_fail(b, "slot_idx: slot %lld is used by two batch rows", (long long)s);
        }
    }
    free(seen);
    return ATTND_ERR_OK;
}

attnd_err attnd_validate_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p,
                                       int host_contents)
{
    CHECK(linear_check_qkvo(b, &p->q, &p->k, &p->v, &p->out, 3));
    CHECK(linear_check_state(b, "kv_cache", &p->kv_cache, &p->slopes, p->q.shape[1], p->q.shape[2],
                             p->v.shape[2]));
    CHECK(attnd_check_tensor(b, "slot_idx", &p->slot_idx, 1, ATTND_DT_INDEX, 1));
    CHECK(attnd_check_dim(b, "slot_idx", &p->slot_idx, 0, p->q.shape[0]));
    if (!host_contents) return ATTND_ERR_OK;
    return linear_check_slots(b, &p->slot_idx, p->kv_cache.shape[0]);
}
