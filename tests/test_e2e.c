/* End to end over a real ipc:// socket: the daemon started by the test, prefill (whole and
 * chunked), mixed batches and many decode steps for several sequences of different lengths,
 * through libattnd-client; every output and LSE compared with the CPU op called directly on the
 * same cache contents and with the float64 reference. Geometry comes from HelloReply; each case
 * writes its own small config (GQA, MQA, MHA with fp8 cache, sliding window and softcap). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

#define NSEQS 3
#define MAX_TOKENS 160

typedef struct e2e_case {
    const char *config;
    attnd_mirror_opts mo; /* the config's options the geometry message does not carry */
    attnd_dtype dt;       /* q, k, v and out */
    int use_inline;
    int over_tcp;       /* connect to the config's listen_tcp (@TCP@) */
    const char *url;    /* or to this URL (NULL: the ipc socket) */
    const char *tls_ca; /* CA file for a tls+tcp:// url */
    int32_t prompt[NSEQS];
    int32_t decode_steps;
    uint64_t seed;
} e2e_case;

static void check_errs(const attnd_e2e_errs *e, attnd_dtype dt, int64_t attends)
{
    cr_assert_eq(e->attends, attends, "%lld attends checked, expected %lld", (long long)e->attends,
                 (long long)attends);
    cr_expect_leq(e->direct, attnd_e2e_direct_tol(dt), "out vs CPU op: rel L2 %.3g", e->direct);
    cr_expect_leq(e->direct_lse, ATTND_E2E_DIRECT_LSE_TOL, "lse vs CPU op: %.3g", e->direct_lse);
    cr_expect_leq(e->ref, attnd_tol_for(dt), "out vs reference: rel L2 %.3g", e->ref);
    cr_expect_leq(e->ref_lse, ATTND_E2E_REF_LSE_TOL, "lse vs reference: %.3g", e->ref_lse);
    fprintf(stderr, "e2e: %lld attends, out vs CPU op %.2g, vs reference %.2g; lse %.2g / %.2g\n",
            (long long)e->attends, e->direct, e->ref, e->direct_lse, e->ref_lse);
}

/* One step; asserts the daemon accepted every request. */
static void step(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, const e2e_case *k,
                 const attnd_step_seq *seqs, int32_t n, int abort, attnd_rng *r,
                 attnd_e2e_errs *errs)
{
    attnd_err rv = attnd_e2e_step(c, m, shm, k->dt, k->use_inline, seqs, n, abort, r, errs);
    cr_assert_eq(rv, ATTND_ERR_OK, "step failed: %s", attnd_err_name(rv));
}

/* Prefill: seqs 0 and 1 whole, seq 2's first half; then seq 2's rest with decodes of 0 and 1. */
static int64_t prefill(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, const e2e_case *k,
                       attnd_rng *r, attnd_e2e_errs *errs)
{
    int32_t half = k->prompt[2] / 2;
    attnd_step_seq a[NSEQS] = {
        {1, (uint32_t)k->prompt[0]}, {2, (uint32_t)k->prompt[1]}, {3, (uint32_t)half}};
    attnd_step_seq b[NSEQS] = {{3, (uint32_t)(k->prompt[2] - half)}, {1, 1}, {2, 1}};
    step(c, m, shm, k, a, NSEQS, 0, r, errs);
    step(c, m, shm, k, b, NSEQS, 0, r, errs);
    return 2;
}

/* Decode steps: all sequences, every third step without seq 2, one aborted step. */
static int64_t decode(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, const e2e_case *k,
                      attnd_rng *r, attnd_e2e_errs *errs)
{
    attnd_step_seq all[NSEQS] = {{1, 1}, {2, 1}, {3, 1}};
    for (int32_t s = 0; s < k->decode_steps; s++) {
        int32_t n = s % 3 == 2 ? 2 : NSEQS;
        step(c, m, shm, k, all, n, s == k->decode_steps / 2, r, errs);
    }
    return k->decode_steps;
}

