/* Cache manager: the block allocator never hands a block out twice, reference counts follow
 * sharing, fork shares and copy-on-write copies a shared partial last block, running out is an
 * error that changes nothing, abort restores, freeing and reclaiming return every block. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "state/cache.h"
#include "testutil.h"

#define NB 32
#define BS 16
#define MBPS 8

static attnd_cache *make(uint32_t nb, uint32_t linear)
{
    attnd_cache *c;
    cr_assert_eq(attnd_cache_alloc(&c, nb, BS, MBPS, linear), ATTND_ERR_OK);
    return c;
}

/* Grow s by n tokens and commit; asserts success. */
static void grow(attnd_cache *c, attnd_seq *s, uint32_t n, attnd_cache_copy *cow)
{
    attnd_cache_copy tmp;
    cr_assert_eq(attnd_cache_reserve(c, s, n, cow ? cow : &tmp), ATTND_ERR_OK);
    attnd_cache_commit(c, s);
}

typedef struct census {
    uint32_t refs[NB * 4];
    uint32_t nseqs;
} census;

static void count_seq(attnd_seq *s, void *arg)
{
    census *cn = arg;
    cn->nseqs++;
    for (uint32_t i = 0; i < s->nblocks; i++)
        cn->refs[s->blocks[i]]++;
    if (s->pend_cow_old >= 0) cn->refs[s->pend_cow_old]++;
}

/* Every block's count equals the references the sequences hold; free = blocks with count 0. */
static void check_invariants(attnd_cache *c, const uint64_t *owners, int nowners)
{
    census cn;
    memset(&cn, 0, sizeof cn);
    for (int o = 0; o < nowners; o++)
        attnd_cache_foreach(c, owners[o], count_seq, &cn);
    uint32_t zero = 0, nb = attnd_cache_num_blocks(c);
    for (uint32_t b = 0; b < nb; b++) {
        cr_assert_eq(attnd_cache_block_refs(c, (int32_t)b), cn.refs[b],
                     "block %u: refs %u, held %u", b, attnd_cache_block_refs(c, (int32_t)b),
                     cn.refs[b]);
        zero += cn.refs[b] == 0;
    }
    cr_assert_eq(attnd_cache_blocks_free(c), zero);
    cr_assert_eq(attnd_cache_num_seqs(c), cn.nseqs);
}

Test(cache, create_find_and_errors, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *s, *t;
    cr_assert_eq(attnd_cache_create(c, 1, 0, &s), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_create(c, 1, 5, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 1, 5, &t), ATTND_ERR_ALREADY_EXISTS);
    /* the same id in another session is another sequence */
    cr_assert_eq(attnd_cache_create(c, 2, 5, &t), ATTND_ERR_OK);
    cr_assert_neq(s, t);
    cr_assert_eq(attnd_cache_find(c, 1, 5), s);
    cr_assert_eq(attnd_cache_find(c, 2, 5), t);
    cr_assert_null(attnd_cache_find(c, 3, 5));
    cr_assert_eq(s->num_tokens, 0);
    cr_assert_eq(s->nblocks, 0);
    cr_assert_eq(attnd_cache_num_seqs(c), 2);
    attnd_cache_free(c);
}

Test(cache, reserve_commit_and_slots, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *s;
    attnd_cache_copy cow;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_reserve(c, s, 0, &cow), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_reserve(c, s, 20, &cow), ATTND_ERR_OK);
    cr_assert_eq(cow.src, -1);
    cr_assert_eq(s->nblocks, 2);
    cr_assert_eq(s->num_tokens, 0, "tokens count only once committed");
    cr_assert_eq(attnd_cache_reserve(c, s, 1, &cow), ATTND_ERR_INVALID_ARGUMENT, "reserved twice");
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2);
    for (uint32_t p = 0; p < 20; p++)
        cr_assert_eq(attnd_cache_slot(c, s, p), (int64_t)s->blocks[p / BS] * BS + p % BS);
    attnd_cache_commit(c, s);
    cr_assert_eq(s->num_tokens, 20);
    grow(c, s, 12, NULL); /* fills the second block exactly */
    cr_assert_eq(s->nblocks, 2);
    grow(c, s, 1, NULL);
    cr_assert_eq(s->nblocks, 3);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 3);
    attnd_cache_free(c);
}

