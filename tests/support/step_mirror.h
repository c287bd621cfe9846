/* Run one layer of a planned step on a backend directly, exactly as the daemon does it
 * (daemon/step.c): the cache write of the new K/V rows by the plan's slot mapping, then every
 * launch of the plan (daemon/sched.c) with the same slices of Q, out and LSE, the same index
 * arrays, kernel kind and segment count. With the same plan options the results are the
 * daemon's bit for bit (the GPU test checks that), and the benchmark times the kernels alone. */
#ifndef ATTND_TESTS_STEP_MIRROR_H
#define ATTND_TESTS_STEP_MIRROR_H

#include "attnd/kernels.h"
#include "sched.h"

typedef struct attnd_step_layer {
    attnd_tensor q, k_new, v_new, out, lse; /* lse.data NULL = none */
    attnd_tensor k_cache, v_cache;          /* the layer's pools */
    float scale;
} attnd_step_layer;

/* The planner options the daemon uses for this geometry on a backend with `units` parallel
 * units (cpu: threads; cuda: SMs). */
attnd_sched_opts attnd_step_mirror_opts(int32_t block_size, int32_t num_q_heads,
                                        int32_t num_kv_heads, int32_t head_size, int32_t units);
/* index: the plan's index arrays (plan->index_bytes from plan->slot_mapping) where be reads
 * them; ws3d: at least plan->workspace_3d bytes of backend memory (NULL when none is needed).
 * which: 1 = the cache write, 2 = the attention launches, 3 = both. */
attnd_err attnd_step_mirror_layer(attnd_backend *be, const attnd_plan *plan, void *index,
                                  const attnd_step_layer *l, void *ws3d, int which);
/* The whole batch of plan in one 2D launch (what the seed's single-kernel choice does). */
attnd_err attnd_step_mirror_single_2d(attnd_backend *be, const attnd_plan *plan, void *index,
                                      const attnd_step_layer *l);

#endif
