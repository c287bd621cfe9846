/* attnctl bench: latencies and the report (a table, or JSON with --json). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

static const char *const kind_names[NUM_KINDS] = {"begin_step", "attend", "end_step"};

int attnctl_lat_init(bench_lat *l, size_t cap)
{
    l->v = calloc(cap > 0 ? cap : 1, sizeof *l->v);
    l->n = 0;
    l->cap = cap;
    return l->v != NULL ? 0 : -1;
}

void attnctl_lat_add(bench_lat *l, double s)
{
    if (l->n < l->cap) l->v[l->n++] = s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const bench_lat *l, double p)
{
    size_t i;
    if (l->n == 0) return 0;
    i = (size_t)(p * (double)(l->n - 1) + 0.5);
    return l->v[i];
}

/* Merge every worker's latencies of kind k (kind NUM_KINDS = all) into out, sorted. */
static int merge_lat(const bench_worker *ws, uint32_t n, int k, bench_lat *out)
{
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < NUM_KINDS; j++)
            if (k == NUM_KINDS || k == j) total += ws[i].lat[j].n;
    if (attnctl_lat_init(out, total) != 0) return -1;
    for (uint32_t i = 0; i < n; i++)
        for (int j = 0; j < NUM_KINDS; j++)
            if (k == NUM_KINDS || k == j)
                for (size_t e = 0; e < ws[i].lat[j].n; e++)
                    attnctl_lat_add(out, ws[i].lat[j].v[e]);
    qsort(out->v, out->n, sizeof *out->v, cmp_double);
    return 0;
}

/* One row of the table: count and percentiles in µs. */
typedef struct lat_row {
    size_t count;
    double p50, p90, p99, max;
} lat_row;

/* rows[k] for each kind and rows[NUM_KINDS] for all; -1 when out of memory. */
static int lat_rows(const bench_opts *o, const bench_worker *ws, lat_row rows[NUM_KINDS + 1])
{
    for (int k = 0; k <= NUM_KINDS; k++) {
        bench_lat m;
        if (merge_lat(ws, o->clients, k, &m) != 0) return -1;
        rows[k] = (lat_row){m.n, pct(&m, 0.5) * 1e6, pct(&m, 0.9) * 1e6, pct(&m, 0.99) * 1e6,
                            m.n ? m.v[m.n - 1] * 1e6 : 0.0};
        free(m.v);
    }
    return 0;
}

/* Wall time of the timed part: first start to last end over the clients. */
static double wall_time(const bench_opts *o, const bench_worker *ws)
{
    double t0 = ws[0].t0, t1 = ws[0].t1;
    for (uint32_t i = 1; i < o->clients; i++) {
        t0 = ws[i].t0 < t0 ? ws[i].t0 : t0;
        t1 = ws[i].t1 > t1 ? ws[i].t1 : t1;
    }
    return t1 - t0 > 0 ? t1 - t0 : 1e-9;
}

static void report_text(const bench_opts *o, const bench_worker *ws, const lat_row *rows,
                        double wall)
{
    const attnd_geometry *g = &ws[0].g;
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
    for (int k = 0; k <= NUM_KINDS; k++)
        printf("%-12s %8zu %10.1f %10.1f %10.1f %10.1f\n", k < NUM_KINDS ? kind_names[k] : "all",
               rows[k].count, rows[k].p50, rows[k].p90, rows[k].p99, rows[k].max);
    printf("throughput:  %.0f requests/s (attend %.0f/s), %.0f steps/s, %.3f s\n",
           (double)rows[NUM_KINDS].count / wall, (double)rows[KIND_ATTEND].count / wall,
           (double)o->steps * o->clients / wall, wall);
}

static json_t *json_rows(const lat_row *rows)
{
    json_t *r = json_object();
    for (int k = 0; r != NULL && k <= NUM_KINDS; k++)
        json_object_set_new(r, k < NUM_KINDS ? kind_names[k] : "all",
                            json_pack("{s:I, s:f, s:f, s:f, s:f}", "count",
                                      (json_int_t)rows[k].count, "p50_us", rows[k].p50, "p90_us",
                                      rows[k].p90, "p99_us", rows[k].p99, "max_us", rows[k].max));
    return r;
}

/* {"daemon": geometry, "run": options, "requests": {kind: latencies}, "throughput": rates}. */
static int report_json(const bench_opts *o, const bench_worker *ws, const lat_row *rows,
                       double wall)
{
    const attnd_geometry *g = &ws[0].g;
    json_t *root = json_pack(
        "{s:{s:I, s:I, s:I, s:I, s:I, s:s}, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:b},"
        " s:o, s:{s:f, s:f, s:f, s:f}}",
        "daemon", "layers", (json_int_t)g->num_layers, "q_heads", (json_int_t)g->num_q_heads,
        "kv_heads", (json_int_t)g->num_kv_heads, "head_size", (json_int_t)g->head_size,
        "block_size", (json_int_t)g->block_size, "cache_dtype", attnd_dtype_name(g->cache_dtype),
        "run", "clients", (json_int_t)o->clients, "seqs", (json_int_t)o->seqs, "context",
        (json_int_t)o->context, "steps", (json_int_t)o->steps, "warmup", (json_int_t)o->warmup,
        "layers", (json_int_t)ws[0].layers, "dtype", attnd_dtype_name(ws[0].dtype), "transport",
        o->use_inline ? "inline" : "shm", "abort", o->abort || ws[0].layers < ws[0].g.num_layers,
        "requests", json_rows(rows), "throughput", "requests_per_s",
        (double)rows[NUM_KINDS].count / wall, "attends_per_s",
        (double)rows[KIND_ATTEND].count / wall, "steps_per_s", (double)o->steps * o->clients / wall,
        "wall_s", wall);
    int rc = root != NULL && json_dumpf(root, stdout, JSON_INDENT(2)) == 0 ? 0 : -1;
    json_decref(root);
    if (rc == 0) fputc('\n', stdout);
    return rc;
}

int attnctl_bench_report(const bench_opts *o, const bench_worker *ws)
{
    lat_row rows[NUM_KINDS + 1];
    double wall = wall_time(o, ws);
    if (lat_rows(o, ws, rows) != 0 || (o->json && report_json(o, ws, rows, wall) != 0)) {
        fprintf(stderr, "attnctl: bench: report: out of memory\n");
        return ATTNCTL_FAILED;
    }
    if (!o->json) report_text(o, ws, rows, wall);
    return ATTNCTL_OK;
}
