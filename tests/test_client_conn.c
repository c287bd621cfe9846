/* libattnd-client on its own, against a fake daemon (an NNG REP socket in a thread) that answers
 * exactly what each test scripts: reply ids checked, error replies passed through with their
 * message, undecodable and mismatched replies, timeouts, a dropped connection failing the call
 * in flight at once, inline outputs of the wrong size, and the local errors (no daemon, bad
 * URLs, TLS without a CA, calls before dialing). The shared-memory channel against a fake that
 * serves it with daemon/channel.c: refused (the socket carries on), requests routed through it
 * or not, the sleep protocol's WakeChannel, a timeout leaving its slot stale until the late
 * reply, a dropped connection and a channel the daemon closed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"
#include "wire/channel.h"

typedef enum fake_mode {
    FAKE_HELLO_THEN_ERROR, /* Hello OK, then NOT_FOUND with a message */
    FAKE_WRONG_ID,         /* a reply whose id is not the request's */
    FAKE_GARBAGE,          /* bytes that are not a Reply */
    FAKE_SILENT,           /* receive, never answer */
    FAKE_HANG_UP,          /* receive, then close the socket */
    FAKE_SHORT_OUTPUT,     /* Attend's inline output 4 bytes short */
} fake_mode;

typedef struct fake {
    nng_socket sock;
    char url[96];
    fake_mode mode;
    int served;
    pthread_t thread;
} fake;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_reply(fake *f, const Attnd__Reply *rep)
{
    nng_msg *m;
    size_t n = attnd__reply__get_packed_size(rep);
    nng_msg_alloc(&m, n);
    attnd__reply__pack(rep, nng_msg_body(m));
    nng_sendmsg(f->sock, m, 0);
}

static void answer(fake *f, const Attnd__Request *req)
{
    Attnd__Reply rep = ATTND__REPLY__INIT;
    Attnd__HelloReply h = ATTND__HELLO_REPLY__INIT;
    Attnd__InlineOutputs io = ATTND__INLINE_OUTPUTS__INIT;
    ProtobufCBinaryData data;
    static uint8_t bytes[64];
    rep.id = f->mode == FAKE_WRONG_ID ? req->id + 1 : req->id;
    if (req->body_case == ATTND__REQUEST__BODY_HELLO) {
        rep.id = req->id;
        h.session = 42;
        h.protocol_version = 1;
        rep.body_case = ATTND__REPLY__BODY_HELLO;
        rep.hello = &h;
    } else if (f->mode == FAKE_SHORT_OUTPUT) {
        data.data = bytes;
        data.len = 60;
        io.n_data = 1;
        io.data = &data;
        rep.body_case = ATTND__REPLY__BODY_OUTPUTS;
        rep.outputs = &io;
    } else if (f->mode == FAKE_HELLO_THEN_ERROR) {
        rep.code = ATTND_ERR_NOT_FOUND;
        rep.message = (char *)"seq_id: 9 not found in this session";
    }
    send_reply(f, &rep);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    nng_msg *m;
    while (nng_recvmsg(f->sock, &m, 0) == 0) {
        Attnd__Request *req = attnd__request__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        nng_msg_free(m);
        f->served++;
        int hello = req && req->body_case == ATTND__REQUEST__BODY_HELLO;
        if (req == NULL || (!hello && f->mode == FAKE_SILENT)) {
        } else if (!hello && f->mode == FAKE_HANG_UP) {
            attnd__request__free_unpacked(req, NULL);
            usleep(100000); /* the client is waiting for the reply by now */
            nng_close(f->sock);
            return NULL;
        } else if (!hello && f->mode == FAKE_GARBAGE) {
            nng_send(f->sock, "\xff\xff\xff\xff\x01\x02", 6, 0);
        } else {
            answer(f, req);
        }
        if (req) attnd__request__free_unpacked(req, NULL);
    }
    return NULL;
}

static void fake_start(fake *f, fake_mode mode)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    snprintf(f->url, sizeof f->url, "ipc:///tmp/attnd-fake-%ld-%d.sock", (long)getpid(), (int)mode);
    cr_assert_eq(nng_rep0_open(&f->sock), 0);
    cr_assert_eq(nng_listen(f->sock, f->url, NULL, 0), 0);
    cr_assert_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f)
{
    if (f->mode != FAKE_HANG_UP) nng_close(f->sock);
    pthread_join(f->thread, NULL);
    unlink(f->url + 6);
}