Test(cache, max_blocks_per_seq_is_invalid_argument, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *s;
    attnd_cache_copy cow;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_reserve(c, s, MBPS * BS + 1, &cow), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_reserve(c, s, MBPS * BS, &cow), ATTND_ERR_OK);
    attnd_cache_commit(c, s);
    cr_assert_eq(attnd_cache_reserve(c, s, 1, &cow), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - MBPS);
    attnd_cache_free(c);
}

Test(cache, out_of_blocks_changes_nothing, .timeout = 60)
{
    attnd_cache *c = make(4, 0);
    attnd_seq *a, *b;
    attnd_cache_copy cow;
    uint64_t owners[] = {1};
    cr_assert_eq(attnd_cache_create(c, 1, 1, &a), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 1, 2, &b), ATTND_ERR_OK);
    grow(c, a, 3 * BS, NULL);
    cr_assert_eq(attnd_cache_reserve(c, b, BS + 1, &cow), ATTND_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(b->nblocks, 0);
    cr_assert_eq(b->pend_tokens, 0);
    cr_assert_eq(attnd_cache_blocks_free(c), 1);
    check_invariants(c, owners, 1);
    /* exactly what is left still works */
    grow(c, b, BS, NULL);
    cr_assert_eq(attnd_cache_blocks_free(c), 0);
    cr_assert_eq(attnd_cache_reserve(c, a, 1, &cow), ATTND_ERR_OUT_OF_BLOCKS);
    check_invariants(c, owners, 1);
    attnd_cache_free(c);
}

Test(cache, abort_releases_everything_it_took, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *s;
    attnd_cache_copy cow;
    uint64_t owners[] = {1};
    cr_assert_eq(attnd_cache_create(c, 1, 1, &s), ATTND_ERR_OK);
    grow(c, s, 20, NULL);
    int32_t b0 = s->blocks[0], b1 = s->blocks[1];
    cr_assert_eq(attnd_cache_reserve(c, s, 40, &cow), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 4);
    attnd_cache_abort(c, s);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2);
    cr_assert_eq(s->num_tokens, 20);
    cr_assert_eq(s->nblocks, 2);
    cr_assert_eq(s->blocks[0], b0);
    cr_assert_eq(s->blocks[1], b1);
    attnd_cache_abort(c, s); /* idempotent */
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2);
    check_invariants(c, owners, 1);
    attnd_cache_free(c);
}

Test(cache, fork_shares_and_cow_copies_the_partial_block, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *p, *ch;
    attnd_cache_copy cow, lc;
    uint64_t owners[] = {1};
    cr_assert_eq(attnd_cache_create(c, 1, 1, &p), ATTND_ERR_OK);
    grow(c, p, 20, NULL); /* block 0 full, block 1 holds 4 tokens */
    cr_assert_eq(attnd_cache_fork(c, p, 1, &ch, &lc), ATTND_ERR_ALREADY_EXISTS);
    cr_assert_eq(attnd_cache_fork(c, p, 2, &ch, &lc), ATTND_ERR_OK);
    cr_assert_eq(lc.src, -1);
    cr_assert_eq(ch->num_tokens, 20);
    cr_assert_eq(ch->nblocks, 2);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2, "a fork takes no block");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ch->blocks[i], p->blocks[i]);
        cr_assert_eq(attnd_cache_block_refs(c, p->blocks[i]), 2);
    }
    int32_t shared_full = p->blocks[0], shared_partial = p->blocks[1];
    /* the child writes into the shared partial block: it gets its own copy */
    grow(c, ch, 1, &cow);
    cr_assert_eq(cow.src, shared_partial);
    cr_assert_neq(cow.dst, shared_partial);
    cr_assert_eq(ch->blocks[1], cow.dst);
    cr_assert_eq(ch->blocks[0], shared_full, "full blocks stay shared");
    cr_assert_eq(attnd_cache_block_refs(c, shared_partial), 1);
    cr_assert_eq(attnd_cache_block_refs(c, shared_full), 2);
    /* the parent is now the only owner of its partial block: no copy */
    grow(c, p, 1, &cow);
    cr_assert_eq(cow.src, -1);
    cr_assert_eq(p->blocks[1], shared_partial);
    check_invariants(c, owners, 1);
    attnd_cache_free(c);
}

