/* attnctl bench: decode steps against a running daemon; requests/s and latency percentiles.
 * Before the prefill: the daemon's free blocks are checked against what the run needs; during
 * it, a progress line on stderr (a terminal, or --progress). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define SHM_ALIGN 64
/* a terminal shows the progress line only for a prefill longer than this (seconds) */
#define PROGRESS_DELAY_S 0.5

/* The prefill's progress over every client; printed by whichever client advances it. */
struct bench_progress {
    int on, forced, tty;
    uint64_t total;
    _Atomic uint64_t done;
    pthread_mutex_t mu;
    double t0, last;
    int shown;
};

/* ---------------------------------------------------------------- options */

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"seqs", required_argument, NULL, 's'},    {"context", required_argument, NULL, 'x'},
        {"steps", required_argument, NULL, 'n'},   {"layers", required_argument, NULL, 'l'},
        {"clients", required_argument, NULL, 'c'}, {"warmup", required_argument, NULL, 'w'},
        {"dtype", required_argument, NULL, 'd'},   {"inline", no_argument, NULL, 'i'},
        {"abort", no_argument, NULL, 'a'},         {"json", no_argument, NULL, 'j'},
        {"progress", no_argument, NULL, 'p'},      {NULL, 0, NULL, 0}};
    static const char nums[] = "sxnlcw";
    static const char *const num_names[] = {"--seqs",   "--context", "--steps",
                                            "--layers", "--clients", "--warmup"};
    uint32_t *num_of[] = {&o->seqs, &o->context, &o->steps, &o->layers, &o->clients, &o->warmup};
    int c;
    *o = (bench_opts){.seqs = 4, .context = 256, .steps = 1000, .clients = 1, .warmup = 50};
    while ((c = attnctl_getopt("bench", argc, argv, ":", longopts)) != -1) {
        const char *num = strchr(nums, c);
        if (c == '?') return ATTNCTL_USAGE;
        if (num != NULL && attnctl_opt_u32("bench", num_names[num - nums], optarg,
                                           num_of[num - nums]) != ATTNCTL_OK)
            return ATTNCTL_USAGE;
        if (c == 'd' && attnctl_parse_dtype(optarg, &o->dtype) != 0)
            return attnctl_usage_error("bench", "--dtype: unknown dtype '%s' (f32, f16, bf16)",
                                       optarg);
        o->have_dtype |= c == 'd';
        o->have_layers |= c == 'l';
        o->use_inline |= c == 'i';
        o->abort |= c == 'a';
        o->json |= c == 'j';
        o->progress |= c == 'p';
    }
    if (optind < argc)
        return attnctl_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (o->seqs == 0 || o->steps == 0 || o->clients == 0)
        return attnctl_usage_error("bench", "--seqs, --steps and --clients must be > 0");
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- one client's run */

static int worker_fail(bench_worker *w, const char *what, attnd_err rv)
{
    fprintf(stderr, "attnctl: bench: %s: %s: %s\n", what, attnd_err_name(rv),
            w->c ? attnd_client_last_error(w->c) : attnd_strerror(rv));
    return ATTNCTL_FAILED;
}

/* Fill a buffer of n elements with small pseudo-random values (deterministic per worker). */
static void fill_random(void *base, attnd_dtype dt, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        attnd_store_f32(base, dt, i, (float)((double)(s >> 11) / 9007199254740992.0 - 0.5));
    }
}

