/* Stream channels (stream-ordered steps, same GPU): OpenStream, StreamBegin, the per-layer
 * signal / wait as stream memory operations on the caller's CUDA stream, StreamEnd, CloseStream.
 * The worker's flag words (o) are allocated here: device memory through the CUDA driver (loaded
 * at open, cuda_driver.h) for a CUDA daemon, followed by their reset values (0; 1 once released:
 * then every later reset keeps them released), a registered shm object for a CPU one; the daemon's
 * (qkv) are mapped from its reply (CUDA IPC, or its shm object). On a CPU daemon the "stream" is
 * the calling thread: a signal is a store, a wait polls. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attnd/clock.h"
#include "client_int.h"
#include "cuda_driver.h"

struct attnd_client_stream {
    attnd_client *c;
    uint32_t id, layers, timeout_ms;
    int cuda;   /* a CUDA daemon: flag words in device memory */
    int failed; /* a step was released: only close is left (atomic: the lost hook sets it) */
    struct attnd_client_stream *next; /* the client's open channels (streams_mu) */
    /* CPU daemon */
    attnd_shm o_shm;
    uint32_t *qkv_host;
    size_t qkv_bytes;
    /* CUDA daemon */
    attnd_cu_driver cu;
    attnd_cu_devptr o_dev, qkv_dev;
    attnd_cu_devptr o_reset; /* [layers] what the step's last wait copies over the o words */
    uint32_t o_region;
    attnd_cu_stream release; /* the worker's own releases of its o words */
    attnd_cu_context ctx;    /* where o_dev and release live (the lost hook's thread has none) */
};

static size_t flag_bytes(uint32_t layers)
{
    size_t b = (size_t)layers * sizeof(uint32_t);
    return b < 512 ? 512 : b;
}

/* ---------------------------------------------------------------- the worker's o words */

static attnd_err o_host(attnd_client_stream *s)
{
    return attnd_client_shm_create(s->c, flag_bytes(s->layers), &s->o_shm);
}