Test(cache, fork_at_a_block_boundary_needs_no_copy, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *p, *ch;
    attnd_cache_copy cow, lc;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &p), ATTND_ERR_OK);
    grow(c, p, 2 * BS, NULL);
    cr_assert_eq(attnd_cache_fork(c, p, 2, &ch, &lc), ATTND_ERR_OK);
    grow(c, ch, 1, &cow);
    cr_assert_eq(cow.src, -1);
    cr_assert_eq(ch->nblocks, 3);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 3);
    attnd_cache_free(c);
}

Test(cache, cow_abort_puts_the_shared_block_back, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *p, *ch;
    attnd_cache_copy cow, lc;
    uint64_t owners[] = {1};
    cr_assert_eq(attnd_cache_create(c, 1, 1, &p), ATTND_ERR_OK);
    grow(c, p, 20, NULL);
    cr_assert_eq(attnd_cache_fork(c, p, 2, &ch, &lc), ATTND_ERR_OK);
    int32_t shared = p->blocks[1];
    cr_assert_eq(attnd_cache_reserve(c, ch, 30, &cow), ATTND_ERR_OK);
    cr_assert_eq(cow.src, shared);
    /* while the step is open the old block is still held for the abort */
    cr_assert_eq(attnd_cache_block_refs(c, shared), 2);
    check_invariants(c, owners, 1);
    /* the parent is freed meanwhile: the block must survive for the child's abort */
    attnd_cache_release(c, p);
    cr_assert_eq(attnd_cache_block_refs(c, shared), 1);
    attnd_cache_abort(c, ch);
    cr_assert_eq(ch->blocks[1], shared);
    cr_assert_eq(ch->nblocks, 2);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2);
    check_invariants(c, owners, 1);
    attnd_cache_free(c);
}

Test(cache, out_of_blocks_for_the_cow_copy, .timeout = 60)
{
    attnd_cache *c = make(2, 0);
    attnd_seq *p, *ch;
    attnd_cache_copy cow, lc;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &p), ATTND_ERR_OK);
    grow(c, p, 20, NULL); /* both blocks used, the second partial */
    cr_assert_eq(attnd_cache_fork(c, p, 2, &ch, &lc), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_reserve(c, ch, 1, &cow), ATTND_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(ch->blocks[1], p->blocks[1]);
    cr_assert_eq(attnd_cache_block_refs(c, p->blocks[1]), 2);
    attnd_cache_free(c);
}

