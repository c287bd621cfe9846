/* Bad input on a real socket. A well-behaved client runs a decode loop in a thread the whole
 * time, every output checked against its mirror; meanwhile raw NNG sockets send garbage bytes,
 * truncated protobuf, a wrong protocol version and a stolen session, and a second client sends
 * every kind of bad request (unknown step, unknown sequence, references outside their region,
 * wrong dtypes and shapes, out of blocks, another client's sequence). Each gets its exact error
 * code; after each one the good client must have completed another correct step; at the end
 * nothing is lost (every block free again) and the daemon exits cleanly. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "attnd.pb-c.h"
#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

/* Few blocks, so one request can run the pool dry while the good client holds some. */
#define CONFIG                                                                                     \
    "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 64,"       \
    " \"max_blocks_per_seq\": 64},"                                                                \
    " \"log\": {\"level\": \"error\", \"stats_interval_s\": 0}}"

/* The good client holds at most 2 x ceil((33 + MAX_GOOD_STEPS) / 16) blocks. */
#define MAX_GOOD_STEPS 200

/* ---------------------------------------------------------------- the well-behaved client */

/* It runs in its own thread, one decode step each time the main thread asks for one (target),
 * so its steps overlap the bad requests while their number stays bounded. */
typedef struct good_client {
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    atomic_int steps;  /* decode steps done */
    atomic_int target; /* decode steps asked for */
    atomic_int stop;
    _Atomic attnd_err failed; /* first failure, OK if none */
    pthread_t thread;
} good_client;

static void *good_loop(void *arg)
{
    good_client *g = arg;
    attnd_step_seq prefill[2] = {{1, 20}, {2, 33}}, decode[2] = {{1, 1}, {2, 1}};
    struct timespec nap = {0, 200000};
    attnd_err rv =
        attnd_e2e_step(g->c, &g->m, &g->shm, ATTND_DTYPE_F32, 0, prefill, 2, 0, &g->r, &g->errs);
    while (rv == ATTND_ERR_OK && !atomic_load(&g->stop)) {
        if (atomic_load(&g->steps) >= atomic_load(&g->target)) {
            nanosleep(&nap, NULL);
            continue;
        }
        rv =
            attnd_e2e_step(g->c, &g->m, &g->shm, ATTND_DTYPE_F32, 0, decode, 2, 0, &g->r, &g->errs);
        if (rv == ATTND_ERR_OK) atomic_fetch_add(&g->steps, 1);
    }
    atomic_store(&g->failed, rv);
    return NULL;
}

static void good_start(good_client *g, const attnd_daemon_proc *d)
{
    memset(g, 0, sizeof *g);
    attnd_test_mirror_client(d, NULL, 40 + MAX_GOOD_STEPS, ATTND_DTYPE_F32, 64, &g->c, &g->m,
                             &g->shm);
    attnd_test_mirror_seqs(g->c, &g->m, 2);
    attnd_rng_seed(&g->r, 31);
    cr_assert_eq(pthread_create(&g->thread, NULL, good_loop, g), 0);
}

/* Ask for one more step (it runs while the caller sends its bad request); returns the count
 * to wait for. */
static int good_request(good_client *g)
{
    int t = atomic_fetch_add(&g->target, 1) + 1;
    cr_assert_leq(t, MAX_GOOD_STEPS, "more bad cases than MAX_GOOD_STEPS");
    return t;
}

