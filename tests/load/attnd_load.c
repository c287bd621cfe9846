/* Load test: C concurrent clients for S seconds of mixed requests against a real daemon on a
 * loopback ipc:// socket, G of them hostile (garbage bytes, truncated messages, sessions dropped
 * in the middle of a step).
 *
 * Checks: every well-formed request of a well-behaved client got a correct reply (code OK, and
 * for Attend the right numbers: V rows of a sequence are one constant per KV head, so every
 * output row must be exactly that constant whatever the attention weights, which also proves no
 * client saw another's cache); after the run and the reclaim timeout no sequence is left and
 * every block is free; the daemon's RSS after warm-up vs at the end (reported, bounded); the
 * daemon exits cleanly on SIGTERM. Prints one summary line and "N passed, N failed".
 *
 * usage: attnd_load [--clients C] [--garbage G] [--seconds S] [--rss-limit-mib M]
 * (runs $ATTND_BUILD_DIR/daemon/attnd, as every daemon test does)
 */
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"
#include "daemon_proc.h"

#define RECLAIM_MS 300
#define MAX_SEQS 3
#define MAX_NEW 24
#define MAX_DECODE 5

#define LOAD_CONFIG                                                                                \
    "{\"backend\": \"cpu\", \"threads\": 1,"                                                       \
    " \"server\": {\"listen\": \"@URL@\", \"workers\": 32},"                                       \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 2048,"     \
    " \"max_blocks_per_seq\": 64},"                                                                \
    " \"limits\": {\"max_sessions\": 4096, \"reclaim_timeout_ms\": 300},"                          \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

typedef struct load_opts {
    int clients, garbage, seconds;
    long rss_limit_kib;
} load_opts;

