/* SIGTERM during load: several clients keep the daemon busy with prefill chunks (every output
 * checked against the CPU op on the mirror's cache) when SIGTERM arrives. Every request the
 * daemon had accepted must get its reply, a correct one, before the daemon exits with status
 * 0; requests sent after the signal may be refused (an error reply, or the connection gone),
 * but nothing hangs and nothing comes back wrong. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

#define CONFIG                                                                                     \
    "{\"backend\": \"cpu\", \"threads\": 2,"                                                       \
    " \"server\": {\"listen\": \"@URL@\", \"drain_timeout_ms\": 60000},"                           \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 1024,"     \
    " \"max_blocks_per_seq\": 256},"                                                               \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

#define NCLIENTS 4      /* background load; client 0 also sends the long request */
#define CHUNK 64        /* new tokens per step: a few ms of attention each */
#define LONG_MIN 1024   /* client 0's first step: a long prefill, in flight at the signal, */
#define LONG_MAX 4096   /* sized from the daemon's speed (see long_chunk) */
#define LONG_TARGET 0.3 /* seconds the long request should take, at least */
#define MAX_LEN 1024    /* then a sequence is replaced by a fresh one */
#define MAX_REQS 4096
#define ACCEPT_MARGIN 0.02 /* a request sent this long before the signal surely arrived */

typedef struct req_rec {
    double t0, t1;
    attnd_err rv;
    int remote; /* the error came from the daemon */
    int attend; /* an Attend of a CHUNK step */
} req_rec;

typedef struct loader {
    const attnd_daemon_proc *d;
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    req_rec recs[MAX_REQS];
    atomic_int nrecs;
    double worst;         /* out vs the CPU op, over every OK Attend */
    int wrong_layout;     /* the daemon's step did not match the mirror's */
    int local_failed;     /* the mirror or the CPU op failed (never asserted off the main thread) */
    uint32_t first_chunk; /* tokens of the first step (then CHUNK) */
    int32_t max_len;      /* tokens of a sequence before it is replaced */
    atomic_int long_sent; /* the first Attend of the first step was sent */
    pthread_t thread;
} loader;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Record one request's outcome; returns rv. */
static attnd_err rec(loader *l, double t0, attnd_err rv)
{
    int i = atomic_load(&l->nrecs);
    if (i < MAX_REQS) {
        l->recs[i] = (req_rec){t0, now_s(), rv,
                               rv != ATTND_ERR_OK && attnd_client_last_error_remote(l->c), 0};
        atomic_store(&l->nrecs, i + 1);
    }
    return rv;
}

/* Out of the daemon against the CPU op's on the mirror, for one layer. */
static void check_layer(loader *l, attnd_e2e_io *io, uint32_t layer, float *dout, float *dlse)
{
    attnd_tensor direct;
    attnd_tensor_init(&direct, dout, ATTND_DTYPE_F32, 3, io->out.shape);
    if (attnd_mirror_attend(&l->m, layer, &io->q, &io->k, &io->v, &direct, dlse, NULL, NULL) !=
        ATTND_ERR_OK)
        l->local_failed = 1;
    double e = attnd_e2e_rel_l2_t(&io->out, &direct);
    if (!(e <= l->worst)) l->worst = e; /* NaN sticks */
}

/* One step of `chunk` tokens on seq; returns the first failure. */
static attnd_err one_step(loader *l, uint64_t seq, uint32_t chunk, float *dout, float *dlse)
{
    attnd_step_seq s = {seq, chunk};
    attnd_step st;
    attnd_e2e_io io;
    attnd_err rv;
    double t0 = now_s();
    if ((rv = rec(l, t0, attnd_client_step_begin(l->c, &s, 1, &st, NULL))) != ATTND_ERR_OK)
        return rv;
    if (attnd_mirror_begin(&l->m, &s, 1) != 0) l->local_failed = 1;
    if (st.num_tokens != chunk) l->wrong_layout = 1;
    attnd_e2e_io_layout(&io, &l->m.g, &l->shm, ATTND_DTYPE_F32, chunk);
    for (uint32_t layer = 0; layer < l->m.g.num_layers; layer++) {
        attnd_e2e_io_fill(&io, &l->r, 1.0);
        t0 = now_s();
        if (chunk > CHUNK && layer == 0) atomic_store(&l->long_sent, 1);
        rv = attnd_client_attend(l->c, st.id, layer, &io.rq, &io.rk, &io.rv, &io.rout, &io.rlse);
        if (rec(l, t0, rv) != ATTND_ERR_OK) return rv;
        if (chunk == CHUNK) l->recs[atomic_load(&l->nrecs) - 1].attend = 1;
        check_layer(l, &io, layer, dout, dlse);
    }
    t0 = now_s();
    if ((rv = rec(l, t0, attnd_client_step_end(l->c, st.id, 0))) != ATTND_ERR_OK) return rv;
    attnd_mirror_end(&l->m, 1);
    return ATTND_ERR_OK;
}

