/* Shared-memory channels (daemon/channel.c) without a daemon: the test plays the client, making
 * objects laid out as proto/attnd_channel.h says. Open and every validation error (exact codes,
 * the field named), requests taken exactly once (several slots and channels, a busy slot skipped
 * until its reply), replies published, malformed lengths handed on, sessions and limits, the
 * sleep protocol, the futex wake, and a client truncating its object under a real SIGBUS guard.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "attnd_channel.h"
#include "wire/channel.h"
#include "core/shmguard.h"

#define REQ_BYTES 256u
#define REP_BYTES 512u

/* The client's side of one object. The name stays linked until obj_destroy. */
typedef struct obj {
    char name[64];
    int fd;
    void *base;
    size_t size;
    uint32_t nslots;
} obj;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An object of `size` bytes (0 = what the layout needs) with a valid header. */
static void obj_make_sized(obj *o, uint32_t nslots, size_t size)
{
    static int counter;
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "/attnd-test-ch-%ld-%d", (long)getpid(), counter++);
    o->nslots = nslots;
    o->size = size ? size : (size_t)attnd_channel_size(nslots, REQ_BYTES, REP_BYTES);
    shm_unlink(o->name);
    o->fd = shm_open(o->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(o->fd, 0);
    cr_assert_eq(ftruncate(o->fd, (off_t)o->size), 0);
    o->base = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    cr_assert_neq(o->base, MAP_FAILED);
    attnd_channel_header *h = o->base;
    h->magic = ATTND_CHANNEL_MAGIC;
    h->version = ATTND_CHANNEL_VERSION;
    h->nslots = nslots;
    h->req_bytes = REQ_BYTES;
    h->rep_bytes = REP_BYTES;
}

static void obj_make(obj *o, uint32_t nslots)
{
    obj_make_sized(o, nslots, 0);
}

static void obj_destroy(obj *o)
{
    munmap(o->base, o->size);
    close(o->fd);
    shm_unlink(o->name);
}

static attnd_channel_header *hdr(const obj *o)
{
    return o->base;
}

static attnd_channel_slot *slot(const obj *o, uint32_t i)
{
    return attnd_channel_slot_at(o->base, i);
}

static uint8_t *req_area(const obj *o, uint32_t i)
{
    return attnd_channel_req_area(o->base, o->nslots, REQ_BYTES, REP_BYTES, i);
}

static uint8_t *rep_area(const obj *o, uint32_t i)
{
    return attnd_channel_rep_area(o->base, o->nslots, REQ_BYTES, REP_BYTES, i);
}

/* Post a request as the client does: bytes, req_len, then req_seq + 1. Returns the seq. */
static uint32_t post_len(const obj *o, uint32_t i, const char *text, uint32_t len)
{
    attnd_channel_slot *s = slot(o, i);
    uint32_t n = atomic_load(&s->req_seq) + 1;
    if (n == 0) n = 1;
    memcpy(req_area(o, i), text, strlen(text));
    s->req_len = len;
    atomic_store(&s->req_seq, n);
    return n;
}

static uint32_t post(const obj *o, uint32_t i, const char *text)
{
    return post_len(o, i, text, (uint32_t)strlen(text));
}

/* What poll handed over. */
typedef struct taken {
    int n;
    attnd_channel_req req[16];
    char text[16][64];
} taken;

static void collect_cb(void *arg, const attnd_channel_req *req)
{
    taken *t = arg;
    cr_assert_lt(t->n, 16);
    t->req[t->n] = *req;
    if (req->bytes != NULL) {
        size_t n = req->len < 63 ? req->len : 63;
        memcpy(t->text[t->n], req->bytes, n);
        t->text[t->n][n] = '\0';
    }
    t->n++;
}

static attnd_channels *channels(uint32_t max)
{
    attnd_channels *cs;
    cr_assert_eq(attnd_channels_alloc(&cs, NULL, max, NULL), ATTND_ERR_OK);
    return cs;
}

