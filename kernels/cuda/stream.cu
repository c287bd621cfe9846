// Streams on the cuda backend (kernels.h "streams"): CUDA streams beside the backend's own, and
// the driver's stream memory operations on 32-bit flag words, reached through the runtime's
// driver entry points (no libcuda link).
#include <cuda.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "stream_impl.h"

struct attnd_stream {
    cudaStream_t stream;
    cudaEvent_t after;         // attnd_stream_after_backend: recorded on the backend's stream; once
                               // retired, on the stream itself, marking the end of its work
    int retired;               // destroyed with work still queued: kept until `after` completes
    unsigned *tickets;         // split-KV merge tickets (cuda_backend.h); NULL until needed
    struct attnd_stream *next; // attnd_cuda.streams
};

struct attnd_cuda_deferred {
    attnd_cuda_free_kind kind;
    void *ptr;
    struct attnd_cuda_deferred *next;
};

typedef CUresult (*value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static attnd_err driver_fn(attnd_backend *b, const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (*fn != NULL) return ATTND_ERR_OK;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || *fn == NULL) {
        cudaGetLastError();
        *fn = NULL;
        snprintf(b->last_error, sizeof b->last_error, "streams: the driver has no %s", name);
        return ATTND_ERR_UNSUPPORTED;
    }
    return ATTND_ERR_OK;
}

static attnd_err driver_check(attnd_backend *b, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS) return ATTND_ERR_OK;
    snprintf(b->last_error, sizeof b->last_error, "%s: CUresult %d", what, (int)r);
    return ATTND_ERR_INTERNAL;
}

extern "C" attnd_err attnd_cuda_stream_create(attnd_backend *b, attnd_stream **out)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_err rv;
    *out = NULL;
    if ((rv = driver_fn(b, "cuStreamWaitValue32", &c->wait32)) != ATTND_ERR_OK ||
        (rv = driver_fn(b, "cuStreamWriteValue32", &c->write32)) != ATTND_ERR_OK)
        return rv;
    attnd_stream *s = (attnd_stream *)calloc(1, sizeof *s);
    if (s == NULL) return ATTND_ERR_NO_MEMORY;
    if ((rv = attnd_cuda_check(b, cudaSetDevice(c->device), "cudaSetDevice")) == ATTND_ERR_OK &&
        (rv = attnd_cuda_check(b, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                               "cudaStreamCreate")) == ATTND_ERR_OK &&
        (rv = attnd_cuda_check(b, cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming),
                               "cudaEventCreate")) != ATTND_ERR_OK)
        cudaStreamDestroy(s->stream);
    if (rv != ATTND_ERR_OK) {
        free(s);
        return rv;
    }
    s->next = c->streams;
    c->streams = s;
    *out = s;
    return ATTND_ERR_OK;
}

static void stream_unlink_free(attnd_cuda *c, attnd_stream *s)
{
    attnd_stream **pp = &c->streams;
    while (*pp != NULL && *pp != s)
        pp = &(*pp)->next;
    if (*pp != NULL) *pp = s->next;
    cudaEventDestroy(s->after);
    free(s);
}

extern "C" void attnd_cuda_stream_destroy(attnd_backend *b, attnd_stream *s)
{
    attnd_cuda *c = attnd_cuda_of(b);
    if (c->stream == s->stream) {
        c->stream = c->home;
        c->stream_tickets = NULL;
    }
    cudaSetDevice(c->device);
    if (s->tickets != NULL) attnd_cuda_free_later(b, ATTND_CUDA_FREE_DEVICE, s->tickets);
    s->tickets = NULL;
    // work still queued finishes on its own; until it has, frees stay deferred
    cudaError_t e = cudaStreamQuery(s->stream);
    int busy = e == cudaErrorNotReady;
    if (busy && (e = cudaEventRecord(s->after, s->stream)) != cudaSuccess) busy = 0;
    if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError(); // not for the next launch
    cudaStreamDestroy(s->stream);
    s->stream = NULL;
    s->retired = 1;
    if (!busy) stream_unlink_free(c, s);
}

/* 1 while a session stream (live, or retired with work left) has work queued; retired ones
 * whose work ended are freed on the way. */
static int streams_busy(attnd_cuda *c)
{
    int busy = 0;
    for (attnd_stream *s = c->streams, *next; s != NULL; s = next) {
        next = s->next;
        cudaError_t e = s->retired ? cudaEventQuery(s->after) : cudaStreamQuery(s->stream);
        if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError();
        if (e == cudaErrorNotReady)
            busy = 1;
        else if (s->retired)
            stream_unlink_free(c, s);
    }
    return busy;
}

static void free_now(attnd_cuda_free_kind kind, void *ptr)
{
    cudaError_t e = kind == ATTND_CUDA_FREE_DEVICE ? cudaFree(ptr)
                    : kind == ATTND_CUDA_FREE_HOST ? cudaFreeHost(ptr)
                                                   : cudaIpcCloseMemHandle(ptr);
    if (e != cudaSuccess) cudaGetLastError(); // a free that failed leaves nothing to report
}

extern "C" uint32_t attnd_cuda_collect(attnd_backend *b, int force)
{
    attnd_cuda *c = attnd_cuda_of(b);
    if (c->deferred == NULL || (!force && streams_busy(c))) return c->ndeferred;
    cudaSetDevice(c->device);
    while (c->deferred != NULL) {
        attnd_cuda_deferred *d = c->deferred;
        c->deferred = d->next;
        free_now(d->kind, d->ptr);
        free(d);
    }
    c->ndeferred = 0;
    return 0;
}

