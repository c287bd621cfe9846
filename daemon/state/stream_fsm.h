/* The stream-ordered step protocol's state machine, pure (no backend, no clock of its own): one
 * per stream channel, fed events, answering with the actions its owner (state/stream.c) takes.
 *
 * The protocol (DESIGN.md "Same-GPU sharing"; issue 16). Per layer two 32-bit flag words, each
 * owned by the side that waits on it, so that side can always release itself:
 *   qkv[l]  daemon memory (exported to the worker by CUDA IPC / shm): the worker's stream writes
 *           1 once layer l's Q/K/V are in place; the daemon's stream waits for 1 and runs the
 *           cache write and the attention, and writes every qkv word back to 0 after the
 *           step's last attention, before that layer's o word (off the per-layer path);
 *   o[l]    worker memory (a registered region): the daemon's stream writes 1 after layer l's
 *           output; the worker's stream waits for 1 before using it (and its last wait of the
 *           step writes every o word back to its reset value: 0, or 1 once it released itself).
 * So each side's resets come before the other side can write the next step's words: a worker's
 * stream may run the next step's signals and waits (a replay launched before this StreamEnd and
 * the next StreamBegin) and nothing of it is erased; the daemon queues that step at its
 * StreamBegin, which follows this step's StreamEnd.
 * Fixed values (set 1 / wait-equal 1 / reset 0) on both sides, so a worker's captured CUDA graph
 * replays the same operations every step; a step's layers are queued on the daemon's stream
 * right after BeginStep's reply (the worker's stream waits for them anyway, so the reply does not
 * wait for ~L x 4 queued operations), its EndStep answers once that stream ran them.
 *
 * Nothing waits forever: a step not done by its deadline (and an abort or a disconnect while its
 * layers are queued) is released: the daemon writes its own qkv words from the host, its stream
 * runs out (what it writes is discarded: the step aborts), and the channel is FAILED, because a
 * worker still alive may write qkv later and such a late 1 would pass a future step's wait
 * unpaired: the worker opens a new channel (new flag words; a graph is captured again). A stream
 * that does not drain in the drain timeout is STUCK: its memory is never reused (the device is
 * reported unhealthy); a late drain still ends it. */
#ifndef ATTND_STATE_STREAM_FSM_H
#define ATTND_STATE_STREAM_FSM_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef enum attnd_sx_state {
    ATTND_SX_IDLE,      /* open, no step */
    ATTND_SX_ARMED,     /* a step's layers are queued; the daemon's stream waits on the worker */
    ATTND_SX_DONE,      /* the stream ran every layer; no EndStep yet */
    ATTND_SX_ENDING,    /* EndStep (commit) came; its reply waits for the stream */
    ATTND_SX_RELEASING, /* the daemon wrote its own flags; waiting for its stream to drain */
    ATTND_SX_FAILED,    /* released and drained: only closing is left */
    ATTND_SX_STUCK,     /* released, not drained in time: quarantined */
    ATTND_SX_CLOSED,    /* gone (the owner frees it) */
} attnd_sx_state;

typedef enum attnd_sx_event {
    ATTND_SX_BEGIN,        /* a step's layers were queued (only from IDLE) */
    ATTND_SX_END,          /* EndStep, commit */
    ATTND_SX_ABORT,        /* EndStep, abort */
    ATTND_SX_DRAINED,      /* the stream has nothing left queued */
    ATTND_SX_FAULT,        /* the stream's work failed (a device error) */
    ATTND_SX_TICK,         /* time passed: deadlines */
    ATTND_SX_DISCONNECT,   /* the worker's connection dropped */
    ATTND_SX_CLOSE,        /* CloseStream */
    ATTND_SX_QUEUE_FAILED, /* queueing the step's layers failed after BeginStep answered */
} attnd_sx_event;

/* Why a step was released (for the EndStep reply and the logs). */
typedef enum attnd_sx_why {
    ATTND_SX_WHY_NONE,
    ATTND_SX_WHY_TIMEOUT,    /* not done by its deadline */
    ATTND_SX_WHY_ABORT,      /* EndStep abort while its layers were queued */
    ATTND_SX_WHY_DISCONNECT, /* connection dropped, or CloseStream, while they were queued */
    ATTND_SX_WHY_FAULT,      /* the stream's work failed, or could not be queued */
} attnd_sx_why;

/* Actions, a bit mask. */
enum {
    ATTND_SX_DO_RELEASE = 1u << 0,    /* write every qkv word from the host */
    ATTND_SX_DO_COMMIT = 1u << 1,     /* commit the step */
    ATTND_SX_DO_ABORT = 1u << 2,      /* abort the step (its writes discarded) */
    ATTND_SX_DO_REPLY = 1u << 3,      /* answer the owed EndStep with reply_code */
    ATTND_SX_DO_FREE = 1u << 4,       /* free the channel (stream, flag memory) */
    ATTND_SX_DO_QUARANTINE = 1u << 5, /* stuck: keep its memory forever, report the device */
};

typedef struct attnd_sx_timeouts {
    uint64_t step_ms;  /* BeginStep to the stream's last layer */
    uint64_t drain_ms; /* release to drained */
} attnd_sx_timeouts;

typedef struct attnd_sx {
    attnd_sx_state state;
    attnd_sx_why why;     /* of the last release */
    uint64_t deadline_ms; /* ARMED, ENDING: the step's; RELEASING: the drain's */
    int end_owed;         /* an EndStep waits for its reply */
    int end_abort;        /* ... and it asked to abort */
    int closing;          /* free once drained */
    attnd_err reply_code; /* with ATTND_SX_DO_REPLY */
} attnd_sx;

void attnd_sx_init(attnd_sx *x);
/* Feed one event at now_ms; returns the ATTND_SX_DO_* actions to take, in bit order. An event
 * a state does not take changes nothing and returns 0 (the owner checks first, see below). */
unsigned attnd_sx_on(attnd_sx *x, attnd_sx_event ev, uint64_t now_ms, const attnd_sx_timeouts *t);
/* May a step begin? OK in IDLE; FAILED_PRECONDITION otherwise, with the reason in err. */
attnd_err attnd_sx_can_begin(const attnd_sx *x, char *err, size_t n);
/* A step is open in the channel (armed, done, ending or being released). */
int attnd_sx_has_step(const attnd_sx *x);
/* The stream still has (or may have) work queued: its query decides. */
int attnd_sx_running(const attnd_sx *x);
const char *attnd_sx_state_name(attnd_sx_state s);
const char *attnd_sx_why_name(attnd_sx_why w);

#endif
