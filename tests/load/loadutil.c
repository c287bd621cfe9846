#include "loadutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

void lu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int64_t lu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The "<key>: N kB" line of /proc/pid/status. */
static long status_kib(pid_t pid, const char *key)
{
    char path[64], line[256], fmt[48];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    snprintf(fmt, sizeof fmt, "%s: %%ld kB", key);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, fmt, &kib) == 1) break;
    fclose(f);
    return kib;
}

long lu_rss_kib(pid_t pid)
{
    return status_kib(pid, "VmRSS");
}

long lu_hwm_kib(pid_t pid)
{
    return status_kib(pid, "VmHWM");
}

/* ---------------------------------------------------------------- the daemon's log */

int lu_log_count(const attnd_daemon_proc *d, const char *needle)
{
    char line[2048];
    int n = 0;
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL) return 0;
    while (fgets(line, sizeof line, f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

int lu_log_wait(const attnd_daemon_proc *d, const char *needle, int timeout_ms)
{
    int64_t deadline = lu_now_ms() + timeout_ms;
    do {
        if (lu_log_count(d, needle) > 0) return 0;
        lu_sleep_ms(10);
    } while (lu_now_ms() < deadline);
    return -1;
}

long long lu_log_value(const attnd_daemon_proc *d, const char *event, const char *key)
{
    char line[2048], pat[64];
    long long v = -1;
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL) return -1;
    snprintf(pat, sizeof pat, " %s=", key);
    while (fgets(line, sizeof line, f) != NULL) {
        const char *at = strstr(line, pat);
        if (strstr(line, event) != NULL && at != NULL) v = strtoll(at + strlen(pat), NULL, 10);
    }
    fclose(f);
    return v;
}

/* ---------------------------------------------------------------- HTTP */

int lu_http_get(uint16_t port, const char *path, char **body)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    char req[256], *buf = NULL;
    size_t cap = 1 << 16, got = 0;
    int status = 0;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (body) *body = NULL;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) goto out;
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) goto out;
    buf = malloc(cap + 1);
    for (;;) {
        if (got == cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t k = recv(fd, buf + got, cap - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    buf[got] = '\0';
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (hdr_end == NULL || sscanf(buf, "HTTP/1.1 %d", &status) != 1) {
        status = 0;
        goto out;
    }
    if (body) *body = strdup(hdr_end + 4);
out:
    free(buf);
    close(fd);
    return status;
}

double lu_metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

/* ---------------------------------------------------------------- raw NNG */

int lu_raw_open(const char *url, int timeout_ms, uint32_t *sock_id)
{
    nng_socket s;
    if (nng_req0_open(&s) != 0) return -1;
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms);
    if (nng_dial(s, url, NULL, 0) != 0) {
        nng_close(s);
        return -1;
    }
    *sock_id = (uint32_t)nng_socket_id(s);
    return 0;
}

void lu_raw_close(uint32_t sock_id)
{
    nng_socket s = {.id = sock_id};
    nng_close(s);
}

int lu_raw_call(uint32_t sock_id, const Attnd__Request *req, Attnd__Reply **out)
{
    nng_socket s = {.id = sock_id};
    nng_msg *m = NULL;
    size_t n = attnd__request__get_packed_size(req);
    *out = NULL;
    if (nng_msg_alloc(&m, n) != 0) return -1;
    attnd__request__pack(req, nng_msg_body(m));
    if (nng_sendmsg(s, m, 0) != 0) {
        nng_msg_free(m);
        return -1;
    }
    if (nng_recvmsg(s, &m, 0) != 0) return -2;
    *out = attnd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    nng_msg_free(m);
    return *out ? 0 : -2;
}

/* ---------------------------------------------------------------- raw SP over ipc */

int lu_unix_connect(const char *url, int handshake)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    /* REQ (protocol 0x30) greeting the REP socket, as nng's ipc transport does */
    static const uint8_t hello[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
    uint8_t peer[8];
    if (strncmp(url, "ipc://", 6) != 0 || strlen(url + 6) >= sizeof sa.sun_path) return -1;
    strcpy(sa.sun_path, url + 6);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    if (!handshake) return fd;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello ||
        recv(fd, peer, sizeof peer, MSG_WAITALL) != (ssize_t)sizeof peer || peer[1] != 'S') {
        close(fd);
        return -1;
    }
    return fd;
}

