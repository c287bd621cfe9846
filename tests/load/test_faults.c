/* Fault tests against the real daemon: a client killed in the middle of a step (its sequences
 * reclaimed after the timeout, the others untouched), SIGTERM under load (every request the
 * daemon accepted answered, every answer delivered), SIGHUP with a changed and with an invalid
 * configuration (the invalid one is logged and the old configuration kept), and the operator
 * HTTP endpoint of a running daemon (/healthz, /status, /metrics after real traffic). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>

#include "loadutil.h"

#define FAULT_CONFIG(extra)                                                                        \
    "{\"backend\": \"cpu\", \"threads\": 1,"                                                       \
    " \"server\": {\"listen\": \"@URL@\", \"drain_timeout_ms\": 10000},"                           \
    " \"http\": {\"listen\": \"http://127.0.0.1:0\"},"                                             \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 32}," extra                                                          \
    " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}"

#define RECLAIM_LIMITS " \"limits\": {\"reclaim_timeout_ms\": 600},"

static attnd_status status_of(const attnd_daemon_proc *d)
{
    attnd_status st;
    attnd_client *c = attnd_daemon_connect(d, 5000);
    cr_assert_not_null(c);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    attnd_client_free(c);
    return st;
}

static uint16_t http_port(const attnd_daemon_proc *d)
{
    cr_assert_eq(lu_log_wait(d, "event=http_listen", 5000), 0);
    long long port = lu_log_value(d, "event=http_listen", "port");
    cr_assert_gt(port, 0);
    return (uint16_t)port;
}

/* Start the fault client, wait until it is in the middle of its step; returns its pid and
 * its session. */
static pid_t start_fault_client(const attnd_daemon_proc *d, unsigned long long *session)
{
    char line[128] = "";
    pid_t pid = lu_spawn("attnd_fault_client", d->url, NULL, line, sizeof line);
    cr_assert(pid > 0 && sscanf(line, "mid-step session=%llu", session) == 1,
              "the fault client did not reach the middle of its step");
    return pid;
}

