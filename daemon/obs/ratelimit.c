#include "ratelimit.h"

#include <string.h>

void attnd_ratelimit_init(attnd_ratelimit *rl, double per_second, double burst)
{
    memset(rl, 0, sizeof(*rl));
    pthread_mutex_init(&rl->mu, NULL);
    rl->rate = per_second;
    rl->burst = burst < 1.0 ? 1.0 : burst;
}

void attnd_ratelimit_fini(attnd_ratelimit *rl)
{
    pthread_mutex_destroy(&rl->mu);
}

/* FNV-1a over the key's first ATTND_RATELIMIT_KEY_MAX - 1 bytes; never 0 (0 marks empty). */
static uint64_t key_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; key[i] != '\0' && i < ATTND_RATELIMIT_KEY_MAX - 1; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h == 0 ? 1 : h;
}

static bool slot_matches(const attnd_ratelimit_slot *s, uint64_t h, const char *key)
{
    return s->hash == h && strncmp(s->key, key, ATTND_RATELIMIT_KEY_MAX - 1) == 0;
}

/* The slot for key: its own, else an empty one, else the least recently used one (recycled;
 * its pending count is dropped, though attnd_ratelimit_suppressed_total still has it). */
static attnd_ratelimit_slot *slot_find(attnd_ratelimit *rl, const char *key, uint64_t now_ns)
{
    uint64_t h = key_hash(key);
    attnd_ratelimit_slot *empty = NULL, *lru = NULL;
    for (int i = 0; i < ATTND_RATELIMIT_KEYS; i++) {
        attnd_ratelimit_slot *s = &rl->slots[i];
        if (slot_matches(s, h, key)) return s;
        if (s->hash == 0) {
            if (empty == NULL) empty = s;
        } else if (lru == NULL || s->last_ns < lru->last_ns) {
            lru = s;
        }
    }
    attnd_ratelimit_slot *s = empty != NULL ? empty : lru;
    memset(s, 0, sizeof(*s));
    strncpy(s->key, key, ATTND_RATELIMIT_KEY_MAX - 1);
    s->hash = h;
    s->tokens = rl->burst;
    s->last_ns = now_ns;
    return s;
}

static void slot_refill(attnd_ratelimit *rl, attnd_ratelimit_slot *s, uint64_t now_ns)
{
    if (now_ns <= s->last_ns) return;
    s->tokens += (double)(now_ns - s->last_ns) / 1e9 * rl->rate;
    if (s->tokens > rl->burst) s->tokens = rl->burst;
    s->last_ns = now_ns;
}

bool attnd_ratelimit_allow(attnd_ratelimit *rl, const char *key, uint64_t now_ns,
                           uint64_t *suppressed)
{
    uint64_t dummy;
    bool ok;
    if (suppressed == NULL) suppressed = &dummy;
    *suppressed = 0;
    if (rl->rate <= 0) return true;
    pthread_mutex_lock(&rl->mu);
    attnd_ratelimit_slot *s = slot_find(rl, key, now_ns);
    slot_refill(rl, s, now_ns);
    ok = s->tokens >= 1.0;
    if (ok) {
        s->tokens -= 1.0;
        *suppressed = s->suppressed;
        s->suppressed = 0;
    } else {
        s->suppressed++;
        rl->suppressed_total++;
    }
    pthread_mutex_unlock(&rl->mu);
    return ok;
}

uint64_t attnd_ratelimit_suppressed_total(attnd_ratelimit *rl)
{
    pthread_mutex_lock(&rl->mu);
    uint64_t n = rl->suppressed_total;
    pthread_mutex_unlock(&rl->mu);
    return n;
}