static attnd_err o_cuda(attnd_client_stream *s)
{
    char err[256];
    attnd_cu_driver *d = &s->cu;
    attnd_cu_context ctx = NULL;
    attnd_cu_ipc_handle h;
    int dev = 0;
    size_t bytes = flag_bytes(s->layers);
    attnd_err rv = attnd_cu_load(d, err, sizeof err);
    /* one allocation: the o words (the registered region), then their reset values (never
     * exported: the region is the first `bytes` only) */
    if (rv == ATTND_ERR_OK && (d->ctx_get_current(&ctx) != 0 || ctx == NULL))
        rv = attnd_errf(err, sizeof err, ATTND_ERR_FAILED_PRECONDITION,
                        "stream: no current CUDA context in this thread (use CUDA here first)");
    s->ctx = ctx;
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->mem_alloc(&s->o_dev, 2 * bytes), "cuMemAlloc", err, sizeof err);
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->memset_d32(s->o_dev, 0, 2 * bytes / 4), "cuMemsetD32", err,
                            sizeof err);
    s->o_reset = s->o_dev + bytes;
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->ipc_get(&h, s->o_dev), "cuIpcGetMemHandle", err, sizeof err);
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->ctx_get_device(&dev), "cuCtxGetDevice", err, sizeof err);
    if (rv == ATTND_ERR_OK)
        rv = attnd_cu_check(d, d->stream_create(&s->release, ATTND_CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate", err, sizeof err);
    if (rv != ATTND_ERR_OK) return attnd_client_fail(s->c, rv, "%s", err);
    s->o_region = attnd_client_region_next_id(s->c);
    if ((rv = attnd_client_region_register_cuda(s->c, s->o_region, &h, bytes, dev)) != ATTND_ERR_OK)
        s->o_region = 0;
    return rv;
}

/* ---------------------------------------------------------------- the daemon's qkv words */

static attnd_err qkv_host(attnd_client_stream *s, const char *name, uint64_t bytes)
{
    struct stat st;
    int fd = name && name[0] ? shm_open(name, O_RDWR, 0) : -1;
    if (fd < 0) return attnd_client_fail(s->c, ATTND_ERR_PROTOCOL, "open_stream: shm_open: %m");
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes ||
        bytes < (uint64_t)s->layers * sizeof(uint32_t)) {
        close(fd);
        return attnd_client_fail(s->c, ATTND_ERR_PROTOCOL, "open_stream: flag object too small");
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return attnd_client_fail(s->c, ATTND_ERR_NO_MEMORY, "open_stream: mmap: %m");
    s->qkv_host = p;
    s->qkv_bytes = (size_t)bytes;
    return ATTND_ERR_OK;
}

static attnd_err qkv_cuda(attnd_client_stream *s, const ProtobufCBinaryData *handle)
{
    char err[256];
    attnd_cu_ipc_handle h;
    if (handle->len != sizeof h.reserved)
        return attnd_client_fail(s->c, ATTND_ERR_PROTOCOL, "open_stream: no qkv_ipc_handle");
    memcpy(h.reserved, handle->data, sizeof h.reserved);
    attnd_err rv =
        attnd_cu_check(&s->cu, s->cu.ipc_open(&s->qkv_dev, h, ATTND_CU_IPC_LAZY_PEER_ACCESS),
                       "cuIpcOpenMemHandle (the daemon's flags)", err, sizeof err);
    return rv == ATTND_ERR_OK ? rv : attnd_client_fail(s->c, rv, "%s", err);
}

/* ---------------------------------------------------------------- open, close */

static attnd_err open_rpc(attnd_client_stream *s)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__OpenStream m = ATTND__OPEN_STREAM__INIT;
    Attnd__TensorRef o = ATTND__TENSOR_REF__INIT;
    Attnd__Reply *rep;
    int64_t shape[1] = {s->layers};
    attnd_err rv;
    o.region = s->cuda ? s->o_region : s->o_shm.region;
    o.dtype = ATTND__DTYPE__I32;
    o.n_shape = 1;
    o.shape = shape;
    m.o_flags = &o;
    req.body_case = ATTND__REQUEST__BODY_OPEN_STREAM;
    req.open_stream = &m;
    if ((rv = attnd_client_rpc(s->c, &req, &rep)) != ATTND_ERR_OK) return rv;
    const Attnd__OpenStreamReply *r =
        rep->body_case == ATTND__REPLY__BODY_STREAM ? rep->stream : NULL;
    if (r == NULL || r->stream == 0 || r->num_layers != s->layers) {
        attnd__reply__free_unpacked(rep, NULL);
        return attnd_client_fail(s->c, ATTND_ERR_PROTOCOL, "open_stream: reply without a stream");
    }
    s->id = r->stream;
    s->timeout_ms = r->timeout_ms;
    rv = s->cuda ? qkv_cuda(s, &r->qkv_ipc_handle) : qkv_host(s, r->qkv_shm_name, r->qkv_bytes);
    attnd__reply__free_unpacked(rep, NULL);
    return rv;
}

static void close_rpc(attnd_client_stream *s)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CloseStream m = ATTND__CLOSE_STREAM__INIT;
    Attnd__Reply *rep;
    attnd_client_error saved;
    m.stream = s->id;
    req.body_case = ATTND__REQUEST__BODY_CLOSE_STREAM;
    req.close_stream = &m;
    attnd_client_error_save(s->c, &saved);
    if (attnd_client_rpc(s->c, &req, &rep) == ATTND_ERR_OK) attnd__reply__free_unpacked(rep, NULL);
    attnd_client_error_restore(s->c, &saved);
}

/* Unmap the daemon's words, then drop the worker's (kept when the daemon still holds them). */
static void stream_release_memory(attnd_client_stream *s)
{
    if (s->qkv_host != NULL) munmap(s->qkv_host, s->qkv_bytes);
    if (s->o_shm.base != NULL) attnd_client_shm_destroy(s->c, &s->o_shm);
    if (!s->cuda || s->cu.lib == NULL) return;
    if (s->qkv_dev) s->cu.ipc_close(s->qkv_dev);
    if (s->release) {
        s->cu.stream_sync(s->release);
        s->cu.stream_destroy(s->release);
    }
    int freeable = 1;
    if (s->o_region) freeable = attnd_client_region_unregister(s->c, s->o_region) == ATTND_ERR_OK;
    if (s->o_dev && freeable) s->cu.mem_free(s->o_dev);
    attnd_cu_unload(&s->cu);
}

