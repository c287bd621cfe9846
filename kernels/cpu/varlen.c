/* Varlen attention over contiguous packed Q/K/V (the seed's triton_flash_attention forward).
 *
 * One pool item is (sequence, kv head, tile of VARLEN_TILE_M query rows) and covers every q head
 * of the kv head's group, so each K/V block is converted to float32 once for all of them. Keys
 * are visited in blocks of VARLEN_BLOCK_N with an FA2 online softmax, like the seed.
 *
 * Semantics, as the seed computes them (natural-log units):
 *   logit = scale * (q . k) + bias   -- the seed folds scale into q and adds bias * log2(e), so the
 *                                       bias is not multiplied by scale.
 *   fp8 inputs are read as x8 * q_scale / k_scale / v_scale; P is quantised to fp8 as
 *   p / p_scale (p relative to the running max of the key block, the seed's m_ij) and read back
 *   times p_scale in the PV product, while the softmax sum uses the unquantised p.
 *   An fp8 output stores o / out_scale, saturating at +-448.
 * The seed also rounds scale * q and (outside fp8) P to the input dtype before its dot products;
 * we keep both in float32, a difference inside the dtype's tolerance.
 * Bias is indexed [sequence, q head, query row, key] with rows and keys local to the sequence.
 * (The seed never adds its batch stride, so it reads sequence 0's bias for every sequence; we
 * follow the documented shape.) Rows that see no key are written as zeros. */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"
#include "tile.h"

#define VARLEN_TILE_M 16
#define VARLEN_BLOCK_N 64

typedef struct varlen_job {
    const attnd_varlen_params *p;
    int64_t batch, num_kv_heads, group, d;
    int64_t *tile_start; /* [batch + 1]: index of each sequence's first tile */
    float q_scale, k_scale, v_scale;
    float p_scale; /* 0 unless the inputs are fp8 */
    float out_mul; /* 1 / out_scale for an fp8 output, else 1 */
    atomic_int failed;
} varlen_job;

/* Where one item works: sequence b, kv head, query rows r0..r1-1 of the sequence. */
typedef struct varlen_tile {
    int64_t b, kvh, q0, k0, lq, lk, r0, r1;
    int64_t rows; /* (r1 - r0) * group: row ri = (r - r0) * group + g */
    float *q, *acc, *kb, *vb, *x;
    attnd_softmax *st;
} varlen_tile;

static int64_t cu_at(const attnd_tensor *t, int64_t i)
{
    return ((const int32_t *)t->data)[i * t->strides[0]];
}