static uint32_t open_ok(attnd_channels *cs, uint64_t session, const obj *o)
{
    char err[256] = "";
    uint32_t id = 0;
    cr_assert_eq(attnd_channels_open(cs, session, 7, o->name, o->size, &id, err, sizeof err),
                 ATTND_ERR_OK, "%s", err);
    cr_assert_gt(id, 0);
    return id;
}

/* open fails with code and a message containing want. */
static void open_fails(attnd_channels *cs, const char *name, uint64_t size, attnd_err code,
                       const char *want)
{
    char err[256] = "";
    uint32_t id = 99, before = attnd_channels_count(cs);
    cr_assert_eq(attnd_channels_open(cs, 1, 7, name, size, &id, err, sizeof err), code, "%s: %s",
                 want, err);
    cr_assert_not_null(strstr(err, want), "wanted \"%s\" in \"%s\"", want, err);
    cr_assert_eq(id, 99);
    cr_assert_eq(attnd_channels_count(cs), before);
}

Test(channel, open_ok, .timeout = 30)
{
    obj o;
    attnd_channels *cs = channels(4);
    char err[128];
    obj_make(&o, 3);
    uint32_t id = open_ok(cs, 5, &o);
    cr_assert_eq(attnd_channels_count(cs), 1);
    cr_assert_eq(atomic_load(&hdr(&o)->daemon_state), ATTND_CHANNEL_DAEMON_POLLING);
    cr_assert_eq(attnd_channels_rep_bytes(cs, id), REP_BYTES);
    cr_assert_eq(attnd_channels_rep_bytes(cs, id + 1), 0);
    cr_assert_eq(attnd_channels_check(cs, 5, id, err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_check(cs, 6, id, err, sizeof err), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_channels_check(cs, 5, id + 1, err, sizeof err), ATTND_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(err, "channel"));
    attnd_channels_free(cs);
    cr_assert_eq(atomic_load(&hdr(&o)->daemon_state), ATTND_CHANNEL_DAEMON_CLOSED);
    obj_destroy(&o);
}

/* An object with one header field (or its size) wrong is refused, naming the field. */
Test(channel, open_rejects_bad_headers, .timeout = 30)
{
    obj o;
    attnd_channels *cs = channels(4);
    char want[96];
    obj_make(&o, 2);
    hdr(&o)->magic ^= 1;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT, "header.magic");
    hdr(&o)->magic ^= 1;
    hdr(&o)->version = 2;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT, "header.version: 2");
    hdr(&o)->version = ATTND_CHANNEL_VERSION;
    hdr(&o)->nslots = 0;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT, "header.nslots: 0 out of 1..64");
    hdr(&o)->nslots = 65;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT, "header.nslots: 65 out of 1..64");
    hdr(&o)->nslots = 2;
    hdr(&o)->req_bytes = 300;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT,
               "header.req_bytes: 300 is not a multiple of 64");
    hdr(&o)->req_bytes = REQ_BYTES;
    hdr(&o)->rep_bytes = 128;
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT, "header.rep_bytes: 128 out of");
    hdr(&o)->rep_bytes = REP_BYTES;
    /* a size that is not the object's */
    open_fails(cs, o.name, o.size + 64, ATTND_ERR_INVALID_ARGUMENT, "size: ");
    obj_destroy(&o);
    /* an object whose size is not the header's layout */
    obj_make_sized(&o, 2, 4096);
    snprintf(want, sizeof want, "size: 4096 but the header's layout needs %llu",
             (unsigned long long)attnd_channel_size(2, REQ_BYTES, REP_BYTES));
    open_fails(cs, o.name, 4096, ATTND_ERR_INVALID_ARGUMENT, want);
    obj_destroy(&o);
    /* too small for a header */
    obj_make_sized(&o, 2, 32);
    open_fails(cs, o.name, 32, ATTND_ERR_INVALID_ARGUMENT, "size: 32");
    obj_destroy(&o);
    attnd_channels_free(cs);
}

