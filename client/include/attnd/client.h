/* libattnd-client: the C client of the attnd daemon (proto/attnd.proto is the wire contract).
 *
 * One attnd_client is one NNG REQ socket dialed to one daemon, and after attnd_client_hello one
 * session. Every call is synchronous: it sends one Request, waits for its Reply (at most the
 * client's timeout for the send and the receive together) and returns an attnd_err: OK, the
 * daemon's code, or a local one (UNAVAILABLE: cannot connect or the connection dropped, TIMEOUT:
 * no reply in time, PROTOCOL: a reply that does not decode or does not match the request,
 * INVALID_ARGUMENT: a call the client cannot even encode). attnd_client_last_error gives the
 * message: the daemon's own (it names the field and the value) or the client's.
 *
 * A session lives on its connection. When the connection drops (the daemon exits or closes
 * it), calls in flight and every later call fail at once with UNAVAILABLE; make a new client
 * to start over (the daemon reclaims the old session's sequences after its timeout).
 *
 * Threads: calls on one client may come from several threads at once (each call runs on its own
 * NNG context, replies are matched to their requests). Configure (timeout, hello) before sharing.
 * Regions, sequences and steps belong to the client's session; another client cannot name them.
 *
 * Same host: attnd_client_connect to an ipc:// URL also opens a shared-memory channel (a POSIX
 * shm object the daemon maps too). BeginStep, Attend (without INLINE outputs), EndStep and the
 * sequence create / fork / free calls then travel through it, skipping the socket's thread
 * hand-offs; the caller spins for its reply, then sleeps on a futex. Every other call, and all
 * of them when the channel could not be opened, takes the socket; results are the same.
 *
 * Environment: $ATTND_URL is the daemon's address when a NULL url is dialed (else
 * ATTND_CLIENT_DEFAULT_URL, ipc:///tmp/attnd.sock); $ATTND_TOKEN the Hello token when
 * attnd_client_opts.token is NULL or empty. Both are read when used (dial, alloc); an explicit
 * url or token wins.
 *
 * Tensors travel by reference (attnd_ref): a region registered with the daemon plus an offset,
 * usually a POSIX shared-memory object made by attnd_client_shm_create, or INLINE (the bytes ride
 * in the message; an inline output is copied back from the reply into the caller's buffer).
 */
#ifndef ATTND_CLIENT_H
#define ATTND_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/dtype.h"
#include "attnd/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ATTND_CLIENT_API __attribute__((visibility("default")))
#else
#define ATTND_CLIENT_API
#endif

/* Hello.protocol_version this client speaks. */
#define ATTND_CLIENT_PROTOCOL_VERSION 1
/* The daemon's address when attnd_client_dial / attnd_client_connect get a NULL url and
 * $ATTND_URL is unset or empty (the default config's socket). */
#define ATTND_CLIENT_DEFAULT_URL "ipc:///tmp/attnd.sock"
/* Send + receive budget of one call when attnd_client_opts.timeout_ms is 0. */
#define ATTND_CLIENT_DEFAULT_TIMEOUT_MS 10000
/* Slots of the shared-memory channel when attnd_client_opts.channel_slots is 0: calls that can
 * be in flight on it at once (more take the socket). */
#define ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS 8
/* How long a call spins on its channel reply before it sleeps, when attnd_client_opts.spin_us
 * is 0. */
#define ATTND_CLIENT_DEFAULT_SPIN_US 2000
/* Most dims a tensor reference carries (as the kernels' ATTND_MAX_DIMS). */
#define ATTND_REF_MAX_DIMS 4

typedef struct attnd_client attnd_client;

typedef struct attnd_client_opts {
    const char *name;   /* Hello.client_name; NULL = "attnd-client" */
    const char *token;  /* Hello.token, when the daemon requires one; NULL or "" = $ATTND_TOKEN
                           (none when that is unset or empty) */
    int32_t timeout_ms; /* per call; 0 = ATTND_CLIENT_DEFAULT_TIMEOUT_MS, -1 = wait forever */
    /* same-host shared-memory channel, opened by attnd_client_connect for ipc:// URLs: 0 =
     * default (ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS = 8), -1 = never */
    int32_t channel_slots;
    /* how long a call spins on its channel reply before sleeping: 0 = default
     * (ATTND_CLIENT_DEFAULT_SPIN_US = 2000), -1 = sleep at once */
    int32_t spin_us;
} attnd_client_opts;

