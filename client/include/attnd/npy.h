/* .npy files (NumPy's format, versions 1.0-3.0, C order, little-endian) for attnctl, the tests
 * and anyone replaying requests. Element types: f4, f2, i4, i8 (NumPy has no bf16 / fp8:
 * convert with attnd_npy_convert first). */
#ifndef ATTND_NPY_H
#define ATTND_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/client.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTND_NPY_MAX_DIMS 8

/* An array owning its contiguous, row-major data (0 dims = a scalar of one element). */
typedef struct attnd_npy {
    attnd_dtype dtype;
    int32_t ndim;
    int64_t shape[ATTND_NPY_MAX_DIMS];
    void *data;
    size_t bytes;
} attnd_npy;

/* Allocate a zero-filled array. INVALID_ARGUMENT for a bad dtype or shape, NO_MEMORY. */
ATTND_CLIENT_API attnd_err attnd_npy_alloc(attnd_npy *arr, attnd_dtype dtype, int32_t ndim,
                                           const int64_t *shape);
/* Release the data (the struct is zeroed; NULL data is fine). */
ATTND_CLIENT_API void attnd_npy_free(attnd_npy *arr);
/* Number of elements. */
ATTND_CLIENT_API int64_t attnd_npy_numel(const attnd_npy *arr);
/* Read path into arr (allocated; free with attnd_npy_free). On failure arr is empty and err
 * (may be NULL) holds a message naming the file and the problem: NOT_FOUND (cannot open),
 * INVALID_ARGUMENT (not a .npy file, a bad header, truncated data), UNSUPPORTED (a dtype or
 * layout outside the list above), NO_MEMORY. */
ATTND_CLIENT_API attnd_err attnd_npy_read(const char *path, attnd_npy *arr, char *err,
                                          size_t errlen);
/* Write arr to path (version 1.0 header, 64-byte aligned data). UNSUPPORTED for bf16 / fp8,
 * INTERNAL for I/O failures (err says which). */
ATTND_CLIENT_API attnd_err attnd_npy_write(const char *path, const attnd_npy *arr, char *err,
                                           size_t errlen);
/* dst = src converted element-wise to dtype (floats round to nearest even; any float dtype of
 * dtype.h, integers to and from floats by value). dst is allocated; free with attnd_npy_free. */
ATTND_CLIENT_API attnd_err attnd_npy_convert(const attnd_npy *src, attnd_dtype dtype,
                                             attnd_npy *dst);

#ifdef __cplusplus
}
#endif
#endif
