/* The CPU backend: host memory, a thread pool, and the ops table. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static attnd_err cpu_open(attnd_backend *b, const attnd_backend_opts *opts)
{
    attnd_cpu *cpu = calloc(1, sizeof *cpu);
    attnd_err rv;
    if (cpu == NULL) return ATTND_ERR_NO_MEMORY;
    if ((rv = attnd_pool_alloc(&cpu->pool, opts->num_threads)) != ATTND_ERR_OK) {
        free(cpu);
        return rv;
    }
    pthread_mutex_init(&cpu->run_mu, NULL);
    b->impl = cpu;
    return ATTND_ERR_OK;
}

static void cpu_close(attnd_backend *b)
{
    attnd_cpu *cpu = b->impl;
    attnd_pool_free(cpu->pool);
    pthread_mutex_destroy(&cpu->run_mu);
    free(cpu);
}

static attnd_err cpu_alloc(attnd_backend *b, size_t bytes, void **ptr)
{
    (void)b;
    /* 64-byte alignment, like device allocations, so vector code may assume it. */
    *ptr = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    return *ptr ? ATTND_ERR_OK : ATTND_ERR_NO_MEMORY;
}

static void cpu_free(attnd_backend *b, void *ptr)
{
    (void)b;
    free(ptr);
}

static attnd_err cpu_memcpy(attnd_backend *b, void *dst, const void *src, size_t bytes,
                            attnd_memcpy_kind kind)
{
    (void)b;
    (void)kind;
    memmove(dst, src, bytes);
    return ATTND_ERR_OK;
}

static attnd_err cpu_sync(attnd_backend *b)
{
    (void)b;
    return ATTND_ERR_OK;
}

const attnd_backend_ops attnd_cpu_backend_ops = {
    .name = "cpu",
    .is_device = 0,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy = cpu_memcpy,
    .sync = cpu_sync,
    .paged_2d = attnd_cpu_run_paged_2d,
    .paged_3d = attnd_cpu_run_paged_3d,
    .cache_write = attnd_cpu_run_cache_write,
    .merge_states = attnd_cpu_run_merge_states,
    .varlen = attnd_cpu_run_varlen,
    .blocksparse = attnd_cpu_run_blocksparse,
    .linear_prefill = attnd_cpu_run_linear_prefill,
    .linear_decode = attnd_cpu_run_linear_decode,
    .features = ATTND_FEATURE_SINKS | ATTND_FEATURE_F32_CACHE,
};