/* One layer's attention options: as the daemon applies them (attnd_geometry.layers, every key
 * resolved), or as a client expects them (attnd_expect.layer_opts, compared within 1e-6
 * relative). */
typedef struct attnd_layer_opts {
    uint32_t sliding_window;   /* 0 = off */
    float softcap;             /* 0 = off */
    float scale;               /* softmax scale (expect: 0 = 1/sqrt(head_size)) */
    float k_scale, v_scale;    /* fp8 cache scales (expect: 0 = not compared) */
    int32_t alibi;             /* 1: ALiBi */
    uint32_t num_alibi_slopes; /* num_q_heads with ALiBi (expect: 0 = the standard slopes) */
    const float *alibi_slopes;
    uint32_t num_sinks; /* num_q_heads with sinks, 0 without */
    const float *sinks; /* sink logits */
} attnd_layer_opts;

/* The daemon's fixed geometry (HelloReply.geometry, StatusReply.geometry). */
typedef struct attnd_geometry {
    uint32_t num_layers;
    uint32_t num_q_heads;
    uint32_t num_kv_heads;
    uint32_t head_size;
    uint32_t block_size;
    attnd_dtype cache_dtype;
    uint32_t num_blocks;
    uint32_t max_blocks_per_seq;
    float scale;
    uint32_t linear_slots; /* 0 = no linear-attention state cache */
    uint32_t linear_heads;
    uint32_t linear_head_dim;
    /* every layer windowed: blocks wholly before this many tokens behind a sequence's end are
     * released (attnd_seq_info.released_tokens); 0 = every block is kept */
    uint32_t window_release;
    /* [num_layers] every layer's options; the client's memory: Hello's stay valid until the next
     * Hello or attnd_client_free, Status's until the next attnd_client_status on this client */
    const attnd_layer_opts *layers;
} attnd_geometry;

/* The geometry a client expects: sent with every later Hello (attnd_client_set_expect), which
 * the daemon refuses with FAILED_PRECONDITION naming the first difference ("geometry.layers[3]
 * .softcap: the daemon serves 0, the client expects 50"), so that a daemon configured for
 * another model never serves silently wrong results. */
typedef struct attnd_expect {
    uint32_t num_layers, num_q_heads, num_kv_heads, head_size, block_size; /* 0 = not compared */
    int32_t compare_cache_dtype; /* 1: cache_dtype is compared */
    attnd_dtype cache_dtype;
    /* 0 = layers not compared; else it divides num_layers and entry i % num_layer_opts is
     * layer i's (Gemma-2: 2 entries) */
    uint32_t num_layer_opts;
    const attnd_layer_opts *layer_opts;
} attnd_expect;

/* Per-session limits (HelloReply.limits). */
typedef struct attnd_limits {
    uint32_t max_seqs;
    uint32_t max_step_tokens;
    uint32_t max_regions;
    uint64_t max_inline_bytes;
    uint32_t request_timeout_ms;
} attnd_limits;

/* What Hello returned: the session and the daemon's description. */
typedef struct attnd_server_info {
    uint32_t protocol_version;
    uint64_t session;
    char version[64];
    char backend[16];
    attnd_geometry geometry;
    attnd_limits limits;
    uint32_t blocks_free;
} attnd_server_info;

/* StatusReply. */
typedef struct attnd_status {
    char version[64];
    char backend[16];
    attnd_geometry geometry;
    uint32_t blocks_free;
    uint32_t num_sequences;
    uint32_t num_sessions;
    uint64_t requests;
    uint64_t errors;
    double uptime_s;
    int32_t mps; /* 1: the daemon's GPU is shared through NVIDIA MPS, 0: not, -1: unknown (a
                    host backend, or a daemon that does not say) */
} attnd_status;

