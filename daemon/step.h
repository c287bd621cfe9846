/* Steps: BeginStep reserves cache slots for every sequence's new tokens (all or nothing),
 * copies shared partial blocks (COW) and plans the step once (attnd/plan.h); each Attend writes one
 * layer's new K/V into the cache and runs the planned paged-attention launches with no
 * host-side planning; EndStep commits the tokens or aborts (every reserved block released, the
 * sequences exactly as before). Executor thread only. */
#ifndef ATTND_DAEMON_STEP_H
#define ATTND_DAEMON_STEP_H

#include <stdint.h>

#include "ops.h"

attnd_err attnd_step_begin(attnd_ops *o, attnd_session *s, const Attnd__BeginStep *m,
                           attnd_ops_reply *r);
attnd_err attnd_step_attend(attnd_ops *o, attnd_session *s, const Attnd__Attend *m,
                            attnd_ops_reply *r);
attnd_err attnd_step_end(attnd_ops *o, attnd_session *s, const Attnd__EndStep *m,
                         attnd_ops_reply *r);
/* Abort every open step of a session (its connection dropped). */
void attnd_step_abort_session(attnd_ops *o, attnd_session *s);
/* Abort and free every open step (shutdown). */
void attnd_step_free_all(attnd_ops *o);
uint64_t attnd_step_count(const attnd_ops *o);

#endif
