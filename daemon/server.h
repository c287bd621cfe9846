/* Server: an NNG REP socket listening on ipc:// (and optionally tcp://) with N nng_ctx receive
 * loops. Each loop is one aio and a small state machine, RECV -> WAIT (executor) -> SEND ->
 * RECV: the aio callback decodes the protobuf Request and queues it; the executor handles it and
 * sends the reply on the same ctx. Every received message gets exactly one reply: undecodable
 * bytes and unknown fields get PROTOCOL, a full queue or a draining daemon UNAVAILABLE.
 * Connection drops (pipe notifications) are posted to the executor. */
#ifndef ATTND_DAEMON_SERVER_H
#define ATTND_DAEMON_SERVER_H

#include <stdint.h>

#include "config.h"
#include "exec.h"
#include "log.h"
#include "ops.h"

typedef struct attnd_server attnd_server;

/* Open the socket and its listeners (they accept at once; requests wait for start).
 * err names the key for bad URLs. */
attnd_err attnd_server_alloc(attnd_server **srv, const attnd_config *cfg, attnd_ops *ops,
                             attnd_exec *ex, attnd_log *lg, char *err, size_t n);
/* Count requests, latency, bytes and connections in obs's metrics and rate-limit the error log
 * lines through it (call before attnd_server_start; obs outlives the server). */
struct attnd_observe;
void attnd_server_set_observe(attnd_server *srv, struct attnd_observe *obs);
/* Start the receive loops. */
void attnd_server_start(attnd_server *srv);
/* Stop accepting: new connections are refused, later requests answered UNAVAILABLE; open
 * connections stay up so the replies to what was accepted still reach their clients. */
void attnd_server_drain(attnd_server *srv);
/* Requests received and not yet answered. */
uint32_t attnd_server_busy(attnd_server *srv);
/* The decode step of every received message, apart so tests and fuzzers share it: the
 * Request, or NULL with *code (PROTOCOL) and a message; *id is the request's id when it
 * decoded (0 otherwise). A Request with unknown fields anywhere is refused. */
Attnd__Request *attnd_server_decode(const void *buf, size_t len, uint64_t *id, attnd_err *code,
                                    char *msg, size_t n);
/* Stop every aio (no callback runs after), close the socket, free. Stop the executor first. */
void attnd_server_free(attnd_server *srv);

#endif
