// Device support calls for the daemon (kernels.h, "device"): properties, free memory, thread
// binding, memset, and CUDA IPC. Each one checks that the backend is the cuda one first.
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

static attnd_err device_cuda(attnd_backend *b, attnd_cuda **c)
{
    if (b == NULL || b->ops != &attnd_cuda_backend_ops) return ATTND_ERR_UNSUPPORTED;
    *c = attnd_cuda_of(b);
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_device_query(attnd_backend *b, attnd_device_info *info)
{
    attnd_cuda *c;
    cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    memset(info, 0, sizeof *info);
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice")) != ATTND_ERR_OK ||
        (rv = attnd_cuda_check(b, cudaGetDeviceProperties(&prop, c->device),
                               "cudaGetDeviceProperties")) != ATTND_ERR_OK ||
        (rv = attnd_cuda_check(b, cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo")) !=
            ATTND_ERR_OK)
        return rv;
    info->device = c->device;
    info->num_sms = c->num_sms;
    info->free_bytes = free_b;
    info->total_bytes = total_b;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_device_bind(attnd_backend *b)
{
    attnd_cuda *c;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    return attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice");
}

extern "C" attnd_err attnd_device_memset(attnd_backend *b, void *ptr, int v, size_t bytes)
{
    attnd_cuda *c;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cuda_check(b, cudaMemsetAsync(ptr, v, bytes, c->stream), "cudaMemsetAsync")))
        return rv;
    return attnd_cuda_check(b, cudaStreamSynchronize(c->stream), "cudaMemsetAsync sync");
}

// The size of the allocation a device pointer lies in, from the driver (cuMemGetAddressRange,
// reached through the runtime so that no libcuda link is needed): bytes from ptr to its end.
static attnd_err device_range(attnd_backend *b, void *ptr, uint64_t *bytes)
{
    typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    CUdeviceptr base = 0;
    size_t size = 0;
    cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
        cudaGetLastError();
        snprintf(b->last_error, sizeof b->last_error,
                 "ipc_handle: cannot look up cuMemGetAddressRange to bound the region");
        return ATTND_ERR_INTERNAL;
    }
    CUresult r = ((range_fn)fn)(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS || (uintptr_t)ptr < base || (uintptr_t)ptr >= base + size) {
        snprintf(b->last_error, sizeof b->last_error,
                 "ipc_handle: cuMemGetAddressRange failed (%d) on the mapped region", (int)r);
        return ATTND_ERR_INTERNAL;
    }
    *bytes = (uint64_t)(base + size - (uintptr_t)ptr);
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_device_ipc_open(attnd_backend *b, const void *handle, void **ptr,
                                           uint64_t *bytes, int32_t *device)
{
    attnd_cuda *c;
    cudaIpcMemHandle_t h;
    cudaPointerAttributes attr;
    *ptr = NULL;
    *bytes = 0;
    *device = -1;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    static_assert(sizeof h == ATTND_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t size");
    memcpy(&h, handle, sizeof h);
    if ((rv = attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice"))) return rv;
    attnd_cuda_collect(b, 0); /* a close of this very mapping may still be deferred */
    cudaError_t e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cudaGetLastError(); // not sticky: clear it so the next launch does not report it
        *ptr = NULL;
        snprintf(b->last_error, sizeof b->last_error, "ipc_handle: cudaIpcOpenMemHandle: %s",
                 cudaGetErrorString(e));
        return ATTND_ERR_INVALID_ARGUMENT;
    }
    if ((rv = device_range(b, *ptr, bytes)) == ATTND_ERR_OK) {
        e = cudaPointerGetAttributes(&attr, *ptr);
        if (e == cudaSuccess) {
            *device = attr.device;
        } else {
            cudaGetLastError();
            rv = attnd_cuda_check(b, e, "ipc_handle: cudaPointerGetAttributes");
        }
    }
    if (rv != ATTND_ERR_OK) {
        attnd_cuda_free_later(b, ATTND_CUDA_FREE_IPC, *ptr);
        *ptr = NULL;
        *bytes = 0;
    }
    return rv;
}

extern "C" void attnd_device_ipc_close(attnd_backend *b, void *ptr)
{
    attnd_cuda *c;
    if (ptr == NULL || device_cuda(b, &c) != ATTND_ERR_OK) return;
    attnd_cuda_free_later(b, ATTND_CUDA_FREE_IPC, ptr);
}

extern "C" attnd_err attnd_device_host_alloc(attnd_backend *b, size_t bytes, void **ptr)
{
    attnd_cuda *c;
    *ptr = NULL;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    if (cudaMallocHost(ptr, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        *ptr = NULL;
        snprintf(b->last_error, sizeof b->last_error, "cudaMallocHost(%zu): out of memory", bytes);
        return ATTND_ERR_NO_MEMORY;
    }
    return ATTND_ERR_OK;
}

extern "C" void attnd_device_host_free(attnd_backend *b, void *ptr)
{
    attnd_cuda *c;
    if (ptr != NULL && device_cuda(b, &c) == ATTND_ERR_OK)
        attnd_cuda_free_later(b, ATTND_CUDA_FREE_HOST, ptr);
}

extern "C" attnd_err attnd_device_upload(attnd_backend *b, void *dst, const void *src, size_t bytes)
{
    attnd_cuda *c;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    return attnd_cuda_check(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream),
                            "cudaMemcpyAsync (upload)");
}

extern "C" attnd_err attnd_device_fence_record(attnd_backend *b, attnd_fence **fence)
{
    attnd_cuda *c;
    *fence = NULL;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    attnd_fence *f = c->fences;
    if (f != NULL) {
        c->fences = f->next;
    } else {
        if ((f = (attnd_fence *)calloc(1, sizeof *f)) == NULL) return ATTND_ERR_NO_MEMORY;
        rv = attnd_cuda_check(b, cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming),
                              "cudaEventCreate");
        if (rv != ATTND_ERR_OK) {
            free(f);
            return rv;
        }
    }
    if ((rv = attnd_cuda_check(b, cudaEventRecord(f->event, c->stream), "cudaEventRecord"))) {
        attnd_device_fence_release(b, f);
        return rv;
    }
    *fence = f;
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_device_fence_query(attnd_backend *b, attnd_fence *fence)
{
    attnd_cuda *c;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    cudaError_t e = cudaEventQuery(fence->event);
    if (e == cudaErrorNotReady) return ATTND_ERR_TIMEOUT;
    return attnd_cuda_check(b, e, "kernel completion");
}

extern "C" void attnd_device_fence_release(attnd_backend *b, attnd_fence *fence)
{
    attnd_cuda *c;
    if (fence == NULL || device_cuda(b, &c) != ATTND_ERR_OK) return;
    fence->next = c->fences;
    c->fences = fence;
}

extern "C" attnd_err attnd_device_ipc_export(attnd_backend *b, void *ptr, void *handle)
{
    attnd_cuda *c;
    cudaIpcMemHandle_t h;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice")) ||
        (rv = attnd_cuda_check(b, cudaIpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle")))
        return rv;
    memcpy(handle, &h, sizeof h);
    return ATTND_ERR_OK;
}

// cudaDevAttrMpsEnabled: contexts made on the device are shared through MPS (this process is
// an MPS client); the one signal from inside a process (nvidia-smi -q shows it from outside).
extern "C" attnd_err attnd_device_mps(attnd_backend *b, int *active)
{
    attnd_cuda *c;
    int v = 0;
    *active = 0;
    attnd_err rv = device_cuda(b, &c);
    if (rv != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cuda_check(b, cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, c->device),
                               "cudaDeviceGetAttribute(MpsEnabled)")))
        return rv;
    *active = v != 0;
    return ATTND_ERR_OK;
}
