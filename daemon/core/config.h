/* Configuration: one table of keys (name, type, field, default, bounds, validator, live or
 * restart), loaded from a JSON file with jansson.
 *
 * Keys are dotted paths into nested objects ("geometry.num_layers"). Unknown keys, wrong types
 * and out-of-range values are errors whose message starts with the key. A reload loads and
 * validates the whole new file first and only then copies the live keys over the running
 * configuration; restart-only keys that changed are reported, not applied. */
#ifndef ATTND_CORE_CONFIG_H
#define ATTND_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

#define ATTND_CFG_URL_MAX 256
#define ATTND_CFG_NAME_MAX 64
#define ATTND_CFG_TOKEN_MAX 128

typedef enum attnd_cfg_backend {
    ATTND_CFG_BACKEND_CPU = 0,
    ATTND_CFG_BACKEND_CUDA = 1,
    ATTND_CFG_BACKEND_AUTO = 2, /* cuda when compiled in and a device opens, else cpu */
} attnd_cfg_backend;

typedef struct attnd_cfg_server {
    char listen[ATTND_CFG_URL_MAX];            /* ipc:// or tcp:// */
    char listen_tcp[ATTND_CFG_URL_MAX];        /* optional second listener, "" = off */
    char ipc_mode[8];                          /* octal permissions of the ipc socket file */
    char ipc_group[ATTND_CFG_NAME_MAX];        /* group owning the ipc socket file, "" = ours */
    char token[ATTND_CFG_TOKEN_MAX];           /* shared secret asked in Hello, "" = none */
    char tls_cert_key_file[ATTND_CFG_URL_MAX]; /* PEM cert chain + key for tls+tcp:// */
    uint32_t workers;                          /* concurrent nng_ctx receive loops */
    uint32_t queue_depth;                      /* executor queue slots; full -> UNAVAILABLE */
    uint64_t max_message_bytes;                /* NNG_OPT_RECVMAXSZ */
    uint32_t max_message_bytes_before_hello;   /* until a Hello succeeds on the connection */
    uint32_t max_inflight_per_connection;      /* requests one connection may have unanswered */
    uint32_t max_inflight_per_session;         /* taken from its channels, not answered yet */
    uint32_t send_timeout_ms;                  /* a reply not taken by then closes its connection */
    uint32_t listener_check_ms; /* how often a probe checks that the listeners accept, 0 = off */
    uint32_t drain_timeout_ms;  /* SIGTERM: wait this long for in-flight work */
    uint32_t channels;          /* shared-memory channels open at most, 0 = off */
    uint32_t spin_us; /* the executor polls this long after its last work before it sleeps */
    uint32_t streams; /* stream channels open at most (stream-ordered steps), 0 = off */
} attnd_cfg_server;

/* ALiBi of a layer. */
enum { ATTND_CFG_ALIBI_OFF = 0, ATTND_CFG_ALIBI_STANDARD = 1, ATTND_CFG_ALIBI_GIVEN = 2 };

/* Which keys an entry of geometry.layers gives (attnd_cfg_layer.set). */
enum {
    ATTND_CFG_LAYER_WINDOW = 1u << 0,
    ATTND_CFG_LAYER_SOFTCAP = 1u << 1,
    ATTND_CFG_LAYER_SCALE = 1u << 2,
    ATTND_CFG_LAYER_ALIBI = 1u << 3,
    ATTND_CFG_LAYER_SINKS = 1u << 4,
    ATTND_CFG_LAYER_K_SCALE = 1u << 5,
    ATTND_CFG_LAYER_V_SCALE = 1u << 6,
};

/* One layer's attention options: an entry of geometry.layers (only the `set` keys given), or a
 * layer resolved against the global keys (attnd_config_layer: every key set). */
