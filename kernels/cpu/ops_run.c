/* The CPU ops table's entries: every op goes through attnd_cpu_run, which runs it at once under
 * the run lock or queues it on the selected stream (stream.c). */
#include "cpu.h"

#define CPU_RUN_OP(name, ptype)                                                                    \
    static attnd_err call_##name(attnd_backend *b, const void *p, int32_t n, void *ws)             \
    {                                                                                              \
        (void)n;                                                                                   \
        (void)ws;                                                                                  \
        return attnd_cpu_##name(b, (const ptype *)p);                                              \
    }                                                                                              \
    attnd_err attnd_cpu_run_##name(attnd_backend *b, const ptype *p)                               \
    {                                                                                              \
        return attnd_cpu_run(b, call_##name, p, sizeof *p, 0, NULL);                               \
    }

CPU_RUN_OP(paged_2d, attnd_paged_params)
CPU_RUN_OP(cache_write, attnd_cache_write_params)
CPU_RUN_OP(merge_states, attnd_merge_params)
CPU_RUN_OP(varlen, attnd_varlen_params)
CPU_RUN_OP(blocksparse, attnd_blocksparse_params)
CPU_RUN_OP(linear_prefill, attnd_linear_prefill_params)
CPU_RUN_OP(linear_decode, attnd_linear_decode_params)

static attnd_err call_paged_3d(attnd_backend *b, const void *p, int32_t n, void *ws)
{
    return attnd_cpu_paged_3d(b, (const attnd_paged_params *)p, n, ws);
}

attnd_err attnd_cpu_run_paged_3d(attnd_backend *b, const attnd_paged_params *p,
                                 int32_t num_segments, void *workspace)
{
    return attnd_cpu_run(b, call_paged_3d, p, sizeof *p, num_segments, workspace);
}