static attnd_client *connect_to(const fake *f, int32_t timeout_ms)
{
    attnd_client_opts opts = {.name = "conn-test", .timeout_ms = timeout_ms, .channel_slots = -1};
    attnd_client *c;
    attnd_server_info info;
    cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_connect(c, f->url, &info), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    cr_assert_eq(info.session, 42);
    cr_assert_eq(attnd_client_session(c), 42);
    cr_assert_not_null(attnd_client_server(c));
    return c;
}

Test(client_conn, error_reply_carries_code_and_message, .timeout = 30)
{
    fake f;
    char buf[16];
    fake_start(&f, FAKE_HELLO_THEN_ERROR);
    attnd_client *c = connect_to(&f, 5000);
    cr_assert_eq(attnd_client_seq_free(c, 9), ATTND_ERR_NOT_FOUND);
    cr_assert_str_eq(attnd_client_last_error(c), "seq_id: 9 not found in this session");
    cr_assert_eq(attnd_client_last_error_remote(c), 1);
    cr_assert_eq(attnd_client_last_error_copy(c, buf, sizeof buf), 35);
    cr_assert_str_eq(buf, "seq_id: 9 not f");
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, reply_for_another_request_is_a_protocol_error, .timeout = 30)
{
    fake f;
    fake_start(&f, FAKE_WRONG_ID);
    attnd_client *c = connect_to(&f, 5000);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_PROTOCOL);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "reply id"), "%s",
                       attnd_client_last_error(c));
    cr_assert_eq(attnd_client_last_error_remote(c), 0);
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, undecodable_reply_is_a_protocol_error, .timeout = 30)
{
    fake f;
    fake_start(&f, FAKE_GARBAGE);
    attnd_client *c = connect_to(&f, 5000);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_PROTOCOL);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "does not decode"));
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, no_reply_times_out, .timeout = 30)
{
    fake f;
    fake_start(&f, FAKE_SILENT);
    attnd_client *c = connect_to(&f, 5000);
    attnd_client_set_timeout(c, 200);
    double t = now_s();
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_TIMEOUT);
    t = now_s() - t;
    cr_assert(t >= 0.15 && t < 3.0, "timed out after %.3f s", t);
    /* the client stays usable: the next call times out the same way, not on a stale reply */
    cr_assert_eq(attnd_client_seq_create(c, 2, NULL), ATTND_ERR_TIMEOUT);
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, dropped_connection_fails_at_once, .timeout = 30)
{
    fake f;
    fake_start(&f, FAKE_HANG_UP);
    attnd_client *c = connect_to(&f, 20000);
    double t = now_s();
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_UNAVAILABLE);
    t = now_s() - t;
    cr_assert_lt(t, 5.0, "the call waited %.1f s for a connection that was gone", t);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "lost"), "%s",
                       attnd_client_last_error(c));
    t = now_s();
    cr_assert_eq(attnd_client_seq_create(c, 2, NULL), ATTND_ERR_UNAVAILABLE);
    cr_assert_lt(now_s() - t, 0.5);
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, inline_output_of_the_wrong_size, .timeout = 30)
{
    fake f;
    float q[64] = {0}, out[16];
    int64_t shape[3] = {1, 1, 16};
    attnd_ref rq, rout;
    fake_start(&f, FAKE_SHORT_OUTPUT);
    attnd_client *c = connect_to(&f, 5000);
    attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, shape);
    attnd_ref_inline_out(&rout, out, ATTND_DTYPE_F32, 3, shape);
    cr_assert_eq(rout.bytes, 64);
    cr_assert_eq(attnd_client_attend(c, 1, 0, &rq, &rq, &rq, &rout, NULL), ATTND_ERR_PROTOCOL);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "60 bytes, expected 64"), "%s",
                       attnd_client_last_error(c));
    attnd_client_free(c);
    fake_stop(&f);
}

Test(client_conn, local_errors, .timeout = 30)
{
    attnd_client *c;
    attnd_status st;
    cr_assert_eq(attnd_client_alloc(&c, NULL), ATTND_ERR_OK);
    cr_assert_str_eq(attnd_client_last_error(c), "");
    cr_assert_null(attnd_client_server(c));
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_UNAVAILABLE); /* not dialed */
    cr_assert_eq(attnd_client_dial(c, "ipc:///tmp/attnd-nobody-listens-here.sock"),
                 ATTND_ERR_UNAVAILABLE);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "attnd-nobody-listens-here"));
    cr_assert_eq(attnd_client_dial(c, "carrier-pigeon://x"), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_client_dial(c, ""), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_client_dial(c, "tls+tcp://localhost:1"), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "tls_ca_file"));
    attnd_client_free(c);
    attnd_client_free(NULL);
}

