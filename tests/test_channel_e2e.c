/* Shared-memory channels against the real daemon (CPU backend, a real ipc:// socket, real shm
 * objects). A hostile client (no library channel: channel_slots = -1) builds its own objects as
 * proto/attnd_channel.h lays them out, registers them with a hand-built OpenChannel through the
 * library's raw rpc, and then writes slots by hand: bad headers, garbage, truncated and unknown
 * protobuf, bad lengths, socket-only requests, another session's requests, double posts, a
 * truncated object, other sessions' channel ids, a second channel on the same object, a forked
 * client that exits mid-request, an executor asleep. Each gets its exact code and a message
 * naming the problem, in its slot or on the socket; a well-behaved client (the library's own
 * channel) runs real steps checked against the CPU op and the float64 reference after every
 * hostile action; at the end nothing is lost (every block free, no sequence left) and the
 * daemon exits 0 on SIGTERM. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/client_int.h"
#include "attnd.pb-c.h"
#include "attnd_channel.h"
#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "testutil.h"
#include "suite.h"

/* Small CPU geometry; sessions of dropped connections reclaimed after 300 ms; warnings logged
 * (event=channel_broken is one). */
#define CONFIG_WITH(server_extra)                                                                  \
    "{\"backend\": \"cpu\", \"threads\": 2,"                                                       \
    " \"server\": {\"listen\": \"@URL@\"" server_extra "},"                                        \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 64},"                                                                \
    " \"limits\": {\"reclaim_timeout_ms\": 300},"                                                  \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"
#define CONFIG CONFIG_WITH("")
/* the executor sleeps as soon as it has nothing to do */
#define CONFIG_SPIN0 CONFIG_WITH(", \"spin_us\": 0")
/* few channels, all sessions together */
#define CONFIG_FEW_CHANNELS CONFIG_WITH(", \"channels\": 4")

#define REPLY_TIMEOUT_MS 5000
#define MAX_GOOD_STEPS 60

/* The forked child (test 9) re-executes this binary with these set: see child_main. */
#define CHILD_URL_ENV "ATTND_CHANNEL_E2E_CHILD_URL"
#define CHILD_FD_ENV "ATTND_CHANNEL_E2E_CHILD_FD"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- the daemon's fate */

/* The daemon of the running test, for failure messages (and the cleanup after a failure). */
static attnd_daemon_proc *cur_daemon;

