/* Block-sparse varlen attention (the seed's blocksparse_flash_attn_varlen_fwd).
 *
 * Query i of a sequence sits at position past + i (past = k_len - q_len: 0 for prefill, k_len - 1
 * for decode) and uses layout row r = position / q_block_size of its q head: it may see the key
 * blocks layout_col[h][crow[h][r] .. crow[h][r+1]-1], each keys kb*block_size .., causally
 * (key <= position, key < k_len). The seed applies the causal mask only in the last listed block
 * (it assumes the layout is lower-triangular with the diagonal block last); masking every block
 * gives the same result for such layouts and stays correct for any other. A row with no visible
 * key (an empty layout row) is written as zeros, where the seed would read col[crow - 1].
 *
 * One pool item is (sequence, q head, layout row): the query rows of one row block share the
 * listed key blocks, so each block's K/V is converted to float32 once per item. */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"
#include "tile.h"

typedef struct bs_job {
    const attnd_blocksparse_params *p;
    int64_t batch, num_q_heads, group, d, bs, qbs;
    int64_t *item_start; /* [batch + 1]: index of each sequence's first (row block, head) item */
    atomic_int failed;
} bs_job;

/* One item: sequence b, q head h, query rows i0..i1-1 (all in layout row r). */
typedef struct bs_tile {
    int64_t b, h, r, q0, k0, lq, lk, past, i0, i1;
    float *q, *acc, *kb, *vb, *x;
    attnd_softmax *st;
} bs_tile;

static int64_t i32_at(const attnd_tensor *t, int64_t i, int64_t j)
{
    return ((const int32_t *)t->data)[i * t->strides[0] + (t->ndim > 1 ? j * t->strides[1] : 0)];
}

/* Layout rows touched by sequence lengths (lq, lk): positions past .. lk-1. */
static int64_t bs_first_row(const bs_job *job, int64_t lq, int64_t lk)
{
    return (lk - lq) / job->qbs;
}

static int64_t bs_row_count(const bs_job *job, int64_t lq, int64_t lk)
{
    return lq == 0 ? 0 : (lk - 1) / job->qbs - bs_first_row(job, lq, lk) + 1;
}

static void bs_locate(const bs_job *job, int64_t item, bs_tile *t)
{
    const attnd_blocksparse_params *p = job->p;
    int64_t lo = 0, hi = job->batch - 1;
    while (lo < hi) { /* last sequence whose first item is <= item */
        int64_t mid = (lo + hi + 1) / 2;
        if (job->item_start[mid] <= item)
            lo = mid;
        else
            hi = mid - 1;
    }
    int64_t local = item - job->item_start[lo];
    t->b = lo;
    t->h = local % job->num_q_heads;
    t->q0 = i32_at(&p->cu_seqlens_q, lo, 0);
    t->k0 = i32_at(&p->cu_seqlens_k, lo, 0);
    t->lq = i32_at(&p->cu_seqlens_q, lo + 1, 0) - t->q0;
    t->lk = i32_at(&p->cu_seqlens_k, lo + 1, 0) - t->k0;
    t->past = t->lk - t->lq;
    t->r = bs_first_row(job, t->lq, t->lk) + local / job->num_q_heads;
    t->i0 = t->r * job->qbs - t->past > 0 ? t->r * job->qbs - t->past : 0;
    t->i1 = (t->r + 1) * job->qbs - t->past < t->lq ? (t->r + 1) * job->qbs - t->past : t->lq;
}

static int bs_tile_alloc(const bs_job *job, bs_tile *t)
{
    int64_t rows = t->i1 - t->i0, d = job->d, bs = job->bs;
    t->q = malloc((size_t)(2 * rows * d + 2 * bs * d + bs) * sizeof(float));
    t->st = malloc((size_t)rows * sizeof *t->st);
    if (t->q == NULL || t->st == NULL) {
        free(t->q);
        free(t->st);
        return -1;
    }
    t->acc = t->q + rows * d;
    t->kb = t->acc + rows * d;
    t->vb = t->kb + bs * d;
    t->x = t->vb + bs * d;
    return 0;
}

static void bs_load_q(const bs_job *job, bs_tile *t)
{
    const attnd_tensor *q = &job->p->q;
    for (int64_t i = t->i0; i < t->i1; i++) {
        int64_t ri = i - t->i0;
        attnd_row_load(t->q + ri * job->d, q->data, q->dtype,
                       (t->q0 + i) * q->strides[0] + t->h * q->strides[1], job->d, 1.0f);
        attnd_softmax_init(&t->st[ri], t->acc + ri * job->d, job->d);
    }
}

