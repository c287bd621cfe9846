/* attnctl bench: decode steps against a running daemon; requests/s and latency percentiles. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnctl.h"

#define SHM_ALIGN 64
enum { KIND_BEGIN, KIND_ATTEND, KIND_END, NUM_KINDS };
static const char *const kind_names[NUM_KINDS] = {"begin_step", "attend", "end_step"};

typedef struct bench_opts {
    uint32_t seqs, context, steps, layers, clients, warmup;
    int have_dtype, have_layers, use_inline, abort;
    attnd_dtype dtype;
} bench_opts;

/* Latencies of one kind of request, in seconds. */
typedef struct lat {
    double *v;
    size_t n, cap;
} lat;

typedef struct bench_worker {
    const attnctl *ctl;
    const bench_opts *o;
    uint32_t index;
    pthread_barrier_t *barrier;
    attnd_client *c;
    attnd_geometry g;
    attnd_limits limits;
    attnd_dtype dtype;
    uint32_t layers;
    attnd_shm shm;
    attnd_ref q, k, v, out;
    lat lat[NUM_KINDS];
    double t0, t1;
    int rc;
    pthread_t thread;
} bench_worker;

/* ---------------------------------------------------------------- options */

static int parse_u32(const char *opt, const char *val, uint32_t *out)
{
    uint64_t v;
    if (val == NULL || attnctl_parse_u64(val, &v) != 0 || v > UINT32_MAX)
        return attnctl_usage_error("bench", "%s needs a number", opt);
    *out = (uint32_t)v;
    return ATTNCTL_OK;
}

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    static const struct {
        const char *name;
        size_t off;
    } nums[] = {
        {"--seqs", offsetof(bench_opts, seqs)},       {"--context", offsetof(bench_opts, context)},
        {"--steps", offsetof(bench_opts, steps)},     {"--layers", offsetof(bench_opts, layers)},
        {"--clients", offsetof(bench_opts, clients)}, {"--warmup", offsetof(bench_opts, warmup)},
    };
    *o = (bench_opts){.seqs = 4, .context = 256, .steps = 1000, .clients = 1, .warmup = 50};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        size_t k = 0;
        for (; k < sizeof nums / sizeof nums[0] && strcmp(a, nums[k].name) != 0; k++) {
        }
        if (k < sizeof nums / sizeof nums[0]) {
            if (parse_u32(a, val, (uint32_t *)((char *)o + nums[k].off)) != ATTNCTL_OK)
                return ATTNCTL_USAGE;
            o->have_layers |= strcmp(a, "--layers") == 0;
            i++;
        } else if (strcmp(a, "--dtype") == 0) {
            if (val == NULL || attnctl_parse_dtype(val, &o->dtype) != 0)
                return attnctl_usage_error("bench", "--dtype needs f32, f16 or bf16");
            o->have_dtype = 1;
            i++;
        } else if (strcmp(a, "--inline") == 0) {
            o->use_inline = 1;
        } else if (strcmp(a, "--abort") == 0) {
            o->abort = 1;
        } else {
            return attnctl_usage_error("bench", "unexpected argument '%s'", a);
        }
    }
    if (o->seqs == 0 || o->steps == 0 || o->clients == 0)
        return attnctl_usage_error("bench", "--seqs, --steps and --clients must be > 0");
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- one client's run */

static int lat_init(lat *l, size_t cap)
{
    l->v = calloc(cap > 0 ? cap : 1, sizeof *l->v);
    l->n = 0;
    l->cap = cap;
    return l->v != NULL ? 0 : -1;
}

static void lat_add(lat *l, double s)
{
    if (l->n < l->cap) l->v[l->n++] = s;
}

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
        (rv = attnd_client_connect(w->c, w->ctl->url, &si)) != ATTND_ERR_OK)
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
                    uint32_t layers, int abort, lat *lats)
{
    attnd_step step;
    attnd_err rv;
    double t = attnctl_now(), t2;
    set_rows(w, rows);
    if ((rv = attnd_client_step_begin(w->c, seqs, n, &step, NULL)) != ATTND_ERR_OK)
        return worker_fail(w, "begin_step", rv);
    if (lats != NULL) {
        t2 = attnctl_now();
        lat_add(&lats[KIND_BEGIN], t2 - t);
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
            lat_add(&lats[KIND_ATTEND], t2 - t);
            t = t2;
        }
    }
    if ((rv = attnd_client_step_end(w->c, step.id, abort)) != ATTND_ERR_OK)
        return worker_fail(w, "end_step", rv);
    if (lats != NULL) lat_add(&lats[KIND_END], attnctl_now() - t);
    return ATTNCTL_OK;
}

