/* Lock-outs (issue 13): nothing one client does keeps the others out. One connection holds a
 * bounded number of sessions; a session with no sequences is reclaimed as soon as its connection
 * drops, so fast connect/Hello/close cycles leave room for the next client; a request decodes
 * into bounded memory, and a small one until Hello; a client that does not read its replies
 * holds nothing for long, and /healthz says when nothing is served; half-open HTTP requests
 * hold no fds for good. Real bytes on real sockets against the real daemon. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>

#include "loadutil.h"
#include "pbwire.h"

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

/* ---------------------------------------------------------------- memory (item 9) */

/* Request{id, session, begin_step: BeginStep{seqs: n empty StepSeq}}: 2 bytes on the wire per
 * entry, one allocated struct (and a pointer) each once decoded. */
static nng_msg *begin_step_of_empty_entries(size_t n, uint64_t id, uint64_t session)
{
    uint8_t head[40];
    size_t h = 0;
    nng_msg *m = NULL;
    head[h++] = 0x08; /* id */
    h += attnd_pb_put_varint(head + h, id);
    head[h++] = 0x10; /* session */
    h += attnd_pb_put_varint(head + h, session);
    head[h++] = 0x92; /* begin_step = 18, length-delimited */
    head[h++] = 0x01;
    h += attnd_pb_put_varint(head + h, 2 * n);
    cr_assert_eq(nng_msg_alloc(&m, h + 2 * n), 0);
    uint8_t *p = nng_msg_body(m);
    memcpy(p, head, h);
    for (size_t i = 0; i < n; i++) {
        p[h + 2 * i] = 0x0a; /* seqs = 1, length-delimited */
        p[h + 2 * i + 1] = 0x00;
    }
    return m;
}

/* Send m on a raw socket and return the reply's code (its message into msg). */
static uint32_t send_raw_msg(uint32_t sock, nng_msg *m, char *msg, size_t n)
{
    nng_socket s = {.id = sock};
    cr_assert_eq(nng_sendmsg(s, m, 0), 0);
    cr_assert_eq(nng_recvmsg(s, &m, 0), 0, "no reply");
    Attnd__Reply *rep = attnd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    cr_assert_not_null(rep);
    snprintf(msg, n, "%s", rep->message ? rep->message : "");
    uint32_t code = rep->code;
    attnd__reply__free_unpacked(rep, NULL);
    return code;
}

