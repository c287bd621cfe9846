#include "devmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEVMEM_INDEX_SLOTS 16
#define DEVMEM_INDEX_BYTES_MAX ((size_t)256 << 20)

static size_t align256(uint64_t x)
{
    return (size_t)((x + 255) & ~(uint64_t)255);
}

/* ---------------------------------------------------------------- health */

attnd_err attnd_devmem_usable(const attnd_devmem *dm, char *err, size_t n)
{
    if (!dm->device_failed) return ATTND_ERR_OK;
    return attnd_errf(err, n, ATTND_ERR_INTERNAL,
                      "device: unusable since an earlier GPU error (%s); restart the daemon",
                      dm->device_error);
}

attnd_err attnd_devmem_kernel_err(attnd_devmem *dm, attnd_err code, const char *what, char *err,
                                  size_t n)
{
    const char *m = attnd_backend_last_error(dm->be);
    attnd_errf(err, n, code, "%s: %s", what, m && m[0] ? m : attnd_strerror(code));
    /* a CUDA error may have left the context (and what the kernels wrote) broken: serve no more
     * GPU work rather than results that may be wrong */
    if (code == ATTND_ERR_INTERNAL && attnd_backend_is_device(dm->be) && !dm->device_failed) {
        dm->device_failed = 1;
        snprintf(dm->device_error, sizeof dm->device_error, "%s", err && n ? err : what);
        ATTND_LOG(dm->log, ATTND_LOG_ERROR,
                  "event=device_failed err=\"%s\" action=refusing_gpu_work (restart the daemon)",
                  dm->device_error);
    }
    return code;
}

/* ---------------------------------------------------------------- host data */

attnd_err attnd_devmem_upload(attnd_devmem *dm, const void *host, size_t bytes, void **dev)
{
    attnd_err rv;
    if (!attnd_backend_is_device(dm->be)) {
        *dev = (void *)host;
        return ATTND_ERR_OK;
    }
    if ((rv = attnd_backend_alloc(dm->be, bytes ? bytes : 1, dev)) != ATTND_ERR_OK) return rv;
    rv = attnd_backend_memcpy(dm->be, *dev, host, bytes, ATTND_MEMCPY_H2D);
    if (rv != ATTND_ERR_OK) {
        attnd_backend_free(dm->be, *dev);
        *dev = NULL;
    }
    return rv;
}

void attnd_devmem_release(attnd_devmem *dm, void *dev, const void *host)
{
    if (dev != NULL && dev != host) attnd_backend_free(dm->be, dev);
}

attnd_err attnd_devmem_zero(attnd_devmem *dm, void *dev, size_t bytes)
{
    if (!attnd_backend_is_device(dm->be)) {
        memset(dev, 0, bytes);
        return ATTND_ERR_OK;
    }
    attnd_err rv = attnd_device_memset(dm->be, dev, 0, bytes);
    if (rv != ATTND_ERR_UNSUPPORTED) return rv;
    void *zeros = calloc(1, bytes ? bytes : 1);
    if (zeros == NULL) return ATTND_ERR_NO_MEMORY;
    rv = attnd_backend_memcpy(dm->be, dev, zeros, bytes, ATTND_MEMCPY_H2D);
    free(zeros);
    return rv;
}

/* ---------------------------------------------------------------- pools */

static attnd_err copy_in_layers(attnd_devmem *dm, void **layers, size_t unit, int32_t src,
                                int32_t dst)
{
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < dm->model->geo.num_layers && rv == ATTND_ERR_OK; l++) {
        char *base = layers[l];
        rv = attnd_backend_memcpy(dm->be, base + (size_t)dst * unit, base + (size_t)src * unit,
                                  unit, ATTND_MEMCPY_D2D);
    }
    return rv;
}

attnd_err attnd_devmem_copy_block(attnd_devmem *dm, int32_t src, int32_t dst)
{
    size_t b = attnd_model_block_bytes(dm->model);
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < dm->model->geo.num_layers && rv == ATTND_ERR_OK; l++) {
        char *k = dm->k_cache[l], *v = dm->v_cache[l];
        rv = attnd_backend_memcpy(dm->be, k + (size_t)dst * b, k + (size_t)src * b, b,
                                  ATTND_MEMCPY_D2D);
        if (rv == ATTND_ERR_OK)
            rv = attnd_backend_memcpy(dm->be, v + (size_t)dst * b, v + (size_t)src * b, b,
                                      ATTND_MEMCPY_D2D);
    }
    return rv;
}

