#include "metrics.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"

#define ATTND_ERR_COUNT_ENTRY(name, value, msg) +1
/* Reply codes counted apart: every attnd_err value, then one slot for anything else. */
enum { METRICS_CODES = 0 ATTND_ERR_MAP(ATTND_ERR_COUNT_ENTRY), METRICS_CODE_SLOTS };
#undef ATTND_ERR_COUNT_ENTRY

#define METRICS_BUCKETS (ATTND_METRICS_LATENCY_BUCKETS + 1)
#define METRICS_LABEL_MAX 64

static const uint64_t latency_bounds_ns[ATTND_METRICS_LATENCY_BUCKETS] = {
    5000,      10000,     25000,      50000,      100000,     250000,      500000,
    1000000,   2500000,   5000000,    10000000,   25000000,   50000000,    100000000,
    250000000, 500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};

typedef struct metrics_hist {
    atomic_uint_fast64_t bucket[METRICS_BUCKETS];
    atomic_uint_fast64_t sum_ns;
} metrics_hist;

struct attnd_metrics {
    atomic_uint_fast64_t requests[ATTND_METRICS_REQ_COUNT][METRICS_CODE_SLOTS];
    metrics_hist latency[ATTND_METRICS_REQ_COUNT];
    atomic_int_fast64_t gauges[ATTND_METRICS_GAUGE_COUNT];
    atomic_uint_fast64_t kernel_ns[ATTND_METRICS_KERNEL_COUNT];
    atomic_uint_fast64_t kernel_launches[ATTND_METRICS_KERNEL_COUNT];
    atomic_uint_fast64_t kernel_bytes[ATTND_METRICS_KERNEL_COUNT];
    atomic_uint_fast64_t wire_rx;
    atomic_uint_fast64_t wire_tx;
    atomic_uint_fast64_t events[ATTND_METRICS_EVENT_COUNT];
    uint64_t start_ns;
    char version[METRICS_LABEL_MAX];
    char backend[METRICS_LABEL_MAX];
};

static const char *const req_labels[ATTND_METRICS_REQ_COUNT] = {
#define METRICS_REQ_LABEL(name, label, field) label,
    ATTND_METRICS_REQ_MAP(METRICS_REQ_LABEL)
#undef METRICS_REQ_LABEL
};

static const uint32_t req_fields[ATTND_METRICS_REQ_COUNT] = {
#define METRICS_REQ_FIELD(name, label, field) field,
    ATTND_METRICS_REQ_MAP(METRICS_REQ_FIELD)
#undef METRICS_REQ_FIELD
};

static const char *const kernel_labels[ATTND_METRICS_KERNEL_COUNT] = {
#define METRICS_KERNEL_LABEL(name, label) label,
    ATTND_METRICS_KERNEL_MAP(METRICS_KERNEL_LABEL)
#undef METRICS_KERNEL_LABEL
};

static const char *const gauge_names[ATTND_METRICS_GAUGE_COUNT] = {
#define METRICS_GAUGE_NAME(name, metric, help) metric,
    ATTND_METRICS_GAUGE_MAP(METRICS_GAUGE_NAME)
#undef METRICS_GAUGE_NAME
};

static const char *const gauge_helps[ATTND_METRICS_GAUGE_COUNT] = {
#define METRICS_GAUGE_HELP(name, metric, help) help,
    ATTND_METRICS_GAUGE_MAP(METRICS_GAUGE_HELP)
#undef METRICS_GAUGE_HELP
};

static const char *const event_names[ATTND_METRICS_EVENT_COUNT] = {
#define METRICS_EVENT_NAME(name, metric, help) metric,
    ATTND_METRICS_EVENT_MAP(METRICS_EVENT_NAME)
#undef METRICS_EVENT_NAME
};

static const char *const event_helps[ATTND_METRICS_EVENT_COUNT] = {
#define METRICS_EVENT_HELP(name, metric, help) help,
    ATTND_METRICS_EVENT_MAP(METRICS_EVENT_HELP)
#undef METRICS_EVENT_HELP
};

