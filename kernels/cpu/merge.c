/* Merge two partial attention states by their log-sum-exps (cascade / shared-prefix attention).
 * Weights come from attnd_lse_merge_weights (+inf read as -inf; both -inf gives zeros and LSE
 * -inf). A side whose weight is 0 is not read at all, so an empty partial whose output holds
 * garbage (the seed's 2D kernel can leave NaN there) cannot leak into the result. */
#include "cpu.h"
#include "tile.h"

/* Tokens per pool item: enough work per item to amortise the pool's lock. */
#define MERGE_TOKENS_PER_ITEM 16

typedef struct merge_job {
    const attnd_merge_params *p;
    int64_t num_tokens, num_heads, head_size;
} merge_job;

static float lse_at(const attnd_tensor *t, int64_t h, int64_t tok)
{
    return ((const float *)t->data)[h * t->strides[0] + tok * t->strides[1]];
}

static int64_t row_off(const attnd_tensor *t, int64_t tok, int64_t h)
{
    return tok * t->strides[0] + h * t->strides[1];
}

static void merge_one(const merge_job *job, int64_t tok, int64_t h)
{
    const attnd_merge_params *p = job->p;
    const int64_t d = job->head_size;
    float out[ATTND_HEAD_SIZE_MAX], side[ATTND_HEAD_SIZE_MAX];
    float wa, wb;
    float lse = attnd_lse_merge_weights(lse_at(&p->prefix_lse, h, tok),
                                        lse_at(&p->suffix_lse, h, tok), &wa, &wb);
    for (int64_t i = 0; i < d; i++)
        out[i] = 0.0f;
    if (wa != 0.0f) {
        attnd_row_load(side, p->prefix_out.data, p->prefix_out.dtype,
                       row_off(&p->prefix_out, tok, h), d, 1.0f);
        attnd_axpy(out, wa, side, d);
    }
    if (wb != 0.0f) {
        attnd_row_load(side, p->suffix_out.data, p->suffix_out.dtype,
                       row_off(&p->suffix_out, tok, h), d, 1.0f);
        attnd_axpy(out, wb, side, d);
    }
    attnd_row_store(p->out.data, p->out.dtype, row_off(&p->out, tok, h), out, d, 1.0f);
    if (p->out_lse.data != NULL)
        ((float *)p->out_lse.data)[h * p->out_lse.strides[0] + tok * p->out_lse.strides[1]] = lse;
}

static void merge_item(void *arg, int64_t item)
{
    const merge_job *job = arg;
    int64_t t0 = item * MERGE_TOKENS_PER_ITEM;
    int64_t t1 =
        t0 + MERGE_TOKENS_PER_ITEM < job->num_tokens ? t0 + MERGE_TOKENS_PER_ITEM : job->num_tokens;
    for (int64_t tok = t0; tok < t1; tok++)
        for (int64_t h = 0; h < job->num_heads; h++)
            merge_one(job, tok, h);
}

attnd_err attnd_cpu_merge_states(attnd_backend *b, const attnd_merge_params *p)
{
    merge_job job = {p, p->out.shape[0], p->out.shape[1], p->out.shape[2]};
    int64_t items = (job.num_tokens + MERGE_TOKENS_PER_ITEM - 1) / MERGE_TOKENS_PER_ITEM;
    attnd_pool_run(attnd_cpu_pool(b), items, merge_item, &job);
    return ATTND_ERR_OK;
}
