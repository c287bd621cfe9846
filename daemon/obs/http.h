/* Operator HTTP endpoint (on NNG's TCP streams): GET (or HEAD) /healthz, /status and /metrics,
 * one request per connection (Connection: close).
 *
 * Off unless the daemon is configured with an address ("http://127.0.0.1:9464"). The endpoint
 * knows nothing about the daemon: it calls the hooks it was given, on NNG's threads. Hooks must
 * be quick and must not block (take a lock for a snapshot, format, return). A NULL hook makes
 * its path answer 404.
 *
 *   /healthz  200 "ok\n" when healthy() says so, else 503 with its reason (text/plain): for
 *             liveness and readiness probes.
 *   /status   200, the status hook's body, application/json.
 *   /metrics  200, the metrics hook's body, Prometheus text format 0.0.4.
 *
 * Render hooks write into the buffer they are given: they return ATTND_ERR_OK with *len set,
 * or ATTND_ERR_NO_MEMORY with *len set to the size needed, and are then called once more with
 * a buffer that large (attnd_metrics_render follows this contract). Any other error answers
 * 500.
 *
 * Bounded for clients that never finish a request: its head (request line and headers, 8 KiB at
 * most, else 431) must arrive within header_timeout_ms, else the connection is closed; at
 * max_connections a new connection closes the oldest one still sending its request.
 */
#ifndef ATTND_OBS_HTTP_H
#define ATTND_OBS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef attnd_err (*attnd_http_render_fn)(void *arg, char *buf, size_t cap, size_t *len);

typedef struct attnd_http_hooks {
    /* true when healthy; otherwise writes a one-line reason (NUL-terminated) into reason. */
    bool (*healthy)(void *arg, char *reason, size_t cap);
    attnd_http_render_fn status;  /* JSON */
    attnd_http_render_fn metrics; /* Prometheus text */
    void *arg;
} attnd_http_hooks;

typedef struct attnd_http attnd_http;

#define ATTND_HTTP_MAX_CONNECTIONS 64
#define ATTND_HTTP_HEADER_TIMEOUT_MS 5000

typedef struct attnd_http_limits {
    uint32_t max_connections;   /* open at once (>= 1) */
    uint32_t header_timeout_ms; /* for a request's head, from the connection's accept */
} attnd_http_limits;

/* Start serving on `url` ("http://HOST:PORT"; port 0 picks a free one, see attnd_http_port)
 * within limits (NULL: the defaults above). INVALID_ARGUMENT for a URL NNG cannot parse or that
 * is not http://HOST[:PORT], UNAVAILABLE when the address cannot be bound (in use, not local),
 * NO_MEMORY otherwise. */
attnd_err attnd_http_alloc(attnd_http **out, const char *url, const attnd_http_hooks *hooks,
                           const attnd_http_limits *limits);

/* Stop serving and free. Returns after every hook call in progress has returned; no hook is
 * called afterwards, so the hooks' arg may be freed next. NULL is a no-op. */
void attnd_http_free(attnd_http *h);

/* The TCP port actually bound (useful after port 0), 0 if unknown. */
uint16_t attnd_http_port(const attnd_http *h);

#endif
