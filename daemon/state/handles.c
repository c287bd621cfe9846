#include "handles.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- regions */

attnd_err attnd_handles_shm_errno(int e, const char *name, char *err, size_t n)
{
    switch (e) {
    case ENOENT:
        return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "shm_name: %s: no such shared memory object",
                          name);
    case EACCES:
    case EPERM:
        return attnd_errf(err, n, ATTND_ERR_PERMISSION_DENIED, "shm_name: %s: permission denied",
                          name);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "shm_name: %s: %s", name, strerror(e));
    default:
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "shm_name: %s: %s", name,
                          strerror(e));
    }
}

attnd_err attnd_handles_shm_name(const char *name, char *err, size_t n)
{
    if (name == NULL) name = "";
    size_t len = strlen(name);
    if (len < 2 || len > 255 || name[0] != '/' || strchr(name + 1, '/') != NULL)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "shm_name: \"%.64s\" must be \"/name\" (no other '/', at most 255 bytes)",
                          name);
    return ATTND_ERR_OK;
}

attnd_err attnd_handles_map_shm(attnd_region *r, attnd_shmguard *guard, uint32_t id,
                                const char *name, uint64_t size, char *err, size_t n)
{
    struct stat st;
    attnd_err rv;
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->guard_id = -1;
    if ((rv = attnd_handles_shm_name(name, err, n)) != ATTND_ERR_OK) return rv;
    if (size == 0) return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "size: 0");
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return attnd_handles_shm_errno(errno, name, err, n);
    if (fstat(fd, &st) != 0) {
        rv = attnd_handles_shm_errno(errno, name, err, n);
        goto fail;
    }
    if (size > (uint64_t)st.st_size || size > SIZE_MAX) {
        rv = attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                        "size: %llu exceeds the object's %lld bytes", (unsigned long long)size,
                        (long long)st.st_size);
        goto fail;
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rv = attnd_handles_shm_errno(errno, name, err, n);
        goto fail;
    }
    if (guard != NULL && (r->guard_id = attnd_shmguard_add(guard, base, (size_t)size)) < 0) {
        munmap(base, (size_t)size);
        rv = attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "region: the SIGBUS guard is full");
        goto fail;
    }
    r->guard = guard;
    r->id = id;
    r->kind = ATTND__REGION_KIND__HOST_SHM;
    r->base = base;
    r->size = size;
    r->fd = fd;
    r->obj_dev = (uint64_t)st.st_dev;
    r->obj_ino = (uint64_t)st.st_ino;
    snprintf(r->name, sizeof r->name, "%s", name);
    return ATTND_ERR_OK;
fail:
    close(fd);
    return rv;
}

attnd_err attnd_handles_open_ipc(attnd_region *r, attnd_backend *be, uint32_t id,
                                 const void *handle, size_t handle_len, uint64_t size, char *err,
                                 size_t n)
{
    void *base;
    uint64_t avail;
    int32_t dev;
    attnd_device_info info;
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->guard_id = -1;
    if (handle_len != ATTND_IPC_HANDLE_BYTES)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "ipc_handle: %zu bytes, expected %d",
                          handle_len, ATTND_IPC_HANDLE_BYTES);
    if (size == 0) return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "size: 0");
    attnd_err rv = attnd_device_ipc_open(be, handle, &base, &avail, &dev);
    if (rv != ATTND_ERR_OK)
        return attnd_errf(err, n, rv, "%s",
                          rv == ATTND_ERR_UNSUPPORTED ? "kind: CUDA_IPC needs the cuda backend"
                                                      : attnd_backend_last_error(be));
    if (attnd_device_query(be, &info) == ATTND_ERR_OK && dev != info.device) {
        rv =
            attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                       "device: the region's memory is on device %d, this daemon runs on device %d",
                       dev, info.device);
    } else if (size > avail) {
        rv = attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                        "size: %llu exceeds the allocation's %llu bytes", (unsigned long long)size,
                        (unsigned long long)avail);
    }
    if (rv != ATTND_ERR_OK) {
        attnd_device_ipc_close(be, base);
        return rv;
    }
    r->id = id;
    r->kind = ATTND__REGION_KIND__CUDA_IPC;
    r->base = base;
    r->size = size;
    r->be = be;
    snprintf(r->name, sizeof r->name, "cuda-ipc:%p", base);
    return ATTND_ERR_OK;
}

