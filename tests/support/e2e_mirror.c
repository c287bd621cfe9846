#include "e2e_mirror.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_paged.h"

#define IO_ALIGN 64

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

int attnd_mirror_init(attnd_mirror *m, const attnd_geometry *g, const attnd_mirror_opts *o,
                      int32_t max_tokens)
{
    attnd_backend_opts bo = {2, 0};
    memset(m, 0, sizeof *m);
    if (g->num_layers > ATTND_MIRROR_MAX_LAYERS || g->block_size == 0) return -1;
    m->g = *g;
    if (o != NULL) m->o = *o;
    if (m->o.k_scale == 0) m->o.k_scale = 1;
    if (m->o.v_scale == 0) m->o.v_scale = 1;
    m->blocks_per_seq = cdiv(max_tokens, g->block_size);
    if (attnd_backend_open(&m->cpu, "cpu", &bo) != ATTND_ERR_OK) return -1;
    int64_t shape[4] = {ATTND_MIRROR_MAX_SEQS * m->blocks_per_seq, g->block_size, g->num_kv_heads,
                        g->head_size};
    for (uint32_t l = 0; l < g->num_layers; l++) {
        attnd_tt_alloc(&m->kc[l], g->cache_dtype, 4, shape);
        attnd_tt_alloc(&m->vc[l], g->cache_dtype, 4, shape);
        attnd_tt_poison(&m->kc[l]); /* keys nobody wrote are NaN: reading one shows */
        attnd_tt_poison(&m->vc[l]);
    }
    return 0;
}

static void step_tensors_free(attnd_mirror *m)
{
    attnd_tt_free(&m->bt);
    attnd_tt_free(&m->sl);
    attnd_tt_free(&m->qsl);
    attnd_tt_free(&m->slots);
}

void attnd_mirror_fini(attnd_mirror *m)
{
    for (uint32_t l = 0; l < m->g.num_layers; l++) {
        attnd_tt_free(&m->kc[l]);
        attnd_tt_free(&m->vc[l]);
    }
    step_tensors_free(m);
    if (m->cpu != NULL) attnd_backend_close(m->cpu);
    memset(m, 0, sizeof *m);
}

static attnd_mirror_seq *find(attnd_mirror *m, uint64_t id)
{
    for (int i = 0; i < ATTND_MIRROR_MAX_SEQS; i++)
        if (m->seqs[i].used && m->seqs[i].id == id) return &m->seqs[i];
    return NULL;
}

int32_t attnd_mirror_len(const attnd_mirror *m, uint64_t id)
{
    attnd_mirror_seq *s = find((attnd_mirror *)m, id);
    return s ? s->len : -1;
}

int attnd_mirror_create(attnd_mirror *m, uint64_t id)
{
    if (find(m, id) != NULL) return -1;
    for (int i = 0; i < ATTND_MIRROR_MAX_SEQS; i++) {
        if (m->seqs[i].used) continue;
        m->seqs[i] = (attnd_mirror_seq){.id = id, .slot = i, .used = 1};
        return 0;
    }
    return -1;
}

int attnd_mirror_fork(attnd_mirror *m, uint64_t parent, uint64_t child)
{
    attnd_mirror_seq *p = find(m, parent), *c;
    if (p == NULL || attnd_mirror_create(m, child) != 0) return -1;
    c = find(m, child);
    c->len = p->len;
    /* a slot's rows are contiguous: [blocks_per_seq * block_size][kv_heads][head] */
    size_t row = (size_t)m->g.num_kv_heads * m->g.head_size * attnd_dtype_size(m->g.cache_dtype);
    size_t per_slot = row * (size_t)(m->blocks_per_seq * m->g.block_size);
    for (uint32_t l = 0; l < m->g.num_layers; l++) {
        char *kb = m->kc[l].buf, *vb = m->vc[l].buf;
        memcpy(kb + per_slot * (size_t)c->slot, kb + per_slot * (size_t)p->slot, row * p->len);
        memcpy(vb + per_slot * (size_t)c->slot, vb + per_slot * (size_t)p->slot, row * p->len);
    }
    return 0;
}

void attnd_mirror_truncate(attnd_mirror *m, uint64_t id, int32_t n)
{
    attnd_mirror_seq *s = find(m, id);
    if (s != NULL) s->len = n < s->len ? s->len - n : 0;
}