/* References for `rows` rows of q/k/v/out (shm or inline buffers inside the shm mapping). */
static void set_rows(bench_worker *w, int64_t rows)
{
    int64_t qs[3] = {rows, w->g.num_q_heads, w->g.head_size};
    int64_t ks[3] = {rows, w->g.num_kv_heads, w->g.head_size};
    size_t qb = attnd_ref_nbytes(w->dtype, 3, qs), kb = attnd_ref_nbytes(w->dtype, 3, ks);
    size_t a = (qb + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
    size_t b = (kb + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
    char *base = w->shm.base;
    if (w->o->use_inline) {
        attnd_ref_inline_in(&w->q, base, w->dtype, 3, qs);
        attnd_ref_inline_in(&w->k, base + a, w->dtype, 3, ks);
        attnd_ref_inline_in(&w->v, base + a + b, w->dtype, 3, ks);
        attnd_ref_inline_out(&w->out, base + a + 2 * b, w->dtype, 3, qs);
        return;
    }
    attnd_ref_shm(&w->q, &w->shm, 0, w->dtype, 3, qs);
    attnd_ref_shm(&w->k, &w->shm, a, w->dtype, 3, ks);
    attnd_ref_shm(&w->v, &w->shm, a + b, w->dtype, 3, ks);
    attnd_ref_shm(&w->out, &w->shm, a + 2 * b, w->dtype, 3, qs);
}

/* Connect, pick dtype and layers, make the region big enough for max_rows rows. */
static int worker_setup(bench_worker *w, int64_t *max_rows)
{
    attnd_server_info si;
    attnd_err rv;
    attnd_client_opts opts = w->ctl->opts;
    int64_t rows;
    size_t row_bytes;
    if ((rv = attnd_client_alloc(&w->c, &opts)) != ATTND_ERR_OK)
        return worker_fail(w, "client", rv);
    if ((rv = attnd_client_set_tls(w->c, w->ctl->tls_ca, NULL)) != ATTND_ERR_OK ||
        (rv = attnd_client_connect(w->c, w->url, &si)) != ATTND_ERR_OK)
        return worker_fail(w, "connect", rv);
    w->g = si.geometry;
    w->limits = si.limits;
    w->dtype = w->o->have_dtype ? w->o->dtype
               : (w->g.cache_dtype == ATTND_DTYPE_F16 || w->g.cache_dtype == ATTND_DTYPE_BF16)
                   ? w->g.cache_dtype
                   : ATTND_DTYPE_F32;
    w->layers = w->o->have_layers && w->o->layers > 0 && w->o->layers < w->g.num_layers
                    ? w->o->layers
                    : w->g.num_layers;
    rows = w->o->context > w->o->seqs ? w->o->context : w->o->seqs;
    if (w->limits.max_step_tokens > 0 && rows > w->limits.max_step_tokens)
        rows = w->limits.max_step_tokens;
    if (rows < w->o->seqs)
        return worker_fail(w, "setup: --seqs above the daemon's max_step_tokens",
                           ATTND_ERR_INVALID_ARGUMENT);
    *max_rows = rows;
    row_bytes = attnd_dtype_size(w->dtype) * w->g.head_size *
                (2 * (size_t)w->g.num_q_heads + 2 * (size_t)w->g.num_kv_heads);
    if ((rv = attnd_client_shm_create(w->c, (size_t)rows * row_bytes + 4 * SHM_ALIGN, &w->shm)) !=
        ATTND_ERR_OK)
        return worker_fail(w, "shm region", rv);
    fill_random(w->shm.base, w->dtype, (int64_t)(w->shm.size / attnd_dtype_size(w->dtype)),
                (uint64_t)(uintptr_t)w);
    return ATTNCTL_OK;
}

/* One step: begin, attend layers 0..layers-1, end; latencies recorded when lats != NULL. A
 * commit needs every layer attended, so a step over fewer than the daemon's layers aborts. */
static int run_step(bench_worker *w, const attnd_step_seq *seqs, size_t n, int64_t rows,
                    uint32_t layers, int abort, bench_lat *lats)
{
    attnd_step step;
    attnd_err rv;
    double t = attnctl_now(), t2;
    set_rows(w, rows);
    if ((rv = attnd_client_step_begin(w->c, seqs, n, &step, NULL)) != ATTND_ERR_OK)
        return worker_fail(w, "begin_step", rv);
    if (lats != NULL) {
        t2 = attnctl_now();
        attnctl_lat_add(&lats[KIND_BEGIN], t2 - t);
        t = t2;
    }
    abort = abort || layers < w->g.num_layers;
    for (uint32_t l = 0; l < layers; l++) {
        rv = attnd_client_attend(w->c, step.id, l, &w->q, &w->k, &w->v, &w->out, NULL);
        if (rv != ATTND_ERR_OK) {
            worker_fail(w, "attend", rv);
            attnd_client_step_end(w->c, step.id, 1);
            return ATTNCTL_FAILED;
        }
        if (lats != NULL) {
            t2 = attnctl_now();
            attnctl_lat_add(&lats[KIND_ATTEND], t2 - t);
            t = t2;
        }
    }
    if ((rv = attnd_client_step_end(w->c, step.id, abort)) != ATTND_ERR_OK)
        return worker_fail(w, "end_step", rv);
    if (lats != NULL) attnctl_lat_add(&lats[KIND_END], attnctl_now() - t);
    return ATTNCTL_OK;
}

/* Sequence ids differ between clients, whatever the daemon's id space. */
static uint64_t seq_id_of(const bench_worker *w, uint32_t s)
{
    return ((uint64_t)w->index << 32) + s + 1;
}

/* ---------------------------------------------------------------- progress */

static void progress_init(bench_progress *p, const bench_opts *o)
{
    memset(p, 0, sizeof *p);
    p->tty = isatty(STDERR_FILENO);
    p->forced = o->progress;
    p->on = p->forced || p->tty;
    p->total = (uint64_t)o->clients * o->seqs * o->context;
    atomic_init(&p->done, 0);
    pthread_mutex_init(&p->mu, NULL);
    p->t0 = p->last = attnctl_now();
}

/* Print the line (under p->mu): on a terminal redrawn in place, else one line each time. */
static void progress_print(bench_progress *p, uint64_t done, double now)
{
    int final = done == p->total;
    fprintf(stderr, "%sattnctl: bench: prefill %llu of %llu tokens (%.0f%%), %.1f s%s",
            p->tty ? "\r" : "", (unsigned long long)done, (unsigned long long)p->total,
            100.0 * (double)done / (double)p->total, now - p->t0,
            final || !p->tty ? "\n" : "\033[K");
    p->shown = 1;
    p->last = now;
}

/* n more tokens prefilled. On a terminal the line appears once the prefill has taken
 * PROGRESS_DELAY_S and is redrawn every 0.1 s; --progress prints it from the start (a line a
 * second when stderr is not a terminal) and always ends with the final line. */
static void progress_add(bench_progress *p, uint64_t n)
{
    uint64_t done = atomic_fetch_add(&p->done, n) + n;
    int final = done == p->total, show;
    double now;
    if (!p->on) return;
    if (final)
        pthread_mutex_lock(&p->mu); /* the one that finishes prints the last line */
    else if (pthread_mutex_trylock(&p->mu) != 0)
        return;
    now = attnctl_now();
    if (final)
        show = p->forced || p->shown;
    else
        show = now - p->t0 >= (p->forced ? 0 : PROGRESS_DELAY_S) &&
               (!p->shown || now - p->last >= (p->tty ? 0.1 : 1.0));
    if (show) progress_print(p, done, now);
    pthread_mutex_unlock(&p->mu);
}

/* Create the sequences and prefill each with the context, in chunks of at most max_rows. */
static int worker_prefill(bench_worker *w, attnd_step_seq *seqs, int64_t max_rows)
{
    attnd_err rv;
    int rc;
    for (uint32_t s = 0; s < w->o->seqs; s++) {
        seqs[s].seq_id = seq_id_of(w, s);
        if ((rv = attnd_client_seq_create(w->c, seqs[s].seq_id, NULL)) != ATTND_ERR_OK)
            return worker_fail(w, "create", rv);
        for (uint32_t done = 0; done < w->o->context;) {
            uint32_t chunk = w->o->context - done;
            if (chunk > max_rows) chunk = (uint32_t)max_rows;
            attnd_step_seq one = {seqs[s].seq_id, chunk};
            if ((rc = run_step(w, &one, 1, chunk, w->g.num_layers, 0, NULL)) != ATTNCTL_OK)
                return rc;
            progress_add(w->progress, chunk);
            done += chunk;
        }
        seqs[s].new_tokens = 1;
    }
    return ATTNCTL_OK;
}

static int worker_run(bench_worker *w)
{
    attnd_step_seq *seqs = calloc(w->o->seqs, sizeof *seqs);
    int64_t max_rows = 0;
    int rc = seqs == NULL ? ATTNCTL_FAILED : worker_setup(w, &max_rows);
    for (int k = 0; rc == ATTNCTL_OK && k < NUM_KINDS; k++)
        if (attnctl_lat_init(&w->lat[k],
                             (size_t)w->o->steps * (k == KIND_ATTEND ? w->layers : 1)) != 0)
            rc = worker_fail(w, "latencies", ATTND_ERR_NO_MEMORY);
    if (rc == ATTNCTL_OK) rc = worker_prefill(w, seqs, max_rows);
    for (uint32_t i = 0; rc == ATTNCTL_OK && i < w->o->warmup; i++)
        rc = run_step(w, seqs, w->o->seqs, w->o->seqs, w->layers, w->o->abort, NULL);
    pthread_barrier_wait(w->barrier); /* every client starts the timed part together */
    w->t0 = attnctl_now();
    for (uint32_t i = 0; rc == ATTNCTL_OK && i < w->o->steps; i++)
        rc = run_step(w, seqs, w->o->seqs, w->o->seqs, w->layers, w->o->abort, w->lat);
    w->t1 = attnctl_now();
    free(seqs);
    return rc;
}

static void *worker_main(void *arg)
{
    bench_worker *w = arg;
    w->rc = worker_run(w);
    return NULL;
}

/* ---------------------------------------------------------------- command */

static void worker_cleanup(bench_worker *w)
{
    for (int k = 0; k < NUM_KINDS; k++)
        free(w->lat[k].v);
    if (w->c == NULL) return;
    for (uint32_t s = 0; s < w->o->seqs; s++)
        attnd_client_seq_free(w->c, seq_id_of(w, s));
    if (w->shm.base != NULL) attnd_client_shm_destroy(w->c, &w->shm);
    attnd_client_free(w->c);
}

/* What the decode steps add to each sequence, in words. */
static const char *steps_kept(const bench_opts *o, char *buf, size_t n)
{
    if (o->abort) return "1 slot, --abort";
    snprintf(buf, n, "--warmup %u + --steps %u", o->warmup, o->steps);
    return buf;
}

/* The blocks the run needs (every sequence of every client holds its context plus one slot per
 * step kept) against the daemon's free blocks: a clear error before any prefill. */
static int check_capacity(attnctl *ctl, const bench_opts *o)
{
    char kept[64];
    attnd_status st;
    attnd_err rv;
    if ((rv = attnd_client_status(ctl->c, &st)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "bench: status", rv);
    const attnd_geometry *g = &st.geometry;
    uint64_t bs = g->block_size > 0 ? g->block_size : 1;
    uint64_t tokens = (uint64_t)o->context + (o->abort ? 1 : (uint64_t)o->warmup + o->steps);
    uint64_t per_seq = (tokens + bs - 1) / bs, need = per_seq * o->seqs * o->clients;
    if (g->max_blocks_per_seq > 0 && per_seq > g->max_blocks_per_seq) {
        fprintf(stderr,
                "attnctl: bench: a sequence of %llu tokens (--context %u + %s) needs %llu blocks "
                "of %llu tokens; the daemon allows %u per sequence: lower --context%s\n",
                (unsigned long long)tokens, o->context, steps_kept(o, kept, sizeof kept),
                (unsigned long long)per_seq, (unsigned long long)bs, g->max_blocks_per_seq,
                o->abort ? "" : " or --steps, or --abort");
        return ATTNCTL_FAILED;
    }
    if (need > st.blocks_free) {
        fprintf(stderr,
                "attnctl: bench: %u client(s) x %u seqs x %llu tokens need %llu blocks of %llu "
                "tokens; the daemon has %u free of %u: lower --clients, --seqs, --context or "
                "--steps (--abort keeps the context fixed)\n",
                o->clients, o->seqs, (unsigned long long)tokens, (unsigned long long)need,
                (unsigned long long)bs, st.blocks_free, g->num_blocks);
        return ATTNCTL_FAILED;
    }
    return ATTNCTL_OK;
}

static void start_workers(attnctl *ctl, const bench_opts *o, bench_worker *ws,
                          pthread_barrier_t *barrier, bench_progress *progress)
{
    for (uint32_t i = 0; i < o->clients; i++) {
        ws[i].ctl = ctl;
        ws[i].url = attnd_client_url(ctl->c);
        ws[i].o = o;
        ws[i].index = i;
        ws[i].barrier = barrier;
        ws[i].progress = progress;
        if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0) {
            /* the others would wait at the barrier for it forever */
            fprintf(stderr, "attnctl: bench: cannot start client thread %u\n", i);
            exit(ATTNCTL_FAILED);
        }
    }
}

int attnctl_cmd_bench(attnctl *ctl, int argc, char **argv)
{
    bench_opts o;
    bench_worker *ws;
    bench_progress progress;
    pthread_barrier_t barrier;
    int rc;
    if ((rc = parse_opts(argc, argv, &o)) != ATTNCTL_OK || ctl->check_only) return rc;
    if ((rc = check_capacity(ctl, &o)) != ATTNCTL_OK) return rc;
    if ((ws = calloc(o.clients, sizeof *ws)) == NULL)
        return attnctl_fail(ctl, "bench", ATTND_ERR_NO_MEMORY);
    progress_init(&progress, &o);
    pthread_barrier_init(&barrier, NULL, o.clients);
    start_workers(ctl, &o, ws, &barrier, &progress);
    for (uint32_t i = 0; i < o.clients; i++) {
        pthread_join(ws[i].thread, NULL);
        if (ws[i].rc != ATTNCTL_OK) rc = ws[i].rc;
    }
    if (rc == ATTNCTL_OK) rc = attnctl_bench_report(&o, ws);
    for (uint32_t i = 0; i < o.clients; i++)
        worker_cleanup(&ws[i]);
    pthread_barrier_destroy(&barrier);
    pthread_mutex_destroy(&progress.mu);
    free(ws);
    return rc;
}
