/* The operator endpoint on NNG's TCP streams. NNG's own HTTP server (1.5.2) has neither a
 * connection limit nor a header timeout: a client that never finishes its request holds a
 * connection and its fd for good, and a thousand of them hold a thousand. This one serves one
 * GET per connection (Connection: close), reads the request head within header_timeout_ms into
 * a fixed buffer, and keeps at most max_connections: at the limit a new connection closes the
 * oldest one still sending its request (a probe gets in, a flood of half-open requests cannot
 * keep it out). */
#include "http.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "attnd/clock.h"
#include "attnd_nng_err.h"

#define HTTP_HEAD_MAX 8192 /* request line and headers */
#define HTTP_BODY_FIRST (64 * 1024)
#define HTTP_BODY_MAX (16 * 1024 * 1024)
#define HTTP_REASON_MAX 256
#define HTTP_SEND_MS 10000 /* a response not taken by then is dropped */

typedef enum http_state { HTTP_READ, HTTP_WRITE, HTTP_DEAD } http_state;

typedef struct http_conn {
    attnd_http *h;
    nng_stream *s;
    nng_aio *aio;
    http_state state;
    int evicted;          /* closed to make room: its callback finishes it */
    uint64_t deadline_ms; /* the request head must be in by then */
    size_t got;
    char head[HTTP_HEAD_MAX + 1];
    char *out; /* the response */
    size_t out_len, out_sent;
    struct http_conn *prev, *next; /* live connections, oldest first */
} http_conn;

struct attnd_http {
    attnd_http_hooks hooks;
    attnd_http_limits limits;
    nng_stream_listener *l;
    nng_aio *accept;
    uint16_t port;
    pthread_mutex_t mu;
    int closing;
    http_conn *first, *last; /* live */
    uint32_t nlive;
    http_conn *dead; /* finished: freed from another aio's callback or by attnd_http_free */
};

/* ---------------------------------------------------------------- connections */

static void conn_unlink(attnd_http *h, http_conn *c)
{
    if (c->prev) c->prev->next = c->next;
    if (c->next) c->next->prev = c->prev;
    if (h->first == c) h->first = c->next;
    if (h->last == c) h->last = c->prev;
    c->prev = c->next = NULL;
    h->nlive--;
}

/* A connection is done (answered, timed out, closed): off the live list. Its own callback
 * cannot free its aio: the next accept, or attnd_http_free, does. Once closing, the live list
 * is attnd_http_free's. */
static void conn_finish(http_conn *c)
{
    attnd_http *h = c->h;
    nng_stream_close(c->s);
    pthread_mutex_lock(&h->mu);
    if (!h->closing && c->state != HTTP_DEAD) {
        c->state = HTTP_DEAD;
        conn_unlink(h, c);
        c->next = h->dead;
        h->dead = c;
    }
    pthread_mutex_unlock(&h->mu);
}

static void conn_set_state(http_conn *c, http_state st)
{
    pthread_mutex_lock(&c->h->mu);
    c->state = st;
    pthread_mutex_unlock(&c->h->mu);
}

static void conn_free(http_conn *c)
{
    nng_aio_free(c->aio); /* waits for its callback */
    nng_stream_free(c->s);
    free(c->out);
    free(c);
}

/* Free the finished connections (not from one of their own callbacks). */
static void http_reap(attnd_http *h)
{
    pthread_mutex_lock(&h->mu);
    http_conn *d = h->dead;
    h->dead = NULL;
    pthread_mutex_unlock(&h->mu);
    while (d) {
        http_conn *next = d->next;
        conn_free(d);
        d = next;
    }
}

/* ---------------------------------------------------------------- responses */

static const char *status_text(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    default:
        return "Service Unavailable";
    }
}

static void conn_send_more(http_conn *c)
{
    nng_iov iov = {c->out + c->out_sent, c->out_len - c->out_sent};
    nng_aio_set_iov(c->aio, 1, &iov);
    nng_aio_set_timeout(c->aio, HTTP_SEND_MS);
    nng_stream_send(c->s, c->aio);
}

