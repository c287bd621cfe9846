#include "stream_fsm.h"

#include <string.h>

void attnd_sx_init(attnd_sx *x)
{
    memset(x, 0, sizeof *x);
    x->state = ATTND_SX_IDLE;
}

/* Release the daemon's own flags: the stream runs out, then the step aborts. */
static unsigned sx_release(attnd_sx *x, attnd_sx_why why, uint64_t now, const attnd_sx_timeouts *t)
{
    x->state = ATTND_SX_RELEASING;
    x->why = why;
    x->deadline_ms = now + t->drain_ms;
    return ATTND_SX_DO_RELEASE;
}

/* The code an owed EndStep gets once its released step is gone: an abort got what it asked. */
static attnd_err sx_released_code(const attnd_sx *x, int abort)
{
    if (abort) return ATTND_ERR_OK;
    switch (x->why) {
    case ATTND_SX_WHY_TIMEOUT:
        return ATTND_ERR_TIMEOUT;
    case ATTND_SX_WHY_DISCONNECT:
        return ATTND_ERR_UNAVAILABLE;
    case ATTND_SX_WHY_ABORT:
        return ATTND_ERR_FAILED_PRECONDITION;
    default:
        return ATTND_ERR_INTERNAL;
    }
}

/* The owed EndStep's answer, when one is owed. */
static unsigned sx_reply(attnd_sx *x, attnd_err code)
{
    if (!x->end_owed) return 0;
    x->end_owed = 0;
    x->reply_code = code;
    return ATTND_SX_DO_REPLY;
}

/* Note an EndStep: owed until the stream says how the step ended. */
static void sx_owe(attnd_sx *x, int abort)
{
    x->end_owed = 1;
    x->end_abort = abort;
}

/* The stream drained (or failed) after a release: abort the step, then FAILED or CLOSED. */
static unsigned sx_released_out(attnd_sx *x, int fault)
{
    unsigned a = ATTND_SX_DO_ABORT;
    if (fault) x->why = ATTND_SX_WHY_FAULT;
    a |= sx_reply(x, fault ? ATTND_ERR_INTERNAL : sx_released_code(x, x->end_abort));
    if (x->closing) {
        x->state = ATTND_SX_CLOSED;
        return a | ATTND_SX_DO_FREE;
    }
    x->state = ATTND_SX_FAILED;
    return a;
}

static unsigned sx_idle(attnd_sx *x, attnd_sx_event ev, uint64_t now, const attnd_sx_timeouts *t)
{
    switch (ev) {
    case ATTND_SX_BEGIN:
        x->state = ATTND_SX_ARMED;
        x->why = ATTND_SX_WHY_NONE;
        x->deadline_ms = now + t->step_ms;
        return 0;
    case ATTND_SX_DISCONNECT:
    case ATTND_SX_CLOSE:
        x->state = ATTND_SX_CLOSED;
        return ATTND_SX_DO_FREE;
    default:
        return 0;
    }
}

/* ARMED and ENDING: the step's layers are queued, its stream may be waiting on the worker. */
static unsigned sx_queued(attnd_sx *x, attnd_sx_event ev, uint64_t now, const attnd_sx_timeouts *t)
{
    switch (ev) {
    case ATTND_SX_END:
        if (x->state != ATTND_SX_ARMED) return 0;
        sx_owe(x, 0);
        x->state = ATTND_SX_ENDING;
        return 0;
    case ATTND_SX_ABORT:
        sx_owe(x, 1);
        return sx_release(x, ATTND_SX_WHY_ABORT, now, t);
    case ATTND_SX_DRAINED:
        if (x->state == ATTND_SX_ARMED) {
            x->state = ATTND_SX_DONE;
            return 0;
        }
        x->state = ATTND_SX_IDLE;
        return ATTND_SX_DO_COMMIT | sx_reply(x, ATTND_ERR_OK);
    case ATTND_SX_FAULT:
        x->why = ATTND_SX_WHY_FAULT;
        x->state = ATTND_SX_FAILED;
        return ATTND_SX_DO_ABORT | sx_reply(x, ATTND_ERR_INTERNAL);
    case ATTND_SX_TICK:
        return now >= x->deadline_ms ? sx_release(x, ATTND_SX_WHY_TIMEOUT, now, t) : 0;
    case ATTND_SX_DISCONNECT:
    case ATTND_SX_CLOSE:
        x->closing = 1;
        return sx_release(x, ATTND_SX_WHY_DISCONNECT, now, t);
    case ATTND_SX_QUEUE_FAILED: /* what was queued runs out first: its blocks stay until then */
        return sx_release(x, ATTND_SX_WHY_FAULT, now, t);
    default:
        return 0;
    }
}

