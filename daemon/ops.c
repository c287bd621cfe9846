#include "ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnd/plan.h"
#include "metrics.h"
#include "ratelimit.h"

#include "chanops.h"
#include "step.h"
#include "tensorops.h"

#ifndef ATTND_VERSION_STRING
#define ATTND_VERSION_STRING "0.0.0"
#endif

uint64_t attnd_ops_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---------------------------------------------------------------- replies */

void attnd_ops_reply_init(attnd_ops_reply *r, uint64_t id)
{
    memset(r, 0, sizeof *r);
    attnd__reply__init(&r->reply);
    r->reply.id = id;
    r->reply.message = r->msg;
}

void attnd_ops_reply_fini(attnd_ops_reply *r)
{
    free(r->seq_items);
    free(r->seq_ptrs);
    free(r->step.query_start_loc);
    for (size_t i = 0; i < r->outputs.n_data; i++)
        free(r->out_data[i].data);
    r->seq_items = NULL;
    r->seq_ptrs = NULL;
    r->step.query_start_loc = NULL;
    r->outputs.n_data = 0;
}

attnd_err attnd_ops_fail(attnd_ops_reply *r, attnd_err code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->reply.code = (uint32_t)code;
    return code;
}

attnd_err attnd_ops_kernel_fail(attnd_ops *o, attnd_ops_reply *r, attnd_err code, const char *what)
{
    const char *m = attnd_backend_last_error(o->be);
    attnd_ops_fail(r, code, "%s: %s", what, m && m[0] ? m : attnd_strerror(code));
    /* a CUDA error may have left the context (and what the kernels wrote) broken: serve no more
     * GPU work rather than results that may be wrong */
    if (code == ATTND_ERR_INTERNAL && attnd_backend_is_device(o->be) && !o->device_failed) {
        o->device_failed = 1;
        memcpy(o->device_error, r->msg, sizeof o->device_error);
        ATTND_LOG(o->log, ATTND_LOG_ERROR,
                  "event=device_failed err=\"%s\" action=refusing_gpu_work (restart the daemon)",
                  o->device_error);
    }
    return code;
}

void attnd_ops_take_outputs(attnd_ops_reply *r, attnd_handles_req *hr)
{
    attnd__inline_outputs__init(&r->outputs);
    for (uint32_t i = 0; i < hr->nout; i++) {
        r->out_data[i].data = hr->out[i];
        r->out_data[i].len = hr->out_bytes[i];
    }
    r->outputs.n_data = hr->nout;
    r->outputs.data = r->out_data;
    hr->nout = 0; /* the reply owns them now */
    if (r->outputs.n_data) {
        r->reply.body_case = ATTND__REPLY__BODY_OUTPUTS;
        r->reply.outputs = &r->outputs;
    }
}

attnd_err attnd_ops_resolve(attnd_ops_reply *r, attnd_handles_req *hr, const Attnd__TensorRef *ref,
                            const attnd_tref_spec *spec, attnd_tensor *t)
{
    attnd_err rv = attnd_handles_resolve(hr, ref, spec, t, r->msg, sizeof r->msg);
    if (rv != ATTND_ERR_OK) r->reply.code = (uint32_t)rv;
    return rv;
}

attnd_err attnd_ops_handles_begin(attnd_ops *o, attnd_session *s, attnd_ops_reply *r,
                                  attnd_handles_req *hr, const Attnd__TensorRef *const *refs,
                                  size_t nrefs)
{
    attnd_handles_req_init(hr, s->regions, s->nregions, o->limits.max_inline_bytes);
    uint64_t in = attnd_handles_inline_in(refs, nrefs);
    if (in > o->limits.max_inline_bytes)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                              "data: %llu INLINE bytes exceed limits.max_inline_bytes (%llu)",
                              (unsigned long long)in,
                              (unsigned long long)o->limits.max_inline_bytes);
    return ATTND_ERR_OK;
}

void attnd_ops_count(attnd_ops *o, attnd_err code)
{
    atomic_fetch_add_explicit(&o->requests, 1, memory_order_relaxed);
    if ((unsigned)code < ATTND_OPS_NCODES)
        atomic_fetch_add_explicit(&o->by_code[code], 1, memory_order_relaxed);
}

/* ---------------------------------------------------------------- backend memory */

attnd_err attnd_ops_upload(attnd_ops *o, const void *host, size_t bytes, void **dev)
{
    attnd_err rv;
    if (!attnd_backend_is_device(o->be)) {
        *dev = (void *)host;
        return ATTND_ERR_OK;
    }
    if ((rv = attnd_backend_alloc(o->be, bytes ? bytes : 1, dev)) != ATTND_ERR_OK) return rv;
    rv = attnd_backend_memcpy(o->be, *dev, host, bytes, ATTND_MEMCPY_H2D);
    if (rv != ATTND_ERR_OK) {
        attnd_backend_free(o->be, *dev);
        *dev = NULL;
    }
    return rv;
}

void attnd_ops_release(attnd_ops *o, void *dev, const void *host)
{
    if (dev != NULL && dev != host) attnd_backend_free(o->be, dev);
}

attnd_err attnd_ops_zero(attnd_ops *o, void *dev, size_t bytes)
{
    if (!attnd_backend_is_device(o->be)) {
        memset(dev, 0, bytes);
        return ATTND_ERR_OK;
    }
    attnd_err rv = attnd_device_memset(o->be, dev, 0, bytes);
    if (rv != ATTND_ERR_UNSUPPORTED) return rv;
    void *zeros = calloc(1, bytes ? bytes : 1);
    if (zeros == NULL) return ATTND_ERR_NO_MEMORY;
    rv = attnd_backend_memcpy(o->be, dev, zeros, bytes, ATTND_MEMCPY_H2D);
    free(zeros);
    return rv;
}

