#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/dtype.h"
#include "log.h"

static const void *cfg_field(const attnd_config *c, const attnd_cfg_key *k)
{
    return (const char *)c + k->offset;
}

/* ---------------------------------------------------------------- per-key checks */

static attnd_err check_head_size(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    uint32_t v = c->geometry.head_size;
    if (v % 8)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %u is not a multiple of 8",
                          k->name, v);
    return ATTND_ERR_OK;
}

static attnd_err check_block_size(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    uint32_t v = c->geometry.block_size;
    if (v != 16 && v != 32 && v != 64)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %u not one of 16, 32, 64", k->name,
                          v);
    return ATTND_ERR_OK;
}

static attnd_err check_url(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    const char *v = cfg_field(c, k);
    int optional = strcmp(k->name, "server.listen_tcp") == 0;
    if (optional && v[0] == '\0') return ATTND_ERR_OK;
    int ipc = strncmp(v, "ipc://", 6) == 0 && v[6] != '\0';
    int tcp = strncmp(v, "tcp://", 6) == 0 && v[6] != '\0';
    int tls = strncmp(v, "tls+tcp://", 10) == 0 && v[10] != '\0';
    if (optional ? !(tcp || tls) : !(ipc || tcp))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: \"%s\" is not a%s URL", k->name, v,
                          optional ? " tcp:// or tls+tcp://" : "n ipc:// or tcp://");
    return ATTND_ERR_OK;
}

/* A tls+tcp:// listener needs its certificate and key; a file with no TLS listener is a
 * mistake worth naming too. */
static attnd_err check_tls(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    int tls = strncmp(c->server.listen_tcp, "tls+tcp://", 10) == 0;
    int file = c->server.tls_cert_key_file[0] != '\0';
    if (tls && !file)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: required by server.listen_tcp \"%s\"", k->name,
                          c->server.listen_tcp);
    if (file && !tls)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: set, but server.listen_tcp is not a tls+tcp:// URL", k->name);
    return ATTND_ERR_OK;
}

static attnd_err check_mode(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    const char *v = c->server.ipc_mode;
    size_t len = strlen(v);
    if (len < 3 || len > 4 || strspn(v, "01234567") != len)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: \"%s\" is not an octal mode like \"0660\"", k->name, v);
    /* permission bits only: setuid, setgid and sticky mean nothing on a socket but a mistake */
    if (strtol(v, NULL, 8) > 0777)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: \"%s\" sets setuid/setgid/sticky bits (permission bits only, "
                          "0000..0777)",
                          k->name, v);
    return ATTND_ERR_OK;
}

static attnd_err check_http(const attnd_config *c, const attnd_cfg_key *k, char *e, size_t n)
{
    const char *v = c->http.listen, *port;
    if (v[0] == '\0') return ATTND_ERR_OK;
    port = strrchr(v, ':');
    /* at most 5 digits before the value is read: a longer one would overflow the conversion */
    size_t digits = port ? strlen(port + 1) : 0;
    if (strncmp(v, "http://", 7) != 0 || v[7] == '\0' || port == NULL || port < v + 8 ||
        digits == 0 || digits > 5 || strspn(port + 1, "0123456789") != digits ||
        strtol(port + 1, NULL, 10) > 65535)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: \"%s\" is not http://HOST:PORT (or \"\" for off)", k->name, v);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- the table */

static const attnd_cfg_choice backend_choices[] = {{"cpu", ATTND_CFG_BACKEND_CPU},
                                                   {"cuda", ATTND_CFG_BACKEND_CUDA},
                                                   {"auto", ATTND_CFG_BACKEND_AUTO},
                                                   {NULL, 0}};
static const attnd_cfg_choice dtype_choices[] = {{"f16", ATTND_DTYPE_F16},
                                                 {"bf16", ATTND_DTYPE_BF16},
                                                 {"fp8_e4m3", ATTND_DTYPE_FP8_E4M3},
                                                 {"f32", ATTND_DTYPE_F32},
                                                 {NULL, 0}};
static const attnd_cfg_choice level_choices[] = {{"error", ATTND_LOG_ERROR},
                                                 {"warn", ATTND_LOG_WARN},
                                                 {"info", ATTND_LOG_INFO},
                                                 {"debug", ATTND_LOG_DEBUG},
                                                 {NULL, 0}};