/* Wait until the good client completed `target` steps, all correct so far. */
static void good_wait(good_client *g, int target, const char *after)
{
    struct timespec ts = {0, 500000};
    for (int i = 0; i < 60000 && atomic_load(&g->steps) < target; i++) {
        if (atomic_load(&g->failed) != ATTND_ERR_OK) break;
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(atomic_load(&g->failed), ATTND_ERR_OK, "good client failed after %s: %s", after,
                 attnd_err_name(atomic_load(&g->failed)));
    cr_assert_geq(atomic_load(&g->steps), target, "good client stalled after %s", after);
}

static void good_finish(good_client *g)
{
    atomic_store(&g->stop, 1);
    pthread_join(g->thread, NULL);
    cr_assert_eq(g->failed, ATTND_ERR_OK, "good client: %s", attnd_err_name(g->failed));
    cr_assert_eq(atomic_load(&g->steps), atomic_load(&g->target));
    attnd_test_expect_errs(&g->errs, ATTND_DTYPE_F32, "good client");
    fprintf(stderr, "badinput: good client ran %d decode steps (%lld attends), worst %.2g\n",
            atomic_load(&g->steps), (long long)g->errs.attends, g->errs.ref);
    cr_assert_eq(attnd_client_seq_free(g->c, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_free(g->c, 2), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_shm_destroy(g->c, &g->shm), ATTND_ERR_OK);
    attnd_mirror_fini(&g->m);
}

/* ---------------------------------------------------------------- raw sockets */

/* Send bytes on a fresh REQ socket; *rep gets the decoded reply (NULL if none decodes).
 * Returns 0, or the NNG error (NNG_ETIMEDOUT when the daemon dropped the message). */
static int raw_exchange(const char *url, const void *buf, size_t len, Attnd__Reply **rep)
{
    nng_socket s;
    nng_msg *m = NULL;
    int rv;
    *rep = NULL;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    cr_assert_eq(nng_dial(s, url, NULL, 0), 0);
    cr_assert_eq(nng_msg_alloc(&m, len), 0);
    if (len > 0) memcpy(nng_msg_body(m), buf, len);
    cr_assert_eq(nng_sendmsg(s, m, 0), 0);
    if ((rv = nng_recvmsg(s, &m, 0)) == 0) {
        *rep = attnd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        nng_msg_free(m);
    }
    nng_close(s);
    return rv;
}

/* The code of the daemon's reply to raw bytes (asserts there is a decodable reply). */
static uint32_t raw_code(const char *url, const void *buf, size_t len, uint64_t want_id)
{
    Attnd__Reply *rep;
    uint32_t code;
    cr_assert_eq(raw_exchange(url, buf, len, &rep), 0, "no reply to %zu raw bytes", len);
    cr_assert_not_null(rep, "reply does not decode");
    cr_assert_eq(rep->id, want_id);
    cr_assert(rep->message != NULL && rep->message[0] != '\0', "error reply without a message");
    code = rep->code;
    attnd__reply__free_unpacked(rep, NULL);
    return code;
}

static size_t pack(const Attnd__Request *req, uint8_t *buf, size_t cap)
{
    size_t n = attnd__request__get_packed_size(req);
    cr_assert_leq(n, cap);
    return attnd__request__pack(req, buf);
}

static void raw_cases(const char *url, uint64_t good_session, good_client *g)
{
    uint8_t buf[8192], q[2048];
    int t = good_request(g);
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0x01, 0x13, 0x37, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x07};
    cr_assert_eq(raw_code(url, garbage, sizeof garbage, 0), ATTND_ERR_PROTOCOL);
    good_wait(g, t, "garbage bytes");

    /* a valid Attend with inline data, cut in the middle of its data */
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend at = ATTND__ATTEND__INIT;
    Attnd__TensorRef tq = ATTND__TENSOR_REF__INIT;
    int64_t shape[3] = {4, 8, 64};
    memset(q, 0x3c, sizeof q);
    tq.dtype = ATTND__DTYPE__BF16;
    tq.n_shape = 3;
    tq.shape = shape;
    tq.data.data = q;
    tq.data.len = sizeof q;
    at.step = 5;
    at.q = &tq;
    req.id = 77;
    req.session = good_session;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &at;
    size_t n = pack(&req, buf, sizeof buf);
    t = good_request(g);
    cr_assert_eq(raw_code(url, buf, n / 2, 0), ATTND_ERR_PROTOCOL);
    good_wait(g, t, "truncated protobuf");

    /* a well-formed request naming the good client's session from another connection */
    Attnd__CreateSequence cs = ATTND__CREATE_SEQUENCE__INIT;
    Attnd__Request steal = ATTND__REQUEST__INIT;
    cs.seq_id = 1;
    steal.id = 78;
    steal.session = good_session;
    steal.body_case = ATTND__REQUEST__BODY_CREATE;
    steal.create = &cs;
    n = pack(&steal, buf, sizeof buf);
    t = good_request(g);
    cr_assert_eq(raw_code(url, buf, n, 78), ATTND_ERR_PERMISSION_DENIED);
    steal.session = good_session + 1000;
    n = pack(&steal, buf, sizeof buf);
    cr_assert_eq(raw_code(url, buf, n, 78), ATTND_ERR_NOT_FOUND);

    /* Hello with a protocol version this daemon does not speak */
    Attnd__Hello h = ATTND__HELLO__INIT;
    Attnd__Request hello = ATTND__REQUEST__INIT;
    h.protocol_version = 99;
    hello.id = 79;
    hello.body_case = ATTND__REQUEST__BODY_HELLO;
    hello.hello = &h;
    n = pack(&hello, buf, sizeof buf);
    cr_assert_eq(raw_code(url, buf, n, 79), ATTND_ERR_UNSUPPORTED);

    /* a request with no body */
    Attnd__Request empty = ATTND__REQUEST__INIT;
    empty.id = 80;
    empty.session = good_session;
    n = pack(&empty, buf, sizeof buf);
    cr_assert_eq(raw_code(url, buf, n, 80), ATTND_ERR_INVALID_ARGUMENT);
    good_wait(g, t, "stolen session, bad hello, empty body");
}

/* ---------------------------------------------------------------- the misbehaving client */

typedef struct bad_client {
    attnd_client *c;
    const attnd_geometry *geo;
    attnd_shm shm;
    attnd_mirror m;
    attnd_rng r;
    attnd_e2e_errs errs;
} bad_client;

/* Expect code from a call, and progress of the good client after it. */
#define EXPECT_CODE(g, call, code)                                                                 \
    do {                                                                                           \
        int t_ = good_request(g);                                                                  \
        attnd_err rv_ = (call);                                                                    \
        cr_assert_eq(rv_, code, "%s: got %s (%s), expected %s", #call, attnd_err_name(rv_),        \
                     attnd_client_last_error(b->c), attnd_err_name(code));                         \
        good_wait(g, t_, #call);                                                                   \
    } while (0)

static void sequence_cases(bad_client *b, good_client *g)
{
    attnd_seq_info info;
    attnd_step st;
    attnd_step_seq unknown = {4242, 1}, zero = {0, 1}, none = {7, 0}, huge = {7, 60 * 16};
    attnd_step_seq too_long = {7, 65 * 16}, twice[2] = {{7, 1}, {7, 1}};
    EXPECT_CODE(g, attnd_client_seq_query(b->c, 4242, &info), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_seq_free(b->c, 4242), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_seq_create(b->c, 0, NULL), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &unknown, 1, &st, NULL), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &zero, 1, &st, NULL), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, NULL, 0, &st, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_client_seq_create(b->c, 7, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&b->m, 7), 0);
    EXPECT_CODE(g, attnd_client_seq_create(b->c, 7, NULL), ATTND_ERR_ALREADY_EXISTS);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &none, 1, &st, NULL), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, twice, 2, &st, NULL), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &too_long, 1, &st, NULL),
                ATTND_ERR_INVALID_ARGUMENT);
    /* 60 blocks fit one sequence (64 at most) but not the pool the good client shares */
    attnd_status before, after;
    cr_assert_eq(attnd_client_status(b->c, &before), ATTND_ERR_OK);
    cr_assert_gt(60u, before.blocks_free, "the pool has %u free blocks", before.blocks_free);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &huge, 1, &st, NULL), ATTND_ERR_OUT_OF_BLOCKS);
    cr_assert_eq(attnd_client_seq_query(b->c, 7, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 0);
    cr_assert_eq(info.num_blocks, 0, "a failed BeginStep kept %u blocks", info.num_blocks);
    cr_assert_eq(info.step, 0);
    cr_assert_eq(attnd_client_status(b->c, &after), ATTND_ERR_OK);
    cr_assert_leq(after.blocks_free, before.blocks_free); /* the good client may have grown */
}

