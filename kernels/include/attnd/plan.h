/* kernels/plan: plan a paged step once, run it per layer. The one place where a step's
 * sequences become kernel launches: the daemon, the GPU tests and the benches all call it.
 *
 * Plan (host only, no allocation): from the step's sequences (context length, new tokens, block
 * list) build the index arrays paged attention needs (query_start_loc, seq_lens, block tables,
 * slot mapping) and the launch list: consecutive decode-only sequences (one new token) go to the
 * 3D split-KV kernel with a segment count that fills the machine, the others to the 2D kernel.
 * One code path computes the workspace size and, given the caller's workspace, its contents
 * (FlashInfer's scheduler). The index arrays come first and contiguous (plan->index_bytes) so a
 * device backend uploads them with one copy; the launch list after them is host-only.
 *
 * Run: one layer's tensors + the plan -> the cache write of the new K/V rows and every launch's
 * attnd_paged_params (slices of Q, out and LSE; the index arrays where the backend reads them),
 * launched on a backend. Nothing is allocated and nothing waits on the host. */
#ifndef ATTND_PLAN_H
#define ATTND_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"
#include "attnd/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- plan */

typedef struct attnd_plan_seq {
    uint32_t context_len;  /* tokens already in the cache */
    uint32_t new_tokens;   /* >= 1 */
    const int32_t *blocks; /* physical blocks covering context_len + new_tokens */
    uint32_t nblocks;
} attnd_plan_seq;

typedef struct attnd_plan_opts {
    int32_t block_size;
    int32_t num_q_heads, num_kv_heads, head_size;
    int32_t parallel_units;     /* cpu: worker threads; cuda: SMs */
    int32_t max_split_rows;     /* a 3D launch's rows x segments stay within it (its workspace);
                                   0 = unbounded */
    int32_t one_launch;         /* 1: every sequence in one 2D launch (the seed's single-kernel
                                   choice, which benches compare against) */
    int32_t min_segment_tokens; /* a split segment covers at least this many context tokens
                                   (0: no minimum) */
} attnd_plan_opts;

/* Below this many context tokens per segment, a split's partial results and merge cost more than
 * the parallelism gains (H100, bench_paged --sweep: 16 x 1056 at 1 segment 33.8 us, 2: 36.5,
 * 3: 40.4; bench/RESULTS.md) - unless the launch, unsplit, would keep fewer than half the
 * parallel units busy: then segments go down to ATTND_PLAN_IDLE_SEGMENT_TOKENS (4 x 1024 at 8
 * segments of 128 tokens: 16.9 us, at 1: 26.2). */
#define ATTND_PLAN_MIN_SEGMENT_TOKENS 1024
#define ATTND_PLAN_IDLE_SEGMENT_TOKENS 128

typedef enum attnd_launch_kind {
    ATTND_LAUNCH_2D = 0,
    ATTND_LAUNCH_3D = 1,
} attnd_launch_kind;

/* One kernel launch over sequences [seq0, seq0 + nseqs) and query rows [row0, row0 + nrows). */
typedef struct attnd_launch {
    attnd_launch_kind kind;
    int32_t seq0, nseqs;
    int32_t row0, nrows;
    int32_t num_segments; /* 3D only; 1 for 2D */
    int32_t max_query_len, max_seq_len;
    int32_t qsl_off; /* this launch's nseqs + 1 query offsets, rebased to row0, in qsl_local */
} attnd_launch;

typedef struct attnd_plan {
    int32_t num_seqs, num_tokens, block_size;
    int32_t table_width;      /* columns of block_tables: the longest block list */
    int64_t *slot_mapping;    /* [num_tokens]; the workspace's first byte */
    int32_t *block_tables;    /* [num_seqs][table_width], unused entries 0 */
    int32_t *seq_lens;        /* [num_seqs] context + new */
    int32_t *query_start_loc; /* [num_seqs + 1] */
    int32_t *qsl_local;       /* per launch: nseqs + 1 offsets from its first row */
    size_t index_bytes;       /* the arrays above, contiguous from the workspace start */
    int32_t num_launches;
    attnd_launch *launches;
    size_t workspace_3d; /* bytes the largest 3D launch needs (0 if none) */
} attnd_plan;

/* The options the daemon plans with for this geometry on a backend with `units` parallel units
 * (max_split_rows = attnd_plan_split_rows(units)): what a replay of its steps must use. */