/* SequenceInfo. */
typedef struct attnd_seq_info {
    uint64_t seq_id;
    uint32_t num_tokens;
    uint32_t num_blocks;
    uint64_t step;            /* open step holding it, 0 if none */
    uint32_t released_tokens; /* leading tokens whose blocks the window released */
} attnd_seq_info;

/* One sequence of a BeginStep. */
typedef struct attnd_step_seq {
    uint64_t seq_id;
    uint32_t new_tokens;
} attnd_step_seq;

/* What BeginStep returned. */
typedef struct attnd_step {
    uint64_t id;
    uint32_t num_tokens; /* rows of Q/K/V of every Attend of this step */
} attnd_step;

/* A tensor reference (TensorRef). region 0 is INLINE: an input's bytes are `data` (`bytes` of
 * them, contiguous); an output's bytes come back into `out` (`bytes` = its capacity, which must
 * equal the size of what the daemon returns). Build one with the attnd_ref_* helpers below. */
typedef struct attnd_ref {
    uint32_t region; /* registered region id; 0 = INLINE */
    uint64_t offset; /* bytes from the region's start */
    attnd_dtype dtype;
    int32_t ndim;
    int64_t shape[ATTND_REF_MAX_DIMS];
    int64_t strides[ATTND_REF_MAX_DIMS]; /* elements; sent only when has_strides */
    int32_t has_strides;                 /* 0 = contiguous (no strides on the wire) */
    const void *data;                    /* INLINE input bytes */
    void *out;                           /* INLINE output destination */
    size_t bytes;                        /* INLINE: size of data, or capacity of out */
} attnd_ref;

/* A POSIX shared-memory object mapped here and registered with the daemon as one region.
 * The caller owns the struct; attnd_client_shm_create fills it, attnd_client_shm_destroy ends it.
 */
typedef struct attnd_shm {
    uint32_t region; /* region id it is registered under (0 = not registered) */
    char name[64];   /* shm_open name it had, "/attnd-<pid>-<n>-<rand>" (unlinked once mapped) */
    void *base;      /* mapping in this process */
    size_t size;     /* bytes */
} attnd_shm;

/* ---------------------------------------------------------------- client and session */

/* Allocate a client (opts may be NULL: defaults, the token from $ATTND_TOKEN). NO_MEMORY or
 * UNAVAILABLE (NNG socket) on failure. */
ATTND_CLIENT_API attnd_err attnd_client_alloc(attnd_client **c, const attnd_client_opts *opts);
/* Close the socket and free the client (NULL is ignored). Regions made with
 * attnd_client_shm_create must be destroyed first; the daemon reclaims the session's sequences
 * and drops its channel when the connection drops (no CloseChannel is sent). */
ATTND_CLIENT_API void attnd_client_free(attnd_client *c);
/* For tls+tcp:// URLs, before dialing: the PEM file of the CA(s) that must have signed the
 * daemon's certificate (required: the daemon is always verified) and the name to check the
 * certificate against (NULL = the URL's host; mbedTLS matches DNS names, so dial
 * tls+tcp://localhost:PORT rather than 127.0.0.1 for a "localhost" certificate). The strings are
 * copied. INVALID_ARGUMENT when too long. */
ATTND_CLIENT_API attnd_err attnd_client_set_tls(attnd_client *c, const char *ca_file,
                                                const char *server_name);
/* Dial "ipc:///path", "tcp://host:port" or "tls+tcp://host:port" (synchronous); url NULL =
 * attnd_client_default_url() ($ATTND_URL, else ATTND_CLIENT_DEFAULT_URL). UNAVAILABLE if
 * nothing listens there (or the TLS handshake fails), INVALID_ARGUMENT for an empty or malformed
 * URL or a tls+tcp:// URL without a CA (attnd_client_set_tls). */
