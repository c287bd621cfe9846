/* The end-to-end tests' oracle: a local copy of what the daemon should hold for one session.
 *
 * The mirror keeps its own paged caches (one slot range per sequence) in the daemon's geometry
 * and cache dtype. For every Attend the test makes, it writes the same new K/V rows with the CPU
 * backend's attnd_cache_write and computes the expected output twice: with the CPU op called
 * directly (attnd_paged_attention_2d) and with the naive float64 reference (attnd_ref_paged).
 * Steps are begun, attended and committed or aborted like the daemon's, forks copy the parent's
 * rows, so forked sequences diverge locally exactly as they should remotely. */
#ifndef ATTND_TESTS_E2E_MIRROR_H
#define ATTND_TESTS_E2E_MIRROR_H

#include <stdint.h>

#include "attnd/client.h"
#include "attnd/kernels.h"
#include "testutil.h"

#define ATTND_MIRROR_MAX_SEQS 8 /* live sequences of one mirror */
#define ATTND_MIRROR_MAX_LAYERS 8

/* Options of the daemon's config, used where the geometry does not list its layers (a geometry
 * that lists them, as every Hello now does, gives each layer's own: window, softcap, scale, ALiBi
 * slopes, sinks, fp8 scales). */
typedef struct attnd_mirror_opts {
    int32_t sliding_window;
    float softcap;
    float k_scale, v_scale; /* fp8 caches; 0 = 1 */
} attnd_mirror_opts;

typedef struct attnd_mirror_seq {
    uint64_t id;
    int32_t slot; /* local index: blocks slot * blocks_per_seq .. */
    int32_t len;  /* committed tokens */
    int32_t pend; /* tokens of the open step */
    int32_t used;
} attnd_mirror_seq;

typedef struct attnd_mirror {
    attnd_geometry g;
    attnd_mirror_opts o;
    attnd_backend *cpu;
    int64_t blocks_per_seq;
    attnd_test_tensor kc[ATTND_MIRROR_MAX_LAYERS], vc[ATTND_MIRROR_MAX_LAYERS];
    attnd_mirror_seq seqs[ATTND_MIRROR_MAX_SEQS];
    /* the open step */
    int32_t nstep;
    int32_t order[ATTND_MIRROR_MAX_SEQS]; /* indices into seqs */
    attnd_test_tensor bt, sl, qsl, slots;
    int64_t num_tokens;
    int32_t max_qlen, max_seqlen;
} attnd_mirror;

/* Geometry from the daemon's HelloReply; room for max_tokens per sequence. 0 on success. */
int attnd_mirror_init(attnd_mirror *m, const attnd_geometry *g, const attnd_mirror_opts *o,
                      int32_t max_tokens);
void attnd_mirror_fini(attnd_mirror *m);
/* Track a new (empty) sequence, or a fork of parent (its rows copied). 0 on success. */
int attnd_mirror_create(attnd_mirror *m, uint64_t id);
int attnd_mirror_fork(attnd_mirror *m, uint64_t parent, uint64_t child);
void attnd_mirror_free(attnd_mirror *m, uint64_t id);
/* Drop the last n tokens of a sequence (its rows are rewritten by later steps). */
void attnd_mirror_truncate(attnd_mirror *m, uint64_t id, int32_t n);
/* Committed tokens of a sequence (-1 if unknown). */
int32_t attnd_mirror_len(const attnd_mirror *m, uint64_t id);
/* A step over n sequences (same order as the daemon's BeginStep). 0 on success. */
int attnd_mirror_begin(attnd_mirror *m, const attnd_step_seq *seqs, int32_t n);
/* One layer: write k/v ([T, kv_heads, head]) into the local cache, then compute q's
 * ([T, q_heads, head]) expected output with the CPU op into direct (a contiguous
 * [T, q_heads, head] tensor in the dtype the daemon is asked for) and direct_lse
 * ([q_heads, T] f32), and with the reference into ref / ref_lse (doubles, same layouts; ref
 * NULL skips it). Returns the CPU op's error code. */