#define OFF(f) offsetof(attnd_config, f)
#define NUM(nm, ty, f, lo, hi, def, chk, lv, d)                                                    \
    {                                                                                              \
        .name = nm, .type = ty, .offset = OFF(f), .min = lo, .max = hi, .def_num = def,            \
        .check = chk, .live = lv, .doc = d                                                         \
    }
#define U32(nm, f, lo, hi, def, chk, lv, d) NUM(nm, ATTND_CFG_U32, f, lo, hi, def, chk, lv, d)
#define U64(nm, f, lo, hi, def, lv, d) NUM(nm, ATTND_CFG_U64, f, lo, hi, def, NULL, lv, d)
#define F32(nm, f, lo, hi, def, lv, d) NUM(nm, ATTND_CFG_F32, f, lo, hi, def, NULL, lv, d)
#define BOOL(nm, f, def, lv, d) NUM(nm, ATTND_CFG_BOOL, f, 0, 1, def, NULL, lv, d)
#define ENUM(nm, f, ch, def, lv, d)                                                                \
    {                                                                                              \
        .name = nm, .type = ATTND_CFG_ENUM, .offset = OFF(f), .def_num = def, .choices = ch,       \
        .live = lv, .doc = d                                                                       \
    }
#define STR(nm, f, def, chk, lv, d)                                                                \
    {                                                                                              \
        .name = nm, .type = ATTND_CFG_STR, .offset = OFF(f),                                       \
        .size = sizeof(((attnd_config *)0)->f), .def_str = def, .check = chk, .live = lv, .doc = d \
    }

