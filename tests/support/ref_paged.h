/* Naive float64 paged attention, the oracle for the CPU and CUDA kernels. Written apart from
 * them on purpose: every logit of a row first, then max, exp, sum (no online softmax). */
#ifndef ATTND_TESTS_REF_PAGED_H
#define ATTND_TESTS_REF_PAGED_H

#include "attnd/kernels.h"

/* Attend as attnd_paged_attention_2d would, reading every tensor of p through its strides
 * (p->out and p->out_lse are not touched). out: [num_tokens][num_q_heads][head_size] dense;
 * lse: [num_q_heads][num_tokens] dense, natural log, -inf for a row that sees no key (its sink
 * with sinks) (may be NULL). A row that sees no key is all zeros. */
void attnd_ref_paged(const attnd_paged_params *p, double *out, double *lse);

#endif
