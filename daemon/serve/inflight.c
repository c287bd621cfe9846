#include "inflight.h"

#include <stdlib.h>

#include "attnd/clock.h"

struct attnd_inflight_item {
    attnd_reply *r;
    attnd_inflight_done_fn done;
    void *arg;
};

void attnd_inflight_init(attnd_inflight *q, attnd_devmem *dm)
{
    *q = (attnd_inflight){.dm = dm};
}

void attnd_inflight_fini(attnd_inflight *q)
{
    attnd_inflight_drain(q);
    free(q->items);
    q->items = NULL;
    q->cap = 0;
}

static int inflight_grow(attnd_inflight *q)
{
    uint32_t cap = q->cap ? q->cap * 2 : 64;
    attnd_inflight_item *n = malloc((size_t)cap * sizeof *n);
    if (n == NULL) return 0;
    for (uint32_t i = 0; i < q->count; i++)
        n[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = n;
    q->cap = cap;
    q->head = 0;
    return 1;
}

/* Kernel time of a finished request: from its last launch or the previous completion,
 * whichever is later, to now (overlapping requests are not counted twice). */
static void inflight_charge(attnd_inflight *q, const attnd_reply *r)
{
    uint64_t now = attnd_clock_ns();
    uint64_t from = r->wait.t_ns > q->done_ns ? r->wait.t_ns : q->done_ns;
    if (q->metrics && now > from)
        attnd_metrics_kernel(q->metrics, (attnd_metrics_kernel_kind)r->wait.kind, now - from, 0);
    q->done_ns = now;
}

/* r's fence passed (rv OK) or failed: release it, note a failure, hand the reply back. */
static void inflight_complete(attnd_inflight *q, attnd_reply *r, attnd_err rv,
                              attnd_inflight_done_fn done, void *arg)
{
    attnd_device_fence_release(q->dm->be, r->wait.fence);
    r->wait.fence = NULL;
    if (rv != ATTND_ERR_OK) {
        attnd_devmem_kernel_err(q->dm, rv, r->wait.what ? r->wait.what : "kernels", r->msg,
                                sizeof r->msg);
        attnd_reply_code(r, rv);
        r->reply.outputs = NULL; /* an error reply carries no body */
        r->reply.body_case = ATTND__REPLY__BODY__NOT_SET;
    } else {
        inflight_charge(q, r);
    }
    done(arg, r);
}

void attnd_inflight_defer(attnd_inflight *q, attnd_reply *r, attnd_inflight_done_fn done, void *arg)
{
    if (q->count == q->cap && !inflight_grow(q)) {
        attnd_err rv = attnd_backend_sync(q->dm->be); /* no room to wait: wait here */
        inflight_complete(q, r, rv, done, arg);
        return;
    }
    attnd_inflight_item *it = &q->items[(q->head + q->count) % q->cap];
    it->r = r;
    it->done = done;
    it->arg = arg;
    q->count++;
}

uint32_t attnd_inflight_poll(attnd_inflight *q)
{
    uint32_t n = 0;
    while (q->count) {
        attnd_inflight_item it = q->items[q->head];
        attnd_err rv = attnd_device_fence_query(q->dm->be, it.r->wait.fence);
        if (rv == ATTND_ERR_TIMEOUT) break;
        q->head = (q->head + 1) % q->cap;
        q->count--;
        inflight_complete(q, it.r, rv, it.done, it.arg);
        n++;
    }
    return n;
}

uint32_t attnd_inflight_count(const attnd_inflight *q)
{
    return q->count;
}

void attnd_inflight_drain(attnd_inflight *q)
{
    if (q->count == 0) return;
    attnd_backend_sync(q->dm->be); /* a failure shows in each fence's query */
    while (q->count)
        attnd_inflight_poll(q);
}