/* One step of b's sequence 7 begun on both sides (for the bad Attends that follow). */
static uint64_t begin7(bad_client *b, uint32_t tokens)
{
    attnd_step st;
    attnd_step_seq s = {7, tokens};
    cr_assert_eq(attnd_client_step_begin(b->c, &s, 1, &st, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_begin(&b->m, &s, 1), 0);
    return st.id;
}

static void tensor_cases(bad_client *b, good_client *g)
{
    attnd_e2e_io io;
    attnd_ref q, k, out, lse;
    uint64_t step = begin7(b, 3);
    attnd_e2e_io_layout(&io, b->geo, &b->shm, ATTND_DTYPE_F32, 3);
    attnd_e2e_io_fill(&io, &b->r, 1.0);
#define ATTEND(qq, kk, vv, oo, ll) attnd_client_attend(b->c, step, 0, qq, kk, vv, oo, ll)
    EXPECT_CODE(g, attnd_client_attend(b->c, 999999, 0, &io.rq, &io.rk, &io.rv, &io.rout, NULL),
                ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_step_end(b->c, 999999, 0), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(
        g,
        attnd_client_attend(b->c, step, b->geo->num_layers, &io.rq, &io.rk, &io.rv, &io.rout, NULL),
        ATTND_ERR_INVALID_ARGUMENT);
    /* outside the region: the last row would end past its end */
    q = io.rq;
    q.offset = b->shm.size - 64;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    q.offset = UINT64_MAX - 7; /* offset + size wraps */
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    out = io.rout;
    out.offset = b->shm.size;
    EXPECT_CODE(g, ATTEND(&io.rq, &io.rk, &io.rv, &out, NULL), ATTND_ERR_INVALID_ARGUMENT);
    q = io.rq;
    q.has_strides = 1;
    q.strides[0] = 1 << 30;
    q.strides[1] = 64;
    q.strides[2] = 1; /* strides reaching far outside */
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    q = io.rq;
    q.region = 77; /* never registered */
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_NOT_FOUND);
    /* wrong dtypes */
    q = io.rq;
    q.dtype = ATTND_DTYPE_I32;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    lse = io.rlse;
    lse.dtype = ATTND_DTYPE_F16;
    EXPECT_CODE(g, ATTEND(&io.rq, &io.rk, &io.rv, &io.rout, &lse), ATTND_ERR_INVALID_ARGUMENT);
    /* wrong shapes: rows, heads, head size, dims */
    q = io.rq;
    q.shape[0] = 4;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    k = io.rk;
    k.shape[1] = b->geo->num_q_heads;
    EXPECT_CODE(g, ATTEND(&io.rq, &k, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    out = io.rout;
    out.shape[2] = b->geo->head_size / 2;
    EXPECT_CODE(g, ATTEND(&io.rq, &io.rk, &io.rv, &out, NULL), ATTND_ERR_INVALID_ARGUMENT);
    q = io.rq;
    q.ndim = 2;
    q.shape[1] = b->geo->num_q_heads * b->geo->head_size;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, ATTEND(NULL, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    /* INLINE data shorter than its shape, and a shape too large to exist */
    attnd_ref_inline_in(&q, io.q.data, ATTND_DTYPE_F32, 3, io.q.shape);
    q.bytes -= 4;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
    q = io.rq;
    q.shape[0] = (int64_t)1 << 40;
    EXPECT_CODE(g, ATTEND(&q, &io.rk, &io.rv, &io.rout, NULL), ATTND_ERR_INVALID_ARGUMENT);
#undef ATTEND
    /* none of that touched the step: it still attends exactly as the mirror says, and commits */
    cr_assert_eq(
        attnd_e2e_attend_layers(b->c, &b->m, &b->shm, ATTND_DTYPE_F32, 0, step, &b->r, &b->errs),
        ATTND_ERR_OK);
    cr_assert_eq(attnd_client_step_end(b->c, step, 0), ATTND_ERR_OK);
    attnd_mirror_end(&b->m, 1);
    attnd_step_seq s = {7, 1};
    cr_assert_eq(
        attnd_e2e_step(b->c, &b->m, &b->shm, ATTND_DTYPE_F32, 0, &s, 1, 0, &b->r, &b->errs),
        ATTND_ERR_OK);
    cr_expect_leq(b->errs.direct, attnd_e2e_direct_tol(ATTND_DTYPE_F32),
                  "after bad attends, vs CPU op: %.3g", b->errs.direct);
    cr_expect_leq(b->errs.ref, attnd_tol_for(ATTND_DTYPE_F32), "after bad attends: %.3g",
                  b->errs.ref);
}

/* A named shm object of `size` bytes the test keeps linked (the client helper unlinks its own
 * names once mapped). */
static void named_shm(char *name, size_t n, size_t size)
{
    snprintf(name, n, "/attnd-badinput-%ld", (long)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

static void region_cases(bad_client *b, good_client *g)
{
    char name[64];
    named_shm(name, sizeof name, 4096);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 0, name, 64), ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, b->shm.region, name, 64),
                ATTND_ERR_ALREADY_EXISTS);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 90, "/attnd-no-such-object", 64),
                ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 90, "no-slash", 64),
                ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 90, "/dev/../etc/passwd", 64),
                ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 91, name, 4096 + 4096),
                ATTND_ERR_INVALID_ARGUMENT);
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 92, name, 0), ATTND_ERR_INVALID_ARGUMENT);
    /* the name itself is fine: it registers, and unregisters once */
    EXPECT_CODE(g, attnd_client_region_register_shm(b->c, 93, name, 4096), ATTND_ERR_OK);
    EXPECT_CODE(g, attnd_client_region_unregister(b->c, 93), ATTND_ERR_OK);
    EXPECT_CODE(g, attnd_client_region_unregister(b->c, 93), ATTND_ERR_NOT_FOUND);
    shm_unlink(name);
}

