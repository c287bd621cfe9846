/* The shared-memory channel transport (channel_transport.h). */
#include "channel_transport.h"

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "attnd/clock.h"
#include "attnd_channel.h"
#include "shm.h"

/* How long one futex wait lasts at most: a lost connection or a closed channel is noticed within
 * it, since neither wakes the futex. */
#define WAIT_SLICE_NS 5000000LL

struct attnd_client_chan {
    attnd_client_shm_object shm;
    uint32_t id; /* the daemon's */
    uint32_t nslots, req_bytes, rep_bytes;
    int64_t spin_ns;
    attnd_client_chan_hooks hooks;
    _Atomic uint64_t busy;  /* slots claimed by a call, or stale */
    _Atomic uint64_t stale; /* slots whose call gave up: free again once rep_seq == req_seq */
    _Atomic int active;     /* 0 once the daemon closed it */
};

static int64_t now_ns(void)
{
    return (int64_t)attnd_clock_ns();
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static attnd_channel_header *chan_header(const attnd_client_chan *ch)
{
    return (attnd_channel_header *)ch->shm.base;
}

static attnd_channel_slot *chan_slot(const attnd_client_chan *ch, uint32_t i)
{
    return attnd_channel_slot_at(ch->shm.base, i);
}

/* ---------------------------------------------------------------- making one */

static uint32_t round64(uint64_t v)
{
    if (v > ATTND_CHANNEL_MAX_AREA) v = ATTND_CHANNEL_MAX_AREA;
    return (uint32_t)((v + ATTND_CHANNEL_ALIGN - 1) / ATTND_CHANNEL_ALIGN * ATTND_CHANNEL_ALIGN);
}

/* Areas sized for the session's largest BeginStep (seqs of 24 bytes at most on the wire) and its
 * reply (query_start_loc: max_seqs + 1 varints of up to 6 bytes). */
static void chan_sizes(attnd_client_chan *ch, const attnd_limits *l)
{
    uint64_t req = 64 + 24 * (uint64_t)l->max_seqs, rep = 64 + 6 * ((uint64_t)l->max_seqs + 1);
    ch->req_bytes = round64(req > 4096 ? req : 4096);
    ch->rep_bytes = round64(rep > 4096 ? rep : 4096);
}

/* Create, size and map the object and write its header (no daemon involved). Named by the
 * live object's address (unique within the process; the library keeps no global counter). */
static attnd_err chan_map_new(attnd_client_chan *ch, int64_t gid, char *err, size_t errlen)
{
    attnd_channel_header *h;
    size_t size = (size_t)attnd_channel_size(ch->nslots, ch->req_bytes, ch->rep_bytes);
    attnd_err rv = attnd_client_shm_object_create(
        &ch->shm, "attnd-ch", (unsigned long)(uintptr_t)ch, size, gid, err, errlen);
    if (rv != ATTND_ERR_OK) return rv;
    h = chan_header(ch);
    h->magic = ATTND_CHANNEL_MAGIC;
    h->version = ATTND_CHANNEL_VERSION;
    h->nslots = ch->nslots;
    h->req_bytes = ch->req_bytes;
    h->rep_bytes = ch->rep_bytes;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_chan_alloc(attnd_client_chan **out, const attnd_client_chan_config *cfg,
                                  char *err, size_t errlen)
{
    int32_t slots = cfg->slots == 0 ? ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS : cfg->slots;
    int32_t spin_us = cfg->spin_us;
    attnd_client_chan *ch;
    char why[256];
    *out = NULL;
    if (slots < 1 || slots > (int32_t)ATTND_CHANNEL_MAX_SLOTS)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "channel_slots: %d out of 1..%u",
                          slots, ATTND_CHANNEL_MAX_SLOTS);
    if ((ch = calloc(1, sizeof *ch)) == NULL)
        return attnd_errf(err, errlen, ATTND_ERR_NO_MEMORY, "channel: out of memory");
    ch->nslots = (uint32_t)slots;
    ch->spin_ns =
        spin_us < 0 ? 0 : (int64_t)(spin_us ? spin_us : ATTND_CLIENT_DEFAULT_SPIN_US) * 1000;
    ch->hooks = cfg->hooks;
    chan_sizes(ch, cfg->limits);
    attnd_err rv = chan_map_new(ch, cfg->shm_gid, why, sizeof why);
    if (rv != ATTND_ERR_OK) {
        free(ch);
        return attnd_errf(err, errlen, rv, "channel: %s", why);
    }
    *out = ch;
    return ATTND_ERR_OK;
}

const char *attnd_client_chan_shm_name(const attnd_client_chan *ch)
{
    return ch->shm.name;
}

uint64_t attnd_client_chan_size(const attnd_client_chan *ch)
{
    return ch->shm.size;
}

void attnd_client_chan_unlink(attnd_client_chan *ch)
{
    attnd_client_shm_object_unlink(&ch->shm);
}

void attnd_client_chan_start(attnd_client_chan *ch, uint32_t id)
{
    ch->id = id;
    atomic_store(&ch->active, 1);
}

uint32_t attnd_client_chan_id(const attnd_client_chan *ch)
{
    return ch->id;
}

static int chan_active(const void *self)
{
    const attnd_client_chan *ch = self;
    return ch != NULL && atomic_load_explicit(&ch->active, memory_order_relaxed);
}

static void chan_free(void *self)
{
    attnd_client_chan *ch = self;
    if (ch == NULL) return;
    attnd_client_shm_object_unmap(&ch->shm);
    free(ch);
}

/* ---------------------------------------------------------------- slots */

static uint64_t all_slots(const attnd_client_chan *ch)
{
    return ch->nslots == 64 ? ~0ull : (1ull << ch->nslots) - 1;
}

/* Free the stale slots whose late reply has come. 1 when one was freed. */
static int slots_reclaim(attnd_client_chan *ch)
{
    uint64_t stale = atomic_load(&ch->stale);
    int freed = 0;
    while (stale != 0) {
        uint32_t i = (uint32_t)__builtin_ctzll(stale);
        uint64_t bit = 1ull << i;
        attnd_channel_slot *s = chan_slot(ch, i);
        stale &= ~bit;
        if (atomic_load(&s->rep_seq) != atomic_load_explicit(&s->req_seq, memory_order_relaxed))
            continue;
        /* only the thread that clears the stale bit hands the slot back */
        if (atomic_fetch_and(&ch->stale, ~bit) & bit) {
            atomic_fetch_and(&ch->busy, ~bit);
            freed = 1;
        }
    }
    return freed;
}

/* A free slot, claimed; -1 when all are taken (the call takes the socket). */
static int slot_claim(attnd_client_chan *ch)
{
    uint64_t busy = atomic_load(&ch->busy);
    for (;;) {
        uint64_t free = ~busy & all_slots(ch);
        if (free == 0) {
            if (!slots_reclaim(ch)) return -1;
            busy = atomic_load(&ch->busy);
            continue;
        }
        uint64_t bit = free & (~free + 1);
        if (atomic_compare_exchange_weak(&ch->busy, &busy, busy | bit)) return __builtin_ctzll(bit);
    }
}

static void slot_release(attnd_client_chan *ch, uint32_t i)
{
    atomic_fetch_and(&ch->busy, ~(1ull << i));
}

/* The call gave up with its request posted: the slot stays claimed until the daemon answers. */
static void slot_abandon(attnd_client_chan *ch, uint32_t i)
{
    atomic_fetch_or(&ch->stale, 1ull << i);
}

/* ---------------------------------------------------------------- one call */

/* Requests the channel carries: the per-layer and per-step ones (stream steps' too), whose
 * replies are small (an Attend with an INLINE output has a large one: it takes the socket). */
static int chan_carries(const Attnd__Request *req)
{
    const Attnd__Attend *a;
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_BEGIN_STEP:
    case ATTND__REQUEST__BODY_END_STEP:
    case ATTND__REQUEST__BODY_CREATE:
    case ATTND__REQUEST__BODY_FREE:
    case ATTND__REQUEST__BODY_FORK:
    case ATTND__REQUEST__BODY_TRUNCATE:
    case ATTND__REQUEST__BODY_STREAM_BEGIN:
    case ATTND__REQUEST__BODY_STREAM_END:
        return 1;
    case ATTND__REQUEST__BODY_ATTEND:
        a = req->attend;
        return a->out != NULL && a->out->region != 0 &&
               (a->out_lse == NULL || a->out_lse->region != 0);
    default:
        return 0;
    }
}