typedef struct worker {
    int idx;
    const attnd_daemon_proc *d;
    atomic_bool *stop;
    uint64_t rng;
    /* well-behaved */
    uint64_t requests, ok, wrong, errors, conversations;
    char first_failure[512];
    /* hostile */
    uint64_t garbage_sent, dropped_mid_step;
} worker;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int rng_int(uint64_t *s, int lo, int hi)
{
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

__attribute__((format(printf, 2, 3))) static void fail(worker *w, const char *fmt, ...)
{
    va_list ap;
    if (w->first_failure[0] != '\0') return;
    va_start(ap, fmt);
    vsnprintf(w->first_failure, sizeof w->first_failure, fmt, ap);
    va_end(ap);
}

/* One call of a well-behaved client: counted, and any non-OK code is a failure. */
static int expect_ok(worker *w, attnd_client *c, attnd_err rv, const char *what)
{
    w->requests++;
    if (rv == ATTND_ERR_OK) {
        w->ok++;
        return 0;
    }
    w->errors++;
    fail(w, "client %d: %s: %s: %s", w->idx, what, attnd_err_name(rv), attnd_client_last_error(c));
    return -1;
}

/* ---------------------------------------------------------------- well-behaved clients */

typedef struct conv {
    int n;
    uint64_t ids[MAX_SEQS];
    uint32_t tokens[MAX_SEQS];
    float value[MAX_SEQS]; /* V of sequence s, kv head h: value[s] + 0.25 h (exact in bf16) */
} conv;

typedef struct bufs {
    float *q, *k, *v, *out;
} bufs;

/* Q and K random, V constant per (sequence, kv head); run every layer; check every output. */
static int run_step(worker *w, attnd_client *c, const attnd_geometry *g, conv *cv,
                    const uint32_t *new_tokens, bufs *b)
{
    attnd_step_seq ss[MAX_SEQS];
    attnd_step step;
    uint32_t qsl[MAX_SEQS + 1];
    for (int s = 0; s < cv->n; s++)
        ss[s] = (attnd_step_seq){cv->ids[s], new_tokens[s]};
    if (expect_ok(w, c, attnd_client_step_begin(c, ss, (size_t)cv->n, &step, qsl), "begin_step"))
        return -1;
    int64_t T = step.num_tokens, QH = g->num_q_heads, KH = g->num_kv_heads, D = g->head_size;
    for (int64_t i = 0; i < T * QH * D; i++)
        b->q[i] = (float)rng_int(&w->rng, -64, 64) / 64.0f;
    for (int64_t i = 0; i < T * KH * D; i++)
        b->k[i] = (float)rng_int(&w->rng, -64, 64) / 64.0f;
    for (int s = 0; s < cv->n; s++)
        for (uint32_t r = qsl[s]; r < qsl[s + 1]; r++)
            for (int64_t h = 0; h < KH; h++)
                for (int64_t d = 0; d < D; d++)
                    b->v[(r * KH + h) * D + d] = cv->value[s] + 0.25f * (float)h;
    int64_t qshape[3] = {T, QH, D}, kshape[3] = {T, KH, D};
    attnd_ref q, k, v, out;
    attnd_ref_inline_in(&q, b->q, ATTND_DTYPE_F32, 3, qshape);
    attnd_ref_inline_in(&k, b->k, ATTND_DTYPE_F32, 3, kshape);
    attnd_ref_inline_in(&v, b->v, ATTND_DTYPE_F32, 3, kshape);
    attnd_ref_inline_out(&out, b->out, ATTND_DTYPE_F32, 3, qshape);
    for (uint32_t layer = 0; layer < g->num_layers; layer++) {
        if (expect_ok(w, c, attnd_client_attend(c, step.id, layer, &q, &k, &v, &out, NULL),
                      "attend"))
            return -1;
        for (int s = 0; s < cv->n; s++)
            for (uint32_t r = qsl[s]; r < qsl[s + 1]; r++)
                for (int64_t h = 0; h < QH; h++) {
                    float want = cv->value[s] + 0.25f * (float)(h / (QH / KH));
                    for (int64_t d = 0; d < D; d++) {
                        float got = b->out[(r * QH + h) * D + d];
                        if (!(fabsf(got - want) <= 1e-3f * fabsf(want) + 1e-5f)) {
                            w->wrong++;
                            fail(w, "client %d: attend seq %llu row %u head %lld: %g, want %g",
                                 w->idx, (unsigned long long)cv->ids[s], r, (long long)h, got,
                                 want);
                            return -1;
                        }
                    }
                }
    }
    if (expect_ok(w, c, attnd_client_step_end(c, step.id, 0), "end_step")) return -1;
    for (int s = 0; s < cv->n; s++)
        cv->tokens[s] += new_tokens[s];
    return 0;
}

static int check_seqs(worker *w, attnd_client *c, const conv *cv)
{
    attnd_seq_info info, list[MAX_SEQS + 2];
    size_t n = 0;
    for (int s = 0; s < cv->n; s++) {
        if (expect_ok(w, c, attnd_client_seq_query(c, cv->ids[s], &info), "query")) return -1;
        if (info.num_tokens != cv->tokens[s]) {
            w->wrong++;
            fail(w, "client %d: seq %llu has %u tokens, want %u", w->idx,
                 (unsigned long long)cv->ids[s], info.num_tokens, cv->tokens[s]);
            return -1;
        }
    }
    if (expect_ok(w, c, attnd_client_seq_list(c, list, MAX_SEQS + 2, &n), "list")) return -1;
    if (n != (size_t)cv->n) {
        w->wrong++;
        fail(w, "client %d: list has %zu sequences, want %d", w->idx, n, cv->n);
        return -1;
    }
    return 0;
}

static int fork_and_free(worker *w, attnd_client *c, const conv *cv, uint64_t child)
{
    attnd_seq_info info;
    if (expect_ok(w, c, attnd_client_seq_fork(c, cv->ids[0], child, &info), "fork")) return -1;
    if (info.num_tokens != cv->tokens[0]) {
        w->wrong++;
        fail(w, "client %d: fork has %u tokens, want %u", w->idx, info.num_tokens, cv->tokens[0]);
        return -1;
    }
    return expect_ok(w, c, attnd_client_seq_free(c, child), "free fork");
}

/* Create 1..3 sequences, prefill, a few decode steps, check, maybe fork, free them all. */
static int conversation(worker *w, attnd_client *c, const attnd_geometry *g, uint64_t *next_id,
                        bufs *b)
{
    conv cv = {.n = rng_int(&w->rng, 1, MAX_SEQS)};
    uint32_t nt[MAX_SEQS];
    int rc = 0, created = 0;
    for (int s = 0; s < cv.n; s++) {
        cv.ids[s] = (*next_id)++;
        cv.value[s] = (float)rng_int(&w->rng, -32, 32) / 8.0f;
        if ((rc = expect_ok(w, c, attnd_client_seq_create(c, cv.ids[s], NULL), "create")) != 0)
            break;
        created++;
    }
    if (rc == 0) {
        for (int s = 0; s < cv.n; s++)
            nt[s] = (uint32_t)rng_int(&w->rng, 1, MAX_NEW);
        rc = run_step(w, c, g, &cv, nt, b);
    }
    for (int i = rng_int(&w->rng, 1, MAX_DECODE); rc == 0 && i > 0; i--) {
        for (int s = 0; s < cv.n; s++)
            nt[s] = 1;
        rc = run_step(w, c, g, &cv, nt, b);
    }
    if (rc == 0) rc = check_seqs(w, c, &cv);
    if (rc == 0 && rng_int(&w->rng, 0, 3) == 0) rc = fork_and_free(w, c, &cv, (*next_id)++);
    for (int s = 0; s < created; s++)
        if (expect_ok(w, c, attnd_client_seq_free(c, cv.ids[s]), "free")) rc = -1;
    w->conversations++;
    return rc;
}

static void *good_client(void *p)
{
    worker *w = p;
    attnd_client *c = attnd_daemon_connect(w->d, 10000);
    if (c == NULL) {
        fail(w, "client %d: cannot connect", w->idx);
        w->errors++;
        return NULL;
    }
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    size_t rows = (size_t)MAX_SEQS * MAX_NEW;
    bufs b = {malloc(rows * g->num_q_heads * g->head_size * sizeof(float)),
              malloc(rows * g->num_kv_heads * g->head_size * sizeof(float)),
              malloc(rows * g->num_kv_heads * g->head_size * sizeof(float)),
              malloc(rows * g->num_q_heads * g->head_size * sizeof(float))};
    uint64_t next_id = ((uint64_t)w->idx + 1) << 32;
    while (!atomic_load(w->stop))
        if (conversation(w, c, g, &next_id, &b) != 0) break;
    free(b.q);
    free(b.k);
    free(b.v);
    free(b.out);
    attnd_client_free(c);
    return NULL;
}

/* ---------------------------------------------------------------- hostile clients */

/* A raw REQ socket: send bytes, wait briefly for whatever comes back, hang up. */
static void raw_send(const char *url, const void *buf, size_t len)
{
    nng_socket s;
    nng_msg *m = NULL;
    if (nng_req0_open(&s) != 0) return;
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 200);
    if (nng_dial(s, url, NULL, 0) == 0 && nng_send(s, (void *)buf, len, 0) == 0 &&
        nng_recvmsg(s, &m, 0) == 0)
        nng_msg_free(m);
    nng_close(s);
}

