/* merge states (cpu) against the float64 reference: random shapes and dtypes, strided views, and
 * the seed's inf conventions (+inf read as -inf; both -inf gives zeros and LSE -inf). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "ref_ops.h"
#include "testutil.h"
#include "suite.h"

typedef struct merge_case {
    attnd_test_tensor out, out_lse, po, pl, so, sl;
    attnd_merge_params p;
} merge_case;

/* pad > head size gives non-contiguous rows; LSE rows are padded too when pad > 0. */
static void merge_alloc(merge_case *c, int64_t T, int64_t H, int64_t D, attnd_dtype in_dt,
                        attnd_dtype out_dt, int64_t pad, int with_lse)
{
    int64_t shape[3] = {T, H, D}, lshape[2] = {H, T};
    int64_t lpad = pad > 0 ? T + 3 : 0;
    attnd_tt_alloc_padded(&c->out, out_dt, 3, shape, pad);
    attnd_tt_alloc_padded(&c->po, in_dt, 3, shape, pad);
    attnd_tt_alloc_padded(&c->so, in_dt, 3, shape, pad);
    attnd_tt_alloc_padded(&c->pl, ATTND_DTYPE_F32, 2, lshape, lpad);
    attnd_tt_alloc_padded(&c->sl, ATTND_DTYPE_F32, 2, lshape, lpad);
    c->p = (attnd_merge_params){.out = c->out.t,
                                .prefix_out = c->po.t,
                                .prefix_lse = c->pl.t,
                                .suffix_out = c->so.t,
                                .suffix_lse = c->sl.t};
    c->out_lse.buf = NULL;
    if (with_lse) {
        attnd_tt_alloc_padded(&c->out_lse, ATTND_DTYPE_F32, 2, lshape, lpad);
        c->p.out_lse = c->out_lse.t;
    }
}

static void merge_fill(merge_case *c, attnd_rng *r)
{
    attnd_tt_fill_normal(&c->po, r, 1.0, 1.0);
    attnd_tt_fill_normal(&c->so, r, 1.0, 1.0);
    attnd_tt_fill_normal(&c->pl, r, 3.0, 1.0);
    attnd_tt_fill_normal(&c->sl, r, 3.0, 1.0);
}

static void merge_free(merge_case *c)
{
    attnd_tt_free(&c->out);
    attnd_tt_free(&c->po);
    attnd_tt_free(&c->so);
    attnd_tt_free(&c->pl);
    attnd_tt_free(&c->sl);
    if (c->out_lse.buf) attnd_tt_free(&c->out_lse);
}

/* Run on poisoned outputs and compare output and LSE with the reference. */
static void merge_check(attnd_backend *b, merge_case *c, double tol)
{
    int64_t T = c->out.t.shape[0], H = c->out.t.shape[1], D = c->out.t.shape[2];
    double *want = malloc((size_t)(T * H * D + 1) * sizeof *want);
    double *want_lse = malloc((size_t)(T * H + 1) * sizeof *want_lse);
    attnd_tt_poison(&c->out);
    if (c->out_lse.buf) attnd_tt_poison(&c->out_lse);
    cr_assert_eq(attnd_merge_states(b, &c->p), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    attnd_ref_merge(&c->p, want, want_lse);
    double err = attnd_ref_rel_err(&c->out, 1.0, want);
    cr_assert(err <= tol, "T=%lld H=%lld D=%lld out %s: rel err %g > %g", (long long)T,
              (long long)H, (long long)D, attnd_dtype_name(c->out.t.dtype), err, tol);
    for (int64_t h = 0; c->out_lse.buf && h < H; h++)
        for (int64_t t = 0; t < T; t++) {
            double got = attnd_tt_get(&c->out_lse, (int64_t[]){h, t}), w = want_lse[h * T + t];
            cr_assert(w == -INFINITY ? got == -INFINITY : fabs(got - w) <= 1e-5 * (1 + fabs(w)),
                      "lse[%lld][%lld] = %g, want %g", (long long)h, (long long)t, got, w);
        }
    free(want);
    free(want_lse);
}

Test(merge, random_shapes_and_dtypes, .timeout = 120)
{
    static const int64_t heads[] = {32, 80, 96, 112, 128, 192, 256};
    static const attnd_dtype dts[] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_BF16};
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 11);
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 3; j++) {
            merge_case c;
            int64_t T = attnd_rng_int(&r, 1, 70), H = attnd_rng_int(&r, 1, 8);
            attnd_dtype in = dts[j], out = dts[(i + j) % 3];
            merge_alloc(&c, T, H, heads[i], in, out, 0, (i + j) % 2 == 0);
            merge_fill(&c, &r);
            /* the output's own rounding dominates; f32 out checks the arithmetic */
            merge_check(b, &c, out == ATTND_DTYPE_F32 ? 1e-6 : attnd_tol_for(out));
            merge_free(&c);
        }
    attnd_backend_close(b);
}

