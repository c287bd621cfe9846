/* Linear (lightning) attention with per-head decay lambda = exp(-slope):
 *   S_t = lambda S_{t-1} + k_t^T v_t,   o_t = q_t S_t   (S is d x e, float32).
 *
 * Prefill ports the seed's chunked algorithm, one block of block_size tokens at a time. For the
 * i-th token of a block (0-based) that starts from state S0:
 *   diagonal:     sum_{j <= i in block} lambda^(i-j) (q_i . k_j) v_j
 *   off-diagonal: lambda^(i+1) q_i S0
 *   block update: S0 <- lambda^len S0 + sum_j lambda^(len-1-j) k_j^T v_j
 * The off-diagonal exponent is i+1, as the recurrence, the seed's decode kernel and MiniMax's
 * reference have it; the seed's prefill kernel uses lambda^i (DESIGN.md, "Semantics"). Decay
 * powers are computed as exp(-slope * t), as the seed's kernels do, not by repeated products.
 *
 * One pool item is one (batch, head): its blocks depend on each other through the state, which is
 * updated in place in kv_state. */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"
#include "tile.h"

#define LINEAR_DEFAULT_BLOCK 256 /* the seed's BLOCK */

typedef struct lin_job {
    const attnd_linear_prefill_params *p;
    int64_t heads, n, d, e, block;
    atomic_int failed;
} lin_job;

/* Scratch and position of one (batch, head) item. */
typedef struct lin_seq {
    int64_t b, h;
    float *state;     /* kv_state[b][h]: row r at state + r * srow */
    int64_t srow;     /* row stride of the state */
    float *q, *k, *v; /* the current block, [block][d] / [block][e] */
    float *o;         /* one output row [e] */
    float *pw;        /* pw[t] = lambda^t, t = 0 .. block */
} lin_seq;

static int lin_seq_alloc(const lin_job *job, lin_seq *s)
{
    int64_t bl = job->block;
    s->q = malloc((size_t)(bl * (2 * job->d + job->e) + job->e + bl + 1) * sizeof(float));
    if (s->q == NULL) return -1;
    s->k = s->q + bl * job->d;
    s->v = s->k + bl * job->d;
    s->o = s->v + bl * job->e;
    s->pw = s->o + job->e;
    return 0;
}

static void lin_decay_powers(float *pw, float slope, int64_t count)
{
    for (int64_t t = 0; t < count; t++)
        pw[t] = expf(-slope * (float)t);
}

/* Token rows t0 .. t0+len-1 of q, k, v into the block scratch. */
static void lin_load_block(const lin_job *job, lin_seq *s, int64_t t0, int64_t len)
{
    const attnd_tensor *q = &job->p->q, *k = &job->p->k, *v = &job->p->v;
    for (int64_t i = 0; i < len; i++) {
        int64_t t = t0 + i;
        attnd_row_load(s->q + i * job->d, q->data, q->dtype,
                       s->b * q->strides[0] + s->h * q->strides[1] + t * q->strides[2], job->d,
                       1.0f);
        attnd_row_load(s->k + i * job->d, k->data, k->dtype,
                       s->b * k->strides[0] + s->h * k->strides[1] + t * k->strides[2], job->d,
                       1.0f);
        attnd_row_load(s->v + i * job->e, v->data, v->dtype,
                       s->b * v->strides[0] + s->h * v->strides[1] + t * v->strides[2], job->e,
                       1.0f);
    }
}

/* Output of block token i: its diagonal part plus the decayed carried state (state before the
 * block's update). */
static void lin_block_output(const lin_job *job, lin_seq *s, int64_t t0, int64_t i)
{
    const int64_t d = job->d, e = job->e;
    const float *qi = s->q + i * d;
    for (int64_t c = 0; c < e; c++)
        s->o[c] = 0.0f;
    for (int64_t j = 0; j <= i; j++)
        attnd_axpy(s->o, s->pw[i - j] * attnd_dot(qi, s->k + j * d, d), s->v + j * e, e);
    for (int64_t r = 0; r < d; r++)
        attnd_axpy(s->o, s->pw[i + 1] * qi[r], s->state + r * s->srow, e);
    const attnd_tensor *o = &job->p->out;
    attnd_row_store(o->data, o->dtype,
                    s->b * o->strides[0] + s->h * o->strides[1] + (t0 + i) * o->strides[2], s->o, e,
                    1.0f);
}