ATTND_CLIENT_API attnd_err attnd_client_dial(attnd_client *c, const char *url);
/* What every later Hello expects of the daemon's geometry (deep-copied; NULL: nothing). Set it
 * before attnd_client_connect / attnd_client_hello. INVALID_ARGUMENT for arrays of
 * num_alibi_slopes / num_sinks without their pointers, NO_MEMORY. */
ATTND_CLIENT_API attnd_err attnd_client_set_expect(attnd_client *c, const attnd_expect *expect);
/* Send Hello and open a session; info (may be NULL) receives the reply, which the client also
 * keeps (attnd_client_server). FAILED_PRECONDITION when the geometry differs from what
 * attnd_client_set_expect asked (the message names the first difference). */
ATTND_CLIENT_API attnd_err attnd_client_hello(attnd_client *c, attnd_server_info *info);
/* attnd_client_dial (url NULL: $ATTND_URL, else the default) then attnd_client_hello; for an
 * ipc:// URL then also attnd_client_channel_open (unless opts.channel_slots is -1). A channel
 * that cannot be opened does not fail the connect: calls take the socket, and
 * attnd_client_channel_error says why. */
ATTND_CLIENT_API attnd_err attnd_client_connect(attnd_client *c, const char *url,
                                                attnd_server_info *info);
/* $ATTND_URL when set and not empty, else ATTND_CLIENT_DEFAULT_URL: what a NULL url dials. */
ATTND_CLIENT_API const char *attnd_client_default_url(void);
/* The URL of the last attnd_client_dial, also when it failed ("" before any): the one a NULL
 * url resolved to. */
ATTND_CLIENT_API const char *attnd_client_url(const attnd_client *c);
/* The HelloReply of the open session, or NULL before attnd_client_hello succeeded. */
ATTND_CLIENT_API const attnd_server_info *attnd_client_server(const attnd_client *c);
/* The session id (0 before Hello). */
ATTND_CLIENT_API uint64_t attnd_client_session(const attnd_client *c);
/* Change the per-call timeout (ms; 0 = default, -1 = forever) for calls that start afterwards. */
ATTND_CLIENT_API void attnd_client_set_timeout(attnd_client *c, int32_t timeout_ms);
/* How long calls spin on a channel reply before they sleep (as attnd_client_opts.spin_us: 0 =
 * default, -1 = sleep at once), for channels opened afterwards: set it between Hello (whose
 * backend may decide it) and attnd_client_channel_open. */
ATTND_CLIENT_API void attnd_client_set_spin(attnd_client *c, int32_t spin_us);
/* Message of the last failed call on this client ("" if none). The pointer stays valid until
 * the client is freed; when threads share a client prefer attnd_client_last_error_copy. */
ATTND_CLIENT_API const char *attnd_client_last_error(const attnd_client *c);
/* 1 when the last failure was an error reply from the daemon, 0 when it was the client's own
 * (transport, timeout, lost connection, a reply that did not decode). */
ATTND_CLIENT_API int attnd_client_last_error_remote(const attnd_client *c);
/* Copy the last error message into buf (always NUL-terminated when len > 0); returns its
 * length. */
ATTND_CLIENT_API size_t attnd_client_last_error_copy(const attnd_client *c, char *buf, size_t len);
/* StatusRequest; works without a session (after attnd_client_dial). */
ATTND_CLIENT_API attnd_err attnd_client_status(attnd_client *c, attnd_status *st);

/* ---------------------------------------------------------------- shared-memory channel */

/* Open the same-host channel (after Hello; the daemon must run on this host): a shm object of
 * `slots` slots (0 = ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS, at most 64), registered with
 * OpenChannel, its name unlinked at once. Not while calls are in flight. ALREADY_EXISTS when one
 * is open, INVALID_ARGUMENT (slots), UNAVAILABLE (no session), NO_MEMORY / INTERNAL (local system
 * calls), or the daemon's refusal (e.g. UNAVAILABLE: channels off or all in use). */
ATTND_CLIENT_API attnd_err attnd_client_channel_open(attnd_client *c, int32_t slots);
/* Close the channel (CloseChannel when the daemon still has it) and unmap it; later calls take
 * the socket. OK when there is none. Not while calls are in flight. */
