#include "channel.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "attnd_channel.h"
#include "../state/handles.h"

/* One open channel; id 0 marks a free entry. */
typedef struct chan {
    uint32_t id;
    uint32_t pipe;
    uint64_t session;
    int fd;
    int32_t guard; /* shmguard handle, -1 when unguarded */
    void *base;
    size_t size;
    uint32_t nslots, req_bytes, rep_bytes;
    uint64_t busy;                           /* slots with a request taken and not answered */
    uint32_t taken[ATTND_CHANNEL_MAX_SLOTS]; /* req_seq of the last request taken per slot */
    uint8_t *copy;                           /* req_bytes: the request being delivered */
    dev_t dev;                               /* the object's identity: one channel each */
    ino_t ino;
    char name[256];
} chan;

struct attnd_channels {
    attnd_shmguard *guard;
    attnd_log *lg;
    uint32_t max, count;
    uint32_t next_id;
    uint32_t session_busy_max; /* requests a session may have taken and unanswered; 0 = any */
    chan *chans;               /* max entries */
};

static attnd_channel_header *chan_header(const chan *ch)
{
    return (attnd_channel_header *)ch->base;
}

static attnd_channel_slot *chan_slot(const chan *ch, uint32_t i)
{
    return attnd_channel_slot_at(ch->base, i);
}

static int chan_faulted(const attnd_channels *cs, const chan *ch)
{
    return ch->guard >= 0 && attnd_shmguard_faulted(cs->guard, ch->guard);
}

static chan *chan_find(const attnd_channels *cs, uint32_t id)
{
    if (id == 0) return NULL;
    for (uint32_t i = 0; i < cs->max; i++)
        if (cs->chans[i].id == id) return &cs->chans[i];
    return NULL;
}

/* ---------------------------------------------------------------- alloc / free */

attnd_err attnd_channels_alloc(attnd_channels **out, attnd_shmguard *guard, uint32_t max,
                               attnd_log *lg)
{
    attnd_channels *cs = calloc(1, sizeof *cs);
    *out = NULL;
    if (cs == NULL) return ATTND_ERR_NO_MEMORY;
    if (max > 0 && (cs->chans = calloc(max, sizeof *cs->chans)) == NULL) {
        free(cs);
        return ATTND_ERR_NO_MEMORY;
    }
    cs->guard = guard;
    cs->lg = lg;
    cs->max = max;
    cs->next_id = 1;
    *out = cs;
    return ATTND_ERR_OK;
}

/* Unmap and forget; the client learns it from daemon_state unless its object is gone. */
static void chan_close(attnd_channels *cs, chan *ch)
{
    if (!chan_faulted(cs, ch))
        atomic_store(&chan_header(ch)->daemon_state, ATTND_CHANNEL_DAEMON_CLOSED);
    if (ch->guard >= 0) attnd_shmguard_remove(cs->guard, ch->guard);
    munmap(ch->base, ch->size);
    close(ch->fd);
    free(ch->copy);
    memset(ch, 0, sizeof *ch);
    cs->count--;
}

void attnd_channels_free(attnd_channels *cs)
{
    if (cs == NULL) return;
    for (uint32_t i = 0; i < cs->max; i++)
        if (cs->chans[i].id != 0) chan_close(cs, &cs->chans[i]);
    free(cs->chans);
    free(cs);
}

/* ---------------------------------------------------------------- open */

static attnd_err check_area(const char *field, uint32_t v, char *err, size_t n)
{
    if (v % ATTND_CHANNEL_ALIGN != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "header.%s: %u is not a multiple of %u", field, v, ATTND_CHANNEL_ALIGN);
    if (v < ATTND_CHANNEL_MIN_AREA || v > ATTND_CHANNEL_MAX_AREA)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "header.%s: %u out of %u..%u", field,
                          v, ATTND_CHANNEL_MIN_AREA, ATTND_CHANNEL_MAX_AREA);
    return ATTND_ERR_OK;
}

