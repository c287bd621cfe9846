/* Online softmax and LSE merge, shared by every CPU op (float32 state, natural log). */
#ifndef ATTND_CPU_SOFTMAX_H
#define ATTND_CPU_SOFTMAX_H

#include <math.h>
#include <stdint.h>

/* Running state of one query row: max logit m, sum of exp(s - m) l, unnormalised acc[d]. */
typedef struct attnd_softmax {
    float m;
    float l;
} attnd_softmax;

static inline void attnd_softmax_init(attnd_softmax *s, float *acc, int64_t d)
{
    s->m = -INFINITY;
    s->l = 0.0f;
    for (int64_t i = 0; i < d; i++)
        acc[i] = 0.0f;
}

/* Fold one logit x (may be -inf: ignored) with its value row v (v_scale applied by caller via
 * the weight) into the state. Returns the weight p = exp(x - m_new) that v is added with. */
static inline float attnd_softmax_push(attnd_softmax *s, float *acc, int64_t d, float x)
{
    if (x == -INFINITY) return 0.0f;
    if (x > s->m) {
        float alpha = s->m == -INFINITY ? 0.0f : expf(s->m - x);
        for (int64_t i = 0; i < d; i++)
            acc[i] *= alpha;
        s->l *= alpha;
        s->m = x;
    }
    float p = expf(x - s->m);
    s->l += p;
    return p;
}

/* Merge a partial state (max m_b, exp-sum l_b, unnormalised acc_b) into s/acc, e.g. one split-KV
 * segment into the row's total. An empty partial (m_b = -inf) changes nothing. */
static inline void attnd_softmax_fold(attnd_softmax *s, float *acc, int64_t d, float m_b, float l_b,
                                      const float *acc_b)
{
    if (m_b == -INFINITY) return;
    if (m_b > s->m) {
        float alpha = s->m == -INFINITY ? 0.0f : expf(s->m - m_b);
        for (int64_t i = 0; i < d; i++)
            acc[i] *= alpha;
        s->l *= alpha;
        s->m = m_b;
    }
    float beta = expf(m_b - s->m);
    s->l += beta * l_b;
    for (int64_t i = 0; i < d; i++)
        acc[i] += beta * acc_b[i];
}

/* Fold a block of n logits x (masked entries -inf) into the state at once, as one FA2 tile does:
 * at most one rescale of acc per block. On return x[j] is the weight p_j = exp(x_j - m) (0 where
 * masked) that value row j must be added to acc with; l already includes every p_j. */
static inline void attnd_softmax_push_block(attnd_softmax *s, float *acc, int64_t d, float *x,
                                            int64_t n)
{
    float bm = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        bm = x[j] > bm ? x[j] : bm;
    if (bm > s->m) {
        float alpha = s->m == -INFINITY ? 0.0f : expf(s->m - bm);
        for (int64_t i = 0; i < d; i++)
            acc[i] *= alpha;
        s->l *= alpha;
        s->m = bm;
    }
    for (int64_t j = 0; j < n; j++) {
        /* test the logit, not m: -inf - -inf would be NaN when everything so far is masked */
        x[j] = x[j] == -INFINITY ? 0.0f : expf(x[j] - s->m);
        s->l += x[j];
    }
}

/* Fold a sink logit x (one more term of the denominator, with no value row) into the state.
 * Returns the factor the row's accumulator must be multiplied by (the rescale to the new max);
 * -inf is no sink. */
static inline float attnd_softmax_sink(attnd_softmax *s, float x)
{
    float alpha = 1.0f;
    if (x == -INFINITY) return alpha;
    if (x > s->m) {
        alpha = s->m == -INFINITY ? 0.0f : expf(s->m - x);
        s->l *= alpha;
        s->m = x;
    }
    s->l += expf(x - s->m);
    return alpha;
}

/* Log-sum-exp of the row (-inf when nothing was pushed). */
static inline float attnd_softmax_lse(const attnd_softmax *s)
{
    return s->l > 0.0f ? s->m + logf(s->l) : -INFINITY;
}

/* Normalise acc into out-scale 1/l; a row with nothing pushed stays zero (never NaN). */
static inline float attnd_softmax_inv_sum(const attnd_softmax *s)
{
    return s->l > 0.0f ? 1.0f / s->l : 0.0f;
}

/* Weights of two partial states given their LSEs (+inf read as -inf, both -inf -> 0, 0).
 * Returns the merged LSE. */
static inline float attnd_lse_merge_weights(float lse_a, float lse_b, float *wa, float *wb)
{
    if (lse_a == INFINITY) lse_a = -INFINITY;
    if (lse_b == INFINITY) lse_b = -INFINITY;
    float mx = lse_a > lse_b ? lse_a : lse_b;
    if (mx == -INFINITY) {
        *wa = 0.0f;
        *wb = 0.0f;
        return -INFINITY;
    }
    float ea = expf(lse_a - mx), eb = expf(lse_b - mx);
    float sum = ea + eb;
    *wa = ea / sum;
    *wb = eb / sum;
    return mx + logf(sum);
}

#endif