static unsigned sx_done(attnd_sx *x, attnd_sx_event ev)
{
    switch (ev) {
    case ATTND_SX_END:
    case ATTND_SX_ABORT:
        x->state = ATTND_SX_IDLE;
        x->reply_code = ATTND_ERR_OK;
        return (ev == ATTND_SX_END ? ATTND_SX_DO_COMMIT : ATTND_SX_DO_ABORT) | ATTND_SX_DO_REPLY;
    case ATTND_SX_DISCONNECT:
    case ATTND_SX_CLOSE:
        x->state = ATTND_SX_CLOSED;
        return ATTND_SX_DO_ABORT | ATTND_SX_DO_FREE;
    default:
        return 0;
    }
}

/* RELEASING and STUCK: the daemon's flags are written; the stream runs out (late, when stuck). */
static unsigned sx_releasing(attnd_sx *x, attnd_sx_event ev, uint64_t now)
{
    switch (ev) {
    case ATTND_SX_END:
    case ATTND_SX_ABORT:
        if (x->end_owed) return 0; /* one EndStep at a time */
        sx_owe(x, ev == ATTND_SX_ABORT);
        return 0;
    case ATTND_SX_DRAINED:
    case ATTND_SX_FAULT:
        return sx_released_out(x, ev == ATTND_SX_FAULT);
    case ATTND_SX_TICK:
        if (x->state != ATTND_SX_RELEASING || now < x->deadline_ms) return 0;
        x->state = ATTND_SX_STUCK;
        return ATTND_SX_DO_QUARANTINE | sx_reply(x, ATTND_ERR_INTERNAL);
    case ATTND_SX_DISCONNECT:
    case ATTND_SX_CLOSE:
        x->closing = 1;
        return 0;
    default:
        return 0;
    }
}

static unsigned sx_failed(attnd_sx *x, attnd_sx_event ev)
{
    switch (ev) {
    case ATTND_SX_END:
    case ATTND_SX_ABORT:
        x->reply_code = sx_released_code(x, ev == ATTND_SX_ABORT);
        return ATTND_SX_DO_REPLY;
    case ATTND_SX_DISCONNECT:
    case ATTND_SX_CLOSE:
        x->state = ATTND_SX_CLOSED;
        return ATTND_SX_DO_FREE;
    default:
        return 0;
    }
}

unsigned attnd_sx_on(attnd_sx *x, attnd_sx_event ev, uint64_t now_ms, const attnd_sx_timeouts *t)
{
    switch (x->state) {
    case ATTND_SX_IDLE:
        return sx_idle(x, ev, now_ms, t);
    case ATTND_SX_ARMED:
    case ATTND_SX_ENDING:
        return sx_queued(x, ev, now_ms, t);
    case ATTND_SX_DONE:
        return sx_done(x, ev);
    case ATTND_SX_RELEASING:
    case ATTND_SX_STUCK:
        return sx_releasing(x, ev, now_ms);
    case ATTND_SX_FAILED:
        return sx_failed(x, ev);
    default:
        return 0;
    }
}

attnd_err attnd_sx_can_begin(const attnd_sx *x, char *err, size_t n)
{
    switch (x->state) {
    case ATTND_SX_IDLE:
        return ATTND_ERR_OK;
    case ATTND_SX_FAILED:
    case ATTND_SX_STUCK:
    case ATTND_SX_RELEASING:
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "stream: released after %s: close it and open a new one (new flags; "
                          "capture the graph again)",
                          attnd_sx_why_name(x->why));
    case ATTND_SX_CLOSED:
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION, "stream: closed");
    default:
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "stream: a step is open (%s): end it first",
                          attnd_sx_state_name(x->state));
    }
}

int attnd_sx_has_step(const attnd_sx *x)
{
    return x->state == ATTND_SX_ARMED || x->state == ATTND_SX_DONE || x->state == ATTND_SX_ENDING ||
           x->state == ATTND_SX_RELEASING || x->state == ATTND_SX_STUCK;
}

int attnd_sx_running(const attnd_sx *x)
{
    return x->state == ATTND_SX_ARMED || x->state == ATTND_SX_ENDING ||
           x->state == ATTND_SX_RELEASING || x->state == ATTND_SX_STUCK;
}

const char *attnd_sx_state_name(attnd_sx_state s)
{
    static const char *const names[] = {"idle",      "armed",  "done",  "ending",
                                        "releasing", "failed", "stuck", "closed"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

const char *attnd_sx_why_name(attnd_sx_why w)
{
    static const char *const names[] = {"nothing", "a timeout", "an abort", "a disconnect",
                                        "a device fault"};
    return (unsigned)w < sizeof names / sizeof names[0] ? names[w] : "?";
}
