/* SIGBUS guard for shared-memory mappings that clients own (libwayland-server's wl_shm approach).
 *
 * The daemon maps POSIX shm objects that clients created; a hostile client can ftruncate its
 * object smaller while the daemon has it mapped, and the daemon's next access past the new end
 * raises SIGBUS. The guard installs one process-wide SIGBUS handler: when the faulting address
 * lies inside a watched range, the handler maps anonymous zero-filled private pages over that
 * whole range (MAP_FIXED), marks it faulted and returns, so the faulting instruction restarts and
 * reads zeros (or writes to the private copy). Any other SIGBUS restores the previous handler
 * (SIG_DFL when it was SIG_IGN) and lets the fault recur, so the process dies as it would have;
 * a previous handler that is a function is called instead (chained). A SIGBUS sent by kill() is
 * never absorbed.
 *
 *     int32_t h = attnd_shmguard_add(g, base, size);    // after mmap
 *     ... read and write the mapping ...
 *     if (attnd_shmguard_faulted(g, h)) ...             // the client's object is gone
 *     attnd_shmguard_remove(g, h);                      // before munmap
 *
 * add, remove and faulted are thread-safe against each other and against the handler (atomics
 * only, no locks). A range must be removed before it is unmapped, and not while another thread
 * still touches it; alloc and free must not race with a fault. */
#ifndef ATTND_CORE_SHMGUARD_H
#define ATTND_CORE_SHMGUARD_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_shmguard attnd_shmguard;

/* Install the process's SIGBUS handler with room for `capacity` ranges. One guard per process:
 * ALREADY_EXISTS when one is installed; INVALID_ARGUMENT (g NULL, capacity 0 or over
 * INT32_MAX); NO_MEMORY; INTERNAL when sigaction fails. */
attnd_err attnd_shmguard_alloc(attnd_shmguard **g, uint32_t capacity);
/* Restore the previous handler and free (ranges still registered are simply forgotten). NULL ok. */
void attnd_shmguard_free(attnd_shmguard *g);

/* Watch [base, base+len) (page-aligned base, as mmap returns; len is rounded up to whole pages,
 * as the mapping is): returns a handle >= 0, or -1 when all entries are taken (or base is not
 * page-aligned, or len is 0). Thread-safe against the handler and other add/remove calls. */
int32_t attnd_shmguard_add(attnd_shmguard *g, void *base, size_t len);
/* 1 when a fault in that range was absorbed since add (the range now holds private zero pages;
 * the caller should treat the client's object as gone); 0 otherwise or for a bad handle. */
int attnd_shmguard_faulted(const attnd_shmguard *g, int32_t handle);
/* Stop watching (before the caller munmaps the range). A bad or free handle is ignored. */
void attnd_shmguard_remove(attnd_shmguard *g, int32_t handle);

/* Faults absorbed since alloc (one per range replaced), for metrics and tests. */
uint64_t attnd_shmguard_faults(const attnd_shmguard *g);

#endif