static void send_garbage(worker *w)
{
    uint8_t buf[512];
    size_t len = (size_t)rng_int(&w->rng, 1, (int)sizeof buf);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)rng_next(&w->rng);
    raw_send(w->d->url, buf, len);
    w->garbage_sent++;
}

static void send_truncated(worker *w)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CreateSequence cr = ATTND__CREATE_SEQUENCE__INIT;
    uint8_t buf[64];
    req.id = 7;
    req.session = rng_next(&w->rng); /* a guessed session: must never name anyone's */
    cr.seq_id = 1;
    req.body_case = ATTND__REQUEST__BODY_CREATE;
    req.create = &cr;
    size_t len = attnd__request__pack(&req, buf);
    raw_send(w->d->url, buf, (size_t)rng_int(&w->rng, 0, 1) ? len : len - 1);
    w->garbage_sent++;
}

/* Hello, sequences, a step with one layer written, then vanish without ending it. */
static void drop_mid_step(worker *w)
{
    attnd_client *c = attnd_daemon_connect(w->d, 5000);
    if (c == NULL) return;
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    attnd_step_seq ss[2] = {{1, 5}, {2, 17}};
    attnd_step step;
    if (attnd_client_seq_create(c, 1, NULL) == ATTND_ERR_OK &&
        attnd_client_seq_create(c, 2, NULL) == ATTND_ERR_OK &&
        attnd_client_step_begin(c, ss, 2, &step, NULL) == ATTND_ERR_OK) {
        int64_t qs[3] = {step.num_tokens, g->num_q_heads, g->head_size};
        int64_t ks[3] = {step.num_tokens, g->num_kv_heads, g->head_size};
        float *q = calloc((size_t)(qs[0] * qs[1] * qs[2]), sizeof(float));
        float *k = calloc((size_t)(ks[0] * ks[1] * ks[2]), sizeof(float));
        attnd_ref rq, rk, rv, ro;
        attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, qs);
        attnd_ref_inline_in(&rk, k, ATTND_DTYPE_F32, 3, ks);
        attnd_ref_inline_in(&rv, k, ATTND_DTYPE_F32, 3, ks);
        attnd_ref_inline_out(&ro, q, ATTND_DTYPE_F32, 3, qs);
        attnd_client_attend(c, step.id, 0, &rq, &rk, &rv, &ro, NULL);
        free(q);
        free(k);
        w->dropped_mid_step++;
    }
    attnd_client_free(c);
}