void attnd_handles_unmap(attnd_region *r)
{
    if (r->kind == ATTND__REGION_KIND__CUDA_IPC) {
        attnd_device_ipc_close(r->be, r->base);
    } else if (r->base) {
        if (r->guard_id >= 0) attnd_shmguard_remove(r->guard, r->guard_id);
        munmap(r->base, (size_t)r->size);
    }
    r->guard_id = -1;
    if (r->fd >= 0) close(r->fd);
    r->base = NULL;
    r->fd = -1;
}

/* ---------------------------------------------------------------- requests */

void attnd_handles_req_init(attnd_handles_req *hr, const attnd_region *regions, uint32_t nregions,
                            uint64_t max_inline_bytes)
{
    memset(hr, 0, sizeof *hr);
    hr->regions = regions;
    hr->nregions = nregions;
    hr->inline_left = max_inline_bytes;
}

void attnd_handles_req_fini(attnd_handles_req *hr)
{
    for (uint32_t i = 0; i < hr->nout; i++)
        free(hr->out[i]);
    hr->nout = 0;
    for (uint32_t i = 0; i < hr->nsnap; i++)
        free(hr->snap[i]);
    hr->nsnap = 0;
}

uint64_t attnd_handles_inline_in(const Attnd__TensorRef *const *refs, size_t count)
{
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++)
        if (refs[i] && refs[i]->region == 0) total += refs[i]->data.len;
    return total;
}

static void dims_str(const int64_t *d, size_t nd, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (size_t i = 0; i < nd && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static attnd_err check_dtype(const Attnd__TensorRef *ref, const attnd_tref_spec *sp, char *err,
                             size_t n)
{
    int dt = (int)ref->dtype;
    if (dt < 0 || dt >= ATTND_DTYPE_COUNT)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.dtype: %d unknown", sp->field,
                          dt);
    if (!(sp->dtypes & (1u << dt))) {
        char want[64] = "";
        for (int i = 0; i < ATTND_DTYPE_COUNT; i++)
            if (sp->dtypes & (1u << i)) {
                size_t k = strlen(want);
                snprintf(want + k, sizeof want - k, "%s%s", k ? "|" : "",
                         attnd_dtype_name((attnd_dtype)i));
            }
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.dtype: %s not accepted (want %s)",
                          sp->field, attnd_dtype_name((attnd_dtype)dt), want);
    }
    return ATTND_ERR_OK;
}

static attnd_err check_shape(const Attnd__TensorRef *ref, const attnd_tref_spec *sp, char *err,
                             size_t n)
{
    if (ref->n_shape != (size_t)sp->ndim)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.shape: %zu dims, expected %d",
                          sp->field, ref->n_shape, sp->ndim);
    for (int32_t d = 0; d < sp->ndim; d++) {
        int64_t v = ref->shape[d];
        if (v < 0 || v > INT32_MAX)
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.shape[%d]: %lld out of range",
                              sp->field, d, (long long)v);
        if (sp->shape[d] >= 0 && v != sp->shape[d]) {
            char got[96], want[96];
            dims_str(ref->shape, ref->n_shape, got, sizeof got);
            dims_str(sp->shape, (size_t)sp->ndim, want, sizeof want);
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s.shape: %s, expected %s (-1 = any)", sp->field, got, want);
        }
    }
    return ATTND_ERR_OK;
}

static attnd_err check_strides(const Attnd__TensorRef *ref, const attnd_tref_spec *sp,
                               attnd_tensor *t, char *err, size_t n)
{
    int32_t nd = sp->ndim;
    if (ref->n_strides == 0) return ATTND_ERR_OK; /* contiguous, set by attnd_tensor_init */
    if (ref->n_strides != (size_t)nd)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.strides: %zu entries for %d dims",
                          sp->field, ref->n_strides, nd);
    for (int32_t d = 0; d < nd; d++) {
        int64_t s = ref->strides[d];
        if (s < 0)
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s.strides[%d]: %lld is negative", sp->field, d, (long long)s);
        /* overlapping output elements would be written by several threads */
        if (sp->output && s == 0 && t->shape[d] > 1)
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s.strides[%d]: 0 makes output elements overlap", sp->field, d);
        t->strides[d] = s;
    }
    /* kernels walk the innermost dim contiguously; the bounds check below assumes the same */
    if (t->shape[nd - 1] > 1 && t->strides[nd - 1] != 1)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.strides[%d]: innermost stride must be 1", sp->field, nd - 1);
    return ATTND_ERR_OK;
}

