/* Step planner: from the step's sequences (context length, new tokens, block list) build the
 * index arrays paged attention needs (query_start_loc, seq_lens, block tables, slot mapping)
 * and the launch list: consecutive decode-only sequences (one new token) go to the 3D split-KV
 * kernel with a segment count that fills the machine, the others to the 2D kernel.
 *
 * Plan/run split (FlashInfer's scheduler): one code path computes the workspace size and,
 * given the workspace, its contents. The index arrays come first and contiguous
 * (plan->index_bytes) so a device backend uploads them with one copy; the launch list after
 * them is host-only. */
#ifndef ATTND_DAEMON_SCHED_H
#define ATTND_DAEMON_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_sched_seq {
    uint32_t context_len;  /* tokens already in the cache */
    uint32_t new_tokens;   /* >= 1 */
    const int32_t *blocks; /* physical blocks covering context_len + new_tokens */
    uint32_t nblocks;
} attnd_sched_seq;

typedef struct attnd_sched_opts {
    int32_t block_size;
    int32_t num_q_heads, num_kv_heads, head_size;
    int32_t parallel_units; /* cpu: worker threads; cuda: SMs */
    int32_t max_split_rows; /* a 3D launch's rows x segments stay within it (its workspace);
                               0 = unbounded */
} attnd_sched_opts;

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
    int64_t *slot_mapping;    /* [num_tokens] */
    int32_t *block_tables;    /* [num_seqs][table_width], unused entries 0 */
    int32_t *seq_lens;        /* [num_seqs] context + new */
    int32_t *query_start_loc; /* [num_seqs + 1] */
    int32_t *qsl_local;       /* per launch: nseqs + 1 offsets from its first row */
    size_t index_bytes;       /* the arrays above, contiguous from the workspace start */
    int32_t num_launches;
    attnd_launch *launches;
    size_t workspace_3d; /* bytes the largest 3D launch needs (0 if none) */
} attnd_plan;

/* Workspace bytes for this step (0 with INVALID_ARGUMENT-worthy input: check the plan call). */
size_t attnd_sched_workspace_size(const attnd_sched_seq *seqs, int32_t num_seqs,
                                  const attnd_sched_opts *opts);
/* Fill plan (its arrays point into ws, ws_bytes >= attnd_sched_workspace_size). INVALID_ARGUMENT
 * for no sequences, a zero new_tokens, blocks not covering the tokens, sizes over int32,
 * NO_MEMORY when ws is too small. */
attnd_err attnd_sched_plan(attnd_plan *plan, const attnd_sched_seq *seqs, int32_t num_seqs,
                           const attnd_sched_opts *opts, void *ws, size_t ws_bytes);
/* Bytes of the index arrays (plan->index_bytes) of any step with at most num_seqs sequences,
 * num_tokens new tokens and table_width blocks per sequence: what a device slot must hold. */
size_t attnd_sched_index_bound(int32_t num_seqs, int64_t num_tokens, int32_t table_width);
/* The rows x segments bound (opts.max_split_rows) the daemon sizes its one split-KV workspace
 * for, given the parallel units: above anything attnd_sched_segments asks for (a 3D launch has
 * fewer rows than 2 x units, so rows x segments < 4 x units), so it never binds in practice. */
int32_t attnd_sched_split_rows(int32_t units);
/* Segments for a run of decode sequences: about two waves over the parallel units, at least 1,
 * never more than the longest context's blocks (nor 1024). */
int32_t attnd_sched_segments(const attnd_sched_opts *opts, int32_t nseqs, int32_t max_ctx_blocks);

#endif
