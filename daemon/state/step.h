/* Steps: BeginStep reserves cache slots for every sequence's new tokens (all or nothing),
 * copies shared partial blocks (COW) and plans the step once (attnd/plan.h), its index arrays
 * uploaded once; each Attend writes one layer's new K/V into the cache and runs the planned
 * launches with no host-side planning; EndStep commits the tokens (a layer no Attend wrote
 * reads as zeros) or aborts (every reserved block released, the sequences exactly as before).
 * Executor thread only. */
#ifndef ATTND_STATE_STEP_H
#define ATTND_STATE_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "../obs/metrics.h"
#include "attnd/plan.h"
#include "cache.h"
#include "devmem.h"
#include "model.h"
#include "session.h"

typedef struct attnd_step {
    uint64_t id, owner;
    uint32_t nseqs;
    attnd_seq **seqs;
    void *ws; /* host plan workspace */
    attnd_plan plan;
    attnd_index_ref index; /* the plan's index arrays where the backend reads them */
    uint8_t *written;      /* [num_layers]: an Attend wrote this layer's K/V */
    struct attnd_step *next;
} attnd_step;

/* The open steps of every session, and the memory they work on. */
typedef struct attnd_steps {
    attnd_step *head;
    uint64_t next_id;
    const attnd_model *model;
    attnd_devmem *dm;
    attnd_cache *cache;
    attnd_metrics *metrics; /* kernel time and bytes by kind; NULL = not counted */
} attnd_steps;

/* One sequence of a BeginStep request. */
typedef struct attnd_step_req {
    uint64_t seq_id;
    uint32_t new_tokens;
} attnd_step_req;

/* The tensors of one layer's Attend, resolved (lse.data NULL = none). */
typedef struct attnd_attend_io {
    attnd_tensor q, k, v, out, lse;
} attnd_attend_io;

/* Kernels an Attend left running: its reply waits for the fence. */
typedef struct attnd_kernel_wait {
    struct attnd_fence *fence; /* NULL: nothing left running */
    const char *what;          /* the last kernel queued, named if they fail */
    int kind;                  /* attnd_metrics_kernel_kind charged with the wait */
    uint64_t t_ns;             /* when the last kernel was queued */
} attnd_kernel_wait;

void attnd_steps_init(attnd_steps *ss, const attnd_model *m, attnd_devmem *dm, attnd_cache *c);
/* Abort and free every open step (shutdown). */
void attnd_steps_fini(attnd_steps *ss);
uint64_t attnd_steps_count(const attnd_steps *ss);
/* Abort every open step of session s (its connection dropped). */
void attnd_steps_abort_session(attnd_steps *ss, attnd_session *s);

/* Open a step of s over seqs[n] (n >= 1): every sequence found in s, in no open step, listed
 * once, with room for its new tokens; at most max_step_tokens in all (INVALID_ARGUMENT, NOT_FOUND
 * naming seqs[i]); room reserved in the cache (OUT_OF_BLOCKS), shared partial blocks copied,
 * the step planned and its index arrays made readable. All or nothing. */
attnd_err attnd_step_begin(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                           uint32_t n, uint32_t max_step_tokens, attnd_step **out, char *err,
                           size_t en);
/* Step id of s: NOT_FOUND when s has no such step open. */
attnd_err attnd_step_find(attnd_steps *ss, const attnd_session *s, uint64_t id, attnd_step **out,
                          char *err, size_t n);
/* Make st's index arrays readable by the backend again (its slot may have been reused). */
attnd_err attnd_step_index(attnd_steps *ss, attnd_step *st, char *err, size_t n);
/* Run layer `layer` of st (< num_layers; attnd_step_index done): write io's new K/V rows, run
 * the launches. With device-resident tensors only (host_views 0) on a device backend the
 * kernels are left running behind wait->fence; otherwise this waits for them. */
attnd_err attnd_step_attend(attnd_steps *ss, attnd_step *st, uint32_t layer,
                            const attnd_attend_io *io, int host_views, attnd_kernel_wait *wait,
                            char *err, size_t n);
/* Commit (zeros written into every layer no Attend wrote) or abort st, and free it. A failed
 * commit aborts. */
attnd_err attnd_step_end(attnd_steps *ss, attnd_session *s, attnd_step *st, int abort, char *err,
                         size_t n);

#endif