extern "C" void attnd_cuda_free_later(attnd_backend *b, attnd_cuda_free_kind kind, void *ptr)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_cuda_deferred *d = NULL;
    cudaSetDevice(c->device);
    if (c->streams == NULL || !streams_busy(c)) {
        attnd_cuda_collect(b, 1);
        free_now(kind, ptr);
        return;
    }
    if ((d = (attnd_cuda_deferred *)malloc(sizeof *d)) == NULL) {
        free_now(kind, ptr); // no memory to remember it: free it and risk the wait
        return;
    }
    d->kind = kind;
    d->ptr = ptr;
    d->next = c->deferred;
    c->deferred = d;
    c->ndeferred++;
}

extern "C" attnd_err attnd_cuda_stream_select(attnd_backend *b, attnd_stream *s)
{
    attnd_cuda *c = attnd_cuda_of(b);
    c->stream = s != NULL ? s->stream : c->home;
    c->stream_tickets = s != NULL ? &s->tickets : NULL;
    return ATTND_ERR_OK;
}

extern "C" attnd_err attnd_cuda_stream_value(attnd_backend *b, attnd_stream *s, int write,
                                             uint32_t *flag, uint32_t count, uint32_t value)
{
    attnd_cuda *c = attnd_cuda_of(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)flag;
    if (write && count > 1 && value == 0) { /* a step's resets: one memset, not count writes */
        cudaError_t e = cudaMemsetAsync(flag, 0, (size_t)count * sizeof *flag, s->stream);
        if (e != cudaSuccess) cudaGetLastError(); /* not sticky: clear it for the next call */
        return attnd_cuda_check(b, e, "cudaMemsetAsync (flag words)");
    }
    for (uint32_t i = 1; write && i < count; i++) {
        attnd_err rv = attnd_cuda_stream_value(b, s, 1, flag + i, 1, value);
        if (rv != ATTND_ERR_OK) return rv;
    }
    if (write)
        return driver_check(
            b,
            ((value32_fn)c->write32)((CUstream)s->stream, p, value, CU_STREAM_WRITE_VALUE_DEFAULT),
            "cuStreamWriteValue32");
    return driver_check(
        b, ((value32_fn)c->wait32)((CUstream)s->stream, p, value, CU_STREAM_WAIT_VALUE_EQ),
        "cuStreamWaitValue32");
}

extern "C" attnd_err attnd_cuda_stream_after_backend(attnd_backend *b, attnd_stream *s)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_err rv = attnd_cuda_check(b, cudaEventRecord(s->after, c->home), "cudaEventRecord");
    if (rv != ATTND_ERR_OK) return rv;
    return attnd_cuda_check(b, cudaStreamWaitEvent(s->stream, s->after, 0), "cudaStreamWaitEvent");
}

// The release stream: highest priority, never given a wait, so a write queued there runs
// whatever the session streams wait for.
static attnd_err release_stream(attnd_backend *b, attnd_cuda *c)
{
    int least = 0, greatest = 0;
    attnd_err rv;
    if (c->release != NULL) return ATTND_ERR_OK;
    if ((rv = driver_fn(b, "cuStreamWriteValue32", &c->write32)) != ATTND_ERR_OK) return rv;
    if ((rv = attnd_cuda_check(b, cudaDeviceGetStreamPriorityRange(&least, &greatest),
                               "cudaDeviceGetStreamPriorityRange")) != ATTND_ERR_OK)
        return rv;
    return attnd_cuda_check(
        b, cudaStreamCreateWithPriority(&c->release, cudaStreamNonBlocking, greatest),
        "cudaStreamCreateWithPriority");
}

extern "C" attnd_err attnd_cuda_stream_release(attnd_backend *b, uint32_t *flag, uint32_t value)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_err rv = release_stream(b, c);
    if (rv != ATTND_ERR_OK) return rv;
    return driver_check(b,
                        ((value32_fn)c->write32)((CUstream)c->release, (CUdeviceptr)(uintptr_t)flag,
                                                 value, CU_STREAM_WRITE_VALUE_DEFAULT),
                        "cuStreamWriteValue32 (release)");
}

extern "C" void attnd_cuda_streams_close(attnd_backend *b)
{
    attnd_cuda *c = attnd_cuda_of(b);
    for (attnd_stream *s = c->streams; s != NULL; s = s->next)
        if (s->tickets != NULL) {
            attnd_cuda_free_later(b, ATTND_CUDA_FREE_DEVICE, s->tickets);
            s->tickets = NULL;
        }
    // a stream that never drained (quarantined) would hold a device-wide free forever: the
    // process is ending, so leave that memory to the driver's teardown
    if (attnd_cuda_collect(b, 0) != 0)
        while (c->deferred != NULL) {
            attnd_cuda_deferred *d = c->deferred;
            c->deferred = d->next;
            free(d);
        }
    c->ndeferred = 0;
    while (c->streams != NULL) {
        attnd_stream *s = c->streams;
        if (!s->retired) cudaStreamDestroy(s->stream);
        stream_unlink_free(c, s);
    }
}

extern "C" attnd_err attnd_cuda_stream_query(attnd_backend *b, attnd_stream *s)
{
    cudaError_t e = cudaStreamQuery(s->stream);
    if (e == cudaErrorNotReady) return ATTND_ERR_TIMEOUT;
    return attnd_cuda_check(b, e, "stream");
}
