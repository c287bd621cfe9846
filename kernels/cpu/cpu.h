/* CPU backend internals: the backend state and one entry per op (each in its own file). */
#ifndef ATTND_CPU_CPU_H
#define ATTND_CPU_CPU_H

#include "attnd/kernels.h"
#include "pool.h"

typedef struct attnd_cpu {
    attnd_pool *pool;
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

#endif