/* Copy a label value, keeping only characters that need no escaping in the exposition format. */
static void copy_label(char *dst, const char *src)
{
    size_t n = 0;
    if (src == NULL) src = "unknown";
    for (; *src != '\0' && n + 1 < METRICS_LABEL_MAX; src++) {
        char c = *src;
        if (c == '"' || c == '\\' || c == '\n') c = '_';
        dst[n++] = c;
    }
    dst[n] = '\0';
}

attnd_err attnd_metrics_alloc(attnd_metrics **out, const char *version, const char *backend)
{
    attnd_metrics *m = calloc(1, sizeof(*m));
    *out = NULL;
    if (m == NULL) return ATTND_ERR_NO_MEMORY;
    /* calloc's zero bytes are valid zero-valued lock-free atomics on every target we build for */
    m->start_ns = attnd_clock_ns();
    copy_label(m->version, version);
    copy_label(m->backend, backend);
    *out = m;
    return ATTND_ERR_OK;
}

void attnd_metrics_free(attnd_metrics *m)
{
    free(m);
}

attnd_metrics_req attnd_metrics_req_from_field(uint32_t field)
{
    for (int r = 1; r < ATTND_METRICS_REQ_COUNT; r++)
        if (req_fields[r] == field) return (attnd_metrics_req)r;
    return ATTND_METRICS_REQ_INVALID;
}

const char *attnd_metrics_req_label(attnd_metrics_req req)
{
    if ((unsigned)req >= ATTND_METRICS_REQ_COUNT) return req_labels[0];
    return req_labels[req];
}

static int code_slot(uint32_t code)
{
    return code < METRICS_CODES ? (int)code : METRICS_CODES;
}

static int latency_bucket(uint64_t ns)
{
    int i = 0;
    while (i < ATTND_METRICS_LATENCY_BUCKETS && ns > latency_bounds_ns[i])
        i++;
    return i;
}

static void add_u64(atomic_uint_fast64_t *a, uint64_t v)
{
    atomic_fetch_add_explicit(a, v, memory_order_relaxed);
}

static uint64_t load_u64(const atomic_uint_fast64_t *a)
{
    return atomic_load_explicit((atomic_uint_fast64_t *)a, memory_order_relaxed);
}

void attnd_metrics_request(attnd_metrics *m, attnd_metrics_req req, uint32_t code,
                           uint64_t latency_ns)
{
    if ((unsigned)req >= ATTND_METRICS_REQ_COUNT) req = ATTND_METRICS_REQ_INVALID;
    add_u64(&m->requests[req][code_slot(code)], 1);
    add_u64(&m->latency[req].bucket[latency_bucket(latency_ns)], 1);
    add_u64(&m->latency[req].sum_ns, latency_ns);
}

void attnd_metrics_gauge_set(attnd_metrics *m, attnd_metrics_gauge_id g, int64_t value)
{
    if ((unsigned)g >= ATTND_METRICS_GAUGE_COUNT) return;
    atomic_store_explicit(&m->gauges[g], value, memory_order_relaxed);
}

void attnd_metrics_gauge_add(attnd_metrics *m, attnd_metrics_gauge_id g, int64_t delta)
{
    if ((unsigned)g >= ATTND_METRICS_GAUGE_COUNT) return;
    atomic_fetch_add_explicit(&m->gauges[g], delta, memory_order_relaxed);
}

void attnd_metrics_kernel(attnd_metrics *m, attnd_metrics_kernel_kind kind, uint64_t ns,
                          uint64_t bytes)
{
    if ((unsigned)kind >= ATTND_METRICS_KERNEL_COUNT) kind = ATTND_METRICS_KERNEL_OTHER;
    add_u64(&m->kernel_ns[kind], ns);
    add_u64(&m->kernel_launches[kind], 1);
    add_u64(&m->kernel_bytes[kind], bytes);
}

void attnd_metrics_wire(attnd_metrics *m, uint64_t rx_bytes, uint64_t tx_bytes)
{
    add_u64(&m->wire_rx, rx_bytes);
    add_u64(&m->wire_tx, tx_bytes);
}

void attnd_metrics_event(attnd_metrics *m, attnd_metrics_event_id ev)
{
    if ((unsigned)ev >= ATTND_METRICS_EVENT_COUNT) return;
    add_u64(&m->events[ev], 1);
}

uint64_t attnd_metrics_requests(const attnd_metrics *m, attnd_metrics_req req, uint32_t code)
{
    if ((unsigned)req >= ATTND_METRICS_REQ_COUNT) return 0;
    return load_u64(&m->requests[req][code_slot(code)]);
}

