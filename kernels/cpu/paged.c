/* Paged attention on the CPU: the 2D form (each query tile walks its whole visible context) and
 * the 3D split-KV form (segments of the context attended apart, then one LSE merge per row), as
 * vLLM's kernel_unified_attention_2d / _3d and reduce_segments, in float32.
 *
 * A work unit is (query tile, kv head[, segment]). A tile holds up to PAGED_TILE_ROWS query rows
 * of one sequence: tile_tokens consecutive tokens x the `group` q heads that read one kv head
 * (the seed's BLOCK_M = BLOCK_Q x num_queries_per_kv), so every K/V row is converted to f32 once
 * and reused by all rows of the tile. Units are spread over the pool in interleaved chunks so a
 * chunk allocates its scratch once and long (late, causal) tiles do not all land on one thread.
 * Every output row is produced by exactly one unit, so results do not depend on thread count.
 *
 * Masks are applied by never computing masked logits: row at position pos sees keys
 * max(0, pos - window + 1) .. pos. Softcap then ALiBi (slope * (key - pos)) follow the scaled
 * dot product, as DESIGN.md fixes. A row that sees no key keeps m = -inf, l = 0 and stores zeros
 * and LSE -inf. A sink joins the denominator once, when the row is stored (after the 3D merge,
 * never per segment).
 *
 * 3D workspace (f32), laid out as attnd_paged_3d_workspace_size sizes it, with
 * row = (token * num_q_heads + q_head) * num_segments + segment:
 *   out[rows][head_size]  sum of exp(logit - max) * v over the segment (unnormalised)
 *   max[rows]             the segment's max logit, -inf when it saw no key
 *   sum[rows]             sum of exp(logit - max), 0 when it saw no key
 * Segment s of a sequence covers its context blocks [s * per, (s + 1) * per), per =
 * cdiv(cdiv(seq_len, block_size), num_segments); segments past the end are empty. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "softmax.h"
#include "tile.h"
#include "validate.h"

enum {
    PAGED_TILE_ROWS = 32,   /* query rows per tile: enough reuse of each converted K/V row */
    PAGED_MAX_CHUNKS = 256, /* pool items; many more than threads, for balance */
};

typedef struct paged_tile {
    int32_t seq;
    int32_t q0, q1; /* query range within the sequence, [q0, q1) */
} paged_tile;

typedef struct paged_job {
    const attnd_paged_params *p;
    int64_t hq, hkv, group, d, bs;
    int64_t tile_tokens, tile_rows;
    paged_tile *tiles;
    int64_t num_tiles;
    int64_t num_segments; /* 0: the 2D form */
    float *ws_out, *ws_max, *ws_sum;
    int64_t units, chunks;
    float lut_k[256], lut_v[256]; /* fp8 code -> value x scale (fp8 caches only) */
    atomic_int failed;            /* a chunk could not allocate its scratch */
} paged_job;

/* One chunk's buffers: the tile's queries and accumulators, one K/V block in f32, logits. */
typedef struct paged_scratch {
    float *q, *acc, *k, *v, *x;
    attnd_softmax *st;
} paged_scratch;