ATTND_CLIENT_API attnd_err attnd_client_channel_close(attnd_client *c);
/* 1 while calls go through a channel; 0 when none was opened, or the daemon closed it (a call
 * then failed with UNAVAILABLE "channel: closed by the daemon"). */
ATTND_CLIENT_API int attnd_client_channel_active(const attnd_client *c);
/* Why attnd_client_connect opened no channel ("" when it did, or did not try). */
ATTND_CLIENT_API const char *attnd_client_channel_error(const attnd_client *c);

/* ---------------------------------------------------------------- regions */

/* Register a POSIX shm object (shm_open name) of `size` bytes as region `region` (> 0, unique
 * in the session). The daemon maps it. */
ATTND_CLIENT_API attnd_err attnd_client_region_register_shm(attnd_client *c, uint32_t region,
                                                            const char *shm_name, uint64_t size);
/* Register CUDA memory by its cudaIpcMemHandle_t (64 bytes at ipc_handle) as region `region`. */
ATTND_CLIENT_API attnd_err attnd_client_region_register_cuda(attnd_client *c, uint32_t region,
                                                             const void *ipc_handle, uint64_t size,
                                                             int32_t device);
/* Register CUDA device memory (cudaMalloc / cuMemAlloc) by pointer as region `region`: the
 * region spans [start of the allocation ptr lies in, ptr + nbytes), its IPC handle and device
 * found through the CUDA driver (loaded when called: nothing CUDA needed to build against
 * this). *base (may be NULL) receives the allocation's start: ptr sits at offset ptr - *base.
 * The memory must outlive the registration. INVALID_ARGUMENT for a pointer that is not device
 * memory or nbytes past the allocation, UNSUPPORTED for memory without a CUDA IPC handle
 * (cuMemCreate, memory pools). */
ATTND_CLIENT_API attnd_err attnd_client_region_register_cuda_ptr(attnd_client *c, uint32_t region,
                                                                 const void *ptr, uint64_t nbytes,
                                                                 uint64_t *base);
ATTND_CLIENT_API attnd_err attnd_client_region_unregister(attnd_client *c, uint32_t region);
/* A region id not yet handed out by this client (1, 2, ...); attnd_client_shm_create uses it. */
ATTND_CLIENT_API uint32_t attnd_client_region_next_id(attnd_client *c);

/* Create a shm object of `size` bytes (shm_open + ftruncate + mmap, zero-filled), and register
 * it under a fresh region id. Once the daemon has mapped it the name is unlinked, so the memory
 * lives exactly as long as the two mappings (a crash leaves nothing in /dev/shm); shm->name
 * stays for messages. On failure nothing is left behind. NO_MEMORY / INTERNAL for local
 * failures (the message names the system call), or the daemon's code. */
ATTND_CLIENT_API attnd_err attnd_client_shm_create(attnd_client *c, size_t size, attnd_shm *shm);
/* Unregister (when registered and c is not NULL) and unmap. Returns the unregister result;
 * the local mapping is released in any case. */
ATTND_CLIENT_API attnd_err attnd_client_shm_destroy(attnd_client *c, attnd_shm *shm);

/* ---------------------------------------------------------------- tensor references */

/* Bytes of a contiguous tensor of this dtype and shape (0 for an unknown dtype or bad shape). */
ATTND_CLIENT_API size_t attnd_ref_nbytes(attnd_dtype dtype, int32_t ndim, const int64_t *shape);
/* A contiguous tensor at `offset` in region `region`. */
ATTND_CLIENT_API void attnd_ref_region(attnd_ref *r, uint32_t region, uint64_t offset,
                                       attnd_dtype dtype, int32_t ndim, const int64_t *shape);
/* A contiguous tensor at `offset` bytes into a shm object's region. */
ATTND_CLIENT_API void attnd_ref_shm(attnd_ref *r, const attnd_shm *shm, uint64_t offset,
                                    attnd_dtype dtype, int32_t ndim, const int64_t *shape);
