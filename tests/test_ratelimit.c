/* Rate-limited logging: token buckets per key, refill, suppressed counts, key table recycling,
 * and exact accounting under concurrent callers. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "obs/ratelimit.h"

#define SEC 1000000000ull

Test(ratelimit, burst_then_refill_reports_suppressed, .timeout = 120)
{
    attnd_ratelimit rl;
    uint64_t sup = 99;
    attnd_ratelimit_init(&rl, 1.0, 3.0);
    uint64_t t0 = 5 * SEC;
    for (int i = 0; i < 3; i++) {
        cr_assert(attnd_ratelimit_allow(&rl, "decode_error", t0, &sup));
        cr_assert_eq(sup, 0);
    }
    cr_assert_not(attnd_ratelimit_allow(&rl, "decode_error", t0, &sup));
    cr_assert_eq(sup, 0, "a refused event reports nothing");
    cr_assert_not(attnd_ratelimit_allow(&rl, "decode_error", t0 + SEC / 2, &sup));
    /* one token per second: at t0 + 1 s exactly one event passes, carrying the 2 refused */
    cr_assert(attnd_ratelimit_allow(&rl, "decode_error", t0 + SEC, &sup));
    cr_assert_eq(sup, 2);
    cr_assert_not(attnd_ratelimit_allow(&rl, "decode_error", t0 + SEC, &sup));
    cr_assert(attnd_ratelimit_allow(&rl, "decode_error", t0 + 2 * SEC, &sup));
    cr_assert_eq(sup, 1);
    cr_assert_eq(attnd_ratelimit_suppressed_total(&rl), 3);
    attnd_ratelimit_fini(&rl);
}

Test(ratelimit, keys_are_independent, .timeout = 120)
{
    attnd_ratelimit rl;
    attnd_ratelimit_init(&rl, 0.5, 1.0);
    cr_assert(attnd_ratelimit_allow(&rl, "a", SEC, NULL));
    cr_assert_not(attnd_ratelimit_allow(&rl, "a", SEC, NULL));
    cr_assert(attnd_ratelimit_allow(&rl, "b", SEC, NULL));
    cr_assert_not(attnd_ratelimit_allow(&rl, "b", SEC, NULL));
    /* 0.5 per second: a token after 2 s, not after 1.9 s */
    cr_assert_not(attnd_ratelimit_allow(&rl, "a", SEC + 19 * SEC / 10, NULL));
    cr_assert(attnd_ratelimit_allow(&rl, "a", 3 * SEC, NULL));
    attnd_ratelimit_fini(&rl);
}

Test(ratelimit, refill_is_capped_at_burst, .timeout = 120)
{
    attnd_ratelimit rl;
    attnd_ratelimit_init(&rl, 100.0, 2.0);
    cr_assert(attnd_ratelimit_allow(&rl, "k", 0, NULL));
    int allowed = 0;
    for (int i = 0; i < 10; i++)
        allowed += attnd_ratelimit_allow(&rl, "k", 1000 * SEC, NULL);
    cr_assert_eq(allowed, 2);
    /* time going backwards (never with a monotonic clock, but harmless) adds nothing */
    cr_assert_not(attnd_ratelimit_allow(&rl, "k", 10 * SEC, NULL));
    attnd_ratelimit_fini(&rl);
}

Test(ratelimit, zero_rate_disables_limiting, .timeout = 120)
{
    attnd_ratelimit rl;
    uint64_t sup = 7;
    attnd_ratelimit_init(&rl, 0.0, 1.0);
    for (int i = 0; i < 1000; i++)
        cr_assert(attnd_ratelimit_allow(&rl, "k", 0, &sup));
    cr_assert_eq(sup, 0);
    cr_assert_eq(attnd_ratelimit_suppressed_total(&rl), 0);
    attnd_ratelimit_fini(&rl);
}

