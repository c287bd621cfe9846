#include <string.h>

#include "attnd/kernels.h"

static const char *const dtype_names[ATTND_DTYPE_COUNT] = {"f32", "f16", "bf16",
                                                           "fp8_e4m3", "i32", "i64"};

const char *attnd_dtype_name(attnd_dtype dt)
{
    return (unsigned)dt < ATTND_DTYPE_COUNT ? dtype_names[dt] : "?";
}

int attnd_dtype_parse(const char *name, attnd_dtype *out)
{
    for (int i = 0; i < ATTND_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (attnd_dtype)i;
            return 0;
        }
    }
    return -1;
}

void attnd_tensor_init(attnd_tensor *t, void *data, attnd_dtype dtype, int32_t ndim,
                       const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = stride;
        stride *= shape[d] > 0 ? shape[d] : 1;
    }
}

int64_t attnd_tensor_numel(const attnd_tensor *t)
{
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim && d < ATTND_MAX_DIMS; d++) {
        if (t->shape[d] < 0 || __builtin_mul_overflow(n, t->shape[d], &n)) return -1;
    }
    return n;
}
