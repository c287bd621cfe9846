/* Stream channels (stream-ordered steps) against the real daemon, CPU backend: the protocol's
 * logic end to end on the emulated streams (kernels/cpu/stream.c), the worker's "stream" being
 * its thread. Steps through a channel are bit-identical to the same steps through Attend (also
 * when layer 0 is signalled before StreamBegin answers, or one step ahead, before the previous
 * step's StreamEnd, as a replay launched ahead does; a begin that then fails is released); a
 * step whose worker stops signalling times out (TIMEOUT, the channel fails, a new one works)
 * while other sessions are served; a worker killed mid-step has its step released and aborted,
 * the other worker is unaffected and bit-identical to a solo run, and every block comes back;
 * aborts before and after the stream ran; and what the daemon refuses (INLINE tensors, a wrong
 * layer count, Attend/EndStep on a stream step, unregistering a channel's region, streams off). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attnd/clock.h"
#include "daemon_proc.h"
#include "suite.h"

#define CONFIG_WITH_TIMEOUT(server_extra, stream_timeout_ms)                                       \
    "{\"backend\": \"cpu\", \"threads\": 2,"                                                       \
    " \"server\": {\"listen\": \"@URL@\"" server_extra "},"                                        \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 128,"      \
    " \"max_blocks_per_seq\": 32},"                                                                \
    " \"limits\": {\"reclaim_timeout_ms\": 200, \"stream_timeout_ms\": " stream_timeout_ms "},"    \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"
#define CONFIG_WITH(server_extra) CONFIG_WITH_TIMEOUT(server_extra, "800")
#define CONFIG CONFIG_WITH("")

#define L 2
#define HQ 8
#define HK 2
#define D 64
#define TMAX 32
#define NBLOCKS 128

/* ---------------------------------------------------------------- a worker */

/* A session with one shm region holding q, k, v, out for up to TMAX rows (f32). */
typedef struct worker {
    attnd_client *c;
    attnd_shm io;
    attnd_client_stream *s; /* NULL: plain Attend */
    int early;              /* layer 0 signalled before StreamBegin: EARLY_* */
    int signalled;          /* the next step's layer 0 is signalled already */
} worker;

/* When a worker signals a step's layer 0: after the previous StreamEnd, before StreamBegin (a
 * replay launched while StreamBegin travels), or before the previous step's StreamEnd (a replay
 * launched one step ahead). */
enum { EARLY_NONE, EARLY_BEFORE_BEGIN, EARLY_AHEAD };

static const size_t Q_OFF = 0, K_OFF = TMAX * HQ * D * 4, V_OFF = K_OFF + TMAX * HK * D * 4,
                    O_OFF = V_OFF + TMAX * HK * D * 4, IO_BYTES = O_OFF + TMAX * HQ * D * 4;

static void worker_open(worker *w, const attnd_daemon_proc *d, int stream)
{
    memset(w, 0, sizeof *w);
    w->c = attnd_test_connect(d);
    cr_assert_eq(attnd_client_shm_create(w->c, IO_BYTES, &w->io), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(w->c));
    if (stream)
        cr_assert_eq(attnd_client_stream_open(w->c, &w->s), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(w->c));
}

static void worker_close(worker *w)
{
    attnd_client_stream_close(w->s);
    attnd_client_shm_destroy(w->c, &w->io);
    attnd_client_free(w->c);
}