/* S <- lambda^len S + sum_j lambda^(len-1-j) k_j^T v_j */
static void lin_block_state(const lin_job *job, lin_seq *s, int64_t len)
{
    const int64_t d = job->d, e = job->e;
    for (int64_t r = 0; r < d; r++) {
        float *row = s->state + r * s->srow;
        for (int64_t c = 0; c < e; c++)
            row[c] *= s->pw[len];
        for (int64_t j = 0; j < len; j++)
            attnd_axpy(row, s->pw[len - 1 - j] * s->k[j * d + r], s->v + j * e, e);
    }
}

static void lin_prefill_item(void *arg, int64_t item)
{
    lin_job *job = arg;
    const attnd_tensor *st = &job->p->kv_state;
    lin_seq s = {.b = item / job->heads, .h = item % job->heads};
    if (lin_seq_alloc(job, &s) != 0) {
        atomic_store(&job->failed, 1);
        return;
    }
    s.state = (float *)st->data + s.b * st->strides[0] + s.h * st->strides[1];
    s.srow = st->strides[2];
    lin_decay_powers(s.pw, ((const float *)job->p->slopes.data)[s.h * job->p->slopes.strides[0]],
                     job->block + 1);
    for (int64_t t0 = 0; t0 < job->n; t0 += job->block) {
        int64_t len = job->n - t0 < job->block ? job->n - t0 : job->block;
        lin_load_block(job, &s, t0, len);
        for (int64_t i = 0; i < len; i++)
            lin_block_output(job, &s, t0, i);
        lin_block_state(job, &s, len);
    }
    free(s.q);
}

attnd_err attnd_cpu_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p)
{
    lin_job job = {.p = p,
                   .heads = p->q.shape[1],
                   .n = p->q.shape[2],
                   .d = p->q.shape[3],
                   .e = p->v.shape[3],
                   .block = p->block_size > 0 ? p->block_size : LINEAR_DEFAULT_BLOCK};
    atomic_init(&job.failed, 0);
    if (job.n == 0) return ATTND_ERR_OK;
    attnd_pool_run(attnd_cpu_pool(b), p->q.shape[0] * job.heads, lin_prefill_item, &job);
    return atomic_load(&job.failed) ? ATTND_ERR_NO_MEMORY : ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- decode */

static int64_t lin_slot(const attnd_tensor *t, int64_t b)
{
    int64_t off = b * t->strides[0];
    if (t->dtype == ATTND_DTYPE_I64) return ((const int64_t *)t->data)[off];
    return ((const int32_t *)t->data)[off];
}

/* One step of batch row b, head h: S <- lambda S + k^T v, o = q S; slot -1 writes zeros. */
static void lin_decode_one(const attnd_linear_decode_params *p, int64_t b, int64_t h)
{
    const int64_t d = p->q.shape[2], e = p->v.shape[2];
    float q[ATTND_HEAD_SIZE_MAX], k[ATTND_HEAD_SIZE_MAX], v[ATTND_HEAD_SIZE_MAX];
    float o[ATTND_HEAD_SIZE_MAX] = {0};
    int64_t slot = lin_slot(&p->slot_idx, b);
    if (slot >= 0) {
        const attnd_tensor *c = &p->kv_cache;
        float *state = (float *)c->data + slot * c->strides[0] + h * c->strides[1];
        float lambda = expf(-((const float *)p->slopes.data)[h * p->slopes.strides[0]]);
        attnd_row_load(q, p->q.data, p->q.dtype, b * p->q.strides[0] + h * p->q.strides[1], d, 1);
        attnd_row_load(k, p->k.data, p->k.dtype, b * p->k.strides[0] + h * p->k.strides[1], d, 1);
        attnd_row_load(v, p->v.data, p->v.dtype, b * p->v.strides[0] + h * p->v.strides[1], e, 1);
        for (int64_t r = 0; r < d; r++) {
            float *row = state + r * c->strides[2];
            for (int64_t j = 0; j < e; j++)
                row[j] = lambda * row[j] + k[r] * v[j];
            attnd_axpy(o, q[r], row, e);
        }
    }
    attnd_row_store(p->out.data, p->out.dtype, b * p->out.strides[0] + h * p->out.strides[1], o, e,
                    1.0f);
}

static void lin_decode_item(void *arg, int64_t item)
{
    const attnd_linear_decode_params *p = arg;
    lin_decode_one(p, item / p->q.shape[1], item % p->q.shape[1]);
}

attnd_err attnd_cpu_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p)
{
    attnd_pool_run(attnd_cpu_pool(b), p->q.shape[0] * p->q.shape[1], lin_decode_item, (void *)p);
    return ATTND_ERR_OK;
}