/* An INLINE input: the contiguous bytes at data travel in the request. */
ATTND_CLIENT_API void attnd_ref_inline_in(attnd_ref *r, const void *data, attnd_dtype dtype,
                                          int32_t ndim, const int64_t *shape);
/* An INLINE output: the result comes back in the reply and is copied to out (contiguous,
 * attnd_ref_nbytes of the shape). */
ATTND_CLIENT_API void attnd_ref_inline_out(attnd_ref *r, void *out, attnd_dtype dtype, int32_t ndim,
                                           const int64_t *shape);

/* ---------------------------------------------------------------- sequences and steps */

/* Create sequence seq_id (client-chosen, non-zero). info may be NULL. */
ATTND_CLIENT_API attnd_err attnd_client_seq_create(attnd_client *c, uint64_t seq_id,
                                                   attnd_seq_info *info);
/* Fork parent into a new sequence child sharing its blocks (copy-on-write). info may be NULL. */
ATTND_CLIENT_API attnd_err attnd_client_seq_fork(attnd_client *c, uint64_t parent, uint64_t child,
                                                 attnd_seq_info *info);
ATTND_CLIENT_API attnd_err attnd_client_seq_free(attnd_client *c, uint64_t seq_id);
/* Drop the last `tokens` tokens of seq_id (speculative decoding's rollback): blocks past the new
 * end are released, a block shared with a fork is never written (its next write copies it).
 * INVALID_ARGUMENT (more tokens than it has, in an open step), FAILED_PRECONDITION (the window
 * already released keys the shorter sequence needs; linear-attention state). info may be NULL. */
ATTND_CLIENT_API attnd_err attnd_client_seq_truncate(attnd_client *c, uint64_t seq_id,
                                                     uint32_t tokens, attnd_seq_info *info);
ATTND_CLIENT_API attnd_err attnd_client_seq_query(attnd_client *c, uint64_t seq_id,
                                                  attnd_seq_info *info);
/* The session's sequences: up to cap of them into seqs, their total count into *n. */
ATTND_CLIENT_API attnd_err attnd_client_seq_list(attnd_client *c, attnd_seq_info *seqs, size_t cap,
                                                 size_t *n);
/* BeginStep over n sequences (Q/K/V rows are their new tokens, concatenated in this order).
 * query_start_loc (may be NULL) receives the n + 1 row offsets. */
ATTND_CLIENT_API attnd_err attnd_client_step_begin(attnd_client *c, const attnd_step_seq *seqs,
                                                   size_t n, attnd_step *step,
                                                   uint32_t *query_start_loc);
/* EndStep: commit, or with abort != 0 release the step's slots. */
ATTND_CLIENT_API attnd_err attnd_client_step_end(attnd_client *c, uint64_t step, int abort);

/* ---------------------------------------------------------------- ops */

/* One layer of a step: k_new/v_new [num_tokens, kv_heads, head_size] go into the cache, paged
 * attention of q [num_tokens, q_heads, head_size] goes to out; out_lse ([q_heads, num_tokens]
 * f32) may be NULL. Inline outputs are filled on success. */
ATTND_CLIENT_API attnd_err attnd_client_attend(attnd_client *c, uint64_t step, uint32_t layer,
                                               const attnd_ref *q, const attnd_ref *k_new,
                                               const attnd_ref *v_new, attnd_ref *out,
                                               attnd_ref *out_lse);

/* MergeStates (out_lse may be NULL). */
typedef struct attnd_merge_args {
    attnd_ref *out, *out_lse;
    const attnd_ref *prefix_out, *prefix_lse, *suffix_out, *suffix_lse;
} attnd_merge_args;
ATTND_CLIENT_API attnd_err attnd_client_merge(attnd_client *c, const attnd_merge_args *a);

/* VarlenAttention (bias may be NULL). */
typedef struct attnd_varlen_args {
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const attnd_ref *cu_seqlens_q, *cu_seqlens_k, *bias;
    int32_t max_seqlen_q, max_seqlen_k;
    int32_t causal;
    float scale;
    float q_scale, k_scale, v_scale, p_scale, out_scale;
} attnd_varlen_args;
ATTND_CLIENT_API attnd_err attnd_client_varlen(attnd_client *c, const attnd_varlen_args *a);

