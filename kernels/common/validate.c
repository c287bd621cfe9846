#include "validate.h"

#include <stdio.h>

attnd_err attnd_fail(attnd_backend *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->last_error, sizeof b->last_error, fmt, ap);
    va_end(ap);
    return ATTND_ERR_INVALID_ARGUMENT;
}

attnd_err attnd_check_tensor(attnd_backend *b, const char *name, const attnd_tensor *t,
                             int32_t ndim, uint32_t dtype_mask, int contiguous_last)
{
    if (t->data == NULL) return attnd_fail(b, "%s: missing (null data pointer)", name);
    if (t->ndim != ndim) return attnd_fail(b, "%s: expected %d dims, got %d", name, ndim, t->ndim);
    if ((unsigned)t->dtype >= ATTND_DTYPE_COUNT || !(dtype_mask & (1u << t->dtype)))
        return attnd_fail(b, "%s: dtype %s not accepted here", name, attnd_dtype_name(t->dtype));
    for (int32_t d = 0; d < ndim; d++) {
        if (t->shape[d] < 0) return attnd_fail(b, "%s: shape[%d] is negative", name, d);
        if (t->strides[d] < 0) return attnd_fail(b, "%s: strides[%d] is negative", name, d);
    }
    if (contiguous_last && ndim > 0 && t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 1)
        return attnd_fail(b, "%s: innermost stride must be 1, got %lld", name,
                          (long long)t->strides[ndim - 1]);
    if (attnd_tensor_span(t) < 0) return attnd_fail(b, "%s: shape x strides overflows", name);
    return ATTND_ERR_OK;
}

attnd_err attnd_check_optional(attnd_backend *b, const char *name, const attnd_tensor *t,
                               int32_t ndim, uint32_t dtype_mask, int contiguous_last)
{
    if (t->data == NULL) return ATTND_ERR_OK;
    return attnd_check_tensor(b, name, t, ndim, dtype_mask, contiguous_last);
}

attnd_err attnd_check_dim(attnd_backend *b, const char *name, const attnd_tensor *t, int32_t d,
                          int64_t want)
{
    if (t->shape[d] != want)
        return attnd_fail(b, "%s: shape[%d] is %lld, expected %lld", name, d,
                          (long long)t->shape[d], (long long)want);
    return ATTND_ERR_OK;
}

attnd_err attnd_check_head_size(attnd_backend *b, const char *name, int64_t head_size)
{
    if (head_size < ATTND_HEAD_SIZE_MIN || head_size > ATTND_HEAD_SIZE_MAX || head_size % 8)
        return attnd_fail(b, "%s: head size %lld out of range (32..256, multiple of 8)", name,
                          (long long)head_size);
    return ATTND_ERR_OK;
}

attnd_err attnd_check_gqa(attnd_backend *b, int64_t num_q_heads, int64_t num_kv_heads)
{
    if (num_q_heads <= 0 || num_kv_heads <= 0 || num_q_heads % num_kv_heads)
        return attnd_fail(b, "num_q_heads %lld is not a positive multiple of num_kv_heads %lld",
                          (long long)num_q_heads, (long long)num_kv_heads);
    return ATTND_ERR_OK;
}

int64_t attnd_tensor_span(const attnd_tensor *t)
{
    int64_t span = 0;
    for (int32_t d = 0; d < t->ndim && d < ATTND_MAX_DIMS; d++) {
        if (t->shape[d] == 0) return 0;
        int64_t term;
        if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &term)) return -1;
        if (__builtin_add_overflow(span, term, &span)) return -1;
    }
    return span;
}

int64_t attnd_index_at(const attnd_tensor *t, int64_t i)
{
    int64_t off = i * (t->ndim > 0 ? t->strides[0] : 1);
    if (t->dtype == ATTND_DTYPE_I64) return ((const int64_t *)t->data)[off];
    return ((const int32_t *)t->data)[off];
}
