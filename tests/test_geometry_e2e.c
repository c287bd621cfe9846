/* Real models over a real ipc:// socket: a daemon whose layers differ (window, softcap with
 * sinks, standard ALiBi, scale) reports every layer in Hello and Status; a client's expected
 * geometry is refused FAILED_PRECONDITION naming the first difference; steps on every layer match
 * the mirror (CPU op on the same cache) and the float64 reference; Truncate drops tokens and
 * their blocks and never writes a block a fork shares; a model whose every layer is windowed
 * releases blocks wholly behind the window, grows past max_blocks_per_seq x block_size, and
 * refuses a truncation into what it released. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "suite.h"
#include "testutil.h"

#define LAYERS_CONFIG                                                                              \
    "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 4, \"num_q_heads\": 4, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 128,"      \
    " \"max_blocks_per_seq\": 16, \"layers\": [{\"sliding_window\": 9},"                           \
    " {\"softcap\": 4, \"sinks\": [1.5, -0.5, 3, 0.25]}, {\"alibi_slopes\": true},"                \
    " {\"scale\": 0.2}]}, \"linear\": {\"slots\": 0},"                                             \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

/* Every layer windowed (9 and 20): blocks before the larger window go. 4 blocks per sequence. */
#define WINDOWED_CONFIG                                                                            \
    "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 4, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 32,"       \
    " \"max_blocks_per_seq\": 4, \"sliding_window\": 9, \"layers\": [{},"                          \
    " {\"sliding_window\": 20, \"sinks\": [1, 2, 3, 4]}]}, \"linear\": {\"slots\": 0},"            \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

static const float SINKS[4] = {1.5f, -0.5f, 3.0f, 0.25f};

/* ---------------------------------------------------------------- what Hello says */

static void check_layers(const attnd_geometry *g)
{
    cr_assert_not_null(g->layers);
    cr_assert_eq(g->num_layers, 4);
    cr_assert_eq(g->window_release, 0, "layers 1-3 see their whole context");
    cr_assert_eq(g->layers[0].sliding_window, 9);
    cr_assert_eq(g->layers[0].softcap, 0.0f);
    cr_assert_float_eq(g->layers[0].scale, 0.125f, 1e-7);
    cr_assert_eq(g->layers[0].num_sinks, 0);
    cr_assert_null(g->layers[0].sinks);
    cr_assert_eq(g->layers[1].softcap, 4.0f);
    cr_assert_eq(g->layers[1].num_sinks, 4);
    cr_assert_eq(memcmp(g->layers[1].sinks, SINKS, sizeof SINKS), 0);
    cr_assert_eq(g->layers[2].alibi, 1);
    cr_assert_eq(g->layers[2].num_alibi_slopes, 4);
    cr_assert_float_eq(g->layers[2].alibi_slopes[0], 0.25f, 1e-7, "2^(-8/4)");
    cr_assert_float_eq(g->layers[2].alibi_slopes[3], 1.0f / 256, 1e-9);
    cr_assert_eq(g->layers[1].alibi, 0);
    cr_assert_eq(g->layers[3].scale, 0.2f);
}

