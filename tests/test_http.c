/* Operator HTTP endpoint: /healthz, /status and /metrics over a real TCP connection on
 * 127.0.0.1 (a plain socket client, so the test does not share NNG's HTTP code), status codes,
 * content types, bodies larger than the first buffer, bad addresses, a free() that waits
 * for hooks in progress, and the bounds on clients that never finish a request (header time,
 * head size, connections: the oldest unfinished one makes room). */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "obs/http.h"
#include "obs/metrics.h"

typedef struct fake_daemon {
    bool healthy;
    size_t status_bytes; /* 0: a small JSON document; else a body this large */
    attnd_err status_err;
    attnd_metrics *metrics;
    atomic_int calls;
    int sleep_ms; /* metrics hook sleeps this long */
    atomic_bool hook_done;
} fake_daemon;

static bool fake_healthy(void *arg, char *reason, size_t cap)
{
    fake_daemon *d = arg;
    atomic_fetch_add(&d->calls, 1);
    if (!d->healthy) snprintf(reason, cap, "draining: 2 requests in flight");
    return d->healthy;
}

static attnd_err fake_status(void *arg, char *buf, size_t cap, size_t *len)
{
    fake_daemon *d = arg;
    atomic_fetch_add(&d->calls, 1);
    if (d->status_err != ATTND_ERR_OK) return d->status_err;
    if (d->status_bytes == 0) {
        int n = snprintf(buf, cap, "{\"backend\":\"cpu\",\"blocks_free\":%d}", 4096);
        *len = (size_t)n;
        return (size_t)n < cap ? ATTND_ERR_OK : ATTND_ERR_NO_MEMORY;
    }
    *len = d->status_bytes;
    if (d->status_bytes >= cap) return ATTND_ERR_NO_MEMORY;
    for (size_t i = 0; i < d->status_bytes; i++)
        buf[i] = (char)('a' + i % 26);
    buf[d->status_bytes] = '\0';
    return ATTND_ERR_OK;
}

static attnd_err fake_metrics(void *arg, char *buf, size_t cap, size_t *len)
{
    fake_daemon *d = arg;
    atomic_fetch_add(&d->calls, 1);
    if (d->sleep_ms > 0) usleep((useconds_t)d->sleep_ms * 1000);
    attnd_err rv = attnd_metrics_render(d->metrics, buf, cap, len);
    atomic_store(&d->hook_done, true);
    return rv;
}

static attnd_http_hooks hooks_for(fake_daemon *d)
{
    return (attnd_http_hooks){
        .healthy = fake_healthy, .status = fake_status, .metrics = fake_metrics, .arg = d};
}

typedef struct http_reply {
    int status;
    char ctype[128];
    char *body; /* heap, NUL-terminated */
    size_t body_len;
} http_reply;