/* ---------------------------------------------------------------- staging host tensors */

static size_t align256(uint64_t x)
{
    return (size_t)((x + 255) & ~(uint64_t)255);
}

/* The staging buffer holds at least bytes (grown, never shrunk: the host-tensor path is the
 * slow one, but it need not allocate on every request). */
static attnd_err stage_reserve(attnd_ops *o, size_t bytes)
{
    if (bytes <= o->stage_bytes) return ATTND_ERR_OK;
    size_t want = bytes > 2 * o->stage_bytes ? bytes : 2 * o->stage_bytes;
    attnd_backend_free(o->be, o->stage);
    o->stage = NULL;
    o->stage_bytes = 0;
    attnd_err rv = attnd_backend_alloc(o->be, want, &o->stage);
    if (rv == ATTND_ERR_OK) o->stage_bytes = want;
    return rv;
}

attnd_err attnd_ops_stage_in(attnd_ops *o, attnd_ops_reply *r, attnd_handles_req *hr,
                             attnd_tensor *const *ts, size_t nts)
{
    size_t total = 0, off = 0;
    attnd_err rv;
    if (!attnd_backend_is_device(o->be) || hr->nhost == 0) return ATTND_ERR_OK;
    for (uint32_t i = 0; i < hr->nhost; i++)
        total += align256(hr->host[i].bytes);
    if ((rv = stage_reserve(o, total)) != ATTND_ERR_OK)
        return attnd_ops_kernel_fail(o, r, rv, "staging host tensors");
    for (uint32_t i = 0; i < hr->nhost; i++) {
        attnd_host_view *v = &hr->host[i];
        v->dev = (char *)o->stage + off;
        off += align256(v->bytes);
        rv = attnd_backend_memcpy(o->be, v->dev, v->host, (size_t)v->bytes, ATTND_MEMCPY_H2D);
        if (rv != ATTND_ERR_OK) return attnd_ops_kernel_fail(o, r, rv, "staging host tensors");
    }
    for (size_t k = 0; k < nts; k++)
        for (uint32_t i = 0; i < hr->nhost; i++)
            if (ts[k]->data != NULL && ts[k]->data == hr->host[i].host) {
                ts[k]->data = hr->host[i].dev;
                break;
            }
    return ATTND_ERR_OK;
}

attnd_err attnd_ops_stage_out(attnd_ops *o, attnd_ops_reply *r, attnd_handles_req *hr)
{
    attnd_err rv;
    for (uint32_t i = 0; attnd_backend_is_device(o->be) && i < hr->nhost; i++) {
        attnd_host_view *v = &hr->host[i];
        if (!v->output || v->dev == NULL) continue;
        rv = attnd_backend_memcpy(o->be, v->host, v->dev, (size_t)v->bytes, ATTND_MEMCPY_D2H);
        if (rv != ATTND_ERR_OK) return attnd_ops_kernel_fail(o, r, rv, "copying outputs back");
    }
    /* a client that truncated its region under the request: its result is void, say so */
    if ((rv = attnd_handles_check_faults(hr, r->msg, sizeof r->msg)) != ATTND_ERR_OK)
        r->reply.code = (uint32_t)rv;
    return rv;
}

size_t attnd_ops_block_bytes(const attnd_ops *o)
{
    return (size_t)o->geo.block_size * o->geo.num_kv_heads * o->geo.head_size *
           attnd_dtype_size((attnd_dtype)o->geo.cache_dtype);
}

size_t attnd_ops_linear_slot_bytes(const attnd_ops *o)
{
    return (size_t)o->lin.heads * o->lin.head_dim * o->lin.head_dim * sizeof(float);
}

/* ---------------------------------------------------------------- lifecycle */

/* ALiBi's standard slopes (Press et al.): 2^(-8i/n) for a power of two n, interleaved
 * from the next power of two otherwise. */
static void alibi_slopes(float *out, uint32_t n)
{
    uint32_t p = 1;
    while (p * 2 <= n)
        p *= 2;
    for (uint32_t i = 0; i < p; i++)
        out[i] = powf(2.0f, -8.0f * (float)(i + 1) / (float)p);
    for (uint32_t i = 0; i < n - p; i++)
        out[p + i] = powf(2.0f, -8.0f * (float)(2 * i + 1) / (float)(2 * p));
}

/* Device backends: the planner fills the SMs, and geometry.gpu_memory_fraction (when set)
 * sizes the cache from the device's free memory. */
static attnd_err ops_device_setup(attnd_ops *o)
{
    attnd_device_info info;
    if (!attnd_backend_is_device(o->be)) {
        if (o->geo.gpu_memory_fraction > 0)
            ATTND_LOG(o->log, ATTND_LOG_WARN,
                      "event=config key=geometry.gpu_memory_fraction ignored=cpu_backend "
                      "num_blocks=%u",
                      o->geo.num_blocks);
        return ATTND_ERR_OK;
    }
    attnd_err rv = attnd_device_query(o->be, &info);
    if (rv != ATTND_ERR_OK) return rv;
    o->units = info.num_sms > 0 ? info.num_sms : 1;
    snprintf(o->device_name, sizeof o->device_name, "%s", info.name);
    if (o->geo.gpu_memory_fraction <= 0) return ATTND_ERR_OK;
    uint64_t per_block = 2ull * o->geo.num_layers * attnd_ops_block_bytes(o);
    uint64_t blocks = (uint64_t)((double)o->geo.gpu_memory_fraction * (double)info.free_bytes) /
                      (per_block ? per_block : 1);
    if (blocks > INT32_MAX) blocks = INT32_MAX;
    if (blocks < o->geo.max_blocks_per_seq) {
        ATTND_LOG(o->log, ATTND_LOG_ERROR,
                  "event=start_failed err=\"geometry.gpu_memory_fraction: %.3f of %llu free bytes "
                  "gives %llu blocks, fewer than geometry.max_blocks_per_seq (%u)\"",
                  (double)o->geo.gpu_memory_fraction, (unsigned long long)info.free_bytes,
                  (unsigned long long)blocks, o->geo.max_blocks_per_seq);
        return ATTND_ERR_NO_MEMORY;
    }
    o->geo.num_blocks = (uint32_t)blocks;
    return ATTND_ERR_OK;
}