Test(channel, open_rejects_names, .timeout = 30)
{
    attnd_channels *cs = channels(4);
    open_fails(cs, "/attnd-test-ch-nobody-made-this", 4096, ATTND_ERR_NOT_FOUND,
               "shm_name: /attnd-test-ch-nobody-made-this: no such");
    open_fails(cs, "no-slash", 4096, ATTND_ERR_INVALID_ARGUMENT, "shm_name: \"no-slash\"");
    open_fails(cs, "/a/b", 4096, ATTND_ERR_INVALID_ARGUMENT, "shm_name: \"/a/b\"");
    open_fails(cs, "", 4096, ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    attnd_channels_free(cs);
}

Test(channel, open_rejects_a_posted_request, .timeout = 30)
{
    obj o;
    attnd_channels *cs = channels(4);
    obj_make(&o, 3);
    atomic_store(&slot(&o, 1)->req_seq, 5);
    atomic_store(&slot(&o, 1)->rep_seq, 4);
    open_fails(cs, o.name, o.size, ATTND_ERR_INVALID_ARGUMENT,
               "slot[1].req_seq: 5 but rep_seq is 4");
    /* equal but non-zero seqs are fine: the daemon starts from them */
    atomic_store(&slot(&o, 1)->rep_seq, 5);
    open_ok(cs, 1, &o);
    attnd_channels_free(cs);
    obj_destroy(&o);
}

Test(channel, poll_takes_each_request_once, .timeout = 30)
{
    obj a, b;
    taken t = {0};
    attnd_channels *cs = channels(4);
    obj_make(&a, 3);
    obj_make(&b, 2);
    uint32_t ida = open_ok(cs, 10, &a), idb = open_ok(cs, 11, &b);
    cr_assert_neq(ida, idb);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0);
    post(&a, 0, "a0");
    post(&a, 2, "a2");
    post(&b, 1, "b1");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 3);
    cr_assert_eq(t.n, 3);
    cr_assert_eq(t.req[0].channel, ida);
    cr_assert_eq(t.req[0].slot, 0);
    cr_assert_eq(t.req[0].session, 10);
    cr_assert_eq(t.req[0].pipe, 7);
    cr_assert_str_eq(t.text[0], "a0");
    cr_assert_eq(t.req[1].slot, 2);
    cr_assert_str_eq(t.text[1], "a2");
    cr_assert_eq(t.req[2].channel, idb);
    cr_assert_eq(t.req[2].slot, 1);
    cr_assert_eq(t.req[2].session, 11);
    cr_assert_str_eq(t.text[2], "b1");
    /* nothing new */
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0);
    /* a slot taken and not answered is skipped, even when its req_seq moves again */
    post(&a, 0, "again");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0);
    cr_assert_eq(attnd_channels_reply(cs, ida, 0, "r", 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_str_eq(t.text[3], "again");
    attnd_channels_free(cs);
    obj_destroy(&a);
    obj_destroy(&b);
}

/* server.max_inflight_per_session: a session at its bound keeps its posts waiting in their slots
 * (not refused) while another session's are taken; each reply frees room for one more. */
Test(channel, a_session_at_its_bound_waits_and_others_go_on, .timeout = 30)
{
    obj a, b, c;
    taken t = {0};
    attnd_channels *cs = channels(4);
    attnd_channels_set_session_limit(cs, 3);
    obj_make(&a, 4);
    obj_make(&b, 4);
    obj_make(&c, 2);
    uint32_t ida = open_ok(cs, 10, &a), idb = open_ok(cs, 10, &b), idc = open_ok(cs, 11, &c);
    const char *names[4] = {"a0", "a1", "a2", "a3"};
    for (uint32_t i = 0; i < 4; i++) {
        post(&a, i, names[i]);
        post(&b, i, "b");
    }
    post(&c, 0, "c0");
    post(&c, 1, "c1");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 5);
    cr_assert_str_eq(t.text[2], "a2");
    cr_assert_eq(t.req[3].channel, idc);
    cr_assert_eq(t.req[4].channel, idc);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0, "session 10 is at its bound");
    cr_assert_eq(attnd_channels_reply(cs, ida, 0, "r", 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_str_eq(t.text[5], "a3");
    /* session 11's slots answered and posted again are taken whatever session 10 holds */
    cr_assert_eq(attnd_channels_reply(cs, idc, 0, "r", 1), ATTND_ERR_OK);
    post(&c, 0, "c2");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_str_eq(t.text[6], "c2");
    /* two replies, two of channel b's waiting posts */
    cr_assert_eq(attnd_channels_reply(cs, ida, 1, "r", 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_reply(cs, ida, 2, "r", 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 2);
    cr_assert_eq(t.req[7].channel, idb);
    cr_assert_eq(t.req[8].channel, idb);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0);
    attnd_channels_free(cs);
    obj_destroy(&a);
    obj_destroy(&b);
    obj_destroy(&c);
}

Test(channel, reply_publishes, .timeout = 30)
{
    obj o;
    taken t = {0};
    uint8_t big[REP_BYTES + 1];
    attnd_channels *cs = channels(4);
    obj_make(&o, 2);
    uint32_t id = open_ok(cs, 1, &o);
    uint32_t n = post(&o, 1, "request");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_eq(atomic_load(&slot(&o, 1)->rep_seq), 0);
    /* too long: nothing written, the slot still waits for its reply */
    memset(big, 'x', sizeof big);
    cr_assert_eq(attnd_channels_reply(cs, id, 1, big, sizeof big), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(atomic_load(&slot(&o, 1)->rep_seq), 0);
    cr_assert_eq(rep_area(&o, 1)[0], 0);
    /* no such channel / slot / request taken */
    cr_assert_eq(attnd_channels_reply(cs, id + 1, 1, "x", 1), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_channels_reply(cs, id, 0, "x", 1), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_channels_reply(cs, id, 2, "x", 1), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_channels_reply(cs, id, 1, "the reply", 9), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&slot(&o, 1)->rep_seq), n);
    cr_assert_eq(slot(&o, 1)->rep_len, 9);
    cr_assert_eq(memcmp(rep_area(&o, 1), "the reply", 9), 0);
    /* answered once: a second reply has no request */
    cr_assert_eq(attnd_channels_reply(cs, id, 1, "x", 1), ATTND_ERR_NOT_FOUND);
    /* a reply of exactly rep_bytes fits */
    post(&o, 1, "next");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_eq(attnd_channels_reply(cs, id, 1, big, REP_BYTES), ATTND_ERR_OK);
    cr_assert_eq(slot(&o, 1)->rep_len, REP_BYTES);
    attnd_channels_free(cs);
    obj_destroy(&o);
}

/* req_len 0 or over req_bytes: handed on without bytes, for the caller's error reply. */
Test(channel, bad_request_lengths_come_without_bytes, .timeout = 30)
{
    obj o;
    taken t = {0};
    attnd_channels *cs = channels(4);
    obj_make(&o, 2);
    uint32_t id = open_ok(cs, 1, &o);
    post_len(&o, 0, "", 0);
    post_len(&o, 1, "x", REQ_BYTES + 1);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 2);
    cr_assert_null(t.req[0].bytes);
    cr_assert_eq(t.req[0].len, 0);
    cr_assert_null(t.req[1].bytes);
    cr_assert_eq(t.req[1].len, REQ_BYTES + 1);
    /* a request of exactly req_bytes is fine */
    cr_assert_eq(attnd_channels_reply(cs, id, 0, "e", 1), ATTND_ERR_OK);
    post_len(&o, 0, "y", REQ_BYTES);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_not_null(t.req[2].bytes);
    cr_assert_eq(t.req[2].len, REQ_BYTES);
    cr_assert_eq(attnd_channels_count(cs), 1);
    attnd_channels_free(cs);
    obj_destroy(&o);
}

Test(channel, close_and_sessions, .timeout = 30)
{
    obj a, b, c;
    taken t = {0};
    char err[128];
    attnd_channels *cs = channels(4);
    obj_make(&a, 1);
    obj_make(&b, 1);
    obj_make(&c, 1);
    uint32_t ida = open_ok(cs, 1, &a), idb = open_ok(cs, 1, &b), idc = open_ok(cs, 2, &c);
    (void)ida;
    (void)idb;
    cr_assert_eq(attnd_channels_count(cs), 3);
    post(&a, 0, "a");
    post(&c, 0, "c");
    attnd_channels_close_session(cs, 1);
    cr_assert_eq(attnd_channels_count(cs), 1);
    cr_assert_eq(atomic_load(&hdr(&a)->daemon_state), ATTND_CHANNEL_DAEMON_CLOSED);
    cr_assert_eq(atomic_load(&hdr(&b)->daemon_state), ATTND_CHANNEL_DAEMON_CLOSED);
    cr_assert_eq(atomic_load(&hdr(&c)->daemon_state), ATTND_CHANNEL_DAEMON_POLLING);
    /* only session 2's request is still seen */
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_eq(t.req[0].channel, idc);
    /* another session cannot close it */
    cr_assert_eq(attnd_channels_close(cs, 1, idc, err, sizeof err), ATTND_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(err, "channel"), "%s", err);
    cr_assert_eq(attnd_channels_close(cs, 2, idc + 1, err, sizeof err), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_channels_close(cs, 2, idc, err, sizeof err), ATTND_ERR_OK);
    cr_assert_eq(atomic_load(&hdr(&c)->daemon_state), ATTND_CHANNEL_DAEMON_CLOSED);
    cr_assert_eq(attnd_channels_count(cs), 0);
    /* the answer to a request taken before the close goes nowhere */
    cr_assert_eq(attnd_channels_reply(cs, idc, 0, "x", 1), ATTND_ERR_NOT_FOUND);
    attnd_channels_free(cs);
    obj_destroy(&a);
    obj_destroy(&b);
    obj_destroy(&c);
}

Test(channel, max_channels, .timeout = 30)
{
    obj o[3];
    char err[128];
    attnd_channels *cs = channels(2);
    for (int i = 0; i < 3; i++)
        obj_make(&o[i], 1);
    uint32_t id0 = open_ok(cs, 1, &o[0]), id1 = open_ok(cs, 1, &o[1]);
    open_fails(cs, o[2].name, o[2].size, ATTND_ERR_UNAVAILABLE, "channels: all 2 in use");
    cr_assert_eq(attnd_channels_close(cs, 1, id0, err, sizeof err), ATTND_ERR_OK);
    /* room again; ids are not reused */
    uint32_t id2 = open_ok(cs, 1, &o[2]);
    cr_assert_neq(id2, id0);
    cr_assert_neq(id2, id1);
    attnd_channels_free(cs);
    for (int i = 0; i < 3; i++)
        obj_destroy(&o[i]);
}

/* A session holds ATTND_CHANNELS_PER_SESSION at most (server.channels is everyone's); an
 * object that is a channel already is refused, in any session. */
Test(channel, per_session_cap_and_one_channel_per_object, .timeout = 30)
{
    obj o[ATTND_CHANNELS_PER_SESSION + 1];
    attnd_channels *cs = channels(16);
    for (uint32_t i = 0; i <= ATTND_CHANNELS_PER_SESSION; i++)
        obj_make(&o[i], 1);
    for (uint32_t i = 0; i < ATTND_CHANNELS_PER_SESSION; i++)
        open_ok(cs, 1, &o[i]);
    open_fails(cs, o[ATTND_CHANNELS_PER_SESSION].name, o[ATTND_CHANNELS_PER_SESSION].size,
               ATTND_ERR_UNAVAILABLE, "the session has 4 open");
    open_ok(cs, 2, &o[ATTND_CHANNELS_PER_SESSION]); /* another session still can */
    char err[256] = "";
    uint32_t id = 0;
    cr_assert_eq(attnd_channels_open(cs, 3, 7, o[0].name, o[0].size, &id, err, sizeof err),
                 ATTND_ERR_ALREADY_EXISTS);
    cr_assert_not_null(strstr(err, "shm_name"), "%s", err);
    cr_assert_eq(attnd_channels_count(cs), ATTND_CHANNELS_PER_SESSION + 1);
    attnd_channels_free(cs);
    for (uint32_t i = 0; i <= ATTND_CHANNELS_PER_SESSION; i++)
        obj_destroy(&o[i]);
}

Test(channel, channels_off, .timeout = 30)
{
    obj o;
    attnd_channels *cs = channels(0);
    obj_make(&o, 1);
    open_fails(cs, o.name, o.size, ATTND_ERR_UNAVAILABLE, "channels: off (server.channels = 0)");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, NULL), 0);
    cr_assert_eq(attnd_channels_set_polling(cs, 0), 0);
    attnd_channels_free(cs);
    attnd_channels_free(NULL);
    obj_destroy(&o);
}

