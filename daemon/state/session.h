/* Sessions: one per Hello, bound to the NNG pipe (connection) it arrived on. A session owns its
 * regions; the cache keys its sequences by the session id, so no other session can name them.
 * A request naming a session from another connection is PERMISSION_DENIED.
 *
 * When the connection drops the session's regions are unmapped (CUDA IPC ones closed) at once and
 * the session is kept (holding its sequences) until the reclaim timeout; the caller then releases
 * them. Executor thread only. */
#ifndef ATTND_STATE_SESSION_H
#define ATTND_STATE_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"
#include "handles.h"

typedef struct attnd_session {
    uint64_t id;
    uint32_t pipe; /* nng_pipe_id of its connection */
    char name[64]; /* client_name from Hello */
    attnd_region *regions;
    uint32_t nregions, cap;
    uint32_t nseqs;  /* kept by the caller */
    uint32_t nsteps; /* open steps, kept by the caller */
    int connected;
    uint64_t gone_ms; /* when the connection dropped */
    struct attnd_session *next;
} attnd_session;

typedef struct attnd_sessions {
    attnd_session *head;
    uint32_t count;
    uint64_t next_id;
} attnd_sessions;

void attnd_sessions_init(attnd_sessions *ss);
/* Unmap and free every session (sequences are the caller's to release first). */
void attnd_sessions_fini(attnd_sessions *ss);

/* New session on pipe. UNAVAILABLE when max_sessions are open, or max_per_pipe on this pipe
 * (err says which), NO_MEMORY. */
attnd_err attnd_session_open(attnd_sessions *ss, uint32_t pipe, const char *name,
                             uint32_t max_sessions, uint32_t max_per_pipe, attnd_session **out,
                             char *err, size_t n);
/* The session id, checked against the pipe the request came on: NOT_FOUND (unknown id, or one
 * whose connection is gone), PERMISSION_DENIED (another connection's). */
attnd_err attnd_session_get(attnd_sessions *ss, uint64_t id, uint32_t pipe, attnd_session **out,
                            char *err, size_t n);
/* Unlink and free (regions unmapped). */
void attnd_session_close(attnd_sessions *ss, attnd_session *s);

/* Register a HOST_SHM region (watched by guard, which may be NULL): INVALID_ARGUMENT (id 0),
 * ALREADY_EXISTS, UNAVAILABLE (at max_regions), and attnd_handles_map_shm's codes. */
attnd_err attnd_session_region_add(attnd_session *s, uint32_t id, attnd_shmguard *guard,
                                   const char *shm_name, uint64_t size, uint32_t max_regions,
                                   char *err, size_t n);
/* Register a CUDA_IPC region (opened once here, closed when it is unregistered or the
 * connection drops): the checks above and attnd_handles_open_ipc's. */
attnd_err attnd_session_region_add_ipc(attnd_session *s, uint32_t id, attnd_backend *be,
                                       const void *handle, size_t handle_len, uint64_t size,
                                       uint32_t max_regions, char *err, size_t n);
/* NOT_FOUND when the id is not registered. */
attnd_err attnd_session_region_remove(attnd_session *s, uint32_t id, char *err, size_t n);

/* Mark the sessions of pipe disconnected at now_ms and unmap their regions; calls fn for each. */
void attnd_sessions_disconnect(attnd_sessions *ss, uint32_t pipe, uint64_t now_ms,
                               void (*fn)(attnd_session *, void *), void *arg);
/* First disconnected session whose connection dropped at least timeout_ms before now_ms, or
 * that holds no sequences (nothing to keep for the reclaim timeout). */
attnd_session *attnd_sessions_expired(const attnd_sessions *ss, uint64_t now_ms,
                                      uint64_t timeout_ms);

#endif
