#include "step.h"

#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"

void attnd_steps_init(attnd_steps *ss, const attnd_model *m, attnd_devmem *dm, attnd_cache *c)
{
    memset(ss, 0, sizeof *ss);
    ss->next_id = 1;
    ss->model = m;
    ss->dm = dm;
    ss->cache = c;
}

static void step_destroy(attnd_steps *ss, attnd_step *st)
{
    attnd_devmem_index_drop(ss->dm, &st->index);
    free(st->ws);
    free(st->attended);
    free(st->seqs);
    free(st);
}

/* Commit or abort every sequence of the step, then unlink and free it. */
static void step_finish(attnd_steps *ss, attnd_step *st, int commit)
{
    for (uint32_t i = 0; i < st->nseqs; i++) {
        if (commit)
            attnd_cache_commit(ss->cache, st->seqs[i]);
        else
            attnd_cache_abort(ss->cache, st->seqs[i]);
        st->seqs[i]->step = 0;
    }
    attnd_step **pp = &ss->head;
    while (*pp && *pp != st)
        pp = &(*pp)->next;
    if (*pp) *pp = st->next;
    step_destroy(ss, st);
}

void attnd_steps_fini(attnd_steps *ss)
{
    while (ss->head)
        step_finish(ss, ss->head, 0);
}

uint64_t attnd_steps_count(const attnd_steps *ss)
{
    uint64_t n = 0;
    for (const attnd_step *st = ss->head; st; st = st->next)
        n++;
    return n;
}

void attnd_steps_abort_session(attnd_steps *ss, attnd_session *s)
{
    attnd_step *st = ss->head;
    while (st) {
        attnd_step *next = st->next;
        if (st->owner == s->id) step_finish(ss, st, 0);
        st = next;
    }
    s->nsteps = 0;
}

attnd_err attnd_step_find(attnd_steps *ss, const attnd_session *s, uint64_t id, attnd_step **out,
                          char *err, size_t n)
{
    for (attnd_step *st = ss->head; st; st = st->next)
        if (st->id == id && st->owner == s->id) {
            *out = st;
            return ATTND_ERR_OK;
        }
    *out = NULL;
    return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "step: %llu not open in this session",
                      (unsigned long long)id);
}

/* ---------------------------------------------------------------- BeginStep */

/* Look every sequence up and check it can join the step; marks them with its id (so a
 * duplicate shows), unmarked again by step_finish on failure. */
static attnd_err begin_validate(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                                uint32_t n, uint32_t max_step_tokens, attnd_step *st, char *err,
                                size_t en)
{
    const attnd_cfg_geometry *g = &ss->model->geo;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const attnd_step_req *e = &seqs[i];
        attnd_seq *q = e->seq_id ? attnd_cache_find(ss->cache, s->id, e->seq_id) : NULL;
        if (q == NULL)
            return attnd_errf(err, en, e->seq_id ? ATTND_ERR_NOT_FOUND : ATTND_ERR_INVALID_ARGUMENT,
                              "seqs[%zu].seq_id: %llu %s", i, (unsigned long long)e->seq_id,
                              e->seq_id ? "not found in this session" : "is reserved");
        if (q->step == st->id)
            return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT,
                              "seqs[%zu].seq_id: %llu listed twice", i, (unsigned long long)q->id);
        if (q->step)
            return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT,
                              "seqs[%zu].seq_id: %llu is in open step %llu", i,
                              (unsigned long long)q->id, (unsigned long long)q->step);
        if (e->new_tokens == 0)
            return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT, "seqs[%zu].new_tokens: 0", i);
        uint64_t held =
            attnd_cache_blocks_for(ss->cache, (uint64_t)q->num_tokens + e->new_tokens, q->base);
        if (held > g->max_blocks_per_seq)
            return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT,
                              "seqs[%zu].new_tokens: %u on %u tokens would hold %llu blocks, over "
                              "geometry.max_blocks_per_seq (%u)",
                              i, e->new_tokens, q->num_tokens, (unsigned long long)held,
                              g->max_blocks_per_seq);
        total += e->new_tokens;
        q->step = st->id;
        st->seqs[st->nseqs++] = q;
    }
    if (total > max_step_tokens)
        return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT,
                          "seqs: %llu new tokens, over limits.max_step_tokens (%u)",
                          (unsigned long long)total, max_step_tokens);
    return ATTND_ERR_OK;
}