/* Answer with status, ctype and body (copied; no body for HEAD), then close. */
static void conn_respond(http_conn *c, int status, const char *ctype, const char *body, size_t len,
                         int head_only)
{
    char hdr[320];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\n%sConnection: close\r\n\r\n",
                     status, status_text(status), ctype, len,
                     status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (head_only) len = 0;
    if ((c->out = malloc((size_t)n + len)) == NULL) {
        conn_finish(c);
        return;
    }
    memcpy(c->out, hdr, (size_t)n);
    if (len) memcpy(c->out + n, body, len);
    c->out_len = (size_t)n + len;
    c->out_sent = 0;
    conn_set_state(c, HTTP_WRITE);
    conn_send_more(c);
}

static void conn_text(http_conn *c, int status, const char *text, int head_only)
{
    conn_respond(c, status, "text/plain", text, strlen(text), head_only);
}

/* Call a render hook into a heap buffer, growing it once to the size the hook asks for. */
static attnd_err http_render(attnd_http_render_fn fn, void *arg, char **body, size_t *len)
{
    size_t cap = HTTP_BODY_FIRST;
    *body = NULL;
    for (int attempt = 0; attempt < 3; attempt++) {
        char *buf = malloc(cap);
        size_t need = 0;
        if (buf == NULL) return ATTND_ERR_NO_MEMORY;
        attnd_err rv = fn(arg, buf, cap, &need);
        if (rv == ATTND_ERR_OK && need < cap) {
            *body = buf;
            *len = need;
            return ATTND_ERR_OK;
        }
        free(buf);
        if (rv != ATTND_ERR_OK && rv != ATTND_ERR_NO_MEMORY) return rv;
        if (need >= HTTP_BODY_MAX) return ATTND_ERR_NO_MEMORY;
        /* some slack: counters may grow a little between the two calls */
        cap = need + 4096 > cap ? need + 4096 : cap * 2;
    }
    return ATTND_ERR_NO_MEMORY;
}

static void serve_healthz(http_conn *c, const attnd_http_hooks *hk, int head_only)
{
    char reason[HTTP_REASON_MAX] = "";
    if (hk->healthy(hk->arg, reason, sizeof reason)) {
        conn_text(c, 200, "ok\n", head_only);
        return;
    }
    reason[sizeof reason - 2] = '\0';
    size_t n = strlen(reason);
    reason[n++] = '\n';
    reason[n] = '\0';
    conn_text(c, 503, reason, head_only);
}

static void serve_render(http_conn *c, attnd_http_render_fn fn, const char *ctype, int head_only)
{
    char *body = NULL;
    size_t len = 0;
    attnd_err rv = http_render(fn, c->h->hooks.arg, &body, &len);
    if (rv != ATTND_ERR_OK) {
        conn_text(c, 500, attnd_strerror(rv), head_only);
        return;
    }
    conn_respond(c, 200, ctype, body, len, head_only);
    free(body);
}

/* The request head is in c->head: route it. */
static void conn_route(http_conn *c)
{
    const attnd_http_hooks *hk = &c->h->hooks;
    char method[8], path[128];
    if (sscanf(c->head, "%7s %127s HTTP/1.%*c", method, path) != 2 || path[0] != '/') {
        conn_text(c, 400, "bad request\n", 0);
        return;
    }
    int head_only = strcmp(method, "HEAD") == 0;
    path[strcspn(path, "?")] = '\0';
    int healthz = strcmp(path, "/healthz") == 0, status = strcmp(path, "/status") == 0,
        metrics = strcmp(path, "/metrics") == 0;
    if (!(healthz && hk->healthy) && !(status && hk->status) && !(metrics && hk->metrics))
        conn_text(c, 404, "not found\n", head_only);
    else if (!head_only && strcmp(method, "GET") != 0)
        conn_text(c, 405, "method not allowed\n", 0);
    else if (healthz)
        serve_healthz(c, hk, head_only);
    else if (status)
        serve_render(c, hk->status, "application/json", head_only);
    else
        serve_render(c, hk->metrics, "text/plain; version=0.0.4; charset=utf-8", head_only);
}

