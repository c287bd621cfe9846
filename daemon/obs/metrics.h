/* Metrics: lock-free counters, gauges and fixed-bucket histograms for the daemon, rendered in
 * the Prometheus text exposition format (version 0.0.4).
 *
 * Every update is a relaxed atomic on a preallocated slot: safe from any thread (the NNG
 * receive callbacks, the executor, the libuv loop) and never blocking. A render reads each slot
 * once; counts written during a render may or may not be included, but a histogram's _count
 * always equals its +Inf bucket. The object holds no global state: the daemon allocates one.
 */
#ifndef ATTND_OBS_METRICS_H
#define ATTND_OBS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

/* Request types, XX(NAME, label, field): `field` is the Request.body oneof field number in
 * proto/attnd.proto, so the server maps a decoded request with attnd_metrics_req_from_field().
 * INVALID counts messages that did not decode or carried no body. */
#define ATTND_METRICS_REQ_MAP(XX)                                                                  \
    XX(INVALID, "invalid", 0)                                                                      \
    XX(HELLO, "hello", 10)                                                                         \
    XX(REGISTER_REGION, "register_region", 11)                                                     \
    XX(UNREGISTER_REGION, "unregister_region", 12)                                                 \
    XX(CREATE, "create", 13)                                                                       \
    XX(FORK, "fork", 14)                                                                           \
    XX(FREE, "free", 15)                                                                           \
    XX(QUERY, "query", 16)                                                                         \
    XX(LIST, "list", 17)                                                                           \
    XX(BEGIN_STEP, "begin_step", 18)                                                               \
    XX(ATTEND, "attend", 19)                                                                       \
    XX(END_STEP, "end_step", 20)                                                                   \
    XX(MERGE, "merge", 21)                                                                         \
    XX(VARLEN, "varlen", 22)                                                                       \
    XX(BLOCKSPARSE, "blocksparse", 23)                                                             \
    XX(LINEAR_PREFILL, "linear_prefill", 24)                                                       \
    XX(LINEAR_DECODE, "linear_decode", 25)                                                         \
    XX(STATUS, "status", 26)                                                                       \
    XX(OPEN_CHANNEL, "open_channel", 27)                                                           \
    XX(CLOSE_CHANNEL, "close_channel", 28)                                                         \
    XX(WAKE_CHANNEL, "wake_channel", 29)                                                           \
    XX(TRUNCATE, "truncate", 30)

typedef enum attnd_metrics_req {
#define ATTND_METRICS_REQ_ENUM(name, label, field) ATTND_METRICS_REQ_##name,
    ATTND_METRICS_REQ_MAP(ATTND_METRICS_REQ_ENUM)
#undef ATTND_METRICS_REQ_ENUM
        ATTND_METRICS_REQ_COUNT
} attnd_metrics_req;

/* Gauges, XX(NAME, metric name, help). */
#define ATTND_METRICS_GAUGE_MAP(XX)                                                                \
    XX(QUEUE_DEPTH, "attnd_queue_depth", "Requests waiting for the executor.")                     \
    XX(INFLIGHT, "attnd_requests_inflight", "Requests received and not yet answered.")             \
    XX(BLOCKS_USED, "attnd_blocks_used", "KV cache blocks in use.")                                \
    XX(BLOCKS_FREE, "attnd_blocks_free", "KV cache blocks free.")                                  \
    XX(SEQUENCES, "attnd_sequences", "Live sequences, all sessions.")                              \
    XX(SESSIONS, "attnd_sessions", "Client sessions, including dropped ones not yet reclaimed.")   \
    XX(CONNECTIONS, "attnd_connections", "Open client connections.")                               \
    XX(REGIONS, "attnd_regions", "Registered memory regions, all sessions.")                       \
    XX(MPS, "attnd_mps",                                                                           \
       "1 when the daemon's CUDA context is an MPS client (what same-GPU "                         \
       "workers need), 0 when not, -1 on the cpu backend.")                                        \
    XX(STREAMS, "attnd_stream_channels", "Stream channels (stream-ordered steps) open.")

typedef enum attnd_metrics_gauge_id {
#define ATTND_METRICS_GAUGE_ENUM(name, metric, help) ATTND_METRICS_GAUGE_##name,
    ATTND_METRICS_GAUGE_MAP(ATTND_METRICS_GAUGE_ENUM)
#undef ATTND_METRICS_GAUGE_ENUM
        ATTND_METRICS_GAUGE_COUNT
} attnd_metrics_gauge_id;

/* Kernel kinds, XX(NAME, label): paged attention 2D (prefill, mixed batches), 3D (split-KV
 * decode; its reduce runs inside the same backend call and is counted here), the cache write,
 * and everything else (merge, varlen, blocksparse, linear). Time is measured on the host around
 * the calls up to the backend's sync, so on an asynchronous device the wait lands on the last
 * kernel of a request. Bytes are the tensors' sizes plus the KV cache rows read (estimated from
 * the launch's longest sequence for attention). */
#define ATTND_METRICS_KERNEL_MAP(XX)                                                               \
    XX(PAGED_2D, "2d")                                                                             \
    XX(PAGED_3D, "3d")                                                                             \
    XX(CACHE_WRITE, "cache_write")                                                                 \
    XX(OTHER, "other")

typedef enum attnd_metrics_kernel_kind {
#define ATTND_METRICS_KERNEL_ENUM(name, label) ATTND_METRICS_KERNEL_##name,
    ATTND_METRICS_KERNEL_MAP(ATTND_METRICS_KERNEL_ENUM)
#undef ATTND_METRICS_KERNEL_ENUM
        ATTND_METRICS_KERNEL_COUNT
} attnd_metrics_kernel_kind;

