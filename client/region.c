/* Regions: register / unregister, and the POSIX shared-memory helper. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"

#define ATTND_CUDA_IPC_HANDLE_BYTES 64

static attnd_err register_region(attnd_client *c, Attnd__RegisterRegion *rr)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Reply *rep;
    attnd_err rv;
    req.body_case = ATTND__REQUEST__BODY_REGISTER_REGION;
    req.register_region = rr;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_region_register_shm(attnd_client *c, uint32_t region, const char *shm_name,
                                           uint64_t size)
{
    Attnd__RegisterRegion rr = ATTND__REGISTER_REGION__INIT;
    if (shm_name == NULL)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "register_region: no shm_name");
    rr.region = region;
    rr.kind = ATTND__REGION_KIND__HOST_SHM;
    rr.shm_name = (char *)shm_name;
    rr.size = size;
    return register_region(c, &rr);
}

attnd_err attnd_client_region_register_cuda(attnd_client *c, uint32_t region,
                                            const void *ipc_handle, uint64_t size, int32_t device)
{
    Attnd__RegisterRegion rr = ATTND__REGISTER_REGION__INIT;
    if (ipc_handle == NULL)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "register_region: no ipc_handle");
    rr.region = region;
    rr.kind = ATTND__REGION_KIND__CUDA_IPC;
    rr.ipc_handle.data = (uint8_t *)ipc_handle;
    rr.ipc_handle.len = ATTND_CUDA_IPC_HANDLE_BYTES;
    rr.size = size;
    rr.device = device;
    return register_region(c, &rr);
}

attnd_err attnd_client_region_unregister(attnd_client *c, uint32_t region)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__UnregisterRegion ur = ATTND__UNREGISTER_REGION__INIT;
    Attnd__Reply *rep;
    attnd_err rv;
    ur.region = region;
    req.body_case = ATTND__REQUEST__BODY_UNREGISTER_REGION;
    req.unregister_region = &ur;
    if ((rv = attnd_client_rpc(c, &req, &rep)) != ATTND_ERR_OK) return rv;
    attnd__reply__free_unpacked(rep, NULL);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- shm helper */

/* shm_open a new, exclusive object named "/<prefix>-<pid>-<tag>-<salt>" into name. Returns the
 * fd or -1. */
static int shm_open_unique(const char *prefix, unsigned long tag, char *name, size_t cap)
{
    struct timespec ts;
    for (int attempt = 0; attempt < 16; attempt++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(name, cap, "/%s-%ld-%lx-%lx", prefix, (long)getpid(), tag,
                 (unsigned long)(ts.tv_nsec ^ ((unsigned long)attempt << 24)));
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0660);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

attnd_err attnd_client_shm_new(attnd_client *c, const char *what, const char *prefix,
                               unsigned long tag, size_t size, char *name, size_t cap, void **base)
{
    int fd = shm_open_unique(prefix, tag, name, cap);
    *base = NULL;
    if (fd < 0)
        return attnd_client_fail(c, ATTND_ERR_INTERNAL, "%sshm_open %s: %s", what, name,
                                 strerror(errno));
    attnd_client_shm_share(c, fd);
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return attnd_client_fail(
            c, e == ENOSPC || e == ENOMEM ? ATTND_ERR_NO_MEMORY : ATTND_ERR_INTERNAL,
            "%sftruncate %s to %zu bytes: %s", what, name, size, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        int e = errno;
        shm_unlink(name);
        return attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "%smmap %s (%zu bytes): %s", what, name,
                                 size, strerror(e));
    }
    *base = p;
    return ATTND_ERR_OK;
}

/* Create and map the object (no daemon involved). */
static attnd_err shm_map_new(attnd_client *c, size_t size, attnd_shm *shm)
{
    void *base;
    attnd_err rv =
        attnd_client_shm_new(c, "", "attnd", shm->region, size, shm->name, sizeof shm->name, &base);
    if (rv != ATTND_ERR_OK) return rv;
    shm->base = base;
    shm->size = size;
    return ATTND_ERR_OK;
}

static void shm_unmap(attnd_shm *shm)
{
    if (shm->base != NULL) munmap(shm->base, shm->size);
    memset(shm, 0, sizeof *shm);
}

attnd_err attnd_client_shm_create(attnd_client *c, size_t size, attnd_shm *shm)
{
    attnd_err rv;
    memset(shm, 0, sizeof *shm);
    if (size == 0) return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "shm_create: size 0");
    shm->region = attnd_client_region_next_id(c);
    if ((rv = shm_map_new(c, size, shm)) != ATTND_ERR_OK) {
        memset(shm, 0, sizeof *shm);
        return rv;
    }
    if ((rv = attnd_client_region_register_shm(c, shm->region, shm->name, size)) != ATTND_ERR_OK) {
        shm_unlink(shm->name);
        shm_unmap(shm);
        return rv;
    }
    /* Both sides have it mapped: drop the name, so nothing outlives the two processes. */
    shm_unlink(shm->name);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_shm_destroy(attnd_client *c, attnd_shm *shm)
{
    attnd_err rv = ATTND_ERR_OK;
    if (c != NULL && shm->region != 0) rv = attnd_client_region_unregister(c, shm->region);
    shm_unmap(shm);
    return rv;
}