/* ---------------------------------------------------------------- reading the request */

static void conn_recv(http_conn *c)
{
    uint64_t now = attnd_clock_ms();
    nng_iov iov = {c->head + c->got, HTTP_HEAD_MAX - c->got};
    nng_aio_set_iov(c->aio, 1, &iov);
    nng_aio_set_timeout(c->aio, c->deadline_ms > now ? (nng_duration)(c->deadline_ms - now) : 1);
    nng_stream_recv(c->s, c->aio);
}

static void conn_read_done(http_conn *c)
{
    c->got += nng_aio_count(c->aio);
    c->head[c->got] = '\0';
    if (strstr(c->head, "\r\n\r\n") != NULL || strstr(c->head, "\n\n") != NULL) {
        pthread_mutex_lock(&c->h->mu);
        int closing = c->h->closing;
        if (!closing) c->state = HTTP_WRITE; /* no longer evicted for a newcomer */
        pthread_mutex_unlock(&c->h->mu);
        if (closing)
            conn_finish(c);
        else
            conn_route(c);
    } else if (c->got == HTTP_HEAD_MAX) {
        conn_text(c, 431, "request head too large\n", 0);
    } else {
        conn_recv(c);
    }
}

static void conn_cb(void *arg)
{
    http_conn *c = arg;
    if (nng_aio_result(c->aio) != 0) { /* timed out, closed, evicted, or the client left */
        conn_finish(c);
        return;
    }
    if (c->state == HTTP_READ) {
        conn_read_done(c);
        return;
    }
    c->out_sent += nng_aio_count(c->aio);
    if (c->out_sent < c->out_len)
        conn_send_more(c);
    else
        conn_finish(c);
}

/* ---------------------------------------------------------------- accepting */

/* At the limit: close the oldest connection still sending its request (caller holds mu).
 * 0 when every connection is being answered: the newcomer is refused instead. */
static int http_evict(attnd_http *h)
{
    for (http_conn *c = h->first; c; c = c->next)
        if (c->state == HTTP_READ && !c->evicted) {
            c->evicted = 1;
            nng_stream_close(c->s);
            return 1;
        }
    return 0;
}

/* A new connection: admitted (its request read next), or closed at once. */
static void http_admit(attnd_http *h, nng_stream *s)
{
    http_conn *c = calloc(1, sizeof *c);
    if (c == NULL || nng_aio_alloc(&c->aio, conn_cb, c) != 0) {
        free(c);
        nng_stream_free(s);
        return;
    }
    c->h = h;
    c->s = s;
    c->deadline_ms = attnd_clock_ms() + h->limits.header_timeout_ms;
    pthread_mutex_lock(&h->mu);
    int ok = !h->closing && (h->nlive < h->limits.max_connections || http_evict(h));
    if (ok) {
        c->prev = h->last;
        if (h->last) h->last->next = c;
        h->last = c;
        if (h->first == NULL) h->first = c;
        h->nlive++;
    }
    pthread_mutex_unlock(&h->mu);
    if (!ok) {
        conn_free(c);
        return;
    }
    conn_recv(c);
}

static void http_accept_cb(void *arg)
{
    attnd_http *h = arg;
    int rv = nng_aio_result(h->accept);
    http_reap(h);
    if (rv == 0) http_admit(h, nng_aio_get_output(h->accept, 0));
    pthread_mutex_lock(&h->mu);
    int closing = h->closing;
    pthread_mutex_unlock(&h->mu);
    if (closing || rv == NNG_ECLOSED || rv == NNG_ECANCELED) return;
    nng_stream_listener_accept(h->l, h->accept); /* other errors (EMFILE...): keep accepting */
}