/* The daemon's and the mirror's token counts agree; then free everything. */
static void check_and_free(attnd_client *c, attnd_mirror *m)
{
    attnd_seq_info info, list[8];
    size_t n = 0;
    cr_assert_eq(attnd_client_seq_list(c, list, 8, &n), ATTND_ERR_OK);
    cr_assert_eq(n, NSEQS);
    for (uint64_t id = 1; id <= NSEQS; id++) {
        cr_assert_eq(attnd_client_seq_query(c, id, &info), ATTND_ERR_OK);
        cr_assert_eq((int32_t)info.num_tokens, attnd_mirror_len(m, id), "seq %llu: %u tokens",
                     (unsigned long long)id, info.num_tokens);
        cr_assert_eq(info.step, 0);
        cr_assert_eq(attnd_client_seq_free(c, id), ATTND_ERR_OK);
    }
    cr_assert_eq(attnd_client_seq_query(c, 1, &info), ATTND_ERR_NOT_FOUND);
}

static void run_case(const e2e_case *k)
{
    attnd_daemon_proc d;
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_status st;
    attnd_rng r;
    attnd_e2e_errs errs;
    const attnd_geometry *g;
    int64_t steps;
    attnd_test_daemon_start(&d, k->config);
    const char *url = k->url ? k->url : k->over_tcp ? d.tcp_url : d.url;
    cr_assert_not_null(c = attnd_daemon_connect_url(url, 20000, k->tls_ca));
    g = &attnd_client_server(c)->geometry;
    cr_assert_eq(attnd_mirror_init(&m, g, &k->mo, MAX_TOKENS), 0);
    cr_assert_eq(attnd_client_shm_create(c, attnd_e2e_io_bytes(g, k->dt, 256), &shm), ATTND_ERR_OK,
                 "%s", attnd_client_last_error(c));
    for (uint64_t id = 1; id <= NSEQS; id++) {
        cr_assert_eq(attnd_client_seq_create(c, id, NULL), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(c));
        cr_assert_eq(attnd_mirror_create(&m, id), 0);
    }
    attnd_rng_seed(&r, k->seed);
    memset(&errs, 0, sizeof errs);
    steps = prefill(c, &m, &shm, k, &r, &errs);
    steps += decode(c, &m, &shm, k, &r, &errs);
    check_errs(&errs, k->dt, steps * g->num_layers);
    check_and_free(c, &m);
    cr_assert_eq(attnd_client_shm_destroy(c, &shm), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, g->num_blocks, "blocks lost: %u free of %u", st.blocks_free,
                 g->num_blocks);
    attnd_client_free(c);
    attnd_mirror_fini(&m);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}

Test(e2e, gqa_f32_shm, .timeout = 120)
{
    e2e_case k = {.config = ATTND_TEST_CONFIG_SMALL,
                  .dt = ATTND_DTYPE_F32,
                  .prompt = {37, 5, 70},
                  .decode_steps = 24,
                  .seed = 11};
    run_case(&k);
}

Test(e2e, mqa_bf16_inline, .timeout = 120)
{
    e2e_case k = {.config =
                      "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"
                      " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 4, \"num_kv_heads\": 1,"
                      " \"head_size\": 128, \"block_size\": 32, \"cache_dtype\": \"f16\","
                      " \"num_blocks\": 64, \"max_blocks_per_seq\": 8},"
                      " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}",
                  .dt = ATTND_DTYPE_BF16,
                  .use_inline = 1,
                  .prompt = {64, 1, 33},
                  .decode_steps = 16,
                  .seed = 12};
    run_case(&k);
}

/* A remote worker: tcp://, every tensor INLINE (the shm region is only local scratch here). */
Test(e2e, tcp_inline, .timeout = 120)
{
    e2e_case k = {.config =
                      "{\"backend\": \"cpu\", \"threads\": 2,"
                      " \"server\": {\"listen\": \"@URL@\", \"listen_tcp\": \"@TCP@\"},"
                      " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"
                      " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\","
                      " \"num_blocks\": 256, \"max_blocks_per_seq\": 32},"
                      " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}",
                  .dt = ATTND_DTYPE_F32,
                  .use_inline = 1,
                  .over_tcp = 1,
                  .prompt = {20, 3, 41},
                  .decode_steps = 12,
                  .seed = 14};
    run_case(&k);
}