typedef struct attnd_cfg_layer {
    uint32_t set;            /* ATTND_CFG_LAYER_* */
    uint32_t sliding_window; /* 0 = off */
    float softcap;           /* 0 = off */
    float scale;             /* 0 = 1/sqrt(head_size); resolved: the scale itself */
    float k_scale, v_scale;  /* fp8 cache scales */
    int alibi;               /* ATTND_CFG_ALIBI_* */
    uint32_t num_alibi_slopes, num_sinks;
    float *alibi_slopes; /* GIVEN: [num_alibi_slopes] (num_q_heads once validated) */
    float *sinks;        /* [num_sinks] sink logits, NULL = none */
} attnd_cfg_layer;

/* geometry.layers: per-layer overrides; entry i applies to layers i, i + count, i + 2 count...
 * (count divides num_layers). Immutable once loaded; owned by the configuration that loaded it
 * (attnd_config_fini frees it), borrowed by copies of it. */
typedef struct attnd_cfg_layers {
    uint32_t count;
    attnd_cfg_layer *entries;
} attnd_cfg_layers;

typedef struct attnd_cfg_geometry {
    uint32_t num_layers, num_q_heads, num_kv_heads, head_size, block_size;
    int cache_dtype; /* attnd_dtype: f32, f16, bf16, fp8_e4m3 */
    uint32_t num_blocks, max_blocks_per_seq;
    float scale;               /* 0 = 1/sqrt(head_size) */
    uint32_t sliding_window;   /* 0 = off */
    float softcap;             /* 0 = off */
    int alibi;                 /* standard ALiBi slopes for num_q_heads */
    float k_scale, v_scale;    /* fp8 cache scales */
    float gpu_memory_fraction; /* cuda: > 0 sizes num_blocks from free device memory */
    attnd_cfg_layers *layers;  /* geometry.layers, NULL when none (or empty) */
} attnd_cfg_geometry;

typedef struct attnd_cfg_linear {
    uint32_t slots, heads, head_dim; /* 0 slots = no linear-attention state */
} attnd_cfg_linear;

typedef struct attnd_cfg_limits {
    uint32_t max_sessions, max_seqs, max_step_tokens, max_regions, max_steps;
    uint32_t max_sessions_per_connection;
    uint64_t max_inline_bytes;
    uint32_t request_timeout_ms; /* 0 = none */
    uint32_t reclaim_timeout_ms; /* sessions of a dropped connection live this long */
    uint32_t stream_timeout_ms;  /* a stream step's layers must run within this */
} attnd_cfg_limits;

typedef struct attnd_config {
    int backend;      /* attnd_cfg_backend */
    uint32_t threads; /* cpu backend worker threads, 0 = online cores */
    uint32_t device;  /* cuda device ordinal */
    attnd_cfg_server server;
    attnd_cfg_geometry geometry;
    attnd_cfg_linear linear;
    attnd_cfg_limits limits;
    struct {
        char listen[ATTND_CFG_URL_MAX]; /* operator HTTP endpoint http://HOST:PORT, "" = off */
        uint32_t max_connections;       /* open at once; at the limit the oldest unfinished goes */
        uint32_t header_timeout_ms;     /* a request's head must arrive within this */
    } http;
    struct {
        int level;                 /* attnd_log_level */
        uint32_t stats_interval_s; /* 0 = no periodic stats line */
    } log;
} attnd_config;

typedef enum attnd_cfg_type {
    ATTND_CFG_U32,
    ATTND_CFG_U64,
    ATTND_CFG_F32,
    ATTND_CFG_BOOL,
    ATTND_CFG_STR,
    ATTND_CFG_ENUM,
    ATTND_CFG_LAYERS, /* geometry.layers: an array of objects of attnd_config_layer_keys */
    ATTND_CFG_ALIBI,  /* a layer's alibi_slopes: true (standard), false, or an array of numbers */
    ATTND_CFG_FLOATS, /* an array of finite numbers */
} attnd_cfg_type;

typedef struct attnd_cfg_choice {
    const char *name;
    int value;
} attnd_cfg_choice;

typedef struct attnd_cfg_key attnd_cfg_key;
/* Extra check of one key's parsed value: fills err (starting with the key) and returns
 * ATTND_ERR_INVALID_ARGUMENT, or ATTND_ERR_OK. */