Test(faults, killed_client_is_reclaimed_and_others_unaffected, .timeout = 120)
{
    attnd_daemon_proc d;
    char why[256] = "";
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG(RECLAIM_LIMITS)), 0);
    attnd_client *b = attnd_daemon_connect(&d, 5000);
    cr_assert_not_null(b);
    cr_assert_eq(attnd_client_seq_create(b, 100, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(b, 100, 10, 1.5f, why, sizeof why), 0, "%s", why);

    unsigned long long session = 0;
    char line[96];
    pid_t victim = start_fault_client(&d, &session);
    attnd_status st = status_of(&d);
    /* B: 1 block; the victim: 5 tokens (1 block) and 17 tokens (2 blocks), mid-step */
    cr_assert_eq(st.num_sequences, 3);
    cr_assert_eq(st.blocks_free, st.geometry.num_blocks - 4);
    int status;
    cr_assert_eq(kill(victim, SIGKILL), 0);
    cr_assert_eq(waitpid(victim, &status, 0), victim);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    int64_t killed_at = lu_now_ms();

    /* not at once: the session may come back within the reclaim timeout (600 ms) */
    lu_sleep_ms(200);
    cr_assert_eq(status_of(&d).num_sequences, 3, "reclaimed before the timeout");
    while ((st = status_of(&d)).num_sequences != 1 && lu_now_ms() - killed_at < 10000)
        lu_sleep_ms(50);
    cr_assert_eq(st.num_sequences, 1, "the killed client's sequences were not reclaimed");
    cr_assert_eq(st.blocks_free, st.geometry.num_blocks - 1);
    cr_assert_geq(lu_now_ms() - killed_at, 500);
    snprintf(line, sizeof line, "event=reclaim session=%llu seqs=2 ", session);
    cr_assert_eq(lu_log_count(&d, line), 1);

    /* B goes on: its cache is intact (V of every token is still 1.5) */
    attnd_seq_info info;
    cr_assert_eq(attnd_client_seq_query(b, 100, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 10);
    cr_assert_eq(lu_step_const_v(b, 100, 1, 1.5f, why, sizeof why), 0, "%s", why);
    cr_assert_eq(attnd_client_seq_query(b, 100, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 11);

    char *body = NULL;
    cr_assert_eq(lu_http_get(http_port(&d), "/metrics", &body), 200);
    /* the victim's session, and the one daemon_proc's readiness check left behind */
    cr_assert_geq(lu_metric(body, "attnd_sessions_reclaimed_total"), 1.0);
    free(body);
    attnd_client_free(b);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- SIGTERM under load */

#define LOADERS 6

typedef struct loader {
    const attnd_daemon_proc *d;
    int idx;
    atomic_int *started;
    uint64_t sent, replies, ok, unavailable, other, unanswered, bad;
} loader;

static void *loader_main(void *p)
{
    loader *l = p;
    uint32_t s;
    Attnd__Reply *rep = NULL;
    if (lu_raw_open(l->d->url, 3000, &s) != 0) return NULL;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello hello = ATTND__HELLO__INIT;
    Attnd__CreateSequence cr = ATTND__CREATE_SEQUENCE__INIT;
    Attnd__FreeSequence fr = ATTND__FREE_SEQUENCE__INIT;
    hello.protocol_version = 1;
    req.id = 1;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &hello;
    if (lu_raw_call(s, &req, &rep) != 0 || rep->code != ATTND_ERR_OK) {
        l->bad++;
        if (rep) attnd__reply__free_unpacked(rep, NULL);
        lu_raw_close(s);
        return NULL;
    }
    req.session = rep->hello->session;
    attnd__reply__free_unpacked(rep, NULL);
    atomic_fetch_add(l->started, 1);
    for (uint64_t i = 2;; i++) {
        req.id = i;
        if (i % 2 == 0) {
            cr.seq_id = i;
            req.body_case = ATTND__REQUEST__BODY_CREATE;
            req.create = &cr;
        } else {
            fr.seq_id = i - 1;
            req.body_case = ATTND__REQUEST__BODY_FREE;
            req.free = &fr;
        }
        int rc = lu_raw_call(s, &req, &rep);
        if (rc == -1) break; /* the connection is gone: never sent */
        l->sent++;
        if (rc == -2) {
            l->unanswered++;
            break;
        }
        l->replies++;
        if (rep->id != req.id) l->bad++;
        if (rep->code == ATTND_ERR_OK)
            l->ok++;
        else if (rep->code == ATTND_ERR_UNAVAILABLE)
            l->unavailable++;
        else
            l->other++;
        int stop = rep->code == ATTND_ERR_UNAVAILABLE;
        attnd__reply__free_unpacked(rep, NULL);
        if (stop) break; /* a client told "shutting down" stops, as the client library does */
    }
    lu_raw_close(s);
    return NULL;
}

Test(faults, sigterm_under_load_answers_every_accepted_request, .timeout = 120)
{
    attnd_daemon_proc d;
    pthread_t th[LOADERS];
    loader ls[LOADERS];
    atomic_int started = 0;
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG("")), 0);
    uint64_t before = status_of(&d).requests + 1; /* what the daemon answered, this included */
    for (int i = 0; i < LOADERS; i++) {
        ls[i] = (loader){.d = &d, .idx = i, .started = &started};
        cr_assert_eq(pthread_create(&th[i], NULL, loader_main, &ls[i]), 0);
    }
    while (atomic_load(&started) < LOADERS)
        lu_sleep_ms(5);
    lu_sleep_ms(500);
    cr_assert_eq(attnd_daemon_signal(&d, SIGTERM), 0);
    int rc = attnd_daemon_wait(&d, 30000);
    uint64_t replies = LOADERS, sent = 0, unanswered = 0, ok = 0, unavailable = 0;
    for (int i = 0; i < LOADERS; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(ls[i].bad, 0, "loader %d: a reply to another request", i);
        cr_assert_eq(ls[i].other, 0, "loader %d: a reply neither OK nor UNAVAILABLE", i);
        replies += ls[i].replies, sent += ls[i].sent, unanswered += ls[i].unanswered;
        ok += ls[i].ok, unavailable += ls[i].unavailable;
    }
    cr_assert_eq(rc, 0, "the daemon did not exit cleanly after SIGTERM");
    long long answered = lu_log_value(&d, "event=final_stats", "requests");
    long long inflight = lu_log_value(&d, "event=final_stats", "inflight");
    cr_log_info("sigterm: sent %llu, replies %llu (ok %llu, unavailable %llu), unanswered %llu, "
                "daemon answered %lld",
                (unsigned long long)sent, (unsigned long long)replies, (unsigned long long)ok,
                (unsigned long long)unavailable, (unsigned long long)unanswered, answered);
    cr_assert_gt(ok, 100, "the load did not run");
    cr_assert_eq(inflight, 0, "the daemon exited with accepted requests unanswered");
    /* every answer the daemon sent reached its client: nothing lost in the close */
    cr_assert_eq((uint64_t)answered, before + replies - 0, "daemon answered %lld, clients got %llu",
                 answered, (unsigned long long)(before + replies));
    cr_assert_eq(lu_log_count(&d, "event=drain"), 1);
    unlink(d.log_path);
    unlink(d.config_path);
    unlink(d.sock_path);
}

/* ---------------------------------------------------------------- SIGHUP */

static void write_config(const attnd_daemon_proc *d, const char *text)
{
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s.new", d->config_path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    /* the URL placeholder as attnd_daemon_start filled it */
    for (const char *p = text; *p; p++) {
        if (strncmp(p, "@URL@", 5) == 0) {
            fputs(d->url, f);
            p += 4;
        } else {
            fputc(*p, f);
        }
    }
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(tmp, d->config_path), 0);
}

