/* Tensor references: building them, their wire form, inline outputs coming back. */
#include <string.h>

#include "client_int.h"

size_t attnd_ref_nbytes(attnd_dtype dtype, int32_t ndim, const int64_t *shape)
{
    size_t n = attnd_dtype_size(dtype);
    if (ndim < 0 || ndim > ATTND_REF_MAX_DIMS) return 0;
    for (int32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0) return 0;
        if (shape[d] != 0 && n > SIZE_MAX / (size_t)shape[d]) return 0;
        n *= (size_t)shape[d];
    }
    return n;
}

static void ref_init(attnd_ref *r, uint32_t region, uint64_t offset, attnd_dtype dtype,
                     int32_t ndim, const int64_t *shape)
{
    memset(r, 0, sizeof *r);
    r->region = region;
    r->offset = offset;
    r->dtype = dtype;
    r->ndim = ndim < 0 ? 0 : ndim > ATTND_REF_MAX_DIMS ? ATTND_REF_MAX_DIMS : ndim;
    for (int32_t d = 0; d < r->ndim; d++)
        r->shape[d] = shape[d];
}

void attnd_ref_region(attnd_ref *r, uint32_t region, uint64_t offset, attnd_dtype dtype,
                      int32_t ndim, const int64_t *shape)
{
    ref_init(r, region, offset, dtype, ndim, shape);
}

void attnd_ref_shm(attnd_ref *r, const attnd_shm *shm, uint64_t offset, attnd_dtype dtype,
                   int32_t ndim, const int64_t *shape)
{
    ref_init(r, shm->region, offset, dtype, ndim, shape);
}

void attnd_ref_inline_in(attnd_ref *r, const void *data, attnd_dtype dtype, int32_t ndim,
                         const int64_t *shape)
{
    ref_init(r, 0, 0, dtype, ndim, shape);
    r->data = data;
    r->bytes = attnd_ref_nbytes(dtype, r->ndim, r->shape);
}

void attnd_ref_inline_out(attnd_ref *r, void *out, attnd_dtype dtype, int32_t ndim,
                          const int64_t *shape)
{
    ref_init(r, 0, 0, dtype, ndim, shape);
    r->out = out;
    r->bytes = attnd_ref_nbytes(dtype, r->ndim, r->shape);
}

attnd_err attnd_client_ref_to_pb(attnd_client *c, const char *field, const attnd_ref *r,
                                 int is_output, Attnd__TensorRef *pb)
{
    Attnd__TensorRef init = ATTND__TENSOR_REF__INIT;
    *pb = init;
    if (r->ndim < 0 || r->ndim > ATTND_REF_MAX_DIMS)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "%s: ndim %d (at most %d)", field,
                                 (int)r->ndim, ATTND_REF_MAX_DIMS);
    if ((int)r->dtype < 0 || r->dtype >= ATTND_DTYPE_COUNT)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "%s: dtype %d unknown", field,
                                 (int)r->dtype);
    if (r->region == 0 && is_output && r->out == NULL && r->bytes > 0)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT,
                                 "%s: inline output without a buffer", field);
    pb->region = r->region;
    pb->offset = r->offset;
    pb->dtype = (Attnd__DType)r->dtype;
    pb->n_shape = (size_t)r->ndim;
    pb->shape = (int64_t *)r->shape;
    if (r->has_strides) {
        pb->n_strides = (size_t)r->ndim;
        pb->strides = (int64_t *)r->strides;
    }
    if (r->region == 0 && !is_output && r->data != NULL) {
        pb->data.data = (uint8_t *)r->data;
        pb->data.len = r->bytes;
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_client_take_outputs(attnd_client *c, const Attnd__Reply *rep,
                                    attnd_ref *const *outs, size_t n)
{
    const Attnd__InlineOutputs *io =
        rep->body_case == ATTND__REPLY__BODY_OUTPUTS ? rep->outputs : NULL;
    size_t have = io != NULL ? io->n_data : 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        attnd_ref *r = outs[i];
        if (r == NULL || r->region != 0) continue;
        if (k >= have)
            return attnd_client_fail(c, ATTND_ERR_PROTOCOL,
                                     "reply carries %zu inline outputs, expected more", have);
        if (io->data[k].len != r->bytes)
            return attnd_client_fail(c, ATTND_ERR_PROTOCOL,
                                     "inline output %zu: %zu bytes, expected %zu", k,
                                     io->data[k].len, r->bytes);
        if (r->bytes > 0) memcpy(r->out, io->data[k].data, r->bytes);
        k++;
    }
    if (k != have)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL,
                                 "reply carries %zu inline outputs, expected %zu", have, k);
    return ATTND_ERR_OK;
}