attnd_err attnd_client_stream_open(attnd_client *c, attnd_client_stream **out)
{
    const attnd_server_info *si = attnd_client_server(c);
    *out = NULL;
    if (si == NULL)
        return attnd_client_fail(c, ATTND_ERR_UNAVAILABLE, "open_stream: no session (Hello first)");
    attnd_client_stream *s = calloc(1, sizeof *s);
    if (s == NULL) return attnd_client_fail(c, ATTND_ERR_NO_MEMORY, "open_stream: out of memory");
    s->c = c;
    s->layers = si->geometry.num_layers;
    s->cuda = strcmp(si->backend, "cuda") == 0;
    attnd_err rv = s->cuda ? o_cuda(s) : o_host(s);
    if (rv == ATTND_ERR_OK) rv = open_rpc(s);
    if (rv != ATTND_ERR_OK) {
        attnd_client_error saved;
        attnd_client_error_save(c, &saved);
        if (s->id) close_rpc(s);
        stream_release_memory(s);
        attnd_client_error_restore(c, &saved);
        free(s);
        return rv;
    }
    pthread_mutex_lock(&c->streams_mu);
    s->next = c->streams;
    c->streams = s;
    pthread_mutex_unlock(&c->streams_mu);
    *out = s;
    return ATTND_ERR_OK;
}

void attnd_client_stream_close(attnd_client_stream *s)
{
    if (s == NULL) return;
    pthread_mutex_lock(&s->c->streams_mu);
    for (attnd_client_stream **p = &s->c->streams; *p != NULL; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&s->c->streams_mu);
    close_rpc(s);
    stream_release_memory(s);
    free(s);
}

uint32_t attnd_client_stream_id(const attnd_client_stream *s)
{
    return s->id;
}

