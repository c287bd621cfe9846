/* Metrics: counters by type and code, histogram buckets, gauges, the Prometheus text format,
 * the buffer contract of the renderer, and exact totals under concurrent updates. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/metrics.h"

static attnd_metrics *fresh(void)
{
    attnd_metrics *m = NULL;
    cr_assert_eq(attnd_metrics_alloc(&m, "0.1.0", "cpu"), ATTND_ERR_OK);
    cr_assert_not_null(m);
    return m;
}

/* Render into a heap string (asserting the size contract on the way). */
static char *render(const attnd_metrics *m)
{
    size_t need = 0;
    char small[8];
    cr_assert_eq(attnd_metrics_render(m, small, sizeof(small), &need), ATTND_ERR_NO_MEMORY);
    cr_assert_gt(need, sizeof(small));
    cr_assert_eq(small[sizeof(small) - 1], '\0', "a truncated render is still NUL-terminated");
    char *buf = malloc(need + 1);
    size_t len = 0;
    cr_assert_eq(attnd_metrics_render(m, buf, need + 1, &len), ATTND_ERR_OK);
    cr_assert_eq(len, need);
    cr_assert_eq(strlen(buf), len);
    return buf;
}

/* The sample line for `series` (name plus labels), or NULL. */
static const char *find_sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p != NULL && *p != '\0';) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return p + n + 1;
        p = strchr(p, '\n');
        if (p != NULL) p++;
    }
    return NULL;
}

static double sample_value(const char *text, const char *series)
{
    const char *v = find_sample(text, series);
    cr_assert_not_null(v, "no sample %s", series);
    return strtod(v, NULL);
}