Test(client_conn, refs, .timeout = 30)
{
    attnd_ref r;
    attnd_shm shm = {.region = 7};
    int64_t shape[3] = {3, 4, 5}, neg[2] = {2, -1};
    cr_assert_eq(attnd_ref_nbytes(ATTND_DTYPE_BF16, 3, shape), 120);
    cr_assert_eq(attnd_ref_nbytes(ATTND_DTYPE_F32, 2, neg), 0);
    cr_assert_eq(attnd_ref_nbytes(ATTND_DTYPE_COUNT, 3, shape), 0);
    cr_assert_eq(attnd_ref_nbytes(ATTND_DTYPE_F32, 5, shape), 0);
    attnd_ref_shm(&r, &shm, 128, ATTND_DTYPE_F16, 3, shape);
    cr_assert_eq(r.region, 7);
    cr_assert_eq(r.offset, 128);
    cr_assert_eq(r.ndim, 3);
    cr_assert_eq(r.shape[2], 5);
    cr_assert_eq(r.has_strides, 0);
}

/* ---------------------------------------------------------------- shared-memory channel */

/* A fake daemon that also serves channels: one thread, like the daemon's executor, reads the
 * socket without blocking and polls its channels (daemon/channel.c) in between; asleep, it
 * blocks on the socket until a WakeChannel. The test steers it through the atomics. */
typedef struct cfake {
    nng_socket sock;
    char url[96];
    pthread_t thread;
    attnd_channels *cs;
    int refuse;                 /* answer OpenChannel with an error, as a daemon without channels */
    int sleepy;                 /* sleep between requests (daemon_state ASLEEP) */
    int hold;                   /* take channel requests, answer none until release */
    int hang_up;                /* close the socket 100 ms after taking a channel request */
    _Atomic int release;        /* answer the held request now */
    _Atomic int close_channels; /* drop every channel now */
    _Atomic int sock_served, chan_served, wakes, closes;
    _Atomic uint32_t held_channel, held_slot, held_valid;
    uint64_t held_id;
    char shm_name[64];
} cfake;

static void cfake_pack_send(cfake *f, const Attnd__Reply *rep)
{
    nng_msg *m;
    nng_msg_alloc(&m, attnd__reply__get_packed_size(rep));
    attnd__reply__pack(rep, nng_msg_body(m));
    nng_sendmsg(f->sock, m, 0);
}

static void cfake_reply_chan(cfake *f, uint32_t channel, uint32_t slot, uint64_t id)
{
    Attnd__Reply rep = ATTND__REPLY__INIT;
    uint8_t buf[64];
    rep.id = id;
    size_t n = attnd__reply__pack(&rep, buf);
    cr_assert_eq(attnd_channels_reply(f->cs, channel, slot, buf, n), ATTND_ERR_OK);
}

static void cfake_chan_cb(void *arg, const attnd_channel_req *cr)
{
    cfake *f = arg;
    Attnd__Request *req = attnd__request__unpack(NULL, cr->len, cr->bytes);
    cr_assert_not_null(req);
    cr_assert_eq(req->session, 42);
    atomic_fetch_add(&f->chan_served, 1);
    if (f->hold || f->hang_up) {
        f->held_id = req->id;
        atomic_store(&f->held_channel, cr->channel);
        atomic_store(&f->held_slot, cr->slot);
        atomic_store(&f->held_valid, 1);
    } else {
        cfake_reply_chan(f, cr->channel, cr->slot, req->id);
    }
    attnd__request__free_unpacked(req, NULL);
}

static void cfake_open(cfake *f, const Attnd__Request *req, Attnd__Reply *rep)
{
    static Attnd__OpenChannelReply ocr;
    static char err[256];
    uint32_t id;
    attnd_err rv;
    if (f->refuse) {
        rep->code = ATTND_ERR_INVALID_ARGUMENT;
        rep->message = (char *)"body: none set";
        return;
    }
    snprintf(f->shm_name, sizeof f->shm_name, "%s", req->open_channel->shm_name);
    rv = attnd_channels_open(f->cs, req->session, 0, req->open_channel->shm_name,
                             req->open_channel->size, &id, err, sizeof err);
    if (rv != ATTND_ERR_OK) {
        rep->code = rv;
        rep->message = err;
        return;
    }
    attnd__open_channel_reply__init(&ocr);
    ocr.channel = id;
    ocr.spin_us = 1000;
    rep->body_case = ATTND__REPLY__BODY_CHANNEL;
    rep->channel = &ocr;
}