/* A self-signed certificate for "localhost" (valid 2000-2100) and its key: a test fixture only. */
#define TEST_CERT_KEY_PEM                                                                          \
    "-----BEGIN CERTIFICATE-----\n"                                                                \
    "MIIBYTCCAQegAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAlsb2NhbGhv\n"                           \
    "c3QwIBcNMDAwMTAxMDAwMDAwWhgPMjEwMDAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM\n"                           \
    "CWxvY2FsaG9zdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABGUnFBqURyWJ5gLV\n"                           \
    "ghr1DdBVT5IhwPAblENP03DX6XIrTmgTJjnfycbh1Se0xzbk09NP/9ldn9d2WzrK\n"                           \
    "yrUFix2jSDBGMA8GA1UdEwEB/wQFMAMBAf8wFAYDVR0RBA0wC4IJbG9jYWxob3N0\n"                           \
    "MB0GA1UdDgQWBBTosRnWgaR5KgXWTjQN3RnuliRsojAKBggqhkjOPQQDAgNIADBF\n"                           \
    "AiEAzgeceKdcqlFv/cz91Yd1j1nG4CzzZ/j8C/MTQfg6wlcCIDYthpdFUq7wVdzE\n"                           \
    "cNU4g2rKLisFBqz9VRXcsDSJaHnT\n"                                                               \
    "-----END CERTIFICATE-----\n"
#define TEST_KEY_PEM                                                                               \
    "-----BEGIN PRIVATE KEY-----\n"                                                                \
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg7YOkr5rIGxa0K/9L\n"                           \
    "qc0KvA92KAhH9qG28GB9eGdjsEmhRANCAARlJxQalEclieYC1YIa9Q3QVU+SIcDw\n"                           \
    "G5RDT9Nw1+lyK05oEyY538nG4dUntMc25NPTT//ZXZ/Xdls6ysq1BYsd\n"                                   \
    "-----END PRIVATE KEY-----\n"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fputs(text, f) >= 0, 1);
    cr_assert_eq(fclose(f), 0);
}

/* tls+tcp://: the daemon's certificate checked against the test CA, every tensor INLINE. */
Test(e2e, tls_inline, .timeout = 120)
{
    char cert[64], both[64], config[1024], url[64];
    int port = attnd_daemon_free_port();
    cr_assert_gt(port, 0);
    snprintf(cert, sizeof cert, "/tmp/attnd-t%ld-ca.pem", (long)getpid());
    snprintf(both, sizeof both, "/tmp/attnd-t%ld-certkey.pem", (long)getpid());
    write_file(cert, TEST_CERT_KEY_PEM);
    write_file(both, TEST_CERT_KEY_PEM TEST_KEY_PEM);
    snprintf(config, sizeof config,
             "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\","
             " \"listen_tcp\": \"tls+tcp://127.0.0.1:%d\", \"tls_cert_key_file\": \"%s\"},"
             " \"geometry\": {\"num_blocks\": 256, \"max_blocks_per_seq\": 32},"
             " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}",
             port, both);
    snprintf(url, sizeof url, "tls+tcp://localhost:%d", port);
    e2e_case k = {.config = config,
                  .dt = ATTND_DTYPE_F32,
                  .use_inline = 1,
                  .url = url,
                  .tls_ca = cert,
                  .prompt = {9, 30, 4},
                  .decode_steps = 8,
                  .seed = 15};
    run_case(&k);
    unlink(cert);
    unlink(both);
}

Test(e2e, mha_fp8_window_softcap, .timeout = 120)
{
    e2e_case k = {.config =
                      "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"
                      " \"geometry\": {\"num_layers\": 1, \"num_q_heads\": 6, \"num_kv_heads\": 6,"
                      " \"head_size\": 80, \"block_size\": 16, \"cache_dtype\": \"fp8_e4m3\","
                      " \"num_blocks\": 128, \"max_blocks_per_seq\": 16, \"sliding_window\": 24,"
                      " \"softcap\": 20, \"k_scale\": 0.5, \"v_scale\": 2},"
                      " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}",
                  .mo = {.sliding_window = 24, .softcap = 20.0f, .k_scale = 0.5f, .v_scale = 2.0f},
                  .dt = ATTND_DTYPE_F16,
                  .prompt = {50, 17, 90},
                  .decode_steps = 16,
                  .seed = 13};
    run_case(&k);
}
