/* Internals shared by the client's source files (never installed). */
#ifndef ATTND_CLIENT_CLIENT_INT_H
#define ATTND_CLIENT_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"

/* Record a client-side error message (printf format) and return err. */
attnd_err attnd_client_fail(attnd_client *c, attnd_err err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One round trip: stamp req with a fresh id and the session, send it, wait for the matching
 * reply. On OK *rep holds the reply (free with attnd__reply__free_unpacked); otherwise *rep is
 * NULL, the error message is recorded and the daemon's or the local code is returned. */
attnd_err attnd_client_rpc(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep);

/* Wire form of a reference (an output never carries data). pb points into r (shape, strides,
 * data): keep r alive until sent. INVALID_ARGUMENT, naming field, when r cannot be encoded. */
attnd_err attnd_client_ref_to_pb(attnd_client *c, const char *field, const attnd_ref *r,
                                 int is_output, Attnd__TensorRef *pb);

/* Copy a reply's inline outputs into the inline refs among outs[0..n) (NULL entries and region
 * refs skipped), in order. PROTOCOL when the count or a size disagrees. */
attnd_err attnd_client_take_outputs(attnd_client *c, const Attnd__Reply *rep,
                                    attnd_ref *const *outs, size_t n);

/* Geometry from its wire form. */
void attnd_client_geometry_from_pb(attnd_geometry *g, const Attnd__Geometry *pb);

/* Decode the len reply bytes at buf to req as attnd_client_rpc does: OK with *rep, or the error
 * reply's code (its message recorded), or PROTOCOL (undecodable, another request's id). */
attnd_err attnd_client_decode(attnd_client *c, const Attnd__Request *req, const void *buf,
                              size_t len, Attnd__Reply **rep);
/* 1 once the connection dropped (every call fails). */
int attnd_client_is_lost(attnd_client *c);
/* Record "connection lost" for req and return UNAVAILABLE, as the socket path does. */
attnd_err attnd_client_fail_lost(attnd_client *c, const Attnd__Request *req);
/* The request's name in messages ("attend", "begin_step", ...). */
const char *attnd_client_body_name(Attnd__Request__BodyCase k);

/* A shm object the daemon must open (region or channel) gets the group of the daemon's ipc://
 * socket when this process may give it (0660 then lets a daemon running as another user in that
 * group map it, as its socket lets us connect); otherwise it keeps ours. */
void attnd_client_shm_share(const attnd_client *c, int fd);

/* Create an exclusive shm object of size bytes, named "/<prefix>-<pid>-<tag>-<salt>" into
 * name[cap], with the daemon's group (attnd_client_shm_share), and map it into *base. On failure
 * nothing is left and the error is recorded, what (e.g. "channel: ") before the system call:
 * INTERNAL, NO_MEMORY. (region.c) */
attnd_err attnd_client_shm_new(attnd_client *c, const char *what, const char *prefix,
                               unsigned long tag, size_t size, char *name, size_t cap, void **base);

/* ---------------------------------------------------------------- channel.c */

/* The same-host shared-memory channel (proto/attnd_channel.h) of a client. */
typedef struct attnd_client_chan attnd_client_chan;

/* Make an object of `slots` slots (0 = ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS, else 1..64) sized
 * for the session's limits, register it with OpenChannel and unlink its name. spin_us as in
 * attnd_client_opts. After Hello. On failure nothing is left and the error is recorded on c:
 * INVALID_ARGUMENT (slots), UNAVAILABLE (no session), NO_MEMORY / INTERNAL (the system call is
 * named), or the daemon's refusal. */
attnd_err attnd_client_chan_open(attnd_client *c, int32_t slots, int32_t spin_us,
                                 attnd_client_chan **ch);
/* Unmap and free ch (NULL is ignored); first CloseChannel on the socket when tell and the
 * channel is still active, whose result is returned. No call may be using ch. */
attnd_err attnd_client_chan_close(attnd_client *c, attnd_client_chan *ch, int tell);
/* 1 while requests go through ch (not NULL, not closed by the daemon). */
int attnd_client_chan_active(const attnd_client_chan *ch);
/* Serve req (id and session stamped) through ch when the channel carries it (per-step and
 * per-layer requests without INLINE outputs), it fits a slot and a slot is free: returns 1 with
 * *rv its result (*rep on OK, as attnd_client_rpc). Returns 0, having done nothing, when req
 * must take the socket. timeout_ms < 0: wait forever. */
int attnd_client_chan_rpc(attnd_client *c, attnd_client_chan *ch, const Attnd__Request *req,
                          int32_t timeout_ms, attnd_err *rv, Attnd__Reply **rep);

#endif
