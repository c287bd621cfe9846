/* The stream-ordered step protocol's state machine (daemon/state/stream_fsm.h): the normal
 * step, EndStep before and after the stream ran, timeouts before and after EndStep, aborts,
 * disconnects, device faults, a stream that does not drain (stuck, then late), and invariants
 * over every state and event. */
#include <criterion/criterion.h>
#include <string.h>

#include "state/stream_fsm.h"

static const attnd_sx_timeouts T = {.step_ms = 100, .drain_ms = 50};

/* A machine in ARMED at t = 1000 (deadline 1100). */
static attnd_sx armed(void)
{
    attnd_sx x;
    attnd_sx_init(&x);
    cr_assert_eq(attnd_sx_on(&x, ATTND_SX_BEGIN, 1000, &T), 0u);
    cr_assert_eq(x.state, ATTND_SX_ARMED);
    return x;
}

Test(stream_fsm, step_then_end)
{
    attnd_sx x = armed();
    char err[128];
    cr_expect_eq(attnd_sx_can_begin(&x, err, sizeof err), ATTND_ERR_FAILED_PRECONDITION);
    cr_expect(attnd_sx_running(&x));
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1099, &T), 0u, "before the deadline");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1050, &T), 0u);
    cr_expect_eq(x.state, ATTND_SX_DONE);
    cr_expect_not(attnd_sx_running(&x));
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 99999, &T), 0u, "a done step has no deadline");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 2000, &T), ATTND_SX_DO_COMMIT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_OK);
    cr_expect_eq(x.state, ATTND_SX_IDLE);
    cr_expect_eq(attnd_sx_can_begin(&x, err, sizeof err), ATTND_ERR_OK);
}

Test(stream_fsm, end_before_the_stream_ran_waits_for_it)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1010, &T), 0u, "the reply waits");
    cr_expect_eq(x.state, ATTND_SX_ENDING);
    cr_expect(x.end_owed);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1011, &T), 0u, "a second EndStep is not taken");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1020, &T),
                 ATTND_SX_DO_COMMIT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_OK);
    cr_expect_eq(x.state, ATTND_SX_IDLE);
    cr_expect_not(x.end_owed);
}

Test(stream_fsm, timeout_releases_and_fails_the_channel)
{
    attnd_sx x = armed();
    char err[160];
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1100, &T), ATTND_SX_DO_RELEASE);
    cr_expect_eq(x.state, ATTND_SX_RELEASING);
    cr_expect_eq(x.why, ATTND_SX_WHY_TIMEOUT);
    cr_expect_eq(x.deadline_ms, 1150u, "the drain deadline");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1120, &T), 0u, "released once");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1130, &T), 0u, "owed until drained");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1140, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY,
                 "never a commit after a release");
    cr_expect_eq(x.reply_code, ATTND_ERR_TIMEOUT);
    cr_expect_eq(x.state, ATTND_SX_FAILED);
    cr_expect_eq(attnd_sx_can_begin(&x, err, sizeof err), ATTND_ERR_FAILED_PRECONDITION);
    cr_expect(strstr(err, "a timeout") != NULL, "%s", err);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_BEGIN, 1200, &T), 0u);
    cr_expect_eq(x.state, ATTND_SX_FAILED, "a failed channel takes no step");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1210, &T), ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_TIMEOUT, "a late EndStep learns why");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_CLOSE, 1300, &T), ATTND_SX_DO_FREE);
    cr_expect_eq(x.state, ATTND_SX_CLOSED);
}

Test(stream_fsm, timeout_while_ending)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1010, &T), 0u);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1101, &T), ATTND_SX_DO_RELEASE);
    cr_expect(x.end_owed, "the EndStep is still owed");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1110, &T),
                 ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_TIMEOUT);
    cr_expect_eq(x.state, ATTND_SX_FAILED);
}

Test(stream_fsm, abort_while_queued_releases)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_ABORT, 1010, &T), ATTND_SX_DO_RELEASE);
    cr_expect_eq(x.why, ATTND_SX_WHY_ABORT);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1020, &T),
                 ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_OK, "the abort got what it asked for");
    cr_expect_eq(x.state, ATTND_SX_FAILED);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1030, &T), ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_FAILED_PRECONDITION, "nothing left to commit");
}