/* Backend memory that counts towards device_bytes. */
static attnd_err ops_take(attnd_ops *o, size_t bytes, void **ptr)
{
    attnd_err rv = attnd_backend_alloc(o->be, bytes, ptr);
    if (rv == ATTND_ERR_OK) o->device_bytes += bytes;
    return rv;
}

static attnd_err ops_alloc_pools(attnd_ops *o)
{
    attnd_err rv;
    uint32_t L = o->geo.num_layers;
    size_t kv = attnd_ops_block_bytes(o) * o->geo.num_blocks;
    o->k_cache = calloc(L, sizeof(void *));
    o->v_cache = calloc(L, sizeof(void *));
    if (o->k_cache == NULL || o->v_cache == NULL) return ATTND_ERR_NO_MEMORY;
    for (uint32_t l = 0; l < L; l++) {
        if ((rv = ops_take(o, kv, &o->k_cache[l])) != ATTND_ERR_OK) return rv;
        if ((rv = ops_take(o, kv, &o->v_cache[l])) != ATTND_ERR_OK) return rv;
        /* rows past a sequence's length are never read; zero them anyway for clean dumps */
        if ((rv = attnd_ops_zero(o, o->k_cache[l], kv)) != ATTND_ERR_OK) return rv;
        if ((rv = attnd_ops_zero(o, o->v_cache[l], kv)) != ATTND_ERR_OK) return rv;
    }
    if (o->lin.slots == 0) return ATTND_ERR_OK;
    size_t lin = attnd_ops_linear_slot_bytes(o) * o->lin.slots;
    o->lin_state = calloc(L, sizeof(void *));
    if (o->lin_state == NULL) return ATTND_ERR_NO_MEMORY;
    for (uint32_t l = 0; l < L; l++) {
        if ((rv = ops_take(o, lin, &o->lin_state[l])) != ATTND_ERR_OK) return rv;
        if ((rv = attnd_ops_zero(o, o->lin_state[l], lin)) != ATTND_ERR_OK) return rv;
    }
    return ATTND_ERR_OK;
}

static attnd_err ops_alloc_alibi(attnd_ops *o)
{
    attnd_err rv = ATTND_ERR_OK;
    size_t bytes = (size_t)o->geo.num_q_heads * sizeof(float);
    float *host = malloc(bytes);
    void *dev = NULL;
    if (host == NULL) return ATTND_ERR_NO_MEMORY;
    alibi_slopes(host, o->geo.num_q_heads);
    if ((rv = attnd_backend_alloc(o->be, bytes, &dev)) != ATTND_ERR_OK) goto done;
    rv = attnd_backend_memcpy(o->be, dev, host, bytes, ATTND_MEMCPY_H2D);
    if (rv != ATTND_ERR_OK)
        attnd_backend_free(o->be, dev);
    else
        o->alibi = dev;
done:
    free(host);
    return rv;
}

#define OPS_INDEX_SLOTS 16
#define OPS_INDEX_BYTES_MAX ((size_t)256 << 20)

/* The split-KV workspace (every backend) and, on a device backend, the slots that hold open
 * steps' index arrays (block tables, seq_lens, query_start_loc, slot mapping): allocated once
 * here, so that neither BeginStep nor Attend allocates device memory. */
static attnd_err ops_alloc_plan_memory(attnd_ops *o)
{
    attnd_err rv;
    o->split_rows = attnd_plan_split_rows(o->units);
    o->ws3d_bytes =
        attnd_paged_3d_workspace_size(o->split_rows, o->geo.num_q_heads, o->geo.head_size, 1);
    if ((rv = ops_take(o, o->ws3d_bytes, &o->ws3d)) != ATTND_ERR_OK) return rv;
    if (!attnd_backend_is_device(o->be)) return ATTND_ERR_OK;
    size_t slot = attnd_plan_index_bound((int32_t)o->limits.max_seqs, o->limits.max_step_tokens,
                                         (int32_t)o->geo.max_blocks_per_seq);
    slot = align256(slot);
    o->index_slots = OPS_INDEX_SLOTS;
    while (o->index_slots > 2 && (size_t)o->index_slots * slot > OPS_INDEX_BYTES_MAX)
        o->index_slots /= 2;
    o->index_slot_bytes = slot;
    o->index_owner = calloc(o->index_slots, sizeof *o->index_owner);
    o->index_used = calloc(o->index_slots, sizeof *o->index_used);
    o->index_fence = calloc(o->index_slots, sizeof *o->index_fence);
    if (o->index_owner == NULL || o->index_used == NULL || o->index_fence == NULL)
        return ATTND_ERR_NO_MEMORY;
    if ((rv = attnd_device_host_alloc(o->be, (size_t)o->index_slots * slot, &o->index_host)))
        return rv;
    return ops_take(o, (size_t)o->index_slots * slot, &o->index_dev);
}

