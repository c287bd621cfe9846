#include "observe.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"
#include "attnd/dtype.h"
#include "http.h"
#include "notify.h"

/* /healthz fails when the loop has not ticked for this long (wedged event loop) or the executor
 * has not refreshed the gauges for this long (a kernel or a request stuck). */
#define OBSERVE_LOOP_STALE_NS (5ull * 1000000000ull)
#define OBSERVE_EXEC_STALE_NS (60ull * 1000000000ull)
/* ... or requests wait and no reply has left for this long while the executor is idle enough to
 * refresh the gauges (so none of its work is what holds them up: the replies are not taken). */
#define OBSERVE_SERVE_STALE_NS (5ull * 1000000000ull)
#define OBSERVE_EXEC_FRESH_NS (2ull * 1000000000ull)

struct attnd_observe {
    attnd_log *log;
    attnd_metrics *metrics;
    attnd_ratelimit rl;
    attnd_notify notify;
    attnd_http *http;
    char http_url[ATTND_CFG_URL_MAX];
    attnd_http_limits http_limits;
    char listen[ATTND_CFG_URL_MAX];
    char listen_json[2 * ATTND_CFG_URL_MAX]; /* JSON-escaped for /status */
    char backend[16];
    attnd_cfg_geometry geo;
    char device_json[128]; /* JSON-escaped device name, "" for cpu */
    uint64_t memory_bytes; /* backend memory taken at start */
    atomic_bool draining;
    atomic_uint_fast64_t loop_tick_ns, exec_tick_ns;
    atomic_uint waiting;                    /* requests received and not answered, last tick */
    atomic_uint_fast64_t served_ns;         /* last tick a reply left or nothing waited */
    uint64_t last_replies;                  /* loop thread only */
    uint64_t watchdog_ns, last_watchdog_ns; /* loop thread only */
};

/* src as the inside of a JSON string (quotes, backslashes and control characters escaped). */
static void json_escape(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; *src != '\0' && n + 7 < cap; src++) {
        unsigned char c = (unsigned char)*src;
        if (c == '"' || c == '\\') {
            dst[n++] = '\\';
            dst[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", c);
        } else {
            dst[n++] = (char)c;
        }
    }
    dst[n] = '\0';
}

attnd_err attnd_observe_alloc(attnd_observe **out, const attnd_config *cfg, attnd_log *lg)
{
    attnd_observe *obs = calloc(1, sizeof(*obs));
    *out = NULL;
    if (obs == NULL) return ATTND_ERR_NO_MEMORY;
    obs->log = lg;
    obs->geo = cfg->geometry;
    snprintf(obs->listen, sizeof(obs->listen), "%s", cfg->server.listen);
    json_escape(obs->listen_json, sizeof(obs->listen_json), obs->listen);
    snprintf(obs->http_url, sizeof(obs->http_url), "%s", cfg->http.listen);
    obs->http_limits.max_connections = cfg->http.max_connections;
    obs->http_limits.header_timeout_ms = cfg->http.header_timeout_ms;
    snprintf(obs->backend, sizeof(obs->backend), "starting");
    attnd_ratelimit_init(&obs->rl, ATTND_OBSERVE_LOG_RATE, ATTND_OBSERVE_LOG_BURST);
    attnd_notify_init(&obs->notify);
    obs->watchdog_ns = attnd_notify_watchdog_usec(&obs->notify) * 1000u / 2u;
    uint64_t now = attnd_clock_ns();
    atomic_init(&obs->loop_tick_ns, now);
    atomic_init(&obs->exec_tick_ns, now);
    atomic_init(&obs->served_ns, now);
    if (attnd_metrics_alloc(&obs->metrics, ATTND_VERSION_STRING, "starting") != ATTND_ERR_OK) {
        attnd_ratelimit_fini(&obs->rl);
        free(obs);
        return ATTND_ERR_NO_MEMORY;
    }
    attnd_metrics_gauge_set(obs->metrics, ATTND_METRICS_GAUGE_BLOCKS_FREE,
                            cfg->geometry.num_blocks);
    attnd_metrics_gauge_set(obs->metrics, ATTND_METRICS_GAUGE_MPS, -1);
    *out = obs;
    return ATTND_ERR_OK;
}