/* Attend with an INLINE output: one 64-byte output back. */
static void cfake_outputs(Attnd__Reply *rep)
{
    static Attnd__InlineOutputs io;
    static ProtobufCBinaryData data;
    static uint8_t bytes[64];
    attnd__inline_outputs__init(&io);
    data.data = bytes;
    data.len = sizeof bytes;
    io.n_data = 1;
    io.data = &data;
    rep->body_case = ATTND__REPLY__BODY_OUTPUTS;
    rep->outputs = &io;
}

static void cfake_answer(cfake *f, const Attnd__Request *req)
{
    Attnd__Reply rep = ATTND__REPLY__INIT;
    Attnd__HelloReply h = ATTND__HELLO_REPLY__INIT;
    Attnd__Limits lim = ATTND__LIMITS__INIT;
    rep.id = req->id;
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_HELLO:
        h.session = 42;
        h.protocol_version = 1;
        lim.max_seqs = 1000; /* a BeginStep of 1000 seqs: 24 KiB request areas */
        h.limits = &lim;
        rep.body_case = ATTND__REPLY__BODY_HELLO;
        rep.hello = &h;
        break;
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
        cfake_open(f, req, &rep);
        break;
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
        atomic_fetch_add(&f->closes, 1);
        rep.code = attnd_channels_close(f->cs, req->session, req->close_channel->channel, NULL, 0);
        break;
    case ATTND__REQUEST__BODY_WAKE_CHANNEL:
        atomic_fetch_add(&f->wakes, 1);
        attnd_channels_set_polling(f->cs, 1);
        rep.code = attnd_channels_check(f->cs, req->session, req->wake_channel->channel, NULL, 0);
        break;
    default:
        atomic_fetch_add(&f->sock_served, 1);
        if (req->body_case == ATTND__REQUEST__BODY_ATTEND) cfake_outputs(&rep);
        break;
    }
    cfake_pack_send(f, &rep);
}

/* The steering that does not come through a request. */
static void cfake_steer(cfake *f)
{
    if (atomic_load(&f->release) && atomic_load(&f->held_valid)) {
        atomic_store(&f->held_valid, 0);
        atomic_store(&f->release, 0);
        cfake_reply_chan(f, f->held_channel, f->held_slot, f->held_id);
    }
    if (atomic_load(&f->close_channels)) {
        attnd_channels_close_session(f->cs, 42);
        atomic_store(&f->close_channels, 0);
    }
}

static void *cfake_main(void *arg)
{
    cfake *f = arg;
    for (;;) {
        nng_msg *m;
        int flags = NNG_FLAG_NONBLOCK;
        if (f->sleepy && !attnd_channels_set_polling(f->cs, 0)) flags = 0;
        int rv = nng_recvmsg(f->sock, &m, flags);
        if (rv == 0) {
            Attnd__Request *req = attnd__request__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
            nng_msg_free(m);
            cr_assert_not_null(req);
            cfake_answer(f, req);
            attnd__request__free_unpacked(req, NULL);
        } else if (rv != NNG_EAGAIN) {
            return NULL; /* closed */
        }
        cfake_steer(f);
        attnd_channels_poll(f->cs, cfake_chan_cb, f);
        if (f->hang_up && atomic_load(&f->held_valid)) {
            usleep(100000); /* the client is waiting for the reply by now */
            nng_close(f->sock);
            return NULL;
        }
        if (flags != 0) usleep(20);
    }
}

static void cfake_start(cfake *f, int refuse, int sleepy, int hold, int hang_up)
{
    static int n;
    memset(f, 0, sizeof *f);
    f->refuse = refuse;
    f->sleepy = sleepy;
    f->hold = hold;
    f->hang_up = hang_up;
    snprintf(f->url, sizeof f->url, "ipc:///tmp/attnd-cfake-%ld-%d.sock", (long)getpid(), n++);
    cr_assert_eq(attnd_channels_alloc(&f->cs, NULL, 4, NULL), ATTND_ERR_OK);
    cr_assert_eq(nng_rep0_open(&f->sock), 0);
    cr_assert_eq(nng_listen(f->sock, f->url, NULL, 0), 0);
    cr_assert_eq(pthread_create(&f->thread, NULL, cfake_main, f), 0);
}