Test(metrics, fresh_render_has_every_family_at_zero, .timeout = 120)
{
    attnd_metrics *m = fresh();
    char *t = render(m);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"attend\",code=\"OK\"}"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"invalid\",code=\"OK\"}"), 0.0);
    cr_assert_null(find_sample(t, "attnd_requests_total{type=\"attend\",code=\"NOT_FOUND\"}"));
    cr_assert_eq(
        sample_value(t, "attnd_request_duration_seconds_bucket{type=\"status\",le=\"+Inf\"}"), 0);
    cr_assert_eq(sample_value(t, "attnd_queue_depth"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_blocks_free"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_kernel_seconds_total{kind=\"3d\"}"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_kernel_seconds_total{kind=\"cache_write\"}"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_wire_bytes_total{direction=\"rx\"}"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_build_info{version=\"0.1.0\",backend=\"cpu\"}"), 1.0);
    cr_assert_not_null(strstr(t, "# TYPE attnd_request_duration_seconds histogram\n"));
    cr_assert_not_null(strstr(t, "# TYPE attnd_requests_total counter\n"));
    cr_assert_not_null(strstr(t, "# TYPE attnd_blocks_used gauge\n"));
    free(t);
    attnd_metrics_free(m);
}

static bool is_name_char(char c, bool first)
{
    return isalpha((unsigned char)c) || c == '_' || c == ':' ||
           (!first && isdigit((unsigned char)c));
}

/* One exposition line: a comment (HELP/TYPE) or `name{k="v",...} value`. Returns the end of the
 * metric name for samples (so the caller can check a TYPE came first), NULL for comments. */
static const char *check_line(const char *line, size_t len, char *name, size_t name_cap)
{
    if (line[0] == '#') {
        cr_assert(strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0,
                  "bad comment: %.*s", (int)len, line);
        return NULL;
    }
    size_t i = 0;
    while (i < len && is_name_char(line[i], i == 0))
        i++;
    cr_assert_gt(i, 0, "no metric name: %.*s", (int)len, line);
    cr_assert_lt(i, name_cap);
    memcpy(name, line, i);
    name[i] = '\0';
    if (line[i] == '{') {
        const char *close = memchr(line + i, '}', len - i);
        cr_assert_not_null(close, "unclosed labels: %.*s", (int)len, line);
        i = (size_t)(close - line) + 1;
    }
    cr_assert_eq(line[i], ' ', "no space before the value: %.*s", (int)len, line);
    char *end = NULL;
    char value[64];
    size_t vlen = len - i - 1;
    cr_assert_lt(vlen, sizeof(value));
    memcpy(value, line + i + 1, vlen);
    value[vlen] = '\0';
    strtod(value, &end);
    cr_assert(end != value && *end == '\0', "bad value: %.*s", (int)len, line);
    return name;
}

/* The family a sample belongs to: histogram samples drop _bucket/_sum/_count. */
static void family_of(char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int s = 0; s < 3; s++) {
        size_t n = strlen(name), k = strlen(suffixes[s]);
        if (n > k && strcmp(name + n - k, suffixes[s]) == 0 &&
            strncmp(name, "attnd_request_duration_seconds", n - k) == 0)
            name[n - k] = '\0';
    }
}

Test(metrics, every_line_is_valid_exposition_format, .timeout = 120)
{
    attnd_metrics *m = fresh();
    attnd_metrics_request(m, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_NOT_FOUND, 1234);
    attnd_metrics_kernel(m, ATTND_METRICS_KERNEL_PAGED_2D, 42, 4096);
    char *t = render(m);
    cr_assert_eq(t[strlen(t) - 1], '\n', "the text ends with a newline");
    int samples = 0;
    for (char *line = t; *line != '\0';) {
        char *nl = strchr(line, '\n');
        cr_assert_not_null(nl);
        char name[128];
        if (check_line(line, (size_t)(nl - line), name, sizeof(name)) != NULL) {
            family_of(name);
            char want[200];
            snprintf(want, sizeof(want), "# TYPE %s ", name);
            char *type_at = strstr(t, want);
            cr_assert(type_at != NULL && type_at < line, "sample %s before its TYPE", name);
            samples++;
        }
        line = nl + 1;
    }
    cr_assert_gt(samples, 400);
    free(t);
    attnd_metrics_free(m);
}

Test(metrics, requests_count_by_type_and_code, .timeout = 120)
{
    attnd_metrics *m = fresh();
    for (int i = 0; i < 3; i++)
        attnd_metrics_request(m, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_OK, 30000);
    attnd_metrics_request(m, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_INVALID_ARGUMENT, 1000);
    attnd_metrics_request(m, ATTND_METRICS_REQ_HELLO, ATTND_ERR_PERMISSION_DENIED, 1000);
    attnd_metrics_request(m, ATTND_METRICS_REQ_INVALID, ATTND_ERR_PROTOCOL, 1000);
    attnd_metrics_request(m, ATTND_METRICS_REQ_STATUS, 99, 1000);
    attnd_metrics_request(m, (attnd_metrics_req)1000, ATTND_ERR_OK, 1000);

    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_OK), 3);
    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_ATTEND, ATTND_ERR_INVALID_ARGUMENT),
                 1);
    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_STATUS, 12345), 1,
                 "every unknown code shares the UNKNOWN slot");
    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_INVALID, ATTND_ERR_OK), 1,
                 "an out-of-range type counts as invalid");
    cr_assert_eq(attnd_metrics_requests_total(m), 8);
    cr_assert_eq(attnd_metrics_errors_total(m), 4);

    char *t = render(m);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"attend\",code=\"OK\"}"), 3.0);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"attend\",code=\"INVALID_ARGUMENT\"}"),
                 1.0);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"hello\",code=\"PERMISSION_DENIED\"}"),
                 1.0);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"invalid\",code=\"PROTOCOL\"}"), 1.0);
    cr_assert_eq(sample_value(t, "attnd_requests_total{type=\"status\",code=\"UNKNOWN\"}"), 1.0);
    free(t);
    attnd_metrics_free(m);
}

Test(metrics, request_types_follow_the_proto_field_numbers, .timeout = 120)
{
    cr_assert_eq(attnd_metrics_req_from_field(10), ATTND_METRICS_REQ_HELLO);
    cr_assert_eq(attnd_metrics_req_from_field(13), ATTND_METRICS_REQ_CREATE);
    cr_assert_eq(attnd_metrics_req_from_field(19), ATTND_METRICS_REQ_ATTEND);
    cr_assert_eq(attnd_metrics_req_from_field(26), ATTND_METRICS_REQ_STATUS);
    cr_assert_eq(attnd_metrics_req_from_field(0), ATTND_METRICS_REQ_INVALID);
    cr_assert_eq(attnd_metrics_req_from_field(9), ATTND_METRICS_REQ_INVALID);
    cr_assert_eq(attnd_metrics_req_from_field(29), ATTND_METRICS_REQ_WAKE_CHANNEL);
    cr_assert_eq(attnd_metrics_req_from_field(30), ATTND_METRICS_REQ_TRUNCATE);
    cr_assert_eq(attnd_metrics_req_from_field(31), ATTND_METRICS_REQ_INVALID);
    cr_assert_str_eq(attnd_metrics_req_label(ATTND_METRICS_REQ_BEGIN_STEP), "begin_step");
    cr_assert_str_eq(attnd_metrics_req_label((attnd_metrics_req)-1), "invalid");
}