/* Plain event counters, XX(NAME, metric name, help). */
#define ATTND_METRICS_EVENT_MAP(XX)                                                                \
    XX(SESSIONS_OPENED, "attnd_sessions_opened_total", "Sessions opened by Hello.")                \
    XX(SESSIONS_RECLAIMED, "attnd_sessions_reclaimed_total",                                       \
       "Sessions reclaimed after their connection dropped.")                                       \
    XX(AUTH_FAILURES, "attnd_auth_failures_total", "Hello requests refused for a bad token.")      \
    XX(DROPPED_MESSAGES, "attnd_dropped_messages_total",                                           \
       "Requests left without a reply (no memory for one).")                                       \
    XX(RELOADS_OK, "attnd_config_reloads_total", "Configuration reloads applied.")                 \
    XX(RELOADS_FAILED, "attnd_config_reload_failures_total",                                       \
       "Configuration reloads rejected (the old configuration stays).")                            \
    XX(LOG_SUPPRESSED, "attnd_log_suppressed_total", "Log lines suppressed by rate limiting.")     \
    XX(SEND_TIMEOUTS, "attnd_send_timeouts_total",                                                 \
       "Connections closed because their client did not take a reply in time.")                    \
    XX(LISTENERS_REPLACED, "attnd_listeners_replaced_total",                                       \
       "Listeners replaced after they stopped accepting (nanomsg/nng#1518, NNG < 1.6).")           \
    XX(STREAM_RELEASES, "attnd_stream_releases_total",                                             \
       "Stream steps released by the daemon (timeout, abort while queued, disconnect).")

typedef enum attnd_metrics_event_id {
#define ATTND_METRICS_EVENT_ENUM(name, metric, help) ATTND_METRICS_EVENT_##name,
    ATTND_METRICS_EVENT_MAP(ATTND_METRICS_EVENT_ENUM)
#undef ATTND_METRICS_EVENT_ENUM
        ATTND_METRICS_EVENT_COUNT
} attnd_metrics_event_id;

/* Latency bucket upper bounds in nanoseconds (5 us .. 10 s); +Inf follows the last. */
#define ATTND_METRICS_LATENCY_BUCKETS 20

typedef struct attnd_metrics attnd_metrics;

/* Allocate zeroed metrics. `version` and `backend` label attnd_build_info (copied; NULL reads as
 * "unknown"). Returns ATTND_ERR_NO_MEMORY when allocation fails. */
attnd_err attnd_metrics_alloc(attnd_metrics **out, const char *version, const char *backend);
void attnd_metrics_free(attnd_metrics *m);

/* The request type for a Request.body oneof field number; INVALID for anything unknown. */
attnd_metrics_req attnd_metrics_req_from_field(uint32_t field);
/* The label of a request type ("attend"), "invalid" out of range. */
const char *attnd_metrics_req_label(attnd_metrics_req req);

/* One answered request: its type, its reply code (an attnd_err value; others count as
 * "UNKNOWN") and the time from receipt to reply. */
void attnd_metrics_request(attnd_metrics *m, attnd_metrics_req req, uint32_t code,
                           uint64_t latency_ns);
void attnd_metrics_gauge_set(attnd_metrics *m, attnd_metrics_gauge_id g, int64_t value);
void attnd_metrics_gauge_add(attnd_metrics *m, attnd_metrics_gauge_id g, int64_t delta);
/* One kernel launch (or a fused group of one kind): device time and bytes read plus written. */
void attnd_metrics_kernel(attnd_metrics *m, attnd_metrics_kernel_kind kind, uint64_t ns,
                          uint64_t bytes);
/* Bytes received and sent on the request socket. */
void attnd_metrics_wire(attnd_metrics *m, uint64_t rx_bytes, uint64_t tx_bytes);
void attnd_metrics_event(attnd_metrics *m, attnd_metrics_event_id ev);

/* Readers (for /status, attnctl and tests). Out-of-range arguments read 0. */
uint64_t attnd_metrics_requests(const attnd_metrics *m, attnd_metrics_req req, uint32_t code);
uint64_t attnd_metrics_requests_total(const attnd_metrics *m);
/* Requests answered with a non-zero code, all types. */
uint64_t attnd_metrics_errors_total(const attnd_metrics *m);
/* Count in latency bucket `i` (0..ATTND_METRICS_LATENCY_BUCKETS, the last being +Inf), not
 * cumulative. */
uint64_t attnd_metrics_latency_bucket(const attnd_metrics *m, attnd_metrics_req req, int i);
/* Upper bound of latency bucket i in nanoseconds; UINT64_MAX for +Inf. */
uint64_t attnd_metrics_latency_bound_ns(int i);
int64_t attnd_metrics_gauge(const attnd_metrics *m, attnd_metrics_gauge_id g);
uint64_t attnd_metrics_event_count(const attnd_metrics *m, attnd_metrics_event_id ev);
uint64_t attnd_metrics_kernel_ns(const attnd_metrics *m, attnd_metrics_kernel_kind kind);
/* Seconds since attnd_metrics_alloc. */
double attnd_metrics_uptime_s(const attnd_metrics *m);

/* Render every metric in the Prometheus text format (HELP and TYPE lines, one sample per line)
 * into buf (cap bytes, NUL-terminated). On success *len is the text's length. When cap is too
 * small, returns ATTND_ERR_NO_MEMORY and *len is the length needed (excluding the NUL); buf then
 * holds a truncated prefix. */
attnd_err attnd_metrics_render(const attnd_metrics *m, char *buf, size_t cap, size_t *len);

#endif