/* Bytes from the first to one past the last element the view can touch (0 if empty). */
static attnd_err view_bytes(const attnd_tensor *t, const attnd_tref_spec *sp, uint64_t *bytes,
                            char *err, size_t n)
{
    int64_t span = 0, term, elems, b;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) {
            *bytes = 0;
            return ATTND_ERR_OK;
        }
    }
    for (int32_t d = 0; d < t->ndim; d++) {
        if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &term) ||
            __builtin_add_overflow(span, term, &span))
            goto overflow;
    }
    if (__builtin_add_overflow(span, 1, &elems) ||
        __builtin_mul_overflow(elems, (int64_t)attnd_dtype_size(t->dtype), &b))
        goto overflow;
    *bytes = (uint64_t)b;
    return ATTND_ERR_OK;
overflow:
    return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                      "%s: shape x strides x element size overflows", sp->field);
}

static attnd_err place_inline(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                              const attnd_tref_spec *sp, uint64_t bytes, attnd_tensor *t, char *err,
                              size_t n)
{
    if (ref->offset != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s.offset: must be 0 for INLINE",
                          sp->field);
    if (!sp->output) {
        if (ref->data.len != bytes)
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s.data: %zu bytes, the shape and strides need %llu", sp->field,
                              ref->data.len, (unsigned long long)bytes);
        t->data = ref->data.data;
        return ATTND_ERR_OK;
    }
    if (ref->data.len != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.data: must be empty for an output", sp->field);
    if (bytes > hr->inline_left || hr->nout == ATTND_HANDLES_MAX_OUT)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: %llu INLINE output bytes exceed limits.max_inline_bytes", sp->field,
                          (unsigned long long)bytes);
    void *buf = calloc(1, bytes ? (size_t)bytes : 1);
    if (buf == NULL)
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "%s: cannot allocate %llu bytes", sp->field,
                          (unsigned long long)bytes);
    hr->inline_left -= bytes;
    hr->out[hr->nout] = buf;
    hr->out_bytes[hr->nout++] = (size_t)bytes;
    t->data = buf;
    return ATTND_ERR_OK;
}

/* Remember a HOST_SHM region the request uses (once), for attnd_handles_check_faults. */
static void note_shm_region(attnd_handles_req *hr, const attnd_region *r)
{
    if (r->kind != ATTND__REGION_KIND__HOST_SHM || r->guard_id < 0) return;
    for (uint32_t i = 0; i < hr->nshm; i++)
        if (hr->shm[i] == r) return;
    if (hr->nshm < ATTND_HANDLES_MAX_HOST) hr->shm[hr->nshm++] = r;
}

attnd_err attnd_handles_check_faults(const attnd_handles_req *hr, char *err, size_t n)
{
    for (uint32_t i = 0; i < hr->nshm; i++)
        if (attnd_shmguard_faulted(hr->shm[i]->guard, hr->shm[i]->guard_id))
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "region: %u was truncated by its client during the request: nothing "
                              "read or written there counts (register it again)",
                              hr->shm[i]->id);
    return ATTND_ERR_OK;
}

static const attnd_region *find_region(const attnd_handles_req *hr, uint32_t id)
{
    for (uint32_t i = 0; i < hr->nregions; i++)
        if (hr->regions[i].id == id) return &hr->regions[i];
    return NULL;
}

static attnd_err place_region(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                              const attnd_tref_spec *sp, uint64_t bytes, attnd_tensor *t, char *err,
                              size_t n)
{
    const attnd_region *r = find_region(hr, ref->region);
    struct stat st;
    uint64_t end;
    size_t esz = attnd_dtype_size(t->dtype);
    if (r == NULL)
        return attnd_errf(err, n, ATTND_ERR_NOT_FOUND,
                          "%s.region: %u not registered in this session", sp->field, ref->region);
    if (ref->data.len != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.data: must be empty with a region", sp->field);
    if (ref->offset % esz)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.offset: %llu not aligned to %s (%zu)", sp->field,
                          (unsigned long long)ref->offset, attnd_dtype_name(t->dtype), esz);
    if (__builtin_add_overflow(ref->offset, bytes, &end) || end > r->size)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: bytes %llu..%llu outside region %u (%llu bytes)", sp->field,
                          (unsigned long long)ref->offset, (unsigned long long)ref->offset + bytes,
                          r->id, (unsigned long long)r->size);
    /* a client that truncates its object would make our accesses fault: notice it here (and
     * through the guard, which turned a truncation under an earlier request into zero pages
     * that no longer share anything with the client) */
    if (r->fd >= 0 && (fstat(r->fd, &st) != 0 || (uint64_t)st.st_size < r->size))
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.region: %u shrank below %llu bytes", sp->field, r->id,
                          (unsigned long long)r->size);
    if (r->guard_id >= 0 && attnd_shmguard_faulted(r->guard, r->guard_id))
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s.region: %u was truncated while mapped: register it again", sp->field,
                          r->id);
    note_shm_region(hr, r);
    t->data = (char *)r->base + ref->offset;
    return ATTND_ERR_OK;
}