/* "alive", or how it ended (without reaping it: attnd_daemon_stop still does). */
static const char *daemon_fate(void)
{
    static char buf[64];
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (cur_daemon == NULL || cur_daemon->pid <= 0) return "not running";
    if (waitid(P_PID, (id_t)cur_daemon->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid == 0)
        return "alive";
    if (si.si_code == CLD_EXITED)
        snprintf(buf, sizeof buf, "DEAD (exit %d)", si.si_status);
    else
        snprintf(buf, sizeof buf, "DEAD (signal %d)", si.si_status);
    return buf;
}

/* ---------------------------------------------------------------- shm names */

/* Every name this test creates, unlinked after each test whatever happened. */
static char shm_names[64][64];
static int nshm_names;

static void name_new(char *out, size_t n)
{
    static int counter;
    snprintf(out, n, "/attnd-c3e2e-%ld-%d", (long)getpid(), counter++);
    if (nshm_names < 64) snprintf(shm_names[nshm_names++], sizeof shm_names[0], "%s", out);
}

/* After every test: its shm names unlinked; a daemon a failed test left running is shown (its
 * log), killed and its files removed. */
static void suite_fini(void)
{
    for (int i = 0; i < nshm_names; i++)
        shm_unlink(shm_names[i]);
    nshm_names = 0;
    if (cur_daemon != NULL) {
        attnd_daemon_dump_log(cur_daemon);
        if (cur_daemon->pid > 0) {
            kill(cur_daemon->pid, SIGKILL);
            waitpid(cur_daemon->pid, NULL, 0);
            cur_daemon->pid = 0;
        }
        (void)attnd_daemon_stop(cur_daemon); /* reaped: only removes its files */
        cur_daemon = NULL;
    }
}

TestSuite(channel_e2e, .fini = suite_fini);

/* ---------------------------------------------------------------- the well-behaved client */

/* The library's default client: its channel opened by connect; two sequences it decodes. */
typedef struct good {
    attnd_client *c;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    int steps;
} good;

static void good_check_errs(const good *g, const char *after)
{
    cr_assert_leq(g->errs.direct, attnd_e2e_direct_tol(ATTND_DTYPE_F32),
                  "good client after %s: out vs CPU op %.3g", after, g->errs.direct);
    cr_assert_leq(g->errs.direct_lse, ATTND_E2E_DIRECT_LSE_TOL,
                  "good client after %s: lse vs CPU op %.3g", after, g->errs.direct_lse);
    cr_assert_leq(g->errs.ref, attnd_tol_for(ATTND_DTYPE_F32),
                  "good client after %s: out vs reference %.3g", after, g->errs.ref);
    cr_assert_leq(g->errs.ref_lse, ATTND_E2E_REF_LSE_TOL,
                  "good client after %s: lse vs reference %.3g", after, g->errs.ref_lse);
}

/* One decode step of both sequences, HOST_SHM (through the channel) and INLINE (the socket)
 * taking turns; every output checked. */
static void good_step(good *g, const char *after)
{
    attnd_step_seq decode[2] = {{1, 1}, {2, 1}};
    cr_assert_lt(g->steps, MAX_GOOD_STEPS, "more good steps than MAX_GOOD_STEPS");
    attnd_err rv = attnd_e2e_step(g->c, &g->m, &g->shm, ATTND_DTYPE_F32, g->steps % 2, decode, 2, 0,
                                  &g->r, &g->errs);
    cr_assert_eq(rv, ATTND_ERR_OK, "good client step after %s: %s (%s); daemon %s", after,
                 attnd_err_name(rv), attnd_client_last_error(g->c), daemon_fate());
    cr_assert(attnd_client_channel_active(g->c), "good client lost its channel after %s", after);
    g->steps++;
    good_check_errs(g, after);
}

static void good_start(good *g, const attnd_daemon_proc *d)
{
    attnd_step_seq prefill[2] = {{1, 20}, {2, 33}};
    memset(g, 0, sizeof *g);
    attnd_test_mirror_client(d, NULL, 40 + MAX_GOOD_STEPS, ATTND_DTYPE_F32, 64, &g->c, &g->m,
                             &g->shm);
    cr_assert(attnd_client_channel_active(g->c), "no channel: %s",
              attnd_client_channel_error(g->c));
    attnd_test_mirror_seqs(g->c, &g->m, 2);
    attnd_rng_seed(&g->r, 41);
    cr_assert_eq(
        attnd_e2e_step(g->c, &g->m, &g->shm, ATTND_DTYPE_F32, 0, prefill, 2, 0, &g->r, &g->errs),
        ATTND_ERR_OK, "prefill: %s", attnd_client_last_error(g->c));
}

/* Blocks the good client's two sequences hold; their tokens must be the mirror's. */
static uint32_t good_blocks(good *g)
{
    uint32_t blocks = 0;
    for (uint64_t id = 1; id <= 2; id++) {
        attnd_seq_info info;
        cr_assert_eq(attnd_client_seq_query(g->c, id, &info), ATTND_ERR_OK);
        cr_assert_eq((int32_t)info.num_tokens, attnd_mirror_len(&g->m, id),
                     "good sequence %llu has %u tokens, expected %d", (unsigned long long)id,
                     info.num_tokens, attnd_mirror_len(&g->m, id));
        cr_assert_eq(info.step, 0);
        blocks += info.num_blocks;
    }
    return blocks;
}

/* Poll Status (up to 5 s: reclaims run on the daemon's 100 ms tick) until the daemon holds
 * exactly what is expected: `sessions` sessions, `seqs` sequences and every block but `held`
 * free. */
static void expect_pool(good *g, uint32_t sessions, uint32_t seqs, uint32_t held, const char *when)
{
    attnd_status st;
    int64_t deadline = now_ms() + 5000;
    for (;;) {
        cr_assert_eq(attnd_client_status(g->c, &st), ATTND_ERR_OK);
        if (st.num_sessions == sessions && st.num_sequences == seqs &&
            st.blocks_free == st.geometry.num_blocks - held)
            return;
        if (now_ms() > deadline) break;
        sleep_us(20000);
    }
    cr_assert_fail("%s: %u sessions, %u sequences, %u of %u blocks free; expected %u, %u, %u", when,
                   st.num_sessions, st.num_sequences, st.blocks_free, st.geometry.num_blocks,
                   sessions, seqs, st.geometry.num_blocks - held);
}

/* ---------------------------------------------------------------- hand-made channels */

typedef struct hchan {
    char name[64];
    int fd;
    void *base;  /* mapping here, NULL once unmapped */
    size_t size; /* bytes of the object and of the mapping */
    uint32_t nslots, req_bytes, rep_bytes;
    uint32_t id; /* the daemon's, once opened */
} hchan;

/* A new object of `size` bytes (0 = what the layout needs), mapped, with a valid header for
 * the layout (when it has room for one). Its name stays linked until hchan_destroy. */
static void hchan_make(hchan *h, uint32_t nslots, uint32_t req_bytes, uint32_t rep_bytes,
                       size_t size)
{
    memset(h, 0, sizeof *h);
    name_new(h->name, sizeof h->name);
    h->nslots = nslots;
    h->req_bytes = req_bytes;
    h->rep_bytes = rep_bytes;
    h->size = size ? size : (size_t)attnd_channel_size(nslots, req_bytes, rep_bytes);
    cr_assert_gt(h->size, 0);
    h->fd = shm_open(h->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(h->fd, 0, "shm_open %s: %s", h->name, strerror(errno));
    cr_assert_eq(ftruncate(h->fd, (off_t)h->size), 0);
    h->base = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
    cr_assert_neq(h->base, MAP_FAILED);
    if (h->size >= sizeof(attnd_channel_header)) {
        attnd_channel_header *hd = h->base;
        hd->magic = ATTND_CHANNEL_MAGIC;
        hd->version = ATTND_CHANNEL_VERSION;
        hd->nslots = nslots;
        hd->req_bytes = req_bytes;
        hd->rep_bytes = rep_bytes;
    }
}

static void hchan_unmap(hchan *h)
{
    if (h->base != NULL) munmap(h->base, h->size);
    h->base = NULL;
}

static void hchan_destroy(hchan *h)
{
    hchan_unmap(h);
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
    shm_unlink(h->name);
}

static attnd_channel_header *hdr(const hchan *h)
{
    return h->base;
}

static attnd_channel_slot *hslot(const hchan *h, uint32_t i)
{
    return attnd_channel_slot_at(h->base, i);
}

static uint32_t daemon_state(const hchan *h)
{
    return atomic_load(&hdr(h)->daemon_state);
}

/* ---------------------------------------------------------------- the hostile client */

typedef struct hostile {
    attnd_client *c;
    hchan ch; /* its main channel */
} hostile;

static attnd_client *connect_no_channel(const attnd_daemon_proc *d, const char *name)
{
    attnd_client_opts opts = {.name = name, .timeout_ms = 10000, .channel_slots = -1};
    attnd_client *c = NULL;
    cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
    attnd_err rv = attnd_client_connect(c, d->url, NULL);
    cr_assert_eq(rv, ATTND_ERR_OK, "connect: %s", attnd_client_last_error(c));
    cr_assert(!attnd_client_channel_active(c), "channel_slots = -1 opened a channel");
    return c;
}

/* OpenChannel on the socket (the library's raw rpc, session stamped); *id on OK. */
static attnd_err open_raw(attnd_client *c, const char *name, uint64_t size, uint32_t *id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__OpenChannel m = ATTND__OPEN_CHANNEL__INIT;
    Attnd__Reply *rep = NULL;
    m.shm_name = (char *)name;
    m.size = size;
    req.body_case = ATTND__REQUEST__BODY_OPEN_CHANNEL;
    req.open_channel = &m;
    attnd_err rv = attnd_client_rpc(c, &req, &rep);
    if (rv != ATTND_ERR_OK) return rv;
    cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_CHANNEL);
    cr_assert_neq(rep->channel->channel, 0);
    if (id != NULL) *id = rep->channel->channel;
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

/* CloseChannel (close != 0) or WakeChannel naming channel id, on the socket. */
static attnd_err chan_ctl(attnd_client *c, int close, uint32_t id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CloseChannel cm = ATTND__CLOSE_CHANNEL__INIT;
    Attnd__WakeChannel wm = ATTND__WAKE_CHANNEL__INIT;
    Attnd__Reply *rep = NULL;
    cm.channel = wm.channel = id;
    if (close) {
        req.body_case = ATTND__REQUEST__BODY_CLOSE_CHANNEL;
        req.close_channel = &cm;
    } else {
        req.body_case = ATTND__REQUEST__BODY_WAKE_CHANNEL;
        req.wake_channel = &wm;
    }
    attnd_err rv = attnd_client_rpc(c, &req, &rep);
    if (rep != NULL) attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

/* The last error message of c names `part` (NULL: anything). */
static void expect_msg(attnd_client *c, const char *part, const char *what)
{
    if (part == NULL) return;
    cr_assert(strstr(attnd_client_last_error(c), part) != NULL,
              "%s: message \"%s\" does not name \"%s\"", what, attnd_client_last_error(c), part);
}

/* The code of a call and its message containing `part`. */
#define EXPECT_RV(c, call, code, part)                                                             \
    do {                                                                                           \
        attnd_err rv_ = (call);                                                                    \
        cr_assert_eq(rv_, code, "%s: %s (%s), expected %s", #call, attnd_err_name(rv_),            \
                     attnd_client_last_error(c), attnd_err_name(code));                            \
        expect_msg(c, part, #call);                                                                \
    } while (0)

static void hostile_start(hostile *x, const attnd_daemon_proc *d)
{
    memset(x, 0, sizeof *x);
    x->ch.fd = -1;
    x->c = connect_no_channel(d, "hostile");
    hchan_make(&x->ch, 4, 512, 512, 0);
    EXPECT_RV(x->c, open_raw(x->c, x->ch.name, x->ch.size, &x->ch.id), ATTND_ERR_OK, NULL);
    /* POLLING from the open; ASLEEP once the executor idles */
    cr_assert_neq(daemon_state(&x->ch), ATTND_CHANNEL_DAEMON_CLOSED);
}

/* ---------------------------------------------------------------- posting by hand */

/* Write len bytes into slot i's request area, req_len as given, and publish the next seq. */
static uint32_t post_bytes(const hchan *h, uint32_t i, const void *buf, size_t len,
                           uint32_t req_len)
{
    attnd_channel_slot *s = hslot(h, i);
    cr_assert_leq(len, h->req_bytes);
    if (len > 0)
        memcpy(attnd_channel_req_area(h->base, h->nslots, h->req_bytes, h->rep_bytes, i), buf, len);
    s->req_len = req_len;
    uint32_t n = atomic_load(&s->req_seq) + 1;
    if (n == 0) n = 1;
    atomic_store(&s->req_seq, n); /* seq_cst: Dekker with the daemon's "ASLEEP, then poll" */
    return n;
}

/* The sleep protocol's second half: WakeChannel when the header says the daemon sleeps. */
static void wake_if_asleep(attnd_client *c, const hchan *h)
{
    if (daemon_state(h) == ATTND_CHANNEL_DAEMON_ASLEEP) (void)chan_ctl(c, 0, h->id);
}

/* 1 once slot i's rep_seq is n (within timeout_ms), else 0. */
static int wait_rep(const hchan *h, uint32_t i, uint32_t n, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    for (uint32_t k = 1; atomic_load(&hslot(h, i)->rep_seq) != n; k++) {
        if (now_ms() > deadline) return 0;
        if (k % 1024 == 0 && strcmp(daemon_fate(), "alive") != 0) return 0; /* no need to wait */
        sleep_us(50);
    }
    return 1;
}

/* The Reply in slot i's reply area (asserts it decodes). */
static Attnd__Reply *slot_reply(const hchan *h, uint32_t i)
{
    uint32_t len = hslot(h, i)->rep_len;
    cr_assert_leq(len, h->rep_bytes, "rep_len %u over rep_bytes %u", len, h->rep_bytes);
    Attnd__Reply *rep = attnd__reply__unpack(
        NULL, len, attnd_channel_rep_area(h->base, h->nslots, h->req_bytes, h->rep_bytes, i));
    cr_assert_not_null(rep, "the reply in slot %u (%u bytes) does not decode", i, len);
    return rep;
}

/* Post raw bytes (req_len as given), wake the daemon if it sleeps, wait for the reply. */
static Attnd__Reply *post_raw(attnd_client *c, const hchan *h, uint32_t i, const void *buf,
                              size_t len, uint32_t req_len)
{
    uint32_t n = post_bytes(h, i, buf, len, req_len);
    wake_if_asleep(c, h);
    cr_assert(wait_rep(h, i, n, REPLY_TIMEOUT_MS),
              "no reply to post %u in slot %u within %d ms; daemon %s", n, i, REPLY_TIMEOUT_MS,
              daemon_fate());
    return slot_reply(h, i);
}

static _Atomic uint64_t next_req_id = 1000000;

/* A request through slot i by hand: a fresh id, the given session; the reply's id checked. */
static Attnd__Reply *hcall(attnd_client *c, const hchan *h, uint32_t i, Attnd__Request *req,
                           uint64_t session)
{
    uint8_t buf[4096];
    req->id = atomic_fetch_add(&next_req_id, 1);
    req->session = session;
    size_t len = attnd__request__get_packed_size(req);
    cr_assert_leq(len, sizeof buf);
    attnd__request__pack(req, buf);
    Attnd__Reply *rep = post_raw(c, h, i, buf, len, (uint32_t)len);
    cr_assert_eq(rep->id, req->id, "reply id %llu for request %llu", (unsigned long long)rep->id,
                 (unsigned long long)req->id);
    return rep;
}

/* An error reply: its code, a message naming `part`; freed. */
static void expect_reply(Attnd__Reply *rep, attnd_err code, const char *part, const char *what)
{
    const char *msg = rep->message != NULL ? rep->message : "";
    cr_assert_eq(rep->code, (uint32_t)code, "%s: %s (\"%s\"), expected %s", what,
                 attnd_err_name((attnd_err)rep->code), msg, attnd_err_name(code));
    if (code != ATTND_ERR_OK) cr_assert(msg[0] != '\0', "%s: error reply without a message", what);
    if (part != NULL)
        cr_assert(strstr(msg, part) != NULL, "%s: message \"%s\" does not name \"%s\"", what, msg,
                  part);
    attnd__reply__free_unpacked(rep, NULL);
}

/* Small request builders (the caller's structs, valid while the request is). */
#define H_CREATE 0
#define H_FREE 1
#define H_QUERY 2

/* The body of a one-sequence request: Create, Free and Query carry only seq_id. */
typedef union seq_body {
    Attnd__CreateSequence create;
    Attnd__FreeSequence free;
    Attnd__QuerySequence query;
} seq_body;

static void req_seq(Attnd__Request *req, seq_body *b, int kind, uint64_t seq)
{
    Attnd__Request ri = ATTND__REQUEST__INIT;
    Attnd__CreateSequence c = ATTND__CREATE_SEQUENCE__INIT;
    Attnd__FreeSequence f = ATTND__FREE_SEQUENCE__INIT;
    Attnd__QuerySequence q = ATTND__QUERY_SEQUENCE__INIT;
    *req = ri;
    if (kind == H_CREATE) {
        c.seq_id = seq;
        b->create = c;
        req->body_case = ATTND__REQUEST__BODY_CREATE;
        req->create = &b->create;
    } else if (kind == H_FREE) {
        f.seq_id = seq;
        b->free = f;
        req->body_case = ATTND__REQUEST__BODY_FREE;
        req->free = &b->free;
    } else {
        q.seq_id = seq;
        b->query = q;
        req->body_case = ATTND__REQUEST__BODY_QUERY;
        req->query = &b->query;
    }
}

/* Create / Free / Query of one sequence through slot i of h as session: the reply's code. */
static attnd_err h_seq(attnd_client *c, const hchan *h, uint32_t i, int kind, uint64_t seq,
                       uint64_t session, attnd_seq_info *info)
{
    Attnd__Request req;
    seq_body body;
    req_seq(&req, &body, kind, seq);
    Attnd__Reply *rep = hcall(c, h, i, &req, session);
    attnd_err code = (attnd_err)rep->code;
    if (info != NULL && code == ATTND_ERR_OK) {
        cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_SEQ);
        info->seq_id = rep->seq->seq_id;
        info->num_tokens = rep->seq->num_tokens;
        info->num_blocks = rep->seq->num_blocks;
        info->step = rep->seq->step;
    }
    attnd__reply__free_unpacked(rep, NULL);
    return code;
}

/* ---------------------------------------------------------------- fixture */

/* One daemon, the good client, the hostile one. Tests keep theirs static: the suite's fini looks
 * at its daemon after a failed assertion has left the test's frame. */
typedef struct fixture {
    attnd_daemon_proc d;
    good g;
    hostile x;
} fixture;

static void fx_start(fixture *f, const char *config)
{
    memset(f, 0, sizeof *f);
    attnd_test_daemon_start(&f->d, config);
    cur_daemon = &f->d;
    good_start(&f->g, &f->d);
    hostile_start(&f->x, &f->d);
    good_step(&f->g, "start");
}

/* The daemon's log (up to cap - 1 bytes). */
static void read_log(const attnd_daemon_proc *d, char *buf, size_t cap)
{
    FILE *fp = fopen(d->log_path, "r");
    size_t n = 0;
    if (fp != NULL) {
        n = fread(buf, 1, cap - 1, fp);
        fclose(fp);
    }
    buf[n] = '\0';
}

static int count_in_log(const attnd_daemon_proc *d, const char *what)
{
    static char buf[1 << 16];
    int n = 0;
    read_log(d, buf, sizeof buf);
    for (const char *p = buf; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* Case 10, for every test: the hostile client leaves; once its session is reclaimed the daemon
 * holds exactly the good client's two sequences and blocks; once those are freed too, nothing;
 * SIGTERM then exits 0. */
static void fx_finish(fixture *f)
{
    good *g = &f->g;
    good_step(g, "everything");
    if (f->x.c != NULL) attnd_client_free(f->x.c);
    f->x.c = NULL;
    hchan_destroy(&f->x.ch);
    expect_pool(g, 1, 2, good_blocks(g), "after the hostile client left");
    good_step(g, "the hostile client's reclaim");
    cr_assert_eq(attnd_client_seq_free(g->c, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_free(g->c, 2), ATTND_ERR_OK);
    expect_pool(g, 1, 0, 0, "after the good client freed its sequences");
    cr_assert_eq(attnd_client_shm_destroy(g->c, &g->shm), ATTND_ERR_OK);
    attnd_mirror_fini(&g->m);
    attnd_client_free(g->c);
    g->c = NULL;
    cur_daemon = NULL;
    cr_assert_eq(attnd_daemon_stop(&f->d), 0, "daemon exit status");
}

/* ---------------------------------------------------------------- 1. OpenChannel refusals */

/* OpenChannel of a fresh object of `size` bytes (its header for the layout): code, message. */
static void open_bad(attnd_client *c, uint32_t nslots, uint32_t req_bytes, uint32_t rep_bytes,
                     size_t size, attnd_err code, const char *part)
{
    hchan h;
    hchan_make(&h, nslots, req_bytes, rep_bytes, size);
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), code, part);
    hchan_destroy(&h);
}

Test(channel_e2e, open_channel_refuses_bad_objects, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    hchan h;
    size_t ok = (size_t)attnd_channel_size(2, 256, 256);

    /* header fields, each spoilt on an object of the right size */
    hchan_make(&h, 2, 256, 256, 0);
    hdr(&h)->magic ^= 1;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.magic");
    hdr(&h)->magic = ATTND_CHANNEL_MAGIC;
    hdr(&h)->version = 2;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.version");
    hdr(&h)->version = ATTND_CHANNEL_VERSION;
    hdr(&h)->nslots = 0;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.nslots");
    hdr(&h)->nslots = ATTND_CHANNEL_MAX_SLOTS + 1;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.nslots");
    hdr(&h)->nslots = 2;
    hdr(&h)->req_bytes = 100;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT,
              "header.req_bytes: 100 is not a multiple of 64");
    hdr(&h)->req_bytes = 128; /* a multiple, under ATTND_CHANNEL_MIN_AREA */
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.req_bytes");
    hdr(&h)->req_bytes = 256;
    hdr(&h)->rep_bytes = ATTND_CHANNEL_MAX_AREA + 64;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "header.rep_bytes");
    hdr(&h)->rep_bytes = 256;
    /* the header now describes a 3-slot layout the 2-slot object does not have */
    hdr(&h)->nslots = 3;
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "layout needs");
    hdr(&h)->nslots = 2;
    /* a request already posted in slot 1 */
    atomic_store(&hslot(&h, 1)->req_seq, 5);
    EXPECT_RV(c, open_raw(c, h.name, h.size, NULL), ATTND_ERR_INVALID_ARGUMENT, "slot[1].req_seq");
    atomic_store(&hslot(&h, 1)->rep_seq, 5); /* idle again, at another number: fine */
    /* the size OpenChannel claims is not the object's */
    EXPECT_RV(c, open_raw(c, h.name, h.size + 64, NULL), ATTND_ERR_INVALID_ARGUMENT,
              "but the object has");
    EXPECT_RV(c, open_raw(c, h.name, 0, NULL), ATTND_ERR_INVALID_ARGUMENT, "size: 0");
    /* repaired, it opens (and closes) */
    uint32_t id = 0;
    EXPECT_RV(c, open_raw(c, h.name, h.size, &id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, chan_ctl(c, 1, id), ATTND_ERR_OK, NULL);
    cr_assert_eq(daemon_state(&h), ATTND_CHANNEL_DAEMON_CLOSED);
    hchan_destroy(&h);
    good_step(&f.g, "bad headers");

    /* objects smaller and larger than their header's layout, and one smaller than a header */
    open_bad(c, 2, 256, 256, ok - 64, ATTND_ERR_INVALID_ARGUMENT, "layout needs");
    open_bad(c, 2, 256, 256, ok + 4096, ATTND_ERR_INVALID_ARGUMENT, "layout needs");
    open_bad(c, 2, 256, 256, 32, ATTND_ERR_INVALID_ARGUMENT, "less than the 64-byte header");
    good_step(&f.g, "bad sizes");

    /* names */
    EXPECT_RV(c, open_raw(c, "no-slash", ok, NULL), ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    EXPECT_RV(c, open_raw(c, "/a/b", ok, NULL), ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    EXPECT_RV(c, open_raw(c, "/", ok, NULL), ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    EXPECT_RV(c, open_raw(c, "", ok, NULL), ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    char longname[300];
    memset(longname, 'x', sizeof longname);
    longname[0] = '/';
    longname[sizeof longname - 1] = '\0';
    EXPECT_RV(c, open_raw(c, longname, ok, NULL), ATTND_ERR_INVALID_ARGUMENT, "shm_name");
    EXPECT_RV(c, open_raw(c, "/attnd-c3e2e-no-such-object", ok, NULL), ATTND_ERR_NOT_FOUND,
              "no such shared memory object");
    good_step(&f.g, "bad names");
    /* none of it touched the channel the hostile client has open */
    cr_assert_neq(daemon_state(&f.x.ch), ATTND_CHANNEL_DAEMON_CLOSED);
    cr_assert_eq(h_seq(c, &f.x.ch, 0, H_QUERY, 1, attnd_client_session(c), NULL),
                 ATTND_ERR_NOT_FOUND);
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 2. bad posts */

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    return n;
}

Test(channel_e2e, bad_posts_get_protocol_replies, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    uint8_t buf[512];
    attnd_rng r;
    attnd_rng_seed(&r, 7);

    /* random bytes (a first byte with wire type 7, which no message has) */
    for (size_t i = 0; i < 300; i++)
        buf[i] = (uint8_t)attnd_rng_next(&r);
    buf[0] = 0xff;
    cr_assert_null(attnd__request__unpack(NULL, 300, buf));
    expect_reply(post_raw(c, h, 0, buf, 300, 300), ATTND_ERR_PROTOCOL, "not an attnd.Request",
                 "garbage");
    good_step(&f.g, "garbage");

    /* a BeginStep cut short */
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep bs = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq ss[4], *ssp[4];
    for (int i = 0; i < 4; i++) {
        Attnd__StepSeq init = ATTND__STEP_SEQ__INIT;
        ss[i] = init;
        ss[i].seq_id = 100 + (uint64_t)i;
        ss[i].new_tokens = 1000;
        ssp[i] = &ss[i];
    }
    bs.n_seqs = 4;
    bs.seqs = ssp;
    req.id = 4242;
    req.session = me;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &bs;
    size_t n = attnd__request__pack(&req, buf);
    cr_assert_null(attnd__request__unpack(NULL, n - 3, buf));
    expect_reply(post_raw(c, h, 1, buf, n - 3, (uint32_t)(n - 3)), ATTND_ERR_PROTOCOL,
                 "not an attnd.Request", "truncated");
    good_step(&f.g, "truncated protobuf");

    /* an unknown field in the Request, then one inside its CreateSequence */
    seq_body cs;
    req_seq(&req, &cs, H_CREATE, 9);
    req.id = 4243;
    req.session = me;
    n = attnd__request__pack(&req, buf);
    n += put_varint(buf + n, (99u << 3) | 0);
    n += put_varint(buf + n, 1);
    Attnd__Reply *rep = post_raw(c, h, 2, buf, n, (uint32_t)n);
    cr_assert_eq(rep->id, 4243);
    expect_reply(rep, ATTND_ERR_PROTOCOL, "unknown field 99 in attnd.Request", "unknown field");
    n = 0;
    buf[n++] = (1 << 3) | 0; /* id */
    n += put_varint(buf + n, 4244);
    buf[n++] = (2 << 3) | 0; /* session */
    n += put_varint(buf + n, me);
    buf[n++] = (13 << 3) | 2; /* create, length-delimited: seq_id 9, field 7 = 1 */
    buf[n++] = 4;
    buf[n++] = (1 << 3) | 0;
    buf[n++] = 9;
    buf[n++] = (7 << 3) | 0;
    buf[n++] = 1;
    rep = post_raw(c, h, 3, buf, n, (uint32_t)n);
    cr_assert_eq(rep->id, 4244);
    expect_reply(rep, ATTND_ERR_PROTOCOL, "unknown field 7 in attnd.CreateSequence",
                 "nested unknown field");
    cr_assert_eq(h_seq(c, h, 0, H_QUERY, 9, me, NULL), ATTND_ERR_NOT_FOUND,
                 "a request with an unknown field ran");
    good_step(&f.g, "unknown fields");

    /* lengths: none, one past the area, the largest */
    req_seq(&req, &cs, H_CREATE, 10);
    req.id = 4245;
    req.session = me;
    n = attnd__request__pack(&req, buf);
    expect_reply(post_raw(c, h, 0, buf, n, 0), ATTND_ERR_PROTOCOL, "req_len 0", "req_len 0");
    expect_reply(post_raw(c, h, 1, buf, n, h->req_bytes + 1), ATTND_ERR_PROTOCOL, "req_len 513",
                 "req_len over");
    expect_reply(post_raw(c, h, 2, buf, n, UINT32_MAX), ATTND_ERR_PROTOCOL, "req_len",
                 "req_len max");
    cr_assert_eq(h_seq(c, h, 3, H_QUERY, 10, me, NULL), ATTND_ERR_NOT_FOUND);
    good_step(&f.g, "bad req_len");

    /* scribbling over the header after the open changes nothing: the daemon kept its layout */
    hdr(h)->nslots = ATTND_CHANNEL_MAX_SLOTS;
    hdr(h)->req_bytes = ATTND_CHANNEL_MAX_AREA;
    hdr(h)->magic = 0;
    atomic_store(&hslot(h, 3)->rep_seq, 12345); /* the daemon's word: it does not read it */
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 11, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 3, H_FREE, 11, me, NULL), ATTND_ERR_OK);
    good_step(&f.g, "header scribbles");

    /* every slot consistent, the channel still served */
    for (uint32_t i = 0; i < h->nslots; i++)
        cr_assert_eq(atomic_load(&hslot(h, i)->rep_seq), atomic_load(&hslot(h, i)->req_seq));
    cr_assert_neq(daemon_state(h), ATTND_CHANNEL_DAEMON_CLOSED);
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 3. socket-only requests */

Test(channel_e2e, socket_only_requests_are_refused_in_a_channel, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello hello = ATTND__HELLO__INIT;
    Attnd__OpenChannel oc = ATTND__OPEN_CHANNEL__INIT;
    Attnd__CloseChannel cc = ATTND__CLOSE_CHANNEL__INIT;
    Attnd__WakeChannel wc = ATTND__WAKE_CHANNEL__INIT;

    hello.protocol_version = ATTND_CLIENT_PROTOCOL_VERSION;
    hello.client_name = (char *)"in-channel";
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &hello;
    expect_reply(hcall(c, h, 0, &req, me), ATTND_ERR_INVALID_ARGUMENT, "served on the socket only",
                 "hello");
    expect_reply(hcall(c, h, 1, &req, 0), ATTND_ERR_INVALID_ARGUMENT, "served on the socket only",
                 "hello without session");
    good_step(&f.g, "hello in a channel");

    oc.shm_name = f.x.ch.name; /* its own object: would be a second channel on it */
    oc.size = f.x.ch.size;
    req.body_case = ATTND__REQUEST__BODY_OPEN_CHANNEL;
    req.open_channel = &oc;
    expect_reply(hcall(c, h, 2, &req, me), ATTND_ERR_INVALID_ARGUMENT, "served on the socket only",
                 "open_channel");
    cc.channel = h->id;
    req.body_case = ATTND__REQUEST__BODY_CLOSE_CHANNEL;
    req.close_channel = &cc;
    expect_reply(hcall(c, h, 3, &req, me), ATTND_ERR_INVALID_ARGUMENT, "served on the socket only",
                 "close_channel");
    wc.channel = h->id;
    req.body_case = ATTND__REQUEST__BODY_WAKE_CHANNEL;
    req.wake_channel = &wc;
    expect_reply(hcall(c, h, 0, &req, me), ATTND_ERR_INVALID_ARGUMENT, "served on the socket only",
                 "wake_channel");
    good_step(&f.g, "channel requests in a channel");

    /* no body at all: refused like on the socket */
    Attnd__Request empty = ATTND__REQUEST__INIT;
    expect_reply(hcall(c, h, 1, &empty, me), ATTND_ERR_INVALID_ARGUMENT, NULL, "empty body");

    /* none of that closed or opened anything: the channel still serves, and Status (no session
     * needed, the channel's named) is served through it */
    cr_assert_eq(daemon_state(h) == ATTND_CHANNEL_DAEMON_CLOSED, 0);
    cr_assert_eq(h_seq(c, h, 2, H_CREATE, 5, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 3, H_FREE, 5, me, NULL), ATTND_ERR_OK);
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    Attnd__Reply *rep = hcall(c, h, 0, &req, me);
    cr_assert_eq(rep->code, ATTND_ERR_OK, "status: %s", rep->message);
    cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_STATUS);
    attnd__reply__free_unpacked(rep, NULL);
    /* Status with session 0 (as on the socket) is not the channel's session */
    expect_reply(hcall(c, h, 1, &req, 0), ATTND_ERR_INVALID_ARGUMENT, "session", "status 0");
    good_step(&f.g, "status in a channel");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 4. another session */

Test(channel_e2e, requests_naming_another_session_are_refused, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c), theirs = attnd_client_session(f.g.c);
    attnd_seq_info before[2], after[2];
    for (uint64_t id = 1; id <= 2; id++)
        cr_assert_eq(attnd_client_seq_query(f.g.c, id, &before[id - 1]), ATTND_ERR_OK);

    Attnd__Request req = ATTND__REQUEST__INIT;
    seq_body cs;
    seq_body fs;
    seq_body qs;
    req_seq(&req, &fs, H_FREE, 1);
    expect_reply(hcall(c, h, 0, &req, theirs), ATTND_ERR_INVALID_ARGUMENT, "session",
                 "free theirs");
    req_seq(&req, &cs, H_CREATE, 3);
    expect_reply(hcall(c, h, 1, &req, theirs), ATTND_ERR_INVALID_ARGUMENT, "session",
                 "create theirs");
    req_seq(&req, &qs, H_QUERY, 2);
    expect_reply(hcall(c, h, 2, &req, theirs), ATTND_ERR_INVALID_ARGUMENT, "session",
                 "query theirs");
    Attnd__BeginStep bs = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq ss = ATTND__STEP_SEQ__INIT, *ssp = &ss;
    ss.seq_id = 1;
    ss.new_tokens = 16;
    bs.n_seqs = 1;
    bs.seqs = &ssp;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &bs;
    expect_reply(hcall(c, h, 3, &req, theirs), ATTND_ERR_INVALID_ARGUMENT, "session",
                 "begin theirs");
    /* sessions that do not exist, and none */
    req_seq(&req, &fs, H_FREE, 1);
    expect_reply(hcall(c, h, 0, &req, theirs + me + 1000), ATTND_ERR_INVALID_ARGUMENT, "session",
                 "unknown session");
    expect_reply(hcall(c, h, 1, &req, 0), ATTND_ERR_INVALID_ARGUMENT, "session", "session 0");
    good_step(&f.g, "requests naming its session");

    /* its own session naming the good client's sequence ids: they do not exist for it */
    cr_assert_eq(h_seq(c, h, 2, H_QUERY, 1, me, NULL), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(h_seq(c, h, 3, H_FREE, 2, me, NULL), ATTND_ERR_NOT_FOUND);
    /* a sequence of the same id of its own is its own */
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 1, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 1, H_FREE, 1, me, NULL), ATTND_ERR_OK);

    /* the good client's sequences are untouched (one more decode step each, nothing else) */
    for (uint64_t id = 1; id <= 2; id++) {
        cr_assert_eq(attnd_client_seq_query(f.g.c, id, &after[id - 1]), ATTND_ERR_OK);
        cr_assert_eq(after[id - 1].num_tokens, before[id - 1].num_tokens + 1);
        cr_assert_eq(after[id - 1].step, 0);
    }
    good_step(&f.g, "foreign sequence ids");
    (void)good_blocks(&f.g);
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 5. a step by hand */

/* Expected outputs of one Attend over `rows` rows. */
typedef struct expect {
    attnd_test_tensor direct;
    float *dlse;
    double *dlse64, *rout, *rlse;
    int64_t nlse;
} expect;

static void expect_alloc(expect *e, const attnd_geometry *g, int64_t rows)
{
    int64_t shape[3] = {rows, g->num_q_heads, g->head_size};
    e->nlse = rows * g->num_q_heads;
    attnd_tt_alloc(&e->direct, ATTND_DTYPE_F32, 3, shape);
    e->dlse = calloc((size_t)e->nlse, sizeof *e->dlse);
    e->dlse64 = calloc((size_t)e->nlse, sizeof *e->dlse64);
    e->rout = calloc((size_t)(e->nlse * g->head_size), sizeof *e->rout);
    e->rlse = calloc((size_t)e->nlse, sizeof *e->rlse);
    cr_assert(e->dlse && e->dlse64 && e->rout && e->rlse);
}

static void expect_free(expect *e)
{
    attnd_tt_free(&e->direct);
    free(e->dlse);
    free(e->dlse64);
    free(e->rout);
    free(e->rlse);
}

/* BeginStep of one sequence through the hand channel: the step id. */
static uint64_t h_begin(attnd_client *c, const hchan *h, uint64_t seq, uint32_t tokens)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep bs = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq ss = ATTND__STEP_SEQ__INIT, *ssp = &ss;
    ss.seq_id = seq;
    ss.new_tokens = tokens;
    bs.n_seqs = 1;
    bs.seqs = &ssp;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &bs;
    Attnd__Reply *rep = hcall(c, h, 1, &req, attnd_client_session(c));
    cr_assert_eq(rep->code, ATTND_ERR_OK, "begin_step: %s", rep->message);
    cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_STEP);
    cr_assert_eq(rep->step->num_tokens, tokens);
    cr_assert_eq(rep->step->n_query_start_loc, 2);
    cr_assert_eq(rep->step->query_start_loc[0], 0);
    cr_assert_eq(rep->step->query_start_loc[1], tokens);
    uint64_t id = rep->step->step;
    attnd__reply__free_unpacked(rep, NULL);
    return id;
}

/* Attend of one layer through the hand channel with HOST_SHM refs: the reply's code. */
static attnd_err h_attend(attnd_client *c, const hchan *h, uint64_t step, uint32_t layer,
                          attnd_e2e_io *io)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend at = ATTND__ATTEND__INIT;
    Attnd__TensorRef q, k, v, out, lse;
    cr_assert_eq(attnd_client_ref_to_pb(c, "q", &io->rq, 0, &q), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_ref_to_pb(c, "k_new", &io->rk, 0, &k), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_ref_to_pb(c, "v_new", &io->rv, 0, &v), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_ref_to_pb(c, "out", &io->rout, 1, &out), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_ref_to_pb(c, "out_lse", &io->rlse, 1, &lse), ATTND_ERR_OK);
    at.step = step;
    at.layer = layer;
    at.q = &q;
    at.k_new = &k;
    at.v_new = &v;
    at.out = &out;
    at.out_lse = &lse;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &at;
    Attnd__Reply *rep = hcall(c, h, 2, &req, attnd_client_session(c));
    attnd_err code = (attnd_err)rep->code;
    if (code != ATTND_ERR_OK && code != ATTND_ERR_INVALID_ARGUMENT)
        fprintf(stderr, "attend by hand: %s\n", rep->message);
    attnd__reply__free_unpacked(rep, NULL);
    return code;
}

static attnd_err h_end(attnd_client *c, const hchan *h, uint64_t step, int abort)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__EndStep es = ATTND__END_STEP__INIT;
    es.step = step;
    es.abort = abort != 0;
    req.body_case = ATTND__REQUEST__BODY_END_STEP;
    req.end_step = &es;
    Attnd__Reply *rep = hcall(c, h, 3, &req, attnd_client_session(c));
    attnd_err code = (attnd_err)rep->code;
    attnd__reply__free_unpacked(rep, NULL);
    return code;
}