#define I31 2147483647.0
static const attnd_cfg_key cfg_keys[] = {
    ENUM("backend", backend, backend_choices, ATTND_CFG_BACKEND_CPU, 0, "kernel backend"),
    U32("threads", threads, 0, 1024, 0, NULL, 0, "cpu backend threads, 0 = online cores"),
    U32("device", device, 0, 64, 0, NULL, 0, "cuda device ordinal"),
    STR("server.listen", server.listen, "ipc:///tmp/attnd.sock", check_url, 0, "main listener"),
    STR("server.listen_tcp", server.listen_tcp, "", check_url, 0,
        "optional tcp:// or tls+tcp:// listener"),
    STR("server.ipc_mode", server.ipc_mode, "0660", check_mode, 0,
        "ipc socket file mode, permission bits only"),
    STR("server.ipc_group", server.ipc_group, "", NULL, 0, "ipc socket file group"),
    STR("server.token", server.token, "", NULL, 1, "shared token asked in Hello"),
    STR("server.tls_cert_key_file", server.tls_cert_key_file, "", check_tls, 0,
        "PEM certificate chain and private key for a tls+tcp:// listen_tcp"),
    U32("server.workers", server.workers, 1, 1024, 16, NULL, 0, "nng_ctx receive loops"),
    U32("server.queue_depth", server.queue_depth, 1, 65536, 64, NULL, 0, "executor queue"),
    U32("server.channels", server.channels, 0, 4096, 256, NULL, 0,
        "shared-memory channels open at once, all sessions (0 = off)"),
    U32("server.spin_us", server.spin_us, 0, 1000000, 1000, NULL, 0,
        "executor keeps polling this long after its last work before it sleeps"),
    U32("server.streams", server.streams, 0, 1024, 16, NULL, 0,
        "stream channels open at once, all sessions (0 = off)"),
    U64("server.max_message_bytes", server.max_message_bytes, 4096, I31, 64.0 * 1048576, 0,
        "largest request accepted"),
    U32("server.max_message_bytes_before_hello", server.max_message_bytes_before_hello, 1024, I31,
        65536, NULL, 0,
        "largest request accepted on a connection before a Hello succeeded on it (capped at "
        "server.max_message_bytes)"),
    U32("server.max_inflight_per_connection", server.max_inflight_per_connection, 1, 65536, 8, NULL,
        0,
        "requests one connection may have unanswered; more are refused UNAVAILABLE (keep it "
        "below server.workers)"),
    U32("server.max_inflight_per_session", server.max_inflight_per_session, 1, 65536, 64, NULL, 0,
        "requests a session's channels may have taken and unanswered (waiting for kernels); "
        "past it its posts wait in their slots while other sessions are served"),
    U32("server.send_timeout_ms", server.send_timeout_ms, 100, 600000, 10000, NULL, 0,
        "a reply the client has not taken by then closes its connection"),
    U32("server.listener_check_ms", server.listener_check_ms, 0, 60000, 1000, NULL, 0,
        "how often a probe checks that the listeners accept (NNG < 1.6, nanomsg/nng#1518), 0 = "
        "off"),
    U32("server.drain_timeout_ms", server.drain_timeout_ms, 0, 600000, 10000, NULL, 0,
        "SIGTERM drain budget"),
    U32("geometry.num_layers", geometry.num_layers, 1, 1024, 2, NULL, 0, "layers"),
    U32("geometry.num_q_heads", geometry.num_q_heads, 1, 1024, 8, NULL, 0, "query heads"),
    U32("geometry.num_kv_heads", geometry.num_kv_heads, 1, 1024, 2, NULL, 0, "kv heads"),
    U32("geometry.head_size", geometry.head_size, 32, 256, 64, check_head_size, 0, "head size"),
    U32("geometry.block_size", geometry.block_size, 16, 64, 16, check_block_size, 0,
        "tokens/block"),
    ENUM("geometry.cache_dtype", geometry.cache_dtype, dtype_choices, ATTND_DTYPE_BF16, 0,
         "kv cache element type"),
    U32("geometry.num_blocks", geometry.num_blocks, 1, I31, 4096, NULL, 0, "kv cache blocks"),
    U32("geometry.max_blocks_per_seq", geometry.max_blocks_per_seq, 1, 1048576, 256, NULL, 0,
        "blocks one sequence may hold"),
    F32("geometry.scale", geometry.scale, 0, 1000, 0, 0, "softmax scale, 0 = 1/sqrt(head)"),
    U32("geometry.sliding_window", geometry.sliding_window, 0, I31, 0, NULL, 0, "0 = off"),
    F32("geometry.softcap", geometry.softcap, 0, 1e6, 0, 0, "logit softcap, 0 = off"),
    BOOL("geometry.alibi", geometry.alibi, 0, 0, "ALiBi with the standard slopes"),
    F32("geometry.k_scale", geometry.k_scale, 1e-30, 1e30, 1, 0, "fp8 key scale"),
    F32("geometry.v_scale", geometry.v_scale, 1e-30, 1e30, 1, 0, "fp8 value scale"),
    F32("geometry.gpu_memory_fraction", geometry.gpu_memory_fraction, 0, 0.98, 0, 0,
        "cuda: give the kv cache this fraction of the device's free memory (num_blocks follows), "
        "0 = num_blocks"),
    {.name = "geometry.layers",
     .type = ATTND_CFG_LAYERS,
     .offset = OFF(geometry.layers),
     .doc = "per-layer overrides of sliding_window, softcap, scale, alibi_slopes, sinks, k_scale, "
            "v_scale; an array whose length divides num_layers repeats"},
    U32("linear.slots", linear.slots, 0, 65536, 16, NULL, 0, "linear-attention state slots"),
    U32("linear.heads", linear.heads, 0, 1024, 8, NULL, 0, "linear-attention heads"),
    U32("linear.head_dim", linear.head_dim, 0, 256, 64, NULL, 0, "linear-attention head dim"),
    U32("limits.max_sessions", limits.max_sessions, 1, 65536, 64, NULL, 1, "sessions"),
    U32("limits.max_sessions_per_connection", limits.max_sessions_per_connection, 1, 65536, 4, NULL,
        1, "sessions one connection may hold (Hellos on it beyond are refused)"),
    U32("limits.max_seqs", limits.max_seqs, 1, 1048576, 256, NULL, 1, "sequences per session"),
    U32("limits.max_step_tokens", limits.max_step_tokens, 1, 16777216, 8192, NULL, 1,
        "new tokens per step"),
    U32("limits.max_regions", limits.max_regions, 1, 4096, 16, NULL, 1, "regions per session"),
    U32("limits.max_steps", limits.max_steps, 1, 1024, 8, NULL, 1, "open steps per session"),
    U64("limits.max_inline_bytes", limits.max_inline_bytes, 0, I31, 32.0 * 1048576, 1,
        "INLINE bytes per message, each way"),
    U32("limits.request_timeout_ms", limits.request_timeout_ms, 0, 3600000, 30000, NULL, 1,
        "queue wait budget, 0 = none"),
    U32("limits.reclaim_timeout_ms", limits.reclaim_timeout_ms, 0, 86400000, 5000, NULL, 1,
        "sequences of a dropped connection live this long"),
    U32("limits.stream_timeout_ms", limits.stream_timeout_ms, 1, 3600000, 10000, NULL, 1,
        "a stream step's layers must run within this of its StreamBegin, else it is released"),
    STR("http.listen", http.listen, "", check_http, 0,
        "operator HTTP endpoint (/healthz, /status, /metrics), \"\" = off"),
    U32("http.max_connections", http.max_connections, 1, 65536, 64, NULL, 0,
        "HTTP connections open at once; at the limit a new one closes the oldest still sending "
        "its request"),
    U32("http.header_timeout_ms", http.header_timeout_ms, 100, 600000, 5000, NULL, 0,
        "an HTTP request's head must arrive within this, else the connection is closed"),
    ENUM("log.level", log.level, level_choices, ATTND_LOG_INFO, 1, "log level"),
    U32("log.stats_interval_s", log.stats_interval_s, 0, 86400, 60, NULL, 1, "0 = off"),
};
#define CFG_NKEYS (sizeof cfg_keys / sizeof cfg_keys[0])

