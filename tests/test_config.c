/* Config: defaults, the shipped files, unknown keys / wrong types / out-of-range values named in
 * the error, cross-key checks, reload (validate all, then apply live keys only; an invalid file
 * changes nothing), and the JSON Schema in sync with the table. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attnd/dtype.h"
#include "core/config.h"
#include "core/log.h"

static char err[512];

/* Repository root, from this file's path (CMake compiles with absolute paths). */
static void repo_path(char *out, size_t n, const char *rel)
{
    const char *me = __FILE__, *cut = strstr(me, "tests/test_config.c");
    cr_assert_not_null(cut, "cannot find the repository from %s", me);
    snprintf(out, n, "%.*s%s", (int)(cut - me), me, rel);
}

/* Load json; expect code and, for errors, a message containing want. */
static void expect_load(const char *json, attnd_err code, const char *want)
{
    attnd_config c;
    err[0] = '\0';
    attnd_err rv = attnd_config_load_string(&c, json, err, sizeof err);
    cr_assert_eq(rv, code, "%s -> %s (%s)", json, attnd_err_name(rv), err);
    if (want)
        cr_assert_not_null(strstr(err, want), "%s: message \"%s\" lacks \"%s\"", json, err, want);
    if (rv == ATTND_ERR_OK) attnd_config_fini(&c);
}

