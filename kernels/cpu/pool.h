/* A small fixed pool of worker threads running parallel-for jobs over [0, n). */
#ifndef ATTND_CPU_POOL_H
#define ATTND_CPU_POOL_H

#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_pool attnd_pool;

/* fn(arg, i) is called once for each i in [0, n), from any worker or the caller. */
typedef void (*attnd_pool_fn)(void *arg, int64_t i);

attnd_err attnd_pool_alloc(attnd_pool **pool, int32_t num_threads);
void attnd_pool_free(attnd_pool *pool);
/* Run fn over [0, n) and return when every item is done. Not reentrant: one job at a time. */
void attnd_pool_run(attnd_pool *pool, int64_t n, attnd_pool_fn fn, void *arg);

#endif
