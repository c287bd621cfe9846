/* Kernel requests on client tensors: merge states, varlen attention, block-sparse attention,
 * linear attention prefill and decode (against the daemon-owned state of each sequence).
 *
 * Besides each reference's own bounds, the shapes of all tensors of a request are checked
 * against one another, and index tensors (cu_seqlens, the block-sparse layout) are read and
 * checked, so that whatever a client sends, no kernel indexes outside what it was given.
 * Executor thread only. */
#ifndef ATTND_DAEMON_TENSOROPS_H
#define ATTND_DAEMON_TENSOROPS_H

#include "ops.h"

attnd_err attnd_tensorops_merge(attnd_ops *o, attnd_session *s, const Attnd__MergeStates *m,
                                attnd_ops_reply *r);
attnd_err attnd_tensorops_varlen(attnd_ops *o, attnd_session *s, const Attnd__VarlenAttention *m,
                                 attnd_ops_reply *r);
attnd_err attnd_tensorops_blocksparse(attnd_ops *o, attnd_session *s,
                                      const Attnd__BlocksparseAttention *m, attnd_ops_reply *r);
attnd_err attnd_tensorops_linear_prefill(attnd_ops *o, attnd_session *s,
                                         const Attnd__LinearPrefill *m, attnd_ops_reply *r);
attnd_err attnd_tensorops_linear_decode(attnd_ops *o, attnd_session *s,
                                        const Attnd__LinearDecode *m, attnd_ops_reply *r);

#endif
