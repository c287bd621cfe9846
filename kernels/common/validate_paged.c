/* Descriptor checks for paged attention and cache write, shared by both backends. Dtypes, ranks
 * and shapes always; with host_contents also the index contents a kernel follows (offsets,
 * lengths, block ids, slots), so a bad request fails here, naming the field and the value,
 * instead of reading or writing out of bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "validate.h"

static int finite_positive(float x)
{
    return isfinite(x) && x > 0.0f;
}

static int64_t i32_at2(const attnd_tensor *t, int64_t i, int64_t j)
{
    return ((const int32_t *)t->data)[i * t->strides[0] + j * t->strides[1]];
}

/* k_cache and v_cache: [num_blocks, block_size, num_kv_heads, head_size], one dtype and shape. */
static attnd_err check_cache_pair(attnd_backend *b, const attnd_tensor *k, const attnd_tensor *v)
{
    attnd_err rv;
    if ((rv = attnd_check_tensor(b, "k_cache", k, 4, ATTND_DT_CACHE, 1)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_tensor(b, "v_cache", v, 4, ATTND_DT_CACHE, 1)) != ATTND_ERR_OK) return rv;
    if (v->dtype != k->dtype)
        return attnd_fail(b, "v_cache: dtype %s differs from k_cache's %s",
                          attnd_dtype_name(v->dtype), attnd_dtype_name(k->dtype));
    for (int32_t d = 0; d < 4; d++)
        if ((rv = attnd_check_dim(b, "v_cache", v, d, k->shape[d])) != ATTND_ERR_OK) return rv;
    int64_t bs = k->shape[1];
    if (bs != 16 && bs != 32 && bs != 64)
        return attnd_fail(b, "k_cache: block size %lld not one of 16, 32, 64", (long long)bs);
    if (k->shape[2] < 1) return attnd_fail(b, "k_cache: num_kv_heads is 0");
    return attnd_check_head_size(b, "k_cache", k->shape[3]);
}

/* fp8 caches need finite, positive dequantisation scales; other dtypes ignore them. */
static attnd_err check_cache_scales(attnd_backend *b, attnd_dtype cache, float k_scale,
                                    float v_scale)
{
    if (cache != ATTND_DTYPE_FP8_E4M3) return ATTND_ERR_OK;
    if (!finite_positive(k_scale))
        return attnd_fail(b, "k_scale: %g must be finite and > 0 for an fp8 cache", k_scale);
    if (!finite_positive(v_scale))
        return attnd_fail(b, "v_scale: %g must be finite and > 0 for an fp8 cache", v_scale);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- paged attention */

static attnd_err paged_tensors(attnd_backend *b, const attnd_paged_params *p)
{
    attnd_err rv;
    if ((rv = attnd_check_tensor(b, "q", &p->q, 3, ATTND_DT_FLOAT, 1)) != ATTND_ERR_OK) return rv;
    if ((rv = check_cache_pair(b, &p->k_cache, &p->v_cache)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_tensor(b, "out", &p->out, 3, ATTND_DT_FLOAT, 1)) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_optional(b, "out_lse", &p->out_lse, 2, ATTND_DT(F32), 0)) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_tensor(b, "block_tables", &p->block_tables, 2, ATTND_DT(I32), 0)) !=
        ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_tensor(b, "seq_lens", &p->seq_lens, 1, ATTND_DT(I32), 0)) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_tensor(b, "query_start_loc", &p->query_start_loc, 1, ATTND_DT(I32), 0)) !=
        ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_optional(b, "alibi_slopes", &p->alibi_slopes, 1, ATTND_DT(F32), 0)) !=
        ATTND_ERR_OK)
        return rv;
    return attnd_check_optional(b, "sinks", &p->sinks, 1, ATTND_DT(F32), 0);
}