static void *load_loop(void *arg)
{
    loader *l = arg;
    uint64_t seq = 1;
    uint32_t chunk = l->first_chunk;
    float *dout = malloc(sizeof(float) * chunk * l->m.g.num_q_heads * l->m.g.head_size);
    float *dlse = malloc(sizeof(float) * chunk * l->m.g.num_q_heads);
    attnd_err rv = ATTND_ERR_OK;
    while (rv == ATTND_ERR_OK && atomic_load(&l->nrecs) < MAX_REQS - 8) {
        if (attnd_mirror_len(&l->m, seq) + (int32_t)chunk > l->max_len) {
            double t0 = now_s();
            if ((rv = rec(l, t0, attnd_client_seq_free(l->c, seq))) != ATTND_ERR_OK) break;
            attnd_mirror_free(&l->m, seq);
            seq++;
            t0 = now_s();
            if ((rv = rec(l, t0, attnd_client_seq_create(l->c, seq, NULL))) != ATTND_ERR_OK) break;
            if (attnd_mirror_create(&l->m, seq) != 0) l->local_failed = 1;
        }
        rv = one_step(l, seq, chunk, dout, dlse);
        chunk = CHUNK;
    }
    free(dout);
    free(dlse);
    return NULL;
}

static void loader_start(loader *l, const attnd_daemon_proc *d, uint64_t seed, uint32_t first)
{
    memset(l, 0, sizeof *l);
    l->d = d;
    l->first_chunk = first;
    l->max_len = first > MAX_LEN ? LONG_MAX : MAX_LEN;
    l->c = attnd_test_connect(d);
    const attnd_geometry *g = &attnd_client_server(l->c)->geometry;
    cr_assert_eq(attnd_mirror_init(&l->m, g, NULL, l->max_len), 0);
    cr_assert_eq(
        attnd_client_shm_create(l->c, attnd_e2e_io_bytes(g, ATTND_DTYPE_F32, first), &l->shm),
        ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_create(l->c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&l->m, 1), 0);
    attnd_rng_seed(&l->r, seed);
    cr_assert_eq(pthread_create(&l->thread, NULL, load_loop, l), 0);
}

/* Tokens of the long prefill: at least LONG_TARGET seconds of daemon work. The fastest CHUNK
 * Attend the loaders saw (CHUNK rows over a context of about MAX_LEN / 2: the least queueing)
 * measures the daemon; causal attention of n rows costs n^2 / 2 row-keys against its
 * CHUNK * MAX_LEN / 2. Slow builds (sanitizers) get short requests, fast machines long ones. */
static uint32_t long_chunk(const loader *ls)
{
    double fastest = 1e9, n;
    for (int i = 1; i < NCLIENTS; i++)
        for (int k = 0; k < atomic_load(&ls[i].nrecs); k++)
            if (ls[i].recs[k].attend && ls[i].recs[k].t1 - ls[i].recs[k].t0 < fastest)
                fastest = ls[i].recs[k].t1 - ls[i].recs[k].t0;
    n = sqrt(LONG_TARGET / fastest * CHUNK * MAX_LEN);
    n = n < LONG_MIN ? LONG_MIN : n > LONG_MAX ? LONG_MAX : n;
    fprintf(stderr, "sigterm: fastest Attend %.2f ms, long prefill of %d tokens\n", fastest * 1e3,
            (int)n / 256 * 256);
    return (uint32_t)n / 256 * 256;
}

/* After the signal at t_sig: the loader's requests against the rules. Returns how many were in
 * flight at the signal and answered. */