/* BlocksparseAttention. */
typedef struct attnd_blocksparse_args {
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const attnd_ref *cu_seqlens_q, *cu_seqlens_k, *layout_crow, *layout_col;
    int32_t block_size, q_block_size;
    int32_t max_seqlen_q, max_seqlen_k;
    float scale;
} attnd_blocksparse_args;
ATTND_CLIENT_API attnd_err attnd_client_blocksparse(attnd_client *c,
                                                    const attnd_blocksparse_args *a);

/* LinearPrefill / LinearDecode against the daemon-held state of each sequence (seq_ids[batch],
 * slopes[heads]; block_size is used by prefill only, 0 = the daemon's default). */
typedef struct attnd_linear_args {
    uint32_t layer;
    const uint64_t *seq_ids;
    size_t batch;
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const float *slopes;
    size_t num_slopes;
    int32_t block_size;
} attnd_linear_args;
ATTND_CLIENT_API attnd_err attnd_client_linear_prefill(attnd_client *c, const attnd_linear_args *a);
ATTND_CLIENT_API attnd_err attnd_client_linear_decode(attnd_client *c, const attnd_linear_args *a);

/* ---------------------------------------------------------------- stream-ordered steps
 * Same GPU (the daemon's device, under MPS): a stream channel hands each layer of a step over
 * with two GPU stream operations on the caller's CUDA stream, no host round trip per layer, so
 * the caller's host queues the whole step at once and may capture it in a CUDA graph:
 *
 *     attnd_client_stream_begin(s, seqs, n, &io, 1, &step, NULL);  // every layer queued
 * daemon-side for each layer l (on stream):
 *         ... write layer l's Q, K, V into io's buffers ...
 *         attnd_client_attend_async(s, l, stream);   // = stream_signal + stream_wait
 *         ... read io.out ...
 *     attnd_client_stream_end(s, step.id, 0);        // returns once the daemon ran every layer
 *
 * Per layer two 32-bit flag words, each owned by the side that waits on it: the daemon's (the
 * caller's stream writes 1 once the layer's Q/K/V are in place) and the caller's (the daemon's
 * stream writes 1 once the output is there; the caller's stream waits for it; the last layer's
 * wait writes every one of them back to 0 at the step's end).
 * The values are the same every step, so a captured graph replays. The caller's stream may run
 * ahead by one step: step k + 1's work (a replay) may be queued right after step k's, before
 * StreamEnd(k) and StreamBegin(k + 1) (in that order) are sent; the daemon resets its words before
 * its last output of a step and the caller's last wait resets the caller's, so nothing of step
 * k + 1 is erased, and the caller's GPU never idles for the two round trips. A step the daemon does
 * not see through within its timeout (OpenStreamReply.timeout_ms) is released: the daemon's stream
 * runs out, the step aborts, StreamEnd fails (TIMEOUT) and the channel takes no more steps:
 * close it and open another (new flag words: capture the graph again). When StreamEnd fails for
 * any such reason, and as soon as the connection to the daemon drops (from NNG's thread, even
 * while the caller is blocked on its stream), this library writes the caller's own flag words
 * for good (the channel's later resets keep them written), so that no wait queued on the
 * caller's stream stalls, a step queued ahead included; those steps' outputs are garbage.
 *
 * On a CUDA daemon the flag words are device memory (allocated through the CUDA driver in the
 * calling thread's current context, which must exist: the caller's framework made it) and
 * `stream` is a CUstream / cudaStream_t (NULL: the legacy default stream). On a CPU daemon
 * (tests) they are shared memory and `stream` must be NULL: a signal is a store and a wait polls,
 * on the calling thread. */
typedef struct attnd_client_stream attnd_client_stream;

/* One layer's tensors of a stream step (out_lse may be NULL), in registered regions (never
 * INLINE), left in place until the step ends; on a CUDA daemon device memory. */