int lu_sp_send(int fd, uint32_t rid, const Attnd__Request *req, int dontwait)
{
    size_t n = attnd__request__get_packed_size(req), len = 4 + n;
    uint8_t head[13], *buf = malloc(sizeof head + n);
    head[0] = 1; /* a message */
    for (int i = 0; i < 8; i++)
        head[1 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    rid |= 0x80000000u; /* REQ's backtrace: the request id, high bit set */
    for (int i = 0; i < 4; i++)
        head[9 + i] = (uint8_t)(rid >> (24 - 8 * i));
    memcpy(buf, head, sizeof head);
    attnd__request__pack(req, buf + sizeof head);
    size_t total = sizeof head + n, off = 0;
    int rc = 0;
    while (off < total) {
        /* a frame is sent whole once begun: only its first byte may be refused */
        ssize_t k = send(fd, buf + off, total - off,
                         MSG_NOSIGNAL | (dontwait && off == 0 ? MSG_DONTWAIT : 0));
        if (k < 0 && off == 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            rc = 1;
            break;
        }
        if (k <= 0) {
            rc = -1;
            break;
        }
        off += (size_t)k;
    }
    free(buf);
    return rc;
}

int lu_drain_until_closed(int fd, int timeout_ms)
{
    char buf[65536];
    int64_t deadline = lu_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - lu_now_ms();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0) continue;
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return 0;
    }
}

/* ---------------------------------------------------------------- a step with known outputs */

int lu_step_const_v(attnd_client *c, uint64_t seq, uint32_t new_tokens, float value, char *why,
                    size_t n)
{
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    attnd_step_seq ss = {seq, new_tokens};
    attnd_step step;
    attnd_err rv;
    int rc = -1;
    if ((rv = attnd_client_step_begin(c, &ss, 1, &step, NULL)) != ATTND_ERR_OK) {
        snprintf(why, n, "begin_step: %s: %s", attnd_err_name(rv), attnd_client_last_error(c));
        return -1;
    }
    int64_t qs[3] = {new_tokens, g->num_q_heads, g->head_size};
    int64_t ks[3] = {new_tokens, g->num_kv_heads, g->head_size};
    size_t nq = (size_t)(qs[0] * qs[1] * qs[2]), nk = (size_t)(ks[0] * ks[1] * ks[2]);
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float));
    float *v = malloc(nk * sizeof(float)), *o = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)((i * 7919) % 129) / 64.0f - 1.0f;
    for (size_t i = 0; i < nk; i++)
        k[i] = (float)((i * 104729) % 131) / 64.0f - 1.0f, v[i] = value;
    attnd_ref rq, rk, rvv, ro;
    attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, qs);
    attnd_ref_inline_in(&rk, k, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_in(&rvv, v, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_out(&ro, o, ATTND_DTYPE_F32, 3, qs);
    for (uint32_t layer = 0; layer < g->num_layers; layer++) {
        if ((rv = attnd_client_attend(c, step.id, layer, &rq, &rk, &rvv, &ro, NULL))) {
            snprintf(why, n, "attend: %s: %s", attnd_err_name(rv), attnd_client_last_error(c));
            goto out;
        }
        for (size_t i = 0; i < nq; i++)
            if (!(fabsf(o[i] - value) <= 1e-3f * fabsf(value) + 1e-5f)) {
                snprintf(why, n, "attend: out[%zu] = %g, want %g", i, o[i], value);
                goto out;
            }
    }
    if ((rv = attnd_client_step_end(c, step.id, 0)) != ATTND_ERR_OK) {
        snprintf(why, n, "end_step: %s", attnd_err_name(rv));
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) attnd_client_step_end(c, step.id, 1);
    free(q);
    free(k);
    free(v);
    free(o);
    return rc;
}

pid_t lu_spawn(const char *name, const char *url, const char *arg, char *line, size_t n)
{
    char bin[512];
    int fds[2];
    snprintf(bin, sizeof bin, "%s/tests/load/%s", getenv("ATTND_BUILD_DIR"), name);
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        execl(bin, bin, url, arg, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    int got = f != NULL && fgets(line, (int)n, f) != NULL;
    if (f != NULL) fclose(f);
    return got ? pid : -1;
}