uint64_t attnd_metrics_requests_total(const attnd_metrics *m)
{
    uint64_t n = 0;
    for (int r = 0; r < ATTND_METRICS_REQ_COUNT; r++)
        for (int c = 0; c < METRICS_CODE_SLOTS; c++)
            n += load_u64(&m->requests[r][c]);
    return n;
}

uint64_t attnd_metrics_errors_total(const attnd_metrics *m)
{
    uint64_t n = 0;
    for (int r = 0; r < ATTND_METRICS_REQ_COUNT; r++)
        for (int c = 1; c < METRICS_CODE_SLOTS; c++)
            n += load_u64(&m->requests[r][c]);
    return n;
}

uint64_t attnd_metrics_latency_bucket(const attnd_metrics *m, attnd_metrics_req req, int i)
{
    if ((unsigned)req >= ATTND_METRICS_REQ_COUNT || i < 0 || i >= METRICS_BUCKETS) return 0;
    return load_u64(&m->latency[req].bucket[i]);
}

uint64_t attnd_metrics_latency_bound_ns(int i)
{
    if (i < 0 || i >= ATTND_METRICS_LATENCY_BUCKETS) return UINT64_MAX;
    return latency_bounds_ns[i];
}

int64_t attnd_metrics_gauge(const attnd_metrics *m, attnd_metrics_gauge_id g)
{
    if ((unsigned)g >= ATTND_METRICS_GAUGE_COUNT) return 0;
    return atomic_load_explicit((atomic_int_fast64_t *)&m->gauges[g], memory_order_relaxed);
}

uint64_t attnd_metrics_event_count(const attnd_metrics *m, attnd_metrics_event_id ev)
{
    if ((unsigned)ev >= ATTND_METRICS_EVENT_COUNT) return 0;
    return load_u64(&m->events[ev]);
}

uint64_t attnd_metrics_kernel_ns(const attnd_metrics *m, attnd_metrics_kernel_kind kind)
{
    if ((unsigned)kind >= ATTND_METRICS_KERNEL_COUNT) return 0;
    return load_u64(&m->kernel_ns[kind]);
}

double attnd_metrics_uptime_s(const attnd_metrics *m)
{
    return (double)(attnd_clock_ns() - m->start_ns) / 1e9;
}

/* ---------------------------------------------------------------- rendering */

/* Appends with snprintf semantics: keeps counting past the end so the caller learns the size. */
typedef struct metrics_out {
    char *buf;
    size_t cap;
    size_t len;
} metrics_out;

