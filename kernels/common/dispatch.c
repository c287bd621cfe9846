/* Public entry points: validate descriptors once, here, then call the backend's table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "validate.h"

static const attnd_backend_ops *find_backend(const char *name)
{
    if (strcmp(name, attnd_cpu_backend_ops.name) == 0) return &attnd_cpu_backend_ops;
#ifdef ATTND_HAVE_CUDA
    if (strcmp(name, attnd_cuda_backend_ops.name) == 0) return &attnd_cuda_backend_ops;
#endif
    return NULL;
}

int attnd_backend_available(const char *name)
{
    return name != NULL && find_backend(name) != NULL;
}

attnd_err attnd_backend_open(attnd_backend **out, const char *name, const attnd_backend_opts *opts)
{
    attnd_backend_opts defaults = {0, 0};
    const attnd_backend_ops *ops = name ? find_backend(name) : NULL;
    attnd_err rv;
    *out = NULL;
    if (ops == NULL) return ATTND_ERR_UNSUPPORTED;
    attnd_backend *b = calloc(1, sizeof *b);
    if (b == NULL) return ATTND_ERR_NO_MEMORY;
    b->ops = ops;
    if ((rv = ops->open(b, opts ? opts : &defaults)) != ATTND_ERR_OK) {
        free(b);
        return rv;
    }
    *out = b;
    return ATTND_ERR_OK;
}

void attnd_backend_close(attnd_backend *b)
{
    if (b == NULL) return;
    b->ops->close(b);
    free(b);
}

const char *attnd_backend_name(const attnd_backend *b)
{
    return b->ops->name;
}

int attnd_backend_is_device(const attnd_backend *b)
{
    return b->ops->is_device;
}

int attnd_backend_has(const attnd_backend *b, uint32_t features)
{
    return (b->ops->features & features) == features;
}

const char *attnd_backend_last_error(const attnd_backend *b)
{
    return b->last_error;
}

attnd_err attnd_backend_alloc(attnd_backend *b, size_t bytes, void **ptr)
{
    return b->ops->alloc(b, bytes, ptr);
}

void attnd_backend_free(attnd_backend *b, void *ptr)
{
    if (ptr != NULL) b->ops->free(b, ptr);
}

attnd_err attnd_backend_memcpy(attnd_backend *b, void *dst, const void *src, size_t bytes,
                               attnd_memcpy_kind kind)
{
    return b->ops->memcpy(b, dst, src, bytes, kind);
}

attnd_err attnd_backend_sync(attnd_backend *b)
{
    return b->ops->sync(b);
}

size_t attnd_paged_3d_workspace_size(int64_t num_tokens, int64_t num_q_heads, int64_t head_size,
                                     int32_t num_segments)
{
    size_t rows = (size_t)num_tokens * (size_t)num_q_heads * (size_t)num_segments;
    /* segment outputs [rows][head_size], then maxima [rows] and exp-sums [rows] */
    return rows * ((size_t)head_size + 2) * sizeof(float);
}

/* Validate with host-content checks where the backend's memory is host memory, then run. */
#define ATTND_DISPATCH(op, validate_call, run_call)                                                \
    do {                                                                                           \
        attnd_err rv_;                                                                             \
        if (b == NULL || p == NULL) return ATTND_ERR_INVALID_ARGUMENT;                             \
        b->last_error[0] = '\0';                                                                   \
        if ((rv_ = (validate_call)) != ATTND_ERR_OK) return rv_;                                   \
        if (b->ops->op == NULL) {                                                                  \
            snprintf(b->last_error, sizeof b->last_error, "%s: not implemented by backend %s",     \
                     #op, b->ops->name);                                                           \
            return ATTND_ERR_UNSUPPORTED;                                                          \
        }                                                                                          \
        return (run_call);                                                                         \
    } while (0)

attnd_err attnd_paged_attention_2d(attnd_backend *b, const attnd_paged_params *p)
{
    ATTND_DISPATCH(paged_2d, attnd_validate_paged(b, p, !b->ops->is_device),
                   b->ops->paged_2d(b, p));
}

attnd_err attnd_paged_attention_3d(attnd_backend *b, const attnd_paged_params *p,
                                   int32_t num_segments, void *workspace)
{
    if (b != NULL && (num_segments < 1 || num_segments > 1024))
        return attnd_fail(b, "num_segments: %d out of range (1..1024)", num_segments);
    if (b != NULL && workspace == NULL) return attnd_fail(b, "workspace: missing");
    ATTND_DISPATCH(paged_3d, attnd_validate_paged(b, p, !b->ops->is_device),
                   b->ops->paged_3d(b, p, num_segments, workspace));
}

attnd_err attnd_cache_write(attnd_backend *b, const attnd_cache_write_params *p)
{
    ATTND_DISPATCH(cache_write, attnd_validate_cache_write(b, p, !b->ops->is_device),
                   b->ops->cache_write(b, p));
}

attnd_err attnd_merge_states(attnd_backend *b, const attnd_merge_params *p)
{
    ATTND_DISPATCH(merge_states, attnd_validate_merge(b, p), b->ops->merge_states(b, p));
}

attnd_err attnd_varlen_attention(attnd_backend *b, const attnd_varlen_params *p)
{
    ATTND_DISPATCH(varlen, attnd_validate_varlen(b, p, !b->ops->is_device), b->ops->varlen(b, p));
}

attnd_err attnd_blocksparse_attention(attnd_backend *b, const attnd_blocksparse_params *p)
{
    ATTND_DISPATCH(blocksparse, attnd_validate_blocksparse(b, p, !b->ops->is_device),
                   b->ops->blocksparse(b, p));
}

attnd_err attnd_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p)
{
    ATTND_DISPATCH(linear_prefill, attnd_validate_linear_prefill(b, p),
                   b->ops->linear_prefill(b, p));
}

attnd_err attnd_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p)
{
    ATTND_DISPATCH(linear_decode, attnd_validate_linear_decode(b, p, !b->ops->is_device),
                   b->ops->linear_decode(b, p));
}
