/* Request handlers: the daemon's state (cache memory, sequences, sessions, open steps, the
 * linear-attention state cache) and one handler per request body, dispatched from a table.
 *
 * Everything here runs on the executor thread (attnd_ops_count excepted), so the state needs
 * no locks. Steps live in step.c, the kernel requests on client tensors in tensorops.c; both
 * use the helpers below. Every handler validates the whole request before it touches memory
 * and returns an attnd_err with a message naming the field (attnd_ops_fail). */
#ifndef ATTND_DAEMON_OPS_H
#define ATTND_DAEMON_OPS_H

#include <stdatomic.h>
#include <stdint.h>

#include "attnd.pb-c.h"
#include "attnd/kernels.h"
#include "cache.h"
#include "config.h"
#include "handles.h"
#include "log.h"
#include "session.h"

/* Version of proto/attnd.proto this daemon speaks (Hello.protocol_version). */
#define ATTND_PROTOCOL_VERSION 1

#define ATTND_OPS_COUNT_CODE(name, value, msg) +1
enum { ATTND_OPS_NCODES = 0 ATTND_ERR_MAP(ATTND_OPS_COUNT_CODE) };
#undef ATTND_OPS_COUNT_CODE

struct attnd_step;
struct attnd_channels;
struct attnd_inflight_item;

typedef struct attnd_ops {
    attnd_log *log;
    attnd_backend *be;
    attnd_cfg_geometry geo;
    attnd_cfg_linear lin;
    float scale;
    attnd_cfg_limits limits;         /* live */
    char token[ATTND_CFG_TOKEN_MAX]; /* live */
    int32_t units;                   /* parallel units the planner fills */
    attnd_cache *cache;
    attnd_sessions sessions;
    void **k_cache, **v_cache; /* [num_layers] backend memory */
    void **lin_state;          /* [num_layers] [slots][heads][dim][dim] f32, NULL if no slots */
    float *alibi;              /* backend memory [num_q_heads], NULL when off */
    struct attnd_step *steps;  /* open steps of every session */
    uint64_t next_step;
    uint64_t start_ms;
    atomic_uint_fast64_t requests;
    atomic_uint_fast64_t by_code[ATTND_OPS_NCODES];
    struct attnd_metrics *metrics;     /* kernel time and bytes by kind; NULL = not counted */
    struct attnd_ratelimit *log_limit; /* repeated request errors logged at this rate; NULL = all */
    /* Memory every step shares, allocated once at start (step.c uses it): */
    void *ws3d;         /* split-KV workspace of the 3D launches (backend memory) */
    size_t ws3d_bytes;  /* it holds split_rows rows x segments */
    int32_t split_rows; /* the planner's bound on a 3D launch's rows x segments */
    void *index_dev;    /* device backends: [index_slots] slots of a plan's index arrays */
    size_t index_slot_bytes;
    uint32_t index_slots;
    void *index_host;                 /* [index_slots] page-locked staging of each slot's upload */
    struct attnd_fence **index_fence; /* [index_slots] after the slot's last upload, or NULL */
    struct attnd_step **index_owner;  /* [index_slots] the open step whose arrays a slot holds */
    uint64_t *index_used;             /* [index_slots] last use, for LRU reuse */
    uint64_t index_clock;
    /* Device backends: */
    void *stage;            /* device copies of host tensors (grows on demand) */
    size_t stage_bytes;     /* its size */
    uint64_t device_bytes;  /* device memory taken at start (cache, tables, workspaces) */
    char device_name[64];   /* "" on the cpu backend */
    int device_failed;      /* a GPU error left the device unusable: no more kernel work */
    char device_error[512]; /* what failed */
    /* Replies waiting for their kernels (inflight.c), a ring in completion order: */
    struct attnd_inflight_item *inflight;
    uint32_t inflight_head, inflight_count, inflight_cap;
    uint64_t inflight_done_ns; /* when the last one completed (kernel time is not counted twice) */
    /* Set by the daemon's wiring: the SIGBUS guard over client-owned mappings (HOST_SHM
     * regions, channels) and the shared-memory channels; NULL = none. */
    struct attnd_shmguard *guard;
    struct attnd_channels *channels;
    uint32_t spin_us; /* the executor's idle polling window, told to channel clients */
} attnd_ops;

/* One reply and the storage its sub-messages point to. */
typedef struct attnd_ops_reply {
    Attnd__Reply reply;
    char msg[512];
    Attnd__HelloReply hello;
    Attnd__Geometry geometry;
    Attnd__Limits limits;
    Attnd__SequenceInfo seq;
    Attnd__SequenceList seqs;
    Attnd__SequenceInfo *seq_items; /* heap */
    Attnd__SequenceInfo **seq_ptrs; /* heap */
    Attnd__BeginStepReply step;
    Attnd__InlineOutputs outputs;
    ProtobufCBinaryData out_data[ATTND_HANDLES_MAX_OUT]; /* heap data */
    Attnd__StatusReply status;
    Attnd__OpenChannelReply channel;
    /* Set by a handler whose kernels still run and whose reply needs nothing else from the host:
     * the caller defers the reply (attnd_ops_defer) instead of sending it now. */
    struct attnd_fence *fence;
    const char *fence_what; /* the op, named in an INTERNAL reply if the kernels failed */
    int fence_kind;         /* attnd_metrics_kernel_kind charged with the wait */
    uint64_t fence_t_ns;    /* when the last kernel was queued */
} attnd_ops_reply;

