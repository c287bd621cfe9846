/* Tensor handles: registered memory regions (POSIX shm mapped, or CUDA IPC memory opened, once
 * per session) and the resolution of a wire TensorRef into an attnd_tensor.
 *
 * Every reference is checked before a kernel sees it: dtype, dims and shape against what the
 * op expects, strides, 64-bit overflow of shape x strides x element size, alignment, and that
 * every byte the view can touch lies inside its region (or inside the INLINE bytes). No output
 * may share a byte with another tensor of the same request (conservatively: the byte ranges its
 * shape and strides span, in the same memory whatever the region ids). A tensor whose values the
 * daemon reads (lengths, layouts) is copied into daemon memory as it is resolved, from any
 * region kind (device memory through the backend, never dereferenced on the host): checks and
 * kernels then see only that copy, whatever the client writes meanwhile. INLINE outputs get a
 * zeroed host buffer, handed back in the reply. Messages start with the field. */
#ifndef ATTND_STATE_HANDLES_H
#define ATTND_STATE_HANDLES_H

#include <stddef.h>
#include <stdint.h>

#include "attnd.pb-c.h"
#include "attnd/kernels.h"
#include "../core/shmguard.h"

#define ATTND_HANDLES_MAX_OUT 4

typedef struct attnd_region {
    uint32_t id;           /* client-chosen, > 0 */
    int kind;              /* Attnd__RegionKind */
    void *base;            /* mapping (host memory for HOST_SHM, device memory for CUDA_IPC) */
    uint64_t size;         /* bytes the client registered (<= the object's or allocation's size) */
    int fd;                /* HOST_SHM: kept open to notice an object shrunk under us */
    attnd_backend *be;     /* CUDA_IPC: the backend that opened it (and closes it) */
    attnd_shmguard *guard; /* HOST_SHM: watches the mapping (a truncated object reads zeros) */
    int32_t guard_id;      /* its entry there, -1 none */
    uint64_t obj_dev, obj_ino; /* HOST_SHM: the object, whatever name or region id maps it */
    char name[256];
} attnd_region;

/* The code and message of a failed shm_open/fstat/mmap of object name (errno e): NOT_FOUND,
 * PERMISSION_DENIED, NO_MEMORY, else INVALID_ARGUMENT; the message starts "shm_name: ". */
attnd_err attnd_handles_shm_errno(int e, const char *name, char *err, size_t n);
/* INVALID_ARGUMENT unless name is "/name" (no other '/', 2..255 bytes). */
attnd_err attnd_handles_shm_name(const char *name, char *err, size_t n);
/* Map the POSIX shm object name (read-write, shared), watched by guard when not NULL (a client
 * that truncates its object under a request then fails that request, not the daemon).
 * INVALID_ARGUMENT (bad name, size 0, size over the object's), NOT_FOUND, PERMISSION_DENIED,
 * NO_MEMORY, UNAVAILABLE (the guard is full). */
attnd_err attnd_handles_map_shm(attnd_region *r, attnd_shmguard *guard, uint32_t id,
                                const char *name, uint64_t size, char *err, size_t n);
/* Open a CUDA_IPC region: handle_len must be ATTND_IPC_HANDLE_BYTES, size > 0 and at most the
 * size of the allocation the handle maps, which must live on be's device. INVALID_ARGUMENT
 * (naming ipc_handle, size or device), UNSUPPORTED on a backend without CUDA. */
attnd_err attnd_handles_open_ipc(attnd_region *r, attnd_backend *be, uint32_t id,
                                 const void *handle, size_t handle_len, uint64_t size, char *err,
                                 size_t n);
/* Unmap (HOST_SHM) or close (CUDA_IPC) a region. */
void attnd_handles_unmap(attnd_region *r);

/* A dtype mask (attnd_tref_spec.dtypes): ATTND_DT(F32) | ATTND_DT(BF16). */
#define ATTND_DT(x) (1u << ATTND_DTYPE_##x)
#define ATTND_DT_FLOAT (ATTND_DT(F32) | ATTND_DT(F16) | ATTND_DT(BF16))
/* Any size, in attnd_tref_spec.shape. */
#define ATTND_DIM_ANY -1

