/* attnd kernel API: every attention op, one C API, two backends ("cpu", "cuda").
 *
 * Tensors are explicit descriptors (pointer, dtype, shape, strides in elements). Pointers are
 * host memory for the cpu backend and device memory for the cuda backend. Every op validates
 * its descriptors first (shared code, identical for both backends) and returns
 * ATTND_ERR_INVALID_ARGUMENT with a message naming the field (attnd_backend_last_error) before
 * touching memory. Semantics follow vLLM's Triton ops (../shared/seeds) with the decisions of
 * DESIGN.md "Semantics": fully masked rows give zeros (and LSE -inf), ALiBi adds
 * slope * (key_pos - query_pos), sliding window w keeps keys p-w+1..p, fp8 is e4m3fn read as
 * x8 * scale and written as x / scale saturating at +-448, a sink is one more logit per q head in
 * the softmax denominator with no value row (the LSE includes it).
 *
 * Head sizes: 32..256, multiples of 8 (80, 96, 112, 192... included). Block sizes 16, 32, 64.
 * The cuda backend launches on its own stream; ops return once launched (attnd_backend_sync waits).
 */
#ifndef ATTND_KERNELS_H
#define ATTND_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/dtype.h"
#include "attnd/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTND_MAX_DIMS 4
#define ATTND_HEAD_SIZE_MIN 32
#define ATTND_HEAD_SIZE_MAX 256

/* A strided view. Unused trailing dims are ignored; data == NULL marks an absent optional. */
typedef struct attnd_tensor {
    void *data;
    attnd_dtype dtype;
    int32_t ndim;
    int64_t shape[ATTND_MAX_DIMS];
    int64_t strides[ATTND_MAX_DIMS]; /* in elements */
} attnd_tensor;

/* Fill t as a contiguous (row-major) tensor of the given shape. */
void attnd_tensor_init(attnd_tensor *t, void *data, attnd_dtype dtype, int32_t ndim,
                       const int64_t *shape);
/* Number of elements (product of the shape), -1 on overflow or a negative dim. */
int64_t attnd_tensor_numel(const attnd_tensor *t);

/* ---------------------------------------------------------------- paged attention
 * Query tokens of all sequences are packed: sequence s owns rows
 * query_start_loc[s] .. query_start_loc[s+1]-1 and has seq_lens[s] tokens in total (its cached
 * context plus its new queries: context_len = seq_len - query_len). Query row i of sequence s is
 * at position context_len + i and sees keys 0..context_len+i (causal), further limited by the
 * sliding window. Key j of sequence s lives in block block_tables[s][j / block_size], row
 * j % block_size. Q head h reads KV head h / (num_q_heads / num_kv_heads). */
typedef struct attnd_paged_params {
    attnd_tensor q;               /* [num_tokens, num_q_heads, head_size]   f32 | f16 | bf16 */
    attnd_tensor k_cache;         /* [num_blocks, block_size, num_kv_heads, head_size] */
    attnd_tensor v_cache;         /* same shape and dtype as k_cache: f32 | f16 | bf16 | fp8 */
    attnd_tensor out;             /* [num_tokens, num_q_heads, head_size]   f32 | f16 | bf16 */
    attnd_tensor out_lse;         /* optional [num_q_heads, num_tokens] f32 (natural log) */
    attnd_tensor block_tables;    /* [num_seqs, max_blocks_per_seq] i32 */
    attnd_tensor seq_lens;        /* [num_seqs] i32 */
    attnd_tensor query_start_loc; /* [num_seqs + 1] i32, non-decreasing, last = num_tokens */
    attnd_tensor alibi_slopes;    /* optional [num_q_heads] f32 */
    /* optional [num_q_heads] f32, finite: head h's softmax denominator gets exp(sinks[h]) (a
     * logit in the scaled, natural-log domain, not softcapped, no value row); the LSE includes
     * it, so a row that sees no key has LSE sinks[h] and a zero output */
    attnd_tensor sinks;
    float scale;            /* softmax scale (usually 1/sqrt(head_size)) */
    float k_scale, v_scale; /* fp8 cache dequantisation scales (ignored otherwise) */
    float softcap;          /* > 0: logits = softcap * tanh(scale * q.k / softcap) */
    int32_t sliding_window; /* 0 = off */
    int32_t max_query_len;  /* host-side upper bounds used to size launches */
    int32_t max_seq_len;
} attnd_paged_params;

