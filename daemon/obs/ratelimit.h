/* Rate limiting for repeated log lines: one token bucket per key (e.g. "decode_error" or
 * "bad_ref:attend.q"), so a client that sends garbage in a loop costs one line per interval
 * instead of one per message, while a different error still gets through at once.
 *
 * The table has a fixed number of keys; when it is full the least recently used key is
 * recycled (its pending suppressed count is dropped from the per-line report but stays in
 * attnd_ratelimit_suppressed_total, which the daemon exports as a metric). Thread-safe (one mutex,
 * held for a few dozen instructions); time is passed in so tests need not sleep.
 *
 *     uint64_t dropped;
 *     if (attnd_ratelimit_allow(&rl, "decode_error", attnd_clock_ns(), &dropped))
 *         ATTND_LOG(WARN, "event=decode_error peer=%u suppressed=%llu", ...);
 */
#ifndef ATTND_OBS_RATELIMIT_H
#define ATTND_OBS_RATELIMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define ATTND_RATELIMIT_KEYS 64
#define ATTND_RATELIMIT_KEY_MAX 48 /* longer keys are compared on this prefix */

typedef struct attnd_ratelimit_slot {
    char key[ATTND_RATELIMIT_KEY_MAX];
    uint64_t hash;       /* 0 = empty */
    double tokens;       /* available events */
    uint64_t last_ns;    /* last refill */
    uint64_t suppressed; /* events refused since the last allowed one */
} attnd_ratelimit_slot;

typedef struct attnd_ratelimit {
    pthread_mutex_t mu;
    double rate;  /* tokens per second */
    double burst; /* bucket size */
    uint64_t suppressed_total;
    attnd_ratelimit_slot slots[ATTND_RATELIMIT_KEYS];
} attnd_ratelimit;

/* Each key may log `burst` events at once, then `per_second` on average. per_second <= 0
 * disables limiting (every event allowed); burst < 1 reads as 1. */
void attnd_ratelimit_init(attnd_ratelimit *rl, double per_second, double burst);
void attnd_ratelimit_fini(attnd_ratelimit *rl);

/* Whether an event for `key` at time now_ns (monotonic) may be logged. When it may,
 * *suppressed (if not NULL) is the number of events of that key refused since the last allowed
 * one, to be printed with it; when it may not, *suppressed is 0. */
bool attnd_ratelimit_allow(attnd_ratelimit *rl, const char *key, uint64_t now_ns,
                           uint64_t *suppressed);

/* Events refused since init, all keys. */
uint64_t attnd_ratelimit_suppressed_total(attnd_ratelimit *rl);

#endif