static attnd_err paged_shapes(attnd_backend *b, const attnd_paged_params *p)
{
    attnd_err rv;
    int64_t num_tokens = p->q.shape[0], hq = p->q.shape[1], num_seqs = p->seq_lens.shape[0];
    if ((rv = attnd_check_head_size(b, "q", p->q.shape[2])) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_dim(b, "k_cache", &p->k_cache, 3, p->q.shape[2])) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_gqa(b, hq, p->k_cache.shape[2])) != ATTND_ERR_OK) return rv;
    for (int32_t d = 0; d < 3; d++)
        if ((rv = attnd_check_dim(b, "out", &p->out, d, p->q.shape[d])) != ATTND_ERR_OK) return rv;
    if (p->out_lse.data != NULL &&
        ((rv = attnd_check_dim(b, "out_lse", &p->out_lse, 0, hq)) != ATTND_ERR_OK ||
         (rv = attnd_check_dim(b, "out_lse", &p->out_lse, 1, num_tokens)) != ATTND_ERR_OK))
        return rv;
    if (p->alibi_slopes.data != NULL &&
        (rv = attnd_check_dim(b, "alibi_slopes", &p->alibi_slopes, 0, hq)) != ATTND_ERR_OK)
        return rv;
    if (p->sinks.data != NULL &&
        (rv = attnd_check_dim(b, "sinks", &p->sinks, 0, hq)) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_dim(b, "block_tables", &p->block_tables, 0, num_seqs)) != ATTND_ERR_OK)
        return rv;
    return attnd_check_dim(b, "query_start_loc", &p->query_start_loc, 0, num_seqs + 1);
}

static attnd_err paged_scalars(attnd_backend *b, const attnd_paged_params *p)
{
    attnd_err rv;
    if (!isfinite(p->scale)) return attnd_fail(b, "scale: %g is not finite", p->scale);
    if (!(isfinite(p->softcap) && p->softcap >= 0.0f))
        return attnd_fail(b, "softcap: %g must be finite and >= 0 (0 = off)", p->softcap);
    if (p->sliding_window < 0)
        return attnd_fail(b, "sliding_window: %d is negative (0 = off)", p->sliding_window);
    if (p->max_query_len < 0)
        return attnd_fail(b, "max_query_len: %d is negative", p->max_query_len);
    if (p->max_seq_len < 0) return attnd_fail(b, "max_seq_len: %d is negative", p->max_seq_len);
    if ((rv = check_cache_scales(b, p->k_cache.dtype, p->k_scale, p->v_scale)) != ATTND_ERR_OK)
        return rv;
    return ATTND_ERR_OK;
}

/* query_start_loc: 0, non-decreasing, ending at num_tokens. */
static attnd_err paged_offsets(attnd_backend *b, const attnd_paged_params *p)
{
    const attnd_tensor *qsl = &p->query_start_loc;
    int64_t n = qsl->shape[0], num_tokens = p->q.shape[0];
    if (attnd_index_at(qsl, 0) != 0)
        return attnd_fail(b, "query_start_loc[0]: is %lld, must be 0",
                          (long long)attnd_index_at(qsl, 0));
    for (int64_t s = 1; s < n; s++) {
        int64_t prev = attnd_index_at(qsl, s - 1), cur = attnd_index_at(qsl, s);
        if (cur < prev)
            return attnd_fail(b, "query_start_loc[%lld]: %lld is less than the previous entry %lld",
                              (long long)s, (long long)cur, (long long)prev);
    }
    if (attnd_index_at(qsl, n - 1) != num_tokens)
        return attnd_fail(b, "query_start_loc[%lld]: last entry %lld != num_tokens %lld",
                          (long long)(n - 1), (long long)attnd_index_at(qsl, n - 1),
                          (long long)num_tokens);
    return ATTND_ERR_OK;
}

/* Sequence s: lengths consistent with its queries, the table and the declared maxima; every
 * block holding one of its keys (all are read when it has queries) is a real block. */