static void ops_log_memory(const attnd_ops *o)
{
    ATTND_LOG(o->log, ATTND_LOG_INFO,
              "event=memory backend=%s device=\"%s\" units=%d num_blocks=%u cache_bytes=%llu "
              "index_slots=%u index_slot_bytes=%zu split_kv_bytes=%zu total_bytes=%llu",
              attnd_backend_name(o->be), o->device_name, o->units, o->geo.num_blocks,
              (unsigned long long)(2ull * o->geo.num_layers * attnd_ops_block_bytes(o) *
                                   o->geo.num_blocks),
              o->index_slots, o->index_slot_bytes, o->ws3d_bytes,
              (unsigned long long)o->device_bytes);
}

attnd_err attnd_ops_alloc(attnd_ops **out, const attnd_config *cfg, attnd_backend *be,
                          int32_t units, attnd_log *lg)
{
    attnd_err rv;
    *out = NULL;
    attnd_ops *o = calloc(1, sizeof *o);
    if (o == NULL) return ATTND_ERR_NO_MEMORY;
    o->log = lg;
    o->be = be;
    o->geo = cfg->geometry;
    o->lin = cfg->linear;
    o->scale = attnd_config_scale(cfg);
    o->limits = cfg->limits;
    memcpy(o->token, cfg->server.token, sizeof o->token);
    o->units = units > 0 ? units : 1;
    o->next_step = 1;
    o->start_ms = attnd_ops_now_ms();
    attnd_sessions_init(&o->sessions);
    rv = ops_device_setup(o);
    if (rv == ATTND_ERR_OK)
        rv = attnd_cache_alloc(&o->cache, o->geo.num_blocks, o->geo.block_size,
                               o->geo.max_blocks_per_seq, o->lin.slots);
    if (rv == ATTND_ERR_OK) rv = ops_alloc_pools(o);
    if (rv == ATTND_ERR_OK) rv = ops_alloc_plan_memory(o);
    if (rv == ATTND_ERR_OK && o->geo.alibi) rv = ops_alloc_alibi(o);
    if (rv != ATTND_ERR_OK) {
        attnd_ops_free(o);
        return rv;
    }
    ops_log_memory(o);
    *out = o;
    return ATTND_ERR_OK;
}

static void free_layers(attnd_ops *o, void **arr)
{
    if (arr == NULL) return;
    for (uint32_t l = 0; l < o->geo.num_layers; l++)
        attnd_backend_free(o->be, arr[l]);
    free(arr);
}

void attnd_ops_free(attnd_ops *o)
{
    if (o == NULL) return;
    attnd_ops_drain(o);
    attnd_step_free_all(o);
    free(o->inflight);
    attnd_sessions_fini(&o->sessions);
    attnd_cache_free(o->cache);
    free_layers(o, o->k_cache);
    free_layers(o, o->v_cache);
    free_layers(o, o->lin_state);
    attnd_backend_free(o->be, o->alibi);
    attnd_backend_free(o->be, o->ws3d);
    attnd_backend_free(o->be, o->index_dev);
    for (uint32_t i = 0; o->index_fence && i < o->index_slots; i++)
        attnd_device_fence_release(o->be, o->index_fence[i]);
    free(o->index_fence);
    attnd_device_host_free(o->be, o->index_host);
    attnd_backend_free(o->be, o->stage);
    free(o->index_owner);
    free(o->index_used);
    free(o);
}

/* ---------------------------------------------------------------- session requests */

typedef attnd_err (*ops_handler)(attnd_ops *o, attnd_session *s, const Attnd__Request *req,
                                 uint32_t pipe, attnd_ops_reply *r);

static void fill_geometry(const attnd_ops *o, Attnd__Geometry *g)
{
    attnd__geometry__init(g);
    g->num_layers = o->geo.num_layers;
    g->num_q_heads = o->geo.num_q_heads;
    g->num_kv_heads = o->geo.num_kv_heads;
    g->head_size = o->geo.head_size;
    g->block_size = o->geo.block_size;
    g->cache_dtype = (Attnd__DType)o->geo.cache_dtype;
    g->num_blocks = o->geo.num_blocks;
    g->max_blocks_per_seq = o->geo.max_blocks_per_seq;
    g->scale = o->scale;
    g->linear_slots = o->lin.slots;
    g->linear_heads = o->lin.heads;
    g->linear_head_dim = o->lin.head_dim;
}

/* Compare without an early exit so the time taken says nothing about the token. */
static int token_equal(const char *want, const char *got)
{
    size_t lw = strlen(want), lg = strlen(got);
    unsigned diff = (unsigned)(lw != lg);
    for (size_t i = 0; i < lw; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? got[i] : 0);
    return diff == 0;
}

static attnd_err op_hello(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                          attnd_ops_reply *r)
{
    const Attnd__Hello *m = req->hello;
    attnd_err rv;
    (void)s;
    if (pipe == 0)
        return attnd_ops_fail(r, ATTND_ERR_UNAVAILABLE, "connection: closed before Hello ran");
    if (m->protocol_version != ATTND_PROTOCOL_VERSION)
        return attnd_ops_fail(r, ATTND_ERR_UNSUPPORTED,
                              "protocol_version: %u not supported (this daemon speaks %d)",
                              m->protocol_version, ATTND_PROTOCOL_VERSION);
    if (o->token[0] && !token_equal(o->token, m->token ? m->token : ""))
        return attnd_ops_fail(r, ATTND_ERR_PERMISSION_DENIED, "token: %s",
                              m->token && m->token[0] ? "invalid" : "required");
    if ((rv = attnd_session_open(&o->sessions, pipe, m->client_name, o->limits.max_sessions, &s)))
        return attnd_ops_fail(r, rv, "session: limits.max_sessions (%u) are open",
                              o->limits.max_sessions);
    ATTND_LOG(o->log, ATTND_LOG_INFO, "event=hello session=%llu pipe=%u client=\"%s\"",
              (unsigned long long)s->id, pipe, s->name);
    Attnd__HelloReply *h = &r->hello;
    attnd__hello_reply__init(h);
    fill_geometry(o, &r->geometry);
    attnd__limits__init(&r->limits);
    r->limits.max_seqs = o->limits.max_seqs;
    r->limits.max_step_tokens = o->limits.max_step_tokens;
    r->limits.max_regions = o->limits.max_regions;
    r->limits.max_inline_bytes = o->limits.max_inline_bytes;
    r->limits.request_timeout_ms = o->limits.request_timeout_ms;
    h->protocol_version = ATTND_PROTOCOL_VERSION;
    h->session = s->id;
    h->version = (char *)ATTND_VERSION_STRING;
    h->backend = (char *)attnd_backend_name(o->be);
    h->geometry = &r->geometry;
    h->limits = &r->limits;
    h->blocks_free = attnd_cache_blocks_free(o->cache);
    r->reply.body_case = ATTND__REPLY__BODY_HELLO;
    r->reply.hello = h;
    return ATTND_ERR_OK;
}

