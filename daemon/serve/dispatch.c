#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>

#include "attnd/clock.h"
#include "handler.h"

static const attnd_req_table *const dispatch_tables[] = {
    &attnd_req_session, &attnd_req_sequence, &attnd_req_step,
    &attnd_req_tensor,  &attnd_req_channel,  &attnd_req_stream,
};

/* The entry for a body, NULL for none (or unknown). */
static const attnd_req_entry *dispatch_entry(int body)
{
    for (size_t t = 0; t < sizeof dispatch_tables / sizeof dispatch_tables[0]; t++)
        for (size_t i = 0; i < dispatch_tables[t]->n; i++)
            if ((int)dispatch_tables[t]->entries[i].body == body)
                return &dispatch_tables[t]->entries[i];
    return NULL;
}

static attnd_err dispatch_run(attnd_serve *sv, const attnd_req_entry *e, const Attnd__Request *req,
                              uint32_t pipe, uint64_t age_ms, attnd_reply *r)
{
    attnd_req_ctx c = {req, NULL, pipe};
    attnd_err rv;
    if (e == NULL) return attnd_reply_fail(r, ATTND_ERR_INVALID_ARGUMENT, "body: none set");
    if (sv->limits.request_timeout_ms && age_ms > sv->limits.request_timeout_ms)
        return attnd_reply_fail(r, ATTND_ERR_TIMEOUT,
                                "request: queued %llu ms, over limits.request_timeout_ms (%u)",
                                (unsigned long long)age_ms, sv->limits.request_timeout_ms);
    if ((e->flags & ATTND_REQ_SESSION) &&
        (rv = attnd_session_get(&sv->sessions, req->session, pipe, &c.s, r->msg, sizeof r->msg)))
        return attnd_reply_code(r, rv);
    if ((e->flags & ATTND_REQ_DEVICE) &&
        (rv = attnd_devmem_usable(sv->dm, r->msg, sizeof r->msg)) != ATTND_ERR_OK)
        return attnd_reply_code(r, rv);
    return e->fn(sv, &c, r);
}

/* Whether a failed request may be logged now (repeated errors are rate limited per body and
 * code); *suppressed gets how many were not. */
static int dispatch_log_allowed(attnd_serve *sv, const char *name, attnd_err rv,
                                uint64_t *suppressed)
{
    char key[48];
    *suppressed = 0;
    if (rv == ATTND_ERR_OK || sv->log_limit == NULL) return 1;
    snprintf(key, sizeof key, "%s:%s", name, attnd_err_name(rv));
    if (attnd_ratelimit_allow(sv->log_limit, key, attnd_clock_ns(), suppressed)) return 1;
    if (sv->metrics) attnd_metrics_event(sv->metrics, ATTND_METRICS_EVENT_LOG_SUPPRESSED);
    return 0;
}

void attnd_dispatch(attnd_serve *sv, const Attnd__Request *req, uint32_t pipe, uint64_t age_ms,
                    attnd_reply *r)
{
    uint64_t t0 = attnd_clock_ns(), suppressed = 0;
    const attnd_req_entry *e = dispatch_entry((int)req->body_case);
    attnd_err rv = dispatch_run(sv, e, req, pipe, age_ms, r);
    if (rv == ATTND_ERR_OK && sv->metrics && (e->flags & ATTND_REQ_TIMED))
        attnd_metrics_kernel(sv->metrics, ATTND_METRICS_KERNEL_OTHER, attnd_clock_ns() - t0, 0);
    r->reply.code = (uint32_t)rv;
    if (rv != ATTND_ERR_OK && r->msg[0] == '\0')
        snprintf(r->msg, sizeof r->msg, "%s", attnd_strerror(rv));
    if (rv == ATTND_ERR_OK) r->msg[0] = '\0';
    const char *name = e ? e->name : "none";
    attnd_log_level level = rv == ATTND_ERR_OK ? ATTND_LOG_DEBUG : ATTND_LOG_INFO;
    if (!attnd_log_enabled(sv->log, level) || !dispatch_log_allowed(sv, name, rv, &suppressed))
        return;
    ATTND_LOG(sv->log, level,
              "event=request id=%llu session=%llu body=%s code=%s msg=\"%s\" suppressed=%llu",
              (unsigned long long)req->id, (unsigned long long)req->session, name,
              attnd_err_name(rv), r->msg, (unsigned long long)suppressed);
}

/* ---------------------------------------------------------------- the wire's handler */

/* One request's reply, from dispatch until the wire sent it. */
typedef struct serve_call {
    attnd_reply r;
    attnd_wire_call *wc;
} serve_call;

static void dispatch_reply_cb(void *arg, attnd_reply *r)
{
    serve_call *c = arg;
    attnd_wire_reply(c->wc, &r->reply);
    attnd_reply_fini(r);
    free(c);
}

static void dispatch_request_cb(void *arg, attnd_wire_call *wc, const Attnd__Request *req,
                                uint32_t pipe, uint64_t age_ms)
{
    attnd_serve *sv = arg;
    serve_call *c = malloc(sizeof *c);
    if (c == NULL) {
        attnd_wire_fail(wc, req->id, ATTND_ERR_NO_MEMORY, "request: out of memory");
        return;
    }
    c->wc = wc;
    attnd_reply_init(&c->r, req->id);
    c->r.hold_done = dispatch_reply_cb;
    c->r.hold_arg = c;
    attnd_dispatch(sv, req, pipe, age_ms, &c->r);
    if (c->r.held) return; /* a stream channel answers it (serve/req_stream.c) */
    if (c->r.wait.fence != NULL)
        attnd_inflight_defer(&sv->inflight, &c->r, dispatch_reply_cb, c);
    else
        dispatch_reply_cb(c, &c->r);
}

static void dispatch_pipe_closed_cb(void *arg, uint32_t pipe)
{
    attnd_serve_pipe_closed(arg, pipe);
}

attnd_wire_handler attnd_dispatch_wire_handler(attnd_serve *sv)
{
    attnd_wire_handler h = {sv, dispatch_request_cb, dispatch_pipe_closed_cb};
    return h;
}