static attnd_err paged_sequence(attnd_backend *b, const attnd_paged_params *p, int64_t s)
{
    int64_t qlen =
        attnd_index_at(&p->query_start_loc, s + 1) - attnd_index_at(&p->query_start_loc, s);
    int64_t seq_len = attnd_index_at(&p->seq_lens, s), bs = p->k_cache.shape[1];
    int64_t max_blocks = p->block_tables.shape[1], num_blocks = p->k_cache.shape[0];
    if (seq_len < qlen)
        return attnd_fail(b, "seq_lens[%lld]: %lld is less than the sequence's query length %lld",
                          (long long)s, (long long)seq_len, (long long)qlen);
    if ((seq_len + bs - 1) / bs > max_blocks) /* divide: max_blocks x bs may overflow */
        return attnd_fail(b,
                          "seq_lens[%lld]: %lld exceeds max_blocks_per_seq %lld x block size %lld",
                          (long long)s, (long long)seq_len, (long long)max_blocks, (long long)bs);
    if (qlen > p->max_query_len)
        return attnd_fail(b,
                          "max_query_len: %d is less than the query length %lld of sequence %lld",
                          p->max_query_len, (long long)qlen, (long long)s);
    if (seq_len > p->max_seq_len)
        return attnd_fail(b, "max_seq_len: %d is less than seq_lens[%lld] = %lld", p->max_seq_len,
                          (long long)s, (long long)seq_len);
    for (int64_t blk = 0; qlen > 0 && blk * bs < seq_len; blk++) {
        int64_t id = i32_at2(&p->block_tables, s, blk);
        if (id < 0 || id >= num_blocks)
            return attnd_fail(b, "block_tables[%lld][%lld]: block id %lld out of range [0, %lld)",
                              (long long)s, (long long)blk, (long long)id, (long long)num_blocks);
    }
    return ATTND_ERR_OK;
}