Test(stream_fsm, abort_after_the_stream_ran_is_clean)
{
    attnd_sx x = armed();
    attnd_sx_on(&x, ATTND_SX_DRAINED, 1010, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_ABORT, 1020, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_OK);
    cr_expect_eq(x.state, ATTND_SX_IDLE, "no release: the channel stays usable");
}

Test(stream_fsm, disconnect_while_queued_releases_then_frees)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DISCONNECT, 1010, &T), ATTND_SX_DO_RELEASE);
    cr_expect(x.closing);
    cr_expect_eq(x.why, ATTND_SX_WHY_DISCONNECT);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1020, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_FREE,
                 "freed only once its stream ran out");
    cr_expect_eq(x.state, ATTND_SX_CLOSED);
}

Test(stream_fsm, disconnect_with_an_owed_end)
{
    attnd_sx x = armed();
    attnd_sx_on(&x, ATTND_SX_END, 1010, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DISCONNECT, 1020, &T), ATTND_SX_DO_RELEASE);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1030, &T),
                 ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY | ATTND_SX_DO_FREE);
    cr_expect_eq(x.reply_code, ATTND_ERR_UNAVAILABLE);
}

Test(stream_fsm, disconnect_idle_or_done)
{
    attnd_sx x;
    attnd_sx_init(&x);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DISCONNECT, 0, &T), ATTND_SX_DO_FREE);
    x = armed();
    attnd_sx_on(&x, ATTND_SX_DRAINED, 1010, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DISCONNECT, 1020, &T),
                 ATTND_SX_DO_ABORT | ATTND_SX_DO_FREE, "a done step aborts without a release");
}

Test(stream_fsm, stuck_then_late_drain)
{
    attnd_sx x = armed();
    attnd_sx_on(&x, ATTND_SX_TICK, 1100, &T);
    attnd_sx_on(&x, ATTND_SX_END, 1110, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1149, &T), 0u);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 1150, &T),
                 ATTND_SX_DO_QUARANTINE | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_INTERNAL);
    cr_expect_eq(x.state, ATTND_SX_STUCK);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_TICK, 9000, &T), 0u, "quarantined once");
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_CLOSE, 9100, &T), 0u, "its memory is kept");
    cr_expect_eq(x.state, ATTND_SX_STUCK);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 9200, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_FREE,
                 "a late drain frees it");
    cr_expect_eq(x.state, ATTND_SX_CLOSED);
}

Test(stream_fsm, faults)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_FAULT, 1010, &T), ATTND_SX_DO_ABORT);
    cr_expect_eq(x.state, ATTND_SX_FAILED);
    cr_expect_eq(x.why, ATTND_SX_WHY_FAULT);
    x = armed();
    attnd_sx_on(&x, ATTND_SX_END, 1010, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_FAULT, 1020, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_INTERNAL);
    x = armed();
    attnd_sx_on(&x, ATTND_SX_TICK, 1100, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_FAULT, 1110, &T), ATTND_SX_DO_ABORT);
    cr_expect_eq(x.state, ATTND_SX_FAILED);
}

Test(stream_fsm, a_step_that_cannot_be_queued_is_released_then_fails)
{
    attnd_sx x = armed();
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_QUEUE_FAILED, 1010, &T), ATTND_SX_DO_RELEASE,
                 "the layers already queued wait on the worker: release them");
    cr_expect_eq(x.state, ATTND_SX_RELEASING);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1020, &T), ATTND_SX_DO_ABORT);
    cr_expect_eq(x.state, ATTND_SX_FAILED);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_END, 1030, &T), ATTND_SX_DO_REPLY);
    cr_expect_eq(x.reply_code, ATTND_ERR_INTERNAL, "a commit learns the step failed");
    x = armed();
    attnd_sx_on(&x, ATTND_SX_END, 1010, &T);
    attnd_sx_on(&x, ATTND_SX_QUEUE_FAILED, 1020, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_DRAINED, 1030, &T), ATTND_SX_DO_ABORT | ATTND_SX_DO_REPLY,
                 "an EndStep already waiting is answered once the stream ran out");
    cr_expect_eq(x.reply_code, ATTND_ERR_INTERNAL);
    x = armed();
    attnd_sx_on(&x, ATTND_SX_DRAINED, 1010, &T);
    cr_expect_eq(attnd_sx_on(&x, ATTND_SX_QUEUE_FAILED, 1020, &T), 0u, "done: nothing to queue");
}