Test(lockout, a_60_mib_request_of_empty_entries_allocates_nothing_big, .timeout = 180)
{
    attnd_daemon_proc d;
    uint32_t s;
    char msg[512];
    const size_t entries = 30u << 20; /* 60 MiB on the wire */
    cr_assert_eq(attnd_daemon_start(&d, LOCKOUT_CONFIG("", "")), 0);
    long hwm0 = lu_hwm_kib(d.pid);
    cr_assert_gt(hwm0, 0);
    cr_assert_eq(lu_raw_open(d.url, 60000, &s), 0);
    /* before any Hello: refused for its size before it is decoded */
    uint32_t code = send_raw_msg(s, begin_step_of_empty_entries(entries, 1, 0), msg, sizeof msg);
    long hwm1 = lu_hwm_kib(d.pid);
    fprintf(stderr, "lockout: before Hello: %u \"%s\", peak RSS %ld -> %ld KiB\n", code, msg, hwm0,
            hwm1);
    cr_assert_neq(code, ATTND_ERR_OK);
    cr_assert_not_null(strstr(msg, "Hello"), "\"%s\" does not say Hello comes first", msg);
    /* the message itself (60 MiB) is held once; its decoded form would be 2.8 GB */
    cr_assert_lt(hwm1 - hwm0, 160 * 1024, "peak RSS grew by %ld KiB", hwm1 - hwm0);

    /* after Hello: the element count is bounded before anything is allocated */
    Attnd__Reply *rep = hello_raw(s, 2);
    cr_assert_eq(rep->code, ATTND_ERR_OK);
    uint64_t session = rep->hello->session;
    attnd__reply__free_unpacked(rep, NULL);
    code = send_raw_msg(s, begin_step_of_empty_entries(entries, 3, session), msg, sizeof msg);
    long hwm2 = lu_hwm_kib(d.pid);
    fprintf(stderr, "lockout: after Hello: %u \"%s\", peak RSS %ld -> %ld KiB\n", code, msg, hwm0,
            hwm2);
    cr_assert_eq(code, ATTND_ERR_PROTOCOL, "%u: %s", code, msg);
    cr_assert_not_null(strstr(msg, "elements"), "\"%s\" does not name the element count", msg);
    cr_assert_lt(hwm2 - hwm0, 160 * 1024, "peak RSS grew by %ld KiB", hwm2 - hwm0);
    lu_raw_close(s);
    /* and it serves on */
    attnd_client *c = NULL;
    char why[256];
    cr_assert_eq(hello_within(&d, 5000, &c), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(c, 1, 3, 0.5f, why, sizeof why), 0, "%s", why);
    attnd_client_free(c);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- clients that never read (item 7)
 */

/* A raw connection that sends Status requests and never reads a reply, until the daemon stops
 * taking them (both directions' buffers full) or `most` are sent; returns how many it sent. */
static int flood_status(int fd, int most)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    int sent = 0;
    int64_t idle_since = lu_now_ms();
    while (sent < most && lu_now_ms() - idle_since < 500) {
        req.id = (uint64_t)sent + 1;
        int rc = lu_sp_send(fd, (uint32_t)sent + 1, &req, 1);
        if (rc < 0) break;
        if (rc == 1) {
            lu_sleep_ms(5);
            continue;
        }
        sent++;
        idle_since = lu_now_ms();
    }
    return sent;
}

/* A well-behaved client's Hello, 20 Status calls and a step, each call within 5 s. */
static void good_client_served(const attnd_daemon_proc *d, const char *while_what)
{
    attnd_client *c = NULL;
    attnd_status st;
    char why[256];
    attnd_err rv = hello_within(d, 5000, &c);
    cr_assert_eq(rv, ATTND_ERR_OK, "Hello %s: %s", while_what, attnd_err_name(rv));
    for (int i = 0; i < 20; i++)
        cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK, "Status %d %s: %s", i, while_what,
                     attnd_client_last_error(c));
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(c, 1, 4, 2.0f, why, sizeof why), 0, "%s", why);
    attnd_client_free(c);
}

