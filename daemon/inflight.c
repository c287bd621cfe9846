/* Deferred replies: requests whose kernels were queued on the device and whose reply waits only
 * for them. They complete in the order they were queued (one stream), so a ring suffices. */
#include <stdlib.h>

#include "metrics.h"
#include "ops.h"

typedef struct attnd_inflight_item {
    attnd_ops_reply *r;
    attnd_ops_done_fn done;
    void *arg;
} attnd_inflight_item;

static int inflight_grow(attnd_ops *o)
{
    uint32_t cap = o->inflight_cap ? o->inflight_cap * 2 : 64;
    attnd_inflight_item *n = malloc((size_t)cap * sizeof *n);
    if (n == NULL) return 0;
    for (uint32_t i = 0; i < o->inflight_count; i++)
        n[i] = o->inflight[(o->inflight_head + i) % o->inflight_cap];
    free(o->inflight);
    o->inflight = n;
    o->inflight_cap = cap;
    o->inflight_head = 0;
    return 1;
}

/* Kernel time of a finished request: from its last launch or the previous completion,
 * whichever is later, to now (overlapping requests are not counted twice). */
static void inflight_charge(attnd_ops *o, const attnd_ops_reply *r)
{
    uint64_t now = attnd_metrics_now_ns();
    uint64_t from = r->fence_t_ns > o->inflight_done_ns ? r->fence_t_ns : o->inflight_done_ns;
    if (o->metrics && now > from)
        attnd_metrics_kernel(o->metrics, (attnd_metrics_kernel_kind)r->fence_kind, now - from, 0);
    o->inflight_done_ns = now;
}

/* r's fence passed (rv OK) or failed: release it, note a failure, hand the reply back. */
static void inflight_complete(attnd_ops *o, attnd_ops_reply *r, attnd_err rv,
                              attnd_ops_done_fn done, void *arg)
{
    attnd_device_fence_release(o->be, r->fence);
    r->fence = NULL;
    if (rv != ATTND_ERR_OK) {
        attnd_ops_kernel_fail(o, r, rv, r->fence_what ? r->fence_what : "kernels");
        r->reply.outputs = NULL; /* an error reply carries no body */
        r->reply.body_case = ATTND__REPLY__BODY__NOT_SET;
    } else {
        inflight_charge(o, r);
    }
    done(arg, r);
}

void attnd_ops_defer(attnd_ops *o, attnd_ops_reply *r, attnd_ops_done_fn done, void *arg)
{
    if (o->inflight_count == o->inflight_cap && !inflight_grow(o)) {
        attnd_err rv = attnd_backend_sync(o->be); /* no room to wait: wait here */
        inflight_complete(o, r, rv, done, arg);
        return;
    }
    attnd_inflight_item *it =
        &o->inflight[(o->inflight_head + o->inflight_count) % o->inflight_cap];
    it->r = r;
    it->done = done;
    it->arg = arg;
    o->inflight_count++;
}

uint32_t attnd_ops_poll(attnd_ops *o)
{
    uint32_t n = 0;
    while (o->inflight_count) {
        attnd_inflight_item it = o->inflight[o->inflight_head];
        attnd_err rv = attnd_device_fence_query(o->be, it.r->fence);
        if (rv == ATTND_ERR_TIMEOUT) break;
        o->inflight_head = (o->inflight_head + 1) % o->inflight_cap;
        o->inflight_count--;
        inflight_complete(o, it.r, rv, it.done, it.arg);
        n++;
    }
    return n;
}

uint32_t attnd_ops_inflight(const attnd_ops *o)
{
    return o->inflight_count;
}

void attnd_ops_drain(attnd_ops *o)
{
    if (o->inflight_count == 0) return;
    attnd_backend_sync(o->be); /* a failure shows in each fence's query */
    while (o->inflight_count)
        attnd_ops_poll(o);
}