/* Reserve every sequence's tokens (all or nothing) and copy shared partial blocks. */
static attnd_err begin_reserve(attnd_steps *ss, const attnd_step_req *seqs, attnd_step *st,
                               char *err, size_t en)
{
    attnd_cache_copy cow;
    attnd_err rv;
    for (uint32_t i = 0; i < st->nseqs; i++) {
        rv = attnd_cache_reserve(ss->cache, st->seqs[i], seqs[i].new_tokens, &cow);
        if (rv == ATTND_ERR_OK && cow.src >= 0 &&
            (rv = attnd_devmem_copy_block(ss->dm, cow.src, cow.dst)) != ATTND_ERR_OK) {
            attnd_cache_abort(ss->cache, st->seqs[i]);
            return attnd_devmem_kernel_err(ss->dm, rv, "copy-on-write", err, en);
        }
        if (rv != ATTND_ERR_OK)
            return attnd_errf(err, en, rv, "seqs[%u].new_tokens: %u: %s (%u blocks free)", i,
                              seqs[i].new_tokens, attnd_strerror(rv),
                              attnd_cache_blocks_free(ss->cache));
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_step_index(attnd_steps *ss, attnd_step *st, char *err, size_t n)
{
    attnd_err rv = attnd_devmem_index(ss->dm, &st->index, st->ws, st->plan.index_bytes);
    return rv == ATTND_ERR_OK
               ? rv
               : attnd_devmem_kernel_err(ss->dm, rv, "step: uploading block tables", err, n);
}

/* Plan the step into its own workspace (and make its index arrays readable, unless a stream
 * channel keeps them). */
static attnd_err begin_plan(attnd_steps *ss, attnd_step *st, char *err, size_t en)
{
    const attnd_cfg_geometry *g = &ss->model->geo;
    attnd_plan_opts so =
        attnd_plan_opts_for((int32_t)g->block_size, (int32_t)g->num_q_heads,
                            (int32_t)g->num_kv_heads, (int32_t)g->head_size, ss->dm->units);
    attnd_plan_seq *in = calloc(st->nseqs, sizeof *in);
    attnd_err rv = ATTND_ERR_NO_MEMORY;
    if (in == NULL) goto done;
    for (uint32_t i = 0; i < st->nseqs; i++) {
        const attnd_seq *q = st->seqs[i];
        /* from the first block held: positions shift by base blocks, which attention cannot
         * see (cache.h) */
        uint32_t context = q->num_tokens - q->base * (uint32_t)g->block_size;
        in[i] = (attnd_plan_seq){context, q->pend_tokens, q->blocks, q->nblocks};
    }
    size_t bytes = attnd_plan_workspace_size(in, (int32_t)st->nseqs, &so);
    if ((st->ws = malloc(bytes)) == NULL) goto done;
    rv = attnd_plan_build(&st->plan, in, (int32_t)st->nseqs, &so, st->ws, bytes);
done:
    free(in);
    if (rv != ATTND_ERR_OK)
        return attnd_errf(err, en, rv, "step: planning failed: %s", attnd_strerror(rv));
    if (st->plan.workspace_3d > ss->dm->ws3d_bytes)
        return attnd_errf(err, en, ATTND_ERR_INTERNAL,
                          "step: the plan needs %zu bytes of split-KV workspace, %zu exist",
                          st->plan.workspace_3d, ss->dm->ws3d_bytes);
    return st->stream ? ATTND_ERR_OK : attnd_step_index(ss, st, err, en);
}

static attnd_step *step_alloc(const attnd_steps *ss, uint32_t n)
{
    attnd_step *st = calloc(1, sizeof *st);
    if (st == NULL || (st->seqs = calloc(n, sizeof *st->seqs)) == NULL ||
        (st->attended = calloc(ss->model->geo.num_layers, 1)) == NULL) {
        if (st) free(st->seqs);
        free(st);
        return NULL;
    }
    st->index.slot = -1;
    return st;
}

static attnd_err step_open(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                           uint32_t n, uint32_t max_step_tokens, uint32_t stream, attnd_step **out,
                           char *err, size_t en)
{
    attnd_err rv;
    attnd_step *st = step_alloc(ss, n);
    *out = NULL;
    if (st == NULL) return attnd_errf(err, en, ATTND_ERR_NO_MEMORY, "step: out of memory");
    st->id = ss->next_id;
    st->owner = s->id;
    st->stream = stream;
    if ((rv = begin_validate(ss, s, seqs, n, max_step_tokens, st, err, en)) == ATTND_ERR_OK &&
        (rv = begin_reserve(ss, seqs, st, err, en)) == ATTND_ERR_OK)
        rv = begin_plan(ss, st, err, en);
    st->next = ss->head;
    ss->head = st;
    if (rv != ATTND_ERR_OK) {
        step_finish(ss, st, 0); /* aborts what was reserved, unmarks the sequences */
        return rv;
    }
    ss->next_id++;
    s->nsteps++;
    *out = st;
    return ATTND_ERR_OK;
}

attnd_err attnd_step_begin(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                           uint32_t n, uint32_t max_step_tokens, attnd_step **out, char *err,
                           size_t en)
{
    return step_open(ss, s, seqs, n, max_step_tokens, 0, out, err, en);
}

attnd_err attnd_step_begin_stream(attnd_steps *ss, attnd_session *s, const attnd_step_req *seqs,
                                  uint32_t n, uint32_t max_step_tokens, uint32_t stream,
                                  attnd_step **out, char *err, size_t en)
{
    return step_open(ss, s, seqs, n, max_step_tokens, stream, out, err, en);
}

void attnd_step_detach(attnd_steps *ss, attnd_step *st)
{
    attnd_step **pp = &ss->head;
    while (*pp && *pp != st)
        pp = &(*pp)->next;
    if (*pp) *pp = st->next;
    st->next = NULL;
}

void attnd_step_free_detached(attnd_steps *ss, attnd_step *st)
{
    step_destroy(ss, st);
}

/* ---------------------------------------------------------------- Attend */

/* Time and bytes of the kernels one Attend queues, by kind. */
typedef struct kernel_clock {
    uint64_t t, ns[ATTND_METRICS_KERNEL_COUNT], bytes[ATTND_METRICS_KERNEL_COUNT];
    int last;
} kernel_clock;

static uint64_t tensor_bytes(const attnd_tensor *t)
{
    int64_t n = attnd_tensor_numel(t);
    return t->data != NULL && n > 0 ? (uint64_t)n * attnd_dtype_size(t->dtype) : 0;
}

/* Charge the time since the last mark (and bytes) to kind. */
static void clock_mark(kernel_clock *kc, int kind, uint64_t bytes)
{
    uint64_t now = attnd_clock_ns();
    kc->ns[kind] += now - kc->t;
    kc->bytes[kind] += bytes;
    kc->t = now;
    kc->last = kind;
}

static void clock_report(const attnd_steps *ss, const kernel_clock *kc)
{
    if (ss->metrics == NULL) return;
    for (int k = 0; k < ATTND_METRICS_KERNEL_COUNT; k++)
        if (kc->ns[k] != 0 || kc->bytes[k] != 0)
            attnd_metrics_kernel(ss->metrics, (attnd_metrics_kernel_kind)k, kc->ns[k],
                                 kc->bytes[k]);
}

/* KV rows a launch reads, at most: every sequence at the launch's longest length. */
static uint64_t launch_kv_bytes(const attnd_model *m, const attnd_launch *l)
{
    return (uint64_t)l->nseqs * (uint64_t)l->max_seq_len * m->geo.num_kv_heads * m->geo.head_size *
           attnd_dtype_size((attnd_dtype)m->geo.cache_dtype) * 2u;
}

/* Bytes of q and out a launch touches: its rows. */
static uint64_t launch_io_bytes(const attnd_attend_io *io, const attnd_launch *l)
{
    uint64_t q = (uint64_t)io->q.shape[1] * io->q.shape[2] * attnd_dtype_size(io->q.dtype);
    uint64_t o = (uint64_t)io->out.shape[1] * io->out.shape[2] * attnd_dtype_size(io->out.dtype);
    return (uint64_t)l->nrows * (q + o);
}

attnd_plan_layer attnd_step_plan_layer(const attnd_steps *ss, uint32_t layer,
                                       const attnd_attend_io *io)
{
    attnd_plan_layer pl;
    memset(&pl, 0, sizeof pl);
    pl.q = io->q;
    pl.k_new = io->k;
    pl.v_new = io->v;
    pl.out = io->out;
    pl.lse = io->lse;
    pl.k_cache = attnd_devmem_cache(ss->dm, layer, 0);
    pl.v_cache = attnd_devmem_cache(ss->dm, layer, 1);
    attnd_model_layer_opts(ss->model, layer, ss->dm->values, &pl);
    return pl;
}

/* The caller's answer waits for the kernels: with device-resident tensors only (no host
 * copies to make after them) it waits behind a fence, and the executor queues the next request
 * meanwhile; otherwise wait here. */
static attnd_err attend_finish(attnd_steps *ss, int host_views, kernel_clock *kc,
                               attnd_kernel_wait *wait, char *err, size_t n)
{
    attnd_backend *be = ss->dm->be;
    attnd_err rv;
    if (!host_views && attnd_backend_is_device(be) &&
        attnd_device_fence_record(be, &wait->fence) == ATTND_ERR_OK) {
        clock_report(ss, kc);
        wait->what = kc->last == ATTND_METRICS_KERNEL_PAGED_3D   ? "paged_attention_3d"
                     : kc->last == ATTND_METRICS_KERNEL_PAGED_2D ? "paged_attention_2d"
                                                                 : "cache_write";
        wait->kind = kc->last;
        wait->t_ns = attnd_clock_ns();
        return ATTND_ERR_OK;
    }
    /* the reply tells the client its output is ready: wait for the device */
    if ((rv = attnd_backend_sync(be)) != ATTND_ERR_OK)
        return attnd_devmem_kernel_err(ss->dm, rv, "sync", err, n);
    clock_mark(kc, kc->last, 0); /* the device wait belongs to the last kernel queued */
    clock_report(ss, kc);
    return ATTND_ERR_OK;
}

attnd_err attnd_step_attend(attnd_steps *ss, attnd_step *st, uint32_t layer,
                            const attnd_attend_io *io, int host_views, attnd_kernel_wait *wait,
                            char *err, size_t n)
{
    attnd_backend *be = ss->dm->be;
    attnd_plan_layer pl = attnd_step_plan_layer(ss, layer, io);
    attnd_err rv;
    kernel_clock kc = {.t = attnd_clock_ns()};
    if ((rv = attnd_plan_write_kv(be, &st->plan, st->index.dev, &pl)) != ATTND_ERR_OK)
        return attnd_devmem_kernel_err(ss->dm, rv, "cache_write", err, n);
    clock_mark(&kc, ATTND_METRICS_KERNEL_CACHE_WRITE,
               2 * (tensor_bytes(&io->k) + tensor_bytes(&io->v)));
    for (int32_t i = 0; i < st->plan.num_launches; i++) {
        const attnd_launch *l = &st->plan.launches[i];
        int is3d = l->kind == ATTND_LAUNCH_3D;
        if ((rv = attnd_plan_launch(be, &st->plan, st->index.dev, i, &pl, ss->dm->ws3d)))
            return attnd_devmem_kernel_err(
                ss->dm, rv, is3d ? "paged_attention_3d" : "paged_attention_2d", err, n);
        clock_mark(&kc, is3d ? ATTND_METRICS_KERNEL_PAGED_3D : ATTND_METRICS_KERNEL_PAGED_2D,
                   launch_io_bytes(io, l) + launch_kv_bytes(ss->model, l));
    }
    if ((rv = attend_finish(ss, host_views, &kc, wait, err, n)) == ATTND_ERR_OK)
        st->attended[layer] = ATTND_LAYER_ATTENDED;
    return rv;
}

/* ---------------------------------------------------------------- EndStep */

/* Append "A-B" or "A" (a run of layers) to buf[*k..n) after a ", " when not first. */
static void put_run(char *buf, size_t n, size_t *k, uint32_t a, uint32_t b)
{
    int w = a == b ? snprintf(buf + *k, n - *k, "%s%u", *k ? ", " : "", a)
                   : snprintf(buf + *k, n - *k, "%s%u-%u", *k ? ", " : "", a, b);
    *k = w < 0 || (size_t)w >= n - *k ? n - 1 : *k + (size_t)w;
}

/* The layers of st in `state`, as compact runs ("2-5, 9"); their count. */
static uint32_t layer_runs(const attnd_step *st, uint32_t layers, uint8_t state, char *buf,
                           size_t n)
{
    uint32_t count = 0;
    size_t k = 0;
    buf[0] = '\0';
    for (uint32_t l = 0; l < layers; l++) {
        if (st->attended[l] != state) continue;
        uint32_t e = l;
        while (e + 1 < layers && st->attended[e + 1] == state)
            e++;
        put_run(buf, n, &k, l, e);
        count += e - l + 1;
        l = e;
    }
    return count;
}

/* FAILED_PRECONDITION naming the layers not attended, or attended more than once; OK when
 * every layer was attended exactly once. */
static attnd_err check_attended(const attnd_steps *ss, const attnd_step *st, char *err, size_t n)
{
    char open[160], twice[160], missing[192] = "";
    uint32_t L = ss->model->geo.num_layers;
    uint32_t nopen = layer_runs(st, L, ATTND_LAYER_OPEN, open, sizeof open);
    uint32_t ntwice = layer_runs(st, L, ATTND_LAYER_REPEATED, twice, sizeof twice);
    if (nopen == 0 && ntwice == 0) return ATTND_ERR_OK;
    if (nopen)
        snprintf(missing, sizeof missing, "%s%s %s not attended", ntwice ? "; " : "",
                 nopen == 1 ? "layer" : "layers", open);
    if (ntwice == 0)
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "end_step: %s in step %llu (a commit needs every layer attended once: "
                          "attend them, or abort)",
                          missing, (unsigned long long)st->id);
    return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                      "end_step: %s %s attended more than once%s in step %llu (a commit needs "
                      "every layer attended exactly once: abort the step)",
                      ntwice == 1 ? "layer" : "layers", twice, missing, (unsigned long long)st->id);
}

attnd_err attnd_step_layer_check(attnd_step *st, uint32_t layer, char *err, size_t n)
{
    if (st->attended[layer] == ATTND_LAYER_OPEN) return ATTND_ERR_OK;
    st->attended[layer] = ATTND_LAYER_REPEATED;
    return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                      "layer: %u already attended in step %llu (once per layer and step; the "
                      "step can now only be aborted)",
                      layer, (unsigned long long)st->id);
}

void attnd_step_layer_void(attnd_step *st, uint32_t layer)
{
    if (st->attended[layer] == ATTND_LAYER_ATTENDED) st->attended[layer] = ATTND_LAYER_OPEN;
}

attnd_err attnd_step_end(attnd_steps *ss, attnd_session *s, attnd_step *st, int abort, char *err,
                         size_t n)
{
    attnd_err rv = ATTND_ERR_OK;
    if (!abort && (rv = check_attended(ss, st, err, n)) != ATTND_ERR_OK)
        return rv; /* the step stays open */
    step_finish(ss, st, !abort);
    s->nsteps--;
    return rv;
}
