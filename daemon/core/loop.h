/* Event loop (libuv): SIGTERM/SIGINT start a drain (stop accepting, wait for in-flight work,
 * then stop; a second signal stops at once), SIGHUP asks for a reload, one housekeeping timer
 * ticks. The policy (what a drain, a reload or a tick does) comes from the caller's hooks; the
 * loop only schedules.
 *
 * attnd_loop_run returns after every handle is closed, with uv_loop_close()'s result: 0 proves
 * nothing was left open. */
#ifndef ATTND_CORE_LOOP_H
#define ATTND_CORE_LOOP_H

#include <stdint.h>
#include <uv.h>

#include "attnd/err.h"
#include "log.h"

typedef struct attnd_loop_hooks {
    void *arg;
    void (*drain)(void *arg);  /* stop accepting new work */
    int (*drained)(void *arg); /* 1 when nothing is in flight */
    void (*reload)(void *arg); /* SIGHUP */
    void (*tick)(void *arg);   /* every tick_ms */
} attnd_loop_hooks;

typedef struct attnd_loop {
    uv_loop_t uv;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t tick, drain;
    attnd_loop_hooks hooks;
    attnd_log *log;
    uint64_t tick_ms, drain_timeout_ms, drain_start;
    uint64_t quiet_since; /* when nothing was in flight any more (0 = not yet) */
    int draining;
    int closing; /* handles being closed */
    int signum;  /* signal that started the drain (0 if none) */
} attnd_loop;

/* Initialise the loop and its handles (not yet running); tick_ms > 0. */
attnd_err attnd_loop_init(attnd_loop *l, const attnd_loop_hooks *hooks, uint64_t tick_ms,
                          uint64_t drain_timeout_ms, attnd_log *lg);
/* Run until a drain finishes; close every handle; returns uv_loop_close()'s result. */
int attnd_loop_run(attnd_loop *l);
/* Close a loop that was initialised but never run (startup failed); returns uv_loop_close(). */
int attnd_loop_fini(attnd_loop *l);

#endif