static attnd_err create_n(const attnd_daemon_proc *d, int n)
{
    attnd_client *c = attnd_daemon_connect(d, 5000);
    attnd_err rv = ATTND_ERR_OK;
    cr_assert_not_null(c);
    for (int i = 1; i <= n && rv == ATTND_ERR_OK; i++)
        rv = attnd_client_seq_create(c, (uint64_t)i, NULL);
    attnd_client_free(c);
    return rv;
}

Test(faults, sighup_applies_a_changed_config_and_keeps_the_old_on_an_invalid_one, .timeout = 120)
{
    attnd_daemon_proc d;
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG(RECLAIM_LIMITS)), 0);
    uint16_t port = http_port(&d);
    cr_assert_eq(create_n(&d, 3), ATTND_ERR_OK);

    /* a live key (limits.max_seqs) and a restart-only one (geometry.num_blocks) */
    write_config(&d, "{\"backend\": \"cpu\", \"threads\": 1,"
                     " \"server\": {\"listen\": \"@URL@\"},"
                     " \"http\": {\"listen\": \"http://127.0.0.1:0\"},"
                     " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"
                     " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\","
                     " \"num_blocks\": 512, \"max_blocks_per_seq\": 32},"
                     " \"limits\": {\"max_seqs\": 2, \"reclaim_timeout_ms\": 0},"
                     " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}");
    cr_assert_eq(attnd_daemon_signal(&d, SIGHUP), 0);
    cr_assert_eq(lu_log_wait(&d, "event=reload applied=live", 5000), 0);
    cr_assert_eq(lu_log_count(&d, "restart_needed=\"geometry.num_blocks\""), 1);
    lu_sleep_ms(200); /* the executor applies the live keys */
    cr_assert_neq(create_n(&d, 3), ATTND_ERR_OK, "limits.max_seqs = 2 not applied");
    cr_assert_eq(create_n(&d, 2), ATTND_ERR_OK);
    cr_assert_eq(status_of(&d).geometry.num_blocks, 256, "a restart-only key changed live");

    /* invalid: not JSON, then an unknown key; the daemon keeps serving on the old config */
    write_config(&d, "{\"limits\": {\"max_seqs\": 100,");
    cr_assert_eq(attnd_daemon_signal(&d, SIGHUP), 0);
    cr_assert_eq(lu_log_wait(&d, "event=reload_failed", 5000), 0);
    write_config(&d, "{\"limits\": {\"max_seqz\": 100}}");
    cr_assert_eq(attnd_daemon_signal(&d, SIGHUP), 0);
    int64_t t0 = lu_now_ms();
    while (lu_log_count(&d, "event=reload_failed") < 2 && lu_now_ms() - t0 < 5000)
        lu_sleep_ms(10);
    cr_assert_eq(lu_log_count(&d, "event=reload_failed"), 2);
    cr_assert_eq(lu_log_count(&d, "limits.max_seqz"), 1, "the log does not say why");
    cr_assert_eq(lu_log_count(&d, "kept=old"), 2);
    cr_assert_neq(create_n(&d, 3), ATTND_ERR_OK, "the old configuration was not kept");
    cr_assert_eq(create_n(&d, 2), ATTND_ERR_OK);

    char *body = NULL;
    cr_assert_eq(lu_http_get(port, "/metrics", &body), 200);
    cr_assert_eq(lu_metric(body, "attnd_config_reloads_total"), 1.0);
    cr_assert_eq(lu_metric(body, "attnd_config_reload_failures_total"), 2.0);
    free(body);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- the HTTP endpoint, for real */