static int view_in_host(const attnd_handles_req *hr, uint32_t region)
{
    const attnd_region *r = find_region(hr, region);
    return r != NULL && r->kind == ATTND__REGION_KIND__HOST_SHM;
}

static attnd_err note_host_view(attnd_handles_req *hr, void *host, uint64_t bytes,
                                const attnd_tref_spec *sp, char *err, size_t n)
{
    if (hr->nhost == ATTND_HANDLES_MAX_HOST)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s: more than %d host tensors",
                          sp->field, ATTND_HANDLES_MAX_HOST);
    attnd_host_view *v = &hr->host[hr->nhost++];
    v->host = host;
    v->bytes = bytes;
    v->output = sp->output;
    v->dev = NULL;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- overlap */

static int spans_meet(const attnd_view_span *a, const attnd_view_span *b)
{
    return a->mem_dev == b->mem_dev && a->mem_ino == b->mem_ino && a->lo < b->hi && b->lo < a->hi;
}

/* Record the client memory a region view spans; refuse it when it or an earlier view is an
 * output and they share a byte. INLINE views are daemon memory of their own: never shared. */
static attnd_err note_span(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                           const attnd_tref_spec *sp, uint64_t bytes, char *err, size_t n)
{
    const attnd_region *r = ref->region ? find_region(hr, ref->region) : NULL;
    if (r == NULL || bytes == 0) return ATTND_ERR_OK;
    if (hr->nspans == ATTND_HANDLES_MAX_VIEWS)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s: more than %d tensors", sp->field,
                          ATTND_HANDLES_MAX_VIEWS);
    int dev = r->kind == ATTND__REGION_KIND__CUDA_IPC;
    uint64_t base = dev ? (uint64_t)(uintptr_t)r->base : 0;
    attnd_view_span v = {sp->field,
                         sp->output,
                         r->id,
                         dev ? 0 : r->obj_dev,
                         dev ? 0 : r->obj_ino,
                         base + ref->offset,
                         base + ref->offset + bytes,
                         ref->offset};
    for (uint32_t i = 0; i < hr->nspans; i++) {
        const attnd_view_span *o = &hr->spans[i];
        if ((o->output || v.output) && spans_meet(o, &v))
            return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                              "%s: bytes %llu..%llu of region %u overlap %s (bytes %llu..%llu of "
                              "region %u): an output may not share memory with another tensor "
                              "of the request",
                              v.field, (unsigned long long)v.offset,
                              (unsigned long long)(v.offset + bytes), v.region, o->field,
                              (unsigned long long)o->offset,
                              (unsigned long long)(o->offset + (o->hi - o->lo)), o->region);
    }
    hr->spans[hr->nspans++] = v;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- snapshots */

/* Copy t's elements, read at src (host memory) by t's strides, into dst in row-major order.
 * The innermost stride is 1 (check_strides), so each innermost row is one memcpy. */
static void gather(const attnd_tensor *t, const char *src, char *dst)
{
    int32_t nd = t->ndim;
    size_t esz = attnd_dtype_size(t->dtype), row = (size_t)t->shape[nd - 1] * esz;
    int64_t idx[ATTND_MAX_DIMS] = {0}, rows = 1;
    for (int32_t d = 0; d + 1 < nd; d++)
        rows *= t->shape[d];
    for (int64_t i = 0; i < rows; i++) {
        int64_t off = 0;
        for (int32_t d = 0; d + 1 < nd; d++)
            off += idx[d] * t->strides[d];
        memcpy(dst + (size_t)i * row, src + (size_t)off * esz, row);
        for (int32_t d = nd - 2; d >= 0 && ++idx[d] == t->shape[d]; d--)
            idx[d] = 0;
    }
}