void attnd_observe_set_memory(attnd_observe *obs, uint32_t num_blocks, const char *device,
                              uint64_t bytes)
{
    obs->geo.num_blocks = num_blocks;
    json_escape(obs->device_json, sizeof(obs->device_json), device ? device : "");
    obs->memory_bytes = bytes;
    attnd_metrics_gauge_set(obs->metrics, ATTND_METRICS_GAUGE_BLOCKS_FREE, num_blocks);
}

void attnd_observe_set_mps(attnd_observe *obs, int mps)
{
    attnd_metrics_gauge_set(obs->metrics, ATTND_METRICS_GAUGE_MPS, mps < 0 ? -1 : mps != 0);
}

attnd_metrics *attnd_observe_metrics(attnd_observe *obs)
{
    return obs->metrics;
}

attnd_ratelimit *attnd_observe_ratelimit(attnd_observe *obs)
{
    return &obs->rl;
}

uint16_t attnd_observe_http_port(const attnd_observe *obs)
{
    return obs->http ? attnd_http_port(obs->http) : 0;
}

/* ---------------------------------------------------------------- HTTP hooks (NNG threads) */

/* Requests wait, the executor is free, and no reply has left for a while: nothing is served. */
static bool observe_serving_ok(attnd_observe *obs, uint64_t now, char *reason, size_t cap)
{
    uint64_t served = atomic_load(&obs->served_ns), exec = atomic_load(&obs->exec_tick_ns);
    uint32_t waiting = atomic_load(&obs->waiting);
    if (waiting == 0 || now <= served || now - served <= OBSERVE_SERVE_STALE_NS) return true;
    if (now > exec && now - exec > OBSERVE_EXEC_FRESH_NS) return true; /* its work: see above */
    snprintf(reason, cap,
             "serving: %u requests waiting, no reply sent for %.1f s (clients not reading "
             "their replies?)",
             waiting, (double)(now - served) / 1e9);
    return false;
}

static bool observe_healthy_cb(void *arg, char *reason, size_t cap)
{
    attnd_observe *obs = arg;
    uint64_t now = attnd_clock_ns();
    uint64_t loop = atomic_load(&obs->loop_tick_ns), exec = atomic_load(&obs->exec_tick_ns);
    if (atomic_load(&obs->draining)) {
        snprintf(reason, cap, "draining: shutting down");
        return false;
    }
    if (now > loop && now - loop > OBSERVE_LOOP_STALE_NS) {
        snprintf(reason, cap, "event loop: no tick for %.1f s", (double)(now - loop) / 1e9);
        return false;
    }
    if (now > exec && now - exec > OBSERVE_EXEC_STALE_NS) {
        snprintf(reason, cap, "executor: busy for %.1f s", (double)(now - exec) / 1e9);
        return false;
    }
    return observe_serving_ok(obs, now, reason, cap);
}

static attnd_err observe_metrics_cb(void *arg, char *buf, size_t cap, size_t *len)
{
    attnd_observe *obs = arg;
    return attnd_metrics_render(obs->metrics, buf, cap, len);
}

static attnd_err observe_status_cb(void *arg, char *buf, size_t cap, size_t *len)
{
    return attnd_observe_status_json(arg, buf, cap, len);
}

/* The geometry object of /status: every key, and every layer's options resolved. */
static size_t status_geometry(const attnd_observe *obs, char *buf, size_t cap)
{
    const attnd_cfg_geometry *g = &obs->geo;
    int n = snprintf(buf, cap,
                     "{\"num_layers\":%u,\"num_q_heads\":%u,\"num_kv_heads\":%u,"
                     "\"head_size\":%u,\"block_size\":%u,\"cache_dtype\":\"%s\","
                     "\"num_blocks\":%u,\"max_blocks_per_seq\":%u,\"window_release\":%u,"
                     "\"layers\":",
                     g->num_layers, g->num_q_heads, g->num_kv_heads, g->head_size, g->block_size,
                     attnd_dtype_name((attnd_dtype)g->cache_dtype), g->num_blocks,
                     g->max_blocks_per_seq, attnd_config_window_all(g));
    size_t k = n > 0 ? (size_t)n : 0;
    k += attnd_config_layers_json(g, k < cap ? buf + k : NULL, k < cap ? cap - k : 0);
    if (k + 1 < cap) buf[k] = '}', buf[k + 1] = '\0';
    return k + 1;
}