static void varlen_locate(const varlen_job *job, int64_t item, varlen_tile *t)
{
    const attnd_varlen_params *p = job->p;
    int64_t tile = item / job->num_kv_heads, lo = 0, hi = job->batch - 1;
    t->kvh = item % job->num_kv_heads;
    while (lo < hi) { /* last sequence whose first tile is <= tile */
        int64_t mid = (lo + hi + 1) / 2;
        if (job->tile_start[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    t->b = lo;
    t->q0 = cu_at(&p->cu_seqlens_q, lo);
    t->k0 = cu_at(&p->cu_seqlens_k, lo);
    t->lq = cu_at(&p->cu_seqlens_q, lo + 1) - t->q0;
    t->lk = cu_at(&p->cu_seqlens_k, lo + 1) - t->k0;
    t->r0 = (tile - job->tile_start[lo]) * VARLEN_TILE_M;
    t->r1 = t->r0 + VARLEN_TILE_M < t->lq ? t->r0 + VARLEN_TILE_M : t->lq;
    t->rows = (t->r1 - t->r0) * job->group;
}

static int varlen_tile_alloc(const varlen_job *job, varlen_tile *t)
{
    int64_t d = job->d;
    size_t floats = (size_t)(2 * t->rows * d + 2 * VARLEN_BLOCK_N * d + VARLEN_BLOCK_N);
    t->q = malloc(floats * sizeof(float));
    t->st = malloc((size_t)t->rows * sizeof *t->st);
    if (t->q == NULL || t->st == NULL) {
        free(t->q);
        free(t->st);
        return -1;
    }
    t->acc = t->q + t->rows * d;
    t->kb = t->acc + t->rows * d;
    t->vb = t->kb + VARLEN_BLOCK_N * d;
    t->x = t->vb + VARLEN_BLOCK_N * d;
    return 0;
}

/* Exclusive end of the keys query row r may see (<= 0: none). */
static int64_t varlen_key_end(const varlen_job *job, const varlen_tile *t, int64_t r)
{
    if (!job->p->causal) return t->lk;
    int64_t end = r + t->lk - t->lq + 1; /* bottom-right aligned: j <= r + Lk - Lq */
    return end < t->lk ? end : t->lk;
}

static void varlen_load_q(const varlen_job *job, varlen_tile *t)
{
    const attnd_tensor *q = &job->p->q;
    for (int64_t r = t->r0; r < t->r1; r++)
        for (int64_t g = 0; g < job->group; g++) {
            int64_t ri = (r - t->r0) * job->group + g, h = t->kvh * job->group + g;
            int64_t off = (t->q0 + r) * q->strides[0] + h * q->strides[1];
            attnd_row_load(t->q + ri * job->d, q->data, q->dtype, off, job->d, job->q_scale);
            attnd_softmax_init(&t->st[ri], t->acc + ri * job->d, job->d);
        }
}

/* K and V rows kb0 .. kb0+n-1 of the sequence's kv head, as float32. */
static void varlen_load_kv(const varlen_job *job, varlen_tile *t, int64_t kb0, int64_t n)
{
    const attnd_tensor *k = &job->p->k, *v = &job->p->v;
    for (int64_t j = 0; j < n; j++) {
        int64_t row = t->k0 + kb0 + j;
        attnd_row_load(t->kb + j * job->d, k->data, k->dtype,
                       row * k->strides[0] + t->kvh * k->strides[1], job->d, job->k_scale);
        attnd_row_load(t->vb + j * job->d, v->data, v->dtype,
                       row * v->strides[0] + t->kvh * v->strides[1], job->d, job->v_scale);
    }
}

static void varlen_add_bias(const varlen_job *job, const varlen_tile *t, int64_t r, int64_t h,
                            int64_t kb0, int64_t n)
{
    const attnd_tensor *bias = &job->p->bias;
    int64_t base = t->b * bias->strides[0] + h * bias->strides[1] + r * bias->strides[2];
    for (int64_t j = 0; j < n; j++)
        if (t->x[j] != -INFINITY)
            t->x[j] += attnd_load_f32(bias->data, bias->dtype, base + (kb0 + j) * bias->strides[3]);
}

/* Fold keys kb0 .. kb0+n-1 (already in kb/vb) into every row of the tile that sees any. */
static void varlen_key_block(const varlen_job *job, varlen_tile *t, int64_t kb0, int64_t n)
{
    const int64_t d = job->d;
    for (int64_t r = t->r0; r < t->r1; r++) {
        int64_t lim = varlen_key_end(job, t, r) - kb0;
        if (lim <= 0) continue;
        for (int64_t g = 0; g < job->group; g++) {
            int64_t ri = (r - t->r0) * job->group + g;
            attnd_block_logits(t->x, t->q + ri * d, t->kb, n, lim, d, job->p->scale);
            if (job->p->bias.data != NULL)
                varlen_add_bias(job, t, r, t->kvh * job->group + g, kb0, n);
            attnd_block_accumulate(&t->st[ri], t->acc + ri * d, t->x, t->vb, n, d, job->p_scale);
        }
    }
}

static void varlen_store(const varlen_job *job, const varlen_tile *t)
{
    const attnd_tensor *o = &job->p->out;
    for (int64_t r = t->r0; r < t->r1; r++)
        for (int64_t g = 0; g < job->group; g++) {
            int64_t ri = (r - t->r0) * job->group + g, h = t->kvh * job->group + g;
            float mul = attnd_softmax_inv_sum(&t->st[ri]) * job->out_mul;
            attnd_row_store(o->data, o->dtype, (t->q0 + r) * o->strides[0] + h * o->strides[1],
                            t->acc + ri * job->d, job->d, mul);
        }
}

static void varlen_item(void *arg, int64_t item)
{
    varlen_job *job = arg;
    varlen_tile t;
    varlen_locate(job, item, &t);
    if (varlen_tile_alloc(job, &t) != 0) {
        atomic_store(&job->failed, 1);
        return;
    }
    varlen_load_q(job, &t);
    int64_t kend = varlen_key_end(job, &t, t.r1 - 1); /* the tile's last row sees the most */
    for (int64_t kb0 = 0; kb0 < kend; kb0 += VARLEN_BLOCK_N) {
        int64_t n = kend - kb0 < VARLEN_BLOCK_N ? kend - kb0 : VARLEN_BLOCK_N;
        varlen_load_kv(job, &t, kb0, n);
        varlen_key_block(job, &t, kb0, n);
    }
    varlen_store(job, &t);
    free(t.q);
    free(t.st);
}

static void varlen_job_init(varlen_job *job, const attnd_varlen_params *p)
{
    int fp8_in = p->q.dtype == ATTND_DTYPE_FP8_E4M3;
    job->p = p;
    job->batch = p->cu_seqlens_q.shape[0] - 1;
    job->num_kv_heads = p->k.shape[1];
    job->group = p->q.shape[1] / p->k.shape[1];
    job->d = p->q.shape[2];
    job->q_scale = fp8_in ? p->q_scale : 1.0f;
    job->k_scale = fp8_in ? p->k_scale : 1.0f;
    job->v_scale = fp8_in ? p->v_scale : 1.0f;
    job->p_scale = fp8_in ? p->p_scale : 0.0f;
    job->out_mul = p->out.dtype == ATTND_DTYPE_FP8_E4M3 ? 1.0f / p->out_scale : 1.0f;
    atomic_init(&job->failed, 0);
}

attnd_err attnd_cpu_varlen(attnd_backend *b, const attnd_varlen_params *p)
{
    varlen_job job;
    varlen_job_init(&job, p);
    if (job.batch <= 0) return ATTND_ERR_OK;
    job.tile_start = malloc((size_t)(job.batch + 1) * sizeof *job.tile_start);
    if (job.tile_start == NULL) return ATTND_ERR_NO_MEMORY;
    job.tile_start[0] = 0;
    for (int64_t s = 0; s < job.batch; s++) {
        int64_t lq = cu_at(&p->cu_seqlens_q, s + 1) - cu_at(&p->cu_seqlens_q, s);
        job.tile_start[s + 1] = job.tile_start[s] + (lq + VARLEN_TILE_M - 1) / VARLEN_TILE_M;
    }
    attnd_pool_run(attnd_cpu_pool(b), job.tile_start[job.batch] * job.num_kv_heads, varlen_item,
                   &job);
    free(job.tile_start);
    return atomic_load(&job.failed) ? ATTND_ERR_NO_MEMORY : ATTND_ERR_OK;
}