Test(cache, free_returns_blocks_and_reclaim_takes_only_the_owner, .timeout = 60)
{
    attnd_cache *c = make(NB, 4);
    attnd_seq *a, *b, *x, *f;
    attnd_cache_copy lc;
    int32_t slot;
    int fresh;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &a), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 1, 2, &b), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 2, 1, &x), ATTND_ERR_OK);
    grow(c, a, 40, NULL);
    grow(c, b, 17, NULL);
    grow(c, x, 5, NULL);
    cr_assert_eq(attnd_cache_linear_slot(c, a, &slot, &fresh), ATTND_ERR_OK);
    cr_assert_eq(fresh, 1);
    cr_assert_eq(attnd_cache_fork(c, a, 3, &f, &lc), ATTND_ERR_OK);
    cr_assert_eq(lc.src, slot);
    cr_assert_neq(lc.dst, slot);
    cr_assert_eq(attnd_cache_linear_free(c), 2);
    cr_assert_eq(attnd_cache_reserve(c, b, 16, &lc), ATTND_ERR_OK); /* pending, then reclaimed */
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 3 - 2 - 1 - 1);
    attnd_cache_release(c, a);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 3 - 2 - 1 - 1, "the fork still holds a's blocks");
    cr_assert_eq(attnd_cache_release_owner(c, 1), 2);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 1);
    cr_assert_eq(attnd_cache_linear_free(c), 4);
    cr_assert_eq(attnd_cache_num_seqs(c), 1);
    cr_assert_eq(attnd_cache_find(c, 2, 1), x);
    cr_assert_eq(attnd_cache_release_owner(c, 2), 1);
    cr_assert_eq(attnd_cache_blocks_free(c), NB);
    attnd_cache_free(c);
}

/* s's blocks are one run of consecutive ascending ids. */
static void assert_run(const attnd_seq *s)
{
    for (uint32_t i = 1; i < s->nblocks; i++)
        cr_assert_eq(s->blocks[i], s->blocks[0] + (int32_t)i, "block %u: %d after %d", i,
                     s->blocks[i], s->blocks[i - 1]);
}

Test(cache, freed_blocks_come_back_as_runs, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *a, *b, *d;
    char err[128];
    cr_assert_eq(attnd_cache_create(c, 1, 1, &a), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 1, 2, &b), ATTND_ERR_OK);
    grow(c, a, 5 * BS, NULL);
    grow(c, b, 2 * BS, NULL);
    assert_run(a);
    assert_run(b);
    attnd_cache_release(c, a); /* its five blocks, then a prompt of four takes four of them */
    cr_assert_eq(attnd_cache_create(c, 1, 3, &d), ATTND_ERR_OK);
    grow(c, d, 4 * BS, NULL);
    assert_run(d);
    cr_assert_eq(attnd_cache_truncate(c, d, 3 * BS, "tokens", err, sizeof err), ATTND_ERR_OK, "%s",
                 err);
    grow(c, d, 3 * BS, NULL); /* rolled back and grown again: the same run */
    assert_run(d);
    attnd_cache_free(c);
}

Test(cache, linear_slots_run_out, .timeout = 60)
{
    attnd_cache *c = make(NB, 1), *none = make(NB, 0);
    attnd_seq *a, *b, *f, *n;
    attnd_cache_copy lc;
    int32_t slot;
    int fresh;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &a), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_create(c, 1, 2, &b), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_linear_slot(c, a, &slot, &fresh), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_linear_slot(c, a, &slot, &fresh), ATTND_ERR_OK);
    cr_assert_eq(fresh, 0, "the second call finds the same slot");
    cr_assert_eq(attnd_cache_linear_slot(c, b, &slot, &fresh), ATTND_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(attnd_cache_fork(c, a, 3, &f, &lc), ATTND_ERR_OUT_OF_BLOCKS);
    cr_assert_null(attnd_cache_find(c, 1, 3), "a failed fork leaves no sequence");
    cr_assert_eq(attnd_cache_create(none, 1, 1, &n), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_linear_slot(none, n, &slot, &fresh), ATTND_ERR_UNSUPPORTED);
    attnd_cache_free(c);
    attnd_cache_free(none);
}

/* Random creates, forks, reserves, commits, aborts, truncates and frees across owners, with and
 * without a window, checking after every operation that no block is handed out twice and every
 * count matches. */