attnd_err attnd_observe_status_json(attnd_observe *obs, char *buf, size_t cap, size_t *len)
{
    const attnd_metrics *m = obs->metrics;
    const attnd_cfg_geometry *g = &obs->geo;
    int64_t free_blocks = attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_BLOCKS_FREE);
    int64_t mps = attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_MPS);
    int n = snprintf(buf, cap,
                     "{\"version\":\"%s\",\"backend\":\"%s\",\"listen\":\"%s\",\"uptime_s\":%.3f,"
                     "\"draining\":%s,\"geometry\":",
                     ATTND_VERSION_STRING, obs->backend, obs->listen_json,
                     attnd_metrics_uptime_s(m), atomic_load(&obs->draining) ? "true" : "false");
    if (n < 0) return ATTND_ERR_INTERNAL;
    size_t k = (size_t)n;
    k += status_geometry(obs, k < cap ? buf + k : NULL, k < cap ? cap - k : 0);
    n = snprintf(k < cap ? buf + k : NULL, k < cap ? cap - k : 0,
                 ",\"memory\":{\"device\":\"%s\",\"bytes\":%llu},\"mps\":%s,"
                 "\"stream_channels\":%lld,\"blocks\":{\"used\":%lld,\"free\":%lld},"
                 "\"sequences\":%lld,\"sessions\":%lld,"
                 "\"clients\":%lld,\"queue_depth\":%lld,\"inflight\":%lld,\"requests\":%llu,"
                 "\"errors\":%llu}\n",
                 obs->device_json, (unsigned long long)obs->memory_bytes,
                 mps < 0 ? "null" : (mps ? "true" : "false"),
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_STREAMS),
                 (long long)g->num_blocks - (long long)free_blocks, (long long)free_blocks,
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_SEQUENCES),
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_SESSIONS),
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_CONNECTIONS),
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH),
                 (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_INFLIGHT),
                 (unsigned long long)attnd_metrics_requests_total(m),
                 (unsigned long long)attnd_metrics_errors_total(m));
    if (n < 0) return ATTND_ERR_INTERNAL;
    k += (size_t)n;
    *len = k;
    return k < cap ? ATTND_ERR_OK : ATTND_ERR_NO_MEMORY;
}

/* ---------------------------------------------------------------- lifecycle */

attnd_err attnd_observe_start(attnd_observe *obs, const char *backend, char *err, size_t n)
{
    attnd_metrics *m = NULL;
    snprintf(obs->backend, sizeof(obs->backend), "%s", backend);
    /* the build info label wants the real backend: swap in fresh metrics before any traffic */
    if (attnd_metrics_alloc(&m, ATTND_VERSION_STRING, backend) == ATTND_ERR_OK) {
        attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_BLOCKS_FREE, obs->geo.num_blocks);
        attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_MPS,
                                attnd_metrics_gauge(obs->metrics, ATTND_METRICS_GAUGE_MPS));
        attnd_metrics_free(obs->metrics);
        obs->metrics = m;
    }
    if (obs->http_url[0] == '\0') return ATTND_ERR_OK;
    attnd_http_hooks hooks = {.healthy = observe_healthy_cb,
                              .status = observe_status_cb,
                              .metrics = observe_metrics_cb,
                              .arg = obs};
    attnd_err rv = attnd_http_alloc(&obs->http, obs->http_url, &hooks, &obs->http_limits);
    if (rv != ATTND_ERR_OK)
        return attnd_errf(err, n, rv, "http.listen: cannot serve %s: %s", obs->http_url,
                          attnd_strerror(rv));
    ATTND_LOG(obs->log, ATTND_LOG_INFO, "event=http_listen url=%s port=%u", obs->http_url,
              attnd_http_port(obs->http));
    return ATTND_ERR_OK;
}