static void cfake_stop(cfake *f)
{
    if (!f->hang_up) nng_close(f->sock);
    pthread_join(f->thread, NULL);
    attnd_channels_free(f->cs);
    unlink(f->url + 6);
}

static attnd_client *cfake_connect(const cfake *f, int32_t slots, int32_t spin_us,
                                   int32_t timeout_ms)
{
    attnd_client_opts opts = {
        .name = "chan-test", .timeout_ms = timeout_ms, .channel_slots = slots, .spin_us = spin_us};
    attnd_client *c;
    cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_connect(c, f->url, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    return c;
}

/* An Attend whose outputs are in region 1 (the channel carries it). */
static attnd_err attend_region(attnd_client *c, attnd_ref *out_lse)
{
    int64_t shape[3] = {1, 1, 16};
    attnd_ref q, out;
    attnd_ref_region(&q, 1, 0, ATTND_DTYPE_F32, 3, shape);
    attnd_ref_region(&out, 1, 4096, ATTND_DTYPE_F32, 3, shape);
    return attnd_client_attend(c, 7, 0, &q, &q, &q, &out, out_lse);
}

Test(client_conn, channel_refused_the_socket_carries_on, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 1, 0, 0, 0);
    attnd_client *c = cfake_connect(&f, 0, 0, 5000);
    cr_assert_eq(attnd_client_channel_active(c), 0);
    cr_assert_not_null(strstr(attnd_client_channel_error(c), "body: none set"), "%s",
                       attnd_client_channel_error(c));
    /* the connect succeeded: its error message is not the channel's */
    cr_assert_str_eq(attnd_client_last_error(c), "");
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attend_region(c, NULL), ATTND_ERR_PROTOCOL); /* the fake's socket reply */
    cr_assert_eq(atomic_load(&f.sock_served), 2);
    cr_assert_eq(atomic_load(&f.chan_served), 0);
    attnd_client_free(c);
    cfake_stop(&f);
}

Test(client_conn, channel_carries_the_step_calls, .timeout = 30)
{
    cfake f;
    attnd_step_seq ss = {.seq_id = 1, .new_tokens = 1};
    attnd_step step;
    uint8_t lse[64];
    int64_t lse_shape[2] = {1, 16};
    attnd_ref rlse;
    cfake_start(&f, 0, 0, 0, 0);
    attnd_client *c = cfake_connect(&f, 2, 0, 5000);
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    cr_assert_str_eq(attnd_client_channel_error(c), "");
    /* the name is gone from /dev/shm once the daemon has it */
    cr_assert_eq(shm_open(f.shm_name, O_RDONLY, 0), -1);
    cr_assert_eq(errno, ENOENT);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_fork(c, 1, 2, NULL), ATTND_ERR_OK);
    cr_assert_eq(attend_region(c, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_free(c, 2), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.chan_served), 4);
    cr_assert_eq(atomic_load(&f.sock_served), 0);
    /* an INLINE output, a query, a BeginStep too large for a slot: the socket */
    attnd_ref_inline_out(&rlse, lse, ATTND_DTYPE_F32, 2, lse_shape);
    cr_assert_eq(attend_region(c, &rlse), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_query(c, 1, NULL), ATTND_ERR_PROTOCOL); /* no SequenceInfo */
    attnd_step_seq *many = calloc(4000, sizeof *many);
    for (int i = 0; i < 4000; i++)
        many[i] = (attnd_step_seq){.seq_id = 1000000000000ull + (uint64_t)i, .new_tokens = 1000};
    attnd_client_step_begin(c, many, 4000, &step, NULL);
    free(many);
    cr_assert_eq(atomic_load(&f.sock_served), 3);
    cr_assert_eq(atomic_load(&f.chan_served), 4);
    /* back on the channel; the reply had no step: PROTOCOL, decoded like a socket reply */
    cr_assert_eq(attnd_client_step_begin(c, &ss, 1, &step, NULL), ATTND_ERR_PROTOCOL);
    cr_assert_eq(attnd_client_step_end(c, 5, 0), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.chan_served), 6);
    /* explicit close: CloseChannel, then the socket */
    cr_assert_eq(attnd_client_channel_close(c), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_channel_active(c), 0);
    cr_assert_eq(atomic_load(&f.closes), 1);
    cr_assert_eq(attnd_client_seq_create(c, 3, NULL), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.sock_served), 4);
    cr_assert_eq(attnd_client_channel_close(c), ATTND_ERR_OK); /* none: nothing to do */
    attnd_client_free(c);
    cfake_stop(&f);
}

