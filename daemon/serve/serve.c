#include "serve.h"

#include <stdlib.h>
#include <string.h>

#include "../wire/channel_transport.h"
#include "attnd/clock.h"

/* How long a released stream channel may take to run out before it counts as stuck. */
#define SERVE_STREAM_DRAIN_MS 2000

attnd_err attnd_serve_alloc(attnd_serve **out, const attnd_config *cfg, attnd_backend *be,
                            int32_t units, attnd_log *lg, char *err, size_t n)
{
    attnd_err rv;
    *out = NULL;
    attnd_serve *sv = calloc(1, sizeof *sv);
    if (sv == NULL) return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "out of memory");
    sv->log = lg;
    sv->be = be;
    sv->limits = cfg->limits;
    memcpy(sv->token, cfg->server.token, sizeof sv->token);
    sv->start_ms = attnd_clock_ms();
    sv->mps = -1;
    attnd_sessions_init(&sv->sessions);
    if ((rv = attnd_model_init(&sv->model, cfg, err, n)) == ATTND_ERR_OK &&
        (rv = attnd_model_check_backend(&sv->model, be, err, n)) == ATTND_ERR_OK) {
        rv = attnd_devmem_alloc(&sv->dm, &sv->model, be, units, &sv->limits, lg);
        if (rv == ATTND_ERR_OK)
            rv = attnd_cache_alloc(&sv->cache, sv->model.geo.num_blocks, sv->model.geo.block_size,
                                   sv->model.geo.max_blocks_per_seq, sv->model.lin.slots);
        if (rv != ATTND_ERR_OK)
            attnd_errf(err, n, rv, "geometry: cannot allocate the cache: %s", attnd_strerror(rv));
    }
    if (rv != ATTND_ERR_OK) {
        attnd_cache_free(sv->cache);
        attnd_devmem_free(sv->dm);
        attnd_model_fini(&sv->model);
        free(sv);
        return rv;
    }
    attnd_cache_set_window(sv->cache, sv->model.window_all);
    attnd_steps_init(&sv->steps, &sv->model, sv->dm, sv->cache);
    attnd_streams_init(&sv->streams, &sv->steps, lg, cfg->server.streams,
                       cfg->limits.stream_timeout_ms, SERVE_STREAM_DRAIN_MS);
    attnd_streams_set_reply(&sv->streams, attnd_serve_stream_reply, sv);
    attnd_inflight_init(&sv->inflight, sv->dm);
    *out = sv;
    return ATTND_ERR_OK;
}

void attnd_serve_free(attnd_serve *sv)
{
    if (sv == NULL) return;
    attnd_inflight_fini(&sv->inflight);
    attnd_streams_fini(&sv->streams); /* before the steps its channels run */
    attnd_steps_fini(&sv->steps);
    attnd_sessions_fini(&sv->sessions);
    attnd_cache_free(sv->cache);
    attnd_devmem_free(sv->dm);
    attnd_model_fini(&sv->model);
    attnd_channels_free(sv->channels); /* after the sessions that opened them */
    attnd_shmguard_free(sv->guard);    /* last: regions and channels were watched by it */
    free(sv);
}

/* Same-GPU workers hand layers over on GPU streams: two CUDA contexts without MPS time-slice
 * (DESIGN.md "Same-GPU sharing": 294 us per layer against 29.9 us under MPS, measured). */
static void serve_report_mps(attnd_serve *sv, attnd_observe *obs)
{
    int mps = -1;
    if (!attnd_backend_is_device(sv->be)) return;
    if (attnd_device_mps(sv->be, &mps) != ATTND_ERR_OK) mps = -1;
    sv->mps = mps;
    attnd_observe_set_mps(obs, mps);
    if (mps == 1) {
        ATTND_LOG(sv->log, ATTND_LOG_INFO, "event=mps active=1 device=\"%s\"", sv->dm->device_name);
        return;
    }
    ATTND_LOG(sv->log, ATTND_LOG_WARN,
              "event=mps active=%d device=\"%s\" cost_us_per_layer=263 msg=\"not an MPS client: "
              "workers on this GPU time-slice with the daemon (+263 us per layer measured, 29.9 us "
              "under MPS); start the MPS control daemon before attnd (deploy/mps)\"",
              mps, sv->dm->device_name);
}

void attnd_serve_set_observe(attnd_serve *sv, attnd_observe *obs)
{
    sv->metrics = attnd_observe_metrics(obs);
    sv->log_limit = attnd_observe_ratelimit(obs);
    sv->steps.metrics = sv->metrics;
    sv->inflight.metrics = sv->metrics;
    sv->streams.metrics = sv->metrics;
    serve_report_mps(sv, obs);
}

attnd_err attnd_serve_open_shm(attnd_serve *sv, const attnd_config *cfg, char *err, size_t n)
{
    attnd_err rv;
    const attnd_cfg_limits *l = &cfg->limits;
    uint64_t cap = (uint64_t)cfg->server.channels + (uint64_t)l->max_sessions * l->max_regions;
    if (cap < 1024) cap = 1024; /* room for limits raised by a reload */
    if (cap > INT32_MAX) cap = INT32_MAX;
    if ((rv = attnd_shmguard_alloc(&sv->guard, (uint32_t)cap)) != ATTND_ERR_OK)
        return attnd_errf(err, n, rv, "shmguard: cannot watch %llu mappings: %s",
                          (unsigned long long)cap, attnd_strerror(rv));
    sv->streams.guard = sv->guard; /* host backends' flag words are shm the workers map too */
    if (cfg->server.channels == 0) return ATTND_ERR_OK;
    if ((rv = attnd_channels_alloc(&sv->channels, sv->guard, cfg->server.channels, sv->log)))
        return attnd_errf(err, n, rv, "server.channels: cannot set up %u channels: %s",
                          cfg->server.channels, attnd_strerror(rv));
    attnd_channels_set_session_limit(sv->channels, cfg->server.max_inflight_per_session);
    return ATTND_ERR_OK;
}

