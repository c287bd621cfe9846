/* Executor: one thread per backend that owns it (the CUDA context and stream) and runs every
 * piece of work that touches daemon state: requests, in a bounded queue (full -> the caller
 * replies UNAVAILABLE), and control events (connection dropped, housekeeping, live config), in
 * an unbounded lane that is served first. State touched only here needs no locks.
 *
 * Between items the thread calls its poller (replies whose kernels finished, requests posted
 * in shared-memory channels). It keeps polling while the poller has work in flight and for
 * spin_us after the last work it saw, then sleeps until the next queued item: a busy daemon
 * answers without thread wake-ups, an idle one costs no CPU. */
#ifndef ATTND_CORE_EXEC_H
#define ATTND_CORE_EXEC_H

#include <stdint.h>

#include "attnd/kernels.h"
#include "log.h"

typedef void (*attnd_exec_fn)(void *arg, uint64_t value);

typedef struct attnd_exec attnd_exec;

/* Work the executor polls for besides its queue (executor thread). */
typedef struct attnd_exec_poller {
    void *arg;
    /* Do what is ready; return how many things were done, set *inflight when work is still
     * pending (device kernels running): the executor then keeps polling. */
    uint32_t (*poll)(void *arg, int *inflight);
    /* The executor is about to sleep (awake 0) or woke up (awake 1). Returns 1 when, going to
     * sleep, work showed up meanwhile: it polls again instead. */
    int (*idle)(void *arg, int awake);
} attnd_exec_poller;

/* Open the backend named "cpu", "cuda" or "auto" (cuda when compiled in and a device opens,
 * else cpu) and size the queue for depth (>= 1) requests. UNSUPPORTED / UNAVAILABLE from
 * attnd_backend_open. */
attnd_err attnd_exec_alloc(attnd_exec **ex, const char *backend, const attnd_backend_opts *opts,
                           uint32_t depth, attnd_log *lg);
/* Set the poller and the idle spin window (before start). */
void attnd_exec_set_poller(attnd_exec *ex, const attnd_exec_poller *p, uint32_t spin_us);
/* Start the thread. */
attnd_err attnd_exec_start(attnd_exec *ex);
/* Queue a request. UNAVAILABLE when the queue is full or the executor is stopping. */
attnd_err attnd_exec_submit(attnd_exec *ex, attnd_exec_fn fn, void *arg);
/* Queue a control event (never refused for depth). UNAVAILABLE once stopping, NO_MEMORY. */
attnd_err attnd_exec_post(attnd_exec *ex, attnd_exec_fn fn, void *arg, uint64_t value);
/* Refuse new work, run everything queued, join the thread. Idempotent. */
void attnd_exec_stop(attnd_exec *ex);
/* After stop: close the backend and free. */
void attnd_exec_free(attnd_exec *ex);
attnd_backend *attnd_exec_backend(attnd_exec *ex);
/* Requests queued and not yet started. */
uint32_t attnd_exec_pending(attnd_exec *ex);

#endif