static void random_operations(uint32_t window, uint64_t seed)
{
    enum { NSEQ = 24 };
    attnd_cache *c;
    attnd_rng r;
    attnd_seq *seqs[NSEQ] = {0};
    uint64_t owners[] = {1, 2, 3};
    attnd_cache_copy cow, lc;
    char err[256];
    cr_assert_eq(attnd_cache_alloc(&c, NB * 4, BS, MBPS, 8), ATTND_ERR_OK);
    attnd_cache_set_window(c, window);
    attnd_rng_seed(&r, seed);
    for (int it = 0; it < 20000; it++) {
        int i = (int)attnd_rng_int(&r, 0, NSEQ - 1), op = (int)attnd_rng_int(&r, 0, 7);
        attnd_seq *s = seqs[i];
        if (s == NULL) {
            cr_assert_eq(attnd_cache_create(c, owners[i % 3], (uint64_t)i + 1, &seqs[i]),
                         ATTND_ERR_OK);
        } else if (op == 0 && s->pend_tokens == 0) {
            int j = (int)attnd_rng_int(&r, 0, NSEQ - 1);
            if (seqs[j] == NULL && j % 3 == i % 3) {
                attnd_err rv = attnd_cache_fork(c, s, (uint64_t)j + 1, &seqs[j], &lc);
                cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_OUT_OF_BLOCKS);
                if (rv != ATTND_ERR_OK) seqs[j] = NULL;
            }
        } else if (op == 1 && s->pend_tokens == 0) {
            attnd_err rv = attnd_cache_reserve(c, s, (uint32_t)attnd_rng_int(&r, 1, 40), &cow);
            cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_OUT_OF_BLOCKS ||
                          rv == ATTND_ERR_INVALID_ARGUMENT,
                      "reserve: %d", rv);
            if (cow.src >= 0) cr_assert_eq(attnd_cache_block_refs(c, cow.dst), 1);
        } else if (op == 2 || op == 3) {
            attnd_cache_commit(c, s);
        } else if (op == 4) {
            attnd_cache_abort(c, s);
        } else if (op == 5) {
            int32_t slot;
            int fresh;
            if (attnd_rng_int(&r, 0, 3) == 0) { /* few: a sequence with state cannot truncate */
                attnd_err rv = attnd_cache_linear_slot(c, s, &slot, &fresh);
                cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_OUT_OF_BLOCKS);
            }
        } else if (op == 6) {
            uint32_t drop = (uint32_t)attnd_rng_int(&r, 0, 20);
            attnd_err rv = attnd_cache_truncate(c, s, drop, "tokens", err, sizeof err);
            cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_INVALID_ARGUMENT ||
                          rv == ATTND_ERR_FAILED_PRECONDITION,
                      "truncate: %d", rv);
        } else {
            attnd_cache_release(c, s);
            seqs[i] = NULL;
        }
        check_invariants(c, owners, 3);
    }
    for (int o = 0; o < 3; o++)
        attnd_cache_release_owner(c, owners[o]);
    cr_assert_eq(attnd_cache_blocks_free(c), NB * 4);
    cr_assert_eq(attnd_cache_linear_free(c), 8);
    attnd_cache_free(c);
}

Test(cache, random_operations_keep_every_invariant, .timeout = 60)
{
    random_operations(0, 1234);
    random_operations(40, 1235);
}

/* ---------------------------------------------------------------- truncate */