__attribute__((format(printf, 2, 3))) static void out_printf(metrics_out *o, const char *fmt, ...)
{
    va_list ap;
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    va_start(ap, fmt);
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void out_header(metrics_out *o, const char *name, const char *type, const char *help)
{
    out_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *code_name(int slot)
{
    return slot < METRICS_CODES ? attnd_err_name((attnd_err)slot) : "UNKNOWN";
}

static void render_requests(const attnd_metrics *m, metrics_out *o)
{
    out_header(o, "attnd_requests_total", "counter",
               "Requests answered, by request type and reply code.");
    for (int r = 0; r < ATTND_METRICS_REQ_COUNT; r++) {
        for (int c = 0; c < METRICS_CODE_SLOTS; c++) {
            uint64_t n = load_u64(&m->requests[r][c]);
            /* every type shows its OK series; other codes once they occur */
            if (n == 0 && c != 0) continue;
            out_printf(o, "attnd_requests_total{type=\"%s\",code=\"%s\"} %llu\n", req_labels[r],
                       code_name(c), (unsigned long long)n);
        }
    }
}

static void render_histogram(const metrics_hist *h, const char *type, metrics_out *o)
{
    uint64_t cum = 0;
    for (int i = 0; i < METRICS_BUCKETS; i++) {
        cum += load_u64(&h->bucket[i]);
        if (i < ATTND_METRICS_LATENCY_BUCKETS)
            out_printf(o, "attnd_request_duration_seconds_bucket{type=\"%s\",le=\"%g\"} %llu\n",
                       type, (double)latency_bounds_ns[i] / 1e9, (unsigned long long)cum);
        else
            out_printf(o, "attnd_request_duration_seconds_bucket{type=\"%s\",le=\"+Inf\"} %llu\n",
                       type, (unsigned long long)cum);
    }
    out_printf(o, "attnd_request_duration_seconds_sum{type=\"%s\"} %.9f\n", type,
               (double)load_u64(&h->sum_ns) / 1e9);
    out_printf(o, "attnd_request_duration_seconds_count{type=\"%s\"} %llu\n", type,
               (unsigned long long)cum);
}

static void render_latency(const attnd_metrics *m, metrics_out *o)
{
    out_header(o, "attnd_request_duration_seconds", "histogram",
               "Time from receiving a request to sending its reply, by request type.");
    for (int r = 0; r < ATTND_METRICS_REQ_COUNT; r++)
        render_histogram(&m->latency[r], req_labels[r], o);
}

static void render_gauges(const attnd_metrics *m, metrics_out *o)
{
    for (int g = 0; g < ATTND_METRICS_GAUGE_COUNT; g++) {
        out_header(o, gauge_names[g], "gauge", gauge_helps[g]);
        out_printf(o, "%s %lld\n", gauge_names[g], (long long)attnd_metrics_gauge(m, g));
    }
}

static void render_kernels(const attnd_metrics *m, metrics_out *o)
{
    out_header(o, "attnd_kernel_seconds_total", "counter", "Kernel time, by kernel kind.");
    for (int k = 0; k < ATTND_METRICS_KERNEL_COUNT; k++)
        out_printf(o, "attnd_kernel_seconds_total{kind=\"%s\"} %.9f\n", kernel_labels[k],
                   (double)load_u64(&m->kernel_ns[k]) / 1e9);
    out_header(o, "attnd_kernel_launches_total", "counter", "Kernel launches, by kernel kind.");
    for (int k = 0; k < ATTND_METRICS_KERNEL_COUNT; k++)
        out_printf(o, "attnd_kernel_launches_total{kind=\"%s\"} %llu\n", kernel_labels[k],
                   (unsigned long long)load_u64(&m->kernel_launches[k]));
    out_header(o, "attnd_kernel_bytes_total", "counter",
               "Bytes read and written by kernels, by kernel kind.");
    for (int k = 0; k < ATTND_METRICS_KERNEL_COUNT; k++)
        out_printf(o, "attnd_kernel_bytes_total{kind=\"%s\"} %llu\n", kernel_labels[k],
                   (unsigned long long)load_u64(&m->kernel_bytes[k]));
}

static void render_misc(const attnd_metrics *m, metrics_out *o)
{
    out_header(o, "attnd_wire_bytes_total", "counter",
               "Bytes received and sent on the request socket.");
    out_printf(o, "attnd_wire_bytes_total{direction=\"rx\"} %llu\n",
               (unsigned long long)load_u64(&m->wire_rx));
    out_printf(o, "attnd_wire_bytes_total{direction=\"tx\"} %llu\n",
               (unsigned long long)load_u64(&m->wire_tx));
    for (int e = 0; e < ATTND_METRICS_EVENT_COUNT; e++) {
        out_header(o, event_names[e], "counter", event_helps[e]);
        out_printf(o, "%s %llu\n", event_names[e], (unsigned long long)load_u64(&m->events[e]));
    }
    out_header(o, "attnd_uptime_seconds", "gauge", "Seconds since the daemon started.");
    out_printf(o, "attnd_uptime_seconds %.3f\n", attnd_metrics_uptime_s(m));
    out_header(o, "attnd_build_info", "gauge", "Daemon version and kernel backend; always 1.");
    out_printf(o, "attnd_build_info{version=\"%s\",backend=\"%s\"} 1\n", m->version, m->backend);
}

attnd_err attnd_metrics_render(const attnd_metrics *m, char *buf, size_t cap, size_t *len)
{
    metrics_out o = {.buf = buf, .cap = cap, .len = 0};
    if (cap > 0) buf[0] = '\0';
    render_requests(m, &o);
    render_latency(m, &o);
    render_gauges(m, &o);
    render_kernels(m, &o);
    render_misc(m, &o);
    *len = o.len;
    return o.len < cap ? ATTND_ERR_OK : ATTND_ERR_NO_MEMORY;
}
