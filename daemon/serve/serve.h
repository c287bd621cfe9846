/* daemon/serve: the request handlers and what they share. This header is the serving context:
 * the daemon's state (model, device memory, cache, sessions, steps), the live limits, the
 * in-flight replies, and the pieces the wiring attaches (metrics, the SIGBUS guard, the
 * channels, the wire's reply counts). Handlers live in serve/req_*.c as tables of {fn, flags}
 * (serve/handler.h), run by serve/dispatch.h; everything here runs on the executor thread. */
#ifndef ATTND_SERVE_SERVE_H
#define ATTND_SERVE_SERVE_H

#include <stdint.h>

#include "../core/config.h"
#include "../core/exec.h"
#include "../core/log.h"
#include "../core/shmguard.h"
#include "../obs/metrics.h"
#include "../obs/observe.h"
#include "../obs/ratelimit.h"
#include "../state/cache.h"
#include "../state/devmem.h"
#include "../state/model.h"
#include "../state/session.h"
#include "../state/step.h"
#include "../state/stream.h"
#include "../wire/channel.h"
#include "../wire/wire.h"
#include "inflight.h"

/* Version of proto/attnd.proto this daemon speaks (Hello.protocol_version). */
#define ATTND_PROTOCOL_VERSION 1

typedef struct attnd_serve {
    attnd_log *log;
    attnd_backend *be;
    attnd_model model;
    attnd_devmem *dm;
    attnd_cache *cache;
    attnd_sessions sessions;
    attnd_steps steps;     /* open steps of every session */
    attnd_streams streams; /* stream channels (stream-ordered steps) */
    attnd_inflight inflight;
    attnd_cfg_limits limits;         /* live */
    char token[ATTND_CFG_TOKEN_MAX]; /* live */
    uint64_t start_ms;
    int mps; /* 1: the device is shared through NVIDIA MPS, 0: not, -1: unknown (host backend) */
    attnd_metrics *metrics;     /* kernel time and bytes by kind; NULL = not counted */
    attnd_ratelimit *log_limit; /* repeated request errors logged at this rate; NULL = all */
    /* NULL = none: the wire whose reply counts Status reports (attnd_serve_attach); the SIGBUS
     * guard over client-owned mappings (HOST_SHM regions, channels) and the shared-memory
     * channels (attnd_serve_open_shm). */
    attnd_wire *wire;
    attnd_shmguard *guard;
    attnd_channels *channels;
    uint32_t spin_us; /* the executor's idle polling window, told to channel clients */
} attnd_serve;

/* The state for cfg on backend be (which must outlive sv): cache pools, linear state,
 * workspaces. units: the cpu backend's threads (>= 1). UNSUPPORTED when the backend cannot run
 * a layer's options (err names the key), NO_MEMORY or the backend's code otherwise. */
attnd_err attnd_serve_alloc(attnd_serve **sv, const attnd_config *cfg, attnd_backend *be,
                            int32_t units, attnd_log *lg, char *err, size_t n);
/* Complete in-flight replies, release every step, session, sequence and pool. */
void attnd_serve_free(attnd_serve *sv);
/* Count kernel time in obs's metrics and rate-limit request error lines through it (after
 * attnd_observe_start, before serving). */
void attnd_serve_set_observe(attnd_serve *sv, attnd_observe *obs);
/* Watch client-owned shared memory (a client that truncates its object fails its own requests,
 * not the daemon): the SIGBUS guard with room for every session's regions, and cfg's channels
 * (server.channels, 0 = none). Freed by attnd_serve_free. err says what failed. */
attnd_err attnd_serve_open_shm(attnd_serve *sv, const attnd_config *cfg, char *err, size_t n);
/* Attach the wire whose replies Status counts and channel requests go through, and the
 * executor's idle spin window (told to channel clients). */
void attnd_serve_attach(attnd_serve *sv, attnd_wire *w, uint32_t spin_us);
/* What the executor polls between queued items: in-flight replies, then channel posts. */
attnd_exec_poller attnd_serve_poller(attnd_serve *sv);

/* Connection pipe dropped: its sessions' channels close, open steps abort, regions unmap;
 * sessions holding sequences wait for limits.reclaim_timeout_ms (attnd_serve_sweep), the others
 * are closed at once. */
void attnd_serve_pipe_closed(attnd_serve *sv, uint32_t pipe);
/* Reclaim sessions whose connection dropped more than limits.reclaim_timeout_ms ago. */
void attnd_serve_sweep(attnd_serve *sv);
/* Apply the live keys of a validated configuration (limits, token). */
void attnd_serve_apply_live(attnd_serve *sv, const attnd_config *cfg);
/* One key=value stats line at info level. */
void attnd_serve_log_stats(attnd_serve *sv);
/* The stream channels' reply callback: answers a held StreamEnd (serve/req_stream.c). */
void attnd_serve_stream_reply(void *arg, void *owed, attnd_err code, const char *msg);
/* Refresh the gauges obs shows (blocks free, sequences, sessions). */
void attnd_serve_gauges(attnd_serve *sv, attnd_observe *obs);
/* Replies sent and errors among them (0 without a wire). */
void attnd_serve_counts(attnd_serve *sv, uint64_t *requests, uint64_t *errors);

#endif
