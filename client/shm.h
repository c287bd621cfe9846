/* POSIX shared-memory objects the daemon must map (regions and channels): their names, their
 * creation, their group (that of the daemon's ipc:// socket), unlinking and unmapping. Knows no
 * client and no daemon: the callers register the objects.
 *
 * An object must keep its name until the daemon has opened it, and a client killed in between
 * (SIGKILL, OOM) cannot drop it. So the creator holds a lock (flock) on its object from creation
 * until it drops the name, and such objects are named "....held"; every create first drops the
 * names of this user's held objects whose lock is free: their creators died before Register
 * returned. Objects of older clients (no ".held") are never touched. */
#ifndef ATTND_CLIENT_SHM_H
#define ATTND_CLIENT_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

/* A mapped shm object. */
typedef struct attnd_client_shm_object {
    char name[64]; /* "/<prefix>-<pid>-<tag>-<salt>.held" */
    void *base;    /* the mapping, NULL when none */
    size_t size;
    int fd; /* holds the lock while the name exists; -1 once it is dropped */
} attnd_client_shm_object;

/* The group a shm object should get for a daemon at url: that of its ipc:// socket file (0660
 * then lets a daemon running as another user in that group map it, as its socket lets us
 * connect); -1 for other URLs or when the file cannot be read. */
int64_t attnd_client_shm_group(const char *url);

/* Create an exclusive object of size bytes, named after prefix, this process and tag, with group
 * gid when >= 0 and this process may give it, and map it (zero-filled), held until its name is
 * dropped; first drop the names dead creators left. On failure nothing is left and err names
 * the system call: INTERNAL, NO_MEMORY. */
attnd_err attnd_client_shm_object_create(attnd_client_shm_object *o, const char *prefix,
                                         unsigned long tag, size_t size, int64_t gid, char *err,
                                         size_t errlen);
/* Drop the object's name (once the daemon mapped it, or refused it) and with it the hold: the
 * memory then lives exactly as long as the mappings. */
void attnd_client_shm_object_unlink(attnd_client_shm_object *o);
/* Unmap the object (when mapped; its name dropped if still held); its fields are cleared. */
void attnd_client_shm_object_unmap(attnd_client_shm_object *o);

#endif
