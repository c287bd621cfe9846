/* Shared-memory channels (proto/attnd_channel.h): the client-made shm objects that carry
 * Requests and Replies on the same host without the socket's thread hand-offs.
 *
 * This module knows the object's layout, not protobuf: it maps and validates an object,
 * watches it with the SIGBUS guard (a client that truncates its object makes it read as
 * zeros, and the channel is dropped, instead of killing the daemon), finds posted requests and
 * copies them out, writes replies and wakes a sleeping client, and keeps daemon_state.
 * channel_transport.c decodes and answers; the executor polls (core/exec.c). Executor thread
 * only. */
#ifndef ATTND_WIRE_CHANNEL_H
#define ATTND_WIRE_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"
#include "../core/log.h"
#include "../core/shmguard.h"

typedef struct attnd_channels attnd_channels;

/* Channels one session may hold open: server.channels is shared by every session. */
#define ATTND_CHANNELS_PER_SESSION 4u

/* A request taken from a slot: its bytes, copied out of the object (valid only during the
 * callback). bytes == NULL: the posted req_len (in len) is 0 or over req_bytes; the caller
 * answers with an error. */
typedef struct attnd_channel_req {
    uint32_t channel; /* id */
    uint32_t slot;
    uint64_t session; /* the session that opened the channel */
    uint32_t pipe;    /* that session's connection */
    const void *bytes;
    size_t len;
} attnd_channel_req;

/* Called by attnd_channels_poll for each request taken. */
typedef void (*attnd_channel_req_fn)(void *arg, const attnd_channel_req *req);

/* Room for max channels in all (0 = channels off: open answers UNAVAILABLE). guard may be NULL
 * (tests): objects are then not guarded. */
attnd_err attnd_channels_alloc(attnd_channels **cs, attnd_shmguard *guard, uint32_t max,
                               attnd_log *lg);
/* Close every channel (daemon_state CLOSED) and free. NULL is ignored. */
void attnd_channels_free(attnd_channels *cs);

/* Map shm_name (size bytes) for session/pipe and check its header against size: magic,
 * version, nslots, areas (attnd_channel_size), every req_seq == rep_seq. *id gets the new
 * channel's id. INVALID_ARGUMENT (naming shm_name, size or header.<field>), NOT_FOUND,
 * PERMISSION_DENIED, ALREADY_EXISTS (the object is a channel already), UNAVAILABLE (max
 * channels open, or ATTND_CHANNELS_PER_SESSION for this session), NO_MEMORY. */
attnd_err attnd_channels_open(attnd_channels *cs, uint64_t session, uint32_t pipe,
                              const char *shm_name, uint64_t size, uint32_t *id, char *err,
                              size_t n);
/* Close one of session's channels: NOT_FOUND when it has no channel id. A request taken from
 * it and not answered yet gets no reply (the caller drains first). */
attnd_err attnd_channels_close(attnd_channels *cs, uint64_t session, uint32_t id, char *err,
                               size_t n);
/* Close every channel of session (its connection dropped, or it was reclaimed). */
void attnd_channels_close_session(attnd_channels *cs, uint64_t session);
/* NOT_FOUND unless session has channel id open. */
attnd_err attnd_channels_check(const attnd_channels *cs, uint64_t session, uint32_t id, char *err,
                               size_t n);

/* At most max_busy requests of one session taken from its channels and not answered yet (they
 * wait for their kernels); past it the session's posts stay in their slots until replies free
 * room, so one session cannot queue the GPU full ahead of the others. 0 = no bound. */
void attnd_channels_set_session_limit(attnd_channels *cs, uint32_t max_busy);
/* Take the requests posted since the last poll (a slot with a request taken and not yet
 * answered is skipped) and call fn for each; a channel whose object shrank is closed here with
 * a warning in the log. Returns the number taken. */
uint32_t attnd_channels_poll(attnd_channels *cs, attnd_channel_req_fn fn, void *arg);
/* Answer a taken request: copy len bytes into the slot's reply area, publish rep_seq, wake the
 * client if it sleeps. INVALID_ARGUMENT (nothing written) when len exceeds rep_bytes;
 * NOT_FOUND when the channel is gone (closed since the request was taken). */
attnd_err attnd_channels_reply(attnd_channels *cs, uint32_t channel, uint32_t slot,
                               const void *bytes, size_t len);
/* rep_bytes of a channel (0 when gone): the caller packs a smaller error reply past it. */
uint32_t attnd_channels_rep_bytes(const attnd_channels *cs, uint32_t channel);
/* Announce polling (1) or sleeping (0) in every open channel's daemon_state. Going to sleep
 * stores ASLEEP, then looks for requests posted meanwhile: returns 1 when there are some (the
 * caller must poll again, and state is POLLING again), 0 when it may sleep. */
int attnd_channels_set_polling(attnd_channels *cs, int polling);
/* Channels open. */
uint32_t attnd_channels_count(const attnd_channels *cs);

#endif