/* What one request may decode into follows the live limits: a BeginStep of max_seqs entries
 * of a few fields each, plus room for tensor shapes and the like. */
static void serve_wire_limits(attnd_serve *sv)
{
    if (sv->wire) attnd_wire_set_max_elements(sv->wire, 8u * sv->limits.max_seqs + 65536u);
}

void attnd_serve_attach(attnd_serve *sv, attnd_wire *w, uint32_t spin_us)
{
    sv->wire = w;
    sv->spin_us = spin_us;
    serve_wire_limits(sv);
}

/* ---------------------------------------------------------------- the executor's poller */

static uint32_t serve_poll_cb(void *arg, int *inflight)
{
    attnd_serve *sv = arg;
    int hot = 0;
    uint32_t n = attnd_inflight_poll(&sv->inflight);
    if (sv->channels && sv->wire) n += attnd_channel_transport_poll(sv->wire, sv->channels);
    if (sv->streams.head) n += attnd_streams_poll(&sv->streams, &hot);
    *inflight = attnd_inflight_count(&sv->inflight) != 0 || hot;
    return n;
}

static int serve_idle_cb(void *arg, int awake)
{
    attnd_serve *sv = arg;
    if (sv->channels == NULL) return 0;
    return attnd_channels_set_polling(sv->channels, awake) && !awake;
}

attnd_exec_poller attnd_serve_poller(attnd_serve *sv)
{
    attnd_exec_poller p = {sv, serve_poll_cb, serve_idle_cb};
    return p;
}

/* ---------------------------------------------------------------- control events */

static void serve_session_gone(attnd_session *s, void *arg)
{
    attnd_serve *sv = arg;
    if (sv->channels) {
        attnd_inflight_drain(&sv->inflight); /* replies still owed through them go out first */
        attnd_channels_close_session(sv->channels, s->id);
    }
    attnd_steps_abort_session(&sv->steps, s);
    ATTND_LOG(sv->log, ATTND_LOG_INFO,
              "event=disconnect session=%llu pipe=%u seqs=%u reclaim_ms=%u",
              (unsigned long long)s->id, s->pipe, s->nseqs, sv->limits.reclaim_timeout_ms);
}

void attnd_serve_pipe_closed(attnd_serve *sv, uint32_t pipe)
{
    attnd_inflight_drain(&sv->inflight); /* its CUDA_IPC regions close next: no kernel may
                                            still read them */
    for (attnd_session *s = sv->sessions.head; s; s = s->next)
        if (s->pipe == pipe && s->connected) attnd_streams_drop_session(&sv->streams, s->id);
    attnd_sessions_disconnect(&sv->sessions, pipe, attnd_clock_ms(), serve_session_gone, sv);
    /* those without sequences (and any, with no reclaim timeout) go at once: nothing to keep,
     * and fast connect/Hello/close cycles must not hold the session slots */
    attnd_serve_sweep(sv);
}

void attnd_serve_sweep(attnd_serve *sv)
{
    attnd_session *s;
    uint64_t now = attnd_clock_ms();
    attnd_streams_tick(&sv->streams); /* stream steps' deadlines */
    while ((s = attnd_sessions_expired(&sv->sessions, now, sv->limits.reclaim_timeout_ms))) {
        uint32_t n = attnd_cache_release_owner(sv->cache, s->id);
        if (sv->metrics) attnd_metrics_event(sv->metrics, ATTND_METRICS_EVENT_SESSIONS_RECLAIMED);
        ATTND_LOG(sv->log, ATTND_LOG_INFO, "event=reclaim session=%llu seqs=%u blocks_free=%u",
                  (unsigned long long)s->id, n, attnd_cache_blocks_free(sv->cache));
        attnd_session_close(&sv->sessions, s);
    }
}

void attnd_serve_apply_live(attnd_serve *sv, const attnd_config *cfg)
{
    sv->limits = cfg->limits;
    memcpy(sv->token, cfg->server.token, sizeof sv->token);
    sv->streams.t.step_ms = cfg->limits.stream_timeout_ms;
    serve_wire_limits(sv);
}

void attnd_serve_counts(attnd_serve *sv, uint64_t *requests, uint64_t *errors)
{
    uint64_t ok = 0;
    *requests = 0;
    if (sv->wire) attnd_wire_counts(sv->wire, requests, &ok);
    *errors = *requests - ok;
}

void attnd_serve_log_stats(attnd_serve *sv)
{
    uint64_t req, errors;
    attnd_serve_counts(sv, &req, &errors);
    ATTND_LOG(sv->log, ATTND_LOG_INFO,
              "event=stats requests=%llu errors=%llu sessions=%u seqs=%u blocks_free=%u/%u "
              "steps_open=%llu",
              (unsigned long long)req, (unsigned long long)errors, sv->sessions.count,
              attnd_cache_num_seqs(sv->cache), attnd_cache_blocks_free(sv->cache),
              sv->model.geo.num_blocks, (unsigned long long)attnd_steps_count(&sv->steps));
}

void attnd_serve_gauges(attnd_serve *sv, attnd_observe *obs)
{
    attnd_observe_gauges(obs, attnd_cache_blocks_free(sv->cache), attnd_cache_num_seqs(sv->cache),
                         sv->sessions.count);
    if (sv->metrics)
        attnd_metrics_gauge_set(sv->metrics, ATTND_METRICS_GAUGE_STREAMS, sv->streams.count);
}