Test(channel_e2e, hand_made_channel_serves_a_real_step, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    const attnd_geometry *geo = &attnd_client_server(c)->geometry;
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs;
    uint32_t steps[3] = {13, 1, 1};
    memset(&errs, 0, sizeof errs);
    attnd_rng_seed(&r, 5);
    cr_assert_eq(attnd_mirror_init(&m, geo, NULL, 64), 0);
    cr_assert_eq(attnd_client_shm_create(c, attnd_e2e_io_bytes(geo, ATTND_DTYPE_F32, 16), &shm),
                 ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 50, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&m, 50), 0);
    for (int s = 0; s < 3; s++) {
        attnd_step_seq ss = {50, steps[s]};
        attnd_e2e_io io;
        expect e;
        uint64_t step = h_begin(c, h, 50, steps[s]);
        cr_assert_eq(attnd_mirror_begin(&m, &ss, 1), 0);
        attnd_e2e_io_layout(&io, geo, &shm, ATTND_DTYPE_F32, steps[s]);
        expect_alloc(&e, geo, steps[s]);
        for (uint32_t l = 0; l < geo->num_layers; l++) {
            attnd_e2e_io_fill(&io, &r, 1.0);
            cr_assert_eq(h_attend(c, h, step, l, &io), ATTND_ERR_OK);
            cr_assert_eq(attnd_mirror_attend(&m, l, &io.q, &io.k, &io.v, &e.direct.t, e.dlse,
                                             e.rout, e.rlse),
                         ATTND_ERR_OK);
            for (int64_t i = 0; i < e.nlse; i++)
                e.dlse64[i] = e.dlse[i];
            attnd_e2e_errs_max(&errs, attnd_e2e_rel_l2_t(&io.out, &e.direct.t),
                               attnd_e2e_lse_err(&io.lse, e.dlse64),
                               attnd_e2e_rel_l2_d(&io.out, e.rout),
                               attnd_e2e_lse_err(&io.lse, e.rlse));
        }
        expect_free(&e);
        cr_assert_eq(h_end(c, h, step, 0), ATTND_ERR_OK);
        attnd_mirror_end(&m, 1);
        good_step(&f.g, "a step by hand");
    }
    cr_assert_eq(errs.attends, 6);
    cr_assert_leq(errs.direct, attnd_e2e_direct_tol(ATTND_DTYPE_F32), "vs CPU op: %.3g",
                  errs.direct);
    cr_assert_leq(errs.direct_lse, ATTND_E2E_DIRECT_LSE_TOL, "lse vs CPU op: %.3g",
                  errs.direct_lse);
    cr_assert_leq(errs.ref, attnd_tol_for(ATTND_DTYPE_F32), "vs reference: %.3g", errs.ref);
    cr_assert_leq(errs.ref_lse, ATTND_E2E_REF_LSE_TOL, "lse vs reference: %.3g", errs.ref_lse);
    attnd_seq_info info;
    cr_assert_eq(h_seq(c, h, 0, H_QUERY, 50, me, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 15);
    cr_assert_eq(info.num_blocks, 1);
    /* an aborted step leaves the sequence as it was */
    uint64_t step = h_begin(c, h, 50, 4);
    cr_assert_eq(h_end(c, h, step, 1), ATTND_ERR_OK);
    cr_assert_eq(h_end(c, h, step, 0), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(h_seq(c, h, 0, H_QUERY, 50, me, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 15);

    /* a reply larger than the 512-byte reply area (150 sequences listed, 5 bytes or more
     * each): the request ran, the slot says so */
    for (uint64_t id = 200; id < 350; id++)
        cr_assert_eq(h_seq(c, h, id % 4, H_CREATE, id, me, NULL), ATTND_ERR_OK);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__ListSequences ls = ATTND__LIST_SEQUENCES__INIT;
    req.body_case = ATTND__REQUEST__BODY_LIST;
    req.list = &ls;
    expect_reply(hcall(c, h, 1, &req, me), ATTND_ERR_INTERNAL,
                 "exceed the channel's reply area (the request ran)", "list");
    for (uint64_t id = 200; id < 350; id++)
        cr_assert_eq(h_seq(c, h, id % 4, H_FREE, id, me, NULL), ATTND_ERR_OK);
    good_step(&f.g, "an oversized reply");

    cr_assert_eq(h_seq(c, h, 3, H_FREE, 50, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_shm_destroy(c, &shm), ATTND_ERR_OK);
    attnd_mirror_fini(&m);
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 6. posting twice */

/* Wait (up to 2 s) until the daemon says it sleeps: 1 when it does. */
static int wait_asleep(const hchan *h)
{
    int64_t deadline = now_ms() + 2000;
    while (daemon_state(h) != ATTND_CHANNEL_DAEMON_ASLEEP) {
        if (now_ms() > deadline) return 0;
        sleep_us(100);
    }
    return 1;
}

/* A second post on a slot before the first one's reply.
 *
 * What the daemon does (daemon/wire/channel.c slot_take): it takes a slot's request when req_seq
 * differs from the last number it took, whatever the number, and answers with rep_seq = the
 * number it took; a slot whose request is taken and not yet answered is skipped. So:
 *   - both posts land between two polls (here: the executor asleep): only the latest runs, the
 *     first never does and gets no reply of its own (its reply slot is the second's);
 *   - the first is taken before the second lands: the first runs and is answered (rep_seq = the
 *     first number), then the second is taken at the next poll and answered too.
 * Either way the slot ends consistent (rep_seq == req_seq) with the latest request's reply in it;
 * bytes rewritten while the daemon copies the first give that first request a torn copy, which
 * is decoded and validated like any other post. Observed: two posts a few hundred ns apart, the
 * first never ran, whether the executor slept or polled (the test accepts both outcomes). */
Test(channel_e2e, posting_twice_on_a_busy_slot, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    uint8_t a[256], b[256];
    int first_ran = 0, rounds = 10;
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 500, me, NULL), ATTND_ERR_OK);

    for (int round = 0; round < 2 * rounds; round++) {
        int asleep = round < rounds;
        Attnd__Request ra, rb;
        seq_body cs;
        seq_body qs;
        uint64_t seq_a = 600 + (uint64_t)round;
        req_seq(&ra, &cs, H_CREATE,
                seq_a); /* A: creates a sequence, so we can tell whether it ran */
        ra.id = atomic_fetch_add(&next_req_id, 1);
        ra.session = me;
        req_seq(&rb, &qs, H_QUERY, 500); /* B: independent of A */
        rb.id = atomic_fetch_add(&next_req_id, 1);
        rb.session = me;
        size_t na = attnd__request__pack(&ra, a), nb = attnd__request__pack(&rb, b);
        if (asleep)
            cr_assert(wait_asleep(h), "the executor never slept");
        else
            (void)chan_ctl(c, 0, h->id); /* awake and polling */
        uint32_t n1 = post_bytes(h, 0, a, na, (uint32_t)na);
        uint32_t n2 = post_bytes(h, 0, b, nb, (uint32_t)nb);
        cr_assert_eq(n2, n1 + 1);
        wake_if_asleep(c, h);
        cr_assert(wait_rep(h, 0, n2, REPLY_TIMEOUT_MS), "round %d: slot never answered %u (at %u)",
                  round, n2, atomic_load(&hslot(h, 0)->rep_seq));
        cr_assert_eq(atomic_load(&hslot(h, 0)->req_seq), atomic_load(&hslot(h, 0)->rep_seq));
        Attnd__Reply *rep = slot_reply(h, 0);
        cr_assert_eq(rep->id, rb.id, "round %d: the slot holds reply %llu, not the latest's", round,
                     (unsigned long long)rep->id);
        cr_assert_eq(rep->code, ATTND_ERR_OK, "round %d: %s", round, rep->message);
        cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_SEQ);
        cr_assert_eq(rep->seq->seq_id, 500);
        attnd__reply__free_unpacked(rep, NULL);
        attnd_err q = h_seq(c, h, 1, H_QUERY, seq_a, me, NULL);
        cr_assert(q == ATTND_ERR_OK || q == ATTND_ERR_NOT_FOUND, "round %d: %s", round,
                  attnd_err_name(q));
        if (q == ATTND_ERR_OK) {
            first_ran++;
            cr_assert_eq(h_seq(c, h, 1, H_FREE, seq_a, me, NULL), ATTND_ERR_OK);
        }
    }
    fprintf(stderr,
            "channel_e2e: double posts: the first request ran in %d of %d rounds (%d posted to a "
            "sleeping executor, %d to a polling one); the latest was always answered\n",
            first_ran, 2 * rounds, rounds, rounds);
    /* the slot is usable as ever */
    cr_assert_eq(h_seq(c, h, 0, H_FREE, 500, me, NULL), ATTND_ERR_OK);
    good_step(&f.g, "double posts");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 7. truncation */

/* Wait (up to 5 s) for `count` channel_broken lines in the daemon's log. */
static void wait_broken(const attnd_daemon_proc *d, int count)
{
    int64_t deadline = now_ms() + 5000;
    while (count_in_log(d, "event=channel_broken") < count) {
        if (now_ms() > deadline) {
            attnd_daemon_dump_log(d);
            cr_assert_fail("no event=channel_broken (%d wanted) in the daemon's log", count);
        }
        sleep_us(10000);
    }
}

Test(channel_e2e, truncated_object_drops_the_channel, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    uint32_t old_id = h->id;
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 70, me, NULL), ATTND_ERR_OK);

    /* an idle channel, cut to nothing: the daemon's next poll faults, absorbed by the guard */
    hchan_unmap(h); /* our own accesses would fault too */
    cr_assert_eq(ftruncate(h->fd, 0), 0);
    (void)chan_ctl(c, 0, old_id); /* wake the executor: it polls, faults, drops the channel */
    wait_broken(&f.d, 1);
    cr_assert_eq(count_in_log(&f.d, "reason=object_shrank"), 1);
    EXPECT_RV(c, chan_ctl(c, 0, old_id), ATTND_ERR_NOT_FOUND, "not open in this session");
    good_step(&f.g, "a truncated channel");
    good_step(&f.g, "a truncated channel (2)");

    /* a channel with a request posted, cut before the daemon looks */
    hchan t;
    hchan_make(&t, 2, 256, 256, 0);
    EXPECT_RV(c, open_raw(c, t.name, t.size, &t.id), ATTND_ERR_OK, NULL);
    cr_assert(wait_asleep(&t));
    Attnd__Request req;
    seq_body cs;
    uint8_t buf[256];
    req_seq(&req, &cs, H_CREATE, 71);
    req.id = 9;
    req.session = me;
    size_t n = attnd__request__pack(&req, buf);
    (void)post_bytes(&t, 1, buf, n, (uint32_t)n);
    hchan_unmap(&t);
    cr_assert_eq(ftruncate(t.fd, 0), 0);
    (void)chan_ctl(c, 0, t.id);
    wait_broken(&f.d, 2);
    EXPECT_RV(c, chan_ctl(c, 1, t.id), ATTND_ERR_NOT_FOUND, "not open in this session");
    hchan_destroy(&t);
    good_step(&f.g, "a truncated channel with a request posted");

    /* a channel cut to one byte: its one page stays mapped and reads as zeros past the end (no
     * fault: the daemon does not notice). It must still do no harm and close cleanly. */
    hchan_make(&t, 1, 256, 256, 0);
    EXPECT_RV(c, open_raw(c, t.name, t.size, &t.id), ATTND_ERR_OK, NULL);
    cr_assert_eq(h_seq(c, &t, 0, H_QUERY, 70, me, NULL), ATTND_ERR_OK);
    hchan_unmap(&t);
    cr_assert_eq(ftruncate(t.fd, 1), 0);
    (void)chan_ctl(c, 0, t.id);
    sleep_us(250000); /* a few polls of the executor and its housekeeping ticks */
    good_step(&f.g, "a channel cut inside its page");
    attnd_err rv = chan_ctl(c, 1, t.id);
    cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_NOT_FOUND, "close: %s", attnd_err_name(rv));
    hchan_destroy(&t);

    /* the same client opens a fresh channel, which serves */
    hchan_destroy(h);
    hchan_make(h, 4, 512, 512, 0);
    EXPECT_RV(c, open_raw(c, h->name, h->size, &h->id), ATTND_ERR_OK, NULL);
    cr_assert_neq(h->id, old_id);
    cr_assert_eq(h_seq(c, h, 2, H_QUERY, 70, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 3, H_QUERY, 71, me, NULL), ATTND_ERR_NOT_FOUND,
                 "a request posted in a truncated object ran");
    cr_assert_eq(h_seq(c, h, 1, H_FREE, 70, me, NULL), ATTND_ERR_OK);
    good_step(&f.g, "a fresh channel");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 8. channel ids */