static attnd_err op_status(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                           attnd_ops_reply *r)
{
    Attnd__StatusReply *st = &r->status;
    (void)s;
    (void)req;
    (void)pipe;
    attnd__status_reply__init(st);
    fill_geometry(o, &r->geometry);
    st->version = (char *)ATTND_VERSION_STRING;
    st->backend = (char *)attnd_backend_name(o->be);
    st->geometry = &r->geometry;
    st->blocks_free = attnd_cache_blocks_free(o->cache);
    st->num_sequences = attnd_cache_num_seqs(o->cache);
    st->num_sessions = o->sessions.count;
    st->requests = atomic_load(&o->requests);
    st->errors = st->requests - atomic_load(&o->by_code[ATTND_ERR_OK]);
    st->uptime_s = (double)(attnd_ops_now_ms() - o->start_ms) / 1000.0;
    r->reply.body_case = ATTND__REPLY__BODY_STATUS;
    r->reply.status = st;
    return ATTND_ERR_OK;
}

static attnd_err op_register(attnd_ops *o, attnd_session *s, const Attnd__Request *req,
                             uint32_t pipe, attnd_ops_reply *r)
{
    const Attnd__RegisterRegion *m = req->register_region;
    attnd_err rv;
    (void)pipe;
    if (m->kind == ATTND__REGION_KIND__CUDA_IPC && !attnd_backend_is_device(o->be))
        return attnd_ops_fail(r, ATTND_ERR_UNSUPPORTED,
                              "kind: CUDA_IPC needs the cuda backend "
                              "(this daemon runs %s)",
                              attnd_backend_name(o->be));
    if (m->kind == ATTND__REGION_KIND__CUDA_IPC) {
        rv =
            attnd_session_region_add_ipc(s, m->region, o->be, m->ipc_handle.data, m->ipc_handle.len,
                                         m->size, o->limits.max_regions, r->msg, sizeof r->msg);
        if (rv == ATTND_ERR_OK)
            ATTND_LOG(o->log, ATTND_LOG_DEBUG,
                      "event=region session=%llu region=%u kind=cuda_ipc bytes=%llu",
                      (unsigned long long)s->id, m->region, (unsigned long long)m->size);
    } else if (m->kind == ATTND__REGION_KIND__HOST_SHM) {
        rv = attnd_session_region_add(s, m->region, o->guard, m->shm_name ? m->shm_name : "",
                                      m->size, o->limits.max_regions, r->msg, sizeof r->msg);
    } else {
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "kind: %d unknown", (int)m->kind);
    }
    return rv == ATTND_ERR_OK ? rv : (attnd_err)(r->reply.code = (uint32_t)rv);
}

static attnd_err op_unregister(attnd_ops *o, attnd_session *s, const Attnd__Request *req,
                               uint32_t pipe, attnd_ops_reply *r)
{
    (void)pipe;
    attnd_ops_drain(o); /* kernels still reading a CUDA_IPC region finish before it closes */
    attnd_err rv =
        attnd_session_region_remove(s, req->unregister_region->region, r->msg, sizeof r->msg);
    return rv == ATTND_ERR_OK ? rv : (attnd_err)(r->reply.code = (uint32_t)rv);
}

/* ---------------------------------------------------------------- sequences */

static void fill_seq_info(const attnd_seq *q, Attnd__SequenceInfo *info)
{
    attnd__sequence_info__init(info);
    info->seq_id = q->id;
    info->num_tokens = q->num_tokens;
    info->num_blocks = q->nblocks;
    info->step = q->step;
}

static attnd_err reply_seq(attnd_ops_reply *r, const attnd_seq *q)
{
    fill_seq_info(q, &r->seq);
    r->reply.body_case = ATTND__REPLY__BODY_SEQ;
    r->reply.seq = &r->seq;
    return ATTND_ERR_OK;
}

static attnd_err find_seq(attnd_ops *o, attnd_session *s, uint64_t id, const char *field,
                          attnd_ops_reply *r, attnd_seq **out)
{
    *out = id ? attnd_cache_find(o->cache, s->id, id) : NULL;
    if (*out == NULL)
        return attnd_ops_fail(r, id ? ATTND_ERR_NOT_FOUND : ATTND_ERR_INVALID_ARGUMENT,
                              "%s: %llu %s", field, (unsigned long long)id,
                              id ? "not found in this session" : "is reserved");
    return ATTND_ERR_OK;
}

