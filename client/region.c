/* Regions: register / unregister, and shm objects made and registered as regions
 * (attnd_client_shm_create / destroy). */
#include <stdint.h>
#include <string.h>

#include "client_int.h"
#include "cuda_driver.h"
#include "shm.h"

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

/* The allocation p lies in: its IPC handle, base, size and device. */
static attnd_err cuda_allocation(const attnd_cu_driver *d, attnd_cu_devptr p,
                                 attnd_cu_ipc_handle *h, attnd_cu_devptr *base, size_t *size,
                                 int *dev, char *err, size_t n)
{
    int ipc = 0;
    if (d->pointer_attr(dev, ATTND_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "ptr 0x%llx is not CUDA device memory", (unsigned long long)p);
    if (d->pointer_attr(&ipc, ATTND_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) != 0 ||
        !ipc)
        return attnd_errf(err, n, ATTND_ERR_UNSUPPORTED,
                          "the allocation of ptr 0x%llx has no CUDA IPC handle (cuMemCreate or "
                          "memory-pool memory, e.g. PyTorch's expandable_segments or its "
                          "cudaMallocAsync backend): allocate it with cudaMalloc",
                          (unsigned long long)p);
    attnd_err rv = attnd_cu_check(d, d->mem_range(base, size, p), "cuMemGetAddressRange", err, n);
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->ipc_get(h, *base), "cuIpcGetMemHandle", err, n);
    return rv;
}

attnd_err attnd_client_region_register_cuda_ptr(attnd_client *c, uint32_t region, const void *ptr,
                                                uint64_t nbytes, uint64_t *base)
{
    char err[256];
    attnd_cu_driver d;
    attnd_cu_ipc_handle h;
    attnd_cu_devptr b = 0, p = (attnd_cu_devptr)(uintptr_t)ptr;
    size_t n = 0;
    int dev = 0;
    attnd_err rv = attnd_cu_load(&d, err, sizeof err);
    if (rv == ATTND_ERR_OK) {
        rv = cuda_allocation(&d, p, &h, &b, &n, &dev, err, sizeof err);
        attnd_cu_unload(&d);
    }
    if (rv != ATTND_ERR_OK) return attnd_client_fail(c, rv, "register_region: %s", err);
    if (nbytes > n - (p - b))
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT,
                                 "register_region: nbytes %llu past the end of the allocation "
                                 "(%llu bytes from ptr)",
                                 (unsigned long long)nbytes, (unsigned long long)(n - (p - b)));
    if ((rv = attnd_client_region_register_cuda(c, region, &h, p - b + nbytes, dev)) !=
        ATTND_ERR_OK)
        return rv;
    if (base != NULL) *base = b;
    return ATTND_ERR_OK;
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

/* ---------------------------------------------------------------- shm regions */

_Static_assert(sizeof(((attnd_shm *)0)->name) == sizeof(((attnd_client_shm_object *)0)->name),
               "an shm region keeps its object's name");

static void shm_from_object(attnd_shm *shm, const attnd_client_shm_object *o)
{
    memcpy(shm->name, o->name, sizeof shm->name);
    shm->base = o->base;
    shm->size = o->size;
}

static attnd_client_shm_object shm_object_of(const attnd_shm *shm)
{
    attnd_client_shm_object o;
    memcpy(o.name, shm->name, sizeof o.name);
    o.base = shm->base;
    o.size = shm->size;
    o.fd = -1; /* the name was dropped when it was registered */
    return o;
}

attnd_err attnd_client_shm_create(attnd_client *c, size_t size, attnd_shm *shm)
{
    attnd_client_shm_object o;
    char err[256];
    attnd_err rv;
    memset(shm, 0, sizeof *shm);
    if (size == 0) return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "shm_create: size 0");
    uint32_t region = attnd_client_region_next_id(c);
    if ((rv = attnd_client_shm_object_create(&o, "attnd", region, size, c->shm_gid, err,
                                             sizeof err)) != ATTND_ERR_OK)
        return attnd_client_fail(c, rv, "%s", err);
    rv = attnd_client_region_register_shm(c, region, o.name, size);
    /* both sides have it mapped (or the daemon refused it): drop the name, so nothing outlives
     * the two processes */
    attnd_client_shm_object_unlink(&o);
    if (rv != ATTND_ERR_OK) {
        attnd_client_shm_object_unmap(&o);
        return rv;
    }
    shm_from_object(shm, &o);
    shm->region = region;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_shm_destroy(attnd_client *c, attnd_shm *shm)
{
    attnd_client_shm_object o = shm_object_of(shm);
    attnd_err rv = ATTND_ERR_OK;
    if (c != NULL && shm->region != 0) rv = attnd_client_region_unregister(c, shm->region);
    attnd_client_shm_object_unmap(&o);
    memset(shm, 0, sizeof *shm);
    return rv;
}
