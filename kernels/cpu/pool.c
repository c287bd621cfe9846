#include "pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct attnd_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_t *threads;
    int32_t num_threads;
    int stopping;
    uint64_t generation; /* bumped per job so workers join each job once */
    attnd_pool_fn fn;
    void *arg;
    int64_t n, next, done;
};

/* Claim and run items until none are left; returns with the lock held. */
static void pool_drain(attnd_pool *p)
{
    while (p->next < p->n) {
        int64_t i = p->next++;
        pthread_mutex_unlock(&p->mu);
        p->fn(p->arg, i);
        pthread_mutex_lock(&p->mu);
        if (++p->done == p->n) pthread_cond_broadcast(&p->done_cv);
    }
}

static void *pool_worker(void *arg)
{
    attnd_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stopping && p->generation == seen)
            pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stopping) break;
        seen = p->generation;
        pool_drain(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

attnd_err attnd_pool_alloc(attnd_pool **out, int32_t num_threads)
{
    attnd_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return ATTND_ERR_NO_MEMORY;
    if (num_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        num_threads = n > 0 ? (int32_t)n : 1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    /* The caller works too, so n threads of parallelism need n - 1 workers. */
    p->threads = calloc((size_t)num_threads, sizeof *p->threads);
    if (p->threads == NULL) {
        attnd_pool_free(p);
        return ATTND_ERR_NO_MEMORY;
    }
    for (int32_t i = 0; i < num_threads - 1; i++) {
        if (pthread_create(&p->threads[i], NULL, pool_worker, p) != 0) break;
        p->num_threads++;
    }
    *out = p;
    return ATTND_ERR_OK;
}

void attnd_pool_free(attnd_pool *p)
{
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void attnd_pool_run(attnd_pool *p, int64_t n, attnd_pool_fn fn, void *arg)
{
    if (n <= 0) return;
    if (n == 1 || p->num_threads == 0) {
        for (int64_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->next = 0;
    p->done = 0;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pool_drain(p);
    while (p->done < p->n) pthread_cond_wait(&p->done_cv, &p->mu);
    p->n = 0; /* late workers see nothing left to claim */
    pthread_mutex_unlock(&p->mu);
}