static attnd_err check_new_seq(attnd_ops *o, attnd_session *s, uint64_t id, const char *field,
                               attnd_ops_reply *r)
{
    if (id == 0) return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "%s: 0 is reserved", field);
    if (attnd_cache_find(o->cache, s->id, id))
        return attnd_ops_fail(r, ATTND_ERR_ALREADY_EXISTS, "%s: %llu already exists", field,
                              (unsigned long long)id);
    if (s->nseqs >= o->limits.max_seqs)
        return attnd_ops_fail(r, ATTND_ERR_UNAVAILABLE, "%s: session holds limits.max_seqs (%u)",
                              field, o->limits.max_seqs);
    return ATTND_ERR_OK;
}

static attnd_err op_create(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                           attnd_ops_reply *r)
{
    uint64_t id = req->create->seq_id;
    attnd_seq *q;
    attnd_err rv;
    (void)pipe;
    if ((rv = check_new_seq(o, s, id, "seq_id", r)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cache_create(o->cache, s->id, id, &q)) != ATTND_ERR_OK)
        return attnd_ops_fail(r, rv, "seq_id: %s", attnd_strerror(rv));
    s->nseqs++;
    return reply_seq(r, q);
}

static attnd_err copy_linear_state(attnd_ops *o, int32_t src, int32_t dst)
{
    size_t b = attnd_ops_linear_slot_bytes(o);
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < o->geo.num_layers && rv == ATTND_ERR_OK; l++) {
        char *base = o->lin_state[l];
        rv = attnd_backend_memcpy(o->be, base + (size_t)dst * b, base + (size_t)src * b, b,
                                  ATTND_MEMCPY_D2D);
    }
    return rv;
}

static attnd_err op_fork(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                         attnd_ops_reply *r)
{
    const Attnd__ForkSequence *m = req->fork;
    attnd_seq *parent, *child;
    attnd_cache_copy lc;
    attnd_err rv;
    (void)pipe;
    if ((rv = find_seq(o, s, m->parent, "parent", r, &parent)) != ATTND_ERR_OK) return rv;
    if ((rv = check_new_seq(o, s, m->child, "child", r)) != ATTND_ERR_OK) return rv;
    if (parent->step)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "parent: %llu is in open step %llu",
                              (unsigned long long)parent->id, (unsigned long long)parent->step);
    if ((rv = attnd_cache_fork(o->cache, parent, m->child, &child, &lc)) != ATTND_ERR_OK)
        return attnd_ops_fail(r, rv, "child: %s",
                              rv == ATTND_ERR_OUT_OF_BLOCKS ? "no free linear state slot"
                                                            : attnd_strerror(rv));
    if (lc.src >= 0 && (rv = copy_linear_state(o, lc.src, lc.dst)) != ATTND_ERR_OK) {
        attnd_cache_release(o->cache, child);
        return attnd_ops_kernel_fail(o, r, rv, "child: copying the linear state");
    }
    s->nseqs++;
    return reply_seq(r, child);
}

static attnd_err op_free(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                         attnd_ops_reply *r)
{
    attnd_seq *q;
    attnd_err rv;
    (void)pipe;
    if ((rv = find_seq(o, s, req->free->seq_id, "seq_id", r, &q)) != ATTND_ERR_OK) return rv;
    if (q->step)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                              "seq_id: %llu is in open step %llu (end it first)",
                              (unsigned long long)q->id, (unsigned long long)q->step);
    attnd_cache_release(o->cache, q);
    s->nseqs--;
    return ATTND_ERR_OK;
}

static attnd_err op_query(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                          attnd_ops_reply *r)
{
    attnd_seq *q;
    attnd_err rv;
    (void)pipe;
    if ((rv = find_seq(o, s, req->query->seq_id, "seq_id", r, &q)) != ATTND_ERR_OK) return rv;
    return reply_seq(r, q);
}

static void list_one(attnd_seq *q, void *arg)
{
    attnd_ops_reply *r = arg;
    fill_seq_info(q, &r->seq_items[r->seqs.n_seqs]);
    r->seq_ptrs[r->seqs.n_seqs] = &r->seq_items[r->seqs.n_seqs];
    r->seqs.n_seqs++;
}

static attnd_err op_list(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                         attnd_ops_reply *r)
{
    (void)req;
    (void)pipe;
    attnd__sequence_list__init(&r->seqs);
    size_t n = s->nseqs ? s->nseqs : 1;
    r->seq_items = calloc(n, sizeof *r->seq_items);
    r->seq_ptrs = calloc(n, sizeof *r->seq_ptrs);
    if (r->seq_items == NULL || r->seq_ptrs == NULL)
        return attnd_ops_fail(r, ATTND_ERR_NO_MEMORY, "seqs: out of memory");
    attnd_cache_foreach(o->cache, s->id, list_one, r);
    r->seqs.seqs = r->seq_ptrs;
    r->reply.body_case = ATTND__REPLY__BODY_SEQS;
    r->reply.seqs = &r->seqs;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- dispatch */

#define OPS_FIRST_BODY ATTND__REQUEST__BODY_HELLO
#define OPS_LAST_BODY ATTND__REQUEST__BODY_WAKE_CHANNEL

static attnd_err op_begin(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                          attnd_ops_reply *r)
{
    (void)pipe;
    return attnd_step_begin(o, s, req->begin_step, r);
}

static attnd_err op_attend(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                           attnd_ops_reply *r)
{
    (void)pipe;
    return attnd_step_attend(o, s, req->attend, r);
}

static attnd_err op_end(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                        attnd_ops_reply *r)
{
    (void)pipe;
    return attnd_step_end(o, s, req->end_step, r);
}

static attnd_err op_tensor(attnd_ops *o, attnd_session *s, const Attnd__Request *req, uint32_t pipe,
                           attnd_ops_reply *r)
{
    (void)pipe;
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_MERGE:
        return attnd_tensorops_merge(o, s, req->merge, r);
    case ATTND__REQUEST__BODY_VARLEN:
        return attnd_tensorops_varlen(o, s, req->varlen, r);
    case ATTND__REQUEST__BODY_BLOCKSPARSE:
        return attnd_tensorops_blocksparse(o, s, req->blocksparse, r);
    case ATTND__REQUEST__BODY_LINEAR_PREFILL:
        return attnd_tensorops_linear_prefill(o, s, req->linear_prefill, r);
    default:
        return attnd_tensorops_linear_decode(o, s, req->linear_decode, r);
    }
}