/* Sequence ids differ between clients, whatever the daemon's id space. */
static uint64_t seq_id_of(const bench_worker *w, uint32_t s)
{
    return ((uint64_t)w->index << 32) + s + 1;
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
        if (lat_init(&w->lat[k], (size_t)w->o->steps * (k == KIND_ATTEND ? w->layers : 1)) != 0)
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

/* ---------------------------------------------------------------- report */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const lat *l, double p)
{
    size_t i;
    if (l->n == 0) return 0;
    i = (size_t)(p * (double)(l->n - 1) + 0.5);
    return l->v[i];
}

/* Merge every worker's latencies of kind k (kind NUM_KINDS = all) into out, sorted. */
static int merge_lat(const bench_worker *ws, uint32_t n, int k, lat *out)
{
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < NUM_KINDS; j++)
            if (k == NUM_KINDS || k == j) total += ws[i].lat[j].n;
    if (lat_init(out, total) != 0) return -1;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < NUM_KINDS; j++)
            if (k == NUM_KINDS || k == j)
                for (size_t e = 0; e < ws[i].lat[j].n; e++)
                    lat_add(out, ws[i].lat[j].v[e]);
    qsort(out->v, out->n, sizeof *out->v, cmp_double);
    return 0;
}

static void report(const bench_opts *o, const bench_worker *ws)
{
    const attnd_geometry *g = &ws[0].g;
    double t0 = ws[0].t0, t1 = ws[0].t1, wall;
    size_t all = 0, attends = 0;
    for (uint32_t i = 1; i < o->clients; i++) {
        t0 = ws[i].t0 < t0 ? ws[i].t0 : t0;
        t1 = ws[i].t1 > t1 ? ws[i].t1 : t1;
    }
    wall = t1 - t0 > 0 ? t1 - t0 : 1e-9;
    printf("bench: %u layer(s) of %u, %u q / %u kv heads, head %u, block %u, cache %s\n",
           ws[0].layers, g->num_layers, g->num_q_heads, g->num_kv_heads, g->head_size,
           g->block_size, attnd_dtype_name(g->cache_dtype));
    printf("       %u client(s) x %u seqs x 1 token per step, context %u (+%u steps%s), %s via "
           "%s, %u steps (+%u warmup)\n",
           o->clients, o->seqs, o->context, o->steps,
           o->abort || ws[0].layers < g->num_layers ? ", aborted" : "",
           attnd_dtype_name(ws[0].dtype), o->use_inline ? "inline" : "shm", o->steps, o->warmup);
    printf("%-12s %8s %10s %10s %10s %10s\n", "request", "count", "p50 us", "p90 us", "p99 us",
           "max us");
    for (int k = 0; k <= NUM_KINDS; k++) {
        lat m;
        if (merge_lat(ws, o->clients, k, &m) != 0) return;
        printf("%-12s %8zu %10.1f %10.1f %10.1f %10.1f\n", k < NUM_KINDS ? kind_names[k] : "all",
               m.n, pct(&m, 0.5) * 1e6, pct(&m, 0.9) * 1e6, pct(&m, 0.99) * 1e6,
               m.n ? m.v[m.n - 1] * 1e6 : 0.0);
        if (k == KIND_ATTEND) attends = m.n;
        if (k == NUM_KINDS) all = m.n;
        free(m.v);
    }
    printf("throughput:  %.0f requests/s (attend %.0f/s), %.0f steps/s, %.3f s\n",
           (double)all / wall, (double)attends / wall, (double)o->steps * o->clients / wall, wall);
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

int attnctl_cmd_bench(attnctl *ctl, int argc, char **argv)
{
    bench_opts o;
    bench_worker *ws;
    pthread_barrier_t barrier;
    int rc;
    if ((rc = parse_opts(argc, argv, &o)) != ATTNCTL_OK) return rc;
    if ((ws = calloc(o.clients, sizeof *ws)) == NULL)
        return attnctl_fail(ctl, "bench", ATTND_ERR_NO_MEMORY);
    pthread_barrier_init(&barrier, NULL, o.clients);
    for (uint32_t i = 0; i < o.clients; i++) {
        ws[i].ctl = ctl;
        ws[i].o = &o;
        ws[i].index = i;
        ws[i].barrier = &barrier;
        pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
    }
    rc = ATTNCTL_OK;
    for (uint32_t i = 0; i < o.clients; i++) {
        pthread_join(ws[i].thread, NULL);
        if (ws[i].rc != ATTNCTL_OK) rc = ws[i].rc;
    }
    if (rc == ATTNCTL_OK) report(&o, ws);
    for (uint32_t i = 0; i < o.clients; i++)
        worker_cleanup(&ws[i]);
    pthread_barrier_destroy(&barrier);
    free(ws);
    return rc;
}