/* A sink of +inf or NaN would make every output of its head NaN; -inf is no sink. */
static attnd_err paged_sinks(attnd_backend *b, const attnd_paged_params *p)
{
    const attnd_tensor *t = &p->sinks;
    for (int64_t h = 0; t->data != NULL && h < t->shape[0]; h++) {
        float x = ((const float *)t->data)[h * t->strides[0]];
        if (isnan(x) || x == INFINITY)
            return attnd_fail(b, "sinks[%lld]: %g is not a logit (finite, or -inf for none)",
                              (long long)h, x);
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_check_cache_features(attnd_backend *b, attnd_dtype cache)
{
    if (cache != ATTND_DTYPE_F32 || attnd_backend_has(b, ATTND_FEATURE_F32_CACHE))
        return ATTND_ERR_OK;
    snprintf(b->last_error, sizeof b->last_error,
             "k_cache: an f32 cache is not implemented by backend %s", b->ops->name);
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_check_paged_features(attnd_backend *b, const attnd_paged_params *p)
{
    if (p->sinks.data != NULL && !attnd_backend_has(b, ATTND_FEATURE_SINKS)) {
        snprintf(b->last_error, sizeof b->last_error, "sinks: not implemented by backend %s",
                 b->ops->name);
        return ATTND_ERR_UNSUPPORTED;
    }
    return attnd_check_cache_features(b, p->k_cache.dtype);
}

attnd_err attnd_validate_paged(attnd_backend *b, const attnd_paged_params *p, int host_contents)
{
    attnd_err rv;
    if ((rv = paged_tensors(b, p)) != ATTND_ERR_OK) return rv;
    if ((rv = paged_shapes(b, p)) != ATTND_ERR_OK) return rv;
    if ((rv = paged_scalars(b, p)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_paged_features(b, p)) != ATTND_ERR_OK) return rv;
    if (!host_contents) return ATTND_ERR_OK;
    if ((rv = paged_sinks(b, p)) != ATTND_ERR_OK) return rv;
    if ((rv = paged_offsets(b, p)) != ATTND_ERR_OK) return rv;
    for (int64_t s = 0; s < p->seq_lens.shape[0]; s++)
        if ((rv = paged_sequence(b, p, s)) != ATTND_ERR_OK) return rv;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- cache write */

static attnd_err cache_write_shapes(attnd_backend *b, const attnd_cache_write_params *p)
{
    attnd_err rv;
    if ((rv = attnd_check_tensor(b, "key", &p->key, 3, ATTND_DT_FLOAT, 1)) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_tensor(b, "value", &p->value, 3, ATTND_DT_FLOAT, 1)) != ATTND_ERR_OK)
        return rv;
    if ((rv = check_cache_pair(b, &p->k_cache, &p->v_cache)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_tensor(b, "slot_mapping", &p->slot_mapping, 1, ATTND_DT_INDEX, 0)) !=
        ATTND_ERR_OK)
        return rv;
    if (p->value.dtype != p->key.dtype)
        return attnd_fail(b, "value: dtype %s differs from key's %s",
                          attnd_dtype_name(p->value.dtype), attnd_dtype_name(p->key.dtype));
    for (int32_t d = 0; d < 3; d++)
        if ((rv = attnd_check_dim(b, "value", &p->value, d, p->key.shape[d])) != ATTND_ERR_OK)
            return rv;
    if ((rv = attnd_check_dim(b, "k_cache", &p->k_cache, 2, p->key.shape[1])) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_dim(b, "k_cache", &p->k_cache, 3, p->key.shape[2])) != ATTND_ERR_OK)
        return rv;
    if ((rv = attnd_check_dim(b, "slot_mapping", &p->slot_mapping, 0, p->key.shape[0])) !=
        ATTND_ERR_OK)
        return rv;
    return check_cache_scales(b, p->k_cache.dtype, p->k_scale, p->v_scale);
}

typedef struct slot_ref {
    int64_t slot, token;
} slot_ref;

static int slot_ref_cmp(const void *a, const void *b)
{
    const slot_ref *x = a, *y = b;
    if (x->slot != y->slot) return x->slot < y->slot ? -1 : 1;
    return x->token < y->token ? -1 : x->token > y->token;
}

/* Two tokens writing one slot would race (and on the GPU land in either order): reject. */
static attnd_err cache_write_unique(attnd_backend *b, const attnd_tensor *sm)
{
    int64_t n = sm->shape[0], m = 0;
    slot_ref *refs = malloc((size_t)(n > 0 ? n : 1) * sizeof *refs);
    attnd_err rv = ATTND_ERR_OK;
    if (refs == NULL) {
        snprintf(b->last_error, sizeof b->last_error, "slot_mapping: out of host memory");
        return ATTND_ERR_NO_MEMORY;
    }
    for (int64_t t = 0; t < n; t++) {
        int64_t slot = attnd_index_at(sm, t);
        if (slot >= 0) refs[m++] = (slot_ref){slot, t};
    }
    qsort(refs, (size_t)m, sizeof *refs, slot_ref_cmp);
    for (int64_t i = 1; i < m && rv == ATTND_ERR_OK; i++)
        if (refs[i].slot == refs[i - 1].slot)
            rv = attnd_fail(b, "slot_mapping[%lld]: slot %lld already written by token %lld",
                            (long long)refs[i].token, (long long)refs[i].slot,
                            (long long)refs[i - 1].token);
    free(refs);
    return rv;
}

attnd_err attnd_validate_cache_write(attnd_backend *b, const attnd_cache_write_params *p,
                                     int host_contents)
{
    attnd_err rv;
    if ((rv = cache_write_shapes(b, p)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_check_cache_features(b, p->k_cache.dtype)) != ATTND_ERR_OK) return rv;
    if (!host_contents) return ATTND_ERR_OK;
    for (int64_t t = 0; t < p->slot_mapping.shape[0]; t++) {
        int64_t slot = attnd_index_at(&p->slot_mapping, t);
        if (slot / p->k_cache.shape[1] >= p->k_cache.shape[0])
            return attnd_fail(b,
                              "slot_mapping[%lld]: slot %lld out of range (num_blocks %lld x "
                              "block size %lld)",
                              (long long)t, (long long)slot, (long long)p->k_cache.shape[0],
                              (long long)p->k_cache.shape[1]);
    }
    return cache_write_unique(b, &p->slot_mapping);
}
