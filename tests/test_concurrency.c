/* Several clients at once: threads, each with its own client and session (the same sequence ids
 * in every session), and threads sharing one client (one NNG context per call). Every output is
 * checked against the thread's own mirror and every step's layout against its own request, so
 * a reply delivered to the wrong caller, or one session's data in another's cache, fails. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

#define NTHREADS 4
#define STEPS 24

typedef struct worker {
    const attnd_daemon_proc *d;
    attnd_client *c; /* own, or shared */
    int own_client;
    int index;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    attnd_err failed;
    int steps;
    pthread_t thread;
} worker;

/* Sequence ids: the same in every session when clients are separate, disjoint on a shared one. */
static uint64_t seq_id(const worker *w, uint64_t k)
{
    return w->own_client ? k : (uint64_t)w->index * 100 + k;
}

static attnd_err work(worker *w)
{
    const attnd_geometry *g = &attnd_client_server(w->c)->geometry;
    attnd_err rv;
    /* different prompt lengths per worker; the io dtype alternates between f32 and bf16 */
    attnd_dtype dt = w->index % 2 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F32;
    uint32_t p0 = 5 + 7 * (uint32_t)w->index, p1 = 40 - 3 * (uint32_t)w->index;
    attnd_step_seq pre[2] = {{seq_id(w, 1), p0}, {seq_id(w, 2), p1}};
    attnd_step_seq dec[2] = {{seq_id(w, 1), 1}, {seq_id(w, 2), 1}};
    if (attnd_mirror_init(&w->m, g, NULL, 128) != 0) return ATTND_ERR_INTERNAL;
    if ((rv = attnd_client_shm_create(w->c, attnd_e2e_io_bytes(g, dt, 64), &w->shm)) !=
        ATTND_ERR_OK)
        return rv;
    for (int k = 0; k < 2; k++) {
        if ((rv = attnd_client_seq_create(w->c, pre[k].seq_id, NULL)) != ATTND_ERR_OK) return rv;
        if (attnd_mirror_create(&w->m, pre[k].seq_id) != 0) return ATTND_ERR_INTERNAL;
    }
    rv = attnd_e2e_step(w->c, &w->m, &w->shm, dt, w->index == 2, pre, 2, 0, &w->r, &w->errs);
    for (int s = 0; rv == ATTND_ERR_OK && s < STEPS; s++, w->steps++)
        rv = attnd_e2e_step(w->c, &w->m, &w->shm, dt, w->index == 2, dec, 2 - (s % 4 == 3), 0,
                            &w->r, &w->errs);
    for (int k = 0; rv == ATTND_ERR_OK && k < 2; k++)
        rv = attnd_client_seq_free(w->c, pre[k].seq_id);
    if (rv == ATTND_ERR_OK) rv = attnd_client_shm_destroy(w->c, &w->shm);
    return rv;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    if (w->own_client && (w->c = attnd_daemon_connect(w->d, 20000)) == NULL)
        w->failed = ATTND_ERR_UNAVAILABLE;
    else
        w->failed = work(w);
    return NULL;
}

static void check_worker(worker *w)
{
    attnd_dtype dt = w->index % 2 ? ATTND_DTYPE_BF16 : ATTND_DTYPE_F32;
    cr_assert_eq(w->failed, ATTND_ERR_OK, "worker %d: %s", w->index, attnd_err_name(w->failed));
    cr_assert_eq(w->steps, STEPS);
    char who[32];
    snprintf(who, sizeof who, "worker %d", w->index);
    attnd_test_expect_errs(&w->errs, dt, who);
    attnd_mirror_fini(&w->m);
}

static void run_workers(worker *ws, const attnd_daemon_proc *d, attnd_client *shared)
{
    for (int i = 0; i < NTHREADS; i++) {
        memset(&ws[i], 0, sizeof ws[i]);
        ws[i].d = d;
        ws[i].index = i;
        ws[i].own_client = shared == NULL;
        ws[i].c = shared;
        attnd_rng_seed(&ws[i].r, 51 + (uint64_t)i);
    }
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(ws[i].thread, NULL);
    for (int i = 0; i < NTHREADS; i++)
        check_worker(&ws[i]);
}

static void expect_all_free(const attnd_daemon_proc *d)
{
    attnd_client *c = attnd_daemon_connect(d, 20000);
    attnd_status st;
    cr_assert_not_null(c);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, st.geometry.num_blocks, "blocks lost: %u of %u free",
                 st.blocks_free, st.geometry.num_blocks);
    cr_assert_eq(st.num_sequences, 0);
    attnd_client_free(c);
}

Test(concurrency, clients_in_threads, .timeout = 120)
{
    attnd_daemon_proc d;
    worker ws[NTHREADS];
    attnd_test_daemon_start(&d, ATTND_TEST_CONFIG_SMALL);
    run_workers(ws, &d, NULL);
    for (int i = 0; i < NTHREADS; i++)
        attnd_client_free(ws[i].c);
    expect_all_free(&d);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}

Test(concurrency, threads_share_one_client, .timeout = 120)
{
    attnd_daemon_proc d;
    worker ws[NTHREADS];
    attnd_client *c;
    attnd_test_daemon_start(&d, ATTND_TEST_CONFIG_SMALL);
    c = attnd_test_connect(&d);
    run_workers(ws, &d, c);
    attnd_client_free(c);
    expect_all_free(&d);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}