typedef attnd_err (*attnd_cfg_check)(const attnd_config *c, const attnd_cfg_key *k, char *err,
                                     size_t n);

struct attnd_cfg_key {
    const char *name;
    attnd_cfg_type type;
    size_t offset;                   /* into attnd_config */
    size_t size;                     /* STR: buffer size (max length + 1) */
    double min, max;                 /* numbers: inclusive bounds */
    double def_num;                  /* default of numbers, bools and enums (the value) */
    const char *def_str;             /* default of strings */
    const attnd_cfg_choice *choices; /* ENUM: NULL-terminated list */
    attnd_cfg_check check;
    int live; /* applied by a reload; otherwise needs a restart */
    const char *doc;
};

/* The table, in file order. */
const attnd_cfg_key *attnd_config_keys(size_t *count);
/* The key with this dotted name, or NULL. */
const attnd_cfg_key *attnd_config_key_find(const char *name);
/* Name of a JSON type for messages ("integer", "number", "boolean", "string"). */
const char *attnd_config_type_name(attnd_cfg_type type);

void attnd_config_defaults(attnd_config *c);
/* Free what a load allocated (geometry.layers); c keeps its other values. */
void attnd_config_fini(attnd_config *c);
/* Defaults, then the file's keys, then every check. c is written only on success (a loaded c
 * owns its geometry.layers: attnd_config_fini it before loading into it again).
 * NOT_FOUND when the file cannot be read, INVALID_ARGUMENT otherwise. */
attnd_err attnd_config_load_file(attnd_config *c, const char *path, char *err, size_t n);
attnd_err attnd_config_load_string(attnd_config *c, const char *json, char *err, size_t n);
/* Every per-key and cross-key check on a filled configuration. */
attnd_err attnd_config_validate(const attnd_config *c, char *err, size_t n);
/* Copy the live keys of next (already validated) into cur; write the names of restart-only
 * keys whose values differ into restart (comma separated). Returns how many differ. */
int attnd_config_apply_live(attnd_config *cur, const attnd_config *next, char *restart, size_t n);
/* Effective softmax scale (the configured one, or 1/sqrt(head_size)). */
float attnd_config_scale(const attnd_config *c);

/* The keys of one geometry.layers entry (names without the prefix), for the schema check. */
const attnd_cfg_key *attnd_config_layer_keys(size_t *count);
/* Layer `layer` (< num_layers) of g resolved: its geometry.layers entry over the global keys,
 * the scale made effective, every key set. Pointers borrow g's arrays. */
void attnd_config_layer(const attnd_cfg_geometry *g, uint32_t layer, attnd_cfg_layer *out);
/* Every layer windowed: the largest window (blocks wholly before it can be released); 0 when
 * some layer sees its whole context. */
uint32_t attnd_config_window_all(const attnd_cfg_geometry *g);
/* Every layer of g resolved, as a JSON array of objects in the config's own keys (alibi_slopes
 * true for the standard slopes; sinks only where a layer has them), into buf[cap]. Returns the
 * length the whole text needs (snprintf's contract: complete when < cap). */
size_t attnd_config_layers_json(const attnd_cfg_geometry *g, char *buf, size_t cap);
/* Whether two geometries have the same geometry.layers (both none counts as equal). */
int attnd_config_layers_equal(const attnd_cfg_layers *a, const attnd_cfg_layers *b);

/* Internal to core/config*.c: parse geometry.layers (an array) into c->geometry.layers;
 * validate it against the rest of the geometry; parse one number of key k named `name`. */
struct json_t;
attnd_err attnd_config_layers_parse(attnd_config *c, const struct json_t *v, char *e, size_t n);
attnd_err attnd_config_layers_check(const attnd_cfg_geometry *g, char *e, size_t n);
attnd_err attnd_config_number(const attnd_cfg_key *k, const char *name, const struct json_t *v,
                              double *out, char *e, size_t n);

#endif
