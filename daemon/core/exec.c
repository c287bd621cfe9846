#include "exec.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"

typedef struct exec_item {
    attnd_exec_fn fn;
    void *arg;
    uint64_t value;
    struct exec_item *next; /* control lane only */
} exec_item;

struct attnd_exec {
    attnd_backend *backend;
    attnd_log *log;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stopping;
    exec_item *ring; /* requests: [depth] */
    uint32_t depth, head, count;
    exec_item *ctl_head, *ctl_tail; /* control events */
    atomic_uint queued;  /* requests + control events: the polling thread looks without the lock */
    atomic_int stop_now; /* stopping, readable without the lock */
    attnd_exec_poller poller;
    uint32_t spin_us;
};

/* "auto": cuda when compiled in and a device opens, else cpu; the log says which and why. */
static attnd_err exec_open_backend(attnd_exec *ex, const char *name, const attnd_backend_opts *opts)
{
    attnd_err rv;
    const char *why = "requested";
    if (strcmp(name, "auto") != 0) {
        rv = attnd_backend_open(&ex->backend, name, opts);
    } else if (!attnd_backend_available("cuda")) {
        why = "auto: built without CUDA";
        rv = attnd_backend_open(&ex->backend, "cpu", opts);
    } else if ((rv = attnd_backend_open(&ex->backend, "cuda", opts)) == ATTND_ERR_OK) {
        why = "auto: a CUDA device opened";
    } else {
        why = rv == ATTND_ERR_UNAVAILABLE ? "auto: no CUDA device" : "auto: the CUDA device failed";
        rv = attnd_backend_open(&ex->backend, "cpu", opts);
    }
    if (rv == ATTND_ERR_OK)
        ATTND_LOG(ex->log, ATTND_LOG_INFO,
                  "event=backend selected=%s config=%s reason=\"%s\" device=%d",
                  attnd_backend_name(ex->backend), name, why, opts ? opts->device : 0);
    return rv;
}

attnd_err attnd_exec_alloc(attnd_exec **out, const char *backend, const attnd_backend_opts *opts,
                           uint32_t depth, attnd_log *lg)
{
    attnd_err rv;
    *out = NULL;
    attnd_exec *ex = calloc(1, sizeof *ex);
    if (ex == NULL) return ATTND_ERR_NO_MEMORY;
    ex->log = lg;
    ex->depth = depth;
    ex->ring = calloc(ex->depth, sizeof *ex->ring);
    if (ex->ring == NULL) {
        rv = ATTND_ERR_NO_MEMORY;
        goto fail;
    }
    if ((rv = exec_open_backend(ex, backend, opts)) != ATTND_ERR_OK) goto fail;
    pthread_mutex_init(&ex->mu, NULL);
    pthread_cond_init(&ex->cv, NULL);
    *out = ex;
    return ATTND_ERR_OK;
fail:
    free(ex->ring);
    free(ex);
    return rv;
}

/* Pop the next item, control lane first (caller holds mu); 0 when both lanes are empty. */
static int exec_pop(attnd_exec *ex, exec_item *it)
{
    if (ex->ctl_head) {
        exec_item *c = ex->ctl_head;
        ex->ctl_head = c->next;
        if (ex->ctl_head == NULL) ex->ctl_tail = NULL;
        *it = *c;
        free(c);
    } else if (ex->count) {
        *it = ex->ring[ex->head];
        ex->head = (ex->head + 1) % ex->depth;
        ex->count--;
    } else {
        return 0;
    }
    atomic_fetch_sub_explicit(&ex->queued, 1, memory_order_relaxed);
    return 1;
}

/* Sleep until an item is queued or the executor stops. */
static void exec_sleep(attnd_exec *ex)
{
    pthread_mutex_lock(&ex->mu);
    while (!ex->stopping && ex->count == 0 && ex->ctl_head == NULL)
        pthread_cond_wait(&ex->cv, &ex->mu);
    pthread_mutex_unlock(&ex->mu);
}

/* Next item if one is queued, without waiting (the lock only when the counter says so). */
static int exec_try_take(attnd_exec *ex, exec_item *it)
{
    if (atomic_load_explicit(&ex->queued, memory_order_acquire) == 0) return 0;
    pthread_mutex_lock(&ex->mu);
    int got = exec_pop(ex, it);
    pthread_mutex_unlock(&ex->mu);
    return got;
}

/* Next item, waiting for one; 0 when stopping and both lanes are empty (one consumer). */
static int exec_take(attnd_exec *ex, exec_item *it)
{
    exec_sleep(ex);
    return exec_try_take(ex, it);
}

/* One turn: a queued item, then the poller. Returns work done; *inflight as the poller says. */
static uint32_t exec_turn(attnd_exec *ex, int *inflight)
{
    exec_item it;
    uint32_t done = 0;
    *inflight = 0;
    if (exec_try_take(ex, &it)) {
        it.fn(it.arg, it.value);
        done = 1;
    }
    if (ex->poller.poll) done += ex->poller.poll(ex->poller.arg, inflight);
    return done;
}

/* Run queued items and poll; spin (yielding the core to anyone runnable) while work is in
 * flight or was seen in the last spin_us, then sleep until an item is queued. */
