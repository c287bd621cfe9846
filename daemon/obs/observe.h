/* Observability: the daemon's metrics, its operator HTTP endpoint (/healthz, /status,
 * /metrics), service-manager notifications (sd_notify) and log rate limiting, behind one object
 * so that main.c only calls it at the points of the daemon's life:
 *
 *   attnd_observe_alloc       after the config is loaded (metrics, rate limiter, notify socket)
 *   attnd_observe_start       once the backend is open: the HTTP endpoint when http.listen is set
 *   attnd_observe_ready       the socket listens and the cache is allocated: READY=1
 *   attnd_observe_tick        every loop tick (libuv loop thread): WATCHDOG=1 when due, and the
 *                             executor queue depth
 *   attnd_observe_serving     every loop tick: requests waiting and replies sent so far (a server
 *                             with requests waiting and no reply leaving is not healthy)
 *   attnd_observe_gauges      from the executor thread, which owns the cache: blocks, sequences,
 *                             sessions
 *   attnd_observe_reload      after a SIGHUP reload (ok or not): counters, RELOADING/READY
 *   attnd_observe_drain       SIGTERM: STOPPING=1, /healthz turns 503
 *   attnd_observe_free        last (after the server and the executor): one final stats line
 *
 * The HTTP hooks read only this object (atomics and copies made at start), never the cache, so
 * they need no lock and cannot block a request.
 */
#ifndef ATTND_OBS_OBSERVE_H
#define ATTND_OBS_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"
#include "../core/config.h"
#include "../core/log.h"
#include "metrics.h"
#include "ratelimit.h"

typedef struct attnd_observe attnd_observe;

/* Log lines of one key (e.g. "request:PROTOCOL") pass at this rate once the burst is spent. */
#define ATTND_OBSERVE_LOG_RATE 1.0
#define ATTND_OBSERVE_LOG_BURST 10.0

/* Copy what /status shows from cfg (geometry, listen URL), read the notify environment. */
attnd_err attnd_observe_alloc(attnd_observe **obs, const attnd_config *cfg, attnd_log *lg);
/* The cache as allocated (num_blocks differs from the file's when geometry.gpu_memory_fraction
 * sized it), the device ("" for cpu) and the backend memory the daemon took at start; shown by
 * /status. Call before attnd_observe_start. */
void attnd_observe_set_memory(attnd_observe *obs, uint32_t num_blocks, const char *device,
                              uint64_t bytes);
/* Whether the daemon's CUDA context is an MPS client: 1, 0, or -1 (cpu backend, unknown);
 * /status "mps" (true, false, null) and the attnd_mps gauge. */
void attnd_observe_set_mps(attnd_observe *obs, int mps);
/* Start the HTTP endpoint if cfg's http.listen is set. On failure err names the key. */
attnd_err attnd_observe_start(attnd_observe *obs, const char *backend, char *err, size_t n);
/* Stop the HTTP endpoint, log a final `event=final_stats` line, free. NULL is a no-op. */
void attnd_observe_free(attnd_observe *obs);

attnd_metrics *attnd_observe_metrics(attnd_observe *obs);
attnd_ratelimit *attnd_observe_ratelimit(attnd_observe *obs);
/* The port the HTTP endpoint listens on (0 when off). */
uint16_t attnd_observe_http_port(const attnd_observe *obs);

void attnd_observe_ready(attnd_observe *obs);
void attnd_observe_tick(attnd_observe *obs, uint32_t queue_depth);
/* Loop thread: requests received and not answered, and replies sent in all. */
void attnd_observe_serving(attnd_observe *obs, uint32_t waiting, uint64_t replies);
void attnd_observe_gauges(attnd_observe *obs, uint32_t blocks_free, uint32_t sequences,
                          uint32_t sessions);
/* rv: the reload's result; err: why it failed (may be NULL when rv is OK). */
void attnd_observe_reload(attnd_observe *obs, attnd_err rv, const char *err);
void attnd_observe_drain(attnd_observe *obs);

/* Whether a line with this key may be logged now; when not, it is counted as suppressed.
 * *suppressed gets the count to print with an allowed line. */
int attnd_observe_log_allowed(attnd_observe *obs, const char *key, uint64_t *suppressed);

/* The /status document (JSON) into buf: the http.h render contract. */
attnd_err attnd_observe_status_json(attnd_observe *obs, char *buf, size_t cap, size_t *len);

#endif