static int connect_local(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One request on its own connection; the reply is read up to Content-Length. */
static http_reply http_do(uint16_t port, const char *method, const char *path)
{
    http_reply r = {0};
    char req[256];
    int fd = connect_local(port);
    cr_assert_geq(fd, 0, "cannot connect to 127.0.0.1:%u", port);
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    size_t cap = 1 << 16, got = 0, body_at = 0; /* body_at: 0 until the headers are in */
    char *buf = malloc(cap + 1);
    long clen = -1;
    while (body_at == 0 || got < body_at + (size_t)clen) {
        if (got == cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t k = recv(fd, buf + got, cap - got, 0);
        cr_assert_gt(k, 0, "connection closed or timed out after %zu bytes", got);
        got += (size_t)k;
        buf[got] = '\0';
        char *end = body_at == 0 ? strstr(buf, "\r\n\r\n") : NULL;
        if (end != NULL) {
            *end = '\0'; /* header searches stop here */
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            cr_assert_not_null(cl, "no Content-Length");
            clen = strtol(cl + 17, NULL, 10);
            body_at = (size_t)(end - buf) + 4;
        }
    }
    close(fd);
    cr_assert_eq(sscanf(buf, "HTTP/1.1 %d", &r.status), 1, "bad status line: %.40s", buf);
    const char *ct = strcasestr(buf, "\r\nContent-Type: ");
    if (ct != NULL) sscanf(ct + 16, "%127[^\r]", r.ctype);
    r.body_len = (size_t)clen;
    r.body = malloc(r.body_len + 1);
    memcpy(r.body, buf + body_at, r.body_len);
    r.body[r.body_len] = '\0';
    free(buf);
    return r;
}

static attnd_http *start(fake_daemon *d, const attnd_http_hooks *hooks)
{
    attnd_http *h = NULL;
    cr_assert_eq(attnd_metrics_alloc(&d->metrics, "9.9.9", "cpu"), ATTND_ERR_OK);
    cr_assert_eq(attnd_http_alloc(&h, "http://127.0.0.1:0", hooks, NULL), ATTND_ERR_OK);
    cr_assert_not_null(h);
    cr_assert_gt(attnd_http_port(h), 0);
    return h;
}

Test(http, healthz_follows_the_health_hook, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = start(&d, &hk);
    http_reply r = http_do(attnd_http_port(h), "GET", "/healthz");
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "ok\n");
    cr_assert_str_eq(r.ctype, "text/plain");
    free(r.body);
    d.healthy = false;
    r = http_do(attnd_http_port(h), "GET", "/healthz");
    cr_assert_eq(r.status, 503);
    cr_assert_str_eq(r.body, "draining: 2 requests in flight\n");
    free(r.body);
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}

Test(http, metrics_serves_the_prometheus_text, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = start(&d, &hk);
    attnd_metrics_request(d.metrics, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_OK, 12000);
    attnd_metrics_gauge_set(d.metrics, ATTND_METRICS_GAUGE_BLOCKS_FREE, 77);
    http_reply r = http_do(attnd_http_port(h), "GET", "/metrics");
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.ctype, "text/plain; version=0.0.4; charset=utf-8");
    cr_assert_gt(r.body_len, 10000);
    cr_assert_not_null(strstr(r.body, "\nattnd_requests_total{type=\"attend\",code=\"OK\"} 1\n"));
    cr_assert_not_null(strstr(r.body, "\nattnd_blocks_free 77\n"));
    cr_assert_not_null(strstr(r.body, "attnd_build_info{version=\"9.9.9\",backend=\"cpu\"} 1\n"));
    cr_assert_eq(r.body[r.body_len - 1], '\n');
    free(r.body);
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}

Test(http, status_serves_json_and_grows_its_buffer, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = start(&d, &hk);
    http_reply r = http_do(attnd_http_port(h), "GET", "/status");
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.ctype, "application/json");
    cr_assert_str_eq(r.body, "{\"backend\":\"cpu\",\"blocks_free\":4096}");
    free(r.body);
    d.status_bytes = 300000; /* larger than the first buffer: one retry at the size asked */
    r = http_do(attnd_http_port(h), "GET", "/status");
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 300000);
    cr_assert_eq(r.body[299999], (char)('a' + 299999 % 26));
    free(r.body);
    d.status_bytes = 0;
    d.status_err = ATTND_ERR_INTERNAL;
    r = http_do(attnd_http_port(h), "GET", "/status");
    cr_assert_eq(r.status, 500);
    cr_assert_str_eq(r.body, "internal error");
    free(r.body);
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}

Test(http, unknown_paths_methods_and_missing_hooks, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    hk.status = NULL;
    attnd_http *h = start(&d, &hk);
    http_reply r = http_do(attnd_http_port(h), "GET", "/nope");
    cr_assert_eq(r.status, 404);
    free(r.body);
    r = http_do(attnd_http_port(h), "GET", "/status");
    cr_assert_eq(r.status, 404, "a NULL hook is not served");
    free(r.body);
    r = http_do(attnd_http_port(h), "POST", "/metrics");
    cr_assert_eq(r.status, 405);
    free(r.body);
    int before = atomic_load(&d.calls);
    r = http_do(attnd_http_port(h), "DELETE", "/healthz");
    cr_assert_eq(r.status, 405);
    free(r.body);
    cr_assert_eq(atomic_load(&d.calls), before, "a refused method never reaches a hook");
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}

