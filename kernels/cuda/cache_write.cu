// Cache write entry point of the cuda backend.
#include <stdint.h>
#include <string.h>

#include "cache_write_kernel.cuh"
#include "cuda_backend.h"
#include "validate.h"

static int aligned_ptr(const void *ptr, int64_t bytes)
{
    return ((uintptr_t)ptr % (uintptr_t)bytes) == 0;
}

// 8 consecutive elements at every row start are one aligned vector.
static int rows_vec8(const attnd_tensor *t, int nrow_dims)
{
    int64_t es = (int64_t)attnd_dtype_size(t->dtype);
    int64_t vb = es * 8 > 16 ? 16 : es * 8; /* f32 loads two 16-byte vectors */
    if (!aligned_ptr(t->data, vb)) return 0;
    for (int d = 0; d < nrow_dims; d++)
        if ((t->strides[d] * es) % vb != 0) return 0;
    return 1;
}

extern "C" attnd_err attnd_cuda_cache_write(attnd_backend *b, const attnd_cache_write_params *p)
{
    attnd_cuda *c = attnd_cuda_of(b);
    const attnd_tensor *key = &p->key, *val = &p->value, *kc = &p->k_cache, *vc = &p->v_cache;
    if (key->strides[2] != 1 || val->strides[2] != 1 || kc->strides[3] != 1 || vc->strides[3] != 1)
        return attnd_fail(b, "cuda cache_write: key, value and caches need a unit innermost "
                             "stride");
    if (kc->dtype != vc->dtype) return attnd_fail(b, "v_cache: dtype differs from k_cache");
    if (p->slot_mapping.dtype != ATTND_DTYPE_I64 && p->slot_mapping.dtype != ATTND_DTYPE_I32)
        return attnd_fail(b, "slot_mapping: must be i64 or i32");
    attnd_cache_write_args a;
    memset(&a, 0, sizeof a);
    a.key = key->data;
    a.value = val->data;
    a.key_s0 = key->strides[0];
    a.key_s1 = key->strides[1];
    a.value_s0 = val->strides[0];
    a.value_s1 = val->strides[1];
    a.key_dt = key->dtype;
    a.value_dt = val->dtype;
    a.key_vec = rows_vec8(key, 2);
    a.value_vec = rows_vec8(val, 2);
    a.k_cache = kc->data;
    a.v_cache = vc->data;
    a.kc_s0 = kc->strides[0];
    a.kc_s1 = kc->strides[1];
    a.kc_s2 = kc->strides[2];
    a.vc_s0 = vc->strides[0];
    a.vc_s1 = vc->strides[1];
    a.vc_s2 = vc->strides[2];
    a.cache_dt = kc->dtype;
    a.cache_vec = rows_vec8(kc, 3) && rows_vec8(vc, 3);
    a.slots = p->slot_mapping.data;
    a.slot_s0 = p->slot_mapping.strides[0];
    a.slot_i64 = p->slot_mapping.dtype == ATTND_DTYPE_I64;
    a.num_tokens = key->shape[0];
    a.num_blocks = kc->shape[0] < vc->shape[0] ? kc->shape[0] : vc->shape[0];
    a.num_kv_heads = (int32_t)key->shape[1];
    a.head_size = (int32_t)key->shape[2];
    a.block_size = (int32_t)kc->shape[1];
    a.k_scale = p->k_scale;
    a.v_scale = p->v_scale;
    const int64_t items = a.num_tokens * a.num_kv_heads * (a.head_size / 8);
    if (items == 0) return ATTND_ERR_OK;
    int64_t blocks = (items + 255) / 256;
    const int64_t cap = (int64_t)c->num_sms * 16;
    if (blocks > cap) blocks = cap;
    attnd_cache_write_kernel<<<(unsigned)blocks, 256, 0, c->stream>>>(a);
    return attnd_cuda_check_launch(b, "cache_write");
}