/* The header (read with pread: a shrinking object cannot fault here) against size. */
static attnd_err check_header(const attnd_channel_header *h, uint64_t size, char *err, size_t n)
{
    attnd_err rv;
    uint64_t need;
    if (h->magic != ATTND_CHANNEL_MAGIC)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "header.magic: 0x%016llx, expected 0x%016llx",
                          (unsigned long long)h->magic, (unsigned long long)ATTND_CHANNEL_MAGIC);
    if (h->version != ATTND_CHANNEL_VERSION)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "header.version: %u, expected %u",
                          h->version, ATTND_CHANNEL_VERSION);
    if (h->nslots < 1 || h->nslots > ATTND_CHANNEL_MAX_SLOTS)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "header.nslots: %u out of 1..%u",
                          h->nslots, ATTND_CHANNEL_MAX_SLOTS);
    if ((rv = check_area("req_bytes", h->req_bytes, err, n)) != ATTND_ERR_OK ||
        (rv = check_area("rep_bytes", h->rep_bytes, err, n)) != ATTND_ERR_OK)
        return rv;
    need = attnd_channel_size(h->nslots, h->req_bytes, h->rep_bytes);
    if (size != need)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "size: %llu but the header's layout needs %llu", (unsigned long long)size,
                          (unsigned long long)need);
    return ATTND_ERR_OK;
}

/* Read the header from fd and check it and the object's size against size. */
static attnd_err read_header(int fd, const char *name, uint64_t size, attnd_channel_header *h,
                             char *err, size_t n)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return attnd_handles_shm_errno(errno, name, err, n);
    if ((uint64_t)st.st_size != size)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "size: %llu but the object has %lld bytes", (unsigned long long)size,
                          (long long)st.st_size);
    if (size < sizeof *h)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "size: %llu, less than the %zu-byte header", (unsigned long long)size,
                          sizeof *h);
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "shm_name: %s: cannot read the header", name);
    return check_header(h, size, err, n);
}

/* A free entry, or NULL. */
static chan *chan_free_entry(attnd_channels *cs)
{
    for (uint32_t i = 0; i < cs->max; i++)
        if (cs->chans[i].id == 0) return &cs->chans[i];
    return NULL;
}

/* Next id: small, positive, not in use (ids only come back after 2^32 opens). */
static uint32_t chan_next_id(attnd_channels *cs)
{
    uint32_t id;
    do {
        id = cs->next_id++;
    } while (id == 0 || chan_find(cs, id) != NULL);
    return id;
}

/* Every slot idle (req_seq == rep_seq); remembers the seqs as taken. The mapping is guarded. */
static attnd_err check_slots(chan *ch, char *err, size_t n)
{
    for (uint32_t i = 0; i < ch->nslots; i++) {
        attnd_channel_slot *s = chan_slot(ch, i);
        uint32_t req = atomic_load_explicit(&s->req_seq, memory_order_acquire);
        uint32_t rep = atomic_load_explicit(&s->rep_seq, memory_order_acquire);
        if (req != rep)
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "slot[%u].req_seq: %u but rep_seq is %u (a request already posted)",
                              i, req, rep);
        ch->taken[i] = req;
    }
    return ATTND_ERR_OK;
}

/* mmap the checked object into ch and watch it. */
static attnd_err chan_map(attnd_channels *cs, chan *ch, const attnd_channel_header *h, char *err,
                          size_t n)
{
    ch->nslots = h->nslots;
    ch->req_bytes = h->req_bytes;
    ch->rep_bytes = h->rep_bytes;
    ch->guard = -1;
    ch->base = mmap(NULL, ch->size, PROT_READ | PROT_WRITE, MAP_SHARED, ch->fd, 0);
    if (ch->base == MAP_FAILED) {
        ch->base = NULL;
        return attnd_handles_shm_errno(errno, ch->name, err, n);
    }
    if (cs->guard != NULL && (ch->guard = attnd_shmguard_add(cs->guard, ch->base, ch->size)) < 0)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "channels: the SIGBUS guard is full");
    if ((ch->copy = malloc(ch->req_bytes)) == NULL)
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "channels: no memory for %u bytes",
                          ch->req_bytes);
    return ATTND_ERR_OK;
}