typedef struct attnd_stream_layer {
    const attnd_ref *q, *k_new, *v_new;
    const attnd_ref *out, *out_lse;
} attnd_stream_layer;

/* OpenStream: a channel of c's session (after Hello). UNAVAILABLE (no session, or the daemon's
 * channels are all in use or off), FAILED_PRECONDITION (no current CUDA context), UNAVAILABLE /
 * INTERNAL from the CUDA driver, the daemon's codes. */
ATTND_CLIENT_API attnd_err attnd_client_stream_open(attnd_client *c, attnd_client_stream **s);
/* CloseStream, unmap and free (NULL is ignored). Nothing may still wait on its words. */
ATTND_CLIENT_API void attnd_client_stream_close(attnd_client_stream *s);
/* The daemon's id of the channel. */
ATTND_CLIENT_API uint32_t attnd_client_stream_id(const attnd_client_stream *s);
/* 1 once a step of the channel was released (timeout, abort while queued, daemon gone): only
 * attnd_client_stream_close is left. */
ATTND_CLIENT_API int attnd_client_stream_failed(const attnd_client_stream *s);
/* StreamBegin over n sequences: every layer's cache write + attention is queued on the daemon's
 * stream behind its flag word. layers: 1 entry used by every layer (the caller rewrites the same
 * buffers layer after layer, after waiting for the previous output), or num_layers entries.
 * query_start_loc (may be NULL) receives the n + 1 row offsets. */
ATTND_CLIENT_API attnd_err attnd_client_stream_begin(attnd_client_stream *s,
                                                     const attnd_step_seq *seqs, size_t n,
                                                     const attnd_stream_layer *layers,
                                                     size_t nlayers, attnd_step *step,
                                                     uint32_t *query_start_loc);
/* Queue on stream: layer's Q/K/V are in place (once the work queued before is done). */
ATTND_CLIENT_API attnd_err attnd_client_stream_signal(attnd_client_stream *s, uint32_t layer,
                                                      void *stream);
/* Queue on stream: wait until the daemon wrote layer's output. On a CUDA daemon the last layer's
 * wait then resets every layer's word for the next step: queue it after the step's other waits
 * (the same stream, or one ordered after theirs). On a CPU daemon this waits here and resets the
 * word (TIMEOUT after the channel's timeout and 5 s; UNAVAILABLE once the step was released or
 * the connection lost). */
ATTND_CLIENT_API attnd_err attnd_client_stream_wait(attnd_client_stream *s, uint32_t layer,
                                                    void *stream);
/* The layer's attention as stream operations: attnd_client_stream_signal then _wait. */
ATTND_CLIENT_API attnd_err attnd_client_attend_async(attnd_client_stream *s, uint32_t layer,
                                                     void *stream);
/* StreamEnd: commit (abort 0) once the daemon's stream ran every layer, or abort. The daemon's
 * TIMEOUT (released), UNAVAILABLE (connection lost), INTERNAL...: the caller's flag words are
 * then written from here (see above) and the channel is failed. */
ATTND_CLIENT_API attnd_err attnd_client_stream_end(attnd_client_stream *s, uint64_t step,
                                                   int abort);
/* The caller's stream may run a step's signals and waits before its StreamBegin answered (the
 * words of the step before were reset before its StreamEnd returned), so a replay can be launched
 * while StreamBegin travels. When that StreamBegin then fails, the daemon runs none of the
 * step: this writes the caller's own flag words from here, as a failed StreamEnd does, so that no
 * queued wait stalls; the step's outputs are garbage and the channel is failed. */
ATTND_CLIENT_API void attnd_client_stream_release(attnd_client_stream *s);

/* ---------------------------------------------------------------- layout, for bindings */

/* Offset of `field` in the public struct `type` ("attnd_ref", "region"), or sizeof(type) when
 * field is NULL; (size_t)-1 for a name this library does not know. Bindings that declare the
 * structs again (the Python package, through cffi) compare their layout with it when loaded. */
ATTND_CLIENT_API size_t attnd_client_abi_offset(const char *type, const char *field);

#ifdef __cplusplus
}
#endif
#endif
