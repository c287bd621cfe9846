/* CUDA backend internals: backend state, error mapping, and one entry per op. */
#ifndef ATTND_CUDA_BACKEND_H
#define ATTND_CUDA_BACKEND_H

#include <cuda_runtime.h>
#include <stdio.h>

#include "attnd/kernels.h"

/* Kernels whose dynamic shared-memory limit this backend raised (cudaFuncSetAttribute applies
 * to the current device, the backend's): raised once, then looked up. */
#define ATTND_CUDA_SMEM_OPTIN_MAX 64
typedef struct attnd_smem_optin {
    const void *fn[ATTND_CUDA_SMEM_OPTIN_MAX];
    int n;
} attnd_smem_optin;

typedef struct attnd_cuda {
    int device;
    cudaStream_t stream;    /* where ops launch: home, or the selected stream (stream.cu) */
    cudaStream_t home;      /* the backend's own stream */
    cudaStream_t release;   /* stream.cu: where releases are written; NULL until needed */
    void *wait32, *write32; /* stream.cu: cuStreamWaitValue32 / cuStreamWriteValue32 */
    int num_sms;
    int max_smem_optin;           /* bytes of shared memory a block may opt into */
    int cc;                       /* compute capability, major * 10 + minor */
    int l2_bytes;                 /* L2 cache size */
    void *encode_tmap;            /* the driver's cuTensorMapEncodeTiled, NULL if not found */
    int paged_core;               /* tests and benches: 0 picks the prefill core by device, 80 or
                                     90 forces the sm80 / sm90 one (90 where it can run) */
    int sm90_off;                 /* tests and benches: ATTND_SM90_NO_* features of the sm90 core
                                     turned off (0, the default: all on) */
    struct attnd_fence *fences;   /* released fences, for reuse (device.cu) */
    struct attnd_stream *streams; /* stream.cu: session streams, live or retired */
    struct attnd_cuda_deferred *deferred; /* stream.cu: frees put off while a stream was busy */
    uint32_t ndeferred;
    attnd_smem_optin optin; /* kernels opted into more shared memory (paged/launch_impl.cuh) */
    /* Split-KV merge tickets (paged/launch.cu), per stream: ATTND_CUDA_TICKETS words zeroed once
     * at allocation (the stream's first split launch), each reset by the merge that used it. */
    unsigned *tickets;         /* the home stream's; NULL until needed */
    unsigned **stream_tickets; /* the selected stream's slot (stream.cu); NULL: the home one */
    int split_reduce; /* tests and benches: 1 merges split-KV partials with the reduce kernel */
    /* benches, in builds with ATTND_DECODE_TIMELINE only: 3D decode launches record 8 words per
     * CTA here (paged/mainloop_sm80.cuh); NULL: none */
    unsigned long long *decode_timeline;
} attnd_cuda;

/* Tickets per stream: a split launch with more (q-block, kv head) pairs uses the reduce kernel. */
#define ATTND_CUDA_TICKETS 16384

/* What a deferred free releases (stream.cu): cudaFree, cudaFreeHost, cudaIpcCloseMemHandle. */
typedef enum attnd_cuda_free_kind {
    ATTND_CUDA_FREE_DEVICE = 0,
    ATTND_CUDA_FREE_HOST = 1,
    ATTND_CUDA_FREE_IPC = 2,
} attnd_cuda_free_kind;

/* A fence is a timing-free CUDA event; released ones wait in attnd_cuda.fences. */
struct attnd_fence {
    cudaEvent_t event;
    struct attnd_fence *next;
};

static inline attnd_cuda *attnd_cuda_of(attnd_backend *b)
{
    return (attnd_cuda *)b->impl;
}

/* Map a CUDA error to INTERNAL with a message naming what failed; OK for cudaSuccess. */
static inline attnd_err attnd_cuda_check(attnd_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return ATTND_ERR_OK;
    snprintf(b->last_error, sizeof b->last_error, "%s: %s", what, cudaGetErrorString(e));
    return ATTND_ERR_INTERNAL;
}

/* After a launch: report a bad configuration or an earlier asynchronous fault. */
static inline attnd_err attnd_cuda_check_launch(attnd_backend *b, const char *kernel)
{
    return attnd_cuda_check(b, cudaGetLastError(), kernel);
}

#ifdef __cplusplus
extern "C" {
#endif
attnd_err attnd_cuda_paged_2d(attnd_backend *b, const attnd_paged_params *p);
attnd_err attnd_cuda_paged_3d(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments,
                              void *workspace);
attnd_err attnd_cuda_cache_write(attnd_backend *b, const attnd_cache_write_params *p);
attnd_err attnd_cuda_merge_states(attnd_backend *b, const attnd_merge_params *p);
attnd_err attnd_cuda_varlen(attnd_backend *b, const attnd_varlen_params *p);
attnd_err attnd_cuda_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p);
attnd_err attnd_cuda_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p);
attnd_err attnd_cuda_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p);
/* cudaFree, cudaFreeHost and cudaIpcCloseMemHandle wait for the whole device, so for every
 * session stream: one waiting on a flag another process has not written yet would stall the
 * caller until it is written, or forever. Free ptr now when no session stream has work queued,
 * else keep it for attnd_cuda_collect (stream.cu). */
void attnd_cuda_free_later(attnd_backend *b, attnd_cuda_free_kind kind, void *ptr);
/* Run the deferred frees when no session stream is busy (force: regardless, at close); returns
 * how many are still deferred. */
uint32_t attnd_cuda_collect(attnd_backend *b, int force);
/* At close: the deferred frees (dropped, not run, while a stream is still busy: one that never
 * drained would make them wait forever), then what is left of the session streams. */
void attnd_cuda_streams_close(attnd_backend *b);
#ifdef __cplusplus
}
#endif

#endif
