/* The client object (struct attnd_client) and the library's internal calls: the call layer
 * (call.c), replies and the last error (reply.c), tensor references on the wire (ref.c). The
 * transports (transport.h, socket_transport.h, channel_transport.h) and shm objects (shm.h) sit
 * below and know nothing of this header. Never installed. */
#ifndef ATTND_CLIENT_CLIENT_INT_H
#define ATTND_CLIENT_CLIENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"
#include "channel_transport.h"
#include "socket_transport.h"

/* The layers of a decoded geometry: the options and the floats they point to. */
typedef struct attnd_client_layers {
    attnd_layer_opts *opts;
    float *values;
} attnd_client_layers;

struct attnd_client {
    attnd_client_socket *socket;
    attnd_client_chan *chan; /* set and cleared only while no call is in flight */
    int dialed;
    int64_t shm_gid; /* group for shm objects (attnd_client_shm_group), -1 when none */
    char url[512];   /* the last URL dialed (attnd_client_url) */
    char name[64];
    char token[256];
    char tls_ca_file[512];
    char tls_server_name[256];
    _Atomic int32_t timeout_ms;
    _Atomic uint64_t next_id;
    _Atomic uint32_t next_region;
    uint64_t session;
    int have_server;
    attnd_server_info server;
    int32_t channel_slots, spin_us;
    pthread_mutex_t mu; /* guards last_error and last_remote */
    char last_error[512];
    int last_remote;      /* last_error came from the daemon */
    char chan_error[512]; /* why attnd_client_connect's channel did not open */
    attnd_client_layers hello_layers, status_layers; /* what attnd_geometry.layers point to */
    attnd_expect expect;                             /* deep copy; num_layers... 0 = none */
    attnd_layer_opts *expect_layers;
    float *expect_values;
    int have_expect;
    pthread_mutex_t streams_mu;          /* guards streams (the socket's lost hook walks it) */
    struct attnd_client_stream *streams; /* open stream channels (stream.c) */
};

/* snprintf's "%s" of src (NULL = ""), always terminated. */
static inline void attnd_client_copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

/* ---------------------------------------------------------------- stream.c */

/* The connection dropped: every open stream channel writes its own o words, so that no wait
 * queued on a worker's stream outlives the daemon (the socket's lost hook, an NNG thread). */
void attnd_client_streams_lost(void *client);

/* ---------------------------------------------------------------- call.c */

/* One round trip: stamp req with a fresh id and the session, send it through the first
 * transport that carries it (the channel, else the socket), wait for the matching reply. On OK
 * *rep holds the reply (free with attnd__reply__free_unpacked); otherwise *rep is NULL, the
 * error message is recorded and the daemon's or the local code is returned. */
attnd_err attnd_client_rpc(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep);
/* attnd_client_rpc with a call budget of its own (ms, < 0: none) instead of the client's. */
attnd_err attnd_client_rpc_timeout(attnd_client *c, Attnd__Request *req, Attnd__Reply **rep,
                                   int32_t timeout_ms);
/* attnd_client_connect's channel: on failure calls take the socket, the reason goes to
 * chan_error and last_error stays as it was (the connect succeeded). */
void attnd_client_channel_connect(attnd_client *c);
/* Unmap and free the channel without telling the daemon (attnd_client_free). */
void attnd_client_channel_drop(attnd_client *c);

/* ---------------------------------------------------------------- reply.c */

/* Record a client-side error message (printf format) and return err. */
attnd_err attnd_client_fail(attnd_client *c, attnd_err err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Record "connection lost" for req and return UNAVAILABLE. */
attnd_err attnd_client_fail_lost(attnd_client *c, const Attnd__Request *req);
/* Decode the len reply bytes at buf to req: OK with *rep, or the error reply's code (its
 * message recorded as the daemon's), or PROTOCOL (undecodable, another request's id). */
attnd_err attnd_client_decode(attnd_client *c, const Attnd__Request *req, const void *buf,
                              size_t len, Attnd__Reply **rep);
/* The request's name in messages ("attend", "begin_step", ...). */
const char *attnd_client_body_name(Attnd__Request__BodyCase k);

/* The last error, saved to be put back (a failure that must not show as the last error). */
typedef struct attnd_client_error {
    char message[512];
    int remote;
} attnd_client_error;
void attnd_client_error_save(attnd_client *c, attnd_client_error *e);
void attnd_client_error_restore(attnd_client *c, const attnd_client_error *e);

/* ---------------------------------------------------------------- session.c */

/* Free what attnd_client_layers holds (client free). */
void attnd_client_layers_free(attnd_client_layers *l);
/* Free the expectation's copy (client free). */
void attnd_client_expect_free(attnd_client *c);

/* ---------------------------------------------------------------- seq.c */

/* A BeginStepReply into step (and the n + 1 row offsets when query_start_loc is not NULL);
 * PROTOCOL when it is not one. */
attnd_err attnd_client_step_from_pb(attnd_client *c, const Attnd__Reply *rep, size_t n,
                                    attnd_step *step, uint32_t *query_start_loc);

/* ---------------------------------------------------------------- ref.c */

/* Wire form of a reference (an output never carries data). pb points into r (shape, strides,
 * data): keep r alive until sent. INVALID_ARGUMENT, naming field, when r cannot be encoded. */
attnd_err attnd_client_ref_to_pb(attnd_client *c, const char *field, const attnd_ref *r,
                                 int is_output, Attnd__TensorRef *pb);
/* Copy a reply's inline outputs into the inline refs among outs[0..n) (NULL entries and region
 * refs skipped), in order. PROTOCOL when the count or a size disagrees. */
attnd_err attnd_client_take_outputs(attnd_client *c, const Attnd__Reply *rep,
                                    attnd_ref *const *outs, size_t n);

#endif
