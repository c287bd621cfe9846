/* Lock-outs (issue 13): nothing one client does keeps the others out. One connection holds a
 * bounded number of sessions; a session with no sequences is reclaimed as soon as its connection
 * drops, so fast connect/Hello/close cycles leave room for the next client. Real bytes on real
 * sockets against the real daemon. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "loadutil.h"

#define LOCKOUT_CONFIG(server_extra, limits_extra)                                                 \
    "{\"backend\": \"cpu\", \"threads\": 1,"                                                       \
    " \"server\": {\"listen\": \"@URL@\"" server_extra "},"                                        \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 32},"                                                                \
    " \"limits\": {\"reclaim_timeout_ms\": 600000" limits_extra "},"                               \
    " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}"

/* ---------------------------------------------------------------- helpers */

static Attnd__Reply *hello_raw(uint32_t s, uint64_t id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello h = ATTND__HELLO__INIT;
    Attnd__Reply *rep = NULL;
    h.protocol_version = 1;
    req.id = id;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &h;
    cr_assert_eq(lu_raw_call(s, &req, &rep), 0, "no reply to Hello %llu", (unsigned long long)id);
    return rep;
}

/* Hello on a fresh client, retried while the daemon says UNAVAILABLE for at most wait_ms (the
 * drop of a connection closed just before reaches the daemon on its own schedule). */
static attnd_err hello_within(const attnd_daemon_proc *d, int wait_ms, attnd_client **out)
{
    int64_t deadline = lu_now_ms() + wait_ms;
    attnd_client_opts opts = {.name = "lockout", .timeout_ms = 5000, .channel_slots = -1};
    for (;;) {
        attnd_client *c = NULL;
        cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
        attnd_err rv = attnd_client_connect(c, d->url, NULL);
        if (rv == ATTND_ERR_OK && out) {
            *out = c;
            return rv;
        }
        attnd_client_free(c);
        if (rv != ATTND_ERR_UNAVAILABLE || lu_now_ms() >= deadline) return rv;
        lu_sleep_ms(20);
    }
}

/* ---------------------------------------------------------------- sessions (item 8) */

Test(lockout, one_connection_holds_a_bounded_number_of_sessions, .timeout = 120)
{
    attnd_daemon_proc d;
    uint32_t s;
    int ok = 0, refused = 0;
    cr_assert_eq(attnd_daemon_start(&d, LOCKOUT_CONFIG("", ", \"max_sessions\": 16, "
                                                           "\"max_sessions_per_connection\": 3")),
                 0);
    cr_assert_eq(lu_raw_open(d.url, 5000, &s), 0);
    for (int i = 0; i < 100; i++) {
        Attnd__Reply *rep = hello_raw(s, (uint64_t)i + 1);
        if (rep->code == ATTND_ERR_OK) {
            ok++;
        } else {
            cr_assert_eq(rep->code, ATTND_ERR_UNAVAILABLE, "Hello %d: %u (%s)", i, rep->code,
                         rep->message);
            cr_assert(rep->message && strstr(rep->message, "limits.max_sessions_per_connection"),
                      "Hello %d: \"%s\" does not name the key", i, rep->message);
            refused++;
        }
        attnd__reply__free_unpacked(rep, NULL);
    }
    cr_assert_eq(ok, 3, "one connection opened %d sessions", ok);
    cr_assert_eq(refused, 97);
    /* the others still get in while it stays connected */
    attnd_client *c[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(hello_within(&d, 0, &c[i]), ATTND_ERR_OK, "client %d kept out", i);
    for (int i = 0; i < 4; i++)
        attnd_client_free(c[i]);
    lu_raw_close(s);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

Test(lockout, fast_connect_hello_close_cycles_leave_room, .timeout = 180)
{
    attnd_daemon_proc d;
    attnd_client *keep = NULL, *c = NULL;
    char why[256];
    cr_assert_eq(attnd_daemon_start(&d, LOCKOUT_CONFIG("", ", \"max_sessions\": 8")), 0);
    /* one client with a sequence: its session outlives its connection (reclaim timeout) */
    cr_assert_eq(hello_within(&d, 5000, &keep), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_create(keep, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(keep, 1, 5, 1.5f, why, sizeof why), 0, "%s", why);
    attnd_client_free(keep);
    /* 64 cycles of connect, Hello, close with 8 sessions at most: each one gets in */
    for (int i = 0; i < 64; i++) {
        attnd_err rv = hello_within(&d, 10000, &c);
        cr_assert_eq(rv, ATTND_ERR_OK, "cycle %d kept out: %s", i, attnd_err_name(rv));
        attnd_client_free(c);
    }
    cr_assert_eq(hello_within(&d, 10000, &c), ATTND_ERR_OK);
    attnd_status st;
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.num_sequences, 1, "the dropped client's sequence is kept until reclaimed");
    cr_assert_leq(st.num_sessions, 3, "%u sessions left of the cycles", st.num_sessions);
    attnd_client_free(c);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
