/* Shared-memory objects for regions and channels (shm.h). */
#include "shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnd/clock.h"

/* Where glibc's shm_open keeps its objects, and how the names of held objects end. */
#define SHM_DIR "/dev/shm"
#define SHM_HELD ".held"

int64_t attnd_client_shm_group(const char *url)
{
    struct stat st;
    return strncmp(url, "ipc://", 6) == 0 && stat(url + 6, &st) == 0 ? (int64_t)st.st_gid : -1;
}

/* Whether shm name "/x" still names the object open on fd. */
static int shm_name_is(int fd, const char *name)
{
    char path[sizeof SHM_DIR + 256];
    struct stat a, b;
    snprintf(path, sizeof path, SHM_DIR "%s", name);
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* One entry of the sweep: an object of ours whose creator no longer holds it lost its creator
 * before the name was dropped (a live creator holds its lock until it unlinks the name). */
static void shm_sweep_one(const char *entry, uid_t me)
{
    char path[sizeof SHM_DIR + 256], name[257];
    struct stat st;
    snprintf(path, sizeof path, SHM_DIR "/%s", entry);
    snprintf(name, sizeof name, "/%s", entry);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == me &&
        flock(fd, LOCK_EX | LOCK_NB) == 0 && shm_name_is(fd, name))
        shm_unlink(name);
    close(fd);
}

/* Drop the names a killed client of this user left: every "attnd-*.held" object nobody holds. */
static void shm_sweep(void)
{
    size_t held = strlen(SHM_HELD);
    DIR *dir = opendir(SHM_DIR);
    if (dir == NULL) return;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "attnd-", 6) == 0 && len > held &&
            strcmp(e->d_name + len - held, SHM_HELD) == 0)
            shm_sweep_one(e->d_name, geteuid());
    }
    closedir(dir);
}

/* shm_open a new, exclusive object named "/<prefix>-<pid>-<tag>-<salt>.held" into name, and
 * hold it (flock) until its name is dropped. Returns the fd or -1. */
static int shm_open_held(const char *prefix, unsigned long tag, char *name, size_t cap)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned long salt = (unsigned long)(attnd_clock_ns() % 1000000000ull);
        snprintf(name, cap, "/%s-%ld-%lx-%lx" SHM_HELD, prefix, (long)getpid(), tag,
                 salt ^ ((unsigned long)attempt << 24));
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0660);
        if (fd < 0 && errno != EEXIST) return -1;
        if (fd < 0) continue;
        /* another client's sweep may have taken the name before the lock: make another */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && shm_name_is(fd, name)) return fd;
        close(fd);
    }
    errno = EEXIST;
    return -1;
}

/* EPERM when we are not in that group: the object keeps our group. */
static void shm_share(int fd, int64_t gid)
{
    if (gid >= 0 && (gid_t)gid != getegid()) (void)!fchown(fd, (uid_t)-1, (gid_t)gid);
}

/* Size and map the held object fd; on failure it is unlinked and closed. */
static attnd_err shm_size_and_map(attnd_client_shm_object *o, int fd, size_t size, char *err,
                                  size_t errlen)
{
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        shm_unlink(o->name);
        close(fd);
        return attnd_errf(err, errlen,
                          e == ENOSPC || e == ENOMEM ? ATTND_ERR_NO_MEMORY : ATTND_ERR_INTERNAL,
                          "ftruncate %s to %zu bytes: %s", o->name, size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        shm_unlink(o->name);
        close(fd);
        return attnd_errf(err, errlen, ATTND_ERR_NO_MEMORY, "mmap %s (%zu bytes): %s", o->name,
                          size, strerror(e));
    }
    o->base = p;
    o->size = size;
    o->fd = fd;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_shm_object_create(attnd_client_shm_object *o, const char *prefix,
                                         unsigned long tag, size_t size, int64_t gid, char *err,
                                         size_t errlen)
{
    o->base = NULL;
    o->size = 0;
    o->fd = -1;
    shm_sweep();
    int fd = shm_open_held(prefix, tag, o->name, sizeof o->name);
    if (fd < 0)
        return attnd_errf(err, errlen, ATTND_ERR_INTERNAL, "shm_open %s: %s", o->name,
                          strerror(errno));
    shm_share(fd, gid);
    return shm_size_and_map(o, fd, size, err, errlen);
}

void attnd_client_shm_object_unlink(attnd_client_shm_object *o)
{
    shm_unlink(o->name);
    if (o->fd >= 0) close(o->fd); /* the lock goes with the name, not before */
    o->fd = -1;
}

void attnd_client_shm_object_unmap(attnd_client_shm_object *o)
{
    if (o->fd >= 0) attnd_client_shm_object_unlink(o);
    if (o->base != NULL) munmap(o->base, o->size);
    memset(o, 0, sizeof *o);
    o->fd = -1;
}