attnd_err attnd_devmem_copy_linear(attnd_devmem *dm, int32_t src, int32_t dst)
{
    return copy_in_layers(dm, dm->lin_state, attnd_model_linear_slot_bytes(dm->model), src, dst);
}

attnd_err attnd_devmem_zero_linear(attnd_devmem *dm, int32_t slot)
{
    size_t sb = attnd_model_linear_slot_bytes(dm->model);
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < dm->model->geo.num_layers && rv == ATTND_ERR_OK; l++)
        rv = attnd_devmem_zero(dm, (char *)dm->lin_state[l] + (size_t)slot * sb, sb);
    return rv;
}

attnd_tensor attnd_devmem_cache(const attnd_devmem *dm, uint32_t layer, int v)
{
    return attnd_model_cache_tensor(dm->model, (v ? dm->v_cache : dm->k_cache)[layer]);
}

/* ---------------------------------------------------------------- index slots */

/* A slot for a step's index arrays: a free one, else the least recently used (its step uploads
 * again when it next runs). */
static int32_t index_slot_pick(const attnd_devmem *dm)
{
    int32_t best = 0;
    for (uint32_t i = 0; i < dm->index_slots; i++) {
        if (dm->index_owner[i] == NULL) return (int32_t)i;
        if (dm->index_used[i] < dm->index_used[best]) best = (int32_t)i;
    }
    return best;
}

/* Upload a plan's arrays into index slot `slot` without waiting for the kernels queued before
 * (they may still read the slot's last owner; the copy runs after them, in stream order), so
 * the executor keeps the GPU fed across steps. The slot's page-locked staging is rewritten only
 * once its previous upload ran. */
static attnd_err index_upload(attnd_devmem *dm, int32_t slot, void *dst, const void *src,
                              size_t bytes)
{
    attnd_err rv = ATTND_ERR_OK;
    void *host = (char *)dm->index_host + (size_t)slot * dm->index_slot_bytes;
    if (dm->index_fence[slot] != NULL &&
        attnd_device_fence_query(dm->be, dm->index_fence[slot]) == ATTND_ERR_TIMEOUT)
        rv = attnd_backend_sync(dm->be);
    attnd_device_fence_release(dm->be, dm->index_fence[slot]);
    dm->index_fence[slot] = NULL;
    if (rv != ATTND_ERR_OK) return rv;
    memcpy(host, src, bytes);
    if ((rv = attnd_device_upload(dm->be, dst, host, bytes)) != ATTND_ERR_OK) return rv;
    return attnd_device_fence_record(dm->be, &dm->index_fence[slot]);
}

attnd_err attnd_devmem_index(attnd_devmem *dm, attnd_index_ref *ref, const void *host, size_t bytes)
{
    attnd_err rv;
    if (!attnd_backend_is_device(dm->be)) {
        ref->dev = (void *)host;
        return ATTND_ERR_OK;
    }
    if (ref->own != NULL) return ATTND_ERR_OK;
    if (ref->slot >= 0 && dm->index_owner[ref->slot] == ref) {
        dm->index_used[ref->slot] = ++dm->index_clock;
        return ATTND_ERR_OK;
    }
    if (dm->index_slots == 0 || bytes > dm->index_slot_bytes) {
        /* limits raised by a reload past what the slots were sized for */
        if ((rv = attnd_backend_alloc(dm->be, bytes, &ref->own)) != ATTND_ERR_OK) return rv;
        ref->dev = ref->own;
        return attnd_backend_memcpy(dm->be, ref->own, host, bytes, ATTND_MEMCPY_H2D);
    }
    int32_t slot = index_slot_pick(dm);
    void *dst = (char *)dm->index_dev + (size_t)slot * dm->index_slot_bytes;
    if (dm->index_owner[slot] != NULL) dm->index_owner[slot]->slot = -1;
    dm->index_owner[slot] = NULL;
    if ((rv = index_upload(dm, slot, dst, host, bytes)) != ATTND_ERR_OK) return rv;
    dm->index_owner[slot] = ref;
    dm->index_used[slot] = ++dm->index_clock;
    ref->slot = slot;
    ref->dev = dst;
    return ATTND_ERR_OK;
}