/* Keys kstart .. kstart+n-1 of the sequence's kv head into kb/vb. */
static void bs_load_kv(const bs_job *job, bs_tile *t, int64_t kstart, int64_t n)
{
    const attnd_tensor *k = &job->p->k, *v = &job->p->v;
    int64_t kvh = t->h / job->group;
    for (int64_t j = 0; j < n; j++) {
        int64_t row = t->k0 + kstart + j;
        attnd_row_load(t->kb + j * job->d, k->data, k->dtype,
                       row * k->strides[0] + kvh * k->strides[1], job->d, 1.0f);
        attnd_row_load(t->vb + j * job->d, v->data, v->dtype,
                       row * v->strides[0] + kvh * v->strides[1], job->d, 1.0f);
    }
}

/* Fold listed key block kb into every row of the tile that sees part of it. */
static void bs_key_block(const bs_job *job, bs_tile *t, int64_t kb)
{
    int64_t kstart = kb * job->bs;
    int64_t kend = kstart + job->bs < t->lk ? kstart + job->bs : t->lk;
    int64_t last_pos = t->past + t->i1 - 1;
    if (kend > last_pos + 1) kend = last_pos + 1; /* causal: nothing past the last row */
    if (kend <= kstart) return;
    bs_load_kv(job, t, kstart, kend - kstart);
    for (int64_t i = t->i0; i < t->i1; i++) {
        int64_t ri = i - t->i0, lim = t->past + i + 1 - kstart; /* key <= position */
        if (lim <= 0) continue;
        attnd_block_logits(t->x, t->q + ri * job->d, t->kb, kend - kstart, lim, job->d,
                           job->p->scale);
        attnd_block_accumulate(&t->st[ri], t->acc + ri * job->d, t->x, t->vb, kend - kstart, job->d,
                               0.0f);
    }
}

static void bs_store(const bs_job *job, const bs_tile *t)
{
    const attnd_tensor *o = &job->p->out;
    for (int64_t i = t->i0; i < t->i1; i++) {
        int64_t ri = i - t->i0;
        attnd_row_store(o->data, o->dtype, (t->q0 + i) * o->strides[0] + t->h * o->strides[1],
                        t->acc + ri * job->d, job->d, attnd_softmax_inv_sum(&t->st[ri]));
    }
}

static void bs_item(void *arg, int64_t item)
{
    bs_job *job = arg;
    const attnd_blocksparse_params *p = job->p;
    bs_tile t;
    bs_locate(job, item, &t);
    if (bs_tile_alloc(job, &t) != 0) {
        atomic_store(&job->failed, 1);
        return;
    }
    bs_load_q(job, &t);
    int64_t c0 = i32_at(&p->layout_crow, t.h, t.r), c1 = i32_at(&p->layout_crow, t.h, t.r + 1);
    for (int64_t c = c0; c < c1; c++)
        bs_key_block(job, &t, i32_at(&p->layout_col, t.h, c));
    bs_store(job, &t);
    free(t.q);
    free(t.st);
}

attnd_err attnd_cpu_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p)
{
    bs_job job = {.p = p,
                  .batch = p->cu_seqlens_q.shape[0] - 1,
                  .num_q_heads = p->q.shape[1],
                  .group = p->q.shape[1] / p->k.shape[1],
                  .d = p->q.shape[2],
                  .bs = p->block_size,
                  .qbs = p->q_block_size > 0 ? p->q_block_size : p->block_size};
    if (job.batch <= 0) return ATTND_ERR_OK;
    atomic_init(&job.failed, 0);
    job.item_start = malloc((size_t)(job.batch + 1) * sizeof *job.item_start);
    if (job.item_start == NULL) return ATTND_ERR_NO_MEMORY;
    job.item_start[0] = 0;
    for (int64_t s = 0; s < job.batch; s++) {
        int64_t lq = i32_at(&p->cu_seqlens_q, s + 1, 0) - i32_at(&p->cu_seqlens_q, s, 0);
        int64_t lk = i32_at(&p->cu_seqlens_k, s + 1, 0) - i32_at(&p->cu_seqlens_k, s, 0);
        job.item_start[s + 1] = job.item_start[s] + bs_row_count(&job, lq, lk) * job.num_q_heads;
    }
    attnd_pool_run(attnd_cpu_pool(b), job.item_start[job.batch], bs_item, &job);
    free(job.item_start);
    return atomic_load(&job.failed) ? ATTND_ERR_NO_MEMORY : ATTND_ERR_OK;
}
