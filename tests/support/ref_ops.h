/* Naive float64 references for merge states, varlen, block-sparse and linear attention: a plain
 * softmax over every allowed logit of a row, and linear attention as the literal token-by-token
 * recurrence. They read the same host descriptors as the op (inputs converted exactly from their
 * dtype, fp8 times its scale) and share no code with kernels/cpu. Outputs are dense row-major
 * double arrays over the op's output shape. */
#ifndef ATTND_TESTS_REF_OPS_H
#define ATTND_TESTS_REF_OPS_H

#include "attnd/kernels.h"
#include "testutil.h"

/* out [tokens * heads * head_size]; out_lse [heads * tokens] (may be NULL). */
void attnd_ref_merge(const attnd_merge_params *p, double *out, double *out_lse);

/* out [total_q * num_q_heads * head_size]; rows past cu_seqlens_q's last entry are left alone.
 * With fp8 inputs, P is quantised as p / p_scale with p relative to the row's maximum. */
void attnd_ref_varlen(const attnd_varlen_params *p, double *out);

/* out [total_q * num_q_heads * head_size]. */
void attnd_ref_blocksparse(const attnd_blocksparse_params *p, double *out);

/* Runs the recurrence from the initial state in state [batch * heads * d * e] (row-major, updated
 * in place); out [batch * heads * n * e]. */
void attnd_ref_linear_prefill(const attnd_linear_prefill_params *p, double *state, double *out);

/* One step per batch row against cache [num_slots * heads * d * e] (updated in place); slot -1
 * gives a zero row and touches nothing. out [batch * heads * e]. */
void attnd_ref_linear_decode(const attnd_linear_decode_params *p, double *cache, double *out);

/* A 4-dim tensor (any strides, any dtype) as a dense row-major double array (malloc'd). */
double *attnd_ref_state_load(const attnd_tensor *t);

/* Relative L2 error of got (every element times got_mul, e.g. an fp8 output scale) against want
 * (dense, row-major over got's shape); NaN or inf in got never passes (see attnd_rel_l2). */
double attnd_ref_rel_err(const attnd_test_tensor *got, double got_mul, const double *want);

/* First row (last dim) of got that is not exactly zero where want's whole row is zero (nothing
 * visible), or -1. Single zero elements of want are not checked: coarse fp8 values can cancel to
 * an exact 0 in float64 and leave a rounding residue in float32. */
int64_t attnd_ref_zero_rows_differ(const attnd_test_tensor *got, const double *want);

#endif