void attnd_devmem_index_drop(attnd_devmem *dm, attnd_index_ref *ref)
{
    if (ref->slot >= 0 && dm->index_owner[ref->slot] == ref) dm->index_owner[ref->slot] = NULL;
    attnd_backend_free(dm->be, ref->own);
    ref->own = NULL;
    ref->slot = -1;
}

/* ---------------------------------------------------------------- staging host tensors */

/* The staging buffer holds at least bytes (grown, never shrunk: the host-tensor path is the
 * slow one, but it need not allocate on every request). */
static attnd_err stage_reserve(attnd_devmem *dm, size_t bytes)
{
    if (bytes <= dm->stage_bytes) return ATTND_ERR_OK;
    size_t want = bytes > 2 * dm->stage_bytes ? bytes : 2 * dm->stage_bytes;
    attnd_backend_free(dm->be, dm->stage);
    dm->stage = NULL;
    dm->stage_bytes = 0;
    attnd_err rv = attnd_backend_alloc(dm->be, want, &dm->stage);
    if (rv == ATTND_ERR_OK) dm->stage_bytes = want;
    return rv;
}

attnd_err attnd_devmem_stage_in(attnd_devmem *dm, attnd_handles_req *hr, attnd_tensor *const *ts,
                                size_t nts, char *err, size_t n)
{
    size_t total = 0, off = 0;
    attnd_err rv;
    if (!attnd_backend_is_device(dm->be) || hr->nhost == 0) return ATTND_ERR_OK;
    for (uint32_t i = 0; i < hr->nhost; i++)
        total += align256(hr->host[i].bytes);
    if ((rv = stage_reserve(dm, total)) != ATTND_ERR_OK)
        return attnd_devmem_kernel_err(dm, rv, "staging host tensors", err, n);
    for (uint32_t i = 0; i < hr->nhost; i++) {
        attnd_host_view *v = &hr->host[i];
        v->dev = (char *)dm->stage + off;
        off += align256(v->bytes);
        rv = attnd_backend_memcpy(dm->be, v->dev, v->host, (size_t)v->bytes, ATTND_MEMCPY_H2D);
        if (rv != ATTND_ERR_OK)
            return attnd_devmem_kernel_err(dm, rv, "staging host tensors", err, n);
    }
    for (size_t k = 0; k < nts; k++)
        for (uint32_t i = 0; i < hr->nhost; i++)
            if (ts[k]->data != NULL && ts[k]->data == hr->host[i].host) {
                ts[k]->data = hr->host[i].dev;
                break;
            }
    return ATTND_ERR_OK;
}

attnd_err attnd_devmem_stage_out(attnd_devmem *dm, attnd_handles_req *hr, char *err, size_t n)
{
    attnd_err rv;
    for (uint32_t i = 0; attnd_backend_is_device(dm->be) && i < hr->nhost; i++) {
        attnd_host_view *v = &hr->host[i];
        if (!v->output || v->dev == NULL) continue;
        rv = attnd_backend_memcpy(dm->be, v->host, v->dev, (size_t)v->bytes, ATTND_MEMCPY_D2H);
        if (rv != ATTND_ERR_OK)
            return attnd_devmem_kernel_err(dm, rv, "copying outputs back", err, n);
    }
    /* a client that truncated its region under the request: its result is void, say so */
    return attnd_handles_check_faults(hr, err, n);
}

/* ---------------------------------------------------------------- lifecycle */

/* Device backends: the planner fills the SMs, and geometry.gpu_memory_fraction (when set)
 * sizes the cache from the device's free memory. */
