/* In-flight replies: requests whose kernels were queued on the device and whose reply waits
 * only for them (reply->wait.fence). The executor queues the next request's kernels meanwhile;
 * replies complete in the order they were queued (one stream), so a ring suffices. Executor
 * thread only. */
#ifndef ATTND_SERVE_INFLIGHT_H
#define ATTND_SERVE_INFLIGHT_H

#include <stdint.h>

#include "../obs/metrics.h"
#include "../state/devmem.h"
#include "reply.h"

/* Called when a waiting reply is ready; r is the one handed to attnd_inflight_defer. */
typedef void (*attnd_inflight_done_fn)(void *arg, attnd_reply *r);

typedef struct attnd_inflight_item attnd_inflight_item;

typedef struct attnd_inflight {
    attnd_devmem *dm;       /* the device (a failed fence marks it failed) */
    attnd_metrics *metrics; /* kernel time of completed replies; NULL = not counted */
    attnd_inflight_item *items;
    uint32_t head, count, cap;
    uint64_t done_ns; /* when the last one completed (kernel time is not counted twice) */
} attnd_inflight;

void attnd_inflight_init(attnd_inflight *q, attnd_devmem *dm);
/* Complete everything still waiting (drain), then free the ring. */
void attnd_inflight_fini(attnd_inflight *q);
/* Hand over r (r->wait.fence set): done(arg, r) runs from a later attnd_inflight_poll, with
 * r->reply an INTERNAL error naming r->wait.what if the kernels failed. Never fails: without
 * memory for the queue it waits for the device and calls done at once. */
void attnd_inflight_defer(attnd_inflight *q, attnd_reply *r, attnd_inflight_done_fn done,
                          void *arg);
/* Complete the replies whose kernels finished, oldest first; returns how many. */
uint32_t attnd_inflight_poll(attnd_inflight *q);
/* Replies not completed yet. */
uint32_t attnd_inflight_count(const attnd_inflight *q);
/* Wait for every waiting reply's kernels and complete them (before memory they use goes). */
void attnd_inflight_drain(attnd_inflight *q);

#endif
