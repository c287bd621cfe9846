/* Steps: BeginStep reserves cache slots for every sequence's new tokens (all or nothing),
 * copies shared partial blocks (COW) and plans the step once (attnd/plan.h), its index arrays
 * uploaded once; each Attend writes one layer's new K/V into the cache and runs the planned
 * launches with no host-side planning, once per layer (a second Attend of a layer is refused);
 * EndStep commits the tokens only when every layer was attended exactly once (otherwise
 * FAILED_PRECONDITION naming the layers, and the step stays open), or aborts (always allowed:
 * every reserved block released, the sequences exactly as before). Executor thread only. */
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

/* What the Attends of a step did to one layer. */
enum { ATTND_LAYER_OPEN = 0, ATTND_LAYER_ATTENDED = 1, ATTND_LAYER_REPEATED = 2 };

typedef struct attnd_step {
    uint64_t id, owner;
    uint32_t nseqs;
    attnd_seq **seqs;
    void *ws; /* host plan workspace */
    attnd_plan plan;
    attnd_index_ref index; /* the plan's index arrays where the backend reads them */
    uint8_t *attended;     /* [num_layers]: ATTND_LAYER_* */
    uint32_t stream;       /* the stream channel that runs it (state/stream.h), 0 = none */
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
/* attnd_step_begin for a step the stream channel `stream` runs: no index slot is taken (the
 * channel keeps the plan's index arrays itself, st->index.dev is its to set). */
attnd_err attnd_step_begin_stream(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                                  uint32_t n, uint32_t max_step_tokens, uint32_t stream,
                                  attnd_step **out, char *err, size_t en);
/* Unlink st from the open steps without touching its sequences or blocks (a step whose kernels
 * may still run on a stream that would not drain: its memory is never reused). */
void attnd_step_detach(attnd_steps *ss, attnd_step *st);
/* Free a detached step's own memory (its sequences are not touched). */
void attnd_step_free_detached(attnd_steps *ss, attnd_step *st);
/* Layer `layer` of a step with io's tensors, as the planner runs it (the layer's cache pools
 * and options). */
attnd_plan_layer attnd_step_plan_layer(const attnd_steps *ss, uint32_t layer,
                                       const attnd_attend_io *io);
/* Step id of s: NOT_FOUND when s has no such step open. */
attnd_err attnd_step_find(attnd_steps *ss, const attnd_session *s, uint64_t id, attnd_step **out,
                          char *err, size_t n);
/* Layer `layer` (< num_layers) may be attended in st: FAILED_PRECONDITION when an Attend of it
 * already succeeded in this step (the layer is then marked repeated: st can only abort). */
attnd_err attnd_step_layer_check(attnd_step *st, uint32_t layer, char *err, size_t n);
/* An Attend of layer whose kernels ran but whose result is void (its reply is an error): the
 * layer counts as not attended, and may be attended again (rewriting the same slots). */
void attnd_step_layer_void(attnd_step *st, uint32_t layer);
/* Make st's index arrays readable by the backend again (its slot may have been reused). */
attnd_err attnd_step_index(attnd_steps *ss, attnd_step *st, char *err, size_t n);
/* Run layer `layer` of st (< num_layers; attnd_step_layer_check and attnd_step_index done):
 * write io's new K/V rows, run the launches; on success the layer counts as attended. With
 * device-resident tensors only (host_views 0) on a device backend the kernels are left running
 * behind wait->fence; otherwise this waits for them. */
attnd_err attnd_step_attend(attnd_steps *ss, attnd_step *st, uint32_t layer,
                            const attnd_attend_io *io, int host_views, attnd_kernel_wait *wait,
                            char *err, size_t n);
/* Abort st, or commit it when every layer was attended exactly once, and free it. A commit
 * with layers not attended, or attended more than once, is FAILED_PRECONDITION naming them
 * ("layers 2-5, 9 not attended"), and st stays open (attend the missing layers and end it
 * again, or abort it). A commit that fails otherwise aborts. */
attnd_err attnd_step_end(attnd_steps *ss, attnd_session *s, attnd_step *st, int abort, char *err,
                         size_t n);

#endif