static void exec_loop(attnd_exec *ex)
{
    uint64_t last = attnd_clock_ns();
    for (;;) {
        int inflight;
        uint32_t done = exec_turn(ex, &inflight);
        /* stopping: leave once nothing is queued or in flight, whatever clients still post */
        if (!inflight && atomic_load(&ex->stop_now) && atomic_load(&ex->queued) == 0) return;
        if (done) {
            last = attnd_clock_ns();
            continue;
        }
        if (inflight || attnd_clock_ns() - last < (uint64_t)ex->spin_us * 1000u) {
            sched_yield();
            continue;
        }
        if (ex->poller.idle && ex->poller.idle(ex->poller.arg, 0)) continue;
        exec_sleep(ex);
        if (ex->poller.idle) ex->poller.idle(ex->poller.arg, 1);
        last = attnd_clock_ns();
    }
}

static void *exec_main(void *arg)
{
    attnd_exec *ex = arg;
    ATTND_LOG(ex->log, ATTND_LOG_DEBUG, "event=executor_start backend=%s spin_us=%u",
              attnd_backend_name(ex->backend), ex->spin_us);
    /* this thread launches every kernel: make the backend's device current here */
    if (attnd_backend_is_device(ex->backend) && attnd_device_bind(ex->backend) != ATTND_ERR_OK)
        ATTND_LOG(ex->log, ATTND_LOG_ERROR, "event=executor_bind_failed err=\"%s\"",
                  attnd_backend_last_error(ex->backend));
    exec_loop(ex);
    return NULL;
}

void attnd_exec_set_poller(attnd_exec *ex, const attnd_exec_poller *p, uint32_t spin_us)
{
    ex->poller = *p;
    ex->spin_us = spin_us;
}

attnd_err attnd_exec_start(attnd_exec *ex)
{
    if (pthread_create(&ex->thread, NULL, exec_main, ex) != 0) return ATTND_ERR_NO_MEMORY;
    ex->started = 1;
    return ATTND_ERR_OK;
}

attnd_err attnd_exec_submit(attnd_exec *ex, attnd_exec_fn fn, void *arg)
{
    attnd_err rv = ATTND_ERR_UNAVAILABLE;
    pthread_mutex_lock(&ex->mu);
    if (!ex->stopping && ex->count < ex->depth) {
        exec_item *it = &ex->ring[(ex->head + ex->count) % ex->depth];
        it->fn = fn;
        it->arg = arg;
        it->value = 0;
        ex->count++;
        atomic_fetch_add_explicit(&ex->queued, 1, memory_order_release);
        rv = ATTND_ERR_OK;
        pthread_cond_signal(&ex->cv);
    }
    pthread_mutex_unlock(&ex->mu);
    return rv;
}

attnd_err attnd_exec_post(attnd_exec *ex, attnd_exec_fn fn, void *arg, uint64_t value)
{
    exec_item *it = calloc(1, sizeof *it);
    if (it == NULL) return ATTND_ERR_NO_MEMORY;
    it->fn = fn;
    it->arg = arg;
    it->value = value;
    pthread_mutex_lock(&ex->mu);
    if (ex->stopping) {
        pthread_mutex_unlock(&ex->mu);
        free(it);
        return ATTND_ERR_UNAVAILABLE;
    }
    if (ex->ctl_tail)
        ex->ctl_tail->next = it;
    else
        ex->ctl_head = it;
    ex->ctl_tail = it;
    atomic_fetch_add_explicit(&ex->queued, 1, memory_order_release);
    pthread_cond_signal(&ex->cv);
    pthread_mutex_unlock(&ex->mu);
    return ATTND_ERR_OK;
}

void attnd_exec_stop(attnd_exec *ex)
{
    pthread_mutex_lock(&ex->mu);
    ex->stopping = 1;
    atomic_store(&ex->stop_now, 1);
    pthread_cond_broadcast(&ex->cv);
    pthread_mutex_unlock(&ex->mu);
    if (ex->started) pthread_join(ex->thread, NULL);
    ex->started = 0;
    /* without a thread (never started) queued control events still own their memory: run them,
     * and let the poller finish what is in flight */
    exec_item it;
    while (exec_take(ex, &it))
        it.fn(it.arg, it.value);
    int inflight = 1;
    while (ex->poller.poll && inflight)
        ex->poller.poll(ex->poller.arg, &inflight);
    /* stopped for good: what the poller polls may be freed next (stop is called again by free) */
    memset(&ex->poller, 0, sizeof ex->poller);
}

void attnd_exec_free(attnd_exec *ex)
{
    if (ex == NULL) return;
    attnd_exec_stop(ex);
    attnd_backend_close(ex->backend);
    pthread_cond_destroy(&ex->cv);
    pthread_mutex_destroy(&ex->mu);
    free(ex->ring);
    free(ex);
}

attnd_backend *attnd_exec_backend(attnd_exec *ex)
{
    return ex->backend;
}

uint32_t attnd_exec_pending(attnd_exec *ex)
{
    pthread_mutex_lock(&ex->mu);
    uint32_t n = ex->count;
    pthread_mutex_unlock(&ex->mu);
    return n;
}