Test(metrics, histogram_buckets_are_inclusive_upper_bounds, .timeout = 120)
{
    attnd_metrics *m = fresh();
    attnd_metrics_req r = ATTND_METRICS_REQ_BEGIN_STEP;
    attnd_metrics_request(m, r, 0, 0);           /* bucket 0 (le 5us) */
    attnd_metrics_request(m, r, 0, 5000);        /* bucket 0: bounds are inclusive */
    attnd_metrics_request(m, r, 0, 5001);        /* bucket 1 (le 10us) */
    attnd_metrics_request(m, r, 0, 1000000);     /* le 1ms */
    attnd_metrics_request(m, r, 0, 10000000000); /* le 10s, the last finite bucket */
    attnd_metrics_request(m, r, 0, 10000000001); /* +Inf */

    cr_assert_eq(attnd_metrics_latency_bound_ns(0), 5000);
    cr_assert_eq(attnd_metrics_latency_bound_ns(7), 1000000);
    cr_assert_eq(attnd_metrics_latency_bound_ns(ATTND_METRICS_LATENCY_BUCKETS), UINT64_MAX);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, 0), 2);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, 1), 1);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, 7), 1);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, ATTND_METRICS_LATENCY_BUCKETS - 1), 1);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, ATTND_METRICS_LATENCY_BUCKETS), 1);
    cr_assert_eq(attnd_metrics_latency_bucket(m, r, ATTND_METRICS_LATENCY_BUCKETS + 1), 0);

    char *t = render(m);
#define B(le) "attnd_request_duration_seconds_bucket{type=\"begin_step\",le=\"" le "\"}"
    cr_assert_eq(sample_value(t, B("5e-06")), 2.0);
    cr_assert_eq(sample_value(t, B("1e-05")), 3.0, "buckets are cumulative");
    cr_assert_eq(sample_value(t, B("0.0005")), 3.0);
    cr_assert_eq(sample_value(t, B("0.001")), 4.0);
    cr_assert_eq(sample_value(t, B("5")), 4.0);
    cr_assert_eq(sample_value(t, B("10")), 5.0);
    cr_assert_eq(sample_value(t, B("+Inf")), 6.0);
#undef B
    cr_assert_eq(sample_value(t, "attnd_request_duration_seconds_count{type=\"begin_step\"}"), 6.0);
    double sum = sample_value(t, "attnd_request_duration_seconds_sum{type=\"begin_step\"}");
    cr_assert_float_eq(sum, 20.001010002, 1e-9);
    cr_assert_eq(sample_value(t, "attnd_request_duration_seconds_count{type=\"attend\"}"), 0.0);
    free(t);
    attnd_metrics_free(m);
}

Test(metrics, gauges_kernels_wire_and_events, .timeout = 120)
{
    attnd_metrics *m = fresh();
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_BLOCKS_FREE, 4096);
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_BLOCKS_USED, 12);
    attnd_metrics_gauge_add(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH, 3);
    attnd_metrics_gauge_add(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH, -5);
    attnd_metrics_gauge_set(m, ATTND_METRICS_GAUGE_COUNT, 7); /* out of range: ignored */
    attnd_metrics_kernel(m, ATTND_METRICS_KERNEL_PAGED_3D, 1500000000, 1000);
    attnd_metrics_kernel(m, ATTND_METRICS_KERNEL_PAGED_3D, 250000000, 24);
    attnd_metrics_kernel(m, ATTND_METRICS_KERNEL_CACHE_WRITE, 1000, 8);
    attnd_metrics_wire(m, 100, 7);
    attnd_metrics_wire(m, 1, 0);
    attnd_metrics_event(m, ATTND_METRICS_EVENT_SESSIONS_RECLAIMED);
    attnd_metrics_event(m, ATTND_METRICS_EVENT_RELOADS_FAILED);
    attnd_metrics_event(m, ATTND_METRICS_EVENT_RELOADS_FAILED);

    cr_assert_eq(attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH), -2);
    cr_assert_eq(attnd_metrics_kernel_ns(m, ATTND_METRICS_KERNEL_PAGED_3D), 1750000000);
    cr_assert_eq(attnd_metrics_event_count(m, ATTND_METRICS_EVENT_RELOADS_FAILED), 2);
    char *t = render(m);
    cr_assert_eq(sample_value(t, "attnd_blocks_free"), 4096.0);
    cr_assert_eq(sample_value(t, "attnd_blocks_used"), 12.0);
    cr_assert_eq(sample_value(t, "attnd_queue_depth"), -2.0);
    cr_assert_eq(
        strncmp(find_sample(t, "attnd_kernel_seconds_total{kind=\"3d\"}"), "1.750000000\n", 12), 0,
        "kernel time is in seconds with ns resolution");
    cr_assert_eq(sample_value(t, "attnd_kernel_seconds_total{kind=\"cache_write\"}"), 1e-6);
    cr_assert_eq(sample_value(t, "attnd_kernel_launches_total{kind=\"3d\"}"), 2.0);
    cr_assert_eq(sample_value(t, "attnd_kernel_launches_total{kind=\"2d\"}"), 0.0);
    cr_assert_eq(sample_value(t, "attnd_kernel_bytes_total{kind=\"3d\"}"), 1024.0);
    cr_assert_eq(sample_value(t, "attnd_wire_bytes_total{direction=\"rx\"}"), 101.0);
    cr_assert_eq(sample_value(t, "attnd_wire_bytes_total{direction=\"tx\"}"), 7.0);
    cr_assert_eq(sample_value(t, "attnd_sessions_reclaimed_total"), 1.0);
    cr_assert_eq(sample_value(t, "attnd_config_reload_failures_total"), 2.0);
    cr_assert_eq(sample_value(t, "attnd_config_reloads_total"), 0.0);
    cr_assert_geq(sample_value(t, "attnd_uptime_seconds"), 0.0);
    free(t);
    attnd_metrics_free(m);
}