const attnd_cfg_key *attnd_config_keys(size_t *count)
{
    *count = CFG_NKEYS;
    return cfg_keys;
}

const attnd_cfg_key *attnd_config_key_find(const char *name)
{
    for (size_t i = 0; i < CFG_NKEYS; i++)
        if (strcmp(cfg_keys[i].name, name) == 0) return &cfg_keys[i];
    return NULL;
}

const char *attnd_config_type_name(attnd_cfg_type type)
{
    switch (type) {
    case ATTND_CFG_U32:
    case ATTND_CFG_U64:
        return "integer";
    case ATTND_CFG_F32:
        return "number";
    case ATTND_CFG_BOOL:
        return "boolean";
    case ATTND_CFG_LAYERS:
    case ATTND_CFG_FLOATS:
        return "array";
    case ATTND_CFG_ALIBI:
        return "boolean or array";
    default:
        return "string";
    }
}

/* ---------------------------------------------------------------- defaults and values */

static void cfg_set_num(attnd_config *c, const attnd_cfg_key *k, double v)
{
    void *f = (char *)c + k->offset;
    switch (k->type) {
    case ATTND_CFG_U32:
        *(uint32_t *)f = (uint32_t)v;
        break;
    case ATTND_CFG_U64:
        *(uint64_t *)f = (uint64_t)v;
        break;
    case ATTND_CFG_F32:
        *(float *)f = (float)v;
        break;
    default:
        *(int *)f = (int)v;
        break;
    }
}

void attnd_config_defaults(attnd_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < CFG_NKEYS; i++) {
        const attnd_cfg_key *k = &cfg_keys[i];
        if (k->type == ATTND_CFG_STR)
            snprintf((char *)c + k->offset, k->size, "%s", k->def_str);
        else if (k->type != ATTND_CFG_LAYERS)
            cfg_set_num(c, k, k->def_num);
    }
}

static attnd_err cfg_set_enum(attnd_config *c, const attnd_cfg_key *k, const char *s, char *e,
                              size_t n)
{
    char names[128] = "";
    for (const attnd_cfg_choice *ch = k->choices; ch->name; ch++) {
        if (strcmp(ch->name, s) == 0) {
            cfg_set_num(c, k, ch->value);
            return ATTND_ERR_OK;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", ch->name);
    }
    return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: \"%s\" not one of %s", k->name, s,
                      names);
}