/* Bytes of workspace the 3D form needs (segment outputs, maxima and exp-sums, f32). */
size_t attnd_paged_3d_workspace_size(int64_t num_tokens, int64_t num_q_heads, int64_t head_size,
                                     int32_t num_segments);

/* ---------------------------------------------------------------- cache write
 * Row t of key/value goes to slot slot_mapping[t] (block = slot / block_size, row = slot %
 * block_size); negative slots are skipped (padding). fp8 caches store x / k_scale (v_scale). */
typedef struct attnd_cache_write_params {
    attnd_tensor key;     /* [num_tokens, num_kv_heads, head_size] f32 | f16 | bf16 */
    attnd_tensor value;   /* same shape */
    attnd_tensor k_cache; /* [num_blocks, block_size, num_kv_heads, head_size] */
    attnd_tensor v_cache;
    attnd_tensor slot_mapping; /* [num_tokens] i64 (or i32) */
    float k_scale, v_scale;
} attnd_cache_write_params;

/* ---------------------------------------------------------------- merge states
 * out = (p_out * e^p_lse + s_out * e^s_lse) / (e^p_lse + e^s_lse), computed stably. An LSE of
 * +inf reads as -inf (FA2's empty input); both -inf gives zeros and out_lse = -inf. */
typedef struct attnd_merge_params {
    attnd_tensor out;        /* [num_tokens, num_heads, head_size] f32 | f16 | bf16 */
    attnd_tensor out_lse;    /* optional [num_heads, num_tokens] f32 */
    attnd_tensor prefix_out; /* [num_tokens, num_heads, head_size] */
    attnd_tensor prefix_lse; /* [num_heads, num_tokens] f32 */
    attnd_tensor suffix_out;
    attnd_tensor suffix_lse;
} attnd_merge_params;

/* ---------------------------------------------------------------- varlen attention
 * Contiguous packed Q/K/V: sequence b owns q rows cu_seqlens_q[b].. and k/v rows
 * cu_seqlens_k[b].. . Causal masks are bottom-right aligned: query i of a sequence with lengths
 * (Lq, Lk) sees keys j <= i + Lk - Lq. Bias is added to the scaled logits. fp8 inputs
 * (dtype fp8_e4m3) are read as x8 * their scale; P is quantised to fp8 as p / p_scale before the
 * PV product when q is fp8; an fp8 output stores o / out_scale. */
typedef struct attnd_varlen_params {
    attnd_tensor q;            /* [total_q, num_q_heads, head_size]  f16 | bf16 | fp8_e4m3 */
    attnd_tensor k;            /* [total_k, num_kv_heads, head_size] same dtype as q */
    attnd_tensor v;            /* [total_k, num_kv_heads, head_size] same dtype as q */
    attnd_tensor out;          /* [total_q, num_q_heads, head_size]  f32 | f16 | bf16 | fp8 */
    attnd_tensor cu_seqlens_q; /* [batch + 1] i32 */
    attnd_tensor cu_seqlens_k; /* [batch + 1] i32 */
    attnd_tensor bias;         /* optional [batch, num_q_heads, max_seqlen_q, max_seqlen_k] */
    int32_t max_seqlen_q, max_seqlen_k;
    int32_t causal;
    float scale;
    float q_scale, k_scale, v_scale, p_scale; /* fp8 inputs only */
    float out_scale;                          /* fp8 output only */
} attnd_varlen_params;