void attnd_mirror_free(attnd_mirror *m, uint64_t id)
{
    attnd_mirror_seq *s = find(m, id);
    if (s != NULL) memset(s, 0, sizeof *s);
}

/* Block tables, lengths, query offsets and slots of the step's sequences. */
static void build_step(attnd_mirror *m)
{
    int64_t n = m->nstep, bps = m->blocks_per_seq, bs = m->g.block_size;
    int64_t bt_shape[2] = {n, bps}, n1 = n + 1;
    int64_t t = 0;
    attnd_tt_alloc(&m->bt, ATTND_DTYPE_I32, 2, bt_shape);
    attnd_tt_alloc(&m->sl, ATTND_DTYPE_I32, 1, &n);
    attnd_tt_alloc(&m->qsl, ATTND_DTYPE_I32, 1, &n1);
    attnd_tt_alloc(&m->slots, ATTND_DTYPE_I64, 1, &m->num_tokens);
    m->max_qlen = m->max_seqlen = 0;
    for (int64_t i = 0; i < n; i++) {
        const attnd_mirror_seq *s = &m->seqs[m->order[i]];
        for (int64_t b = 0; b < bps; b++)
            ((int32_t *)m->bt.buf)[i * bps + b] = (int32_t)(s->slot * bps + b);
        ((int32_t *)m->sl.buf)[i] = s->len + s->pend;
        ((int32_t *)m->qsl.buf)[i] = (int32_t)t;
        for (int32_t j = 0; j < s->pend; j++)
            ((int64_t *)m->slots.buf)[t++] = s->slot * bps * bs + s->len + j;
        if (s->pend > m->max_qlen) m->max_qlen = s->pend;
        if (s->len + s->pend > m->max_seqlen) m->max_seqlen = s->len + s->pend;
    }
    ((int32_t *)m->qsl.buf)[n] = (int32_t)t;
}

int attnd_mirror_begin(attnd_mirror *m, const attnd_step_seq *seqs, int32_t n)
{
    if (n <= 0 || n > ATTND_MIRROR_MAX_SEQS) return -1;
    step_tensors_free(m);
    m->nstep = n;
    m->num_tokens = 0;
    for (int32_t i = 0; i < n; i++) {
        attnd_mirror_seq *s = find(m, seqs[i].seq_id);
        if (s == NULL || s->pend != 0) return -1;
        if (s->len + (int64_t)seqs[i].new_tokens > m->blocks_per_seq * m->g.block_size) return -1;
        s->pend = (int32_t)seqs[i].new_tokens;
        m->order[i] = (int32_t)(s - m->seqs);
        m->num_tokens += s->pend;
    }
    build_step(m);
    return 0;
}

attnd_err attnd_mirror_attend(attnd_mirror *m, uint32_t layer, const attnd_tensor *q,
                              const attnd_tensor *k, const attnd_tensor *v,
                              const attnd_tensor *direct, float *direct_lse, double *ref,
                              double *ref_lse)
{
    attnd_cache_write_params cw;
    attnd_paged_params p;
    int64_t lshape[2] = {m->g.num_q_heads, m->num_tokens}, hq = m->g.num_q_heads;
    attnd_err rv;
    memset(&p, 0, sizeof p);
    p.scale = m->g.scale;
    p.k_scale = m->o.k_scale;
    p.v_scale = m->o.v_scale;
    p.softcap = m->o.softcap;
    p.sliding_window = m->o.sliding_window;
    if (m->g.layers != NULL) { /* the layer's own options, as the daemon reported them */
        const attnd_layer_opts *l = &m->g.layers[layer];
        p.scale = l->scale, p.softcap = l->softcap, p.sliding_window = (int32_t)l->sliding_window;
        p.k_scale = l->k_scale, p.v_scale = l->v_scale;
        if (l->alibi_slopes)
            attnd_tensor_init(&p.alibi_slopes, (void *)l->alibi_slopes, ATTND_DTYPE_F32, 1, &hq);
        if (l->sinks) attnd_tensor_init(&p.sinks, (void *)l->sinks, ATTND_DTYPE_F32, 1, &hq);
    }
    memset(&cw, 0, sizeof cw);
    cw.key = *k;
    cw.value = *v;
    cw.k_cache = m->kc[layer].t;
    cw.v_cache = m->vc[layer].t;
    cw.slot_mapping = m->slots.t;
    cw.k_scale = p.k_scale;
    cw.v_scale = p.v_scale;
    if ((rv = attnd_cache_write(m->cpu, &cw)) != ATTND_ERR_OK) return rv;
    p.q = *q;
    p.k_cache = m->kc[layer].t;
    p.v_cache = m->vc[layer].t;
    p.out = *direct;
    attnd_tensor_init(&p.out_lse, direct_lse, ATTND_DTYPE_F32, 2, lshape);
    p.block_tables = m->bt.t;
    p.seq_lens = m->sl.t;
    p.query_start_loc = m->qsl.t;
    p.max_query_len = m->max_qlen;
    p.max_seq_len = m->max_seqlen;
    if ((rv = attnd_paged_attention_2d(m->cpu, &p)) != ATTND_ERR_OK) return rv;
    if (ref != NULL) attnd_ref_paged(&p, ref, ref_lse);
    return ATTND_ERR_OK;
}

