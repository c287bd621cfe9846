/* The device support calls of kernels.h in a build without CUDA: nothing to call, so
 * UNSUPPORTED (kernels/cuda/device.cu implements them when CUDA is compiled in). */
#include "attnd/kernels.h"

#ifndef ATTND_HAVE_CUDA
#include <string.h>

attnd_err attnd_device_query(attnd_backend *b, attnd_device_info *info)
{
    (void)b;
    memset(info, 0, sizeof *info);
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_bind(attnd_backend *b)
{
    (void)b;
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_memset(attnd_backend *b, void *ptr, int v, size_t bytes)
{
    (void)b;
    (void)ptr;
    (void)v;
    (void)bytes;
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_ipc_open(attnd_backend *b, const void *handle, void **ptr, uint64_t *bytes,
                                int32_t *device)
{
    (void)b;
    (void)handle;
    *ptr = NULL;
    *bytes = 0;
    *device = -1;
    return ATTND_ERR_UNSUPPORTED;
}

void attnd_device_ipc_close(attnd_backend *b, void *ptr)
{
    (void)b;
    (void)ptr;
}

attnd_err attnd_device_host_alloc(attnd_backend *b, size_t bytes, void **ptr)
{
    (void)b;
    (void)bytes;
    *ptr = NULL;
    return ATTND_ERR_UNSUPPORTED;
}

void attnd_device_host_free(attnd_backend *b, void *ptr)
{
    (void)b;
    (void)ptr;
}

attnd_err attnd_device_upload(attnd_backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    (void)dst;
    (void)src;
    (void)bytes;
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_fence_record(attnd_backend *b, attnd_fence **fence)
{
    (void)b;
    *fence = NULL;
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_fence_query(attnd_backend *b, attnd_fence *fence)
{
    (void)b;
    (void)fence;
    return ATTND_ERR_UNSUPPORTED;
}

void attnd_device_fence_release(attnd_backend *b, attnd_fence *fence)
{
    (void)b;
    (void)fence;
}

attnd_err attnd_device_ipc_export(attnd_backend *b, void *ptr, void *handle)
{
    (void)b;
    (void)ptr;
    (void)handle;
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_device_mps(attnd_backend *b, int *active)
{
    (void)b;
    *active = 0;
    return ATTND_ERR_UNSUPPORTED;
}
#else
typedef int attnd_device_none_unused; /* the cuda build implements these in device.cu */
#endif