static attnd_err chan_closed(attnd_client_chan *ch, attnd_client_transport_call *call)
{
    atomic_store(&ch->active, 0);
    return attnd_errf(call->err, call->err_cap, ATTND_ERR_UNAVAILABLE,
                      "channel: closed by the daemon");
}

/* Write the packed request into slot i and publish it (its seq in *seq); then make sure the
 * daemon will look (Dekker with its "store ASLEEP, then poll once more"): a daemon asleep gets a
 * wake-up through the hook. UNAVAILABLE when the daemon closed the channel. */
static attnd_err slot_post(attnd_client_chan *ch, uint32_t i, attnd_client_transport_call *call,
                           uint32_t *seq)
{
    attnd_channel_slot *s = chan_slot(ch, i);
    uint32_t n = atomic_load_explicit(&s->req_seq, memory_order_relaxed) + 1;
    if (n == 0) n = 1; /* 0 is never posted */
    attnd__request__pack(call->req, attnd_channel_req_area(ch->shm.base, ch->nslots, ch->req_bytes,
                                                           ch->rep_bytes, i));
    s->req_len = (uint32_t)call->req_len;
    atomic_store(&s->req_seq, n);
    *seq = n;
    switch (atomic_load(&chan_header(ch)->daemon_state)) {
    case ATTND_CHANNEL_DAEMON_POLLING:
        return ATTND_ERR_OK;
    case ATTND_CHANNEL_DAEMON_ASLEEP:
        ch->hooks.wake(ch->hooks.arg, ch->id);
        return ATTND_ERR_OK;
    default:
        return chan_closed(ch, call);
    }
}