void attnd_mirror_end(attnd_mirror *m, int commit)
{
    for (int32_t i = 0; i < m->nstep; i++) {
        attnd_mirror_seq *s = &m->seqs[m->order[i]];
        if (commit) s->len += s->pend;
        s->pend = 0;
    }
    m->nstep = 0;
}

/* ---------------------------------------------------------------- io in a shm region */

static size_t align_up(size_t n)
{
    return (n + IO_ALIGN - 1) / IO_ALIGN * IO_ALIGN;
}

size_t attnd_e2e_io_bytes(const attnd_geometry *g, attnd_dtype dt, int64_t rows)
{
    size_t es = attnd_dtype_size(dt), r = (size_t)rows * g->head_size;
    return 2 * align_up(r * g->num_q_heads * es) + 2 * align_up(r * g->num_kv_heads * es) +
           align_up((size_t)rows * g->num_q_heads * 4);
}

/* One tensor at *off (advanced past it): a view and its reference. */
static void place(const attnd_shm *shm, size_t *off, attnd_dtype dt, int32_t ndim,
                  const int64_t *shape, attnd_tensor *t, attnd_ref *r)
{
    attnd_tensor_init(t, (char *)shm->base + *off, dt, ndim, shape);
    attnd_ref_shm(r, shm, *off, dt, ndim, shape);
    *off += align_up(attnd_ref_nbytes(dt, ndim, shape));
}

void attnd_e2e_io_layout(attnd_e2e_io *io, const attnd_geometry *g, const attnd_shm *shm,
                         attnd_dtype dt, int64_t rows)
{
    int64_t qs[3] = {rows, g->num_q_heads, g->head_size};
    int64_t ks[3] = {rows, g->num_kv_heads, g->head_size};
    int64_t ls[2] = {g->num_q_heads, rows};
    size_t off = 0;
    memset(io, 0, sizeof *io);
    place(shm, &off, dt, 3, qs, &io->q, &io->rq);
    place(shm, &off, dt, 3, ks, &io->k, &io->rk);
    place(shm, &off, dt, 3, ks, &io->v, &io->rv);
    place(shm, &off, dt, 3, qs, &io->out, &io->rout);
    place(shm, &off, ATTND_DTYPE_F32, 2, ls, &io->lse, &io->rlse);
    io->bytes = off;
}

static void fill_tensor(attnd_tensor *t, attnd_rng *r, double sigma)
{
    int64_t n = attnd_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        attnd_store_f32(t->data, t->dtype, i, (float)(sigma * attnd_rng_normal(r)));
}

static void poison(attnd_tensor *t)
{
    memset(t->data, 0xff, (size_t)attnd_tensor_numel(t) * attnd_dtype_size(t->dtype));
}

void attnd_e2e_io_fill(attnd_e2e_io *io, attnd_rng *r, double sigma)
{
    fill_tensor(&io->q, r, sigma);
    fill_tensor(&io->k, r, sigma);
    fill_tensor(&io->v, r, 1.0);
    poison(&io->out);
    poison(&io->lse);
}

/* ---------------------------------------------------------------- comparisons */

static double rel_l2(const attnd_tensor *a, const attnd_tensor *bt, const double *bd)
{
    int64_t n = attnd_tensor_numel(a);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = attnd_load_f32(a->data, a->dtype, i);
        double y = bt ? attnd_load_f32(bt->data, bt->dtype, i) : bd[i];
        if (!isfinite(x)) return INFINITY;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double attnd_e2e_rel_l2_t(const attnd_tensor *a, const attnd_tensor *b)
{
    return rel_l2(a, b, NULL);
}

double attnd_e2e_rel_l2_d(const attnd_tensor *a, const double *b)
{
    return rel_l2(a, NULL, b);
}

double attnd_e2e_lse_err(const attnd_tensor *a, const double *b)
{
    int64_t n = attnd_tensor_numel(a);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = ((const float *)a->data)[i];
        if (isinf(b[i]) || !isfinite(x)) {
            if (x != b[i]) return INFINITY;
            continue;
        }
        if (fabs(x - b[i]) > worst) worst = fabs(x - b[i]);
    }
    return worst;
}

