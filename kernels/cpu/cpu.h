/* CPU backend internals: the backend state and one entry per op (each in its own file). */
#ifndef ATTND_CPU_CPU_H
#define ATTND_CPU_CPU_H

#include <pthread.h>

#include "attnd/kernels.h"
#include "pool.h"

typedef struct attnd_cpu {
    attnd_pool *pool;
    pthread_mutex_t run_mu; /* held while an op runs: the pool runs one job at a time */
    attnd_stream *cur;      /* the selected stream (stream.c), NULL = run ops at once */
} attnd_cpu;

static inline attnd_pool *attnd_cpu_pool(attnd_backend *b)
{
    return ((attnd_cpu *)b->impl)->pool;
}

attnd_err attnd_cpu_paged_2d(attnd_backend *b, const attnd_paged_params *p);
attnd_err attnd_cpu_paged_3d(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments,
                             void *workspace);
attnd_err attnd_cpu_cache_write(attnd_backend *b, const attnd_cache_write_params *p);
attnd_err attnd_cpu_merge_states(attnd_backend *b, const attnd_merge_params *p);
attnd_err attnd_cpu_varlen(attnd_backend *b, const attnd_varlen_params *p);
attnd_err attnd_cpu_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p);
attnd_err attnd_cpu_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p);
attnd_err attnd_cpu_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p);

/* ---------------------------------------------------------------- streams (stream.c) */

/* An op with its params, run now or from a stream's queue (n, ws: paged_3d's extra args). */
typedef attnd_err (*attnd_cpu_call)(attnd_backend *b, const void *params, int32_t n, void *ws);
/* Run fn under the run lock now, or, while a stream is selected, queue a copy of params there. */
attnd_err attnd_cpu_run(attnd_backend *b, attnd_cpu_call fn, const void *params, size_t size,
                        int32_t n, void *ws);
attnd_err attnd_cpu_stream_create(attnd_backend *b, attnd_stream **s);
void attnd_cpu_stream_destroy(attnd_backend *b, attnd_stream *s);
attnd_err attnd_cpu_stream_select(attnd_backend *b, attnd_stream *s);
/* Queue a wait for (write 0) or a write of (write 1) value at flag. */
/* Queue a wait for flag == value (count 1), or a write of value to count words from flag. */
attnd_err attnd_cpu_stream_value(attnd_stream *s, int write, uint32_t *flag, uint32_t count,
                                 uint32_t value);
attnd_err attnd_cpu_stream_query(attnd_backend *b, attnd_stream *s);

/* The ops table's entries: each runs its attnd_cpu_* op through attnd_cpu_run (ops_run.c). */
attnd_err attnd_cpu_run_paged_2d(attnd_backend *b, const attnd_paged_params *p);
attnd_err attnd_cpu_run_paged_3d(attnd_backend *b, const attnd_paged_params *p,
                                 int32_t num_segments, void *workspace);
attnd_err attnd_cpu_run_cache_write(attnd_backend *b, const attnd_cache_write_params *p);
attnd_err attnd_cpu_run_merge_states(attnd_backend *b, const attnd_merge_params *p);
attnd_err attnd_cpu_run_varlen(attnd_backend *b, const attnd_varlen_params *p);
attnd_err attnd_cpu_run_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p);
attnd_err attnd_cpu_run_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p);
attnd_err attnd_cpu_run_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p);

#endif