static void chan_unmap(attnd_channels *cs, chan *ch)
{
    if (ch->guard >= 0) attnd_shmguard_remove(cs->guard, ch->guard);
    if (ch->base != NULL) munmap(ch->base, ch->size);
    if (ch->fd >= 0) close(ch->fd);
    free(ch->copy);
    memset(ch, 0, sizeof *ch);
}

/* Record which object ch->fd is and refuse one that is already a channel (its posts would be
 * taken twice, and answered in another channel's name). */
static attnd_err chan_identity(const attnd_channels *cs, chan *ch, char *err, size_t n)
{
    struct stat st;
    if (fstat(ch->fd, &st) != 0) return attnd_handles_shm_errno(errno, ch->name, err, n);
    for (uint32_t i = 0; i < cs->max; i++) {
        const chan *o = &cs->chans[i];
        if (o->id != 0 && o->dev == st.st_dev && o->ino == st.st_ino)
            return attnd_errf(err, n, ATTND_ERR_ALREADY_EXISTS,
                              "shm_name: %s is channel %u already", ch->name, o->id);
    }
    ch->dev = st.st_dev;
    ch->ino = st.st_ino;
    return ATTND_ERR_OK;
}

/* Map and check ch (name, size, fd -1 set); on failure everything is undone. */
static attnd_err chan_setup(attnd_channels *cs, chan *ch, char *err, size_t n)
{
    attnd_channel_header h;
    attnd_err rv;
    if ((ch->fd = shm_open(ch->name, O_RDWR | O_CLOEXEC, 0)) < 0) {
        rv = attnd_handles_shm_errno(errno, ch->name, err, n);
        goto fail;
    }
    if ((rv = chan_identity(cs, ch, err, n)) != ATTND_ERR_OK) goto fail;
    if ((rv = read_header(ch->fd, ch->name, ch->size, &h, err, n)) != ATTND_ERR_OK ||
        (rv = chan_map(cs, ch, &h, err, n)) != ATTND_ERR_OK ||
        (rv = check_slots(ch, err, n)) != ATTND_ERR_OK)
        goto fail;
    if (chan_faulted(cs, ch)) {
        rv = attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "shm_name: %s: the object shrank",
                        ch->name);
        goto fail;
    }
    return ATTND_ERR_OK;
fail:
    chan_unmap(cs, ch);
    return rv;
}

static uint32_t chan_session_count(const attnd_channels *cs, uint64_t session)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < cs->max; i++)
        k += cs->chans[i].id != 0 && cs->chans[i].session == session;
    return k;
}

attnd_err attnd_channels_open(attnd_channels *cs, uint64_t session, uint32_t pipe,
                              const char *shm_name, uint64_t size, uint32_t *id, char *err,
                              size_t n)
{
    chan *ch;
    attnd_err rv;
    if (cs->max == 0)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "channels: off (server.channels = 0)");
    if ((rv = attnd_handles_shm_name(shm_name, err, n)) != ATTND_ERR_OK) return rv;
    if (chan_session_count(cs, session) >= ATTND_CHANNELS_PER_SESSION)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "channels: the session has %u open, the most",
                          ATTND_CHANNELS_PER_SESSION);
    if ((ch = chan_free_entry(cs)) == NULL)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "channels: all %u in use (server.channels)", cs->max);
    ch->fd = -1;
    ch->guard = -1;
    ch->size = (size_t)size;
    snprintf(ch->name, sizeof ch->name, "%s", shm_name);
    if ((rv = chan_setup(cs, ch, err, n)) != ATTND_ERR_OK) return rv;
    ch->id = chan_next_id(cs);
    ch->session = session;
    ch->pipe = pipe;
    cs->count++;
    atomic_store(&chan_header(ch)->daemon_state, ATTND_CHANNEL_DAEMON_POLLING);
    ATTND_LOG(cs->lg, ATTND_LOG_INFO,
              "event=channel_open channel=%u session=%llu slots=%u req_bytes=%u rep_bytes=%u",
              ch->id, (unsigned long long)session, ch->nslots, ch->req_bytes, ch->rep_bytes);
    *id = ch->id;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- close */