Test(cache, truncate_releases_blocks_past_the_new_end, .timeout = 60)
{
    attnd_cache *c = make(NB, 2);
    attnd_seq *a, *b;
    attnd_cache_copy cow, lc;
    char err[256];
    uint64_t owner = 1;
    cr_assert_eq(attnd_cache_create(c, 1, 1, &a), ATTND_ERR_OK);
    grow(c, a, 40, NULL); /* 3 blocks */
    cr_assert_eq(attnd_cache_truncate(c, a, 10, "tokens", err, sizeof err), ATTND_ERR_OK, "%s",
                 err);
    cr_assert_eq(a->num_tokens, 30);
    cr_assert_eq(a->nblocks, 2);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 2);
    cr_assert_eq(attnd_cache_truncate(c, a, 0, "tokens", err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_truncate(c, a, 31, "tokens", err, sizeof err),
                 ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "tokens: 31 tokens to drop, sequence 1 has 30"), "%s", err);
    /* a child sharing both blocks drops into the first: the second goes back to the parent
     * alone, and the child's next write copies the shared (now partial) first block */
    cr_assert_eq(attnd_cache_fork(c, a, 2, &b, &lc), ATTND_ERR_OK);
    int32_t first = a->blocks[0], second = a->blocks[1];
    cr_assert_eq(attnd_cache_truncate(c, b, 20, "tokens", err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(b->nblocks, 1);
    cr_assert_eq(attnd_cache_block_refs(c, second), 1);
    cr_assert_eq(attnd_cache_block_refs(c, first), 2);
    grow(c, b, 3, &cow);
    cr_assert_eq(cow.src, first, "the shared block is copied, never written");
    cr_assert_neq(b->blocks[0], first);
    cr_assert_eq(a->blocks[0], first);
    check_invariants(c, &owner, 1);
    /* a reservation pending, or linear state, refuses */
    cr_assert_eq(attnd_cache_reserve(c, a, 2, &cow), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_truncate(c, a, 1, "tokens", err, sizeof err),
                 ATTND_ERR_INVALID_ARGUMENT);
    attnd_cache_abort(c, a);
    int32_t slot;
    int fresh;
    cr_assert_eq(attnd_cache_linear_slot(c, a, &slot, &fresh), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_truncate(c, a, 1, "tokens", err, sizeof err),
                 ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(err, "linear-attention state"), "%s", err);
    check_invariants(c, &owner, 1);
    attnd_cache_free(c);
}

/* ---------------------------------------------------------------- windowed memory */

Test(cache, window_releases_blocks_wholly_before_it, .timeout = 60)
{
    attnd_cache *c = make(NB, 0);
    attnd_seq *s;
    char err[256];
    uint64_t owner = 1;
    attnd_cache_set_window(c, 64);
    cr_assert_eq(attnd_cache_create(c, 1, 1, &s), ATTND_ERR_OK);
    grow(c, s, 100, NULL);
    for (int i = 0; i < 190; i++)
        grow(c, s, 1, NULL);
    /* 290 tokens: the next query (position 290) sees keys 227..290, from block 14 on */
    cr_assert_eq(s->num_tokens, 290);
    cr_assert_eq(s->base, 14);
    cr_assert_eq(s->nblocks, 5, "holds %u blocks, not the 19 its length covers", s->nblocks);
    cr_assert_eq(attnd_cache_blocks_free(c), NB - 5);
    cr_assert_eq(attnd_cache_slot(c, s, 224), (int64_t)s->blocks[0] * BS);
    check_invariants(c, &owner, 1);
    /* far past max_blocks_per_seq (8) x block size: only the held blocks count */
    for (int i = 0; i < 40; i++)
        grow(c, s, 25, NULL);
    cr_assert_eq(s->num_tokens, 1290);
    cr_assert_leq(s->nblocks, 6);
    /* a prefill chunk that would hold more than 8 blocks is still refused */
    attnd_cache_copy cow;
    cr_assert_eq(attnd_cache_reserve(c, s, 100, &cow), ATTND_ERR_INVALID_ARGUMENT);
    /* rollback within the window is fine; past what was released it is refused */
    cr_assert_eq(attnd_cache_truncate(c, s, 5, "tokens", err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_truncate(c, s, 60, "tokens", err, sizeof err),
                 ATTND_ERR_FAILED_PRECONDITION);
    cr_assert(strstr(err, "the window released every key before"), "%s", err);
    check_invariants(c, &owner, 1);
    /* no window: nothing is released */
    attnd_cache_set_window(c, 0);
    attnd_seq *t;
    cr_assert_eq(attnd_cache_create(c, 1, 2, &t), ATTND_ERR_OK);
    grow(c, t, 100, NULL);
    cr_assert_eq(t->nblocks, 7);
    cr_assert_eq(t->base, 0);
    attnd_cache_free(c);
}