Test(geometry_e2e, hello_and_status_report_every_layer, .timeout = 60)
{
    attnd_daemon_proc d;
    attnd_status st;
    attnd_test_daemon_start(&d, LAYERS_CONFIG);
    attnd_client *c = attnd_test_connect(&d);
    check_layers(&attnd_client_server(c)->geometry);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    check_layers(&st.geometry);
    attnd_client_free(c);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- Hello.expect */

/* Hello with the expectation e on a fresh client: its code; the message into msg. */
static attnd_err hello_expecting(const attnd_daemon_proc *d, const attnd_expect *e, char *msg,
                                 size_t n)
{
    attnd_client *c;
    cr_assert_eq(attnd_client_alloc(&c, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_set_expect(c, e), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_dial(c, d->url), ATTND_ERR_OK);
    attnd_err rv = attnd_client_hello(c, NULL);
    snprintf(msg, n, "%s", attnd_client_last_error(c));
    if (rv != ATTND_ERR_OK) { /* the same connection says Hello again without it */
        cr_assert_eq(attnd_client_set_expect(c, NULL), ATTND_ERR_OK);
        cr_assert_eq(attnd_client_hello(c, NULL), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    }
    attnd_client_free(c);
    return rv;
}

Test(geometry_e2e, an_expected_geometry_that_differs_is_refused_naming_it, .timeout = 60)
{
    attnd_daemon_proc d;
    char msg[512];
    float other[4] = {1.5f, -0.5f, 2.5f, 0.25f};
    /* the model's own account: ALiBi "standard" (no slopes), scale 0 = 1/sqrt(64) */
    attnd_layer_opts l[4] = {{.sliding_window = 9},
                             {.softcap = 4, .num_sinks = 4, .sinks = SINKS},
                             {.alibi = 1},
                             {.scale = 0.2f}};
    attnd_expect e = {.num_layers = 4,
                      .num_q_heads = 4,
                      .num_kv_heads = 2,
                      .head_size = 64,
                      .compare_cache_dtype = 1,
                      .cache_dtype = ATTND_DTYPE_BF16,
                      .num_layer_opts = 4,
                      .layer_opts = l};
    attnd_test_daemon_start(&d, LAYERS_CONFIG);
    cr_assert_eq(hello_expecting(&d, &e, msg, sizeof msg), ATTND_ERR_OK, "%s", msg);
    l[1].sinks = other;
    cr_assert_eq(hello_expecting(&d, &e, msg, sizeof msg), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(msg, "geometry.layers[1].sinks[2]: the daemon serves 3, the client expects "
                          "2.5"),
              "%s", msg);
    l[1].sinks = SINKS;
    l[3].scale = 0;
    cr_assert_eq(hello_expecting(&d, &e, msg, sizeof msg), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(msg, "geometry.layers[3].scale: the daemon serves 0.200000003"), "%s", msg);
    l[3].scale = 0.2f;
    e.cache_dtype = ATTND_DTYPE_F32;
    cr_assert_eq(hello_expecting(&d, &e, msg, sizeof msg), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(msg, "geometry.cache_dtype: the daemon serves bf16, the client expects f32"),
              "%s", msg);
    e.compare_cache_dtype = 0;
    e.num_kv_heads = 1;
    cr_assert_eq(hello_expecting(&d, &e, msg, sizeof msg), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(msg, "geometry.num_kv_heads: the daemon serves 2, the client expects 1"), "%s",
              msg);
    /* one entry for every layer: layer 0's window is wrong for layers 1-3 */
    attnd_expect one = {.num_layer_opts = 1, .layer_opts = l};
    cr_assert_eq(hello_expecting(&d, &one, msg, sizeof msg), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(msg, "geometry.layers[1].sliding_window: the daemon serves 0, the client "
                          "expects 9"),
              "%s", msg);
    attnd_expect three = {.num_layer_opts = 3, .layer_opts = l};
    cr_assert_eq(hello_expecting(&d, &three, msg, sizeof msg), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "expect.layers: 3 entries do not divide the daemon's 4 layers"), "%s",
              msg);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- steps, truncate, fork */

typedef struct run {
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    int64_t steps;
} run;

static void run_open(run *x, const attnd_daemon_proc *d, int32_t max_tokens)
{
    memset(x, 0, sizeof *x);
    x->c = attnd_test_connect(d);
    const attnd_geometry *g = &attnd_client_server(x->c)->geometry;
    cr_assert_eq(attnd_mirror_init(&x->m, g, NULL, max_tokens), 0);
    cr_assert_eq(
        attnd_client_shm_create(x->c, attnd_e2e_io_bytes(g, ATTND_DTYPE_BF16, 128), &x->shm),
        ATTND_ERR_OK);
    attnd_rng_seed(&x->r, 31);
}

static void run_step(run *x, const attnd_step_seq *seqs, int32_t n)
{
    attnd_err rv =
        attnd_e2e_step(x->c, &x->m, &x->shm, ATTND_DTYPE_BF16, 0, seqs, n, 0, &x->r, &x->errs);
    cr_assert_eq(rv, ATTND_ERR_OK, "step: %s", attnd_client_last_error(x->c));
    x->steps++;
}

static void run_close(run *x, attnd_daemon_proc *d)
{
    const attnd_geometry *g = &attnd_client_server(x->c)->geometry;
    cr_assert_eq(x->errs.attends, x->steps * g->num_layers);
    cr_expect_leq(x->errs.direct, attnd_e2e_direct_tol(ATTND_DTYPE_BF16), "vs CPU op %.3g",
                  x->errs.direct);
    cr_expect_leq(x->errs.ref, attnd_tol_for(ATTND_DTYPE_BF16), "vs reference %.3g", x->errs.ref);
    cr_expect_leq(x->errs.direct_lse, ATTND_E2E_DIRECT_LSE_TOL);
    cr_expect_leq(x->errs.ref_lse, ATTND_E2E_REF_LSE_TOL);
    fprintf(stderr, "geometry_e2e: %lld attends, out vs CPU op %.2g, vs reference %.2g\n",
            (long long)x->errs.attends, x->errs.direct, x->errs.ref);
    cr_assert_eq(attnd_client_shm_destroy(x->c, &x->shm), ATTND_ERR_OK);
    attnd_client_free(x->c);
    attnd_mirror_fini(&x->m);
    cr_assert_eq(attnd_daemon_stop(d), 0);
}

static attnd_seq_info query(run *x, uint64_t id)
{
    attnd_seq_info info;
    cr_assert_eq(attnd_client_seq_query(x->c, id, &info), ATTND_ERR_OK);
    cr_assert_eq((int32_t)info.num_tokens, attnd_mirror_len(&x->m, id));
    return info;
}

static void truncate_both(run *x, uint64_t id, uint32_t n)
{
    attnd_seq_info info;
    cr_assert_eq(attnd_client_seq_truncate(x->c, id, n, &info), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(x->c));
    attnd_mirror_truncate(&x->m, id, (int32_t)n);
    cr_assert_eq((int32_t)info.num_tokens, attnd_mirror_len(&x->m, id));
}

Test(geometry_e2e, per_layer_steps_truncate_and_fork, .timeout = 120)
{
    attnd_daemon_proc d;
    run x;
    attnd_status st;
    attnd_test_daemon_start(&d, LAYERS_CONFIG);
    run_open(&x, &d, 160);
    for (uint64_t id = 1; id <= 2; id++) {
        cr_assert_eq(attnd_client_seq_create(x.c, id, NULL), ATTND_ERR_OK);
        cr_assert_eq(attnd_mirror_create(&x.m, id), 0);
    }
    attnd_step_seq pre[2] = {{1, 40}, {2, 20}}, dec[2] = {{1, 1}, {2, 1}};
    run_step(&x, pre, 2);
    for (int s = 0; s < 4; s++)
        run_step(&x, dec, 2);
    /* seq 1: 44 tokens in 3 blocks; dropping 13 leaves 31 in 2 */
    truncate_both(&x, 1, 13);
    cr_assert_eq(query(&x, 1).num_blocks, 2);
    /* seq 2 (24 tokens) forks; the child drops into the shared first block and writes: the
     * block is copied, the parent's rows stay as they were (its next steps match the mirror) */
    cr_assert_eq(attnd_client_seq_fork(x.c, 2, 3, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_fork(&x.m, 2, 3), 0);
    truncate_both(&x, 3, 14);
    attnd_step_seq mix[3] = {{3, 5}, {2, 1}, {1, 1}};
    run_step(&x, mix, 3);
    attnd_step_seq all[3] = {{1, 1}, {2, 1}, {3, 1}};
    for (int s = 0; s < 6; s++)
        run_step(&x, all, 3);
    /* in an open step, more than the sequence has, a sequence never made */
    attnd_step step;
    cr_assert_eq(attnd_client_step_begin(x.c, dec, 1, &step, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_truncate(x.c, 1, 1, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(attnd_client_last_error(x.c), "is in open step"));
    cr_assert_eq(attnd_client_step_end(x.c, step.id, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_truncate(x.c, 2, 1000, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(attnd_client_last_error(x.c), "tokens: 1000 tokens to drop, sequence 2 has"));
    cr_assert_eq(attnd_client_seq_truncate(x.c, 9, 1, NULL), ATTND_ERR_NOT_FOUND);
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert_eq(attnd_client_seq_truncate(x.c, id, query(&x, id).num_tokens, NULL),
                     ATTND_ERR_OK, "down to nothing");
    cr_assert_eq(attnd_client_status(x.c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, st.geometry.num_blocks, "every block back after truncating all");
    run_close(&x, &d);
}

Test(geometry_e2e, a_windowed_model_releases_blocks_behind_the_window, .timeout = 120)
{
    attnd_daemon_proc d;
    run x;
    attnd_test_daemon_start(&d, WINDOWED_CONFIG);
    run_open(&x, &d, 400);
    cr_assert_eq(attnd_client_server(x.c)->geometry.window_release, 20);
    cr_assert_eq(attnd_client_seq_create(x.c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&x.m, 1), 0);
    attnd_step_seq pre[1] = {{1, 50}}, dec[1] = {{1, 1}};
    run_step(&x, pre, 1);
    /* 4 blocks of 16 would cap a sequence at 64 tokens; it grows to 150 holding at most 3 */
    for (int s = 0; s < 100; s++) {
        run_step(&x, dec, 1);
        attnd_seq_info info = query(&x, 1);
        cr_assert_leq(info.num_blocks, 3, "%u tokens hold %u blocks", info.num_tokens,
                      info.num_blocks);
        cr_assert_eq(info.released_tokens, (info.num_tokens - 20 + 1) / 16 * 16);
    }
    /* rollback inside the window (150 tokens: 129.. are kept; 2 back, the next query sees
     * 129..); past what was released it is refused */
    truncate_both(&x, 1, 2);
    run_step(&x, dec, 1);
    cr_assert_eq(attnd_client_seq_truncate(x.c, 1, 40, NULL), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(attnd_client_last_error(x.c), "the window released every key before"), "%s",
              attnd_client_last_error(x.c));
    /* a chunk that would hold more than 4 blocks is still refused */
    attnd_step_seq big[1] = {{1, 60}};
    attnd_step step;
    cr_assert_eq(attnd_client_step_begin(x.c, big, 1, &step, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(attnd_client_last_error(x.c), "over geometry.max_blocks_per_seq (4)"));
    run_close(&x, &d);
}
