/* Test helpers shared by the suites: seeded random data, tensors in any dtype, error norms. */
#ifndef ATTND_TESTS_TESTUTIL_H
#define ATTND_TESTS_TESTUTIL_H

#include <stdint.h>

#include "attnd/kernels.h"

/* xorshift64* generator; each test seeds its own (never global state). */
typedef struct attnd_rng {
    uint64_t s;
} attnd_rng;

void attnd_rng_seed(attnd_rng *r, uint64_t seed);
uint64_t attnd_rng_next(attnd_rng *r);
/* Uniform in [lo, hi). */
double attnd_rng_uniform(attnd_rng *r, double lo, double hi);
/* Uniform integer in [lo, hi]. */
int64_t attnd_rng_int(attnd_rng *r, int64_t lo, int64_t hi);
/* Standard normal. */
double attnd_rng_normal(attnd_rng *r);

/* A host tensor owning its buffer (contiguous unless strides are changed by the caller). */
typedef struct attnd_test_tensor {
    attnd_tensor t;
    void *buf;
    size_t bytes;
} attnd_test_tensor;

/* Allocate a contiguous host tensor (zero-filled). */
void attnd_tt_alloc(attnd_test_tensor *tt, attnd_dtype dt, int32_t ndim, const int64_t *shape);
/* Allocate with the innermost dim padded to `pad` elements (non-contiguous rows). */
void attnd_tt_alloc_padded(attnd_test_tensor *tt, attnd_dtype dt, int32_t ndim,
                           const int64_t *shape, int64_t pad);
void attnd_tt_free(attnd_test_tensor *tt);
/* Fill every element with N(0, sigma^2), stored in the tensor's dtype (divided by scale). */
void attnd_tt_fill_normal(attnd_test_tensor *tt, attnd_rng *r, double sigma, double scale);
/* Set every byte of the buffer to 0xff: NaN in every float dtype (poison before a run). */
void attnd_tt_poison(attnd_test_tensor *tt);
/* Element at a multi-index (ndim entries) as double. */
double attnd_tt_get(const attnd_test_tensor *tt, const int64_t *idx);
void attnd_tt_set(attnd_test_tensor *tt, const int64_t *idx, double v);
/* Flat element e (row-major over the shape) as double, honouring strides. */
double attnd_tt_get_flat(const attnd_test_tensor *tt, int64_t e);

/* ||a - b|| / ||b|| over n values; returns +inf if any value of a is NaN or inf where b is
 * finite. */
double attnd_rel_l2(const double *a, const double *b, int64_t n);
/* Copy every element of a tensor (row-major over the shape) into a double array. */
double *attnd_tt_to_f64(const attnd_test_tensor *tt);

/* Allocate cu as the i32 prefix sums [batch + 1] of lens, and the largest length in *max_len. */
void attnd_tt_cu_seqlens(attnd_test_tensor *cu, const int32_t *lens, int64_t batch,
                         int32_t *max_len);

/* Relative L2 bound for results stored in dtype dt (accumulated in f32). */
double attnd_tol_for(attnd_dtype dt);

#endif
