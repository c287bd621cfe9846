/* Fork and copy-on-write over a real socket: forked sequences share their parent's blocks, copy
 * a shared partial last block only when they write into it, and then diverge without touching
 * each other's cache. Every output is checked against the mirror (which copies the parent's rows
 * at fork time, so any write that leaks into a shared block shows up as a wrong output on the
 * other sequence), and the daemon's free-block count is checked at each point. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

typedef struct fixture {
    attnd_daemon_proc d;
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    const attnd_geometry *g;
    int64_t attends;
} fixture;

static void setup(fixture *f, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    attnd_test_daemon_start(&f->d, ATTND_TEST_CONFIG_SMALL);
    attnd_test_mirror_client(&f->d, NULL, 256, ATTND_DTYPE_F32, 128, &f->c, &f->m, &f->shm);
    f->g = &attnd_client_server(f->c)->geometry;
    attnd_rng_seed(&f->r, seed);
}

static void teardown(fixture *f)
{
    attnd_status st;
    cr_assert_eq(attnd_client_status(f->c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, f->g->num_blocks, "blocks lost: %u free of %u", st.blocks_free,
                 f->g->num_blocks);
    attnd_test_expect_errs(&f->errs, ATTND_DTYPE_F32, "fork_cow");
    cr_assert_eq(f->errs.attends, f->attends);
    cr_assert_eq(attnd_client_shm_destroy(f->c, &f->shm), ATTND_ERR_OK);
    attnd_client_free(f->c);
    attnd_mirror_fini(&f->m);
    cr_assert_eq(attnd_daemon_stop(&f->d), 0, "daemon exit status");
}

static void run(fixture *f, const attnd_step_seq *seqs, int32_t n)
{
    attnd_err rv =
        attnd_e2e_step(f->c, &f->m, &f->shm, ATTND_DTYPE_F32, 0, seqs, n, 0, &f->r, &f->errs);
    cr_assert_eq(rv, ATTND_ERR_OK, "step: %s", attnd_err_name(rv));
    f->attends += f->g->num_layers;
}

static uint32_t blocks_free(fixture *f)
{
    attnd_status st;
    cr_assert_eq(attnd_client_status(f->c, &st), ATTND_ERR_OK);
    return st.blocks_free;
}

static void create(fixture *f, uint64_t id, uint32_t prompt)
{
    attnd_step_seq s = {id, prompt};
    cr_assert_eq(attnd_client_seq_create(f->c, id, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&f->m, id), 0);
    run(f, &s, 1);
}

static void fork_seq(fixture *f, uint64_t parent, uint64_t child)
{
    attnd_seq_info info;
    cr_assert_eq(attnd_client_seq_fork(f->c, parent, child, &info), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(f->c));
    cr_assert_eq(attnd_mirror_fork(&f->m, parent, child), 0);
    cr_assert_eq((int32_t)info.num_tokens, attnd_mirror_len(&f->m, parent));
}

static void free_seq(fixture *f, uint64_t id)
{
    cr_assert_eq(attnd_client_seq_free(f->c, id), ATTND_ERR_OK);
    attnd_mirror_free(&f->m, id);
}

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

Test(fork_cow, partial_block_copied_on_write_and_diverges, .timeout = 120)
{
    fixture f;
    setup(&f, 21);
    uint32_t bs = f.g->block_size, prompt = 2 * bs + 5; /* a shared partial last block */
    uint32_t before = blocks_free(&f);
    create(&f, 1, prompt);
    cr_assert_eq(blocks_free(&f), before - cdiv(prompt, bs));
    uint32_t after_prefill = blocks_free(&f);
    fork_seq(&f, 1, 2);
    fork_seq(&f, 1, 3);
    cr_assert_eq(blocks_free(&f), after_prefill, "fork must share blocks, not copy them");

    /* the child writes first: it copies the partial block, the parent keeps its own */
    attnd_step_seq c2 = {2, 1}, p1 = {1, 1}, both[2] = {{3, 1}, {1, 1}};
    run(&f, &c2, 1);
    cr_assert_eq(blocks_free(&f), after_prefill - 1, "one copy for child 2's write");
    /* the parent still shares that block with child 3: it copies too */
    run(&f, &p1, 1);
    cr_assert_eq(blocks_free(&f), after_prefill - 2, "one copy for the parent's write");
    /* child 3 now holds the original block alone: no copy */
    run(&f, both, 2);
    cr_assert_eq(blocks_free(&f), after_prefill - 2, "no copy for a block held alone");
    /* diverge for a while, past the next block boundary, in mixed batches */
    attnd_step_seq all[3] = {{1, 1}, {2, 1}, {3, 2}};
    for (int i = 0; i < 14; i++)
        run(&f, all, 3);
    attnd_step_seq longer = {2, 9};
    run(&f, &longer, 1);
    for (int i = 0; i < 4; i++)
        run(&f, all, 3);
    free_seq(&f, 1);
    free_seq(&f, 2);
    free_seq(&f, 3);
    teardown(&f);
}

Test(fork_cow, fork_at_block_boundary_then_free_parent, .timeout = 120)
{
    fixture f;
    setup(&f, 22);
    uint32_t bs = f.g->block_size;
    create(&f, 10, 2 * bs); /* full blocks only: nothing to copy */
    uint32_t base = blocks_free(&f);
    fork_seq(&f, 10, 11);
    attnd_step_seq child = {11, 1};
    run(&f, &child, 1);
    cr_assert_eq(blocks_free(&f), base - 1, "a fresh block for the child, no copy");
    /* the parent goes away; the child's shared blocks must stay */
    free_seq(&f, 10);
    cr_assert_eq(blocks_free(&f), base - 1, "shared blocks freed while the child holds them");
    for (int i = 0; i < 8; i++)
        run(&f, &child, 1);
    /* fork of a fork, then both decode */
    fork_seq(&f, 11, 12);
    attnd_step_seq two[2] = {{12, 3}, {11, 1}};
    for (int i = 0; i < 6; i++)
        run(&f, two, 2);
    free_seq(&f, 11);
    free_seq(&f, 12);
    teardown(&f);
}

Test(fork_cow, fork_errors, .timeout = 60)
{
    fixture f;
    attnd_seq_info info;
    setup(&f, 23);
    create(&f, 1, 7);
    cr_assert_eq(attnd_client_seq_fork(f.c, 99, 2, &info), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_client_seq_fork(f.c, 1, 1, &info), ATTND_ERR_ALREADY_EXISTS);
    cr_assert_eq(attnd_client_seq_fork(f.c, 1, 0, &info), ATTND_ERR_INVALID_ARGUMENT);
    fork_seq(&f, 1, 2);
    cr_assert_eq(attnd_client_seq_fork(f.c, 1, 2, &info), ATTND_ERR_ALREADY_EXISTS);
    attnd_step_seq both[2] = {{1, 1}, {2, 1}};
    run(&f, both, 2);
    free_seq(&f, 1);
    free_seq(&f, 2);
    teardown(&f);
}