attnd_err attnd_channels_close(attnd_channels *cs, uint64_t session, uint32_t id, char *err,
                               size_t n)
{
    attnd_err rv;
    if ((rv = attnd_channels_check(cs, session, id, err, n)) != ATTND_ERR_OK) return rv;
    chan_close(cs, chan_find(cs, id));
    return ATTND_ERR_OK;
}

void attnd_channels_close_session(attnd_channels *cs, uint64_t session)
{
    for (uint32_t i = 0; i < cs->max; i++)
        if (cs->chans[i].id != 0 && cs->chans[i].session == session) chan_close(cs, &cs->chans[i]);
}

attnd_err attnd_channels_check(const attnd_channels *cs, uint64_t session, uint32_t id, char *err,
                               size_t n)
{
    const chan *ch = chan_find(cs, id);
    if (ch == NULL || ch->session != session)
        return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "channel: %u not open in this session", id);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- poll */

static void chan_broken(attnd_channels *cs, chan *ch, const char *reason)
{
    ATTND_LOG(cs->lg, ATTND_LOG_WARN, "event=channel_broken channel=%u session=%llu reason=%s",
              ch->id, (unsigned long long)ch->session, reason);
    chan_close(cs, ch);
}

/* Slot i's request when one was posted since the last taken: copied out, the slot busy.
 * Returns 1 with *req filled, 0 when there is none, -1 when the object shrank meanwhile. */
static int slot_take(attnd_channels *cs, chan *ch, uint32_t i, attnd_channel_req *req)
{
    attnd_channel_slot *s = chan_slot(ch, i);
    uint32_t seq = atomic_load_explicit(&s->req_seq, memory_order_acquire);
    uint32_t len;
    if (seq == ch->taken[i]) return 0;
    /* the client may still scribble on the object: read req_len once, copy, then trust only the
     * copy */
    len = *(volatile uint32_t *)&s->req_len;
    uint8_t *dst = ch->copy; /* fn decodes it before the next slot is taken */
    memset(req, 0, sizeof *req);
    req->channel = ch->id;
    req->slot = i;
    req->session = ch->session;
    req->pipe = ch->pipe;
    req->len = len;
    if (len != 0 && len <= ch->req_bytes) {
        memcpy(dst, attnd_channel_req_area(ch->base, ch->nslots, ch->req_bytes, ch->rep_bytes, i),
               len);
        req->bytes = dst;
    }
    if (chan_faulted(cs, ch)) return -1;
    ch->taken[i] = seq;
    ch->busy |= 1ull << i;
    return 1;
}

/* Take and deliver one channel's requests, closing it when its object shrank (fn may close it
 * too). Returns how many were taken. */
/* Requests taken from session's channels and not answered yet. */
static uint32_t session_busy(const attnd_channels *cs, uint64_t session)
{
    uint32_t n = 0;
    for (uint32_t i = 0, seen = 0; i < cs->max && seen < cs->count; i++)
        if (cs->chans[i].id != 0) {
            seen++;
            if (cs->chans[i].session == session)
                n += (uint32_t)__builtin_popcountll(cs->chans[i].busy);
        }
    return n;
}

static uint32_t chan_poll(attnd_channels *cs, chan *ch, attnd_channel_req_fn fn, void *arg)
{
    attnd_channel_req req;
    uint32_t id = ch->id, taken = 0;
    uint32_t busy = cs->session_busy_max ? session_busy(cs, ch->session) : 0;
    if (chan_faulted(cs, ch)) {
        chan_broken(cs, ch, "object_shrank");
        return 0;
    }
    for (uint32_t i = 0; i < ch->nslots; i++) {
        if (ch->busy & (1ull << i)) continue;
        /* a session at its bound leaves its posts waiting in their slots: others go first */
        if (cs->session_busy_max && busy >= cs->session_busy_max) break;
        int got = slot_take(cs, ch, i, &req);
        if (got < 0) {
            chan_broken(cs, ch, "object_shrank");
            return taken;
        }
        if (got == 0) continue;
        taken++;
        busy++;
        fn(arg, &req);
        if (ch->id != id) return taken; /* fn closed it */
    }
    /* a shrink noticed only by this scan's reads */
    if (chan_faulted(cs, ch)) chan_broken(cs, ch, "object_shrank");
    return taken;
}

