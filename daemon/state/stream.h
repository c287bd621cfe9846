/* Stream channels: the stream-ordered step protocol (state/stream_fsm.h says how it goes) on
 * the backend's streams. A channel belongs to one session and has its own backend stream, its
 * flag words (qkv[layers], daemon memory the worker maps: a CUDA IPC handle on device backends, a
 * POSIX shm object on host ones; o[layers], the worker's, in one of its registered regions), its
 * own split-KV workspace and index arrays (its steps run beside the backend's stream, so they
 * share neither), and at most one open step.
 *
 * BeginStep on a channel plans the step (state/step.h) and queues every layer on the channel's
 * stream: wait qkv[l] == 1, the cache write and the attention, write o[l] = 1 (the last layer
 * writes every qkv[l] = 0 before its o word); then returns. EndStep answers once the stream ran
 * them (now, or later through the reply callback). Deadlines and releases are the state machine's;
 * the executor's poller and the housekeeping tick feed it. Executor thread only. */
#ifndef ATTND_STATE_STREAM_H
#define ATTND_STATE_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "../core/log.h"
#include "../core/shmguard.h"
#include "../obs/metrics.h"
#include "attnd/kernels.h"
#include "session.h"
#include "step.h"
#include "stream_fsm.h"

/* Answers an EndStep whose reply was owed (owed: what attnd_stream_end was given). */
typedef void (*attnd_stream_reply_fn)(void *arg, void *owed, attnd_err code, const char *msg);

typedef struct attnd_stream_chan {
    uint32_t id;
    uint64_t session;
    attnd_session *sess; /* NULL once quarantined (the session may go first) */
    attnd_sx sx;
    attnd_stream *stream;
    uint32_t layers;
    uint32_t *qkv; /* [layers] the daemon's words, waited on by its stream */
    size_t qkv_bytes;
    int32_t guard_id;  /* host backends: qkv's shm mapping in the SIGBUS guard, -1 none */
    char shm_name[64]; /* host backends: the object the worker maps ("" once unlinked) */
    uint8_t ipc_handle[ATTND_IPC_HANDLE_BYTES]; /* device backends: qkv's */
    uint32_t *o;                                /* [layers] the worker's words, in its region */
    uint32_t o_region;                          /* that region's id */
    void *ws3d;                                 /* the channel's split-KV workspace */
    void *index_dev; /* device backends: the open step's index arrays, and their staging */
    void *index_host;
    size_t index_cap;
    attnd_step *step;           /* the open step, NULL when none */
    attnd_attend_io *arm_io;    /* its tensors while layers remain to queue (NULL: all queued) */
    uint32_t arm_nio, arm_next; /* arm_io's entries (1: every layer's), the next layer to queue */
    uint64_t step_id;           /* the open step's id, or the last one released */
    void *owed;                 /* the owed EndStep's reply (the callback's), NULL none */
    struct attnd_stream_chan *next;
} attnd_stream_chan;

typedef struct attnd_streams {
    attnd_stream_chan *head;
    uint32_t count, max; /* open channels; at most max at once (0: streams off) */
    uint32_t next_id;
    attnd_steps *steps;
    attnd_log *log;
    attnd_shmguard *guard; /* watches host backends' flag mappings; NULL = none */
    attnd_sx_timeouts t;
    attnd_stream_reply_fn reply;
    void *reply_arg;
    uint32_t stuck;         /* channels quarantined since start */
    attnd_metrics *metrics; /* releases counted; NULL = not counted */
} attnd_streams;

/* max channels at once (0 = off), step_ms: a step's deadline, drain_ms: a release's. */
void attnd_streams_init(attnd_streams *ss, attnd_steps *steps, attnd_log *lg, uint32_t max,
                        uint64_t step_ms, uint64_t drain_ms);
void attnd_streams_set_reply(attnd_streams *ss, attnd_stream_reply_fn fn, void *arg);
/* Release every channel, wait for each stream to drain (at most drain_ms each), answer owed
 * EndSteps, free (shutdown). */
void attnd_streams_fini(attnd_streams *ss);

/* A channel of session s with the worker's flag words o (I32 [num_layers] in one of s's regions,
 * device memory on a device backend). UNAVAILABLE (streams off or all in use), UNSUPPORTED (the
 * backend has no streams), NO_MEMORY, INTERNAL. */
attnd_err attnd_stream_open(attnd_streams *ss, attnd_session *s, uint32_t *o, uint32_t o_region,
                            attnd_stream_chan **out, char *err, size_t n);
/* Channel id of session: NOT_FOUND. */
attnd_err attnd_stream_find(attnd_streams *ss, uint64_t session, uint32_t id,
                            attnd_stream_chan **out, char *err, size_t n);
/* Begin a step on ch over seqs[n]: io[0] for every layer (nio 1), or io[l] for layer l (nio =
 * num_layers); their tensors stay in place until the step ends. The layers are queued after the
 * reply (attnd_streams_poll, a few per executor turn; at once before anything else the channel
 * is asked).
 * FAILED_PRECONDITION (a step open, the channel failed), attnd_step_begin's codes, INTERNAL. */
attnd_err attnd_stream_begin(attnd_streams *ss, attnd_stream_chan *ch, const attnd_step_req *seqs,
                             uint32_t n, uint32_t max_step_tokens, const attnd_attend_io *io,
                             uint32_t nio, attnd_step **out, char *err, size_t en);
/* EndStep of `step` on ch (commit, or abort). *owed_taken 0: answered now (the code and err);
 * 1: the reply waits, and the callback gets `owed` later. NOT_FOUND (another step),
 * FAILED_PRECONDITION (an EndStep already waits). */
attnd_err attnd_stream_end(attnd_streams *ss, attnd_stream_chan *ch, uint64_t step, int abort,
                           void *owed, int *owed_taken, char *err, size_t n);
/* CloseStream: a step still queued is released first (freed once its stream drained). */
void attnd_stream_close(attnd_streams *ss, attnd_stream_chan *ch);
/* Session `session` is gone: release its channels' queued steps and wait for their streams (at
 * most drain_ms each), so that nothing runs on its regions once they are unmapped; free them. */
void attnd_streams_drop_session(attnd_streams *ss, uint64_t session);
/* 1 while a channel of session may still run kernels on its regions (any region then), or
 * holds its flag words in region: it must stay registered. */
int attnd_streams_holds_region(const attnd_streams *ss, uint64_t session, uint32_t region);
/* Executor poller: streams whose EndStep waits or that are being released; returns how many
 * changed state, *hot = 1 while any still needs polling. */
uint32_t attnd_streams_poll(attnd_streams *ss, int *hot);
/* Housekeeping tick: every running channel's stream and deadline. */
void attnd_streams_tick(attnd_streams *ss);

#endif