double attnd_e2e_direct_tol(attnd_dtype out_dtype)
{
    switch (out_dtype) {
    case ATTND_DTYPE_F32:
        return 1e-5;
    case ATTND_DTYPE_F16:
        return 2e-4;
    default:
        return 1e-3;
    }
}

/* ---------------------------------------------------------------- one step through the daemon */

static double fmax_nan(double a, double b)
{
    return (isnan(a) || isnan(b)) ? INFINITY : (a > b ? a : b);
}

void attnd_e2e_errs_max(attnd_e2e_errs *errs, double direct, double direct_lse, double ref,
                        double ref_lse)
{
    errs->direct = fmax_nan(errs->direct, direct);
    errs->direct_lse = fmax_nan(errs->direct_lse, direct_lse);
    errs->ref = fmax_nan(errs->ref, ref);
    errs->ref_lse = fmax_nan(errs->ref_lse, ref_lse);
    errs->attends++;
}

static attnd_err call_failed(attnd_client *c, const char *what, attnd_err rv)
{
    fprintf(stderr, "e2e: %s: %s: %s\n", what, attnd_err_name(rv), attnd_client_last_error(c));
    return rv;
}

/* BeginStep on both sides; the daemon's layout must be the mirror's. */
static attnd_err begin_both(attnd_client *c, attnd_mirror *m, const attnd_step_seq *seqs, int32_t n,
                            attnd_step *step)
{
    uint32_t qsl[ATTND_MIRROR_MAX_SEQS + 1];
    attnd_err rv;
    if (attnd_mirror_begin(m, seqs, n) != 0) {
        fprintf(stderr, "e2e: mirror cannot begin this step\n");
        return ATTND_ERR_INTERNAL;
    }
    if ((rv = attnd_client_step_begin(c, seqs, (size_t)n, step, qsl)) != ATTND_ERR_OK) {
        attnd_mirror_end(m, 0);
        return call_failed(c, "begin_step", rv);
    }
    if (step->num_tokens != m->num_tokens) {
        fprintf(stderr, "e2e: begin_step: num_tokens %u, expected %lld\n", step->num_tokens,
                (long long)m->num_tokens);
        return ATTND_ERR_INTERNAL;
    }
    for (int32_t i = 0; i <= n; i++) {
        if ((int32_t)qsl[i] != ((int32_t *)m->qsl.buf)[i]) {
            fprintf(stderr, "e2e: begin_step: query_start_loc[%d] %u, expected %d\n", i, qsl[i],
                    ((int32_t *)m->qsl.buf)[i]);
            return ATTND_ERR_INTERNAL;
        }
    }
    return ATTND_ERR_OK;
}

/* Attend through the daemon with the io's refs (or inline copies of them). */
static attnd_err attend_remote(attnd_client *c, attnd_e2e_io *io, uint64_t step, uint32_t layer,
                               int use_inline)
{
    attnd_ref q = io->rq, k = io->rk, v = io->rv, out = io->rout, lse = io->rlse;
    if (use_inline) {
        attnd_ref_inline_in(&q, io->q.data, io->q.dtype, 3, io->q.shape);
        attnd_ref_inline_in(&k, io->k.data, io->k.dtype, 3, io->k.shape);
        attnd_ref_inline_in(&v, io->v.data, io->v.dtype, 3, io->v.shape);
        attnd_ref_inline_out(&out, io->out.data, io->out.dtype, 3, io->out.shape);
        attnd_ref_inline_out(&lse, io->lse.data, ATTND_DTYPE_F32, 2, io->lse.shape);
    }
    return attnd_client_attend(c, step, layer, &q, &k, &v, &out, &lse);
}

/* Expected outputs of one Attend: the CPU op's (f32) and the reference's (f64). */
typedef struct expect {
    void *dout;
    attnd_tensor direct; /* over dout, in the requested out dtype */
    float *dlse;
    double *rout, *rlse, *dlse64;
    int64_t nout, nlse;
} expect;