/* Where one unit's rows are and what they may see. */
typedef struct paged_rows {
    int64_t seq, kvh;
    int64_t tok0;    /* packed index of the tile's first token */
    int64_t ntok;    /* tokens in the tile */
    int64_t pos0;    /* position of the first token (context_len + q0) */
    int64_t seq_len; /* keys of the sequence */
} paged_rows;

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t cdiv64(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* One K or V row in f32. fp8 goes through the job's code table (scale folded in): a table
 * lookup per element instead of a decode and a multiply, since decode is the hot loop here. */
static void load_kv_row(float *dst, const attnd_tensor *t, int64_t off, int64_t n, const float *lut)
{
    if (t->dtype != ATTND_DTYPE_FP8_E4M3) {
        attnd_row_load(dst, t->data, t->dtype, off, n, 1.0f);
        return;
    }
    const uint8_t *src = (const uint8_t *)t->data + off;
    for (int64_t i = 0; i < n; i++)
        dst[i] = lut[src[i]];
}

static int64_t block_id(const attnd_paged_params *p, int64_t seq, int64_t blk)
{
    const attnd_tensor *t = &p->block_tables;
    return ((const int32_t *)t->data)[seq * t->strides[0] + blk * t->strides[1]];
}

static int64_t query_start(const attnd_paged_params *p, int64_t seq)
{
    return attnd_index_at(&p->query_start_loc, seq);
}

/* ---------------------------------------------------------------- job setup */

static void job_init(paged_job *j, const attnd_paged_params *p, int32_t num_segments,
                     void *workspace)
{
    memset(j, 0, sizeof *j);
    j->p = p;
    j->hq = p->q.shape[1];
    j->hkv = p->k_cache.shape[2];
    j->group = j->hq / j->hkv;
    j->d = p->q.shape[2];
    j->bs = p->k_cache.shape[1];
    j->tile_tokens = max64(1, PAGED_TILE_ROWS / j->group);
    j->tile_rows = j->tile_tokens * j->group;
    j->num_segments = num_segments;
    atomic_init(&j->failed, 0);
    if (p->k_cache.dtype == ATTND_DTYPE_FP8_E4M3) {
        for (int c = 0; c < 256; c++) {
            j->lut_k[c] = attnd_fp8_to_f32((uint8_t)c) * p->k_scale;
            j->lut_v[c] = attnd_fp8_to_f32((uint8_t)c) * p->v_scale;
        }
    }
    if (workspace != NULL) {
        int64_t rows = p->q.shape[0] * j->hq * num_segments;
        j->ws_out = workspace;
        j->ws_max = j->ws_out + rows * j->d;
        j->ws_sum = j->ws_max + rows;
    }
}

/* Cut every sequence's queries into tiles of tile_tokens; sequences without queries get none. */
static attnd_err build_tiles(paged_job *j)
{
    const attnd_paged_params *p = j->p;
    int64_t num_seqs = p->seq_lens.shape[0], n = 0;
    for (int64_t s = 0; s < num_seqs; s++)
        n += cdiv64(query_start(p, s + 1) - query_start(p, s), j->tile_tokens);
    j->tiles = malloc((size_t)max64(n, 1) * sizeof *j->tiles);
    if (j->tiles == NULL) return ATTND_ERR_NO_MEMORY;
    j->num_tiles = n;
    n = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        int64_t qlen = query_start(p, s + 1) - query_start(p, s);
        for (int64_t q0 = 0; q0 < qlen; q0 += j->tile_tokens) {
            j->tiles[n].seq = (int32_t)s;
            j->tiles[n].q0 = (int32_t)q0;
            j->tiles[n].q1 = (int32_t)min64(q0 + j->tile_tokens, qlen);
            n++;
        }
    }
    return ATTND_ERR_OK;
}

static int scratch_alloc(const paged_job *j, paged_scratch *s)
{
    size_t d = (size_t)j->d, rows = (size_t)j->tile_rows, bs = (size_t)j->bs;
    s->q = malloc(rows * d * sizeof(float));
    s->acc = malloc(rows * d * sizeof(float));
    s->k = malloc(bs * d * sizeof(float));
    s->v = malloc(bs * d * sizeof(float));
    s->x = malloc(bs * sizeof(float));
    s->st = malloc(rows * sizeof *s->st);
    return s->q && s->acc && s->k && s->v && s->x && s->st ? 0 : -1;
}

static void scratch_free(paged_scratch *s)
{
    free(s->q);
    free(s->acc);
    free(s->k);
    free(s->v);
    free(s->x);
    free(s->st);
}

/* ---------------------------------------------------------------- one unit */

static void rows_describe(const paged_job *j, const paged_tile *t, int64_t kvh, paged_rows *r)
{
    const attnd_paged_params *p = j->p;
    int64_t qs = query_start(p, t->seq), qe = query_start(p, t->seq + 1);
    r->seq = t->seq;
    r->kvh = kvh;
    r->tok0 = qs + t->q0;
    r->ntok = t->q1 - t->q0;
    r->seq_len = attnd_index_at(&p->seq_lens, t->seq);
    r->pos0 = r->seq_len - (qe - qs) + t->q0;
}

/* Keys any row of the tile may see: from the first row's window start to the last row's
 * position; in 3D only those of the segment. lo >= hi means none (the rows stay empty). */
static void key_range(const paged_job *j, const paged_rows *r, int64_t seg, int64_t *lo,
                      int64_t *hi)
{
    int64_t w = j->p->sliding_window;
    *lo = w > 0 ? max64(0, r->pos0 - w + 1) : 0;
    *hi = r->pos0 + r->ntok;
    if (seg >= 0) {
        int64_t per = cdiv64(cdiv64(r->seq_len, j->bs), j->num_segments) * j->bs;
        *lo = max64(*lo, seg * per);
        *hi = min64(*hi, min64((seg + 1) * per, r->seq_len));
    }
}