void attnd_channels_set_session_limit(attnd_channels *cs, uint32_t max_busy)
{
    cs->session_busy_max = max_busy;
}

uint32_t attnd_channels_poll(attnd_channels *cs, attnd_channel_req_fn fn, void *arg)
{
    uint32_t taken = 0, seen = 0, open = cs->count;
    /* every executor turn comes here: stop at the last open channel, not at server.channels */
    for (uint32_t i = 0; i < cs->max && seen < open; i++)
        if (cs->chans[i].id != 0) {
            seen++;
            taken += chan_poll(cs, &cs->chans[i], fn, arg);
        }
    return taken;
}

/* ---------------------------------------------------------------- reply */

static void futex_wake(_Atomic uint32_t *word)
{
    /* shared (not FUTEX_PRIVATE): the waiter is another process mapping the same object */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

attnd_err attnd_channels_reply(attnd_channels *cs, uint32_t channel, uint32_t slot,
                               const void *bytes, size_t len)
{
    chan *ch = chan_find(cs, channel);
    attnd_channel_slot *s;
    if (ch == NULL || slot >= ch->nslots || !(ch->busy & (1ull << slot)))
        return ATTND_ERR_NOT_FOUND;
    if (len > ch->rep_bytes) return ATTND_ERR_INVALID_ARGUMENT;
    if (chan_faulted(cs, ch)) {
        chan_broken(cs, ch, "object_shrank");
        return ATTND_ERR_NOT_FOUND;
    }
    s = chan_slot(ch, slot);
    memcpy(attnd_channel_rep_area(ch->base, ch->nslots, ch->req_bytes, ch->rep_bytes, slot), bytes,
           len);
    s->rep_len = (uint32_t)len;
    atomic_store_explicit(&s->rep_seq, ch->taken[slot], memory_order_release);
    ch->busy &= ~(1ull << slot);
    /* Dekker with the client's "client_waiting = 1, then re-read rep_seq": one of us sees the
     * other's store */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&s->client_waiting, memory_order_relaxed)) futex_wake(&s->rep_seq);
    return ATTND_ERR_OK;
}

uint32_t attnd_channels_rep_bytes(const attnd_channels *cs, uint32_t channel)
{
    const chan *ch = chan_find(cs, channel);
    return ch != NULL ? ch->rep_bytes : 0;
}

/* ---------------------------------------------------------------- polling state */

static void set_state(attnd_channels *cs, uint32_t state)
{
    for (uint32_t i = 0; i < cs->max; i++) {
        chan *ch = &cs->chans[i];
        if (ch->id == 0) continue;
        _Atomic uint32_t *w = &chan_header(ch)->daemon_state;
        /* only the daemon writes it: skip the store (and the cache-line bounce) when unchanged */
        if (atomic_load_explicit(w, memory_order_relaxed) != state) atomic_store(w, state);
    }
}

/* A request posted and not taken yet in any channel. */
static int any_posted(const attnd_channels *cs)
{
    for (uint32_t i = 0; i < cs->max; i++) {
        const chan *ch = &cs->chans[i];
        if (ch->id == 0) continue;
        for (uint32_t j = 0; j < ch->nslots; j++)
            if (!(ch->busy & (1ull << j)) &&
                atomic_load(&chan_slot(ch, j)->req_seq) != ch->taken[j])
                return 1;
    }
    return 0;
}

int attnd_channels_set_polling(attnd_channels *cs, int polling)
{
    if (polling) {
        set_state(cs, ATTND_CHANNEL_DAEMON_POLLING);
        return 0;
    }
    set_state(cs, ATTND_CHANNEL_DAEMON_ASLEEP);
    /* Dekker with the client's "post, then read daemon_state": a request posted before it could
     * see ASLEEP is visible here */
    atomic_thread_fence(memory_order_seq_cst);
    if (!any_posted(cs)) return 0;
    set_state(cs, ATTND_CHANNEL_DAEMON_POLLING);
    return 1;
}

uint32_t attnd_channels_count(const attnd_channels *cs)
{
    return cs->count;
}