int attnd_client_stream_failed(const attnd_client_stream *s)
{
    return __atomic_load_n(&s->failed, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- StreamBegin */

#define LAYER_REFS 5

/* The wire form of one layer's tensors (pb points into store and into l's refs). */
static attnd_err layer_to_pb(attnd_client *c, const attnd_stream_layer *l, Attnd__StreamLayer *pb,
                             Attnd__TensorRef *store)
{
    const attnd_ref *refs[LAYER_REFS] = {l->q, l->k_new, l->v_new, l->out, l->out_lse};
    const char *names[LAYER_REFS] = {"q", "k_new", "v_new", "out", "out_lse"};
    Attnd__TensorRef **slots[LAYER_REFS] = {&pb->q, &pb->k_new, &pb->v_new, &pb->out, &pb->out_lse};
    attnd__stream_layer__init(pb);
    for (int i = 0; i < LAYER_REFS; i++) {
        if (refs[i] == NULL) continue;
        attnd_err rv = attnd_client_ref_to_pb(c, names[i], refs[i], i >= 3, &store[i]);
        if (rv != ATTND_ERR_OK) return rv;
        *slots[i] = &store[i];
    }
    return ATTND_ERR_OK;
}

/* Everything a StreamBegin message points to. */
typedef struct begin_msg {
    Attnd__StepSeq *items, **seqs;
    Attnd__StreamLayer *layers, **lptrs;
    Attnd__TensorRef *refs;
} begin_msg;

static void begin_msg_free(begin_msg *b)
{
    free(b->items);
    free(b->seqs);
    free(b->layers);
    free(b->lptrs);
    free(b->refs);
}

static attnd_err begin_fill(attnd_client_stream *s, const attnd_step_seq *seqs, size_t n,
                            const attnd_stream_layer *layers, size_t nl, begin_msg *b,
                            Attnd__StreamBegin *m)
{
    b->items = calloc(n ? n : 1, sizeof *b->items);
    b->seqs = calloc(n ? n : 1, sizeof *b->seqs);
    b->layers = calloc(nl ? nl : 1, sizeof *b->layers);
    b->lptrs = calloc(nl ? nl : 1, sizeof *b->lptrs);
    b->refs = calloc((nl ? nl : 1) * LAYER_REFS, sizeof *b->refs);
    if (!b->items || !b->seqs || !b->layers || !b->lptrs || !b->refs)
        return attnd_client_fail(s->c, ATTND_ERR_NO_MEMORY, "stream_begin: out of memory");
    for (size_t i = 0; i < n; i++) {
        attnd__step_seq__init(&b->items[i]);
        b->items[i].seq_id = seqs[i].seq_id;
        b->items[i].new_tokens = seqs[i].new_tokens;
        b->seqs[i] = &b->items[i];
    }
    for (size_t l = 0; l < nl; l++) {
        attnd_err rv = layer_to_pb(s->c, &layers[l], &b->layers[l], &b->refs[l * LAYER_REFS]);
        if (rv != ATTND_ERR_OK) return rv;
        b->lptrs[l] = &b->layers[l];
    }
    m->stream = s->id;
    m->n_seqs = n;
    m->seqs = b->seqs;
    m->n_layers = nl;
    m->layers = b->lptrs;
    return ATTND_ERR_OK;
}

attnd_err attnd_client_stream_begin(attnd_client_stream *s, const attnd_step_seq *seqs, size_t n,
                                    const attnd_stream_layer *layers, size_t nlayers,
                                    attnd_step *step, uint32_t *query_start_loc)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StreamBegin m = ATTND__STREAM_BEGIN__INIT;
    Attnd__Reply *rep = NULL;
    begin_msg b = {0};
    attnd_err rv = begin_fill(s, seqs, n, layers, nlayers, &b, &m);
    if (rv == ATTND_ERR_OK) {
        req.body_case = ATTND__REQUEST__BODY_STREAM_BEGIN;
        req.stream_begin = &m;
        rv = attnd_client_rpc(s->c, &req, &rep);
    }
    if (rv == ATTND_ERR_OK) rv = attnd_client_step_from_pb(s->c, rep, n, step, query_start_loc);
    if (rv == ATTND_ERR_FAILED_PRECONDITION && strstr(attnd_client_last_error(s->c), "released"))
        __atomic_store_n(&s->failed, 1, __ATOMIC_RELEASE);
    if (rep != NULL) attnd__reply__free_unpacked(rep, NULL);
    begin_msg_free(&b);
    return rv;
}

/* ---------------------------------------------------------------- per layer */

static attnd_err layer_check(attnd_client_stream *s, uint32_t layer, void *stream, const char *what)
{
    if (layer >= s->layers)
        return attnd_client_fail(s->c, ATTND_ERR_INVALID_ARGUMENT, "%s: layer %u out of range (%u)",
                                 what, layer, s->layers);
    if (!s->cuda && stream != NULL)
        return attnd_client_fail(s->c, ATTND_ERR_INVALID_ARGUMENT,
                                 "%s: a CPU daemon takes no CUDA stream (pass NULL)", what);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_stream_signal(attnd_client_stream *s, uint32_t layer, void *stream)
{
    char err[256];
    attnd_err rv = layer_check(s, layer, stream, "stream_signal");
    if (rv != ATTND_ERR_OK) return rv;
    if (!s->cuda) {
        __atomic_store_n(&s->qkv_host[layer], 1u, __ATOMIC_RELEASE);
        return ATTND_ERR_OK;
    }
    rv = attnd_cu_check(&s->cu, s->cu.write32(stream, s->qkv_dev + 4u * layer, 1, 0),
                        "cuStreamWriteValue32", err, sizeof err);
    return rv == ATTND_ERR_OK ? rv : attnd_client_fail(s->c, rv, "stream_signal: %s", err);
}

/* CPU daemon: poll the o word (a short spin, then 20 us naps) until 1, at most timeout_ms. */
static attnd_err wait_host(attnd_client_stream *s, uint32_t layer)
{
    uint32_t *w = (uint32_t *)s->o_shm.base + layer;
    uint64_t end = attnd_clock_ms() + s->timeout_ms + 5000u;
    for (uint32_t i = 0; __atomic_load_n(w, __ATOMIC_ACQUIRE) != 1u; i++) {
        if (attnd_clock_ms() > end)
            return attnd_client_fail(s->c, ATTND_ERR_TIMEOUT,
                                     "stream_wait: layer %u's output never came", layer);
        if (i > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    __atomic_store_n(w, 0u, __ATOMIC_RELEASE);
    if (__atomic_load_n(&s->failed, __ATOMIC_ACQUIRE))
        return attnd_client_fail(s->c, ATTND_ERR_UNAVAILABLE,
                                 "stream_wait: layer %u was released (the step failed or the "
                                 "connection to the daemon was lost): its output is void",
                                 layer);
    return ATTND_ERR_OK;
}

attnd_err attnd_client_stream_wait(attnd_client_stream *s, uint32_t layer, void *stream)
{
    char err[256];
    attnd_err rv = layer_check(s, layer, stream, "stream_wait");
    if (rv != ATTND_ERR_OK) return rv;
    if (!s->cuda) return wait_host(s, layer);
    attnd_cu_devptr w = s->o_dev + 4u * layer;
    rv = attnd_cu_check(&s->cu, s->cu.wait32(stream, w, 1, ATTND_CU_WAIT_VALUE_EQ),
                        "cuStreamWaitValue32", err, sizeof err);
    /* the step's last wait resets every o word (one operation per step) by copying their reset
     * values: after it, nothing of this step writes them (the daemon's writes came before the
     * waits passed), and the next step's come after its signals, queued behind this; a release
     * set the reset values to 1 first, so a step queued behind a failed one passes too */
    if (rv == ATTND_ERR_OK && layer == s->layers - 1)
        rv = attnd_cu_check(&s->cu,
                            s->cu.memcpy_dtod_async(s->o_dev, s->o_reset, 4u * s->layers, stream),
                            "cuMemcpyDtoDAsync", err, sizeof err);
    return rv == ATTND_ERR_OK ? rv : attnd_client_fail(s->c, rv, "stream_wait: %s", err);
}

attnd_err attnd_client_attend_async(attnd_client_stream *s, uint32_t layer, void *stream)
{
    attnd_err rv = attnd_client_stream_signal(s, layer, stream);
    return rv == ATTND_ERR_OK ? attnd_client_stream_wait(s, layer, stream) : rv;
}

/* ---------------------------------------------------------------- StreamEnd */

/* Write every word of `words` ([layers], device) to 1 on the release stream and wait for it. */
static void write_ones(attnd_client_stream *s, attnd_cu_devptr words)
{
    for (uint32_t l = 0; l < s->layers; l++)
        s->cu.write32(s->release, words + 4u * l, 1, 0);
    s->cu.stream_sync(s->release);
}

/* The step did not end as planned: write every o word from here, so that no wait queued on the
 * caller's stream stalls (what follows reads garbage: the step's outputs are void). On CUDA the
 * reset values go to 1 first, so the resets of steps the caller's stream still runs (a step
 * launched ahead of this one's StreamEnd) keep the words released; a reset already copying when
 * the words were written could clear them once more, so they are written again a moment later.
 * Any thread may release (NNG's, a binding's worker thread): the channel's context is made
 * current for it. */
static void release_own(attnd_client_stream *s)
{
    __atomic_store_n(&s->failed, 1, __ATOMIC_RELEASE);
    if (!s->cuda) {
        for (uint32_t l = 0; l < s->layers; l++)
            __atomic_store_n((uint32_t *)s->o_shm.base + l, 1u, __ATOMIC_RELEASE);
        return;
    }
    if (s->cu.ctx_set_current(s->ctx) != 0) return; /* nothing to write with */
    write_ones(s, s->o_reset);
    write_ones(s, s->o_dev);
    struct timespec ts = {0, 2000000}; /* 2 ms: far longer than a 512-byte copy runs */
    nanosleep(&ts, NULL);
    write_ones(s, s->o_dev);
}

void attnd_client_stream_release(attnd_client_stream *s)
{
    if (s == NULL) return;
    release_own(s);
}

void attnd_client_streams_lost(void *client)
{
    attnd_client *c = client;
    pthread_mutex_lock(&c->streams_mu);
    for (attnd_client_stream *s = c->streams; s != NULL; s = s->next) {
        release_own(s);
    }
    pthread_mutex_unlock(&c->streams_mu);
}

attnd_err attnd_client_stream_end(attnd_client_stream *s, uint64_t step, int abort)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StreamEnd m = ATTND__STREAM_END__INIT;
    Attnd__Reply *rep;
    int32_t budget = (int32_t)s->timeout_ms + 10000; /* the daemon answers by its deadline */
    m.stream = s->id;
    m.step = step;
    m.abort = abort != 0;
    req.body_case = ATTND__REQUEST__BODY_STREAM_END;
    req.stream_end = &m;
    attnd_err rv = attnd_client_rpc_timeout(s->c, &req, &rep, budget);
    if (rv == ATTND_ERR_OK) {
        attnd__reply__free_unpacked(rep, NULL);
        return rv;
    }
    if (rv != ATTND_ERR_NOT_FOUND && rv != ATTND_ERR_INVALID_ARGUMENT) release_own(s);
    return rv;
}