static void *bad_client(void *p)
{
    worker *w = p;
    for (int i = 0; !atomic_load(w->stop); i++) {
        switch (i % 3) {
        case 0:
            send_garbage(w);
            break;
        case 1:
            send_truncated(w);
            break;
        default:
            drop_mid_step(w);
            break;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- main */

static int parse(int argc, char **argv, load_opts *o)
{
    *o = (load_opts){.clients = 16, .garbage = 4, .seconds = 10, .rss_limit_kib = 16 * 1024};
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--clients") == 0)
            o->clients = (int)v;
        else if (strcmp(argv[i], "--garbage") == 0)
            o->garbage = (int)v;
        else if (strcmp(argv[i], "--seconds") == 0)
            o->seconds = (int)v;
        else if (strcmp(argv[i], "--rss-limit-mib") == 0)
            o->rss_limit_kib = v * 1024;
        else
            return -1;
    }
    if (argc % 2 == 0 || o->clients < 1 || o->garbage < 0 || o->garbage >= o->clients ||
        o->seconds < 1)
        return -1;
    return 0;
}

/* Wait for the reclaim timeout, then: no sequence, every block free, one session (ours). */
static int check_no_leak(const attnd_daemon_proc *d, char *why, size_t n)
{
    usleep((RECLAIM_MS + 700) * 1000);
    attnd_client *c = attnd_daemon_connect(d, 5000);
    attnd_status st;
    if (c == NULL) return snprintf(why, n, "cannot connect after the run"), -1;
    attnd_err rv = attnd_client_status(c, &st);
    attnd_client_free(c);
    if (rv != ATTND_ERR_OK) return snprintf(why, n, "status: %s", attnd_err_name(rv)), -1;
    if (st.num_sequences != 0 || st.blocks_free != st.geometry.num_blocks)
        return snprintf(why, n, "leaked: %u sequences, %u of %u blocks free", st.num_sequences,
                        st.blocks_free, st.geometry.num_blocks),
               -1;
    return 0;
}

int main(int argc, char **argv)
{
    load_opts o;
    attnd_daemon_proc d;
    atomic_bool stop = false;
    int failed = 0;
    char why[256] = "";
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: attnd_load [--clients C] [--garbage G<C] [--seconds S] "
                        "[--rss-limit-mib M]\n");
        return 2;
    }
    if (attnd_daemon_start(&d, LOAD_CONFIG) != 0) return 1;
    worker *w = calloc((size_t)o.clients, sizeof *w);
    pthread_t *th = calloc((size_t)o.clients, sizeof *th);
    for (int i = 0; i < o.clients; i++) {
        w[i] = (worker){.idx = i, .d = &d, .stop = &stop, .rng = 0x9e3779b97f4a7c15ull * (i + 1)};
        pthread_create(&th[i], NULL, i < o.garbage ? bad_client : good_client, &w[i]);
    }
    double t0 = now_s(), warm_at = t0 + (o.seconds > 4 ? 2.0 : o.seconds / 2.0);
    long rss_warm = -1, rss_peak = 0;
    while (now_s() < t0 + o.seconds) {
        usleep(100000);
        long r = rss_kib(d.pid);
        if (rss_warm < 0 && now_s() >= warm_at) rss_warm = r;
        if (r > rss_peak) rss_peak = r;
    }
    atomic_store(&stop, true);
    uint64_t requests = 0, ok = 0, wrong = 0, errors = 0, convs = 0, garbage = 0, dropped = 0;
    for (int i = 0; i < o.clients; i++) {
        pthread_join(th[i], NULL);
        requests += w[i].requests, ok += w[i].ok, wrong += w[i].wrong, errors += w[i].errors;
        convs += w[i].conversations, garbage += w[i].garbage_sent;
        dropped += w[i].dropped_mid_step;
        if (w[i].first_failure[0] != '\0') fprintf(stderr, "FAIL: %s\n", w[i].first_failure);
    }
    double elapsed = now_s() - t0;
    int leak = check_no_leak(&d, why, sizeof why);
    long rss_end = rss_kib(d.pid);
    long growth = rss_end - rss_warm;
    printf("load: clients=%d (hostile %d) seconds=%.1f requests=%llu (%.0f/s) ok=%llu wrong=%llu "
           "errors=%llu conversations=%llu garbage=%llu dropped_mid_step=%llu\n",
           o.clients, o.garbage, elapsed, (unsigned long long)requests, (double)requests / elapsed,
           (unsigned long long)ok, (unsigned long long)wrong, (unsigned long long)errors,
           (unsigned long long)convs, (unsigned long long)garbage, (unsigned long long)dropped);
    printf("load: rss warm=%ld KiB peak=%ld KiB end=%ld KiB growth=%+ld KiB (limit %ld KiB)\n",
           rss_warm, rss_peak, rss_end, growth, o.rss_limit_kib);
    int checks[5] = {
        requests > 0 && ok == requests,
        wrong == 0,
        leak == 0,
        rss_warm > 0 && growth <= o.rss_limit_kib,
        0,
    };
    if (leak != 0) fprintf(stderr, "FAIL: %s\n", why);
    if (garbage == 0 && o.garbage > 0) fprintf(stderr, "FAIL: the hostile clients sent nothing\n");
    int rc = attnd_daemon_stop(&d);
    checks[4] = rc == 0 && (garbage > 0 || o.garbage == 0);
    if (rc != 0) fprintf(stderr, "FAIL: the daemon exited with %d after SIGTERM\n", rc);
    for (int i = 0; i < 5; i++)
        failed += !checks[i];
    printf("%d passed, %d failed\n", 5 - failed, failed);
    free(w);
    free(th);
    return failed ? 1 : 0;
}