Test(ratelimit, full_table_recycles_the_least_recently_used_key, .timeout = 120)
{
    attnd_ratelimit rl;
    char key[32];
    attnd_ratelimit_init(&rl, 1e-3, 1.0);
    /* exhaust key 0, then fill every other slot, touching them later than key 0 */
    cr_assert(attnd_ratelimit_allow(&rl, "key-0", 1, NULL));
    cr_assert_not(attnd_ratelimit_allow(&rl, "key-0", 1, NULL));
    for (int i = 1; i < ATTND_RATELIMIT_KEYS; i++) {
        snprintf(key, sizeof(key), "key-%d", i);
        cr_assert(attnd_ratelimit_allow(&rl, key, 10 + (uint64_t)i, NULL));
    }
    /* the table is full: key 0 still has its (empty) bucket */
    cr_assert_not(attnd_ratelimit_allow(&rl, "key-0", 2, NULL));
    /* a new key recycles the least recently used slot: key 0's (last used at t=2, the others
     * at t=11..) */
    cr_assert(attnd_ratelimit_allow(&rl, "fresh", 1000, NULL));
    /* key 0 lost its slot: it comes back with a full bucket, taking the next oldest (key 1) */
    cr_assert(attnd_ratelimit_allow(&rl, "key-0", 1001, NULL));
    /* key 2 kept its slot and its empty bucket */
    cr_assert_not(attnd_ratelimit_allow(&rl, "key-2", 1002, NULL));
    cr_assert_eq(attnd_ratelimit_suppressed_total(&rl), 3);
    attnd_ratelimit_fini(&rl);
}

Test(ratelimit, long_keys_compare_on_their_prefix, .timeout = 120)
{
    attnd_ratelimit rl;
    char a[200], b[200];
    memset(a, 'x', sizeof(a) - 1);
    a[sizeof(a) - 1] = '\0';
    memcpy(b, a, sizeof(b));
    b[150] = 'y'; /* differs only past the compared prefix */
    attnd_ratelimit_init(&rl, 1e-3, 1.0);
    cr_assert(attnd_ratelimit_allow(&rl, a, 1, NULL));
    cr_assert_not(attnd_ratelimit_allow(&rl, b, 1, NULL));
    b[3] = 'y'; /* differs inside the prefix: its own bucket */
    cr_assert(attnd_ratelimit_allow(&rl, b, 1, NULL));
    attnd_ratelimit_fini(&rl);
}

#define THREADS 4
#define CALLS 20000

typedef struct hammer_arg {
    attnd_ratelimit *rl;
    int allowed;
    uint64_t reported;
} hammer_arg;

static void *hammer(void *p)
{
    hammer_arg *h = p;
    for (int i = 0; i < CALLS; i++) {
        uint64_t sup = 0;
        /* all callers at the same instant: only the burst may pass */
        if (attnd_ratelimit_allow(h->rl, "shared", SEC, &sup)) h->allowed++;
        h->reported += sup;
    }
    return NULL;
}

Test(ratelimit, concurrent_callers_share_one_bucket_exactly, .timeout = 120)
{
    attnd_ratelimit rl;
    pthread_t th[THREADS];
    hammer_arg args[THREADS];
    attnd_ratelimit_init(&rl, 1.0, 10.0);
    for (int i = 0; i < THREADS; i++) {
        args[i] = (hammer_arg){.rl = &rl};
        cr_assert_eq(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    int allowed = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        allowed += args[i].allowed;
    }
    cr_assert_eq(allowed, 10);
    cr_assert_eq(attnd_ratelimit_suppressed_total(&rl), (uint64_t)THREADS * CALLS - 10);
    uint64_t sup = 0;
    cr_assert(attnd_ratelimit_allow(&rl, "shared", 2 * SEC, &sup));
    cr_assert_eq(sup, (uint64_t)THREADS * CALLS - 10, "every refused call is reported once");
    attnd_ratelimit_fini(&rl);
}
