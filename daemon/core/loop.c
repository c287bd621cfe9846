#include "loop.h"

#include <signal.h>
#include <string.h>

#define DRAIN_POLL_MS 5
/* NNG 1.5 has no linger: a reply whose send completed may still be queued on its connection
 * when the socket closes. Keep the socket open this long after the last reply. */
#define DRAIN_LINGER_MS 100

static void loop_close_all(attnd_loop *l);

static void loop_drain_cb(uv_timer_t *t)
{
    attnd_loop *l = t->data;
    uint64_t now = uv_now(&l->uv), waited = now - l->drain_start;
    if (l->quiet_since == 0 && l->hooks.drained(l->hooks.arg)) l->quiet_since = now;
    if (l->quiet_since && now - l->quiet_since >= DRAIN_LINGER_MS) {
        loop_close_all(l);
        return;
    }
    if (waited < l->drain_timeout_ms) return;
    ATTND_LOG(l->log, ATTND_LOG_WARN, "event=drain_timeout waited_ms=%llu",
              (unsigned long long)waited);
    loop_close_all(l);
}

static void loop_begin_drain(attnd_loop *l, int signum)
{
    if (l->closing) return;
    if (l->draining) {
        /* asked twice: the operator does not want to wait */
        ATTND_LOG(l->log, ATTND_LOG_WARN, "event=stop_now signal=%d", signum);
        loop_close_all(l);
        return;
    }
    l->draining = 1;
    l->signum = signum;
    l->drain_start = uv_now(&l->uv);
    ATTND_LOG(l->log, ATTND_LOG_INFO, "event=drain signal=%d timeout_ms=%llu", signum,
              (unsigned long long)l->drain_timeout_ms);
    l->hooks.drain(l->hooks.arg);
    uv_timer_start(&l->drain, loop_drain_cb, 0, DRAIN_POLL_MS);
}

static void loop_signal_cb(uv_signal_t *h, int signum)
{
    attnd_loop *l = h->data;
    if (signum == SIGHUP) {
        if (!l->draining) l->hooks.reload(l->hooks.arg);
        return;
    }
    loop_begin_drain(l, signum);
}

static void loop_tick_cb(uv_timer_t *t)
{
    attnd_loop *l = t->data;
    l->hooks.tick(l->hooks.arg);
}

static void loop_close_all(attnd_loop *l)
{
    if (l->closing) return;
    l->closing = 1;
    uv_handle_t *hs[] = {(uv_handle_t *)&l->sig_term, (uv_handle_t *)&l->sig_int,
                         (uv_handle_t *)&l->sig_hup, (uv_handle_t *)&l->tick,
                         (uv_handle_t *)&l->drain};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], NULL);
}

static attnd_err map_uv(int rv)
{
    return rv == 0 ? ATTND_ERR_OK : rv == UV_ENOMEM ? ATTND_ERR_NO_MEMORY : ATTND_ERR_INTERNAL;
}

attnd_err attnd_loop_init(attnd_loop *l, const attnd_loop_hooks *hooks, uint64_t tick_ms,
                          uint64_t drain_timeout_ms, attnd_log *lg)
{
    int rv;
    memset(l, 0, sizeof *l);
    l->hooks = *hooks;
    l->log = lg;
    l->tick_ms = tick_ms;
    l->drain_timeout_ms = drain_timeout_ms;
    if ((rv = uv_loop_init(&l->uv)) != 0) return map_uv(rv);
    uv_signal_init(&l->uv, &l->sig_term);
    uv_signal_init(&l->uv, &l->sig_int);
    uv_signal_init(&l->uv, &l->sig_hup);
    uv_timer_init(&l->uv, &l->tick);
    uv_timer_init(&l->uv, &l->drain);
    l->sig_term.data = l->sig_int.data = l->sig_hup.data = l;
    l->tick.data = l->drain.data = l;
    rv = uv_signal_start(&l->sig_term, loop_signal_cb, SIGTERM);
    if (rv == 0) rv = uv_signal_start(&l->sig_int, loop_signal_cb, SIGINT);
    if (rv == 0) rv = uv_signal_start(&l->sig_hup, loop_signal_cb, SIGHUP);
    if (rv == 0) rv = uv_timer_start(&l->tick, loop_tick_cb, l->tick_ms, l->tick_ms);
    if (rv != 0) {
        loop_close_all(l);
        uv_run(&l->uv, UV_RUN_DEFAULT);
        uv_loop_close(&l->uv);
        return map_uv(rv);
    }
    return ATTND_ERR_OK;
}

int attnd_loop_run(attnd_loop *l)
{
    uv_run(&l->uv, UV_RUN_DEFAULT);
    int rv = uv_loop_close(&l->uv);
    if (rv != 0)
        ATTND_LOG(l->log, ATTND_LOG_ERROR, "event=loop_close_failed err=%s", uv_err_name(rv));
    return rv;
}

int attnd_loop_fini(attnd_loop *l)
{
    loop_close_all(l);
    return attnd_loop_run(l);
}