Test(lockout, a_client_that_never_reads_replies_does_not_starve_the_others, .timeout = 180)
{
    attnd_daemon_proc d;
    cr_assert_eq(attnd_daemon_start(&d, LOCKOUT_CONFIG(", \"send_timeout_ms\": 2000", "")), 0);
    int fd = lu_unix_connect(d.url, 1);
    cr_assert_geq(fd, 0);
    int sent = flood_status(fd, 100000);
    fprintf(stderr, "lockout: %d Status requests sent, no reply read\n", sent);
    cr_assert_geq(sent, 574);
    good_client_served(&d, "while a client does not read its replies");
    /* the daemon cut the connection that would not read */
    cr_assert_eq(lu_drain_until_closed(fd, 20000), 0, "the stalled connection is still open");
    close(fd);
    good_client_served(&d, "after");
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* A server whose every receive context waits on a client that does not read (limits set so one
 * connection can take them all) says so on /healthz, and is healthy again once it is gone. */
Test(lockout, healthz_reports_a_server_that_serves_nothing, .timeout = 180)
{
    attnd_daemon_proc d;
    char *body = NULL;
    cr_assert_eq(attnd_daemon_start(
                     &d, LOCKOUT_CONFIG(", \"workers\": 4, \"max_inflight_per_connection\": 4, "
                                        "\"send_timeout_ms\": 600000},"
                                        " \"http\": {\"listen\": \"http://127.0.0.1:0\"",
                                        "")),
                 0);
    cr_assert_eq(lu_log_wait(&d, "event=http_listen", 5000), 0);
    uint16_t port = (uint16_t)lu_log_value(&d, "event=http_listen", "port");
    cr_assert_eq(lu_http_get(port, "/healthz", NULL), 200);
    int fd = lu_unix_connect(d.url, 1);
    cr_assert_geq(fd, 0);
    flood_status(fd, 100000);
    int status = 200;
    for (int64_t end = lu_now_ms() + 30000; status == 200 && lu_now_ms() < end;) {
        lu_sleep_ms(250);
        status = lu_http_get(port, "/healthz", &body);
        if (status == 200) free(body);
    }
    cr_assert_eq(status, 503, "/healthz said 200 for 30 s while nothing was served");
    fprintf(stderr, "lockout: /healthz: %s", body);
    cr_assert_not_null(strstr(body, "no reply"), "%s", body);
    free(body);
    close(fd);
    for (int64_t end = lu_now_ms() + 30000; status != 200 && lu_now_ms() < end;) {
        lu_sleep_ms(250);
        status = lu_http_get(port, "/healthz", NULL);
    }
    cr_assert_eq(status, 200, "/healthz did not recover once the client was gone");
    good_client_served(&d, "after the stall");
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- HTTP (item 10) */

static int open_fds(pid_t pid)
{
    char path[64];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* A connection to 127.0.0.1:port that sends an HTTP request without its last line. */
static int half_open_request(uint16_t port)
{
    static const char part[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        send(fd, part, sizeof part - 1, MSG_NOSIGNAL) != (ssize_t)sizeof part - 1) {
        close(fd);
        return -1;
    }
    return fd;
}

Test(lockout, half_open_http_requests_hold_no_fds_for_good, .timeout = 180)
{
    attnd_daemon_proc d;
    struct rlimit rl;
    int fds[1000], n = 1000;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 1100) n = (int)rl.rlim_cur - 100;
    cr_assert_eq(attnd_daemon_start(&d, LOCKOUT_CONFIG("},"
                                                       " \"http\": {\"listen\": "
                                                       "\"http://127.0.0.1:0\","
                                                       " \"header_timeout_ms\": 2000",
                                                       "")),
                 0);
    cr_assert_eq(lu_log_wait(&d, "event=http_listen", 5000), 0);
    uint16_t port = (uint16_t)lu_log_value(&d, "event=http_listen", "port");
    int base = open_fds(d.pid), opened = 0;
    for (int i = 0; i < n; i++)
        if ((fds[opened] = half_open_request(port)) >= 0) opened++;
    fprintf(stderr, "lockout: %d half-open HTTP requests; the daemon holds %d fds (%d before)\n",
            opened, open_fds(d.pid), base);
    cr_assert_geq(opened, n / 2);
    /* a probe is answered meanwhile (the oldest unfinished request makes room for it) */
    cr_assert_eq(lu_http_get(port, "/healthz", NULL), 200, "/healthz not answered under the flood");
    /* an evicted connection's fd goes only after its callback and NNG's release of the stream,
     * both on NNG's threads (late on a loaded machine): a moment to settle, far under the 2 s
     * the half-open requests would otherwise last */
    int held = open_fds(d.pid);
    for (int64_t end = lu_now_ms() + 300; held > base + 80 && lu_now_ms() < end;
         held = open_fds(d.pid))
        lu_sleep_ms(10);
    cr_assert_leq(held, base + 80, "the daemon holds %d fds (%d before)", held, base);
    /* and every one of them is closed by the daemon within its header time */
    int closed = 0;
    for (int i = 0; i < opened; i++) {
        closed += lu_drain_until_closed(fds[i], 10000) == 0;
        close(fds[i]);
    }
    cr_assert_eq(closed, opened, "%d of %d half-open requests still open", opened - closed, opened);
    cr_assert_eq(lu_http_get(port, "/healthz", NULL), 200);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