attnd_err attnd_config_number(const attnd_cfg_key *k, const char *name, const json_t *v,
                              double *out, char *e, size_t n)
{
    double d;
    if (k->type == ATTND_CFG_F32) {
        if (!json_is_number(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected a number", name);
        d = json_number_value(v);
        if (!isfinite(d) || d < k->min || d > k->max)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %g out of range (%g..%g)",
                              name, d, k->min, k->max);
        if (k->min == 0 && d != 0 && fabs(d) < 1e-30)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %g too small", name, d);
    } else {
        if (!json_is_integer(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected an integer", name);
        json_int_t i = json_integer_value(v);
        if ((double)i < k->min || (double)i > k->max)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s: %lld out of range (%.0f..%.0f)", name, (long long)i, k->min,
                              k->max);
        d = (double)i;
    }
    *out = d;
    return ATTND_ERR_OK;
}

static attnd_err cfg_set_number(attnd_config *c, const attnd_cfg_key *k, const json_t *v, char *e,
                                size_t n)
{
    double d;
    attnd_err rv = attnd_config_number(k, k->name, v, &d, e, n);
    if (rv == ATTND_ERR_OK) cfg_set_num(c, k, d);
    return rv;
}

static attnd_err cfg_set_value(attnd_config *c, const attnd_cfg_key *k, const json_t *v, char *e,
                               size_t n)
{
    switch (k->type) {
    case ATTND_CFG_BOOL:
        if (!json_is_boolean(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected a boolean", k->name);
        cfg_set_num(c, k, json_is_true(v));
        return ATTND_ERR_OK;
    case ATTND_CFG_STR:
        if (!json_is_string(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected a string", k->name);
        if (json_string_length(v) >= k->size ||
            strlen(json_string_value(v)) != json_string_length(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s: longer than %zu characters or holds NUL", k->name, k->size - 1);
        snprintf((char *)c + k->offset, k->size, "%s", json_string_value(v));
        return ATTND_ERR_OK;
    case ATTND_CFG_ENUM:
        if (!json_is_string(v))
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected a string", k->name);
        return cfg_set_enum(c, k, json_string_value(v), e, n);
    case ATTND_CFG_LAYERS:
        return attnd_config_layers_parse(c, v, e, n);
    default:
        return cfg_set_number(c, k, v, e, n);
    }
}

/* ---------------------------------------------------------------- walking the document */

/* Some key of the table lives under "prefix." */
static int cfg_is_section(const char *prefix)
{
    size_t len = strlen(prefix);
    for (size_t i = 0; i < CFG_NKEYS; i++)
        if (strncmp(cfg_keys[i].name, prefix, len) == 0 && cfg_keys[i].name[len] == '.') return 1;
    return 0;
}

static attnd_err cfg_walk(attnd_config *c, const json_t *obj, const char *prefix, char *e, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        char path[128];
        attnd_err rv;
        if (snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key) >=
            (int)sizeof path)
            return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "unknown key: %.64s...", path);
        const attnd_cfg_key *k = attnd_config_key_find(path);
        if (k == NULL && cfg_is_section(path)) {
            if (!json_is_object(v))
                return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "%s: expected an object", path);
            if ((rv = cfg_walk(c, v, path, e, n)) != ATTND_ERR_OK) return rv;
            continue;
        }
        if (k == NULL) return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "unknown key: %s", path);
        if ((rv = cfg_set_value(c, k, v, e, n)) != ATTND_ERR_OK) return rv;
    }
    return ATTND_ERR_OK;
}

static attnd_err cfg_load_json(attnd_config *c, json_t *root, const json_error_t *jerr, char *e,
                               size_t n)
{
    attnd_config tmp;
    attnd_err rv;
    if (root == NULL)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "config: line %d column %d: %s",
                          jerr->line, jerr->column, jerr->text);
    if (!json_is_object(root)) {
        rv = attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT, "config: top level must be an object");
        goto done;
    }
    attnd_config_defaults(&tmp);
    if ((rv = cfg_walk(&tmp, root, "", e, n)) == ATTND_ERR_OK)
        rv = attnd_config_validate(&tmp, e, n);
    if (rv == ATTND_ERR_OK)
        *c = tmp;
    else
        attnd_config_fini(&tmp);
done:
    json_decref(root);
    return rv;
}

attnd_err attnd_config_load_string(attnd_config *c, const char *json, char *err, size_t n)
{
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    return cfg_load_json(c, root, &jerr, err, n);
}

attnd_err attnd_config_load_file(attnd_config *c, const char *path, char *err, size_t n)
{
    json_error_t jerr;
    FILE *f = fopen(path, "r");
    if (f == NULL) return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "config: cannot open %s", path);
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    return cfg_load_json(c, root, &jerr, err, n);
}

/* ---------------------------------------------------------------- cross-key checks */