/* Spin on rep_seq for the spin budget (bounded by the deadline, -1 = none); 1 when it came. */
static int wait_spin(const attnd_client_chan *ch, attnd_channel_slot *s, uint32_t n,
                     int64_t deadline)
{
    int64_t end = now_ns() + ch->spin_ns;
    if (deadline >= 0 && deadline < end) end = deadline;
    for (uint32_t k = 1;; k++) {
        if (atomic_load_explicit(&s->rep_seq, memory_order_acquire) == n) return 1;
        if (k % 64 == 0 && now_ns() >= end) return 0;
        cpu_relax();
    }
}

static void futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    /* shared (not FUTEX_PRIVATE): the daemon's FUTEX_WAKE comes through its own mapping */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Sleep on rep_seq (client_waiting set, so the daemon wakes us) in slices, watching the
 * connection, the channel and the deadline. */
static attnd_err wait_sleep(attnd_client_chan *ch, attnd_client_transport_call *call,
                            attnd_channel_slot *s, uint32_t n, int64_t deadline)
{
    attnd_err rv = ATTND_ERR_OK;
    atomic_store(&s->client_waiting, 1);
    for (;;) {
        uint32_t cur = atomic_load(&s->rep_seq); /* seq_cst: Dekker with the daemon's wake */
        int64_t t = now_ns(), slice = WAIT_SLICE_NS;
        if (cur == n) break;
        if (ch->hooks.lost(ch->hooks.arg)) {
            call->lost = 1;
            rv = ATTND_ERR_UNAVAILABLE;
            break;
        }
        if (atomic_load(&chan_header(ch)->daemon_state) == ATTND_CHANNEL_DAEMON_CLOSED) {
            rv = chan_closed(ch, call);
            break;
        }
        if (deadline >= 0 && t >= deadline) {
            rv = ATTND_ERR_TIMEOUT;
            break;
        }
        if (deadline >= 0 && deadline - t < slice) slice = deadline - t;
        futex_wait(&s->rep_seq, cur, slice);
    }
    atomic_store_explicit(&s->client_waiting, 0, memory_order_relaxed);
    return rv;
}

/* Wait for slot i's reply n and hand it to the call's callback. */
static attnd_err slot_reply(attnd_client_chan *ch, attnd_client_transport_call *call, uint32_t i,
                            uint32_t n, int64_t deadline)
{
    attnd_channel_slot *s = chan_slot(ch, i);
    attnd_err rv;
    uint32_t len;
    if (!wait_spin(ch, s, n, deadline) &&
        (rv = wait_sleep(ch, call, s, n, deadline)) != ATTND_ERR_OK) {
        if (rv == ATTND_ERR_TIMEOUT)
            attnd_errf(call->err, call->err_cap, rv, "no reply in time (channel %u, slot %u)",
                       ch->id, i);
        return rv;
    }
    len = s->rep_len;
    if (len > ch->rep_bytes)
        return attnd_errf(call->err, call->err_cap, ATTND_ERR_PROTOCOL,
                          "reply of %u bytes in a %u-byte slot", len, ch->rep_bytes);
    call->reply_cb(
        call->reply_arg,
        attnd_channel_rep_area(ch->shm.base, ch->nslots, ch->req_bytes, ch->rep_bytes, i), len);
    return ATTND_ERR_OK;
}

static int chan_call(void *self, attnd_client_transport_call *call)
{
    attnd_client_chan *ch = self;
    int64_t deadline;
    uint32_t n;
    int i;
    if (!chan_active(ch) || !chan_carries(call->req) || call->req_len > ch->req_bytes) return 0;
    if ((i = slot_claim(ch)) < 0) return 0;
    deadline = call->timeout_ms < 0 ? -1 : now_ns() + (int64_t)call->timeout_ms * 1000000;
    if ((call->rv = slot_post(ch, (uint32_t)i, call, &n)) == ATTND_ERR_OK)
        call->rv = slot_reply(ch, call, (uint32_t)i, n, deadline);
    /* a reply that came (even one too long to take) frees the slot; else it waits for it */
    if (atomic_load(&chan_slot(ch, (uint32_t)i)->rep_seq) == n)
        slot_release(ch, (uint32_t)i);
    else
        slot_abandon(ch, (uint32_t)i);
    return 1;
}

const attnd_client_transport_ops attnd_client_chan_transport = {
    .call = chan_call,
    .active = chan_active,
    .free = chan_free,
};
