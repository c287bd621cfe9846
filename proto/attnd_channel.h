/* attnd shared-memory channel, version 1: the layout of the POSIX shm object that a client
 * registers with OpenChannel (proto/attnd.proto), shared by the daemon and the client library.
 *
 * Why: a REQ/REP round trip over ipc:// hands each message between several threads on both
 * sides, and every hand-off to a sleeping thread costs a wake-up. Through a channel the client
 * writes a packed Request into a slot and bumps req_seq; the daemon's executor, which polls its
 * channels while it has work or was busy in the last spin_us, reads it, serves it and writes
 * the packed Reply back, then bumps rep_seq, which the client spins on (then sleeps on it with
 * FUTEX_WAIT, after setting client_waiting, so that the daemon FUTEX_WAKEs it).
 *
 * Object: [header: 64 B][slot headers: nslots x 64 B][slot 0: req_bytes + rep_bytes]...
 * Every integer is little-endian host order (same host), the atomics are plain lock-free
 * 32-bit words. A slot carries one request at a time: the client posts n = req_seq + 1 (never
 * 0; it wraps) only when rep_seq == req_seq. The daemon takes a request when req_seq differs
 * from the last it took, copies it out first (the client could still write) and validates it
 * like a socket message; a client that posts again before the reply (breaking the rule) gets
 * only its latest post answered. Sleep protocol (Dekker, both sides seq_cst): before the daemon
 * sleeps it stores daemon_state = ASLEEP, then polls once more; a client that posts, then
 * reads ASLEEP sends WakeChannel on the socket (without it the post waits for the daemon's next
 * wake-up: a socket request or its 100 ms housekeeping tick). */
#ifndef ATTND_PROTO_CHANNEL_H
#define ATTND_PROTO_CHANNEL_H

#include <stdatomic.h>
#include <stdint.h>

#define ATTND_CHANNEL_MAGIC 0x314c4e4843444e41ull /* "ANDCHNL1" read little-endian */
#define ATTND_CHANNEL_VERSION 1u
#define ATTND_CHANNEL_MAX_SLOTS 64u
#define ATTND_CHANNEL_ALIGN 64u           /* req_bytes and rep_bytes are multiples */
#define ATTND_CHANNEL_MIN_AREA 256u       /* smallest req_bytes / rep_bytes */
#define ATTND_CHANNEL_MAX_AREA (1u << 20) /* largest req_bytes / rep_bytes */

enum {
    ATTND_CHANNEL_DAEMON_ASLEEP = 0,  /* not polling: post, then send WakeChannel */
    ATTND_CHANNEL_DAEMON_POLLING = 1, /* a posted request is seen within microseconds */
    ATTND_CHANNEL_DAEMON_CLOSED = 2,  /* the daemon dropped the channel (closed or broken) */
};

typedef struct attnd_channel_header {
    uint64_t magic;   /* ATTND_CHANNEL_MAGIC */
    uint32_t version; /* ATTND_CHANNEL_VERSION */
    uint32_t nslots;  /* 1..ATTND_CHANNEL_MAX_SLOTS */
    uint32_t req_bytes;
    uint32_t rep_bytes;
    _Atomic uint32_t daemon_state; /* written by the daemon only */
    uint32_t reserved[9];
} attnd_channel_header;

typedef struct attnd_channel_slot {
    _Atomic uint32_t req_seq;        /* client: number of the posted request */
    _Atomic uint32_t rep_seq;        /* daemon: number of the last answered one; futex word */
    _Atomic uint32_t client_waiting; /* client: 1 while it sleeps on rep_seq */
    uint32_t req_len;                /* client: bytes of the posted request */
    uint32_t rep_len;                /* daemon: bytes of the reply */
    uint32_t reserved[11];
} attnd_channel_slot;

_Static_assert(sizeof(attnd_channel_header) == 64, "channel header is 64 bytes");
_Static_assert(sizeof(attnd_channel_slot) == 64, "channel slot header is 64 bytes");

/* Bytes of an object with this layout (0 when the numbers are out of bounds). */
static inline uint64_t attnd_channel_size(uint32_t nslots, uint32_t req_bytes, uint32_t rep_bytes)
{
    if (nslots < 1 || nslots > ATTND_CHANNEL_MAX_SLOTS || req_bytes % ATTND_CHANNEL_ALIGN ||
        rep_bytes % ATTND_CHANNEL_ALIGN || req_bytes < ATTND_CHANNEL_MIN_AREA ||
        rep_bytes < ATTND_CHANNEL_MIN_AREA || req_bytes > ATTND_CHANNEL_MAX_AREA ||
        rep_bytes > ATTND_CHANNEL_MAX_AREA)
        return 0;
    return 64u + (uint64_t)nslots * (64u + (uint64_t)req_bytes + rep_bytes);
}

static inline attnd_channel_slot *attnd_channel_slot_at(void *base, uint32_t i)
{
    return (attnd_channel_slot *)((char *)base + 64u + (uint64_t)i * 64u);
}

/* Slot i's request area; its reply area follows it. */
static inline uint8_t *attnd_channel_req_area(void *base, uint32_t nslots, uint32_t req_bytes,
                                              uint32_t rep_bytes, uint32_t i)
{
    return (uint8_t *)base + 64u + (uint64_t)nslots * 64u +
           (uint64_t)i * ((uint64_t)req_bytes + rep_bytes);
}

static inline uint8_t *attnd_channel_rep_area(void *base, uint32_t nslots, uint32_t req_bytes,
                                              uint32_t rep_bytes, uint32_t i)
{
    return attnd_channel_req_area(base, nslots, req_bytes, rep_bytes, i) + req_bytes;
}

#endif