Test(client_conn, channel_open_explicitly, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 0, 0, 0, 0);
    attnd_client *c = cfake_connect(&f, -1, 0, 5000);
    cr_assert_eq(attnd_client_channel_active(c), 0);
    cr_assert_eq(attnd_client_channel_open(c, 65), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "channel_slots: 65"));
    cr_assert_eq(attnd_client_channel_open(c, 64), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_eq(attnd_client_channel_open(c, 1), ATTND_ERR_ALREADY_EXISTS);
    cr_assert_eq(attnd_client_channel_active(c), 1);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.chan_served), 1);
    attnd_client_free(c); /* unmaps it; the connection's close drops it in the daemon */
    cr_assert_eq(atomic_load(&f.closes), 0);
    cfake_stop(&f);
}

Test(client_conn, channel_wakes_a_sleeping_daemon, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 0, 1, 0, 0);
    attnd_client *c = cfake_connect(&f, 0, -1, 5000); /* sleeps on the futex at once */
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    for (int i = 1; i <= 5; i++) {
        usleep(10000); /* the fake is asleep by now */
        cr_assert_eq(attnd_client_seq_create(c, (uint64_t)i, NULL), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(c));
    }
    cr_assert_eq(atomic_load(&f.chan_served), 5);
    /* the fake sleeps after each request: the calls found it ASLEEP and woke it */
    cr_assert_geq(atomic_load(&f.wakes), 3);
    cr_assert_eq(atomic_load(&f.sock_served), 0);
    attnd_client_free(c);
    cfake_stop(&f);
}

/* A call that times out leaves its slot stale: the next call takes the socket (one slot) until
 * the late reply frees it. */
Test(client_conn, channel_timeout_leaves_the_slot_stale, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 0, 0, 1, 0);
    attnd_client *c = cfake_connect(&f, 1, 100, 5000);
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    attnd_client_set_timeout(c, 200);
    double t = now_s();
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_TIMEOUT);
    t = now_s() - t;
    cr_assert(t >= 0.15 && t < 3.0, "timed out after %.3f s", t);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "create: no reply in time"), "%s",
                       attnd_client_last_error(c));
    cr_assert_eq(atomic_load(&f.chan_served), 1);
    /* the only slot is stale: the socket */
    cr_assert_eq(attnd_client_seq_create(c, 2, NULL), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.sock_served), 1);
    /* the late reply comes: the slot is free again, and its reply is not taken for another's */
    atomic_store(&f.release, 1);
    while (atomic_load(&f.release))
        usleep(1000);
    f.hold = 0; /* (the fake reads it only when taking a request) */
    cr_assert_eq(attnd_client_seq_create(c, 3, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    cr_assert_eq(atomic_load(&f.chan_served), 2);
    cr_assert_eq(atomic_load(&f.sock_served), 1);
    attnd_client_free(c);
    cfake_stop(&f);
}

Test(client_conn, channel_call_fails_at_once_when_the_connection_drops, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 0, 0, 0, 1);
    attnd_client *c = cfake_connect(&f, 0, 0, 20000);
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    double t = now_s();
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_UNAVAILABLE);
    t = now_s() - t;
    cr_assert_lt(t, 5.0, "the call waited %.1f s for a connection that was gone", t);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "lost"), "%s",
                       attnd_client_last_error(c));
    cr_assert_eq(attnd_client_seq_create(c, 2, NULL), ATTND_ERR_UNAVAILABLE);
    attnd_client_free(c);
    cfake_stop(&f);
}

Test(client_conn, channel_closed_by_the_daemon, .timeout = 30)
{
    cfake f;
    cfake_start(&f, 0, 0, 0, 0);
    attnd_client *c = cfake_connect(&f, 0, 0, 5000);
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    atomic_store(&f.close_channels, 1);
    while (atomic_load(&f.close_channels))
        usleep(1000);
    cr_assert_eq(attnd_client_seq_create(c, 2, NULL), ATTND_ERR_UNAVAILABLE);
    cr_assert_not_null(strstr(attnd_client_last_error(c), "channel: closed by the daemon"), "%s",
                       attnd_client_last_error(c));
    cr_assert_eq(attnd_client_channel_active(c), 0);
    /* later calls take the socket */
    cr_assert_eq(attnd_client_seq_create(c, 3, NULL), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&f.sock_served), 1);
    attnd_client_free(c);
    cr_assert_eq(atomic_load(&f.closes), 0);
    cfake_stop(&f);
}