/* The tile's queries in f32, pre-multiplied by the softmax scale; fresh softmax states. */
static void rows_load(const paged_job *j, paged_scratch *s, const paged_rows *r)
{
    const attnd_tensor *q = &j->p->q;
    int64_t d = j->d;
    for (int64_t row = 0; row < r->ntok * j->group; row++) {
        int64_t tok = r->tok0 + row / j->group, h = r->kvh * j->group + row % j->group;
        float *dst = s->q + row * d;
        attnd_row_load(dst, q->data, q->dtype, tok * q->strides[0] + h * q->strides[1], d,
                       j->p->scale);
        attnd_softmax_init(&s->st[row], s->acc + row * d, d);
    }
}

/* Softcap then ALiBi on n logits of keys first_rel.. relative to the query position. */
static void logits_finish(const paged_job *j, float *x, int64_t n, int64_t h, int64_t first_rel)
{
    const attnd_paged_params *p = j->p;
    if (p->softcap > 0.0f) {
        float c = p->softcap;
        for (int64_t i = 0; i < n; i++)
            x[i] = c * tanhf(x[i] / c);
    }
    if (p->alibi_slopes.data != NULL) {
        float slope = ((const float *)p->alibi_slopes.data)[h * p->alibi_slopes.strides[0]];
        for (int64_t i = 0; i < n; i++)
            x[i] += slope * (float)(first_rel + i);
    }
}

/* One row against the block's keys [k0, k0 + n) held in s->k / s->v. */
static void attend_row(const paged_job *j, paged_scratch *s, const paged_rows *r, int64_t row,
                       int64_t k0, int64_t n)
{
    int64_t d = j->d, w = j->p->sliding_window;
    int64_t pos = r->pos0 + row / j->group, h = r->kvh * j->group + row % j->group;
    int64_t a = w > 0 ? max64(k0, pos - w + 1) : k0, b = min64(k0 + n, pos + 1);
    if (a >= b) return;
    const float *q = s->q + row * d;
    float *acc = s->acc + row * d;
    for (int64_t key = a; key < b; key++)
        s->x[key - a] = attnd_dot(q, s->k + (key - k0) * d, d);
    logits_finish(j, s->x, b - a, h, a - pos);
    attnd_softmax_push_block(&s->st[row], acc, d, s->x, b - a);
    for (int64_t key = a; key < b; key++)
        attnd_axpy(acc, s->x[key - a], s->v + (key - k0) * d, d);
}

/* Keys [k0, k1) of logical block blk: convert its K/V rows once, then every row of the tile. */
static void attend_block(const paged_job *j, paged_scratch *s, const paged_rows *r, int64_t blk,
                         int64_t k0, int64_t k1)
{
    const attnd_tensor *kc = &j->p->k_cache, *vc = &j->p->v_cache;
    int64_t phys = block_id(j->p, r->seq, blk), d = j->d;
    for (int64_t key = k0; key < k1; key++) {
        int64_t slot = key % j->bs;
        int64_t ko = phys * kc->strides[0] + slot * kc->strides[1] + r->kvh * kc->strides[2];
        int64_t vo = phys * vc->strides[0] + slot * vc->strides[1] + r->kvh * vc->strides[2];
        load_kv_row(s->k + (key - k0) * d, kc, ko, d, j->lut_k);
        load_kv_row(s->v + (key - k0) * d, vc, vo, d, j->lut_v);
    }
    for (int64_t row = 0; row < r->ntok * j->group; row++)
        attend_row(j, s, r, row, k0, k1 - k0);
}

/* Normalise one row into out (and out_lse), head h's sink folded in first; an empty row gives
 * zeros and -inf (the sink's logit with a sink). */
static void store_final(const paged_job *j, int64_t tok, int64_t h, const attnd_softmax *st,
                        const float *acc)
{
    const attnd_tensor *o = &j->p->out, *lse = &j->p->out_lse, *sk = &j->p->sinks;
    attnd_softmax s = *st;
    float mul = 1.0f;
    if (sk->data != NULL)
        mul = attnd_softmax_sink(&s, ((const float *)sk->data)[h * sk->strides[0]]);
    attnd_row_store(o->data, o->dtype, tok * o->strides[0] + h * o->strides[1], acc, j->d,
                    mul * attnd_softmax_inv_sum(&s));
    if (lse->data != NULL)
        ((float *)lse->data)[h * lse->strides[0] + tok * lse->strides[1]] = attnd_softmax_lse(&s);
}