Test(metrics, labels_are_sanitised, .timeout = 120)
{
    attnd_metrics *m = NULL;
    cr_assert_eq(attnd_metrics_alloc(&m, "1\"2\\3\n", NULL), ATTND_ERR_OK);
    char *t = render(m);
    cr_assert_eq(sample_value(t, "attnd_build_info{version=\"1_2_3_\",backend=\"unknown\"}"), 1.0);
    free(t);
    attnd_metrics_free(m);
}

#define THREADS 8
#define ITERS 100000

static void *hammer(void *arg)
{
    attnd_metrics *m = arg;
    for (int i = 0; i < ITERS; i++) {
        attnd_metrics_request(m, ATTND_METRICS_REQ_ATTEND, (uint32_t)(i % 2), (uint64_t)i);
        attnd_metrics_gauge_add(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH, 1);
        attnd_metrics_kernel(m, ATTND_METRICS_KERNEL_PAGED_2D, 3, 5);
        attnd_metrics_wire(m, 2, 1);
        attnd_metrics_gauge_add(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH, -1);
        attnd_metrics_gauge_add(m, ATTND_METRICS_GAUGE_INFLIGHT, 1);
    }
    return NULL;
}

static void *scrape(void *arg)
{
    attnd_metrics *m = arg;
    static char buf[1 << 17];
    size_t len;
    for (int i = 0; i < 50; i++)
        cr_assert_eq(attnd_metrics_render(m, buf, sizeof(buf), &len), ATTND_ERR_OK);
    return NULL;
}

Test(metrics, concurrent_updates_are_exact, .timeout = 120)
{
    attnd_metrics *m = fresh();
    pthread_t th[THREADS + 1];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, hammer, m), 0);
    cr_assert_eq(pthread_create(&th[THREADS], NULL, scrape, m), 0);
    for (int i = 0; i <= THREADS; i++)
        pthread_join(th[i], NULL);
    uint64_t n = (uint64_t)THREADS * ITERS;
    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_ATTEND, 0), n / 2);
    cr_assert_eq(attnd_metrics_requests(m, ATTND_METRICS_REQ_ATTEND, 1), n / 2);
    cr_assert_eq(attnd_metrics_errors_total(m), n / 2);
    cr_assert_eq(attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_QUEUE_DEPTH), 0);
    cr_assert_eq(attnd_metrics_gauge(m, ATTND_METRICS_GAUGE_INFLIGHT), (int64_t)n);
    cr_assert_eq(attnd_metrics_kernel_ns(m, ATTND_METRICS_KERNEL_PAGED_2D), 3 * n);
    uint64_t in_buckets = 0;
    for (int i = 0; i <= ATTND_METRICS_LATENCY_BUCKETS; i++)
        in_buckets += attnd_metrics_latency_bucket(m, ATTND_METRICS_REQ_ATTEND, i);
    cr_assert_eq(in_buckets, n);
    char *t = render(m);
    cr_assert_eq(sample_value(t, "attnd_wire_bytes_total{direction=\"rx\"}"), (double)(2 * n));
    cr_assert_eq(sample_value(t, "attnd_request_duration_seconds_count{type=\"attend\"}"),
                 (double)n);
    free(t);
    attnd_metrics_free(m);
}
