#include "ref_paged.h"

#include <math.h>
#include <stdlib.h>

/* Element of a tensor at a multi-index, as double (any float dtype, or an integer). */
static double at(const attnd_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    int64_t idx[4] = {i0, i1, i2, i3}, off = 0;
    for (int32_t d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    if (t->dtype == ATTND_DTYPE_I32) return ((const int32_t *)t->data)[off];
    if (t->dtype == ATTND_DTYPE_I64) return (double)((const int64_t *)t->data)[off];
    return attnd_load_f32(t->data, t->dtype, off);
}

/* The sequence's keys (or values) gathered from the paged cache through its block table and
 * dequantised: dst[key][kv_head][d]. */
static void gather(const attnd_paged_params *p, const attnd_tensor *c, double scale, int64_t s,
                   int64_t seq_len, double *dst)
{
    int64_t bs = c->shape[1], hkv = c->shape[2], hd = c->shape[3];
    double mul = c->dtype == ATTND_DTYPE_FP8_E4M3 ? scale : 1.0;
    for (int64_t j = 0; j < seq_len; j++) {
        int64_t blk = (int64_t)at(&p->block_tables, s, j / bs, 0, 0);
        for (int64_t kh = 0; kh < hkv; kh++)
            for (int64_t d = 0; d < hd; d++)
                dst[(j * hkv + kh) * hd + d] = at(c, blk, j % bs, kh, d) * mul;
    }
}

/* Logit of query row q (position pos, head h) against key row k, or -inf when masked. */
static double logit(const attnd_paged_params *p, const double *q, const double *k, int64_t h,
                    int64_t pos, int64_t j)
{
    if (j > pos) return -INFINITY;
    if (p->sliding_window > 0 && j <= pos - p->sliding_window) return -INFINITY;
    double dot = 0.0;
    for (int64_t d = 0; d < p->q.shape[2]; d++)
        dot += q[d] * k[d];
    double x = (double)p->scale * dot;
    if (p->softcap > 0.0f) x = p->softcap * tanh(x / p->softcap);
    if (p->alibi_slopes.data != NULL) x += at(&p->alibi_slopes, h, 0, 0, 0) * (double)(j - pos);
    return x;
}

/* One output row o[hd] from every logit at once, head h's sink (when p has sinks) one more term
 * of the denominator with no value row; returns its LSE. */
static double attend_row(const attnd_paged_params *p, const double *K, const double *V, int64_t t,
                         int64_t h, int64_t pos, int64_t seq_len, double *w, double *o)
{
    int64_t hd = p->q.shape[2], hkv = p->k_cache.shape[2], kh = h / (p->q.shape[1] / hkv);
    double q[ATTND_HEAD_SIZE_MAX], mx = -INFINITY, sum = 0.0;
    double sink = p->sinks.data != NULL ? at(&p->sinks, h, 0, 0, 0) : -INFINITY;
    for (int64_t d = 0; d < hd; d++)
        q[d] = at(&p->q, t, h, d, 0);
    for (int64_t j = 0; j < seq_len; j++) {
        w[j] = logit(p, q, K + (j * hkv + kh) * hd, h, pos, j);
        if (w[j] > mx) mx = w[j];
    }
    if (sink > mx) mx = sink;
    for (int64_t d = 0; d < hd; d++)
        o[d] = 0.0;
    if (mx == -INFINITY) return -INFINITY;
    for (int64_t j = 0; j < seq_len; j++) {
        w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
        sum += w[j];
    }
    if (sink != -INFINITY) sum += exp(sink - mx);
    for (int64_t j = 0; j < seq_len; j++)
        for (int64_t d = 0; d < hd && w[j] != 0.0; d++)
            o[d] += w[j] / sum * V[(j * hkv + kh) * hd + d];
    return mx + log(sum);
}

void attnd_ref_paged(const attnd_paged_params *p, double *out, double *lse)
{
    int64_t num_tokens = p->q.shape[0], hq = p->q.shape[1], hd = p->q.shape[2];
    int64_t hkv = p->k_cache.shape[2];
    for (int64_t s = 0; s < p->seq_lens.shape[0]; s++) {
        int64_t q0 = (int64_t)at(&p->query_start_loc, s, 0, 0, 0);
        int64_t q1 = (int64_t)at(&p->query_start_loc, s + 1, 0, 0, 0);
        int64_t seq_len = (int64_t)at(&p->seq_lens, s, 0, 0, 0);
        if (q1 == q0) continue; /* no queries: nothing read, nothing written */
        size_t n = (size_t)seq_len;
        double *K = malloc(n * (size_t)(hkv * hd) * sizeof *K);
        double *V = malloc(n * (size_t)(hkv * hd) * sizeof *V);
        double *w = malloc(n * sizeof *w);
        gather(p, &p->k_cache, p->k_scale, s, seq_len, K);
        gather(p, &p->v_cache, p->v_scale, s, seq_len, V);
        for (int64_t t = q0; t < q1; t++) {
            int64_t pos = seq_len - (q1 - q0) + (t - q0);
            for (int64_t h = 0; h < hq; h++) {
                double l = attend_row(p, K, V, t, h, pos, seq_len, w, out + (t * hq + h) * hd);
                if (lse != NULL) lse[h * num_tokens + t] = l;
            }
        }
        free(K);
        free(V);
        free(w);
    }
}