static int check_loader(const loader *l, int idx, double t_sig)
{
    int n = atomic_load(&l->nrecs), answered_in_flight = 0;
    for (int i = n > 6 ? n - 6 : 0; getenv("ATTND_TEST_VERBOSE") && i < n; i++)
        fprintf(stderr, "client %d req %d: %+.2f .. %+.2f ms: %s%s\n", idx, i,
                (l->recs[i].t0 - t_sig) * 1e3, (l->recs[i].t1 - t_sig) * 1e3,
                attnd_err_name(l->recs[i].rv), l->recs[i].remote ? " (reply)" : "");
    cr_assert_eq(l->wrong_layout, 0);
    cr_assert_eq(l->local_failed, 0);
    cr_assert_leq(l->worst, attnd_e2e_direct_tol(ATTND_DTYPE_F32), "client %d: out vs CPU op %.3g",
                  idx, l->worst);
    for (int i = 0; i < n; i++) {
        const req_rec *r = &l->recs[i];
        int accepted = r->t0 < t_sig - ACCEPT_MARGIN;
        if (r->rv == ATTND_ERR_OK) {
            answered_in_flight += r->t0 < t_sig && r->t1 > t_sig;
            continue;
        }
        cr_assert_eq(i, n - 1, "client %d: request %d failed (%s) and the loader went on", idx, i,
                     attnd_err_name(r->rv));
        cr_assert(!accepted, "client %d: request %d, sent %.1f ms before SIGTERM, got %s (%s)", idx,
                  i, (t_sig - r->t0) * 1e3, attnd_err_name(r->rv),
                  r->remote ? "the daemon's reply" : "no reply");
        cr_assert(r->rv == ATTND_ERR_UNAVAILABLE, "client %d: refused with %s", idx,
                  attnd_err_name(r->rv));
        cr_assert_lt(r->t1 - t_sig, 25.0, "client %d: waited %.1f s", idx, r->t1 - t_sig);
    }
    cr_assert_gt(n, 0);
    cr_assert_neq(l->recs[n - 1].rv, ATTND_ERR_OK, "client %d never saw the daemon go", idx);
    return answered_in_flight;
}

Test(sigterm, accepted_requests_are_answered_before_exit, .timeout = 120)
{
    attnd_daemon_proc d;
    loader *ls = calloc(NCLIENTS, sizeof *ls);
    struct timespec nap = {0, 5000000};
    double t_sig;
    int in_flight = 0, rc;
    attnd_test_daemon_start(&d, CONFIG);
    /* clients 1.. load the daemon with small steps; once they run, client 0 sends a long
     * prefill and the signal comes while the daemon works on it */
    for (int i = 1; i < NCLIENTS; i++)
        loader_start(&ls[i], &d, 41 + (uint64_t)i, CHUNK);
    for (int i = 1; i < NCLIENTS; i++)
        for (int k = 0; k < 4000 && atomic_load(&ls[i].nrecs) < 8; k++)
            nanosleep(&nap, NULL);
    for (int i = 1; i < NCLIENTS; i++)
        cr_assert_geq(atomic_load(&ls[i].nrecs), 8);
    loader_start(&ls[0], &d, 41, long_chunk(ls));
    for (int k = 0; k < 4000 && !atomic_load(&ls[0].long_sent); k++)
        nanosleep(&nap, NULL);
    cr_assert(atomic_load(&ls[0].long_sent));
    nap.tv_nsec = (long)(ACCEPT_MARGIN * 3e9); /* surely received by now, far from done */
    nanosleep(&nap, NULL);
    t_sig = now_s();
    cr_assert_eq(attnd_daemon_signal(&d, SIGTERM), 0);
    rc = attnd_daemon_wait(&d, 90000);
    double drain = now_s() - t_sig;
    if (rc != 0) attnd_daemon_dump_log(&d);
    cr_assert_eq(rc, 0, "daemon exit status %d after SIGTERM", rc);
    cr_assert_lt(drain, 50.0, "the drain took %.1f s: it timed out (60 s) instead of finishing",
                 drain);
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(ls[i].thread, NULL);
    for (int i = 0; i < NCLIENTS; i++)
        in_flight += check_loader(&ls[i], i, t_sig);
    fprintf(stderr, "sigterm: %d requests in flight at the signal were answered\n", in_flight);
    /* client 0's long Attend (record 1, after its BeginStep) was accepted long before the
     * signal and finished after it: it must have been answered, correctly (checked above) */
    cr_assert_geq(atomic_load(&ls[0].nrecs), 2);
    cr_assert_eq(ls[0].recs[1].rv, ATTND_ERR_OK, "the long request got %s",
                 attnd_err_name(ls[0].recs[1].rv));
    cr_assert_gt(ls[0].recs[1].t1, t_sig, "the long request finished %.1f ms before the signal",
                 (t_sig - ls[0].recs[1].t1) * 1e3);
    for (int i = 0; i < NCLIENTS; i++) {
        attnd_client_shm_destroy(NULL, &ls[i].shm); /* the daemon is gone: local cleanup only */
        attnd_client_free(ls[i].c);
        attnd_mirror_fini(&ls[i].m);
    }
    free(ls);
    attnd_daemon_stop(&d); /* removes the files; already reaped */
}
