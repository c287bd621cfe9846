/* libattnd-client on its own, against a fake daemon (an NNG REP socket in a thread) that answers
 * exactly what each test scripts: reply ids checked, error replies passed through with their
 * message, undecodable and mismatched replies, timeouts, a dropped connection failing the call
 * in flight at once, inline outputs of the wrong size, and the local errors (no daemon, bad
 * URLs, TLS without a CA, calls before dialing). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"

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
    attnd_client_opts opts = {.name = "conn-test", .timeout_ms = timeout_ms};
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
    float q[64], out[16];
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
