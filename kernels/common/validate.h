/* Descriptor checks shared by every op and both backends. Each check writes a message naming
 * the field into the backend's last_error and returns ATTND_ERR_INVALID_ARGUMENT. */
#ifndef ATTND_KERNELS_VALIDATE_H
#define ATTND_KERNELS_VALIDATE_H

#include <stdarg.h>

#include "attnd/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bitmask of accepted dtypes. */
#define ATTND_DT(x) (1u << ATTND_DTYPE_##x)
#define ATTND_DT_FLOAT (ATTND_DT(F32) | ATTND_DT(F16) | ATTND_DT(BF16))
#define ATTND_DT_CACHE (ATTND_DT(F32) | ATTND_DT(F16) | ATTND_DT(BF16) | ATTND_DT(FP8_E4M3))
#define ATTND_DT_INDEX (ATTND_DT(I32) | ATTND_DT(I64))

/* Record an error on b (printf-style) and return ATTND_ERR_INVALID_ARGUMENT. */
attnd_err attnd_fail(attnd_backend *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* t must be present, have ndim dims (each >= 0), one of the dtypes in mask, non-negative strides,
 * and an innermost stride of 1 when contiguous_last is set. name is used in messages. */
attnd_err attnd_check_tensor(attnd_backend *b, const char *name, const attnd_tensor *t,
                             int32_t ndim, uint32_t dtype_mask, int contiguous_last);
/* Like attnd_check_tensor, but an absent tensor (data == NULL) passes. */
attnd_err attnd_check_optional(attnd_backend *b, const char *name, const attnd_tensor *t,
                               int32_t ndim, uint32_t dtype_mask, int contiguous_last);
/* Dimension d of t must equal want. */
attnd_err attnd_check_dim(attnd_backend *b, const char *name, const attnd_tensor *t, int32_t d,
                          int64_t want);
/* Head size within [32, 256] and a multiple of 8. */
attnd_err attnd_check_head_size(attnd_backend *b, const char *name, int64_t head_size);
/* num_q_heads must be a positive multiple of num_kv_heads. */
attnd_err attnd_check_gqa(attnd_backend *b, int64_t num_q_heads, int64_t num_kv_heads);

/* UNSUPPORTED naming what of p (sinks, an f32 cache) b's backend does not implement; OK
 * otherwise. The cache write's variant checks the cache dtype only. */
attnd_err attnd_check_paged_features(attnd_backend *b, const attnd_paged_params *p);
attnd_err attnd_check_cache_features(attnd_backend *b, attnd_dtype cache);

/* Largest element offset a view can touch (0 for an empty tensor), -1 on overflow. */
int64_t attnd_tensor_span(const attnd_tensor *t);
/* Integer element i of an i32 or i64 tensor (host memory). */
int64_t attnd_index_at(const attnd_tensor *t, int64_t i);

/* Per-op validation (one file per op family). host_contents: also check index contents
 * (block ids, lengths, offsets), possible only when the tensors are in host memory. */
attnd_err attnd_validate_paged(attnd_backend *b, const attnd_paged_params *p, int host_contents);
attnd_err attnd_validate_cache_write(attnd_backend *b, const attnd_cache_write_params *p,
                                     int host_contents);
attnd_err attnd_validate_merge(attnd_backend *b, const attnd_merge_params *p);
attnd_err attnd_validate_varlen(attnd_backend *b, const attnd_varlen_params *p, int host_contents);
attnd_err attnd_validate_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p,
                                     int host_contents);
attnd_err attnd_validate_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p);
attnd_err attnd_validate_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p,
                                       int host_contents);

#ifdef __cplusplus
}
#endif
#endif