Test(faults, http_endpoint_reports_the_running_daemon, .timeout = 120)
{
    attnd_daemon_proc d;
    char *body = NULL, why[256];
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG("")), 0);
    uint16_t port = http_port(&d);
    attnd_client *c = attnd_daemon_connect(&d, 5000);
    cr_assert_eq(attnd_client_seq_create(c, 9, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(c, 9, 20, 0.5f, why, sizeof why), 0, "%s", why);
    cr_assert_eq(lu_step_const_v(c, 9, 1, 0.5f, why, sizeof why), 0, "%s", why);
    cr_assert_eq(attnd_client_seq_free(c, 77), ATTND_ERR_NOT_FOUND);
    lu_sleep_ms(300); /* the gauges refresh every tick */

    cr_assert_eq(lu_http_get(port, "/healthz", &body), 200);
    cr_assert_str_eq(body, "ok\n");
    free(body);
    cr_assert_eq(lu_http_get(port, "/status", &body), 200);
    cr_assert_not_null(strstr(body, "\"backend\":\"cpu\""), "%s", body);
    cr_assert_not_null(strstr(body, "\"blocks\":{\"used\":2,\"free\":254}"), "%s", body);
    cr_assert_not_null(strstr(body, "\"sequences\":1,"), "%s", body);
    cr_assert_not_null(strstr(body, "\"clients\":1,"), "%s", body);
    cr_assert_not_null(strstr(body, "\"num_blocks\":256"), "%s", body);
    free(body);
    cr_assert_eq(lu_http_get(port, "/metrics", &body), 200);
    cr_assert_eq(lu_metric(body, "attnd_requests_total{type=\"attend\",code=\"OK\"}"), 4.0);
    cr_assert_eq(lu_metric(body, "attnd_requests_total{type=\"free\",code=\"NOT_FOUND\"}"), 1.0);
    cr_assert_eq(lu_metric(body, "attnd_request_duration_seconds_count{type=\"begin_step\"}"), 2.0);
    cr_assert_eq(lu_metric(body, "attnd_blocks_used"), 2.0);
    cr_assert_eq(lu_metric(body, "attnd_sequences"), 1.0);
    cr_assert_eq(lu_metric(body, "attnd_connections"), 1.0);
    cr_assert_eq(lu_metric(body, "attnd_kernel_launches_total{kind=\"cache_write\"}"), 4.0);
    /* 20 new tokens: prefill (2D); then one token: decode (2D or 3D by the planner) */
    cr_assert_geq(lu_metric(body, "attnd_kernel_launches_total{kind=\"2d\"}"), 2.0);
    cr_assert_gt(lu_metric(body, "attnd_kernel_seconds_total{kind=\"2d\"}"), 0.0);
    cr_assert_gt(lu_metric(body, "attnd_kernel_bytes_total{kind=\"2d\"}"), 0.0);
    cr_assert_gt(lu_metric(body, "attnd_wire_bytes_total{direction=\"rx\"}"), 20 * 8 * 64 * 4);
    cr_assert_eq(
        lu_metric(body, "attnd_build_info{version=\"" ATTND_TEST_VERSION "\",backend=\"cpu\"}"),
        1.0);
    free(body);
    attnd_client_free(c);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- systemd notifications */

/* A datagram socket standing in for systemd's; the daemon inherits NOTIFY_SOCKET. */
static int fake_systemd(char *path, size_t n)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(path, n, "/tmp/attnd-notify-%d.sock", (int)getpid());
    unlink(path);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* The next notification that starts with prefix (others skipped); 0 when it came. */
static int expect_notification(int fd, const char *prefix, char *got, size_t n)
{
    for (int i = 0; i < 1000; i++) {
        ssize_t k = recv(fd, got, n - 1, 0);
        if (k <= 0) return -1;
        got[k] = '\0';
        if (strncmp(got, prefix, strlen(prefix)) == 0) return 0;
    }
    return -1;
}

Test(faults, systemd_gets_ready_watchdog_reloading_and_stopping, .timeout = 120)
{
    attnd_daemon_proc d;
    char path[108], got[512];
    int fd = fake_systemd(path, sizeof path);
    cr_assert_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
    cr_assert_eq(setenv("WATCHDOG_USEC", "400000", 1), 0); /* a ping at least every 200 ms */
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG("")), 0);
    cr_assert_eq(expect_notification(fd, "READY=1", got, sizeof got), 0);
    cr_assert_not_null(strstr(got, "STATUS=serving ipc://"), "%s", got);
    int64_t t0 = lu_now_ms();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(expect_notification(fd, "WATCHDOG=1", got, sizeof got), 0);
    cr_assert_lt(lu_now_ms() - t0, 2000, "three watchdog pings took too long");
    cr_assert_eq(attnd_daemon_signal(&d, SIGHUP), 0);
    cr_assert_eq(expect_notification(fd, "RELOADING=1", got, sizeof got), 0);
    cr_assert_eq(expect_notification(fd, "READY=1", got, sizeof got), 0);
    cr_assert_eq(attnd_daemon_signal(&d, SIGTERM), 0);
    cr_assert_eq(expect_notification(fd, "STOPPING=1", got, sizeof got), 0);
    cr_assert_eq(attnd_daemon_wait(&d, 20000), 0);
    close(fd);
    unlink(path);
    unlink(d.log_path);
    unlink(d.config_path);
}

