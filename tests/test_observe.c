/* Observability glue: /status is valid JSON with the gauges the executor reported (even for a
 * listen URL that needs escaping), reloads and drains reach the metrics and /healthz, and the
 * HTTP endpoint starts only when http.listen is set. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "obs/observe.h"

static attnd_log quiet_log(void)
{
    attnd_log lg;
    attnd_log_init(&lg, ATTND_LOG_ERROR, stderr);
    return lg;
}

static json_t *status_of(attnd_observe *obs)
{
    char buf[4096];
    size_t len = 0;
    json_error_t je;
    cr_assert_eq(attnd_observe_status_json(obs, buf, sizeof buf, &len), ATTND_ERR_OK);
    cr_assert_eq(strlen(buf), len);
    json_t *j = json_loads(buf, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %s", je.text, buf);
    return j;
}

static long long num(json_t *j, const char *a, const char *b)
{
    json_t *v = json_object_get(j, a);
    if (b) v = json_object_get(v, b);
    cr_assert(json_is_integer(v), "%s%s%s is not an integer", a, b ? "." : "", b ? b : "");
    return json_integer_value(v);
}

Test(observe, status_is_json_with_the_reported_gauges, .timeout = 60)
{
    attnd_config cfg;
    attnd_log lg = quiet_log();
    attnd_observe *obs = NULL;
    char err[256] = "";
    attnd_config_defaults(&cfg);
    snprintf(cfg.server.listen, sizeof cfg.server.listen, "ipc:///tmp/odd\"name\\x.sock");
    cfg.geometry.num_blocks = 100;
    cr_assert_eq(attnd_observe_alloc(&obs, &cfg, &lg), ATTND_ERR_OK);
    cr_assert_eq(attnd_observe_start(obs, "cpu", err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(attnd_observe_http_port(obs), 0, "http.listen is off by default");
    attnd_observe_gauges(obs, 60, 3, 2);
    attnd_observe_tick(obs, 5);
    attnd_metrics_request(attnd_observe_metrics(obs), ATTND_METRICS_REQ_FREE, ATTND_ERR_NOT_FOUND,
                          1000);
    json_t *j = status_of(obs);
    cr_assert_str_eq(json_string_value(json_object_get(j, "listen")), cfg.server.listen);
    cr_assert_str_eq(json_string_value(json_object_get(j, "backend")), "cpu");
    cr_assert(json_is_false(json_object_get(j, "draining")));
    cr_assert_eq(num(j, "blocks", "used"), 40);
    cr_assert_eq(num(j, "blocks", "free"), 60);
    cr_assert_eq(num(j, "sequences", NULL), 3);
    cr_assert_eq(num(j, "sessions", NULL), 2);
    cr_assert_eq(num(j, "queue_depth", NULL), 5);
    cr_assert_eq(num(j, "requests", NULL), 1);
    cr_assert_eq(num(j, "errors", NULL), 1);
    cr_assert_eq(num(j, "geometry", "num_blocks"), 100);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_object_get(j, "geometry"), "cache_dtype")), "bf16");
    cr_assert(json_is_null(json_object_get(j, "mps")), "mps unknown until a device reports it");
    cr_assert_eq(num(j, "stream_channels", NULL), 0);
    json_decref(j);
    attnd_observe_set_mps(obs, 0);
    j = status_of(obs);
    cr_assert(json_is_false(json_object_get(j, "mps")));
    json_decref(j);
    attnd_observe_set_mps(obs, 1);
    j = status_of(obs);
    cr_assert(json_is_true(json_object_get(j, "mps")));
    json_decref(j);
    cr_assert_eq(attnd_metrics_gauge(attnd_observe_metrics(obs), ATTND_METRICS_GAUGE_MPS), 1);

    attnd_observe_reload(obs, ATTND_ERR_INVALID_ARGUMENT, "limits.max_seqz: unknown key");
    attnd_observe_reload(obs, ATTND_ERR_OK, NULL);
    attnd_metrics *m = attnd_observe_metrics(obs);
    cr_assert_eq(attnd_metrics_event_count(m, ATTND_METRICS_EVENT_RELOADS_OK), 1);
    cr_assert_eq(attnd_metrics_event_count(m, ATTND_METRICS_EVENT_RELOADS_FAILED), 1);
    attnd_observe_drain(obs);
    j = status_of(obs);
    cr_assert(json_is_true(json_object_get(j, "draining")));
    json_decref(j);
    attnd_observe_free(obs);
}

Test(observe, log_rate_limit_counts_what_it_drops, .timeout = 60)
{
    attnd_config cfg;
    attnd_log lg = quiet_log();
    attnd_observe *obs = NULL;
    uint64_t sup = 0;
    int allowed = 0;
    attnd_config_defaults(&cfg);
    cr_assert_eq(attnd_observe_alloc(&obs, &cfg, &lg), ATTND_ERR_OK);
    for (int i = 0; i < 100; i++)
        allowed += attnd_observe_log_allowed(obs, "request:PROTOCOL", &sup);
    cr_assert_eq(allowed, (int)ATTND_OBSERVE_LOG_BURST);
    cr_assert_eq(
        attnd_metrics_event_count(attnd_observe_metrics(obs), ATTND_METRICS_EVENT_LOG_SUPPRESSED),
        100 - (int)ATTND_OBSERVE_LOG_BURST);
    cr_assert(attnd_observe_log_allowed(obs, "request:NOT_FOUND", &sup), "another key waits");
    attnd_observe_free(obs);
}

Test(observe, http_starts_when_configured_and_a_bad_address_names_the_key, .timeout = 60)
{
    attnd_config cfg;
    attnd_log lg = quiet_log();
    attnd_observe *obs = NULL;
    char err[256] = "";
    attnd_config_defaults(&cfg);
    snprintf(cfg.http.listen, sizeof cfg.http.listen, "http://127.0.0.1:0");
    cr_assert_eq(attnd_observe_alloc(&obs, &cfg, &lg), ATTND_ERR_OK);
    cr_assert_eq(attnd_observe_start(obs, "cpu", err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_gt(attnd_observe_http_port(obs), 0);
    attnd_observe_free(obs);

    snprintf(cfg.http.listen, sizeof cfg.http.listen, "http://256.0.0.1:80");
    cr_assert_eq(attnd_observe_alloc(&obs, &cfg, &lg), ATTND_ERR_OK);
    cr_assert_neq(attnd_observe_start(obs, "cpu", err, sizeof err), ATTND_ERR_OK);
    cr_assert_not_null(strstr(err, "http.listen"), "%s", err);
    attnd_observe_free(obs);
}

/* /status: the whole geometry, every layer resolved in the config's own keys. */
Test(observe, status_reports_every_layer, .timeout = 60)
{
    attnd_config cfg;
    attnd_log lg = quiet_log();
    attnd_observe *obs = NULL;
    char err[256], small[64];
    size_t len = 0;
    const char *json = "{\"geometry\": {\"num_layers\": 4, \"num_q_heads\": 2, \"num_kv_heads\": 1,"
                       " \"softcap\": 50, \"layers\": [{\"sliding_window\": 4096, \"sinks\": [1, "
                       "-2.5]}, {\"alibi_slopes\": true, \"scale\": 0.5}]}}";
    cr_assert_eq(attnd_config_load_string(&cfg, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(attnd_observe_alloc(&obs, &cfg, &lg), ATTND_ERR_OK);
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    cr_assert_eq(attnd_observe_status_json(obs, buf, cap, &len), ATTND_ERR_OK);
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    cr_assert_not_null(root, "%s: %s", je.text, buf);
    json_t *g = json_object_get(root, "geometry"), *layers = json_object_get(g, "layers");
    cr_assert_eq(json_array_size(layers), 4);
    json_t *l2 = json_array_get(layers, 2), *l1 = json_array_get(layers, 1);
    cr_assert_eq(json_integer_value(json_object_get(l2, "sliding_window")), 4096);
    cr_assert_float_eq(json_number_value(json_object_get(l2, "softcap")), 50.0, 1e-9);
    json_t *sinks = json_object_get(l2, "sinks");
    cr_assert_float_eq(json_number_value(json_array_get(sinks, 1)), -2.5, 1e-9);
    cr_assert(json_is_true(json_object_get(l1, "alibi_slopes")));
    cr_assert_float_eq(json_number_value(json_object_get(l1, "scale")), 0.5, 1e-9);
    cr_assert_null(json_object_get(l1, "sinks"));
    cr_assert_eq(json_integer_value(json_object_get(g, "window_release")), 0);
    json_decref(root);
    /* too small a buffer: NO_MEMORY with the length it needs */
    cr_assert_eq(attnd_observe_status_json(obs, small, sizeof small, &len), ATTND_ERR_NO_MEMORY);
    cr_assert_gt(len, sizeof small);
    free(buf);
    attnd_observe_free(obs);
    attnd_config_fini(&cfg);
}