static attnd_err devmem_device_setup(attnd_devmem *dm, attnd_model *m)
{
    attnd_device_info info;
    if (!attnd_backend_is_device(dm->be)) {
        if (m->geo.gpu_memory_fraction > 0)
            ATTND_LOG(dm->log, ATTND_LOG_WARN,
                      "event=config key=geometry.gpu_memory_fraction ignored=cpu_backend "
                      "num_blocks=%u",
                      m->geo.num_blocks);
        return ATTND_ERR_OK;
    }
    attnd_err rv = attnd_device_query(dm->be, &info);
    if (rv != ATTND_ERR_OK) return rv;
    dm->units = info.num_sms > 0 ? info.num_sms : 1;
    snprintf(dm->device_name, sizeof dm->device_name, "%s", info.name);
    if (m->geo.gpu_memory_fraction <= 0) return ATTND_ERR_OK;
    uint64_t per_block = 2ull * m->geo.num_layers * attnd_model_block_bytes(m);
    uint64_t blocks =
        (uint64_t)((double)m->geo.gpu_memory_fraction * (double)info.free_bytes) / per_block;
    if (blocks > INT32_MAX) blocks = INT32_MAX;
    if (blocks < m->geo.max_blocks_per_seq) {
        ATTND_LOG(dm->log, ATTND_LOG_ERROR,
                  "event=start_failed err=\"geometry.gpu_memory_fraction: %.3f of %llu free bytes "
                  "gives %llu blocks, fewer than geometry.max_blocks_per_seq (%u)\"",
                  (double)m->geo.gpu_memory_fraction, (unsigned long long)info.free_bytes,
                  (unsigned long long)blocks, m->geo.max_blocks_per_seq);
        return ATTND_ERR_NO_MEMORY;
    }
    m->geo.num_blocks = (uint32_t)blocks;
    return ATTND_ERR_OK;
}

/* Backend memory that counts towards device_bytes. */
static attnd_err devmem_take(attnd_devmem *dm, size_t bytes, void **ptr)
{
    attnd_err rv = attnd_backend_alloc(dm->be, bytes, ptr);
    if (rv == ATTND_ERR_OK) dm->device_bytes += bytes;
    return rv;
}

/* [num_layers] zeroed arrays of bytes each, allocated layer by layer (two sets at once when b
 * is not NULL: K and V of a layer side by side). */
static attnd_err devmem_layers(attnd_devmem *dm, size_t bytes, void ***a, void ***b)
{
    attnd_err rv;
    uint32_t L = dm->model->geo.num_layers;
    if ((*a = calloc(L, sizeof(void *))) == NULL) return ATTND_ERR_NO_MEMORY;
    if (b && (*b = calloc(L, sizeof(void *))) == NULL) return ATTND_ERR_NO_MEMORY;
    for (uint32_t l = 0; l < L; l++) {
        if ((rv = devmem_take(dm, bytes, &(*a)[l])) != ATTND_ERR_OK) return rv;
        if (b && (rv = devmem_take(dm, bytes, &(*b)[l])) != ATTND_ERR_OK) return rv;
        /* rows past a sequence's length are never read; zero them anyway for clean dumps */
        if ((rv = attnd_devmem_zero(dm, (*a)[l], bytes)) != ATTND_ERR_OK) return rv;
        if (b && (rv = attnd_devmem_zero(dm, (*b)[l], bytes)) != ATTND_ERR_OK) return rv;
    }
    return ATTND_ERR_OK;
}

static attnd_err devmem_alloc_pools(attnd_devmem *dm)
{
    attnd_err rv;
    const attnd_model *m = dm->model;
    size_t kv = attnd_model_block_bytes(m) * m->geo.num_blocks;
    if ((rv = devmem_layers(dm, kv, &dm->k_cache, &dm->v_cache)) != ATTND_ERR_OK) return rv;
    if (m->lin.slots == 0) return ATTND_ERR_OK;
    return devmem_layers(dm, attnd_model_linear_slot_bytes(m) * m->lin.slots, &dm->lin_state, NULL);
}

/* Every layer's ALiBi slopes and sinks, where the kernels read them. */
static attnd_err devmem_alloc_values(attnd_devmem *dm)
{
    const attnd_cfg_geometry *g = &dm->model->geo;
    size_t bytes = (size_t)g->num_layers * 2 * g->num_q_heads * sizeof(float);
    void *dev = NULL;
    attnd_err rv = devmem_take(dm, bytes, &dev);
    if (rv != ATTND_ERR_OK) return rv;
    dm->values = dev;
    return attnd_backend_memcpy(dm->be, dev, dm->model->values, bytes, ATTND_MEMCPY_H2D);
}

/* The split-KV workspace (every backend) and, on a device backend, the slots that hold open
 * steps' index arrays (block tables, seq_lens, query_start_loc, slot mapping): allocated once
 * here, so that neither BeginStep nor Attend allocates device memory. */
