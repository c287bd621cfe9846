/* An f32 cache with per-layer options through two daemons, cuda and cpu, on the same steps: the
 * cuda backend's exact f32 kernel (sinks, window, softcap, ALiBi, scale per layer) against the
 * cpu backend, INLINE tensors (the cuda daemon stages them). */
#include "e2e_f32.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/client.h"
#include "testutil.h"

#define F_NL 4
#define F_HQ 8
#define F_HK 2
#define F_HD 96
#define F_TOL 1e-5

#define F32_CONFIG(backend)                                                                        \
    "{\"backend\": \"" backend "\", \"threads\": 8, \"server\": {\"listen\": \"@URL@\"},"          \
    " \"geometry\": {\"num_layers\": 4, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 96, \"block_size\": 16, \"cache_dtype\": \"f32\", \"num_blocks\": 256,"       \
    " \"max_blocks_per_seq\": 32, \"layers\": [{\"sliding_window\": 9},"                           \
    " {\"softcap\": 5, \"sinks\": [0.5, -1, 2, 0, 1.5, -2, 3, 0.25]},"                             \
    " {\"alibi_slopes\": true, \"sinks\": [1, 1, 1, 1, -3, -3, -3, -3]}, {\"scale\": 0.2}]},"      \
    " \"linear\": {\"slots\": 0}, \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

int attnd_e2e_f32_start(attnd_daemon_proc *cuda, attnd_daemon_proc *cpu)
{
    if (attnd_daemon_start(cuda, F32_CONFIG("cuda")) != 0) return -1;
    return attnd_daemon_start(cpu, F32_CONFIG("cpu"));
}

static void fill(attnd_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)attnd_rng_normal(r);
}

static double rel(const float *a, const float *b, size_t n)
{
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        x[i] = a[i], y[i] = b[i];
    double e = attnd_rel_l2(x, y, (int64_t)n);
    free(x);
    free(y);
    return e;
}

/* One layer of an open step on client c: INLINE q/k/v in, out and LSE back. */
static attnd_err attend(attnd_client *c, uint64_t step, uint32_t layer, int64_t T, const float *q,
                        const float *k, const float *v, float *out, float *lse)
{
    attnd_ref rq, rk, rv, ro, rl;
    int64_t sq[3] = {T, F_HQ, F_HD}, sk[3] = {T, F_HK, F_HD}, sl[2] = {F_HQ, T};
    attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, sq);
    attnd_ref_inline_in(&rk, k, ATTND_DTYPE_F32, 3, sk);
    attnd_ref_inline_in(&rv, v, ATTND_DTYPE_F32, 3, sk);
    attnd_ref_inline_out(&ro, out, ATTND_DTYPE_F32, 3, sq);
    attnd_ref_inline_out(&rl, lse, ATTND_DTYPE_F32, 2, sl);
    return attnd_client_attend(c, step, layer, &rq, &rk, &rv, &ro, &rl);
}

typedef struct f32_run {
    attnd_client *c[2]; /* cuda, cpu */
    attnd_rng rng;
    double worst_out, worst_lse;
    int layers;
} f32_run;

/* One step of n sequences over every layer on both daemons; -1 on a failed call. */
static int run_step(f32_run *r, const attnd_step_seq *seqs, size_t n, char *report, size_t rn)
{
    int64_t T = 0;
    attnd_step st[2];
    for (size_t i = 0; i < n; i++)
        T += seqs[i].new_tokens;
    size_t nq = (size_t)T * F_HQ * F_HD, nk = (size_t)T * F_HK * F_HD, nl = (size_t)T * F_HQ;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    float *o[2] = {malloc(nq * 4), malloc(nq * 4)}, *l[2] = {malloc(nl * 4), malloc(nl * 4)};
    int rv = 0;
    for (int d = 0; d < 2 && rv == 0; d++)
        if (attnd_client_step_begin(r->c[d], seqs, n, &st[d], NULL) != ATTND_ERR_OK) rv = -1;
    for (uint32_t layer = 0; layer < F_NL && rv == 0; layer++) {
        fill(&r->rng, q, nq), fill(&r->rng, k, nk), fill(&r->rng, v, nk);
        for (int d = 0; d < 2 && rv == 0; d++)
            if (attend(r->c[d], st[d].id, layer, T, q, k, v, o[d], l[d]) != ATTND_ERR_OK) rv = -1;
        if (rv) break;
        r->worst_out = fmax(r->worst_out, rel(o[0], o[1], nq));
        r->worst_lse = fmax(r->worst_lse, rel(l[0], l[1], nl));
        r->layers++;
    }
    for (int d = 0; d < 2 && rv == 0; d++)
        if (attnd_client_step_end(r->c[d], st[d].id, 0) != ATTND_ERR_OK) rv = -1;
    if (rv)
        snprintf(report, rn, "f32 cache: a call failed: %s / %s", attnd_client_last_error(r->c[0]),
                 attnd_client_last_error(r->c[1]));
    free(q), free(k), free(v), free(o[0]), free(o[1]), free(l[0]), free(l[1]);
    return rv;
}

int attnd_e2e_f32_run(const attnd_daemon_proc *cuda, const attnd_daemon_proc *cpu, char *report,
                      size_t n)
{
    f32_run r;
    memset(&r, 0, sizeof r);
    attnd_rng_seed(&r.rng, 4242);
    r.c[0] = attnd_daemon_connect(cuda, 60000);
    r.c[1] = attnd_daemon_connect(cpu, 60000);
    int rv = r.c[0] && r.c[1] ? 0 : -1;
    if (rv) snprintf(report, n, "f32 cache: cannot connect to both daemons");
    for (uint64_t id = 1; id <= 2 && rv == 0; id++)
        for (int d = 0; d < 2; d++)
            if (attnd_client_seq_create(r.c[d], id, NULL) != ATTND_ERR_OK) rv = -1;
    /* prefills of 40 and 7, twelve decode steps, then chunks of 19 and 1 */
    for (int s = 0; s < 14 && rv == 0; s++) {
        attnd_step_seq seqs[2] = {{1, s == 0 ? 40 : 1}, {2, s == 0 ? 7 : (s == 13 ? 19 : 1)}};
        rv = run_step(&r, seqs, 2, report, n);
    }
    if (rv == 0) {
        rv = r.worst_out <= F_TOL && r.worst_lse <= F_TOL ? 0 : -1;
        snprintf(report, n,
                 "f32 cache, per-layer window / softcap+sinks / ALiBi+sinks / scale: cuda daemon "
                 "vs cpu daemon over %d layer calls: out rel err %.2e, lse %.2e (tol %.0e)",
                 r.layers, r.worst_out, r.worst_lse, F_TOL);
    }
    attnd_client_free(r.c[0]);
    attnd_client_free(r.c[1]);
    return rv;
}