/* ---------------------------------------------------------------- block-sparse attention
 * Varlen like above, with either q_len == k_len (prefill) or q_len == 1 (decode) per sequence;
 * past = k_len - q_len. Query i (position past + i) of head h may see key block kb (keys
 * kb*block_size ..) iff kb is listed in layout_col[h][crow[h][r] .. crow[h][r+1]-1] for row
 * r = (past + i) / q_block_size; within listed blocks the mask is causal (key <= position).
 * Each layout row lists distinct key blocks in increasing order; decode needs k_len >= 1. */
typedef struct attnd_blocksparse_params {
    attnd_tensor q; /* [total_q, num_q_heads, head_size] f16 | bf16 */
    attnd_tensor k; /* [total_k, num_kv_heads, head_size] */
    attnd_tensor v;
    attnd_tensor out;          /* [total_q, num_q_heads, head_size] */
    attnd_tensor cu_seqlens_q; /* [batch + 1] i32 */
    attnd_tensor cu_seqlens_k; /* [batch + 1] i32 */
    attnd_tensor layout_crow;  /* [num_q_heads, num_row_blocks + 1] i32 */
    attnd_tensor layout_col;   /* [num_q_heads, max_cols] i32 */
    int32_t block_size;        /* key block size (16, 32, 64, 128) */
    int32_t q_block_size;      /* query (row) block size; 0 = block_size */
    int32_t max_seqlen_q, max_seqlen_k;
    float scale;
} attnd_blocksparse_params;

/* ---------------------------------------------------------------- linear (lightning) attention
 * Per head h, decay lambda = exp(-slopes[h]): S_t = lambda S_{t-1} + k_t^T v_t, o_t = q_t S_t.
 * Prefill processes n tokens per (batch, head) starting from kv_state and leaves the final
 * state in kv_state. Decode does one step per batch row against kv_cache[slot_idx[b]]; a slot of
 * -1 is padding: its state is untouched and its output row is zero. */
typedef struct attnd_linear_prefill_params {
    attnd_tensor q;        /* [batch, heads, n, d] f32 | f16 | bf16 */
    attnd_tensor k;        /* [batch, heads, n, d] */
    attnd_tensor v;        /* [batch, heads, n, e] */
    attnd_tensor out;      /* [batch, heads, n, e] */
    attnd_tensor slopes;   /* [heads] f32 */
    attnd_tensor kv_state; /* [batch, heads, d, e] f32, read and updated */
    int32_t block_size;    /* chunk length (seed: 256); 0 = backend default */
} attnd_linear_prefill_params;

typedef struct attnd_linear_decode_params {
    attnd_tensor q;        /* [batch, heads, d] f32 | f16 | bf16 */
    attnd_tensor k;        /* [batch, heads, d] */
    attnd_tensor v;        /* [batch, heads, e] */
    attnd_tensor out;      /* [batch, heads, e] */
    attnd_tensor slopes;   /* [heads] f32 */
    attnd_tensor kv_cache; /* [num_slots, heads, d, e] f32, read and updated */
    attnd_tensor slot_idx; /* [batch] i64 (or i32); -1 = padding */
} attnd_linear_decode_params;

/* ---------------------------------------------------------------- backends */
typedef struct attnd_backend attnd_backend;

typedef struct attnd_backend_opts {
    int32_t num_threads; /* cpu: worker threads (0 = online cores) */
    int32_t device;      /* cuda: device ordinal */
} attnd_backend_opts;

typedef enum attnd_memcpy_kind {
    ATTND_MEMCPY_H2D,
    ATTND_MEMCPY_D2H,
    ATTND_MEMCPY_D2D
} attnd_memcpy_kind;

/* What a backend implements beyond the base ops (attnd_backend_ops.features). An op asked for
 * a feature its backend lacks fails UNSUPPORTED, naming it, before any memory is touched. */
