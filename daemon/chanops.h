/* Requests about shared-memory channels (OpenChannel, CloseChannel, WakeChannel): the session
 * side of channel.h, on the executor thread like every handler. */
#ifndef ATTND_DAEMON_CHANOPS_H
#define ATTND_DAEMON_CHANOPS_H

#include "ops.h"

attnd_err attnd_chanops_open(attnd_ops *o, attnd_session *s, const Attnd__OpenChannel *m,
                             attnd_ops_reply *r);
attnd_err attnd_chanops_close(attnd_ops *o, attnd_session *s, const Attnd__CloseChannel *m,
                              attnd_ops_reply *r);
/* Nothing to do but answer: handling it woke the executor, which polls its channels next. */
attnd_err attnd_chanops_wake(attnd_ops *o, attnd_session *s, const Attnd__WakeChannel *m,
                             attnd_ops_reply *r);
/* The session's connection dropped: its channels close (after in-flight replies went out). */
void attnd_chanops_session_gone(attnd_ops *o, attnd_session *s);

#endif