void attnd_observe_free(attnd_observe *obs)
{
    if (obs == NULL) return;
    attnd_http_free(obs->http);
    const attnd_metrics *m = obs->metrics;
    ATTND_LOG(
        obs->log, ATTND_LOG_INFO,
        "event=final_stats requests=%llu errors=%llu inflight=%lld sessions_reclaimed=%llu "
        "log_suppressed=%llu",
        (unsigned long long)attnd_metrics_requests_total(m),
        (unsigned long long)attnd_metrics_errors_total(m),
        (long long)attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_INFLIGHT),
        (unsigned long long)attnd_metrics_event_count(m, ATTND_METRICS_EVENT_SESSIONS_RECLAIMED),
        (unsigned long long)attnd_ratelimit_suppressed_total(&obs->rl));
    attnd_metrics_free(obs->metrics);
    attnd_ratelimit_fini(&obs->rl);
    free(obs);
}

void attnd_observe_ready(attnd_observe *obs)
{
    char status[ATTND_CFG_URL_MAX + 32];
    snprintf(status, sizeof(status), "serving %s", obs->listen);
    if (attnd_notify_ready(&obs->notify, status) != ATTND_ERR_OK)
        ATTND_LOG(obs->log, ATTND_LOG_WARN, "event=notify_failed what=READY");
    if (attnd_notify_enabled(&obs->notify))
        ATTND_LOG(obs->log, ATTND_LOG_INFO, "event=notify_ready impl=%s watchdog_ms=%llu",
                  attnd_notify_impl(), (unsigned long long)(obs->watchdog_ns * 2 / 1000000));
}

void attnd_observe_tick(attnd_observe *obs, uint32_t queue_depth)
{
    uint64_t now = attnd_clock_ns();
    atomic_store(&obs->loop_tick_ns, now);
    attnd_metrics_gauge_set(obs->metrics, ATTND_METRICS_GAUGE_QUEUE_DEPTH, queue_depth);
    if (obs->watchdog_ns == 0 || now - obs->last_watchdog_ns < obs->watchdog_ns) return;
    /* the executor must be alive too: a wedged kernel stops the pings and systemd restarts us */
    uint64_t exec = atomic_load(&obs->exec_tick_ns);
    if (now > exec && now - exec > OBSERVE_EXEC_STALE_NS) return;
    obs->last_watchdog_ns = now;
    attnd_notify_watchdog(&obs->notify);
}

void attnd_observe_serving(attnd_observe *obs, uint32_t waiting, uint64_t replies)
{
    if (waiting == 0 || replies != obs->last_replies)
        atomic_store(&obs->served_ns, attnd_clock_ns());
    obs->last_replies = replies;
    atomic_store(&obs->waiting, waiting);
}

void attnd_observe_gauges(attnd_observe *obs, uint32_t blocks_free, uint32_t sequences,
                          uint32_t sessions)
{
    attnd_metrics *m = obs->metrics;
    atomic_store(&obs->exec_tick_ns, attnd_clock_ns());
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_BLOCKS_FREE, blocks_free);
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_BLOCKS_USED,
                            (int64_t)obs->geo.num_blocks - (int64_t)blocks_free);
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_SEQUENCES, sequences);
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_SESSIONS, sessions);
}

void attnd_observe_reload(attnd_observe *obs, attnd_err rv, const char *err)
{
    char status[600];
    attnd_notify_reloading(&obs->notify, NULL);
    attnd_metrics_event(obs->metrics, rv == ATTND_ERR_OK ? ATTND_METRICS_EVENT_RELOADS_OK
                                                         : ATTND_METRICS_EVENT_RELOADS_FAILED);
    if (rv == ATTND_ERR_OK)
        snprintf(status, sizeof(status), "serving %s (reloaded)", obs->listen);
    else
        snprintf(status, sizeof(status), "serving %s (reload failed: %s)", obs->listen,
                 err ? err : attnd_strerror(rv));
    attnd_notify_ready(&obs->notify, status);
}

void attnd_observe_drain(attnd_observe *obs)
{
    atomic_store(&obs->draining, true);
    attnd_notify_stopping(&obs->notify, "draining in-flight requests");
}

int attnd_observe_log_allowed(attnd_observe *obs, const char *key, uint64_t *suppressed)
{
    if (attnd_ratelimit_allow(&obs->rl, key, attnd_clock_ns(), suppressed)) return 1;
    attnd_metrics_event(obs->metrics, ATTND_METRICS_EVENT_LOG_SUPPRESSED);
    return 0;
}