enum {
    ATTND_FEATURE_SINKS = 1u << 0,     /* paged attention: attnd_paged_params.sinks */
    ATTND_FEATURE_F32_CACHE = 1u << 1, /* paged attention and cache write on an f32 cache */
};

/* One table per backend; the public functions below validate, then dispatch through it. */
typedef struct attnd_backend_ops {
    const char *name;
    int is_device; /* tensors live in device memory */
    attnd_err (*open)(attnd_backend *b, const attnd_backend_opts *opts);
    void (*close)(attnd_backend *b);
    attnd_err (*alloc)(attnd_backend *b, size_t bytes, void **ptr);
    void (*free)(attnd_backend *b, void *ptr);
    attnd_err (*memcpy)(attnd_backend *b, void *dst, const void *src, size_t bytes,
                        attnd_memcpy_kind kind);
    attnd_err (*sync)(attnd_backend *b);
    attnd_err (*paged_2d)(attnd_backend *b, const attnd_paged_params *p);
    attnd_err (*paged_3d)(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments,
                          void *workspace);
    attnd_err (*cache_write)(attnd_backend *b, const attnd_cache_write_params *p);
    attnd_err (*merge_states)(attnd_backend *b, const attnd_merge_params *p);
    attnd_err (*varlen)(attnd_backend *b, const attnd_varlen_params *p);
    attnd_err (*blocksparse)(attnd_backend *b, const attnd_blocksparse_params *p);
    attnd_err (*linear_prefill)(attnd_backend *b, const attnd_linear_prefill_params *p);
    attnd_err (*linear_decode)(attnd_backend *b, const attnd_linear_decode_params *p);
    uint32_t features; /* ATTND_FEATURE_* (last: tables that omit it have none) */
} attnd_backend_ops;

/* The backend object; backends keep their own state behind impl. */
struct attnd_backend {
    const attnd_backend_ops *ops;
    void *impl;
    char last_error[256];
};

/* Names the backends compiled in: "cpu" always, "cuda" when built with CUDA. */
int attnd_backend_available(const char *name);
/* Open "cpu" or "cuda" (opts may be NULL). UNSUPPORTED if not compiled in, UNAVAILABLE if no
 * device. */
attnd_err attnd_backend_open(attnd_backend **b, const char *name, const attnd_backend_opts *opts);
void attnd_backend_close(attnd_backend *b);
const char *attnd_backend_name(const attnd_backend *b);
int attnd_backend_is_device(const attnd_backend *b);
/* Whether b implements every ATTND_FEATURE_* bit of `features`. */
int attnd_backend_has(const attnd_backend *b, uint32_t features);
/* Message of the last failed call on this backend (names the field for bad descriptors). */
const char *attnd_backend_last_error(const attnd_backend *b);

attnd_err attnd_backend_alloc(attnd_backend *b, size_t bytes, void **ptr);
void attnd_backend_free(attnd_backend *b, void *ptr);
attnd_err attnd_backend_memcpy(attnd_backend *b, void *dst, const void *src, size_t bytes,
                               attnd_memcpy_kind kind);
/* Wait for all launched work; reports asynchronous kernel failures as INTERNAL. */
attnd_err attnd_backend_sync(attnd_backend *b);

/* ---------------------------------------------------------------- ops */
attnd_err attnd_paged_attention_2d(attnd_backend *b, const attnd_paged_params *p);
/* Split-KV: each sequence's context blocks are cut into num_segments equal runs
 * (cdiv(blocks, num_segments) blocks each), attended in parallel, then merged by LSE.
 * workspace: attnd_paged_3d_workspace_size bytes of backend memory. */
attnd_err attnd_paged_attention_3d(attnd_backend *b, const attnd_paged_params *p,
                                   int32_t num_segments, void *workspace);
attnd_err attnd_cache_write(attnd_backend *b, const attnd_cache_write_params *p);
attnd_err attnd_merge_states(attnd_backend *b, const attnd_merge_params *p);
attnd_err attnd_varlen_attention(attnd_backend *b, const attnd_varlen_params *p);
attnd_err attnd_blocksparse_attention(attnd_backend *b, const attnd_blocksparse_params *p);
attnd_err attnd_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p);
attnd_err attnd_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p);

