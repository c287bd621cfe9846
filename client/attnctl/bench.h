/* attnctl bench internals: options, one client's run and its latencies, the report. */
#ifndef ATTND_ATTNCTL_BENCH_H
#define ATTND_ATTNCTL_BENCH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "attnctl.h"

enum { KIND_BEGIN, KIND_ATTEND, KIND_END, NUM_KINDS };

typedef struct bench_opts {
    uint32_t seqs, context, steps, layers, clients, warmup;
    int have_dtype, have_layers, use_inline, abort, json, progress;
    attnd_dtype dtype;
} bench_opts;

/* Latencies of one kind of request, in seconds. */
typedef struct bench_lat {
    double *v;
    size_t n, cap;
} bench_lat;

typedef struct bench_progress bench_progress;

typedef struct bench_worker {
    const attnctl *ctl;
    const char *url;
    const bench_opts *o;
    uint32_t index;
    pthread_barrier_t *barrier;
    bench_progress *progress;
    attnd_client *c;
    attnd_geometry g;
    attnd_limits limits;
    attnd_dtype dtype;
    uint32_t layers;
    attnd_shm shm;
    attnd_ref q, k, v, out;
    bench_lat lat[NUM_KINDS];
    double t0, t1;
    int rc;
    pthread_t thread;
} bench_worker;

/* Room for cap latencies; 0 on success, -1 when out of memory. */
int attnctl_lat_init(bench_lat *l, size_t cap);
void attnctl_lat_add(bench_lat *l, double s);
/* Print the result of o.clients workers: a table, or with o->json one JSON object on stdout.
 * ATTNCTL_FAILED (printed) when out of memory. */
int attnctl_bench_report(const bench_opts *o, const bench_worker *ws);

#endif