/* Drive a machine into state s (from a fresh one at t = 1000). */
static attnd_sx in_state(attnd_sx_state s)
{
    attnd_sx x;
    attnd_sx_init(&x);
    static const attnd_sx_event path[][3] = {
        [ATTND_SX_IDLE] = {ATTND_SX_TICK, ATTND_SX_TICK, ATTND_SX_TICK},
        [ATTND_SX_ARMED] = {ATTND_SX_BEGIN, ATTND_SX_TICK, ATTND_SX_TICK},
        [ATTND_SX_DONE] = {ATTND_SX_BEGIN, ATTND_SX_DRAINED, ATTND_SX_TICK},
        [ATTND_SX_ENDING] = {ATTND_SX_BEGIN, ATTND_SX_END, ATTND_SX_TICK},
        [ATTND_SX_RELEASING] = {ATTND_SX_BEGIN, ATTND_SX_ABORT, ATTND_SX_TICK},
        [ATTND_SX_FAILED] = {ATTND_SX_BEGIN, ATTND_SX_ABORT, ATTND_SX_DRAINED},
        [ATTND_SX_STUCK] = {ATTND_SX_BEGIN, ATTND_SX_ABORT, ATTND_SX_TICK},
        [ATTND_SX_CLOSED] = {ATTND_SX_CLOSE, ATTND_SX_TICK, ATTND_SX_TICK},
    };
    for (int i = 0; i < 3; i++)
        attnd_sx_on(&x, path[s][i], s == ATTND_SX_STUCK && i == 2 ? 5000 : 1000, &T);
    cr_assert_eq(x.state, s, "reached %s", attnd_sx_state_name(s));
    return x;
}

Test(stream_fsm, invariants_over_every_state_and_event)
{
    for (int s = ATTND_SX_IDLE; s <= ATTND_SX_CLOSED; s++)
        for (int e = ATTND_SX_BEGIN; e <= ATTND_SX_QUEUE_FAILED; e++) {
            attnd_sx x = in_state((attnd_sx_state)s);
            int owed = x.end_owed;
            unsigned a = attnd_sx_on(&x, (attnd_sx_event)e, 1010, &T);
            const char *sn = attnd_sx_state_name((attnd_sx_state)s);
            cr_expect(!((a & ATTND_SX_DO_COMMIT) && (a & ATTND_SX_DO_ABORT)), "%s/%d", sn, e);
            cr_expect(!(a & ATTND_SX_DO_FREE) || x.state == ATTND_SX_CLOSED, "%s/%d", sn, e);
            cr_expect(!(a & ATTND_SX_DO_RELEASE) || x.state == ATTND_SX_RELEASING, "%s/%d", sn, e);
            cr_expect(!(a & ATTND_SX_DO_COMMIT) || s == ATTND_SX_DONE || s == ATTND_SX_ENDING,
                      "a commit only after the stream ran the step: %s/%d", sn, e);
            cr_expect(!x.end_owed || attnd_sx_has_step(&x), "%s/%d owes a reply", sn, e);
            cr_expect(!(owed && (a & ATTND_SX_DO_REPLY)) || !x.end_owed, "%s/%d", sn, e);
            if (s == ATTND_SX_CLOSED) cr_expect_eq(a, 0u, "closed takes nothing (%d)", e);
            if (e == ATTND_SX_BEGIN && s != ATTND_SX_IDLE)
                cr_expect_eq(x.state, (attnd_sx_state)s, "BEGIN only from idle (%s)", sn);
        }
}