/* Going to sleep looks once more: a request posted after ASLEEP was stored keeps it awake. */
Test(channel, sleep_protocol, .timeout = 30)
{
    obj a, b;
    taken t = {0};
    attnd_channels *cs = channels(4);
    obj_make(&a, 2);
    obj_make(&b, 2);
    uint32_t ida = open_ok(cs, 1, &a);
    open_ok(cs, 1, &b);
    cr_assert_eq(attnd_channels_set_polling(cs, 0), 0);
    cr_assert_eq(atomic_load(&hdr(&a)->daemon_state), ATTND_CHANNEL_DAEMON_ASLEEP);
    cr_assert_eq(atomic_load(&hdr(&b)->daemon_state), ATTND_CHANNEL_DAEMON_ASLEEP);
    /* the client posts and reads ASLEEP (it would send WakeChannel); the daemon's check catches
     * it anyway */
    post(&b, 1, "late");
    cr_assert_eq(attnd_channels_set_polling(cs, 0), 1);
    cr_assert_eq(atomic_load(&hdr(&a)->daemon_state), ATTND_CHANNEL_DAEMON_POLLING);
    cr_assert_eq(atomic_load(&hdr(&b)->daemon_state), ATTND_CHANNEL_DAEMON_POLLING);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    /* a request taken and not answered does not keep it awake */
    cr_assert_eq(attnd_channels_set_polling(cs, 0), 0);
    post(&a, 0, "x");
    cr_assert_eq(attnd_channels_set_polling(cs, 1), 0);
    cr_assert_eq(atomic_load(&hdr(&a)->daemon_state), ATTND_CHANNEL_DAEMON_POLLING);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_eq(t.req[1].channel, ida);
    attnd_channels_free(cs);
    obj_destroy(&a);
    obj_destroy(&b);
}

