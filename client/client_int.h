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

#endif