attnd_plan_opts attnd_plan_opts_for(int32_t block_size, int32_t num_q_heads, int32_t num_kv_heads,
                                    int32_t head_size, int32_t units);
/* Workspace bytes for this step (0 with INVALID_ARGUMENT-worthy input: check the build call). */
size_t attnd_plan_workspace_size(const attnd_plan_seq *seqs, int32_t num_seqs,
                                 const attnd_plan_opts *opts);
/* Fill plan (its arrays point into ws, ws_bytes >= attnd_plan_workspace_size). INVALID_ARGUMENT
 * for no sequences, a zero new_tokens, blocks not covering the tokens, sizes over int32,
 * NO_MEMORY when ws is too small. */
attnd_err attnd_plan_build(attnd_plan *plan, const attnd_plan_seq *seqs, int32_t num_seqs,
                           const attnd_plan_opts *opts, void *ws, size_t ws_bytes);
/* Bytes of the index arrays (plan->index_bytes) of any step with at most num_seqs sequences,
 * num_tokens new tokens and table_width blocks per sequence: what a device slot must hold. */
size_t attnd_plan_index_bound(int32_t num_seqs, int64_t num_tokens, int32_t table_width);
/* The rows x segments bound (opts.max_split_rows) the daemon sizes its one split-KV workspace
 * for, given the parallel units: above anything attnd_plan_segments asks for (a 3D launch has
 * fewer rows than 2 x units, so rows x segments < 4 x units), so it never binds in practice. */
int32_t attnd_plan_split_rows(int32_t units);
/* Segments for a run of decode sequences: as many as fit in two waves over the parallel units
 * (whole waves: a partial one adds the merge without filling the units), at least 1, never more
 * than the longest context's blocks (nor min_segment_tokens per segment, nor 1024). */
int32_t attnd_plan_segments(const attnd_plan_opts *opts, int32_t nseqs, int32_t max_ctx_blocks);

/* ---------------------------------------------------------------- run */

/* One layer of a planned step: its tensors and its options (a model's layers may differ in every
 * option; the plan, made once per step, serves them all). */
typedef struct attnd_plan_layer {
    attnd_tensor q, k_new, v_new; /* [num_tokens, heads, head_size] */
    attnd_tensor out;             /* [num_tokens, num_q_heads, head_size] */
    attnd_tensor lse;             /* [num_q_heads, num_tokens] f32; data NULL = none */
    attnd_tensor k_cache, v_cache;
    attnd_tensor alibi_slopes; /* [num_q_heads] f32; data NULL = none */
    attnd_tensor sinks;        /* [num_q_heads] f32 sink logits; data NULL = none */
    float scale;               /* softmax scale */
    float k_scale, v_scale;    /* fp8 cache scales (1 otherwise) */
    float softcap;             /* 0 = off */
    int32_t sliding_window;    /* 0 = off */
} attnd_plan_layer;

/* `index` below is where the backend reads the plan's index arrays: plan->slot_mapping itself
 * on a host backend, a device copy of its plan->index_bytes otherwise. */

/* The cache write of the layer's new K/V rows by the plan's slot mapping. */
void attnd_plan_cache_write_params(const attnd_plan *plan, const void *index,
                                   const attnd_plan_layer *layer, attnd_cache_write_params *p);
/* The paged-attention params of launch i: its slices of q, out and lse, its block tables, seq
 * lens and rebased query offsets, the layer's options. */
void attnd_plan_paged_params(const attnd_plan *plan, const void *index, int32_t i,
                             const attnd_plan_layer *layer, attnd_paged_params *p);
/* Write the layer's new K/V rows into its cache. */
attnd_err attnd_plan_write_kv(attnd_backend *be, const attnd_plan *plan, const void *index,
                              const attnd_plan_layer *layer);
/* Launch i on be: the 2D kernel, or the 3D one with its segments over ws3d (at least
 * plan->workspace_3d bytes of backend memory; NULL when the plan has no 3D launch). */
attnd_err attnd_plan_launch(attnd_backend *be, const attnd_plan *plan, const void *index, int32_t i,
                            const attnd_plan_layer *layer, void *ws3d);
/* The whole layer: the cache write, then every launch in order. */
attnd_err attnd_plan_run_layer(attnd_backend *be, const attnd_plan *plan, const void *index,
                               const attnd_plan_layer *layer, void *ws3d);

#ifdef __cplusplus
}
#endif
#endif