Test(http, bad_addresses_are_refused, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = (attnd_http *)&d;
    cr_assert_eq(attnd_http_alloc(&h, "tcp://127.0.0.1:0", &hk, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_null(h);
    cr_assert_eq(attnd_http_alloc(&h, "not a url", &hk, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_null(h);
    /* a port someone else listens on */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(fd, 1), 0);
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u", ntohs(sa.sin_port));
    cr_assert_eq(attnd_http_alloc(&h, url, &hk, NULL), ATTND_ERR_UNAVAILABLE);
    cr_assert_null(h);
    close(fd);
    attnd_http_free(NULL);
}

typedef struct scrape_arg {
    uint16_t port;
    int status;
} scrape_arg;

/* No asserts here (another thread): the status line if one arrives before the close, else 0. */
static void *scrape_thread(void *p)
{
    scrape_arg *a = p;
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char buf[64] = "";
    int fd = connect_local(a->port);
    if (fd < 0) return NULL;
    if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1 &&
        recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL) > 0)
        sscanf(buf, "HTTP/1.1 %d", &a->status);
    close(fd);
    return NULL;
}

Test(http, free_waits_for_a_hook_in_progress_and_stops_serving, .timeout = 120)
{
    fake_daemon d = {.healthy = true, .sleep_ms = 300};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = start(&d, &hk);
    uint16_t port = attnd_http_port(h);
    scrape_arg a = {.port = port};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, scrape_thread, &a), 0);
    while (atomic_load(&d.calls) == 0)
        usleep(1000);
    attnd_http_free(h); /* the hook is sleeping now */
    cr_assert(atomic_load(&d.hook_done), "free returned while a hook was still running");
    int calls = atomic_load(&d.calls);
    pthread_join(th, NULL);
    cr_assert(a.status == 200 || a.status == 0);
    int fd = connect_local(port);
    cr_assert_lt(fd, 0, "the port still accepts connections after free");
    cr_assert_eq(atomic_load(&d.calls), calls);
    attnd_metrics_free(d.metrics);
}

Test(http, restarts_on_the_same_port, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http *h = start(&d, &hk);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u", attnd_http_port(h));
    attnd_http_free(h);
    cr_assert_eq(attnd_http_alloc(&h, url, &hk, NULL), ATTND_ERR_OK);
    http_reply r = http_do(attnd_http_port(h), "GET", "/healthz");
    cr_assert_eq(r.status, 200);
    free(r.body);
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}

/* A connection that sent part of a request head and nothing more. */
static int half_open(uint16_t port)
{
    static const char part[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    int fd = connect_local(port);
    cr_assert_geq(fd, 0);
    cr_assert_eq(send(fd, part, sizeof(part) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(part) - 1);
    return fd;
}

/* 1 when the peer closed fd (EOF, reset) within the socket's 10 s receive timeout. */
static int closed_by_peer(int fd)
{
    char buf[256];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof(buf), 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 1;
        if (k < 0) return 0;
    }
}

Test(http, unfinished_requests_are_bounded_in_time_size_and_number, .timeout = 120)
{
    fake_daemon d = {.healthy = true};
    attnd_http_hooks hk = hooks_for(&d);
    attnd_http_limits lim = {.max_connections = 2, .header_timeout_ms = 500};
    attnd_http *h = NULL;
    cr_assert_eq(attnd_metrics_alloc(&d.metrics, "9.9.9", "cpu"), ATTND_ERR_OK);
    cr_assert_eq(attnd_http_alloc(&h, "http://127.0.0.1:0", &hk, &lim), ATTND_ERR_OK);
    uint16_t port = attnd_http_port(h);
    /* two half-open requests hold the two connections; a probe still gets in (the oldest goes) */
    int a = half_open(port), b = half_open(port);
    usleep(50000);
    http_reply r = http_do(port, "GET", "/healthz");
    cr_assert_eq(r.status, 200);
    free(r.body);
    cr_assert(closed_by_peer(a), "the oldest unfinished request was not closed for the probe");
    /* the other one is closed when its header time is up */
    cr_assert(closed_by_peer(b), "a half-open request outlived its header time");
    close(a);
    close(b);
    /* a head that fills 8 KiB without ending: 431 */
    int fd = connect_local(port);
    char big[8192]; /* exactly the limit: nothing left unread (no reset before the reply) */
    memset(big, 'x', sizeof(big));
    memcpy(big, "GET /healthz HTTP/1.1\r\nX-Big: ", 31);
    cr_assert_eq(send(fd, big, sizeof(big), MSG_NOSIGNAL), (ssize_t)sizeof(big));
    char reply[64] = "";
    cr_assert_gt(recv(fd, reply, sizeof(reply) - 1, 0), 0);
    int status = 0;
    sscanf(reply, "HTTP/1.1 %d", &status);
    cr_assert_eq(status, 431, "%s", reply);
    close(fd);
    /* HEAD: the headers only */
    fd = connect_local(port);
    static const char head[] = "HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    cr_assert_eq(send(fd, head, sizeof(head) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(head) - 1);
    char all[512] = "";
    size_t got = 0;
    for (ssize_t k; (k = recv(fd, all + got, sizeof(all) - 1 - got, 0)) > 0;)
        got += (size_t)k;
    cr_assert(strncmp(all, "HTTP/1.1 200", 12) == 0, "%s", all);
    cr_assert_eq(strcmp(all + got - 4, "\r\n\r\n"), 0, "a body after HEAD: %s", all);
    close(fd);
    attnd_http_free(h);
    attnd_metrics_free(d.metrics);
}