/* ---------------------------------------------------------------- lifecycle */

/* "http://HOST:PORT" as NNG's tcp:// stream URL. */
static attnd_err http_tcp_url(const char *url, char *out, size_t n)
{
    nng_url *u = NULL;
    if (nng_url_parse(&u, url) != 0) return ATTND_ERR_INVALID_ARGUMENT;
    int v6 = strchr(u->u_hostname, ':') != NULL; /* an IPv6 literal keeps its brackets */
    int ok = strcmp(u->u_scheme, "http") == 0 && u->u_hostname[0] != '\0' &&
             strcmp(u->u_path, "") == 0 &&
             (size_t)snprintf(out, n, "tcp://%s%s%s:%s", v6 ? "[" : "", u->u_hostname,
                              v6 ? "]" : "", u->u_port[0] ? u->u_port : "80") < n;
    nng_url_free(u);
    return ok ? ATTND_ERR_OK : ATTND_ERR_INVALID_ARGUMENT;
}

static attnd_err http_start(attnd_http *h, const char *url)
{
    char tcp[300];
    int rv, port = 0;
    if (http_tcp_url(url, tcp, sizeof tcp) != ATTND_ERR_OK) return ATTND_ERR_INVALID_ARGUMENT;
    if ((rv = nng_stream_listener_alloc(&h->l, tcp)) != 0)
        return rv == NNG_ENOMEM ? ATTND_ERR_NO_MEMORY : ATTND_ERR_INVALID_ARGUMENT;
    if ((rv = nng_stream_listener_listen(h->l)) != 0) return ATTND_ERR_UNAVAILABLE;
    if (nng_stream_listener_get_int(h->l, NNG_OPT_TCP_BOUND_PORT, &port) == 0)
        h->port = (uint16_t)port;
    if (nng_aio_alloc(&h->accept, http_accept_cb, h) != 0) return ATTND_ERR_NO_MEMORY;
    nng_stream_listener_accept(h->l, h->accept);
    return ATTND_ERR_OK;
}

attnd_err attnd_http_alloc(attnd_http **out, const char *url, const attnd_http_hooks *hooks,
                           const attnd_http_limits *limits)
{
    attnd_http *h = calloc(1, sizeof *h);
    attnd_err rv;
    *out = NULL;
    if (h == NULL) return ATTND_ERR_NO_MEMORY;
    h->hooks = *hooks;
    h->limits = limits
                    ? *limits
                    : (attnd_http_limits){ATTND_HTTP_MAX_CONNECTIONS, ATTND_HTTP_HEADER_TIMEOUT_MS};
    if (h->limits.max_connections == 0) h->limits.max_connections = 1;
    pthread_mutex_init(&h->mu, NULL);
    if ((rv = http_start(h, url)) != ATTND_ERR_OK) {
        attnd_http_free(h);
        return rv;
    }
    *out = h;
    return ATTND_ERR_OK;
}

void attnd_http_free(attnd_http *h)
{
    if (h == NULL) return;
    pthread_mutex_lock(&h->mu);
    h->closing = 1;
    pthread_mutex_unlock(&h->mu);
    if (h->l) nng_stream_listener_close(h->l);
    if (h->accept) nng_aio_stop(h->accept); /* no accept callback from here on */
    /* every live connection: stop its aio (waits for a hook in progress), then free it */
    for (;;) {
        pthread_mutex_lock(&h->mu);
        http_conn *c = h->first;
        if (c) conn_unlink(h, c);
        pthread_mutex_unlock(&h->mu);
        if (c == NULL) break;
        nng_stream_close(c->s);
        conn_free(c); /* nng_aio_free stops it first */
    }
    http_reap(h);
    nng_aio_free(h->accept);
    nng_stream_listener_free(h->l);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

uint16_t attnd_http_port(const attnd_http *h)
{
    return h->port;
}