/* A client asleep on rep_seq, as the library does it. */
typedef struct waiter {
    const obj *o;
    uint32_t want;
    double woke;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    attnd_channel_slot *s = slot(w->o, 0);
    struct timespec ts = {.tv_sec = 10};
    atomic_store(&s->client_waiting, 1);
    for (;;) {
        uint32_t cur = atomic_load(&s->rep_seq);
        if (cur == w->want) break;
        syscall(SYS_futex, (uint32_t *)&s->rep_seq, FUTEX_WAIT, cur, &ts, NULL, 0);
    }
    w->woke = now_s();
    atomic_store(&s->client_waiting, 0);
    return NULL;
}

Test(channel, reply_wakes_a_sleeping_client, .timeout = 30)
{
    obj o;
    taken t = {0};
    pthread_t th;
    attnd_channels *cs = channels(4);
    obj_make(&o, 1);
    uint32_t id = open_ok(cs, 1, &o);
    waiter w = {.o = &o, .want = post(&o, 0, "sleepy")};
    cr_assert_eq(pthread_create(&th, NULL, waiter_main, &w), 0);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    /* let it reach FUTEX_WAIT (its timeout is 10 s) */
    while (atomic_load(&slot(&o, 0)->client_waiting) == 0)
        usleep(1000);
    usleep(100000);
    double sent = now_s();
    cr_assert_eq(attnd_channels_reply(cs, id, 0, "up", 2), ATTND_ERR_OK);
    pthread_join(th, NULL);
    cr_assert_lt(w.woke - sent, 1.0, "woke %.3f s after the reply", w.woke - sent);
    attnd_channels_free(cs);
    obj_destroy(&o);
}