/* b names the good client's sequences, step and region: none of them exist for b. */
static void foreign_cases(bad_client *b, good_client *g)
{
    attnd_seq_info info;
    attnd_step st;
    attnd_step_seq theirs = {1, 1}; /* the good client's sequence 1 */
    attnd_e2e_io io;
    attnd_e2e_io_layout(&io, b->geo, &g->shm, ATTND_DTYPE_F32, 1);
    EXPECT_CODE(g, attnd_client_seq_query(b->c, 2, &info), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_step_begin(b->c, &theirs, 1, &st, NULL), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_seq_free(b->c, 1), ATTND_ERR_NOT_FOUND);
    EXPECT_CODE(g, attnd_client_seq_fork(b->c, 2, 100, &info), ATTND_ERR_NOT_FOUND);
    /* the good client's region id, which b never registered (b's own id differs) */
    if (g->shm.region != b->shm.region) {
        EXPECT_CODE(g, attnd_client_region_unregister(b->c, g->shm.region), ATTND_ERR_NOT_FOUND);
    }
    /* step ids are daemon-wide: around b's own latest one lie the good client's (one of them
     * open right now, the good client being mid-step); none of them is b's to name */
    uint64_t mine = begin7(b, 1);
    attnd_mirror_end(&b->m, 0);
    cr_assert_eq(attnd_client_step_end(b->c, mine, 1), ATTND_ERR_OK);
    atomic_fetch_add(&g->target, 8);
    for (uint64_t id = mine > 16 ? mine - 16 : 1; id < mine + 16; id++) {
        attnd_err rv;
        if (id == mine) continue;
        rv = attnd_client_attend(b->c, id, 0, &io.rq, &io.rk, &io.rv, &io.rout, NULL);
        cr_assert_eq(rv, ATTND_ERR_NOT_FOUND, "step %llu of another session: %s",
                     (unsigned long long)id, attnd_err_name(rv));
        rv = attnd_client_step_end(b->c, id, 1);
        cr_assert_eq(rv, ATTND_ERR_NOT_FOUND, "end of step %llu of another session: %s",
                     (unsigned long long)id, attnd_err_name(rv));
    }
    good_wait(g, atomic_load(&g->target), "naming other sessions' steps");
    EXPECT_CODE(g, attnd_client_seq_query(b->c, 1, &info), ATTND_ERR_NOT_FOUND);
}