/* Bring a device view (bytes from data) to the host in one copy through the region's backend. */
static attnd_err device_to_host(const attnd_region *r, const attnd_tref_spec *sp, const void *data,
                                uint64_t bytes, void **host, char *err, size_t n)
{
    if (bytes > ATTND_HANDLES_SNAP_SPAN_MAX)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: spans %llu bytes of device memory, at most %llu for a tensor the "
                          "daemon reads",
                          sp->field, (unsigned long long)bytes,
                          (unsigned long long)ATTND_HANDLES_SNAP_SPAN_MAX);
    if ((*host = malloc((size_t)bytes)) == NULL)
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "%s: cannot allocate %llu bytes", sp->field,
                          (unsigned long long)bytes);
    attnd_err rv = attnd_backend_memcpy(r->be, *host, data, (size_t)bytes, ATTND_MEMCPY_D2H);
    if (rv == ATTND_ERR_OK) return rv;
    free(*host);
    *host = NULL;
    return attnd_errf(err, n, rv, "%s: copying it from device memory: %s", sp->field,
                      attnd_backend_last_error(r->be));
}

/* Replace t's data by a contiguous daemon-owned copy of its values (t->data: the client's view,
 * bytes its span), noted as a host view: nothing reads the client's memory for them again. */
static attnd_err snapshot(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                          const attnd_tref_spec *sp, uint64_t bytes, attnd_tensor *t, char *err,
                          size_t n)
{
    const attnd_region *r = ref->region ? find_region(hr, ref->region) : NULL;
    void *staged = NULL, *copy;
    const void *src = t->data;
    size_t dense = (size_t)attnd_tensor_numel(t) * attnd_dtype_size(t->dtype);
    attnd_err rv;
    if (hr->nsnap == ATTND_HANDLES_MAX_SNAP)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s: more than %d index tensors",
                          sp->field, ATTND_HANDLES_MAX_SNAP);
    if (r != NULL && r->kind == ATTND__REGION_KIND__CUDA_IPC) {
        if ((rv = device_to_host(r, sp, t->data, bytes, &staged, err, n)) != ATTND_ERR_OK)
            return rv;
        src = staged;
    }
    if ((copy = malloc(dense)) == NULL) {
        free(staged);
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes", sp->field,
                          dense);
    }
    gather(t, src, copy);
    free(staged);
    hr->snap[hr->nsnap++] = copy;
    int64_t shape[ATTND_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    attnd_tensor_init(t, copy, t->dtype, t->ndim, shape);
    return note_host_view(hr, copy, dense, sp, err, n);
}

attnd_err attnd_handles_resolve(attnd_handles_req *hr, const Attnd__TensorRef *ref,
                                const attnd_tref_spec *sp, attnd_tensor *t, char *err, size_t n)
{
    attnd_err rv;
    uint64_t bytes;
    memset(t, 0, sizeof *t);
    if (ref == NULL)
        return sp->optional
                   ? ATTND_ERR_OK
                   : attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s: missing", sp->field);
    if ((rv = check_dtype(ref, sp, err, n)) != ATTND_ERR_OK) return rv;
    if ((rv = check_shape(ref, sp, err, n)) != ATTND_ERR_OK) return rv;
    attnd_tensor_init(t, NULL, (attnd_dtype)ref->dtype, sp->ndim, ref->shape);
    if ((rv = check_strides(ref, sp, t, err, n)) != ATTND_ERR_OK) return rv;
    if ((rv = view_bytes(t, sp, &bytes, err, n)) != ATTND_ERR_OK) return rv;
    if (ref->region == 0)
        rv = place_inline(hr, ref, sp, bytes, t, err, n);
    else
        rv = place_region(hr, ref, sp, bytes, t, err, n);
    if (rv == ATTND_ERR_OK) rv = note_span(hr, ref, sp, bytes, err, n);
    if (rv == ATTND_ERR_OK && bytes > 0 && sp->snapshot && !sp->output)
        rv = snapshot(hr, ref, sp, bytes, t, err, n);
    else if (rv == ATTND_ERR_OK && bytes > 0 && (ref->region == 0 || view_in_host(hr, ref->region)))
        rv = note_host_view(hr, t->data, bytes, sp, err, n);
    /* an empty view still needs a non-NULL pointer: NULL means "absent" to the kernels */
    if (rv == ATTND_ERR_OK && t->data == NULL) t->data = (void *)hr;
    return rv;
}