static int expect_alloc(expect *e, const attnd_mirror *m, attnd_dtype dt)
{
    int64_t shape[3] = {m->num_tokens, m->g.num_q_heads, m->g.head_size};
    e->nout = m->num_tokens * m->g.num_q_heads * m->g.head_size;
    e->nlse = m->num_tokens * m->g.num_q_heads;
    e->dout = malloc((size_t)e->nout * attnd_dtype_size(dt) + 1);
    attnd_tensor_init(&e->direct, e->dout, dt, 3, shape);
    e->dlse = malloc((size_t)e->nlse * sizeof *e->dlse + 1);
    e->rout = malloc((size_t)e->nout * sizeof *e->rout + 1);
    e->rlse = malloc((size_t)e->nlse * sizeof *e->rlse + 1);
    e->dlse64 = malloc((size_t)e->nlse * sizeof *e->dlse64 + 1);
    return e->dout && e->dlse && e->rout && e->rlse && e->dlse64 ? 0 : -1;
}

static void expect_free(expect *e)
{
    free(e->dout);
    free(e->dlse);
    free(e->rout);
    free(e->rlse);
    free(e->dlse64);
}

/* The daemon's out / out_lse in io against both expectations. */
static void compare(const attnd_e2e_io *io, expect *e, attnd_e2e_errs *errs)
{
    for (int64_t i = 0; i < e->nlse; i++)
        e->dlse64[i] = e->dlse[i];
    attnd_e2e_errs_max(errs, attnd_e2e_rel_l2_t(&io->out, &e->direct),
                       attnd_e2e_lse_err(&io->lse, e->dlse64),
                       attnd_e2e_rel_l2_d(&io->out, e->rout), attnd_e2e_lse_err(&io->lse, e->rlse));
}

attnd_err attnd_e2e_attend_layers(attnd_client *c, attnd_mirror *m, const attnd_shm *shm,
                                  attnd_dtype dt, int use_inline, uint64_t step, attnd_rng *r,
                                  attnd_e2e_errs *errs)
{
    attnd_e2e_io io;
    expect e;
    attnd_err rv = ATTND_ERR_OK;
    if (expect_alloc(&e, m, dt) != 0) {
        expect_free(&e);
        return ATTND_ERR_NO_MEMORY;
    }
    attnd_e2e_io_layout(&io, &m->g, shm, dt, m->num_tokens);
    for (uint32_t l = 0; rv == ATTND_ERR_OK && l < m->g.num_layers; l++) {
        attnd_e2e_io_fill(&io, r, 1.0);
        if ((rv = attend_remote(c, &io, step, l, use_inline)) != ATTND_ERR_OK) {
            call_failed(c, "attend", rv);
            break;
        }
        rv = attnd_mirror_attend(m, l, &io.q, &io.k, &io.v, &e.direct, e.dlse, e.rout, e.rlse);
        if (rv != ATTND_ERR_OK) {
            fprintf(stderr, "e2e: the CPU op failed locally: %s\n", attnd_err_name(rv));
            break;
        }
        compare(&io, &e, errs);
    }
    expect_free(&e);
    return rv;
}

attnd_err attnd_e2e_step(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, attnd_dtype dt,
                         int use_inline, const attnd_step_seq *seqs, int32_t n, int abort,
                         attnd_rng *r, attnd_e2e_errs *errs)
{
    attnd_step step;
    attnd_err rv;
    if ((rv = begin_both(c, m, seqs, n, &step)) != ATTND_ERR_OK) return rv;
    if (attnd_e2e_io_bytes(&m->g, dt, m->num_tokens) > shm->size) {
        fprintf(stderr, "e2e: region of %zu bytes too small for %lld rows\n", shm->size,
                (long long)m->num_tokens);
        rv = ATTND_ERR_INTERNAL;
    } else {
        rv = attnd_e2e_attend_layers(c, m, shm, dt, use_inline, step.id, r, errs);
    }
    if (rv != ATTND_ERR_OK) {
        attnd_client_step_end(c, step.id, 1);
        attnd_mirror_end(m, 0);
        return rv;
    }
    if ((rv = attnd_client_step_end(c, step.id, abort)) != ATTND_ERR_OK) {
        attnd_mirror_end(m, 0);
        return call_failed(c, "end_step", rv);
    }
    attnd_mirror_end(m, !abort);
    return ATTND_ERR_OK;
}