Test(badinput, every_bad_request_gets_its_code_and_the_good_client_is_served, .timeout = 120)
{
    attnd_daemon_proc d;
    good_client g;
    bad_client b;
    attnd_status st;
    memset(&b, 0, sizeof b);
    attnd_test_daemon_start(&d, CONFIG);
    good_start(&g, &d);
    b.c = attnd_test_connect(&d);
    b.geo = &attnd_client_server(b.c)->geometry;
    /* make the ids differ from the good client's, so "foreign" is really foreign */
    (void)attnd_client_region_next_id(b.c);
    cr_assert_eq(
        attnd_client_shm_create(b.c, attnd_e2e_io_bytes(b.geo, ATTND_DTYPE_F32, 8), &b.shm),
        ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_init(&b.m, b.geo, NULL, 64), 0);
    attnd_rng_seed(&b.r, 32);

    raw_cases(d.url, attnd_client_session(g.c), &g);
    sequence_cases(&b, &g);
    tensor_cases(&b, &g);
    region_cases(&b, &g);
    foreign_cases(&b, &g);

    good_finish(&g);
    cr_assert_eq(attnd_client_seq_free(b.c, 7), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_shm_destroy(b.c, &b.shm), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_status(b.c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, b.geo->num_blocks, "blocks lost: %u of %u free", st.blocks_free,
                 b.geo->num_blocks);
    cr_assert_geq(st.errors, 40, "the daemon counted %llu errors", (unsigned long long)st.errors);
    attnd_mirror_fini(&b.m);
    attnd_client_free(b.c);
    attnd_client_free(g.c);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}
