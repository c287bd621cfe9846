#include "shmguard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The handler touches nothing but these atomics (and mmap/sigaction, both raw syscalls). */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 &&
                   ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_POINTER_LOCK_FREE == 2,
               "the SIGBUS handler needs lock-free atomics");

/* Entry state: a generation above two phase bits. Every remove bumps the generation, so the
 * handler, reading state / base / len / state again like a seqlock, never pairs a base and len
 * from two different adds. state, base and len are accessed sequentially consistent (add and
 * remove are rare, faults rarer): a handler that reads a new base or len then reads a state that
 * is no longer the one it read first. */
#define PHASE_MASK 3u
#define PHASE_FREE 0u
#define PHASE_CLAIMED 1u /* an add is writing base and len */
#define PHASE_LIVE 2u
#define GEN_ONE 4u

typedef struct shmguard_entry {
    _Atomic unsigned state;
    _Atomic uintptr_t base;
    _Atomic size_t len;  /* whole pages */
    _Atomic int faulted; /* set by the first fault, which replaces the pages */
} shmguard_entry;

struct attnd_shmguard {
    struct sigaction old; /* SIGBUS's action before alloc */
    size_t page;
    uint32_t capacity;
    _Atomic uint64_t faults;
    shmguard_entry entries[];
};

/* The installed guard. The one file-scope mutable variable: a signal handler can find its state
 * no other way. */
static _Atomic(attnd_shmguard *) shmguard_current;

/* ---------------------------------------------------------------- the handler */

/* The live entry whose range holds addr, or NULL. */
static shmguard_entry *shmguard_find(attnd_shmguard *g, uintptr_t addr)
{
    for (uint32_t i = 0; i < g->capacity; i++) {
        shmguard_entry *e = &g->entries[i];
        unsigned s = atomic_load(&e->state);
        if ((s & PHASE_MASK) != PHASE_LIVE) continue;
        uintptr_t base = atomic_load(&e->base);
        size_t len = atomic_load(&e->len);
        if (atomic_load(&e->state) != s) continue; /* removed (and perhaps re-added) meanwhile */
        if (addr >= base && addr - base < len) return e;
    }
    return NULL;
}

/* Not ours: chain to the previous handler when it was a function; else go back to SIG_DFL (a
 * fault cannot be ignored) so that the fault recurs on return and kills the process as it would
 * have. A SIGBUS sent by kill() would not recur: raise it again. */