static attnd_err devmem_alloc_plan_memory(attnd_devmem *dm, const attnd_cfg_limits *limits)
{
    attnd_err rv;
    const attnd_cfg_geometry *g = &dm->model->geo;
    dm->split_rows = attnd_plan_split_rows(dm->units);
    dm->ws3d_bytes = attnd_paged_3d_workspace_size(dm->split_rows, g->num_q_heads, g->head_size, 1);
    if ((rv = devmem_take(dm, dm->ws3d_bytes, &dm->ws3d)) != ATTND_ERR_OK) return rv;
    if (!attnd_backend_is_device(dm->be)) return ATTND_ERR_OK;
    size_t slot = align256(attnd_plan_index_bound(
        (int32_t)limits->max_seqs, limits->max_step_tokens, (int32_t)g->max_blocks_per_seq));
    dm->index_slots = DEVMEM_INDEX_SLOTS;
    while (dm->index_slots > 2 && (size_t)dm->index_slots * slot > DEVMEM_INDEX_BYTES_MAX)
        dm->index_slots /= 2;
    dm->index_slot_bytes = slot;
    dm->index_owner = calloc(dm->index_slots, sizeof *dm->index_owner);
    dm->index_used = calloc(dm->index_slots, sizeof *dm->index_used);
    dm->index_fence = calloc(dm->index_slots, sizeof *dm->index_fence);
    if (dm->index_owner == NULL || dm->index_used == NULL || dm->index_fence == NULL)
        return ATTND_ERR_NO_MEMORY;
    if ((rv = attnd_device_host_alloc(dm->be, (size_t)dm->index_slots * slot, &dm->index_host)))
        return rv;
    return devmem_take(dm, (size_t)dm->index_slots * slot, &dm->index_dev);
}

static void devmem_log(const attnd_devmem *dm)
{
    const attnd_cfg_geometry *g = &dm->model->geo;
    ATTND_LOG(dm->log, ATTND_LOG_INFO,
              "event=memory backend=%s device=\"%s\" units=%d num_blocks=%u cache_bytes=%llu "
              "index_slots=%u index_slot_bytes=%zu split_kv_bytes=%zu total_bytes=%llu",
              attnd_backend_name(dm->be), dm->device_name, dm->units, g->num_blocks,
              (unsigned long long)(2ull * g->num_layers * attnd_model_block_bytes(dm->model) *
                                   g->num_blocks),
              dm->index_slots, dm->index_slot_bytes, dm->ws3d_bytes,
              (unsigned long long)dm->device_bytes);
}

attnd_err attnd_devmem_alloc(attnd_devmem **out, attnd_model *model, attnd_backend *be,
                             int32_t units, const attnd_cfg_limits *limits, attnd_log *lg)
{
    attnd_err rv;
    *out = NULL;
    attnd_devmem *dm = calloc(1, sizeof *dm);
    if (dm == NULL) return ATTND_ERR_NO_MEMORY;
    dm->be = be;
    dm->log = lg;
    dm->model = model;
    dm->units = units;
    rv = devmem_device_setup(dm, model);
    if (rv == ATTND_ERR_OK) rv = devmem_alloc_pools(dm);
    if (rv == ATTND_ERR_OK) rv = devmem_alloc_plan_memory(dm, limits);
    if (rv == ATTND_ERR_OK && model->per_layer) rv = devmem_alloc_values(dm);
    if (rv != ATTND_ERR_OK) {
        attnd_devmem_free(dm);
        return rv;
    }
    devmem_log(dm);
    *out = dm;
    return ATTND_ERR_OK;
}

static void free_layers(attnd_devmem *dm, void **arr)
{
    if (arr == NULL) return;
    for (uint32_t l = 0; l < dm->model->geo.num_layers; l++)
        attnd_backend_free(dm->be, arr[l]);
    free(arr);
}

void attnd_devmem_free(attnd_devmem *dm)
{
    if (dm == NULL) return;
    free_layers(dm, dm->k_cache);
    free_layers(dm, dm->v_cache);
    free_layers(dm, dm->lin_state);
    attnd_backend_free(dm->be, dm->values);
    attnd_backend_free(dm->be, dm->ws3d);
    attnd_backend_free(dm->be, dm->index_dev);
    for (uint32_t i = 0; dm->index_fence && i < dm->index_slots; i++)
        attnd_device_fence_release(dm->be, dm->index_fence[i]);
    free(dm->index_fence);
    attnd_device_host_free(dm->be, dm->index_host);
    attnd_backend_free(dm->be, dm->stage);
    free(dm->index_owner);
    free(dm->index_used);
    free(dm);
}
