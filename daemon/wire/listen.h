/* The NNG socket's listeners, kept accepting.
 *
 * NNG 1.5.2 (Debian 12's libnng) stops accepting on a listener for good once a connection goes
 * away before NNG wrote its SP header to it: the write fails with EPIPE, which NNG reports as
 * NNG_ECLOSED on the listener's accept, and the listener takes that for its own close
 * (nanomsg/nng#1518, fixed by PR #1519 in 1.6: /work/notes/nng1518/REPORT.md has the code
 * reading). On ipc a plain connect()+close() does it (a health probe, `nc -U`, NNG's own check
 * for a stale socket file in a second daemon's listen); on tcp a FIN and an RST in a row. Later
 * clients still complete their handshake (their dial succeeds) and wait for ever. So:
 *
 *  - ipc: the path is held under a lock ("<path>.lock", flock) taken before NNG touches it. A
 *    second attnd fails there, naming the key and the holder's pid, and never connects to the
 *    socket.
 *  - A watch: every server.listener_check_ms a probe dials each listener (a full SP handshake,
 *    nothing sent). The nng#1518 state is exactly "the probe's handshake completed but the
 *    listener reported no new connection (ADD_PRE) within the check's timeout"; only that
 *    replaces a listener. On ipc each listener binds a private "<path>.<n>" and the path is a
 *    hard link to it, switched atomically (link + rename): clients never see the name missing,
 *    and the replaced listener keeps its connections (their sessions) until they end. On tcp and
 *    tls+tcp the listener is closed and listened again (its connections drop), after two probes
 *    in a row, so that one slow probe on a loaded host costs nobody a session.
 *
 * On NNG >= 1.6 the state cannot occur: the watch does not run (the lock stays). */
#ifndef ATTND_WIRE_LISTEN_H
#define ATTND_WIRE_LISTEN_H

#include <nng/nng.h>
#include <stddef.h>

#include "../core/config.h"
#include "../core/log.h"
#include "../obs/metrics.h"
#include "attnd/err.h"

typedef struct attnd_listen attnd_listen;

/* Listen on url (key names it in errors: "server.listen") with cfg's mode, group and TLS
 * settings; ipc paths under the lock. UNAVAILABLE when the address is in use (err says by
 * whom when it is another attnd), INVALID_ARGUMENT for bad settings. metrics may be NULL. */
attnd_err attnd_listen_open(attnd_listen **out, nng_socket s, const char *key, const char *url,
                            const attnd_cfg_server *cfg, attnd_log *lg, attnd_metrics *metrics,
                            char *err, size_t n);
/* From the socket's pipe callback: a connection of listener p was added (ADD_PRE, accepted)
 * or removed (REM_POST). Any thread. */
void attnd_listen_pipe(attnd_listen *l, nng_pipe p, int added);
/* Housekeeping (the loop thread, never an NNG callback): probe, judge, replace, close replaced
 * listeners whose connections ended. draining: no probes. */
void attnd_listen_tick(attnd_listen *l, int draining);
/* Before the socket closes: the probe goes. */
void attnd_listen_stop(attnd_listen *l);
/* After the socket closed: the path (when it is still ours) and the lock go. NULL is a no-op. */
void attnd_listen_free(attnd_listen *l);

#endif
