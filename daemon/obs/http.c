#include "http.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "attnd_nng_err.h"

#define HTTP_BODY_FIRST (64 * 1024)
#define HTTP_BODY_MAX (16 * 1024 * 1024)
#define HTTP_REASON_MAX 256

/* Shared by the endpoint and its handlers: NNG may finalise a handler (and run a late
 * callback) after attnd_http_free returns, so what a callback touches is reference counted,
 * and `closed` keeps callbacks off the hooks once the owner has gone. */
typedef struct http_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int active;
    bool closed;
    attnd_http_hooks hooks;
} http_gate;

typedef enum http_route_kind { HTTP_HEALTHZ, HTTP_STATUS, HTTP_METRICS } http_route_kind;

typedef struct http_route {
    http_gate *gate;
    http_route_kind kind;
} http_route;

struct attnd_http {
    nng_http_server *server;
    http_gate *gate;
    uint16_t port;
};

static void gate_unref(http_gate *g)
{
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static bool gate_enter(http_gate *g)
{
    pthread_mutex_lock(&g->mu);
    bool open = !g->closed;
    if (open) g->active++;
    pthread_mutex_unlock(&g->mu);
    return open;
}

static void gate_leave(http_gate *g)
{
    pthread_mutex_lock(&g->mu);
    if (--g->active == 0) pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_close(http_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->closed = true;
    while (g->active > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void route_free_cb(void *arg)
{
    http_route *r = arg;
    gate_unref(r->gate);
    free(r);
}

/* Complete the handler aio with a response (status, content type, body copied). */
static void http_respond(nng_aio *aio, uint16_t status, const char *ctype, const char *body,
                         size_t len)
{
    nng_http_res *res = NULL;
    int rv;
    if ((rv = nng_http_res_alloc(&res)) != 0) goto fail;
    if ((rv = nng_http_res_set_status(res, status)) != 0 ||
        (rv = nng_http_res_set_header(res, "Content-Type", ctype)) != 0 ||
        (rv = nng_http_res_set_header(res, "Cache-Control", "no-store")) != 0 ||
        (rv = nng_http_res_copy_data(res, body, len)) != 0)
        goto fail;
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
    return;
fail:
    if (res != NULL) nng_http_res_free(res);
    nng_aio_finish(aio, rv);
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

static void http_serve_healthz(nng_aio *aio, const attnd_http_hooks *hk)
{
    char reason[HTTP_REASON_MAX] = "";
    if (hk->healthy(hk->arg, reason, sizeof(reason))) {
        http_respond(aio, NNG_HTTP_STATUS_OK, "text/plain", "ok\n", 3);
        return;
    }
    reason[sizeof(reason) - 2] = '\0';
    size_t n = strlen(reason);
    reason[n++] = '\n';
    http_respond(aio, NNG_HTTP_STATUS_SERVICE_UNAVAILABLE, "text/plain", reason, n);
}

static void http_serve_render(nng_aio *aio, const attnd_http_hooks *hk, http_route_kind kind)
{
    attnd_http_render_fn fn = kind == HTTP_STATUS ? hk->status : hk->metrics;
    const char *ctype =
        kind == HTTP_STATUS ? "application/json" : "text/plain; version=0.0.4; charset=utf-8";
    char *body = NULL;
    size_t len = 0;
    attnd_err rv = http_render(fn, hk->arg, &body, &len);
    if (rv != ATTND_ERR_OK) {
        const char *msg = attnd_strerror(rv);
        http_respond(aio, NNG_HTTP_STATUS_INTERNAL_SERVER_ERROR, "text/plain", msg, strlen(msg));
        return;
    }
    http_respond(aio, NNG_HTTP_STATUS_OK, ctype, body, len);
    free(body);
}

static bool route_has_hook(const http_route *r)
{
    const attnd_http_hooks *hk = &r->gate->hooks;
    switch (r->kind) {
    case HTTP_HEALTHZ:
        return hk->healthy != NULL;
    case HTTP_STATUS:
        return hk->status != NULL;
    case HTTP_METRICS:
        return hk->metrics != NULL;
    }
    return false;
}

/* NNG handler callback: input 1 is the handler, whose data is our route. */
static void http_request_cb(nng_aio *aio)
{
    nng_http_handler *hd = nng_aio_get_input(aio, 1);
    http_route *r = nng_http_handler_get_data(hd);
    if (!route_has_hook(r)) {
        http_respond(aio, NNG_HTTP_STATUS_NOT_FOUND, "text/plain", "not found\n", 10);
        return;
    }
    if (!gate_enter(r->gate)) {
        http_respond(aio, NNG_HTTP_STATUS_SERVICE_UNAVAILABLE, "text/plain", "stopping\n", 9);
        return;
    }
    if (r->kind == HTTP_HEALTHZ)
        http_serve_healthz(aio, &r->gate->hooks);
    else
        http_serve_render(aio, &r->gate->hooks, r->kind);
    gate_leave(r->gate);
}

static int http_add_route(attnd_http *h, const char *path, http_route_kind kind)
{
    nng_http_handler *hd = NULL;
    http_route *r = malloc(sizeof(*r));
    int rv;
    if (r == NULL) return NNG_ENOMEM;
    r->gate = h->gate;
    r->kind = kind;
    if ((rv = nng_http_handler_alloc(&hd, path, http_request_cb)) != 0) {
        free(r);
        return rv;
    }
    if ((rv = nng_http_handler_set_data(hd, r, route_free_cb)) != 0) {
        free(r);
        nng_http_handler_free(hd);
        return rv;
    }
    pthread_mutex_lock(&h->gate->mu);
    h->gate->refs++;
    pthread_mutex_unlock(&h->gate->mu);
    /* from here the handler owns the route: freeing the handler runs route_free_cb */
    if ((rv = nng_http_server_add_handler(h->server, hd)) != 0) nng_http_handler_free(hd);
    return rv;
}

static uint16_t http_bound_port(nng_http_server *srv)
{
    nng_sockaddr sa;
    if (nng_http_server_get_addr(srv, &sa) != 0) return 0;
    if (sa.s_family == NNG_AF_INET) return ntohs(sa.s_in.sa_port);
    if (sa.s_family == NNG_AF_INET6) return ntohs(sa.s_in6.sa_port);
    return 0;
}

static http_gate *gate_alloc(const attnd_http_hooks *hooks)
{
    http_gate *g = calloc(1, sizeof(*g));
    if (g == NULL) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->hooks = *hooks;
    return g;
}

static attnd_err http_start(attnd_http *h, const char *url)
{
    nng_url *u = NULL;
    int rv;
    if ((rv = nng_url_parse(&u, url)) != 0) return ATTND_ERR_INVALID_ARGUMENT;
    if (strcmp(u->u_scheme, "http") != 0) {
        nng_url_free(u);
        return ATTND_ERR_INVALID_ARGUMENT;
    }
    rv = nng_http_server_hold(&h->server, u);
    nng_url_free(u);
    if (rv != 0) return attnd_err_from_nng(rv);
    if ((rv = http_add_route(h, "/healthz", HTTP_HEALTHZ)) != 0 ||
        (rv = http_add_route(h, "/status", HTTP_STATUS)) != 0 ||
        (rv = http_add_route(h, "/metrics", HTTP_METRICS)) != 0)
        return attnd_err_from_nng(rv);
    if ((rv = nng_http_server_start(h->server)) != 0) return ATTND_ERR_UNAVAILABLE;
    h->port = http_bound_port(h->server);
    return ATTND_ERR_OK;
}

attnd_err attnd_http_alloc(attnd_http **out, const char *url, const attnd_http_hooks *hooks)
{
    attnd_http *h = calloc(1, sizeof(*h));
    attnd_err rv;
    *out = NULL;
    if (h == NULL) return ATTND_ERR_NO_MEMORY;
    if ((h->gate = gate_alloc(hooks)) == NULL) {
        free(h);
        return ATTND_ERR_NO_MEMORY;
    }
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
    gate_close(h->gate);
    if (h->server != NULL) {
        nng_http_server_stop(h->server);
        nng_http_server_release(h->server);
    }
    gate_unref(h->gate);
    free(h);
}

uint16_t attnd_http_port(const attnd_http *h)
{
    return h->port;
}