static attnd_err cfg_check_geometry(const attnd_config *c, char *e, size_t n)
{
    const attnd_cfg_geometry *g = &c->geometry;
    if (g->num_q_heads % g->num_kv_heads)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.num_q_heads: %u is not a multiple of "
                          "geometry.num_kv_heads (%u)",
                          g->num_q_heads, g->num_kv_heads);
    if (g->max_blocks_per_seq > g->num_blocks)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.max_blocks_per_seq: %u exceeds geometry.num_blocks (%u)",
                          g->max_blocks_per_seq, g->num_blocks);
    /* one layer's K (or V) pool must be addressable with int64 element offsets, and the
     * whole cache must fit in size_t */
    uint64_t per = (uint64_t)g->num_blocks * g->block_size * g->num_kv_heads * g->head_size;
    uint64_t total;
    if (__builtin_mul_overflow(per, 2ull * g->num_layers * attnd_dtype_size(g->cache_dtype),
                               &total) ||
        total > (UINT64_C(1) << 46))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "geometry.num_blocks: %u blocks make a cache larger than 64 TiB",
                          g->num_blocks);
    return ATTND_ERR_OK;
}

static attnd_err cfg_check_linear(const attnd_config *c, char *e, size_t n)
{
    const attnd_cfg_linear *l = &c->linear;
    if (l->slots == 0) return ATTND_ERR_OK;
    if (l->heads == 0)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "linear.heads: must be > 0 when linear.slots > 0");
    if (l->head_dim == 0)
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "linear.head_dim: must be > 0 when linear.slots > 0");
    uint64_t per = (uint64_t)l->slots * l->heads * l->head_dim * l->head_dim * 4;
    if (per * c->geometry.num_layers > (UINT64_C(1) << 40))
        return attnd_errf(e, n, ATTND_ERR_INVALID_ARGUMENT,
                          "linear.slots: %u slots make a state cache larger than 1 TiB", l->slots);
    return ATTND_ERR_OK;
}

attnd_err attnd_config_validate(const attnd_config *c, char *err, size_t n)
{
    attnd_err rv;
    for (size_t i = 0; i < CFG_NKEYS; i++) {
        const attnd_cfg_key *k = &cfg_keys[i];
        if (k->check && (rv = k->check(c, k, err, n)) != ATTND_ERR_OK) return rv;
    }
    if ((rv = cfg_check_geometry(c, err, n)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_config_layers_check(&c->geometry, err, n)) != ATTND_ERR_OK) return rv;
    return cfg_check_linear(c, err, n);
}

/* ---------------------------------------------------------------- reload */

static size_t cfg_value_size(const attnd_cfg_key *k)
{
    switch (k->type) {
    case ATTND_CFG_U32:
        return sizeof(uint32_t);
    case ATTND_CFG_U64:
        return sizeof(uint64_t);
    case ATTND_CFG_F32:
        return sizeof(float);
    case ATTND_CFG_STR:
        return k->size;
    case ATTND_CFG_LAYERS:
        return sizeof(attnd_cfg_layers *);
    default:
        return sizeof(int);
    }
}

int attnd_config_apply_live(attnd_config *cur, const attnd_config *next, char *restart, size_t n)
{
    int differ = 0;
    if (n) restart[0] = '\0';
    for (size_t i = 0; i < CFG_NKEYS; i++) {
        const attnd_cfg_key *k = &cfg_keys[i];
        void *dst = (char *)cur + k->offset;
        const void *src = (const char *)next + k->offset;
        size_t sz = cfg_value_size(k);
        if (k->type == ATTND_CFG_LAYERS
                ? attnd_config_layers_equal(cur->geometry.layers, next->geometry.layers)
            : k->type == ATTND_CFG_STR ? strcmp(dst, src) == 0
                                       : memcmp(dst, src, sz) == 0)
            continue;
        if (k->live) {
            memcpy(dst, src, sz);
            continue;
        }
        size_t used = n ? strlen(restart) : 0;
        if (n > used) snprintf(restart + used, n - used, "%s%s", differ ? "," : "", k->name);
        differ++;
    }
    return differ;
}

float attnd_config_scale(const attnd_config *c)
{
    if (c->geometry.scale > 0) return c->geometry.scale;
    return 1.0f / sqrtf((float)c->geometry.head_size);
}
