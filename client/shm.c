/* Shared-memory objects for regions and channels (shm.h). */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnd/clock.h"

int64_t attnd_client_shm_group(const char *url)
{
    struct stat st;
    return strncmp(url, "ipc://", 6) == 0 && stat(url + 6, &st) == 0 ? (int64_t)st.st_gid : -1;
}

/* shm_open a new, exclusive object named "/<prefix>-<pid>-<tag>-<salt>" into name. Returns the
 * fd or -1. */
static int shm_open_unique(const char *prefix, unsigned long tag, char *name, size_t cap)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned long salt = (unsigned long)(attnd_clock_ns() % 1000000000ull);
        snprintf(name, cap, "/%s-%ld-%lx-%lx", prefix, (long)getpid(), tag,
                 salt ^ ((unsigned long)attempt << 24));
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0660);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

/* EPERM when we are not in that group: the object keeps our group. */
static void shm_share(int fd, int64_t gid)
{
    if (gid >= 0 && (gid_t)gid != getegid()) (void)!fchown(fd, (uid_t)-1, (gid_t)gid);
}

attnd_err attnd_client_shm_object_create(attnd_client_shm_object *o, const char *prefix,
                                         unsigned long tag, size_t size, int64_t gid, char *err,
                                         size_t errlen)
{
    int fd = shm_open_unique(prefix, tag, o->name, sizeof o->name);
    o->base = NULL;
    o->size = 0;
    if (fd < 0)
        return attnd_errf(err, errlen, ATTND_ERR_INTERNAL, "shm_open %s: %s", o->name,
                          strerror(errno));
    shm_share(fd, gid);
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(o->name);
        return attnd_errf(err, errlen,
                          e == ENOSPC || e == ENOMEM ? ATTND_ERR_NO_MEMORY : ATTND_ERR_INTERNAL,
                          "ftruncate %s to %zu bytes: %s", o->name, size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        int e = errno;
        shm_unlink(o->name);
        return attnd_errf(err, errlen, ATTND_ERR_NO_MEMORY, "mmap %s (%zu bytes): %s", o->name,
                          size, strerror(e));
    }
    o->base = p;
    o->size = size;
    return ATTND_ERR_OK;
}

void attnd_client_shm_object_unlink(const attnd_client_shm_object *o)
{
    shm_unlink(o->name);
}

void attnd_client_shm_object_unmap(attnd_client_shm_object *o)
{
    if (o->base != NULL) munmap(o->base, o->size);
    memset(o, 0, sizeof *o);
}