/* What an op expects of one tensor. */
typedef struct attnd_tref_spec {
    const char *field;             /* names it in messages */
    uint32_t dtypes;               /* mask of ATTND_DT() */
    int32_t ndim;                  /* 1..ATTND_MAX_DIMS */
    int64_t shape[ATTND_MAX_DIMS]; /* -1 = any */
    int output;                    /* written by the op */
    int optional;                  /* a missing reference gives a tensor with data == NULL */
    int snapshot;                  /* the daemon reads its values: resolved to a daemon copy */
} attnd_tref_spec;

#define ATTND_HANDLES_MAX_HOST 8
#define ATTND_HANDLES_MAX_VIEWS 12 /* references of one request */
#define ATTND_HANDLES_MAX_SNAP 4
/* Bytes an index tensor in device memory may span (what one snapshot copies to the host). */
#define ATTND_HANDLES_SNAP_SPAN_MAX ((uint64_t)64 << 20)

/* The client memory one resolved view may touch, for the overlap check. */
typedef struct attnd_view_span {
    const char *field;
    int output;
    uint32_t region;
    uint64_t mem_dev, mem_ino; /* the memory: a HOST_SHM object, or (0, 0) for device memory */
    uint64_t lo, hi;           /* bytes [lo, hi): object offsets, or device addresses */
    uint64_t offset;           /* lo as an offset into the region (for messages) */
} attnd_view_span;

/* A resolved view in host memory (INLINE bytes or a HOST_SHM region): a device backend copies
 * it to device memory before the kernel (attnd_devmem_stage_in) and outputs back after. */
typedef struct attnd_host_view {
    void *host;     /* the view's first byte (the tensor's data pointer) */
    uint64_t bytes; /* first to one past the last byte the view can touch */
    int output;
    void *dev; /* its staging copy, set by the stager */
} attnd_host_view;

/* Per request: the session's regions, the INLINE budget, the INLINE outputs made, and the
 * views that live in host memory. */
typedef struct attnd_handles_req {
    const attnd_region *regions;
    uint32_t nregions;
    uint64_t inline_left; /* INLINE output bytes still allowed */
    uint32_t nout;
    void *out[ATTND_HANDLES_MAX_OUT];
    size_t out_bytes[ATTND_HANDLES_MAX_OUT];
    uint32_t nhost;
    attnd_host_view host[ATTND_HANDLES_MAX_HOST];
    uint32_t nshm; /* HOST_SHM regions the request's views lie in (checked for faults after) */
    const attnd_region *shm[ATTND_HANDLES_MAX_HOST];
    uint32_t nspans; /* the region views resolved so far */
    attnd_view_span spans[ATTND_HANDLES_MAX_VIEWS];
    uint32_t nsnap; /* daemon copies of index tensors (freed by attnd_handles_req_fini) */
    void *snap[ATTND_HANDLES_MAX_SNAP];
} attnd_handles_req;

void attnd_handles_req_init(attnd_handles_req *hr, const attnd_region *regions, uint32_t nregions,
                            uint64_t max_inline_bytes);
/* Free INLINE output buffers still owned (those not taken by the reply) and the snapshots. */
void attnd_handles_req_fini(attnd_handles_req *hr);
/* Resolve ref (NULL = missing) per spec into t. INVALID_ARGUMENT naming both tensors when an
 * output overlaps a tensor resolved before it in hr (or this one, an output, overlaps one). With
 * spec->snapshot, t is a contiguous daemon-owned copy of the view's values (host memory; a
 * device backend stages it like any host view). */
attnd_err attnd_handles_resolve(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                                const attnd_tref_spec *spec, attnd_tensor *t, char *err, size_t n);
/* After the kernels and copies: INVALID_ARGUMENT, naming the region, when one of the request's
 * HOST_SHM regions was truncated by its client meanwhile (what was read or written is void). */
attnd_err attnd_handles_check_faults(const attnd_handles_req *hr, char *err, size_t n);
/* Total bytes of INLINE input data in a request's references (to bound them up front). */
uint64_t attnd_handles_inline_in(const Attnd__TensorRef *const *refs, size_t count);

#endif