attnd_err attnd_mirror_attend(attnd_mirror *m, uint32_t layer, const attnd_tensor *q,
                              const attnd_tensor *k, const attnd_tensor *v,
                              const attnd_tensor *direct, float *direct_lse, double *ref,
                              double *ref_lse);
/* Commit (tokens become part of the sequences) or abort the open step. */
void attnd_mirror_end(attnd_mirror *m, int commit);

/* Tensors of one Attend laid out in a shm region: q | k | v | out | lse, each 64-byte aligned,
 * for `rows` rows in dtype dt (lse f32). */
typedef struct attnd_e2e_io {
    attnd_tensor q, k, v, out, lse; /* views into the mapping */
    attnd_ref rq, rk, rv, rout, rlse;
    size_t bytes; /* region bytes the layout needs */
} attnd_e2e_io;

/* Bytes a region needs for `rows` rows. */
size_t attnd_e2e_io_bytes(const attnd_geometry *g, attnd_dtype dt, int64_t rows);
/* Lay out `rows` rows at the start of shm. */
void attnd_e2e_io_layout(attnd_e2e_io *io, const attnd_geometry *g, const attnd_shm *shm,
                         attnd_dtype dt, int64_t rows);
/* Random q, k, v (N(0, sigma^2)) and NaN in out and lse. */
void attnd_e2e_io_fill(attnd_e2e_io *io, attnd_rng *r, double sigma);

/* Relative L2 error of a contiguous tensor against expected values: another tensor (any float
 * dtype) or doubles (+inf when a holds NaN or inf). */
double attnd_e2e_rel_l2_t(const attnd_tensor *a, const attnd_tensor *b);
double attnd_e2e_rel_l2_d(const attnd_tensor *a, const double *b);
/* Largest |a - b| of an LSE tensor; a row expected -inf must be exactly -inf (else +inf). */
double attnd_e2e_lse_err(const attnd_tensor *a, const double *b);

/* ---------------------------------------------------------------- bounds */

/* The daemon's out against the CPU op on the same cache, relative L2: near-exact. Decode steps
 * run the split-KV (3D) kernel there and the 2D one here, which may round the last f32 bit
 * differently (test_paged bounds 3D vs 2D by 1e-5); a 16-bit output turns such a bit into one
 * ulp of its dtype on a few elements. */
double attnd_e2e_direct_tol(attnd_dtype out_dtype);
/* Largest |lse - expected| against the CPU op and against the reference. */
#define ATTND_E2E_DIRECT_LSE_TOL 1e-5
#define ATTND_E2E_REF_LSE_TOL 1e-3

/* ---------------------------------------------------------------- one step through the daemon */

/* Worst errors seen so far (start zeroed): the daemon's out and out_lse against the CPU op
 * called directly (direct*) and against the float64 reference (ref*). */
typedef struct attnd_e2e_errs {
    double direct, direct_lse, ref, ref_lse;
    int64_t attends; /* Attend requests checked */
} attnd_e2e_errs;

/* One step on the daemon and the mirror: BeginStep (its num_tokens and query_start_loc checked
 * against the mirror's), then for every layer fresh random q/k/v in dtype dt at the start of
 * shm (inline refs when use_inline), Attend with out and out_lse, compare; then EndStep (commit,
 * or abort when abort != 0) on both. Returns the first failing call's code (the client's message
 * printed), or INTERNAL after printing a mismatch of the step layout. */
attnd_err attnd_e2e_step(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, attnd_dtype dt,
                         int use_inline, const attnd_step_seq *seqs, int32_t n, int abort,
                         attnd_rng *r, attnd_e2e_errs *errs);
/* The Attends of a step already begun on both sides (step = the daemon's id): every layer with
 * fresh random inputs, compared; the step stays open. */
attnd_err attnd_e2e_attend_layers(attnd_client *c, attnd_mirror *m, const attnd_shm *shm,
                                  attnd_dtype dt, int use_inline, uint64_t step, attnd_rng *r,
                                  attnd_e2e_errs *errs);
/* Fold one check into errs. */
void attnd_e2e_errs_max(attnd_e2e_errs *errs, double direct, double direct_lse, double ref,
                        double ref_lse);

#endif