/* ---------------------------------------------------------------- log rate limiting */

Test(faults, repeated_errors_are_rate_limited_in_the_log, .timeout = 120)
{
    attnd_daemon_proc d;
    uint32_t s;
    char *body = NULL;
    cr_assert_eq(attnd_daemon_start(&d, FAULT_CONFIG("")), 0);
    uint16_t port = http_port(&d);
    cr_assert_eq(lu_raw_open(d.url, 5000, &s), 0);
    /* 200 undecodable messages in a burst, each answered PROTOCOL */
    nng_socket sock = {.id = s};
    for (int i = 0; i < 200; i++) {
        static const char junk[] = "\xff\xff\xff\xff not a request";
        nng_msg *m = NULL;
        cr_assert_eq(nng_send(sock, (void *)junk, sizeof junk - 1, 0), 0);
        cr_assert_eq(nng_recvmsg(sock, &m, 0), 0);
        Attnd__Reply *rep = attnd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        cr_assert(rep != NULL && rep->code == ATTND_ERR_PROTOCOL);
        attnd__reply__free_unpacked(rep, NULL);
        nng_msg_free(m);
    }
    lu_raw_close(s);
    int lines = lu_log_count(&d, "code=PROTOCOL");
    cr_assert_geq(lines, 1);
    cr_assert_leq(lines, 12, "%d log lines for 200 identical errors", lines);
    cr_assert_eq(lu_http_get(port, "/metrics", &body), 200);
    cr_assert_eq(lu_metric(body, "attnd_requests_total{type=\"invalid\",code=\"PROTOCOL\"}"),
                 200.0);
    cr_assert_eq(lu_metric(body, "attnd_log_suppressed_total"), 200.0 - lines);
    free(body);
    /* another kind of error still gets its line at once */
    attnd_client *c = attnd_daemon_connect(&d, 5000);
    cr_assert_eq(attnd_client_seq_free(c, 12345), ATTND_ERR_NOT_FOUND);
    attnd_client_free(c);
    cr_assert_eq(lu_log_wait(&d, "body=free code=NOT_FOUND", 2000), 0);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