static void refs_for(const worker *w, int64_t T, attnd_ref r[4])
{
    const int64_t qs[3] = {T, HQ, D}, ks[3] = {T, HK, D};
    attnd_ref_shm(&r[0], &w->io, Q_OFF, ATTND_DTYPE_F32, 3, qs);
    attnd_ref_shm(&r[1], &w->io, K_OFF, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_shm(&r[2], &w->io, V_OFF, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_shm(&r[3], &w->io, O_OFF, ATTND_DTYPE_F32, 3, qs);
}

/* Layer l's inputs of step `k`: the same numbers in every session. */
static void fill_inputs(worker *w, int64_t T, int k, uint32_t l)
{
    float *q = (float *)((char *)w->io.base + Q_OFF), *kk = (float *)((char *)w->io.base + K_OFF);
    float *v = (float *)((char *)w->io.base + V_OFF);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(k * 16 + (int)l + 1);
    for (int64_t i = 0; i < T * HQ * D; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        q[i] = (float)((int)(x % 2001) - 1000) / 1000.0f;
    }
    for (int64_t i = 0; i < T * HK * D; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        kk[i] = (float)((int)(x % 2001) - 1000) / 1000.0f;
        v[i] = (float)((int)((x >> 20) % 2001) - 1000) / 1000.0f;
    }
}

/* Step k over seqs: every layer's output into out[l] ([TMAX * HQ * D] floats each), through the
 * worker's channel or plain Attend; next_T: the next step's tokens (EARLY_AHEAD), 0 none. */
static void run_step(worker *w, const attnd_step_seq *seqs, size_t n, int k, float *out,
                     int64_t next_T)
{
    attnd_step st;
    attnd_ref r[4];
    int64_t T = 0;
    for (size_t i = 0; i < n; i++)
        T += seqs[i].new_tokens;
    refs_for(w, T, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    int ahead = w->s && w->early == EARLY_AHEAD && next_T > 0;
    if (w->s && w->early != EARLY_NONE && !w->signalled) {
        fill_inputs(w, T, k, 0);
        cr_assert_eq(attnd_client_stream_signal(w->s, 0, NULL), ATTND_ERR_OK);
        w->signalled = 1;
    }
    if (w->s)
        cr_assert_eq(attnd_client_stream_begin(w->s, seqs, n, &io, 1, &st, NULL), ATTND_ERR_OK,
                     "%s", attnd_client_last_error(w->c));
    else
        cr_assert_eq(attnd_client_step_begin(w->c, seqs, n, &st, NULL), ATTND_ERR_OK);
    cr_assert_eq(st.num_tokens, (uint32_t)T);
    for (uint32_t l = 0; l < L; l++) {
        int early = w->s && w->signalled && l == 0; /* filled and signalled before begin */
        if (!early) fill_inputs(w, T, k, l);
        if (early) {
            w->signalled = 0;
            cr_assert_eq(attnd_client_stream_wait(w->s, 0, NULL), ATTND_ERR_OK, "%s",
                         attnd_client_last_error(w->c));
        } else if (w->s)
            cr_assert_eq(attnd_client_attend_async(w->s, l, NULL), ATTND_ERR_OK, "%s",
                         attnd_client_last_error(w->c));
        else
            cr_assert_eq(attnd_client_attend(w->c, st.id, l, &r[0], &r[1], &r[2], &r[3], NULL),
                         ATTND_ERR_OK, "%s", attnd_client_last_error(w->c));
        /* one step ahead: the next step's layer 0 signalled the moment the last wait returned,
         * as tight as a stream running ahead gets (its inputs are written below, before the
         * StreamBegin that queues the daemon's read of them) */
        if (ahead && l == L - 1) {
            cr_assert_eq(attnd_client_stream_signal(w->s, 0, NULL), ATTND_ERR_OK);
            w->signalled = 1;
        }
        memcpy(out + (size_t)l * TMAX * HQ * D, (char *)w->io.base + O_OFF, (size_t)T * HQ * D * 4);
    }
    if (ahead) fill_inputs(w, next_T, k + 1, 0);
    if (w->s)
        cr_assert_eq(attnd_client_stream_end(w->s, st.id, 0), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(w->c));
    else
        cr_assert_eq(attnd_client_step_end(w->c, st.id, 0), ATTND_ERR_OK);
}

/* The steps every test runs: a prefill of two sequences, then two decode steps. */
#define NSTEPS 3
static const attnd_step_seq STEPS[NSTEPS][2] = {
    {{1, 13}, {2, 7}}, {{1, 1}, {2, 1}}, {{1, 1}, {2, 1}}};

static float *run_all(worker *w)
{
    float *out = calloc((size_t)NSTEPS * L * TMAX * HQ * D, sizeof(float));
    cr_assert_not_null(out);
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_create(w->c, id, NULL), ATTND_ERR_OK);
    for (int k = 0; k < NSTEPS; k++) {
        int64_t next_T =
            k + 1 < NSTEPS ? STEPS[k + 1][0].new_tokens + STEPS[k + 1][1].new_tokens : 0;
        run_step(w, STEPS[k], 2, k, out + (size_t)k * L * TMAX * HQ * D, next_T);
    }
    return out;
}

static int same(const float *a, const float *b)
{
    return memcmp(a, b, (size_t)NSTEPS * L * TMAX * HQ * D * sizeof(float)) == 0;
}

static uint32_t blocks_free(attnd_client *c)
{
    attnd_status st;
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    return st.blocks_free;
}

/* ---------------------------------------------------------------- tests */

Test(stream_e2e, steps_match_attend_bit_for_bit, .timeout = 120)
{
    attnd_daemon_proc d;
    worker a, b, e, f;
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&a, &d, 1);
    worker_open(&b, &d, 0);
    worker_open(&e, &d, 1);
    worker_open(&f, &d, 1);
    e.early = EARLY_BEFORE_BEGIN;
    f.early = EARLY_AHEAD;
    float *via_stream = run_all(&a), *via_attend = run_all(&b), *early = run_all(&e);
    float *ahead = run_all(&f);
    cr_expect(same(via_stream, via_attend), "stream steps equal Attend steps bit for bit");
    cr_expect(same(early, via_attend), "and so do steps whose layer 0 was signalled before "
                                       "StreamBegin answered");
    cr_expect(same(ahead, via_attend), "and steps whose layer 0 was signalled before the "
                                       "previous step's StreamEnd");
    attnd_seq_info info;
    cr_expect_eq(attnd_client_seq_query(a.c, 1, &info), ATTND_ERR_OK);
    cr_expect_eq(info.num_tokens, 15u, "13 + 1 + 1 tokens committed");
    cr_expect_eq(attnd_client_stream_failed(a.s), 0);
    cr_expect_eq(attnd_client_stream_failed(e.s), 0);
    free(via_stream);
    free(via_attend);
    free(early);
    free(ahead);
    worker_close(&a);
    worker_close(&b);
    worker_close(&e);
    worker_close(&f);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}

/* A StreamBegin that fails after the caller's stream went ahead: the caller releases itself. */
Test(stream_e2e, a_failed_begin_behind_queued_work_is_released, .timeout = 120)
{
    attnd_daemon_proc d;
    worker a;
    attnd_step st;
    attnd_ref r[4];
    const attnd_step_seq unknown = {77, 1};
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&a, &d, 1);
    refs_for(&a, 1, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    cr_assert_eq(attnd_client_stream_signal(a.s, 0, NULL), ATTND_ERR_OK);
    cr_expect_eq(attnd_client_stream_begin(a.s, &unknown, 1, &io, 1, &st, NULL),
                 ATTND_ERR_NOT_FOUND);
    attnd_client_stream_release(a.s);
    uint64_t t0 = attnd_clock_ms();
    cr_expect_eq(attnd_client_stream_wait(a.s, 0, NULL), ATTND_ERR_UNAVAILABLE,
                 "the wait passes at once and says its output is void");
    cr_expect_lt(attnd_clock_ms() - t0, 500u, "released, not timed out");
    cr_expect(attnd_client_stream_failed(a.s));
    worker_close(&a);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}

/* A step that signals layer 0 only: its StreamEnd waits for the deadline and gets TIMEOUT. */
static void begin_and_stall(worker *w, uint64_t *step)
{
    attnd_step st;
    attnd_ref r[4];
    const attnd_step_seq s[2] = {{1, 1}, {2, 1}};
    refs_for(w, 2, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    cr_assert_eq(attnd_client_stream_begin(w->s, s, 2, &io, 1, &st, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(w->c));
    fill_inputs(w, 2, 99, 0);
    cr_assert_eq(attnd_client_attend_async(w->s, 0, NULL), ATTND_ERR_OK);
    *step = st.id;
}

Test(stream_e2e, a_stalled_step_times_out_and_others_are_served, .timeout = 120)
{
    attnd_daemon_proc d;
    worker a, b, solo;
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&solo, &d, 1);
    float *ref = run_all(&solo);
    worker_close(&solo);
    worker_open(&a, &d, 1);
    worker_open(&b, &d, 1);
    uint64_t step;
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_create(a.c, id, NULL), ATTND_ERR_OK);
    begin_and_stall(&a, &step);
    float *got = run_all(&b); /* while a's stream waits on layer 1 */
    cr_expect(same(got, ref), "a stalled channel does not touch another session's steps");
    uint64_t t0 = attnd_clock_ms();
    attnd_err rv = attnd_client_stream_end(a.s, step, 0);
    uint64_t waited = attnd_clock_ms() - t0;
    cr_expect_eq(rv, ATTND_ERR_TIMEOUT, "%s: %s", attnd_err_name(rv), attnd_client_last_error(a.c));
    cr_expect(strstr(attnd_client_last_error(a.c), "stream_timeout_ms") != NULL, "%s",
              attnd_client_last_error(a.c));
    cr_expect_lt(waited, 5000u, "answered by the deadline (800 ms) and a tick, not later");
    cr_expect(attnd_client_stream_failed(a.s));
    attnd_seq_info info;
    cr_expect_eq(attnd_client_seq_query(a.c, 1, &info), ATTND_ERR_OK);
    cr_expect_eq(info.num_tokens, 0u, "the released step was aborted");
    cr_expect_eq(info.step, 0u);
    attnd_step st;
    attnd_ref r[4];
    refs_for(&a, 1, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    const attnd_step_seq one = {1, 1};
    rv = attnd_client_stream_begin(a.s, &one, 1, &io, 1, &st, NULL);
    cr_expect_eq(rv, ATTND_ERR_FAILED_PRECONDITION, "a failed channel takes no step");
    cr_expect(strstr(attnd_client_last_error(a.c), "open a new one") != NULL, "%s",
              attnd_client_last_error(a.c));
    /* a new channel of the same session works, from the sequences as they were */
    attnd_client_stream_close(a.s);
    cr_assert_eq(attnd_client_stream_open(a.c, &a.s), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(a.c));
    float *again = calloc((size_t)NSTEPS * L * TMAX * HQ * D, sizeof(float));
    for (int k = 0; k < NSTEPS; k++)
        run_step(&a, STEPS[k], 2, k, again + (size_t)k * L * TMAX * HQ * D, 0);
    cr_expect(same(again, ref), "the reopened channel serves as a fresh one");
    free(ref);
    free(got);
    free(again);
    worker_close(&a);
    worker_close(&b);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}

Test(stream_e2e, aborts, .timeout = 120)
{
    attnd_daemon_proc d;
    worker a;
    attnd_step st;
    attnd_ref r[4];
    attnd_seq_info info;
    const attnd_step_seq s[2] = {{1, 3}, {2, 2}};
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&a, &d, 1);
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_create(a.c, id, NULL), ATTND_ERR_OK);
    refs_for(&a, 5, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    /* after the stream ran every layer: a clean abort, the channel stays usable */
    cr_assert_eq(attnd_client_stream_begin(a.s, s, 2, &io, 1, &st, NULL), ATTND_ERR_OK);
    for (uint32_t l = 0; l < L; l++)
        cr_assert_eq(attnd_client_attend_async(a.s, l, NULL), ATTND_ERR_OK);
    cr_expect_eq(attnd_client_stream_end(a.s, st.id, 1), ATTND_ERR_OK);
    cr_expect_eq(attnd_client_stream_failed(a.s), 0);
    cr_expect_eq(attnd_client_seq_query(a.c, 1, &info), ATTND_ERR_OK);
    cr_expect_eq(info.num_tokens, 0u, "aborted: nothing committed");
    /* while layers are still queued: released, the abort succeeds, the channel fails */
    cr_assert_eq(attnd_client_stream_begin(a.s, s, 2, &io, 1, &st, NULL), ATTND_ERR_OK);
    cr_expect_eq(attnd_client_stream_end(a.s, st.id, 1), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(a.c));
    cr_expect_eq(attnd_client_seq_query(a.c, 2, &info), ATTND_ERR_OK);
    cr_expect_eq(info.num_tokens, 0u);
    cr_expect_eq(info.step, 0u, "the step is gone");
    cr_expect_eq(attnd_client_stream_begin(a.s, s, 2, &io, 1, &st, NULL),
                 ATTND_ERR_FAILED_PRECONDITION);
    cr_expect_eq(blocks_free(a.c), NBLOCKS, "every reserved block came back");
    worker_close(&a);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}

/* ---------------------------------------------------------------- a worker killed mid-step */

#define CHILD_URL_ENV "ATTND_STREAM_E2E_CHILD_URL"
#define CHILD_FD_ENV "ATTND_STREAM_E2E_CHILD_FD"

/* The re-executed child: a stream step over one sequence, layer 0 signalled and answered, then
 * it tells its session id and waits to be killed. */
__attribute__((constructor)) static void child_main(void)
{
    const char *url = getenv(CHILD_URL_ENV), *fds = getenv(CHILD_FD_ENV);
    attnd_daemon_proc d;
    worker w;
    attnd_step st;
    attnd_ref r[4];
    const attnd_step_seq s = {1, 4};
    if (url == NULL || fds == NULL) return;
    memset(&d, 0, sizeof d);
    snprintf(d.url, sizeof d.url, "%s", url);
    memset(&w, 0, sizeof w);
    if ((w.c = attnd_daemon_connect(&d, 5000)) == NULL) _exit(2);
    if (attnd_client_shm_create(w.c, IO_BYTES, &w.io) != ATTND_ERR_OK ||
        attnd_client_stream_open(w.c, &w.s) != ATTND_ERR_OK ||
        attnd_client_seq_create(w.c, 1, NULL) != ATTND_ERR_OK)
        _exit(3);
    refs_for(&w, 4, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    if (attnd_client_stream_begin(w.s, &s, 1, &io, 1, &st, NULL) != ATTND_ERR_OK) _exit(4);
    fill_inputs(&w, 4, 7, 0);
    if (attnd_client_attend_async(w.s, 0, NULL) != ATTND_ERR_OK) _exit(5);
    uint64_t session = attnd_client_session(w.c);
    if (write(atoi(fds), &session, sizeof session) != (ssize_t)sizeof session) _exit(6);
    for (;;)
        pause();
}

static pid_t spawn_child(const attnd_daemon_proc *d, uint64_t *session)
{
    return attnd_test_spawn_self("test_stream_e2e_child", CHILD_URL_ENV, CHILD_FD_ENV, d->url,
                                 session);
}

static int log_has(const attnd_daemon_proc *d, const char *needle)
{
    char buf[1 << 16];
    FILE *f = fopen(d->log_path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

Test(stream_e2e, a_worker_killed_mid_step_leaves_the_other_untouched, .timeout = 120)
{
    attnd_daemon_proc d;
    worker solo, b;
    uint64_t child_session = 0;
    int status = 0;
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&solo, &d, 1);
    float *ref = run_all(&solo);
    worker_close(&solo);
    pid_t child = spawn_child(&d, &child_session);
    worker_open(&b, &d, 1);
    float *got = calloc((size_t)NSTEPS * L * TMAX * HQ * D, sizeof(float));
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_create(b.c, id, NULL), ATTND_ERR_OK);
    run_step(&b, STEPS[0], 2, 0, got, 0);
    cr_assert_eq(kill(child, SIGKILL), 0);
    cr_assert_eq(waitpid(child, &status, 0), child);
    for (int k = 1; k < NSTEPS; k++)
        run_step(&b, STEPS[k], 2, k, got + (size_t)k * L * TMAX * HQ * D, 0);
    cr_expect(same(got, ref), "the surviving worker is bit-identical to a solo run");
    for (int i = 0; i < 100 && !log_has(&d, "why=\"a disconnect\""); i++)
        usleep(20000);
    cr_expect(log_has(&d, "event=stream_release"), "the dead worker's step was released");
    cr_expect(log_has(&d, "why=\"a disconnect\""));
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_free(b.c, id), ATTND_ERR_OK);
    uint32_t free_now = 0;
    for (int i = 0; i < 100 && (free_now = blocks_free(b.c)) != NBLOCKS; i++)
        usleep(20000); /* the child's session is reclaimed after 200 ms */
    cr_expect_eq(free_now, NBLOCKS, "every block back, the killed step's included");
    free(ref);
    free(got);
    worker_close(&b);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}

/* ---------------------------------------------------------------- the daemon killed mid-step */

/* The daemon dies with the worker's wait for layer 1 pending. The channel's own timeout is 60 s,
 * past this test's 30: only the lost connection (the client's socket hook writing the worker's
 * words) can end that wait, and it must end with an error, not an output. */
Test(stream_e2e, a_daemon_killed_mid_step_fails_the_waiting_worker, .timeout = 30)
{
    attnd_daemon_proc d;
    worker w;
    attnd_step st;
    attnd_ref r[4];
    const attnd_step_seq s = {1, 4};
    attnd_test_daemon_start(&d, CONFIG_WITH_TIMEOUT("", "60000"));
    worker_open(&w, &d, 1);
    cr_assert_eq(attnd_client_seq_create(w.c, 1, NULL), ATTND_ERR_OK);
    refs_for(&w, 4, r);
    attnd_stream_layer io = {&r[0], &r[1], &r[2], &r[3], NULL};
    cr_assert_eq(attnd_client_stream_begin(w.s, &s, 1, &io, 1, &st, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(w.c));
    fill_inputs(&w, 4, 0, 0);
    cr_assert_eq(attnd_client_attend_async(w.s, 0, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(w.c));
    cr_assert_eq(attnd_daemon_signal(&d, SIGKILL), 0);
    fill_inputs(&w, 4, 0, 1);
    cr_assert_eq(attnd_client_attend_async(w.s, 1, NULL), ATTND_ERR_UNAVAILABLE, "%s",
                 attnd_client_last_error(w.c));
    cr_expect(strstr(attnd_client_last_error(w.c), "released") != NULL, "%s",
              attnd_client_last_error(w.c));
    cr_expect(attnd_client_stream_failed(w.s));
    cr_expect_neq(attnd_client_stream_end(w.s, st.id, 0), ATTND_ERR_OK);
    worker_close(&w);
    cr_expect_eq(attnd_daemon_stop(&d), 128 + SIGKILL);
}

/* ---------------------------------------------------------------- refusals */

Test(stream_e2e, refusals, .timeout = 120)
{
    attnd_daemon_proc d;
    worker a;
    attnd_step st;
    attnd_ref r[4], inl;
    float buf[HQ * D] = {0};
    const int64_t qs[3] = {1, HQ, D};
    const attnd_step_seq s = {1, 1};
    attnd_test_daemon_start(&d, CONFIG);
    worker_open(&a, &d, 1);
    cr_assert_eq(attnd_client_seq_create(a.c, 1, NULL), ATTND_ERR_OK);
    refs_for(&a, 1, r);
    attnd_ref_inline_in(&inl, buf, ATTND_DTYPE_F32, 3, qs);
    attnd_stream_layer bad = {&inl, &r[1], &r[2], &r[3], NULL};
    cr_expect_eq(attnd_client_stream_begin(a.s, &s, 1, &bad, 1, &st, NULL),
                 ATTND_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(attnd_client_last_error(a.c), "q: INLINE") != NULL, "%s",
              attnd_client_last_error(a.c));
    attnd_stream_layer io[3] = {{&r[0], &r[1], &r[2], &r[3], NULL},
                                {&r[0], &r[1], &r[2], &r[3], NULL},
                                {&r[0], &r[1], &r[2], &r[3], NULL}};
    cr_expect_eq(attnd_client_stream_begin(a.s, &s, 1, io, 3, &st, NULL),
                 ATTND_ERR_INVALID_ARGUMENT, "3 layer entries for 2 layers");
    cr_expect_eq(attnd_client_stream_signal(a.s, 0, (void *)&st), ATTND_ERR_INVALID_ARGUMENT,
                 "a CPU daemon takes no CUDA stream");
    cr_expect_eq(attnd_client_stream_signal(a.s, L, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_client_stream_begin(a.s, &s, 1, io, 2, &st, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(a.c));
    cr_expect_eq(attnd_client_step_end(a.c, st.id, 0), ATTND_ERR_FAILED_PRECONDITION,
                 "EndStep does not end a stream step");
    cr_expect_eq(attnd_client_attend(a.c, st.id, 0, &r[0], &r[1], &r[2], &r[3], NULL),
                 ATTND_ERR_FAILED_PRECONDITION, "nor does Attend run one of its layers");
    cr_expect_eq(attnd_client_region_unregister(a.c, a.io.region), ATTND_ERR_FAILED_PRECONDITION,
                 "regions stay while a stream step may use them");
    for (uint32_t l = 0; l < L; l++)
        cr_assert_eq(attnd_client_attend_async(a.s, l, NULL), ATTND_ERR_OK);
    cr_expect_eq(attnd_client_stream_end(a.s, st.id + 1, 0), ATTND_ERR_NOT_FOUND);
    cr_expect_eq(attnd_client_stream_end(a.s, st.id, 0), ATTND_ERR_OK);
    worker_close(&a);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");

    attnd_test_daemon_start(&d, CONFIG_WITH(", \"streams\": 0"));
    attnd_client *c = attnd_test_connect(&d);
    attnd_client_stream *s0 = NULL;
    cr_expect_eq(attnd_client_stream_open(c, &s0), ATTND_ERR_UNAVAILABLE);
    cr_expect(strstr(attnd_client_last_error(c), "server.streams") != NULL, "%s",
              attnd_client_last_error(c));
    cr_expect_null(s0);
    attnd_client_free(c);
    cr_expect_eq(attnd_daemon_stop(&d), 0, "clean exit");
}