static attnd_err op_channel(attnd_ops *o, attnd_session *s, const Attnd__Request *req,
                            uint32_t pipe, attnd_ops_reply *r)
{
    (void)pipe;
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
        return attnd_chanops_open(o, s, req->open_channel, r);
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
        return attnd_chanops_close(o, s, req->close_channel, r);
    default:
        return attnd_chanops_wake(o, s, req->wake_channel, r);
    }
}

/* The protocol as a table: handler, whether it needs a session, name for logs. */
static const struct {
    ops_handler fn;
    int session;
    const char *name;
} ops_table[OPS_LAST_BODY - OPS_FIRST_BODY + 1] = {
    [ATTND__REQUEST__BODY_HELLO - OPS_FIRST_BODY] = {op_hello, 0, "hello"},
    [ATTND__REQUEST__BODY_REGISTER_REGION - OPS_FIRST_BODY] = {op_register, 1, "register_region"},
    [ATTND__REQUEST__BODY_UNREGISTER_REGION -
        OPS_FIRST_BODY] = {op_unregister, 1, "unregister_region"},
    [ATTND__REQUEST__BODY_CREATE - OPS_FIRST_BODY] = {op_create, 1, "create"},
    [ATTND__REQUEST__BODY_FORK - OPS_FIRST_BODY] = {op_fork, 1, "fork"},
    [ATTND__REQUEST__BODY_FREE - OPS_FIRST_BODY] = {op_free, 1, "free"},
    [ATTND__REQUEST__BODY_QUERY - OPS_FIRST_BODY] = {op_query, 1, "query"},
    [ATTND__REQUEST__BODY_LIST - OPS_FIRST_BODY] = {op_list, 1, "list"},
    [ATTND__REQUEST__BODY_BEGIN_STEP - OPS_FIRST_BODY] = {op_begin, 1, "begin_step"},
    [ATTND__REQUEST__BODY_ATTEND - OPS_FIRST_BODY] = {op_attend, 1, "attend"},
    [ATTND__REQUEST__BODY_END_STEP - OPS_FIRST_BODY] = {op_end, 1, "end_step"},
    [ATTND__REQUEST__BODY_MERGE - OPS_FIRST_BODY] = {op_tensor, 1, "merge"},
    [ATTND__REQUEST__BODY_VARLEN - OPS_FIRST_BODY] = {op_tensor, 1, "varlen"},
    [ATTND__REQUEST__BODY_BLOCKSPARSE - OPS_FIRST_BODY] = {op_tensor, 1, "blocksparse"},
    [ATTND__REQUEST__BODY_LINEAR_PREFILL - OPS_FIRST_BODY] = {op_tensor, 1, "linear_prefill"},
    [ATTND__REQUEST__BODY_LINEAR_DECODE - OPS_FIRST_BODY] = {op_tensor, 1, "linear_decode"},
    [ATTND__REQUEST__BODY_STATUS - OPS_FIRST_BODY] = {op_status, 0, "status"},
    [ATTND__REQUEST__BODY_OPEN_CHANNEL - OPS_FIRST_BODY] = {op_channel, 1, "open_channel"},
    [ATTND__REQUEST__BODY_CLOSE_CHANNEL - OPS_FIRST_BODY] = {op_channel, 1, "close_channel"},
    [ATTND__REQUEST__BODY_WAKE_CHANNEL - OPS_FIRST_BODY] = {op_channel, 1, "wake_channel"},
};

/* Requests that launch kernels or copy device memory (an EndStep that aborts does neither). */
static int ops_needs_device(const Attnd__Request *req)
{
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_FORK:
    case ATTND__REQUEST__BODY_BEGIN_STEP:
    case ATTND__REQUEST__BODY_ATTEND:
    case ATTND__REQUEST__BODY_MERGE:
    case ATTND__REQUEST__BODY_VARLEN:
    case ATTND__REQUEST__BODY_BLOCKSPARSE:
    case ATTND__REQUEST__BODY_LINEAR_PREFILL:
    case ATTND__REQUEST__BODY_LINEAR_DECODE:
        return 1;
    case ATTND__REQUEST__BODY_END_STEP:
        return !req->end_step->abort;
    default:
        return 0;
    }
}

static attnd_err ops_dispatch(attnd_ops *o, const Attnd__Request *req, uint32_t pipe,
                              uint64_t age_ms, attnd_ops_reply *r)
{
    attnd_session *s = NULL;
    attnd_err rv;
    int bc = (int)req->body_case;
    if (bc < OPS_FIRST_BODY || bc > OPS_LAST_BODY || ops_table[bc - OPS_FIRST_BODY].fn == NULL)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "body: none set");
    if (o->limits.request_timeout_ms && age_ms > o->limits.request_timeout_ms)
        return attnd_ops_fail(r, ATTND_ERR_TIMEOUT,
                              "request: queued %llu ms, over limits.request_timeout_ms (%u)",
                              (unsigned long long)age_ms, o->limits.request_timeout_ms);
    if (ops_table[bc - OPS_FIRST_BODY].session &&
        (rv = attnd_session_get(&o->sessions, req->session, pipe, &s, r->msg, sizeof r->msg)))
        return (attnd_err)(r->reply.code = (uint32_t)rv);
    if (o->device_failed && ops_needs_device(req))
        return attnd_ops_fail(r, ATTND_ERR_INTERNAL,
                              "device: unusable since an earlier GPU error (%s); restart the "
                              "daemon",
                              o->device_error);
    return ops_table[bc - OPS_FIRST_BODY].fn(o, s, req, pipe, r);
}

