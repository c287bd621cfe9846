// The CUDA backend: one device, one stream, device memory, and the ops table.
#include <stdlib.h>

#include "cuda_backend.h"

static attnd_err cuda_open(attnd_backend *b, const attnd_backend_opts *opts)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(b->last_error, sizeof b->last_error, "cuda: no device");
        return ATTND_ERR_UNAVAILABLE;
    }
    if (opts->device < 0 || opts->device >= count) {
        snprintf(b->last_error, sizeof b->last_error, "device: %d out of range (0..%d)",
                 opts->device, count - 1);
        return ATTND_ERR_INVALID_ARGUMENT;
    }
    attnd_cuda *c = (attnd_cuda *)calloc(1, sizeof *c);
    if (c == NULL) return ATTND_ERR_NO_MEMORY;
    c->device = opts->device;
    attnd_err rv = attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice");
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(b, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                              "cudaStreamCreate");
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(
            b, cudaDeviceGetAttribute(&c->num_sms, cudaDevAttrMultiProcessorCount, c->device),
            "cudaDeviceGetAttribute");
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(b,
                              cudaDeviceGetAttribute(&c->max_smem_optin,
                                                     cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                     c->device),
                              "cudaDeviceGetAttribute");
    int major = 0, minor = 0;
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(
            b, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device),
            "cudaDeviceGetAttribute");
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(
            b, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device),
            "cudaDeviceGetAttribute");
    if (rv == ATTND_ERR_OK)
        rv = attnd_cuda_check(
            b, cudaDeviceGetAttribute(&c->l2_bytes, cudaDevAttrL2CacheSize, c->device),
            "cudaDeviceGetAttribute");
    if (rv != ATTND_ERR_OK) {
        free(c);
        return rv;
    }
    c->cc = major * 10 + minor;
    c->home = c->stream;
    // TMA descriptors are encoded by the driver; without it the sm90 core is not used
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &c->encode_tmap, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        c->encode_tmap = NULL;
    }
    b->impl = c;
    return ATTND_ERR_OK;
}

static void cuda_close(attnd_backend *b)
{
    attnd_cuda *c = attnd_cuda_of(b);
    cudaSetDevice(c->device);
    c->stream = c->home;
    cudaStreamSynchronize(c->stream);
    if (c->tickets != NULL) attnd_cuda_free_later(b, ATTND_CUDA_FREE_DEVICE, c->tickets);
    attnd_cuda_streams_close(b);
    cudaStreamDestroy(c->stream);
    if (c->release != NULL) cudaStreamDestroy(c->release);
    while (c->fences != NULL) {
        attnd_fence *f = c->fences;
        c->fences = f->next;
        cudaEventDestroy(f->event);
        free(f);
    }
    free(c);
}

static attnd_err cuda_alloc(attnd_backend *b, size_t bytes, void **ptr)
{
    cudaSetDevice(attnd_cuda_of(b)->device);
    if (cudaMalloc(ptr, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        *ptr = NULL;
        snprintf(b->last_error, sizeof b->last_error, "cudaMalloc(%zu): out of device memory",
                 bytes);
        return ATTND_ERR_NO_MEMORY;
    }
    return ATTND_ERR_OK;
}

static void cuda_free(attnd_backend *b, void *ptr)
{
    if (ptr != NULL) attnd_cuda_free_later(b, ATTND_CUDA_FREE_DEVICE, ptr);
}

static attnd_err cuda_memcpy(attnd_backend *b, void *dst, const void *src, size_t bytes,
                             attnd_memcpy_kind kind)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                           cudaMemcpyDeviceToDevice};
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_err rv = attnd_cuda_check(b, cudaMemcpyAsync(dst, src, bytes, kinds[kind], c->stream),
                                    "cudaMemcpyAsync");
    if (rv != ATTND_ERR_OK) return rv;
    return attnd_cuda_check(b, cudaStreamSynchronize(c->stream), "cudaMemcpy sync");
}

static attnd_err cuda_sync(attnd_backend *b)
{
    return attnd_cuda_check(b, cudaStreamSynchronize(attnd_cuda_of(b)->stream),
                            "cudaStreamSynchronize");
}

extern "C" const attnd_backend_ops attnd_cuda_backend_ops = {
    "cuda",
    1,
    cuda_open,
    cuda_close,
    cuda_alloc,
    cuda_free,
    cuda_memcpy,
    cuda_sync,
    attnd_cuda_paged_2d,
    attnd_cuda_paged_3d,
    attnd_cuda_cache_write,
    attnd_cuda_merge_states,
    attnd_cuda_varlen,
    attnd_cuda_blocksparse,
    attnd_cuda_linear_prefill,
    attnd_cuda_linear_decode,
    ATTND_FEATURE_SINKS | ATTND_FEATURE_F32_CACHE,
};
