/* The few CUDA driver calls the worker side needs (flag words in device memory, CUDA IPC,
 * stream memory operations, a pointer's allocation), loaded from libcuda.so.1 when used, so that
 * the library needs no CUDA at build or link time. The driver's C ABI is declared here (its types
 * are plain integers and pointers). Knows nothing of the client. */
#ifndef ATTND_CLIENT_CUDA_DRIVER_H
#define ATTND_CLIENT_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef int attnd_cu_result;      /* CUresult: 0 = CUDA_SUCCESS */
typedef uint64_t attnd_cu_devptr; /* CUdeviceptr */
typedef void *attnd_cu_stream;    /* CUstream (== cudaStream_t) */
typedef void *attnd_cu_context;   /* CUcontext */

typedef struct attnd_cu_ipc_handle {
    char reserved[64];
} attnd_cu_ipc_handle;

typedef struct attnd_cu_driver {
    void *lib;
    attnd_cu_result (*ctx_get_current)(attnd_cu_context *);
    attnd_cu_result (*ctx_set_current)(attnd_cu_context);
    attnd_cu_result (*ctx_get_device)(int *);
    attnd_cu_result (*mem_alloc)(attnd_cu_devptr *, size_t);
    attnd_cu_result (*mem_free)(attnd_cu_devptr);
    attnd_cu_result (*memset_d32)(attnd_cu_devptr, unsigned int, size_t);
    attnd_cu_result (*memcpy_dtod_async)(attnd_cu_devptr, attnd_cu_devptr, size_t, attnd_cu_stream);
    attnd_cu_result (*ipc_get)(attnd_cu_ipc_handle *, attnd_cu_devptr);
    attnd_cu_result (*ipc_open)(attnd_cu_devptr *, attnd_cu_ipc_handle, unsigned int);
    attnd_cu_result (*ipc_close)(attnd_cu_devptr);
    attnd_cu_result (*wait32)(attnd_cu_stream, attnd_cu_devptr, uint32_t, unsigned int);
    attnd_cu_result (*write32)(attnd_cu_stream, attnd_cu_devptr, uint32_t, unsigned int);
    attnd_cu_result (*stream_create)(attnd_cu_stream *, unsigned int);
    attnd_cu_result (*stream_destroy)(attnd_cu_stream);
    attnd_cu_result (*stream_sync)(attnd_cu_stream);
    attnd_cu_result (*error_string)(attnd_cu_result, const char **);
    attnd_cu_result (*mem_range)(attnd_cu_devptr *, size_t *, attnd_cu_devptr);
    attnd_cu_result (*pointer_attr)(void *, int, attnd_cu_devptr);
} attnd_cu_driver;

#define ATTND_CU_STREAM_NON_BLOCKING 0x1u
#define ATTND_CU_WAIT_VALUE_EQ 0x1u
#define ATTND_CU_IPC_LAZY_PEER_ACCESS 0x1u
#define ATTND_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define ATTND_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10

/* dlopen libcuda.so.1 and find every call: UNAVAILABLE (no driver) with err saying which. */
attnd_err attnd_cu_load(attnd_cu_driver *d, char *err, size_t n);
void attnd_cu_unload(attnd_cu_driver *d);
/* "<what>: <the driver's name for r>" into err; INTERNAL (OK for r == 0). */
attnd_err attnd_cu_check(const attnd_cu_driver *d, attnd_cu_result r, const char *what, char *err,
                         size_t n);

#endif