/* A client that truncates its object: the guard absorbs the fault, poll drops the channel. */
Test(channel, truncated_object_is_dropped, .timeout = 30)
{
    obj o, other;
    taken t = {0};
    attnd_shmguard *g;
    attnd_channels *cs;
    attnd_log lg;
    char line[1024] = "";
    FILE *logf = tmpfile();
    cr_assert_not_null(logf);
    attnd_log_init(&lg, ATTND_LOG_WARN, logf);
    cr_assert_eq(attnd_shmguard_alloc(&g, 8), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_alloc(&cs, g, 4, &lg), ATTND_ERR_OK);
    obj_make(&o, 2);
    obj_make(&other, 1);
    uint32_t id = open_ok(cs, 33, &o);
    open_ok(cs, 34, &other);
    post(&o, 1, "doomed");
    post(&other, 0, "fine");
    /* the test's own mapping is not guarded: never touch it again */
    cr_assert_eq(ftruncate(o.fd, 0), 0);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_str_eq(t.text[0], "fine");
    cr_assert_eq(attnd_channels_count(cs), 1);
    cr_assert_geq(attnd_shmguard_faults(g), 1);
    cr_assert_eq(attnd_channels_reply(cs, id, 1, "x", 1), ATTND_ERR_NOT_FOUND);
    fflush(logf);
    rewind(logf);
    cr_assert_not_null(fgets(line, sizeof line, logf));
    cr_assert_not_null(strstr(line, "event=channel_broken"), "%s", line);
    cr_assert_not_null(strstr(line, "session=33"), "%s", line);
    attnd_channels_free(cs);
    attnd_shmguard_free(g);
    fclose(logf);
    munmap(o.base, o.size);
    close(o.fd);
    shm_unlink(o.name);
    obj_destroy(&other);
}

/* A truncation after a request was taken: the reply finds the channel broken. */
Test(channel, truncated_before_the_reply, .timeout = 30)
{
    obj o;
    taken t = {0};
    attnd_shmguard *g;
    attnd_channels *cs;
    cr_assert_eq(attnd_shmguard_alloc(&g, 8), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_alloc(&cs, g, 4, NULL), ATTND_ERR_OK);
    obj_make(&o, 1);
    uint32_t id = open_ok(cs, 1, &o);
    post(&o, 0, "req");
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 1);
    cr_assert_eq(ftruncate(o.fd, 0), 0);
    /* the reply's write faults, lands in the guard's zero pages; the next poll drops it */
    cr_assert_eq(attnd_channels_reply(cs, id, 0, "rep", 3), ATTND_ERR_OK);
    cr_assert_eq(attnd_channels_poll(cs, collect_cb, &t), 0);
    cr_assert_eq(attnd_channels_count(cs), 0);
    cr_assert_eq(attnd_shmguard_faults(g), 1);
    attnd_channels_free(cs);
    attnd_shmguard_free(g);
    munmap(o.base, o.size);
    close(o.fd);
    shm_unlink(o.name);
}