/* ---------------------------------------------------------------- device (daemon support)
 * The few CUDA runtime calls the daemon needs beyond the ops (device properties and free
 * memory, binding the device to a thread, CUDA IPC, device memset), so that daemon code needs
 * no CUDA headers. On a backend other than "cuda", and in builds without CUDA, every call
 * returns ATTND_ERR_UNSUPPORTED (attnd_device_ipc_close does nothing). */
#define ATTND_IPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */

typedef struct attnd_device_info {
    int32_t device;       /* ordinal */
    int32_t num_sms;      /* streaming multiprocessors */
    uint64_t free_bytes;  /* device memory free now */
    uint64_t total_bytes; /* device memory in all */
    char name[64];        /* e.g. "NVIDIA H100 80GB HBM3" */
} attnd_device_info;

/* Properties and current free memory of the backend's device. */
attnd_err attnd_device_query(attnd_backend *b, attnd_device_info *info);
/* Make the backend's device current on the calling thread (a thread that launches ops on a
 * device other than 0 calls it once). */
attnd_err attnd_device_bind(attnd_backend *b);
/* Set bytes of backend memory to byte value v and wait. */
attnd_err attnd_device_memset(attnd_backend *b, void *ptr, int v, size_t bytes);
/* Open another process's cudaIpcMemHandle_t (ATTND_IPC_HANDLE_BYTES at handle): *ptr is the
 * mapped allocation's base in this process, *bytes the allocation's size, *device the device it
 * lives on. INVALID_ARGUMENT (with last_error naming why) for a handle that does not open. */
attnd_err attnd_device_ipc_open(attnd_backend *b, const void *handle, void **ptr, uint64_t *bytes,
                                int32_t *device);
/* Close what attnd_device_ipc_open mapped (NULL is ignored). */
void attnd_device_ipc_close(attnd_backend *b, void *ptr);

/* Page-locked host memory (what attnd_device_upload copies from without waiting). */
attnd_err attnd_device_host_alloc(attnd_backend *b, size_t bytes, void **ptr);
void attnd_device_host_free(attnd_backend *b, void *ptr);
/* Queue a copy of bytes of page-locked host memory at src (attnd_device_host_alloc) to device
 * memory at dst on the backend's stream, behind the work queued before it, and return at once:
 * src must stay as it is until the copy ran (a fence recorded after it passed). INTERNAL. */
attnd_err attnd_device_upload(attnd_backend *b, void *dst, const void *src, size_t bytes);

/* Fences: mark the work queued on the backend's stream so far, to learn later, without
 * waiting, whether it finished (the daemon replies when a request's kernels are done while it
 * queues the next request's). A fence comes from a pool; release it once done with. */
typedef struct attnd_fence attnd_fence;
/* Record a fence after the work queued so far. INTERNAL (a CUDA error), NO_MEMORY. */
attnd_err attnd_device_fence_record(attnd_backend *b, attnd_fence **fence);
/* OK: the work before it finished; TIMEOUT: not yet; INTERNAL: the work failed (last_error
 * says how). Never waits. */
attnd_err attnd_device_fence_query(attnd_backend *b, attnd_fence *fence);
/* Back to the pool (NULL is ignored). */
void attnd_device_fence_release(attnd_backend *b, attnd_fence *fence);