static void shmguard_pass_on(attnd_shmguard *g, int sig, siginfo_t *si, void *uctx)
{
    if (g != NULL && g->old.sa_handler != SIG_DFL && g->old.sa_handler != SIG_IGN) {
        if (g->old.sa_flags & SA_SIGINFO)
            g->old.sa_sigaction(sig, si, uctx);
        else
            g->old.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (si->si_code <= 0) raise(SIGBUS);
}

static void shmguard_sigbus_cb(int sig, siginfo_t *si, void *uctx)
{
    int saved_errno = errno;
    attnd_shmguard *g = atomic_load_explicit(&shmguard_current, memory_order_acquire);
    shmguard_entry *e = NULL;
    /* only a bad access to a mapped file's missing page; never a kill() (its si_addr is junk) */
    if (g != NULL && si->si_code == BUS_ADRERR) e = shmguard_find(g, (uintptr_t)si->si_addr);
    if (e == NULL) {
        shmguard_pass_on(g, sig, si, uctx);
        errno = saved_errno;
        return;
    }
    int expected = 0;
    /* Only the first fault replaces the pages; another thread faulting in the range meanwhile
     * returns, faults again until the pages are there, then proceeds. */
    if (atomic_compare_exchange_strong_explicit(&e->faulted, &expected, 1, memory_order_acq_rel,
                                                memory_order_acquire)) {
        uintptr_t base = atomic_load(&e->base);
        size_t len = atomic_load(&e->len);
        if (mmap((void *)base, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0) == MAP_FAILED) {
            /* give the signal back to the previous action: the fault recurs there (a fault that
             * cannot be ignored reaches SIG_DFL even from SIG_IGN) and the process dies as it
             * would have; threads waiting on this range follow */
            sigaction(SIGBUS, &g->old, NULL);
            errno = saved_errno;
            return;
        }
        atomic_fetch_add_explicit(&g->faults, 1, memory_order_relaxed);
    }
    errno = saved_errno;
}

/* ---------------------------------------------------------------- the API */

attnd_err attnd_shmguard_alloc(attnd_shmguard **out, uint32_t capacity)
{
    attnd_shmguard *g, *none = NULL;
    struct sigaction sa;
    attnd_err rv;
    if (out == NULL || capacity == 0 || capacity > INT32_MAX) return ATTND_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (atomic_load(&shmguard_current) != NULL) return ATTND_ERR_ALREADY_EXISTS;
    g = calloc(1, sizeof(*g) + (size_t)capacity * sizeof(shmguard_entry));
    if (g == NULL) return ATTND_ERR_NO_MEMORY;
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    g->capacity = capacity;
    atomic_init(&g->faults, 0);
    for (uint32_t i = 0; i < capacity; i++) {
        atomic_init(&g->entries[i].state, PHASE_FREE);
        atomic_init(&g->entries[i].base, 0);
        atomic_init(&g->entries[i].len, 0);
        atomic_init(&g->entries[i].faulted, 0);
    }
    if (!atomic_compare_exchange_strong(&shmguard_current, &none, g)) {
        rv = ATTND_ERR_ALREADY_EXISTS;
        goto fail;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = shmguard_sigbus_cb;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    if (sigaction(SIGBUS, &sa, &g->old) != 0) {
        atomic_store(&shmguard_current, NULL);
        rv = ATTND_ERR_INTERNAL;
        goto fail;
    }
    *out = g;
    return ATTND_ERR_OK;
fail:
    free(g);
    return rv;
}

void attnd_shmguard_free(attnd_shmguard *g)
{
    attnd_shmguard *self = g;
    if (g == NULL) return;
    sigaction(SIGBUS, &g->old, NULL);
    atomic_compare_exchange_strong(&shmguard_current, &self, NULL);
    free(g);
}

int32_t attnd_shmguard_add(attnd_shmguard *g, void *base, size_t len)
{
    uintptr_t b = (uintptr_t)base;
    if (g == NULL || len == 0 || b % g->page != 0 || len > SIZE_MAX - (g->page - 1)) return -1;
    len = (len + g->page - 1) / g->page * g->page;
    for (uint32_t i = 0; i < g->capacity; i++) {
        shmguard_entry *e = &g->entries[i];
        unsigned s = atomic_load(&e->state);
        if ((s & PHASE_MASK) != PHASE_FREE) continue;
        if (!atomic_compare_exchange_strong(&e->state, &s, s | PHASE_CLAIMED)) continue;
        atomic_store(&e->base, b);
        atomic_store(&e->len, len);
        atomic_store(&e->faulted, 0);
        atomic_store(&e->state, s | PHASE_LIVE);
        return (int32_t)i;
    }
    return -1;
}

int attnd_shmguard_faulted(const attnd_shmguard *g, int32_t handle)
{
    if (g == NULL || handle < 0 || (uint32_t)handle >= g->capacity) return 0;
    return atomic_load_explicit(&g->entries[handle].faulted, memory_order_acquire) != 0;
}

void attnd_shmguard_remove(attnd_shmguard *g, int32_t handle)
{
    if (g == NULL || handle < 0 || (uint32_t)handle >= g->capacity) return;
    shmguard_entry *e = &g->entries[handle];
    unsigned s = atomic_load(&e->state);
    if ((s & PHASE_MASK) != PHASE_LIVE) return;
    atomic_compare_exchange_strong(&e->state, &s, (s & ~PHASE_MASK) + GEN_ONE);
}

uint64_t attnd_shmguard_faults(const attnd_shmguard *g)
{
    return g == NULL ? 0 : atomic_load_explicit(&g->faults, memory_order_relaxed);
}