/* Called when a deferred reply is ready (executor thread); r is the one handed to defer. */
typedef void (*attnd_ops_done_fn)(void *arg, attnd_ops_reply *r);

/* Allocate the cache pools and the linear state on backend be (which must outlive ops). */
attnd_err attnd_ops_alloc(attnd_ops **o, const attnd_config *cfg, attnd_backend *be, int32_t units,
                          attnd_log *lg);
/* Release every sequence, step, session and pool. */
void attnd_ops_free(attnd_ops *o);

/* Handle one decoded request from connection pipe (nng_pipe_id), queued for age_ms. r was
 * initialised. pipe 0: the connection is already gone (a Hello then opens no session that
 * nothing would ever reclaim). */
void attnd_ops_handle(attnd_ops *o, const Attnd__Request *req, uint32_t pipe, uint64_t age_ms,
                      attnd_ops_reply *r);
/* Count a reply by code (any thread). */
void attnd_ops_count(attnd_ops *o, attnd_err code);

/* Control events (executor thread). */
void attnd_ops_pipe_closed(attnd_ops *o, uint32_t pipe);
/* Reclaim sessions whose connection dropped more than limits.reclaim_timeout_ms ago. */
void attnd_ops_sweep(attnd_ops *o);
/* Apply the live keys of a validated configuration (limits, token). */
void attnd_ops_apply_live(attnd_ops *o, const attnd_config *cfg);
/* One key=value stats line at info level. */
void attnd_ops_log_stats(attnd_ops *o);

/* ---------------------------------------------------------------- deferred replies (inflight.c)
 * The executor queues the next request's kernels while the last ones run; replies go out in
 * order as their fences pass. */
/* Hand over r (r->fence set): done(arg, r) runs from a later attnd_ops_poll, with r->reply an
 * INTERNAL error naming r->fence_what if the kernels failed. Never fails: without memory for
 * the queue it waits for the device and calls done at once. */
void attnd_ops_defer(attnd_ops *o, attnd_ops_reply *r, attnd_ops_done_fn done, void *arg);
/* Complete the deferred replies whose kernels finished, oldest first; returns how many. */
uint32_t attnd_ops_poll(attnd_ops *o);
/* Deferred replies not completed yet. */
uint32_t attnd_ops_inflight(const attnd_ops *o);
/* Wait for every deferred reply's kernels and complete them (before memory they use goes). */
void attnd_ops_drain(attnd_ops *o);

/* ---------------------------------------------------------------- replies */
void attnd_ops_reply_init(attnd_ops_reply *r, uint64_t id);
void attnd_ops_reply_fini(attnd_ops_reply *r);
/* Set the reply's code and message; returns code. */
attnd_err attnd_ops_fail(attnd_ops_reply *r, attnd_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A kernel's error as a reply: "<what>: <backend message>". On a device backend an INTERNAL
 * code (a CUDA error) also stops all later kernel work (attnd_ops_handle refuses it). */
attnd_err attnd_ops_kernel_fail(attnd_ops *o, attnd_ops_reply *r, attnd_err code, const char *what);
/* Move hr's INLINE outputs into the reply (body outputs), in the order they were resolved. */
void attnd_ops_take_outputs(attnd_ops_reply *r, attnd_handles_req *hr);
/* Resolve a reference; on error the reply carries it. */
attnd_err attnd_ops_resolve(attnd_ops_reply *r, attnd_handles_req *hr, const Attnd__TensorRef *ref,
                            const attnd_tref_spec *spec, attnd_tensor *t);
/* Start a per-request handle context over s's regions; INVALID_ARGUMENT when the INLINE input
 * bytes of refs exceed limits.max_inline_bytes. */
attnd_err attnd_ops_handles_begin(attnd_ops *o, attnd_session *s, attnd_ops_reply *r,
                                  attnd_handles_req *hr, const Attnd__TensorRef *const *refs,
                                  size_t nrefs);

/* ---------------------------------------------------------------- backend memory helpers */
/* Host data the kernels read: used in place on host backends, copied to device memory
 * otherwise (*dev != host then; release with attnd_ops_release). */
attnd_err attnd_ops_upload(attnd_ops *o, const void *host, size_t bytes, void **dev);
void attnd_ops_release(attnd_ops *o, void *dev, const void *host);
attnd_err attnd_ops_zero(attnd_ops *o, void *dev, size_t bytes);
/* Device backends: copy the host views hr noted (INLINE bytes, HOST_SHM regions) to device
 * memory and point every tensor of ts whose data is such a view at its copy (outputs are
 * copied too, so that bytes a strided view skips come back unchanged). No-op on host
 * backends. Call after every content check on host data, right before the kernel. */
attnd_err attnd_ops_stage_in(attnd_ops *o, attnd_ops_reply *r, attnd_handles_req *hr,
                             attnd_tensor *const *ts, size_t nts);
/* After the kernel finished: copy the staged outputs back to their host views, then
 * INVALID_ARGUMENT if a HOST_SHM region the request used was truncated by its client meanwhile
 * (attnd_handles_check_faults). Every backend calls it. */
attnd_err attnd_ops_stage_out(attnd_ops *o, attnd_ops_reply *r, attnd_handles_req *hr);
/* Bytes of one layer's K (or V) block. */
size_t attnd_ops_block_bytes(const attnd_ops *o);
/* Bytes of one linear state slot (heads x dim x dim f32). */
size_t attnd_ops_linear_slot_bytes(const attnd_ops *o);

uint64_t attnd_ops_now_ms(void);

#endif