static void rows_store(const paged_job *j, const paged_scratch *s, const paged_rows *r, int64_t seg)
{
    int64_t d = j->d;
    for (int64_t row = 0; row < r->ntok * j->group; row++) {
        int64_t tok = r->tok0 + row / j->group, h = r->kvh * j->group + row % j->group;
        const float *acc = s->acc + row * d;
        if (seg < 0) {
            store_final(j, tok, h, &s->st[row], acc);
            continue;
        }
        int64_t w = (tok * j->hq + h) * j->num_segments + seg;
        memcpy(j->ws_out + w * d, acc, (size_t)d * sizeof *acc);
        j->ws_max[w] = s->st[row].m;
        j->ws_sum[w] = s->st[row].l;
    }
}

static void paged_unit(const paged_job *j, paged_scratch *s, int64_t u)
{
    int64_t ns = j->num_segments > 0 ? j->num_segments : 1;
    int64_t kvh = (u / ns) % j->hkv, seg = j->num_segments > 0 ? u % ns : -1;
    paged_rows r;
    int64_t lo, hi;
    rows_describe(j, &j->tiles[u / (ns * j->hkv)], kvh, &r);
    key_range(j, &r, seg, &lo, &hi);
    rows_load(j, s, &r);
    for (int64_t blk = lo / j->bs; blk * j->bs < hi; blk++)
        attend_block(j, s, &r, blk, max64(lo, blk * j->bs), min64(hi, (blk + 1) * j->bs));
    rows_store(j, s, &r, seg);
}

/* Pool item c: units c, c + chunks, c + 2 chunks ... with one scratch allocation. */
static void paged_chunk(void *arg, int64_t c)
{
    paged_job *j = arg;
    paged_scratch s;
    if (scratch_alloc(j, &s) != 0) {
        atomic_store(&j->failed, 1);
    } else {
        for (int64_t u = c; u < j->units; u += j->chunks)
            paged_unit(j, &s, u);
    }
    scratch_free(&s);
}

/* 3D second pass, pool item = one token: merge each head's segments by LSE. */
static void reduce_token(void *arg, int64_t tok)
{
    const paged_job *j = arg;
    float acc[ATTND_HEAD_SIZE_MAX];
    for (int64_t h = 0; h < j->hq; h++) {
        attnd_softmax st;
        attnd_softmax_init(&st, acc, j->d);
        for (int64_t seg = 0; seg < j->num_segments; seg++) {
            int64_t w = (tok * j->hq + h) * j->num_segments + seg;
            attnd_softmax_fold(&st, acc, j->d, j->ws_max[w], j->ws_sum[w], j->ws_out + w * j->d);
        }
        store_final(j, tok, h, &st, acc);
    }
}

static attnd_err paged_run(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments,
                           void *workspace)
{
    paged_job j;
    attnd_err rv;
    job_init(&j, p, num_segments, workspace);
    if ((rv = build_tiles(&j)) != ATTND_ERR_OK) goto done;
    j.units = j.num_tiles * j.hkv * (num_segments > 0 ? num_segments : 1);
    j.chunks = min64(j.units, PAGED_MAX_CHUNKS);
    attnd_pool_run(attnd_cpu_pool(b), j.chunks, paged_chunk, &j);
    if (atomic_load(&j.failed)) {
        rv = ATTND_ERR_NO_MEMORY;
        goto done;
    }
    if (num_segments > 0) attnd_pool_run(attnd_cpu_pool(b), p->q.shape[0], reduce_token, &j);
done:
    if (rv == ATTND_ERR_NO_MEMORY)
        snprintf(b->last_error, sizeof b->last_error, "paged attention: out of host memory");
    free(j.tiles);
    return rv;
}

attnd_err attnd_cpu_paged_2d(attnd_backend *b, const attnd_paged_params *p)
{
    return paged_run(b, p, 0, NULL);
}

attnd_err attnd_cpu_paged_3d(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments,
                             void *workspace)
{
    return paged_run(b, p, num_segments, workspace);
}
