/* The socket transport: an NNG REP socket listening on ipc:// (and optionally tcp:// or
 * tls+tcp://) with N nng_ctx receive loops. Each loop is one aio and a small state machine,
 * RECV -> WAIT (executor) -> SEND -> RECV: the aio callback decodes the Request and queues it on
 * the executor, which hands it up (attnd_wire_deliver) and later sends the reply on the same
 * ctx. A full queue or a draining daemon gets UNAVAILABLE. Connection drops (pipe
 * notifications) are posted to the executor and reach the handler's pipe_closed. */
#ifndef ATTND_WIRE_SOCKET_H
#define ATTND_WIRE_SOCKET_H

#include <stdint.h>

#include "../core/config.h"
#include "../core/exec.h"
#include "../core/log.h"
#include "wire.h"

typedef struct attnd_socket attnd_socket;

/* Open the socket and its listeners (they accept at once; requests wait for start). err names
 * the key for bad URLs. w and ex outlive the socket. */
attnd_err attnd_socket_alloc(attnd_socket **sock, const attnd_config *cfg, attnd_wire *w,
                             attnd_exec *ex, attnd_log *lg, char *err, size_t n);
/* Start the receive loops. */
void attnd_socket_start(attnd_socket *sock);
/* Housekeeping, every loop tick (loop thread): the listeners' watch (wire/listen.h). */
void attnd_socket_tick(attnd_socket *sock);
/* Stop accepting: new connections are refused, later requests answered UNAVAILABLE; open
 * connections stay up so the replies to what was accepted still reach their clients. */
void attnd_socket_drain(attnd_socket *sock);
/* Stop every aio (no callback runs after), close the socket, free. Stop the executor first. */
void attnd_socket_free(attnd_socket *sock);

#endif