/* Whether a failed request may be logged now (repeated errors are rate limited per body and
 * code); *suppressed gets how many were not. */
static int ops_log_allowed(attnd_ops *o, const char *name, attnd_err rv, uint64_t *suppressed)
{
    char key[48];
    *suppressed = 0;
    if (rv == ATTND_ERR_OK || o->log_limit == NULL) return 1;
    snprintf(key, sizeof key, "%s:%s", name, attnd_err_name(rv));
    if (attnd_ratelimit_allow(o->log_limit, key, attnd_metrics_now_ns(), suppressed)) return 1;
    if (o->metrics) attnd_metrics_event(o->metrics, ATTND_METRICS_EVENT_LOG_SUPPRESSED);
    return 0;
}

void attnd_ops_handle(attnd_ops *o, const Attnd__Request *req, uint32_t pipe, uint64_t age_ms,
                      attnd_ops_reply *r)
{
    uint64_t t0 = attnd_metrics_now_ns(), suppressed = 0;
    attnd_err rv = ops_dispatch(o, req, pipe, age_ms, r);
    /* the kernel requests on client tensors: their time is the handler's (Attend counts its own
     * kernels in step.c) */
    if (rv == ATTND_ERR_OK && o->metrics && req->body_case >= ATTND__REQUEST__BODY_MERGE &&
        req->body_case <= ATTND__REQUEST__BODY_LINEAR_DECODE)
        attnd_metrics_kernel(o->metrics, ATTND_METRICS_KERNEL_OTHER, attnd_metrics_now_ns() - t0,
                             0);
    r->reply.code = (uint32_t)rv;
    if (rv != ATTND_ERR_OK && r->msg[0] == '\0')
        snprintf(r->msg, sizeof r->msg, "%s", attnd_strerror(rv));
    if (rv == ATTND_ERR_OK) r->msg[0] = '\0';
    int bc = (int)req->body_case;
    const char *name =
        (bc >= OPS_FIRST_BODY && bc <= OPS_LAST_BODY && ops_table[bc - OPS_FIRST_BODY].name)
            ? ops_table[bc - OPS_FIRST_BODY].name
            : "none";
    if (!attnd_log_enabled(o->log, rv == ATTND_ERR_OK ? ATTND_LOG_DEBUG : ATTND_LOG_INFO) ||
        !ops_log_allowed(o, name, rv, &suppressed))
        return;
    ATTND_LOG(o->log, rv == ATTND_ERR_OK ? ATTND_LOG_DEBUG : ATTND_LOG_INFO,
              "event=request id=%llu session=%llu body=%s code=%s msg=\"%s\" suppressed=%llu",
              (unsigned long long)req->id, (unsigned long long)req->session, name,
              attnd_err_name(rv), r->msg, (unsigned long long)suppressed);
}

/* ---------------------------------------------------------------- control events */

static void on_session_gone(attnd_session *s, void *arg)
{
    attnd_ops *o = arg;
    attnd_chanops_session_gone(o, s);
    attnd_step_abort_session(o, s);
    ATTND_LOG(o->log, ATTND_LOG_INFO, "event=disconnect session=%llu pipe=%u seqs=%u reclaim_ms=%u",
              (unsigned long long)s->id, s->pipe, s->nseqs, o->limits.reclaim_timeout_ms);
}

void attnd_ops_pipe_closed(attnd_ops *o, uint32_t pipe)
{
    attnd_ops_drain(o); /* its CUDA_IPC regions close next: no kernel may still read them */
    attnd_sessions_disconnect(&o->sessions, pipe, attnd_ops_now_ms(), on_session_gone, o);
    if (o->limits.reclaim_timeout_ms == 0) attnd_ops_sweep(o);
}

void attnd_ops_sweep(attnd_ops *o)
{
    attnd_session *s;
    uint64_t now = attnd_ops_now_ms();
    while ((s = attnd_sessions_expired(&o->sessions, now, o->limits.reclaim_timeout_ms))) {
        uint32_t n = attnd_cache_release_owner(o->cache, s->id);
        if (o->metrics) attnd_metrics_event(o->metrics, ATTND_METRICS_EVENT_SESSIONS_RECLAIMED);
        ATTND_LOG(o->log, ATTND_LOG_INFO, "event=reclaim session=%llu seqs=%u blocks_free=%u",
                  (unsigned long long)s->id, n, attnd_cache_blocks_free(o->cache));
        attnd_session_close(&o->sessions, s);
    }
}

void attnd_ops_apply_live(attnd_ops *o, const attnd_config *cfg)
{
    o->limits = cfg->limits;
    memcpy(o->token, cfg->server.token, sizeof o->token);
}

void attnd_ops_log_stats(attnd_ops *o)
{
    uint64_t req = atomic_load(&o->requests);
    uint64_t ok = atomic_load(&o->by_code[ATTND_ERR_OK]);
    ATTND_LOG(o->log, ATTND_LOG_INFO,
              "event=stats requests=%llu errors=%llu sessions=%u seqs=%u blocks_free=%u/%u "
              "steps_open=%llu",
              (unsigned long long)req, (unsigned long long)(req - ok), o->sessions.count,
              attnd_cache_num_seqs(o->cache), attnd_cache_blocks_free(o->cache), o->geo.num_blocks,
              (unsigned long long)attnd_step_count(o));
}