/* ---------------------------------------------------------------- streams (stream-ordered steps)
 * Streams beside the backend's own, for work that waits on 32-bit flag words another process
 * sets (DESIGN.md "Same-GPU sharing"): wait until a word equals a value, write a value after the
 * work before it, and select a stream so that the ops (kernels, uploads, fences) that follow are
 * queued there. On "cuda" a stream is a CUDA stream and the value ops are the driver's stream
 * memory operations (cuStreamWaitValue32 / cuStreamWriteValue32), which a CUDA graph captures; on
 * "cpu" a stream is a thread running its queue in order (ops launched while it is selected are
 * copied into the queue, waits poll the word), so the protocol runs without a GPU. Flag words live
 * in backend memory or memory mapped from another process (CUDA IPC, POSIX shm), 4-byte aligned.
 * One thread (the daemon's executor) creates, selects, queues on and queries streams. */
typedef struct attnd_stream attnd_stream;

/* A new stream. UNSUPPORTED when the backend has no stream memory operations, NO_MEMORY,
 * INTERNAL. */
attnd_err attnd_stream_create(attnd_backend *b, attnd_stream **s);
/* Destroy s (NULL is ignored). Call it once attnd_stream_query says OK: cuda leaves work still
 * queued to finish on its own; cpu drops it (a wait in progress ends). */
void attnd_stream_destroy(attnd_backend *b, attnd_stream *s);
/* Queue the ops that follow (kernels, attnd_device_upload, fences) on s instead of the backend's
 * own stream; NULL selects the backend's stream again. Never call attnd_backend_sync or
 * attnd_backend_memcpy while a stream is selected (they would wait for it). */
attnd_err attnd_stream_select(attnd_backend *b, attnd_stream *s);
/* Queue on s: wait until the word at flag equals value. */
attnd_err attnd_stream_wait_value(attnd_backend *b, attnd_stream *s, uint32_t *flag,
                                  uint32_t value);
/* Queue on s: write value to the word at flag once the work queued before it is done (its
 * memory writes visible first). */
attnd_err attnd_stream_write_value(attnd_backend *b, attnd_stream *s, uint32_t *flag,
                                   uint32_t value);
/* The same for count consecutive words from flag, as one operation (a step's resets). */
attnd_err attnd_stream_write_values(attnd_backend *b, attnd_stream *s, uint32_t *flag,
                                    uint32_t count, uint32_t value);
/* Queue on s: wait for the work queued on the backend's own stream so far. */
attnd_err attnd_stream_after_backend(attnd_backend *b, attnd_stream *s);
/* Write value to the word at flag from outside every stream, without waiting (cuda: a write on
 * the backend's release stream, which no wait is ever queued on; cpu: a store): what releases a
 * stream waiting on a word whose writer went away. */
attnd_err attnd_stream_release(attnd_backend *b, uint32_t *flag, uint32_t value);
/* OK: everything queued on s so far is done; TIMEOUT: not yet; INTERNAL: it failed
 * (last_error says how). Never waits. */
attnd_err attnd_stream_query(attnd_backend *b, attnd_stream *s);
/* cuda: frees that would wait for the whole device (cudaFree, cudaFreeHost, closing a CUDA IPC
 * mapping), asked for while a stream had work queued (it may wait on a word another process has
 * not written yet), are put off; run them now if no stream has work queued. Returns how many
 * are still put off (0 on cpu, which never defers). Never waits. */
uint32_t attnd_stream_collect(attnd_backend *b);
/* The cudaIpcMemHandle_t (ATTND_IPC_HANDLE_BYTES into handle) of backend memory at ptr (the
 * start of an attnd_backend_alloc allocation), for another process to map. UNSUPPORTED off
 * cuda, INTERNAL. */
attnd_err attnd_device_ipc_export(attnd_backend *b, void *ptr, void *handle);
/* 1 when the backend's device is shared through NVIDIA MPS (this process is an MPS client),
 * 0 when not; UNSUPPORTED off cuda. */
attnd_err attnd_device_mps(attnd_backend *b, int *active);

/* Backend tables (cuda only when compiled with it). */
extern const attnd_backend_ops attnd_cpu_backend_ops;
#ifdef ATTND_HAVE_CUDA
extern const attnd_backend_ops attnd_cuda_backend_ops;
#endif

#ifdef __cplusplus
}
#endif
#endif
