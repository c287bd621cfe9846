/* Cache write on the CPU (vLLM's reshape_and_cache): row t of key/value goes to slot
 * slot_mapping[t] of the paged caches, converted to the cache dtype; fp8 caches store
 * x / scale, rounded to nearest even and saturated at +-448. Negative slots are padding and
 * skipped. Tokens are split into chunks over the pool; distinct slots never share memory. */
#include "cpu.h"
#include "validate.h"

enum { CACHE_WRITE_CHUNK = 64 }; /* tokens per pool item */

typedef struct cache_write_job {
    const attnd_cache_write_params *p;
    int64_t num_tokens, heads, d, bs;
} cache_write_job;

/* One head row of src (any float dtype) into dst (cache dtype), dividing by scale for fp8. */
static void copy_row(const attnd_tensor *dst, int64_t doff, const attnd_tensor *src, int64_t soff,
                     int64_t n, float scale)
{
    int fp8 = dst->dtype == ATTND_DTYPE_FP8_E4M3;
    for (int64_t i = 0; i < n; i++) {
        float x = attnd_load_f32(src->data, src->dtype, soff + i);
        attnd_store_f32(dst->data, dst->dtype, doff + i, fp8 ? x / scale : x);
    }
}

static void write_token(const cache_write_job *j, int64_t t)
{
    const attnd_cache_write_params *p = j->p;
    int64_t slot = attnd_index_at(&p->slot_mapping, t);
    if (slot < 0) return;
    int64_t blk = slot / j->bs, row = slot % j->bs;
    for (int64_t h = 0; h < j->heads; h++) {
        int64_t ko =
            blk * p->k_cache.strides[0] + row * p->k_cache.strides[1] + h * p->k_cache.strides[2];
        int64_t vo =
            blk * p->v_cache.strides[0] + row * p->v_cache.strides[1] + h * p->v_cache.strides[2];
        int64_t ks = t * p->key.strides[0] + h * p->key.strides[1];
        int64_t vs = t * p->value.strides[0] + h * p->value.strides[1];
        copy_row(&p->k_cache, ko, &p->key, ks, j->d, p->k_scale);
        copy_row(&p->v_cache, vo, &p->value, vs, j->d, p->v_scale);
    }
}

static void write_chunk(void *arg, int64_t c)
{
    const cache_write_job *j = arg;
    int64_t end = (c + 1) * CACHE_WRITE_CHUNK;
    for (int64_t t = c * CACHE_WRITE_CHUNK; t < end && t < j->num_tokens; t++)
        write_token(j, t);
}

attnd_err attnd_cpu_cache_write(attnd_backend *b, const attnd_cache_write_params *p)
{
    cache_write_job j = {
        .p = p,
        .num_tokens = p->key.shape[0],
        .heads = p->key.shape[1],
        .d = p->key.shape[2],
        .bs = p->k_cache.shape[1],
    };
    int64_t chunks = (j.num_tokens + CACHE_WRITE_CHUNK - 1) / CACHE_WRITE_CHUNK;
    attnd_pool_run(attnd_cpu_pool(b), chunks, write_chunk, &j);
    return ATTND_ERR_OK;
}
