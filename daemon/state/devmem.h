/* Device memory: everything the daemon keeps in backend memory, allocated once at start so
 * that no request allocates device memory on its fast path. Per layer the K and V pools and the
 * linear-attention state; every layer's ALiBi slopes and sinks; the split-KV workspace every 3D
 * launch shares; the index slots that hold open steps' plan arrays (uploaded once per step,
 * page-locked staging); the staging buffer for host tensors a device backend must copy. Also the
 * device's health: a GPU error marks it failed, and no more kernel work is served.
 *
 * On a host backend (cpu) "device memory" is host memory and uploads are no-ops. Executor
 * thread only. Errors come back as attnd_err with a message in the caller's buffer. */
#ifndef ATTND_STATE_DEVMEM_H
#define ATTND_STATE_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "../core/config.h"
#include "../core/log.h"
#include "attnd/kernels.h"
#include "handles.h"
#include "model.h"

/* Where the backend reads one open step's plan index arrays. */
typedef struct attnd_index_ref {
    void *dev;    /* the arrays as the backend sees them */
    int32_t slot; /* device backends: the index slot holding them, -1 none */
    void *own;    /* device backends: their own copy when too large for a slot */
} attnd_index_ref;

typedef struct attnd_devmem {
    attnd_backend *be;
    attnd_log *log;
    const attnd_model *model;
    int32_t units;             /* parallel units the planner fills (cpu threads, SMs) */
    void **k_cache, **v_cache; /* [num_layers] */
    void **lin_state;          /* [num_layers] [slots][heads][dim][dim] f32, NULL if no slots */
    float *values;             /* the model's per-layer values (attnd_model.values), NULL if none */
    void *ws3d;                /* split-KV workspace of the 3D launches */
    size_t ws3d_bytes;         /* it holds split_rows rows x segments */
    int32_t split_rows;        /* the planner's bound on a 3D launch's rows x segments */
    void *index_dev;           /* device backends: [index_slots] slots of plan index arrays */
    size_t index_slot_bytes;
    uint32_t index_slots;
    void *index_host;                 /* [index_slots] page-locked staging of each upload */
    struct attnd_fence **index_fence; /* [index_slots] after the slot's last upload, or NULL */
    attnd_index_ref **index_owner;    /* [index_slots] the step whose arrays a slot holds */
    uint64_t *index_used;             /* [index_slots] last use, for LRU reuse */
    uint64_t index_clock;
    void *stage;            /* device copies of host tensors (grows on demand) */
    size_t stage_bytes;     /* its size */
    uint64_t device_bytes;  /* memory taken at start (pools, workspaces, slots) */
    char device_name[64];   /* "" on the cpu backend */
    int device_failed;      /* a GPU error left the device unusable: no more kernel work */
    char device_error[512]; /* what failed */
} attnd_devmem;

/* Size and allocate everything for model on be (which must outlive dm). units: the cpu
 * backend's threads, >= 1 (a device backend counts its SMs). On a device backend
 * geometry.gpu_memory_fraction, when set, sizes model->geo.num_blocks from the free memory
 * first. limits size the index slots. NO_MEMORY, or the backend's code. */
attnd_err attnd_devmem_alloc(attnd_devmem **dm, attnd_model *model, attnd_backend *be,
                             int32_t units, const attnd_cfg_limits *limits, attnd_log *lg);
void attnd_devmem_free(attnd_devmem *dm);

/* INTERNAL naming the earlier GPU error when the device failed; OK otherwise. */
attnd_err attnd_devmem_usable(const attnd_devmem *dm, char *err, size_t n);
/* A kernel's (or copy's) failure as "<what>: <backend message>"; returns code. On a device
 * backend an INTERNAL code (a CUDA error) also marks the device failed. */
attnd_err attnd_devmem_kernel_err(attnd_devmem *dm, attnd_err code, const char *what, char *err,
                                  size_t n);

/* Host data the kernels read: used in place on host backends, copied to device memory
 * otherwise (*dev != host then; release with attnd_devmem_release). */
attnd_err attnd_devmem_upload(attnd_devmem *dm, const void *host, size_t bytes, void **dev);
void attnd_devmem_release(attnd_devmem *dm, void *dev, const void *host);
attnd_err attnd_devmem_zero(attnd_devmem *dm, void *dev, size_t bytes);

/* Copy block src to dst in every layer's K and V pools (copy-on-write). */
attnd_err attnd_devmem_copy_block(attnd_devmem *dm, int32_t src, int32_t dst);
/* Copy linear state slot src to dst in every layer (fork). */
attnd_err attnd_devmem_copy_linear(attnd_devmem *dm, int32_t src, int32_t dst);
/* Zero linear state slot `slot` in every layer (a slot newly given to a sequence). */
attnd_err attnd_devmem_zero_linear(attnd_devmem *dm, int32_t slot);
/* Layer `layer`'s K (v 0) or V (v 1) pool as a tensor. */
attnd_tensor attnd_devmem_cache(const attnd_devmem *dm, uint32_t layer, int v);

/* Make a step's plan index arrays (bytes from host, its plan workspace) readable by the
 * backend in ref->dev: in place on host backends; on device backends in an index slot uploaded
 * once (again only when more steps are open than there are slots and ref's slot was reused),
 * without waiting for the kernels queued before. ref starts as {NULL, -1, NULL}. */
attnd_err attnd_devmem_index(attnd_devmem *dm, attnd_index_ref *ref, const void *host,
                             size_t bytes);
/* Give up ref's slot (or own copy): its step is gone. */
void attnd_devmem_index_drop(attnd_devmem *dm, attnd_index_ref *ref);

/* Device backends: copy the host views hr noted (INLINE bytes, HOST_SHM regions) to device
 * memory and point every tensor of ts whose data is such a view at its copy (outputs are
 * copied too, so that bytes a strided view skips come back unchanged). No-op on host
 * backends. Call after every content check on host data, right before the kernel. */
attnd_err attnd_devmem_stage_in(attnd_devmem *dm, attnd_handles_req *hr, attnd_tensor *const *ts,
                                size_t nts, char *err, size_t n);
/* After the kernel finished: copy the staged outputs back to their host views, then
 * INVALID_ARGUMENT if a HOST_SHM region the request used was truncated by its client meanwhile
 * (attnd_handles_check_faults). Every backend calls it. */
attnd_err attnd_devmem_stage_out(attnd_devmem *dm, attnd_handles_req *hr, char *err, size_t n);

#endif