Test(merge, strided_views, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 12);
    merge_case c;
    merge_alloc(&c, 37, 4, 96, ATTND_DTYPE_BF16, ATTND_DTYPE_F32, 104, 1);
    merge_fill(&c, &r);
    merge_check(b, &c, 1e-6);
    merge_free(&c);
    attnd_backend_close(b);
}

Test(merge, far_apart_lses_stay_finite, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 13);
    merge_case c;
    merge_alloc(&c, 4, 2, 64, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0, 1);
    merge_fill(&c, &r);
    static const float lses[4][2] = {{1000, 999}, {-1000, -1001}, {0, -200}, {80, 80}};
    for (int t = 0; t < 4; t++)
        for (int h = 0; h < 2; h++) {
            attnd_tt_set(&c.pl, (int64_t[]){h, t}, lses[t][0]);
            attnd_tt_set(&c.sl, (int64_t[]){h, t}, lses[t][1]);
        }
    merge_check(b, &c, 1e-6);
    merge_free(&c);
    attnd_backend_close(b);
}

/* The seed's comments: +inf (FA2's empty input) is read as -inf; both empty gives zeros. */
Test(merge, inf_conventions, .timeout = 120)
{
    static const float cases[][2] = {
        {INFINITY, 0.5f},      {0.5f, INFINITY},       {-INFINITY, 2.0f},
        {2.0f, -INFINITY},     {-INFINITY, -INFINITY}, {INFINITY, INFINITY},
        {INFINITY, -INFINITY}, {-INFINITY, INFINITY},  {1.0f, 1.0f},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 14);
    merge_case c;
    merge_alloc(&c, n, 3, 32, ATTND_DTYPE_F32, ATTND_DTYPE_F32, 0, 1);
    merge_fill(&c, &r);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < 3; h++) {
            attnd_tt_set(&c.pl, (int64_t[]){h, t}, cases[t][0]);
            attnd_tt_set(&c.sl, (int64_t[]){h, t}, cases[t][1]);
        }
    merge_check(b, &c, 1e-6);
    for (int t = 0; t < n; t++) {
        float a = cases[t][0], s = cases[t][1];
        int prefix_empty = isinf(a), suffix_empty = isinf(s);
        for (int64_t d = 0; d < 32; d++) {
            int64_t idx[3] = {t, 1, d};
            double got = attnd_tt_get(&c.out, idx);
            double want = prefix_empty && suffix_empty ? 0.0
                          : prefix_empty               ? attnd_tt_get(&c.so, idx)
                          : suffix_empty               ? attnd_tt_get(&c.po, idx)
                                                       : got;
            cr_assert_eq(got, want, "case %d dim %lld: %g != %g", t, (long long)d, got, want);
        }
        double lse = attnd_tt_get(&c.out_lse, (int64_t[]){1, t});
        if (prefix_empty && suffix_empty) cr_assert_eq(lse, -INFINITY, "case %d lse %g", t, lse);
        if (prefix_empty && !suffix_empty) cr_assert_eq(lse, s, "case %d lse %g", t, lse);
    }
    merge_free(&c);
    attnd_backend_close(b);
}

/* An empty side is not read: garbage (NaN) in its output cannot reach the merged row. */
Test(merge, empty_side_output_is_not_read, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    attnd_rng r;
    attnd_rng_seed(&r, 15);
    merge_case c;
    merge_alloc(&c, 5, 2, 128, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, 0, 0);
    merge_fill(&c, &r);
    attnd_tt_poison(&c.po); /* NaN everywhere */
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < 2; h++)
            attnd_tt_set(&c.pl, (int64_t[]){h, t}, t % 2 ? INFINITY : -INFINITY);
    attnd_tt_poison(&c.out);
    cr_assert_eq(attnd_merge_states(b, &c.p), ATTND_ERR_OK);
    for (int64_t e = 0; e < 5 * 2 * 128; e++)
        cr_assert_eq(attnd_tt_get_flat(&c.out, e), attnd_tt_get_flat(&c.so, e), "element %lld",
                     (long long)e);
    merge_free(&c);
    attnd_backend_close(b);
}

Test(merge, zero_tokens, .timeout = 120)
{
    attnd_backend *b = attnd_test_open_cpu(3);
    merge_case c;
    merge_alloc(&c, 0, 4, 64, ATTND_DTYPE_F16, ATTND_DTYPE_F16, 0, 1);
    cr_assert_eq(attnd_merge_states(b, &c.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(b));
    merge_free(&c);
    attnd_backend_close(b);
}