Test(config, defaults_are_the_small_cpu_geometry, .timeout = 60)
{
    attnd_config c;
    attnd_config_defaults(&c);
    cr_assert_eq(attnd_config_validate(&c, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(c.backend, ATTND_CFG_BACKEND_CPU);
    cr_assert_eq(c.geometry.num_layers, 2);
    cr_assert_eq(c.geometry.num_q_heads, 8);
    cr_assert_eq(c.geometry.num_kv_heads, 2);
    cr_assert_eq(c.geometry.head_size, 64);
    cr_assert_eq(c.geometry.block_size, 16);
    cr_assert_eq(c.geometry.cache_dtype, ATTND_DTYPE_BF16);
    cr_assert_eq(c.geometry.num_blocks, 4096);
    cr_assert_str_eq(c.server.listen, "ipc:///tmp/attnd.sock");
    cr_assert_str_eq(c.server.listen_tcp, "");
    cr_assert_eq(c.log.level, ATTND_LOG_INFO);
    cr_assert_float_eq(attnd_config_scale(&c), 0.125f, 1e-7);
    /* an empty document is all defaults */
    attnd_config e;
    cr_assert_eq(attnd_config_load_string(&e, "{}", err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(memcmp(&e, &c, sizeof c), 0);
}

Test(config, shipped_files_load, .timeout = 60)
{
    static const char *files[] = {"config/attnd.json", "config/examples/llama-3-8b.json",
                                  "config/examples/mistral-7b-fp8.json",
                                  "config/examples/gemma-2-9b.json"};
    attnd_config c, d;
    char path[1024];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        repo_path(path, sizeof path, files[i]);
        cr_assert_eq(attnd_config_load_file(&c, path, err, sizeof err), ATTND_ERR_OK, "%s: %s",
                     files[i], err);
        attnd_config_fini(&c);
    }
    /* the default file spells out the table's defaults */
    repo_path(path, sizeof path, "config/attnd.json");
    cr_assert_eq(attnd_config_load_file(&c, path, err, sizeof err), ATTND_ERR_OK);
    attnd_config_defaults(&d);
    cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "config/attnd.json differs from the defaults");
    repo_path(path, sizeof path, "config/examples/mistral-7b-fp8.json");
    cr_assert_eq(attnd_config_load_file(&c, path, err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(c.geometry.cache_dtype, ATTND_DTYPE_FP8_E4M3);
    cr_assert_eq(c.geometry.sliding_window, 4096);
}

Test(config, missing_file_is_not_found, .timeout = 60)
{
    attnd_config c;
    cr_assert_eq(attnd_config_load_file(&c, "/nonexistent/attnd.json", err, sizeof err),
                 ATTND_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(err, "/nonexistent/attnd.json"));
}

Test(config, unknown_keys_are_named, .timeout = 60)
{
    expect_load("{\"bogus\": 1}", ATTND_ERR_INVALID_ARGUMENT, "unknown key: bogus");
    expect_load("{\"geometry\": {\"num_layer\": 2}}", ATTND_ERR_INVALID_ARGUMENT,
                "unknown key: geometry.num_layer");
    expect_load("{\"limits\": {\"max_seqs\": 4, \"extra\": {\"deep\": 1}}}",
                ATTND_ERR_INVALID_ARGUMENT, "unknown key: limits.extra");
    /* a leaf name used as a section, and a section given a scalar */
    expect_load("{\"backend\": {\"cpu\": 1}}", ATTND_ERR_INVALID_ARGUMENT,
                "backend: expected a string");
    expect_load("{\"geometry\": 3}", ATTND_ERR_INVALID_ARGUMENT, "geometry: expected an object");
}

Test(config, wrong_types_are_named, .timeout = 60)
{
    expect_load("{\"geometry\": {\"num_layers\": \"2\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.num_layers: expected an integer");
    expect_load("{\"geometry\": {\"num_layers\": 2.5}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.num_layers: expected an integer");
    expect_load("{\"geometry\": {\"scale\": \"x\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.scale: expected a number");
    expect_load("{\"geometry\": {\"alibi\": 1}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.alibi: expected a boolean");
    expect_load("{\"server\": {\"listen\": 5}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.listen: expected a string");
    expect_load("{\"log\": {\"level\": true}}", ATTND_ERR_INVALID_ARGUMENT,
                "log.level: expected a string");
    expect_load("[1, 2]", ATTND_ERR_INVALID_ARGUMENT, "top level must be an object");
    expect_load("{\"geometry\": {", ATTND_ERR_INVALID_ARGUMENT, "line 1");
    expect_load("{\"threads\": 1, \"threads\": 2}", ATTND_ERR_INVALID_ARGUMENT, "duplicate");
}

Test(config, out_of_range_values_are_named, .timeout = 60)
{
    expect_load("{\"geometry\": {\"num_layers\": 0}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.num_layers: 0 out of range (1..1024)");
    expect_load("{\"geometry\": {\"num_blocks\": -5}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.num_blocks: -5 out of range");
    expect_load("{\"geometry\": {\"num_blocks\": 99999999999999999}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.num_blocks");
    expect_load("{\"geometry\": {\"head_size\": 300}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.head_size: 300 out of range");
    expect_load("{\"geometry\": {\"head_size\": 68}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.head_size: 68 is not a multiple of 8");
    expect_load("{\"geometry\": {\"block_size\": 24}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.block_size: 24 not one of 16, 32, 64");
    expect_load("{\"geometry\": {\"cache_dtype\": \"int8\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.cache_dtype: \"int8\" not one of f16, bf16, fp8_e4m3");
    expect_load("{\"geometry\": {\"k_scale\": 0}}", ATTND_ERR_INVALID_ARGUMENT, "geometry.k_scale");
    expect_load("{\"geometry\": {\"softcap\": -1}}", ATTND_ERR_INVALID_ARGUMENT,
                "geometry.softcap");
    expect_load("{\"log\": {\"level\": \"loud\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "log.level: \"loud\" not one of error, warn, info, debug");
    expect_load("{\"backend\": \"tpu\"}", ATTND_ERR_INVALID_ARGUMENT, "backend: \"tpu\"");
    expect_load("{\"server\": {\"listen\": \"http://x\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.listen: \"http://x\" is not an ipc:// or tcp:// URL");
    expect_load("{\"server\": {\"listen_tcp\": \"ipc:///x\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.listen_tcp");
    expect_load("{\"server\": {\"ipc_mode\": \"0999\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.ipc_mode");
    expect_load("{\"server\": {\"workers\": 0}}", ATTND_ERR_INVALID_ARGUMENT, "server.workers");
    char big[400] = "{\"server\": {\"token\": \"";
    memset(big + strlen(big), 'x', 200);
    strcpy(big + strlen(big), "\"}}");
    expect_load(big, ATTND_ERR_INVALID_ARGUMENT, "server.token: longer than 127");
}

/* Issue 13, item 13: a mode with setuid/setgid/sticky bits, and ports that do not fit 16 bits
 * (atoi used to wrap them to a small number), are refused by the check, not at start. */
Test(config, ipc_mode_special_bits_and_huge_http_ports_are_refused, .timeout = 60)
{
    expect_load("{\"server\": {\"ipc_mode\": \"7777\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.ipc_mode: \"7777\"");
    expect_load("{\"server\": {\"ipc_mode\": \"4660\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.ipc_mode");
    expect_load("{\"server\": {\"ipc_mode\": \"1660\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "server.ipc_mode");
    expect_load("{\"server\": {\"ipc_mode\": \"0660\"}}", ATTND_ERR_OK, NULL);
    expect_load("{\"server\": {\"ipc_mode\": \"600\"}}", ATTND_ERR_OK, NULL);
    expect_load("{\"http\": {\"listen\": \"http://127.0.0.1:99999999999999999999\"}}",
                ATTND_ERR_INVALID_ARGUMENT, "http.listen");
    expect_load("{\"http\": {\"listen\": \"http://127.0.0.1:4294967297\"}}",
                ATTND_ERR_INVALID_ARGUMENT, "http.listen");
    expect_load("{\"http\": {\"listen\": \"http://127.0.0.1:65536\"}}", ATTND_ERR_INVALID_ARGUMENT,
                "http.listen");
    expect_load("{\"http\": {\"listen\": \"http://127.0.0.1:65535\"}}", ATTND_ERR_OK, NULL);
    expect_load("{\"http\": {\"listen\": \"http://127.0.0.1:0\"}}", ATTND_ERR_OK, NULL);
}

/* Exit status of `attnd --check-config` on json (its output into out). */
static int check_config_run(const char *json, char *out, size_t n)
{
    const char *dir = getenv("ATTND_BUILD_DIR");
    char bin[512], cfg[64] = "/tmp/attnd-cfgtest-XXXXXX", cmd[1200];
    cr_assert_not_null(dir, "ATTND_BUILD_DIR is not set (run with ctest)");
    snprintf(bin, sizeof bin, "%s/daemon/attnd", dir);
    int fd = mkstemp(cfg);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    snprintf(cmd, sizeof cmd, "%s --check-config --config %s 2>&1", bin, cfg);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    unlink(cfg);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(config, check_config_refuses_special_mode_bits_and_huge_ports, .timeout = 60)
{
    char out[1024];
    cr_assert_eq(check_config_run("{\"server\": {\"ipc_mode\": \"7777\"}}", out, sizeof out), 1,
                 "%s", out);
    cr_assert_not_null(strstr(out, "server.ipc_mode"), "%s", out);
    cr_assert_eq(
        check_config_run("{\"http\": {\"listen\": \"http://127.0.0.1:99999999999999999999\"}}", out,
                         sizeof out),
        1, "%s", out);
    cr_assert_not_null(strstr(out, "http.listen"), "%s", out);
    cr_assert_eq(
        check_config_run("{\"http\": {\"listen\": \"http://127.0.0.1:9464\"}}", out, sizeof out), 0,
        "%s", out);
}

Test(config, cross_key_checks_name_the_key, .timeout = 60)
{
    expect_load("{\"geometry\": {\"num_q_heads\": 6, \"num_kv_heads\": 4}}",
                ATTND_ERR_INVALID_ARGUMENT, "geometry.num_q_heads: 6 is not a multiple of");
    expect_load("{\"geometry\": {\"num_blocks\": 8, \"max_blocks_per_seq\": 9}}",
                ATTND_ERR_INVALID_ARGUMENT, "geometry.max_blocks_per_seq: 9 exceeds");
    expect_load("{\"linear\": {\"slots\": 4, \"heads\": 0}}", ATTND_ERR_INVALID_ARGUMENT,
                "linear.heads");
    expect_load("{\"linear\": {\"slots\": 0, \"heads\": 0, \"head_dim\": 0}}", ATTND_ERR_OK, NULL);
    expect_load("{\"geometry\": {\"num_layers\": 1024, \"num_kv_heads\": 1024, \"num_q_heads\": "
                "1024, \"head_size\": 256, \"num_blocks\": 2147483647, \"block_size\": 64}}",
                ATTND_ERR_INVALID_ARGUMENT, "geometry.num_blocks");
}

Test(config, values_are_stored, .timeout = 60)
{
    attnd_config c;
    const char *json = "{\"backend\": \"auto\", \"threads\": 3, \"server\": {\"listen\": "
                       "\"tcp://127.0.0.1:7000\", \"token\": \"s3cret\", \"max_message_bytes\": "
                       "1048576}, \"geometry\": {\"cache_dtype\": \"fp8_e4m3\", \"scale\": 0.5, "
                       "\"alibi\": true, \"head_size\": 96}, \"log\": {\"level\": \"debug\"}}";
    cr_assert_eq(attnd_config_load_string(&c, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(c.backend, ATTND_CFG_BACKEND_AUTO);
    cr_assert_eq(c.threads, 3);
    cr_assert_str_eq(c.server.listen, "tcp://127.0.0.1:7000");
    cr_assert_str_eq(c.server.token, "s3cret");
    cr_assert_eq(c.server.max_message_bytes, 1048576);
    cr_assert_eq(c.geometry.cache_dtype, ATTND_DTYPE_FP8_E4M3);
    cr_assert_eq(c.geometry.head_size, 96);
    cr_assert_eq(c.geometry.alibi, 1);
    cr_assert_float_eq(attnd_config_scale(&c), 0.5f, 1e-7);
    cr_assert_eq(c.log.level, ATTND_LOG_DEBUG);
}

Test(config, reload_applies_live_keys_and_reports_restart_keys, .timeout = 60)
{
    attnd_config cur, next;
    char restart[256];
    attnd_config_defaults(&cur);
    const char *json = "{\"log\": {\"level\": \"debug\"}, \"limits\": {\"max_seqs\": 7}, "
                       "\"server\": {\"token\": \"t\", \"workers\": 3}, "
                       "\"geometry\": {\"num_blocks\": 1000}}";
    cr_assert_eq(attnd_config_load_string(&next, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    int n = attnd_config_apply_live(&cur, &next, restart, sizeof restart);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(restart, "server.workers,geometry.num_blocks");
    cr_assert_eq(cur.log.level, ATTND_LOG_DEBUG);
    cr_assert_eq(cur.limits.max_seqs, 7);
    cr_assert_str_eq(cur.server.token, "t");
    cr_assert_eq(cur.server.workers, 16, "restart-only keys keep their running value");
    cr_assert_eq(cur.geometry.num_blocks, 4096);
    /* the same file again: nothing differs */
    cr_assert_eq(attnd_config_apply_live(&cur, &next, restart, sizeof restart), 2);
    attnd_config same = cur;
    cr_assert_eq(attnd_config_apply_live(&cur, &same, restart, sizeof restart), 0);
    cr_assert_str_eq(restart, "");
}

Test(config, reload_keeps_old_on_invalid, .timeout = 60)
{
    attnd_config cur, before;
    attnd_config_defaults(&cur);
    cur.log.level = ATTND_LOG_WARN;
    before = cur;
    /* the first key is valid and live, the second is not: nothing may be applied */
    const char *json = "{\"log\": {\"level\": \"debug\"}, \"limits\": {\"max_seqs\": 0}}";
    cr_assert_eq(attnd_config_load_string(&cur, json, err, sizeof err), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err, "limits.max_seqs"));
    cr_assert_eq(memcmp(&cur, &before, sizeof cur), 0, "an invalid file changed the config");
    /* a file that fails a cross-key check after all keys parsed */
    json = "{\"log\": {\"level\": \"debug\"}, \"geometry\": {\"num_q_heads\": 3}}";
    cr_assert_eq(attnd_config_load_string(&cur, json, err, sizeof err), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(memcmp(&cur, &before, sizeof cur), 0);
}

/* ---------------------------------------------------------------- the schema */

typedef struct schema_key {
    char name[128];
    json_t *node;
} schema_key;

static size_t schema_walk(json_t *obj, const char *prefix, schema_key *out, size_t n, size_t cap)
{
    const char *k;
    json_t *v;
    json_t *props = json_object_get(obj, "properties");
    cr_assert_not_null(props, "%s: no properties", prefix);
    cr_assert(json_is_false(json_object_get(obj, "additionalProperties")),
              "%s: additionalProperties must be false (unknown keys are errors)", prefix);
    json_object_foreach(props, k, v)
    {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", k);
        const char *type = json_string_value(json_object_get(v, "type"));
        cr_assert_not_null(type, "%s: no type", name);
        if (strcmp(type, "object") == 0) {
            n = schema_walk(v, name, out, n, cap);
            continue;
        }
        cr_assert_lt(n, cap);
        snprintf(out[n].name, sizeof out[n].name, "%s", name);
        out[n++].node = v;
    }
    return n;
}

static void check_schema_number(const attnd_cfg_key *k, json_t *v, const char *name)
{
    cr_assert_float_eq(json_number_value(json_object_get(v, "minimum")), k->min,
                       1e-6 * fabs(k->min) + 1e-40, "%s: minimum", name);
    cr_assert_float_eq(json_number_value(json_object_get(v, "maximum")), k->max,
                       1e-6 * fabs(k->max), "%s: maximum", name);
}

/* geometry.layers: default [], its items' keys exactly the parser's layer keys, with their types
 * and bounds. */
static void check_schema_layers(json_t *v)
{
    size_t nk;
    const attnd_cfg_key *keys = attnd_config_layer_keys(&nk);
    json_t *def = json_object_get(v, "default"), *items = json_object_get(v, "items");
    cr_assert(json_is_array(def) && json_array_size(def) == 0, "geometry.layers: default []");
    cr_assert(json_is_false(json_object_get(items, "additionalProperties")));
    json_t *props = json_object_get(items, "properties");
    cr_assert_eq(json_object_size(props), nk, "geometry.layers: item keys");
    for (size_t i = 0; i < nk; i++) {
        json_t *p = json_object_get(props, keys[i].name);
        cr_assert_not_null(p, "geometry.layers[].%s is not in the schema", keys[i].name);
        json_t *type = json_object_get(p, "type");
        if (keys[i].type == ATTND_CFG_ALIBI) {
            cr_assert(json_is_array(type) && json_array_size(type) == 2, "alibi_slopes: type");
            continue;
        }
        cr_assert_str_eq(json_string_value(type), attnd_config_type_name(keys[i].type),
                         "geometry.layers[].%s: type", keys[i].name);
        if (keys[i].type == ATTND_CFG_U32 || keys[i].type == ATTND_CFG_F32)
            check_schema_number(&keys[i], p, keys[i].name);
    }
}

static void check_schema_key(const attnd_cfg_key *k, json_t *v)
{
    const char *type = json_string_value(json_object_get(v, "type"));
    cr_assert_str_eq(type, attnd_config_type_name(k->type), "%s: type", k->name);
    json_t *def = json_object_get(v, "default");
    cr_assert_not_null(def, "%s: no default", k->name);
    cr_assert_str_eq(json_string_value(json_object_get(v, "x-attnd-reload")),
                     k->live ? "live" : "restart", "%s: reload", k->name);
    if (k->type == ATTND_CFG_LAYERS) {
        check_schema_layers(v);
    } else if (k->type == ATTND_CFG_U32 || k->type == ATTND_CFG_U64 || k->type == ATTND_CFG_F32) {
        check_schema_number(k, v, k->name);
        cr_assert_float_eq(json_number_value(def), k->def_num, 1e-9, "%s: default", k->name);
    } else if (k->type == ATTND_CFG_BOOL) {
        cr_assert_eq(json_is_true(def), k->def_num != 0, "%s: default", k->name);
    } else if (k->type == ATTND_CFG_STR) {
        cr_assert_str_eq(json_string_value(def), k->def_str, "%s: default", k->name);
    } else {
        json_t *en = json_object_get(v, "enum");
        size_t i = 0;
        for (const attnd_cfg_choice *ch = k->choices; ch->name; ch++, i++) {
            cr_assert_str_eq(json_string_value(json_array_get(en, i)), ch->name, "%s: enum",
                             k->name);
            if (ch->value == (int)k->def_num)
                cr_assert_str_eq(json_string_value(def), ch->name, "%s: default", k->name);
        }
        cr_assert_eq(json_array_size(en), i, "%s: enum size", k->name);
    }
}

Test(config, schema_and_table_describe_the_same_keys, .timeout = 60)
{
    char path[1024];
    json_error_t je;
    schema_key keys[128];
    size_t ntable;
    const attnd_cfg_key *table = attnd_config_keys(&ntable);
    repo_path(path, sizeof path, "config/attnd.schema.json");
    json_t *root = json_load_file(path, 0, &je);
    cr_assert_not_null(root, "%s: %s", path, je.text);
    size_t nschema = schema_walk(root, "", keys, 0, 128);
    for (size_t i = 0; i < nschema; i++)
        cr_assert_not_null(attnd_config_key_find(keys[i].name), "schema key %s is not in the table",
                           keys[i].name);
    for (size_t i = 0; i < ntable; i++) {
        json_t *node = NULL;
        for (size_t j = 0; j < nschema; j++)
            if (strcmp(keys[j].name, table[i].name) == 0) node = keys[j].node;
        cr_assert_not_null(node, "table key %s is not in the schema", table[i].name);
        check_schema_key(&table[i], node);
    }
    cr_assert_eq(nschema, ntable);
    json_decref(root);
}

/* ---------------------------------------------------------------- geometry.layers */

Test(config, layers_repeat_and_resolve_over_the_global_keys, .timeout = 60)
{
    attnd_config c;
    attnd_cfg_layer l;
    /* Gemma-2's pattern over 6 layers, with a global softcap and scale; layer 1 of 3 has its own
     * ALiBi slopes and sinks */
    const char *json = "{\"geometry\": {\"num_layers\": 6, \"num_q_heads\": 2, \"num_kv_heads\": 1,"
                       " \"softcap\": 50, \"scale\": 0.25, \"cache_dtype\": \"f32\", \"layers\": ["
                       "{\"sliding_window\": 4096}, {}]}}";
    cr_assert_eq(attnd_config_load_string(&c, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(c.geometry.cache_dtype, ATTND_DTYPE_F32);
    for (uint32_t i = 0; i < 6; i++) {
        attnd_config_layer(&c.geometry, i, &l);
        cr_assert_eq(l.sliding_window, i % 2 ? 0u : 4096u, "layer %u", i);
        cr_assert_eq(l.softcap, 50.0f);
        cr_assert_eq(l.scale, 0.25f);
        cr_assert_eq(l.alibi, ATTND_CFG_ALIBI_OFF);
        cr_assert_null(l.sinks);
    }
    attnd_config_fini(&c);
    cr_assert_null(c.geometry.layers);
    json = "{\"geometry\": {\"num_layers\": 3, \"num_q_heads\": 2, \"num_kv_heads\": 1,"
           " \"alibi\": true, \"layers\": [{\"alibi_slopes\": false, \"scale\": 0},"
           " {\"alibi_slopes\": [0.5, 0.25], \"sinks\": [1.5, -2], \"softcap\": 30, \"k_scale\": 2,"
           " \"v_scale\": 0.5, \"scale\": 0.125}, {\"alibi_slopes\": true}]}}";
    cr_assert_eq(attnd_config_load_string(&c, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    attnd_config_layer(&c.geometry, 0, &l);
    cr_assert_eq(l.alibi, ATTND_CFG_ALIBI_OFF);
    cr_assert_float_eq(l.scale, 0.125f, 1e-7, "scale 0 is 1/sqrt(head_size 64)");
    attnd_config_layer(&c.geometry, 1, &l);
    cr_assert_eq(l.alibi, ATTND_CFG_ALIBI_GIVEN);
    cr_assert_eq(l.num_alibi_slopes, 2);
    cr_assert_eq(l.alibi_slopes[1], 0.25f);
    cr_assert_eq(l.num_sinks, 2);
    cr_assert_eq(l.sinks[0], 1.5f);
    cr_assert_eq(l.sinks[1], -2.0f);
    cr_assert_eq(l.softcap, 30.0f);
    cr_assert_eq(l.k_scale, 2.0f);
    cr_assert_eq(l.v_scale, 0.5f);
    attnd_config_layer(&c.geometry, 2, &l);
    cr_assert_eq(l.alibi, ATTND_CFG_ALIBI_STANDARD);
    cr_assert_null(l.sinks);
    cr_assert_eq(l.k_scale, 1.0f);
    attnd_config_fini(&c);
    /* [] is no overrides */
    cr_assert_eq(attnd_config_load_string(&c, "{\"geometry\": {\"layers\": []}}", err, sizeof err),
                 ATTND_ERR_OK);
    cr_assert_null(c.geometry.layers);
}

Test(config, layer_errors_name_the_entry_and_key, .timeout = 60)
{
#define G(x) "{\"geometry\": {\"num_layers\": 4, \"num_q_heads\": 2, \"num_kv_heads\": 1, " x "}}"
    expect_load(G("\"layers\": [{}, {}, {}, {\"softcap\": -1}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[3].softcap: -1 out of range (0..1e+06)");
    expect_load(G("\"layers\": [{\"sliding_window\": 1.5}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sliding_window: expected an integer");
    expect_load(G("\"layers\": [{}, {\"windw\": 3}]"), ATTND_ERR_INVALID_ARGUMENT,
                "unknown key: geometry.layers[1].windw");
    expect_load(G("\"layers\": [{}, {}, {}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers: 3 entries do not divide geometry.num_layers (4)");
    expect_load(G("\"layers\": [{}, {}, {}, {}, {}, {}, {}, {}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers: 8 entries do not divide");
    expect_load(G("\"layers\": [{\"sinks\": [1, 2, 3]}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sinks: 3 entries, geometry.num_q_heads is 2");
    expect_load(G("\"layers\": [{}, {\"alibi_slopes\": [1]}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[1].alibi_slopes: 1 entries, geometry.num_q_heads is 2");
    expect_load(G("\"layers\": [{\"sinks\": [1, \"x\"]}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sinks[1]: not a finite number");
    expect_load(G("\"layers\": [{\"sinks\": [1, 1e300]}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sinks[1]: not a finite number");
    expect_load(G("\"layers\": [{\"sinks\": []}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sinks: 0 entries");
    expect_load(G("\"layers\": [{\"sinks\": true}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].sinks: expected an array of numbers");
    expect_load(G("\"layers\": [{\"alibi_slopes\": \"std\"}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].alibi_slopes: expected an array of numbers");
    expect_load(G("\"layers\": [3]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0]: expected an object");
    expect_load(G("\"layers\": {\"sliding_window\": 3}"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers: expected an array of objects");
    expect_load(G("\"layers\": [{\"k_scale\": 0}]"), ATTND_ERR_INVALID_ARGUMENT,
                "geometry.layers[0].k_scale: 0 out of range");
#undef G
}

Test(config, reload_names_changed_layers_as_restart, .timeout = 60)
{
    attnd_config cur, next;
    char restart[256];
    const char *a = "{\"geometry\": {\"layers\": [{\"sinks\": [1, 2, 3, 4, 5, 6, 7, 8]}, {}]}}";
    const char *b = "{\"geometry\": {\"layers\": [{\"sinks\": [1, 2, 3, 4, 5, 6, 7, 9]}, {}]}}";
    cr_assert_eq(attnd_config_load_string(&cur, a, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(attnd_config_load_string(&next, a, err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(attnd_config_apply_live(&cur, &next, restart, sizeof restart), 0);
    attnd_config_fini(&next);
    cr_assert_eq(attnd_config_load_string(&next, b, err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(attnd_config_apply_live(&cur, &next, restart, sizeof restart), 1);
    cr_assert_str_eq(restart, "geometry.layers");
    cr_assert_eq(cur.geometry.layers->entries[0].sinks[7], 8.0f, "the running layers stay");
    attnd_config_fini(&next);
    attnd_config_fini(&cur);
}