Test(channel_e2e, wake_and_close_name_only_own_channels, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    /* ids are small and daemon-wide: around its own lie the good client's and the start-up
     * probe's */
    for (uint32_t id = 0; id < h->id + 8; id++) {
        if (id == h->id) continue;
        EXPECT_RV(c, chan_ctl(c, 0, id), ATTND_ERR_NOT_FOUND, "not open in this session");
        EXPECT_RV(c, chan_ctl(c, 1, id), ATTND_ERR_NOT_FOUND, "not open in this session");
    }
    EXPECT_RV(c, chan_ctl(c, 0, UINT32_MAX), ATTND_ERR_NOT_FOUND, "not open in this session");
    good_step(&f.g, "naming other channels");
    good_step(&f.g, "naming other channels (2)");

    /* its own: wake, then close; the header says so, and posts go unanswered */
    EXPECT_RV(c, chan_ctl(c, 0, h->id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, chan_ctl(c, 1, h->id), ATTND_ERR_OK, NULL);
    cr_assert_eq(daemon_state(h), ATTND_CHANNEL_DAEMON_CLOSED);
    Attnd__Request req;
    seq_body cs;
    uint8_t buf[256];
    req_seq(&req, &cs, H_CREATE, 80);
    req.id = 11;
    req.session = me;
    size_t n = attnd__request__pack(&req, buf);
    uint32_t rep_before = atomic_load(&hslot(h, 0)->rep_seq);
    uint32_t posted = post_bytes(h, 0, buf, n, (uint32_t)n);
    EXPECT_RV(c, chan_ctl(c, 0, h->id), ATTND_ERR_NOT_FOUND, "not open in this session");
    cr_assert_eq(wait_rep(h, 0, posted, 400), 0, "a closed channel answered");
    cr_assert_eq(atomic_load(&hslot(h, 0)->rep_seq), rep_before);
    EXPECT_RV(c, chan_ctl(c, 1, h->id), ATTND_ERR_NOT_FOUND, "not open in this session");
    attnd_seq_info info;
    EXPECT_RV(c, attnd_client_seq_query(c, 80, &info), ATTND_ERR_NOT_FOUND, NULL);
    good_step(&f.g, "closing its own channel");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 9. a client that dies */

/* The forked child's churn: create / free through the library's channel until _exit. */
static void *child_churn(void *arg)
{
    attnd_client *c = arg;
    for (uint64_t i = 0;; i++) {
        (void)attnd_client_seq_create(c, 1000 + i % 8, NULL);
        (void)attnd_client_seq_free(c, 1000 + i % 8);
    }
    return NULL;
}

/* Runs before Criterion's main in a re-executed copy of this binary (test 9): a client with a
 * channel holds a sequence in an open step, a thread keeps calls in flight through the channel,
 * and the process _exit()s without waiting for them. A fresh process: NNG in a forked child of
 * a process whose NNG threads run would not be safe. */
__attribute__((constructor)) static void child_main(void)
{
    const char *url = getenv(CHILD_URL_ENV), *fds = getenv(CHILD_FD_ENV);
    attnd_client_opts opts = {.name = "forked-child", .timeout_ms = 5000};
    attnd_client *c = NULL;
    attnd_step st;
    attnd_step_seq s = {1, 40};
    pthread_t t;
    struct timespec nap = {0, 20 * 1000000};
    if (url == NULL || fds == NULL) return;
    int fd = atoi(fds);
    if (attnd_client_alloc(&c, &opts) != ATTND_ERR_OK ||
        attnd_client_connect(c, url, NULL) != ATTND_ERR_OK)
        _exit(2);
    if (!attnd_client_channel_active(c)) _exit(3);
    if (attnd_client_seq_create(c, 1, NULL) != ATTND_ERR_OK ||
        attnd_client_step_begin(c, &s, 1, &st, NULL) != ATTND_ERR_OK)
        _exit(4);
    if (pthread_create(&t, NULL, child_churn, c) != 0) _exit(5);
    uint64_t session = attnd_client_session(c);
    if (write(fd, &session, sizeof session) != (ssize_t)sizeof session) _exit(6);
    nanosleep(&nap, NULL);
    _exit(0);
}

static pid_t spawn_child(const attnd_daemon_proc *d, uint64_t *session)
{
    return attnd_test_spawn_self("attnd-channel-child", CHILD_URL_ENV, CHILD_FD_ENV, d->url,
                                 session);
}

static int reap(pid_t pid, int timeout_ms)
{
    int status;
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 || now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        sleep_us(1000);
    }
}

Test(channel_e2e, forked_client_exits_mid_request, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    for (int k = 0; k < 3; k++) {
        uint64_t session = 0;
        expect_pool(&f.g, 2, 2, good_blocks(&f.g), "before the child");
        pid_t pid = spawn_child(&f.d, &session);
        cr_assert_neq(session, 0);
        good_step(&f.g, "the child's start");
        cr_assert_eq(reap(pid, 10000), 0, "child exit status");
        good_step(&f.g, "the child's exit");
        /* its session, open step, sequences and channel go; its blocks come back */
        expect_pool(&f.g, 2, 2, good_blocks(&f.g), "after the child's reclaim");
        good_step(&f.g, "the child's reclaim");
    }
    fx_finish(&f);
}

/* ---------------------------------------------------------------- 11. a sleeping executor */

/* With server.spin_us 0 the executor sleeps as soon as it is idle: every library call posted
 * while it sleeps must send WakeChannel. A post that does not is answered at the executor's
 * next wake-up: the next socket request, or the daemon's 100 ms housekeeping tick (main.c
 * TICK_MS posts a sweep to the executor), whichever comes first. */
Test(channel_e2e, sleeping_executor_answers_after_wake, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG_SPIN0);
    attnd_client *gc = f.g.c, *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    for (uint64_t i = 0; i < 200; i++) {
        attnd_err rv = attnd_client_seq_create(gc, 100 + i, NULL);
        cr_assert_eq(rv, ATTND_ERR_OK, "create %llu: %s", (unsigned long long)i,
                     attnd_client_last_error(gc));
        rv = attnd_client_seq_free(gc, 100 + i);
        cr_assert_eq(rv, ATTND_ERR_OK, "free %llu: %s", (unsigned long long)i,
                     attnd_client_last_error(gc));
        if (i % 50 == 49) good_step(&f.g, "create/free pairs");
    }
    cr_assert(attnd_client_channel_active(gc));

    Attnd__Request req;
    seq_body qs;
    uint8_t buf[256];
    req_seq(&req, &qs, H_QUERY, 1);
    req.session = me;
    /* a post with WakeChannel right after it */
    cr_assert(wait_asleep(h), "the executor never slept");
    req.id = 21;
    size_t n = attnd__request__pack(&req, buf);
    uint32_t seq = post_bytes(h, 0, buf, n, (uint32_t)n);
    EXPECT_RV(c, chan_ctl(c, 0, h->id), ATTND_ERR_OK, NULL);
    cr_assert(wait_rep(h, 0, seq, REPLY_TIMEOUT_MS), "no reply after WakeChannel");
    expect_reply(slot_reply(h, 0), ATTND_ERR_NOT_FOUND, "not found in this session", "woken");

    /* a post with another socket request after it */
    cr_assert(wait_asleep(h));
    req.id = 22;
    n = attnd__request__pack(&req, buf);
    seq = post_bytes(h, 1, buf, n, (uint32_t)n);
    attnd_status st;
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    cr_assert(wait_rep(h, 1, seq, REPLY_TIMEOUT_MS), "no reply after a socket request");
    expect_reply(slot_reply(h, 1), ATTND_ERR_NOT_FOUND, NULL, "socket request");

    /* a post with nothing after it: the housekeeping tick wakes the executor */
    int64_t worst = 0;
    for (int k = 0; k < 3; k++) {
        cr_assert(wait_asleep(h));
        req.id = 23 + (uint64_t)k;
        n = attnd__request__pack(&req, buf);
        int64_t t0 = now_ms();
        seq = post_bytes(h, 2, buf, n, (uint32_t)n);
        cr_assert(wait_rep(h, 2, seq, 1000), "no reply within 1 s without WakeChannel");
        int64_t dt = now_ms() - t0;
        worst = dt > worst ? dt : worst;
        expect_reply(slot_reply(h, 2), ATTND_ERR_NOT_FOUND, NULL, "tick");
    }
    fprintf(stderr,
            "channel_e2e: a post to a sleeping executor without WakeChannel waited up to %lld ms "
            "(the 100 ms tick)\n",
            (long long)worst);
    good_step(&f.g, "posts to a sleeping executor");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- more hostile objects */

/* One object registered as two channels would have both take every request posted there (each
 * keeps its own "last taken" numbers): a request would run twice, or another session's channel
 * would answer the owner's slot with its refusal. The daemon refuses an object that is a
 * channel already (same device and inode), in the same session or another (a client that learns
 * another's object name while it is still linked and may open it: same uid, or the group of the
 * 0660 objects the library makes), naming shm_name; the first channel keeps working. */
Test(channel_e2e, second_registration_is_refused, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    EXPECT_RV(c, open_raw(c, h->name, h->size, NULL), ATTND_ERR_ALREADY_EXISTS, "shm_name");
    /* the victim: a second raw client with its own hand-made channel */
    attnd_client *v = connect_no_channel(&f.d, "victim");
    uint64_t vs = attnd_client_session(v);
    hchan vh;
    hchan_make(&vh, 2, 512, 512, 0);
    EXPECT_RV(v, open_raw(v, vh.name, vh.size, &vh.id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, open_raw(c, vh.name, vh.size, NULL), ATTND_ERR_ALREADY_EXISTS, "shm_name");
    /* both channels serve their own requests once: Create OK, then Free OK */
    cr_assert_eq(h_seq(v, &vh, 0, H_CREATE, 91, vs, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(v, &vh, 1, H_FREE, 91, vs, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 90, me, NULL), ATTND_ERR_OK);
    cr_assert_eq(h_seq(c, h, 1, H_FREE, 90, me, NULL), ATTND_ERR_OK);
    good_step(&f.g, "objects registered again");
    attnd_client_free(v);
    hchan_destroy(&vh);
    fx_finish(&f);
}

/* server.channels is shared by all sessions: a client can take every one. The daemon refuses
 * the next with UNAVAILABLE, naming the key; a client connecting then works over its socket. */
Test(channel_e2e, channels_run_out_and_clients_fall_back_to_the_socket, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG_FEW_CHANNELS);
    attnd_client *c = f.x.c;
    hchan extra[3];
    /* the good client holds one, the hostile one; two more fill server.channels = 4 */
    for (int i = 0; i < 3; i++)
        hchan_make(&extra[i], 1, 256, 256, 0);
    EXPECT_RV(c, open_raw(c, extra[0].name, extra[0].size, &extra[0].id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, open_raw(c, extra[1].name, extra[1].size, &extra[1].id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, open_raw(c, extra[2].name, extra[2].size, NULL), ATTND_ERR_UNAVAILABLE,
              "all 4 in use (server.channels)");
    good_step(&f.g, "all channels taken");
    /* a newcomer: no channel, the reason kept, its calls on the socket */
    attnd_client *late = attnd_daemon_connect(&f.d, 10000);
    cr_assert_not_null(late);
    cr_assert(!attnd_client_channel_active(late));
    cr_assert(strstr(attnd_client_channel_error(late), "server.channels") != NULL, "\"%s\"",
              attnd_client_channel_error(late));
    cr_assert_eq(attnd_client_seq_create(late, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_free(late, 1), ATTND_ERR_OK);
    attnd_client_free(late);
    EXPECT_RV(c, chan_ctl(c, 1, extra[0].id), ATTND_ERR_OK, NULL);
    EXPECT_RV(c, chan_ctl(c, 1, extra[1].id), ATTND_ERR_OK, NULL);
    for (int i = 0; i < 3; i++)
        hchan_destroy(&extra[i]);
    /* room again: the late client would get one now */
    EXPECT_RV(c, open_raw(c, extra[2].name, 0, NULL), ATTND_ERR_NOT_FOUND, NULL);
    good_step(&f.g, "channels given back");
    fx_finish(&f);
}

/* ---------------------------------------------------------------- a region cut under an Attend */

typedef struct toggler {
    int fd;
    size_t size;
    atomic_int stop;
    long flips;
} toggler;

static void *toggle_loop(void *arg)
{
    toggler *t = arg;
    while (!atomic_load(&t->stop)) {
        if (ftruncate(t->fd, 0) != 0 || ftruncate(t->fd, (off_t)t->size) != 0) break;
        t->flips++;
    }
    return NULL;
}

/* A HOST_SHM region whose client flips its size between 0 and full while Attends use it
 * (through the channel; the socket path is the same): the daemon's SIGBUS guard turns each
 * truncation under a request into zero pages, and the request, and every later one naming the
 * region, gets INVALID_ARGUMENT instead of the daemon dying. */
Test(channel_e2e, region_cut_under_an_attend_does_not_kill_the_daemon, .timeout = 60)
{
    static fixture f;
    fx_start(&f, CONFIG);
    attnd_client *c = f.x.c;
    const hchan *h = &f.x.ch;
    uint64_t me = attnd_client_session(c);
    const attnd_geometry *geo = &attnd_client_server(c)->geometry;
    char name[64];
    name_new(name, sizeof name);
    size_t size = attnd_e2e_io_bytes(geo, ATTND_DTYPE_F32, 256);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    EXPECT_RV(c, attnd_client_region_register_shm(c, 7, name, size), ATTND_ERR_OK, NULL);
    attnd_shm region = {.region = 7, .base = NULL, .size = size};
    attnd_e2e_io io; /* refs only: the data is whatever the object holds */
    attnd_e2e_io_layout(&io, geo, &region, ATTND_DTYPE_F32, 256);
    cr_assert_eq(h_seq(c, h, 0, H_CREATE, 5, me, NULL), ATTND_ERR_OK);
    toggler t = {.fd = fd, .size = size};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, toggle_loop, &t), 0);
    int ok = 0, refused = 0;
    for (int64_t end = now_ms() + 2000; now_ms() < end;) {
        uint64_t step = h_begin(c, h, 5, 256);
        for (uint32_t l = 0; l < geo->num_layers; l++) {
            attnd_err rv = h_attend(c, h, step, l, &io); /* asserts a reply comes */
            cr_assert(rv == ATTND_ERR_OK || rv == ATTND_ERR_INVALID_ARGUMENT, "%s",
                      attnd_err_name(rv));
            rv == ATTND_ERR_OK ? ok++ : refused++;
        }
        cr_assert_eq(h_end(c, h, step, 1), ATTND_ERR_OK);
    }
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    fprintf(stderr, "channel_e2e: %ld size flips, %d attends served, %d refused (shrank)\n",
            t.flips, ok, refused);
    good_step(&f.g, "a region cut under attends");
    cr_assert_eq(h_seq(c, h, 0, H_FREE, 5, me, NULL), ATTND_ERR_OK);
    EXPECT_RV(c, attnd_client_region_unregister(c, 7), ATTND_ERR_OK, NULL);
    close(fd);
    shm_unlink(name);
    fx_finish(&f);
}
