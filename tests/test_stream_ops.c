/* Streams on the cpu backend (kernels.h "streams"), the emulation the stream-ordered protocol's
 * CPU tests run on: a wait holds everything queued after it until its word is written, ops
 * launched while a stream is selected run there in order (bit-identical to running them at once),
 * a release unblocks a wait, a write of several words (a step's resets) waits its turn and sets
 * exactly those, one stream's wait never holds another stream or the backend, and
 * destroying a stream stuck in a wait returns. */
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include "attnd/clock.h"
#include "suite.h"
#include "testutil.h"

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll until the stream is idle (OK) or 5 s pass; returns the last query. */
static attnd_err wait_idle(attnd_backend *b, attnd_stream *s)
{
    attnd_err rv = ATTND_ERR_TIMEOUT;
    for (uint64_t end = attnd_clock_ms() + 5000; attnd_clock_ms() < end; nap_ms(1))
        if ((rv = attnd_stream_query(b, s)) != ATTND_ERR_TIMEOUT) break;
    return rv;
}

Test(stream_ops, wait_holds_later_work_until_written)
{
    attnd_backend *b = attnd_test_open_cpu(2);
    attnd_stream *s;
    uint32_t go = 0, done = 0;
    cr_assert_eq(attnd_stream_create(b, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_query(b, s), ATTND_ERR_OK, "a new stream is idle");
    cr_assert_eq(attnd_stream_wait_value(b, s, &go, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_write_value(b, s, &done, 7), ATTND_ERR_OK);
    nap_ms(30);
    cr_expect_eq(attnd_stream_query(b, s), ATTND_ERR_TIMEOUT, "waiting on go == 1");
    cr_expect_eq(__atomic_load_n(&done, __ATOMIC_ACQUIRE), 0u, "the write after the wait waits");
    go = 2; /* not equal: still waits */
    nap_ms(10);
    cr_expect_eq(attnd_stream_query(b, s), ATTND_ERR_TIMEOUT, "2 is not the value waited for");
    cr_assert_eq(attnd_stream_release(b, &go, 1), ATTND_ERR_OK);
    cr_expect_eq(wait_idle(b, s), ATTND_ERR_OK);
    cr_expect_eq(__atomic_load_n(&done, __ATOMIC_ACQUIRE), 7u);
    attnd_stream_destroy(b, s);
    attnd_backend_close(b);
}

Test(stream_ops, a_multi_word_write_sets_every_word_after_the_wait)
{
    attnd_backend *b = attnd_test_open_cpu(2);
    attnd_stream *s;
    uint32_t go = 0, words[6] = {1, 1, 1, 1, 1, 9};
    cr_assert_eq(attnd_stream_create(b, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_wait_value(b, s, &go, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_write_values(b, s, words, 5, 0), ATTND_ERR_OK);
    nap_ms(20);
    cr_expect_eq(__atomic_load_n(&words[0], __ATOMIC_ACQUIRE), 1u, "held by the wait");
    cr_assert_eq(attnd_stream_release(b, &go, 1), ATTND_ERR_OK);
    cr_expect_eq(wait_idle(b, s), ATTND_ERR_OK);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(words[i], 0u, "word %d", i);
    cr_expect_eq(words[5], 9u, "the word after the count is untouched");
    attnd_stream_destroy(b, s);
    attnd_backend_close(b);
}

/* A merge of random f32 states, T x H x D. */
typedef struct merge_io {
    attnd_test_tensor out, po, pl, so, sl;
    attnd_merge_params p;
} merge_io;

static void merge_io_init(merge_io *m, attnd_rng *r)
{
    int64_t shape[3] = {5, 3, 40}, lshape[2] = {3, 5};
    attnd_tt_alloc(&m->out, ATTND_DTYPE_F32, 3, shape);
    attnd_tt_alloc(&m->po, ATTND_DTYPE_F32, 3, shape);
    attnd_tt_alloc(&m->so, ATTND_DTYPE_F32, 3, shape);
    attnd_tt_alloc(&m->pl, ATTND_DTYPE_F32, 2, lshape);
    attnd_tt_alloc(&m->sl, ATTND_DTYPE_F32, 2, lshape);
    attnd_tt_fill_normal(&m->po, r, 0.0, 1.0);
    attnd_tt_fill_normal(&m->so, r, 0.0, 1.0);
    attnd_tt_fill_normal(&m->pl, r, 0.0, 1.0);
    attnd_tt_fill_normal(&m->sl, r, 0.0, 1.0);
    memset(m->out.buf, 0, m->out.bytes);
    m->p = (attnd_merge_params){.out = m->out.t,
                                .prefix_out = m->po.t,
                                .prefix_lse = m->pl.t,
                                .suffix_out = m->so.t,
                                .suffix_lse = m->sl.t};
}

static void merge_io_free(merge_io *m)
{
    attnd_tt_free(&m->out);
    attnd_tt_free(&m->po);
    attnd_tt_free(&m->so);
    attnd_tt_free(&m->pl);
    attnd_tt_free(&m->sl);
}

Test(stream_ops, selected_ops_run_after_the_wait_bit_identical)
{
    attnd_backend *b = attnd_test_open_cpu(2);
    attnd_rng r;
    merge_io now, later;
    attnd_stream *s;
    uint32_t go = 0, done = 0;
    attnd_rng_seed(&r, 11);
    merge_io_init(&now, &r);
    attnd_rng_seed(&r, 11);
    merge_io_init(&later, &r);
    cr_assert_eq(attnd_merge_states(b, &now.p), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_create(b, &s), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_wait_value(b, s, &go, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_select(b, s), ATTND_ERR_OK);
    cr_assert_eq(attnd_merge_states(b, &later.p), ATTND_ERR_OK, "queued, not run");
    cr_assert_eq(attnd_stream_select(b, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_write_value(b, s, &done, 1), ATTND_ERR_OK);
    nap_ms(20);
    const float *o = later.out.buf;
    int untouched = 1;
    for (size_t i = 0; i < later.out.bytes / sizeof(float); i++)
        untouched &= o[i] == 0.0f;
    cr_expect(untouched, "the merge waits behind the stream's wait");
    /* the backend itself is not held by the stream's wait */
    cr_expect_eq(attnd_merge_states(b, &now.p), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_release(b, &go, 1), ATTND_ERR_OK);
    cr_assert_eq(wait_idle(b, s), ATTND_ERR_OK);
    cr_expect_eq(done, 1u);
    cr_expect_eq(memcmp(now.out.buf, later.out.buf, now.out.bytes), 0,
                 "the queued merge equals the one run at once, bit for bit");
    attnd_stream_destroy(b, s);
    merge_io_free(&now);
    merge_io_free(&later);
    attnd_backend_close(b);
}

Test(stream_ops, one_streams_wait_never_holds_another)
{
    attnd_backend *b = attnd_test_open_cpu(2);
    attnd_stream *a, *c;
    uint32_t never = 0, go = 0, a_done = 0, c_done = 0;
    cr_assert_eq(attnd_stream_create(b, &a), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_create(b, &c), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_wait_value(b, a, &never, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_write_value(b, a, &a_done, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_wait_value(b, c, &go, 5), ATTND_ERR_OK);
    cr_assert_eq(attnd_stream_write_value(b, c, &c_done, 1), ATTND_ERR_OK);
    go = 5;
    cr_expect_eq(wait_idle(b, c), ATTND_ERR_OK, "c runs while a waits");
    cr_expect_eq(c_done, 1u);
    cr_expect_eq(attnd_stream_query(b, a), ATTND_ERR_TIMEOUT);
    cr_expect_eq(a_done, 0u);
    uint64_t t0 = attnd_clock_ms();
    attnd_stream_destroy(b, a); /* stuck in its wait: destroy still returns */
    cr_expect_lt(attnd_clock_ms() - t0, 2000u);
    cr_expect_eq(a_done, 0u, "work behind the abandoned wait never ran");
    attnd_stream_destroy(b, c);
    attnd_backend_close(b);
}

Test(stream_ops, device_calls_are_unsupported_off_cuda)
{
    attnd_backend *b = attnd_test_open_cpu(1);
    unsigned char h[ATTND_IPC_HANDLE_BYTES];
    int mps = 1;
    cr_expect_eq(attnd_device_ipc_export(b, h, h), ATTND_ERR_UNSUPPORTED);
    cr_expect_eq(attnd_device_mps(b, &mps), ATTND_ERR_UNSUPPORTED);
    cr_expect_eq(mps, 0);
    attnd_backend_close(b);
}
