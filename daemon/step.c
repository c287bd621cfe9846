#include "step.h"

#include <stdlib.h>
#include <string.h>

#include "attnd/plan.h"
#include "metrics.h"

#define DT(x) (1u << ATTND_DTYPE_##x)
#define DT_FLOAT (DT(F32) | DT(F16) | DT(BF16))

typedef struct attnd_step {
    uint64_t id, owner;
    uint32_t nseqs;
    attnd_seq **seqs;
    void *ws; /* host plan workspace */
    attnd_plan plan;
    void *dev_index;  /* the plan's index arrays where the backend reads them */
    int32_t slot;     /* device backends: the index slot (ops) holding them, -1 none */
    void *dev_own;    /* device backends: their own copy when too large for a slot */
    uint8_t *written; /* [num_layers]: an Attend wrote this layer's K/V */
    struct attnd_step *next;
} attnd_step;

static void step_destroy(attnd_ops *o, attnd_step *st)
{
    if (st->slot >= 0 && o->index_owner[st->slot] == st) o->index_owner[st->slot] = NULL;
    attnd_backend_free(o->be, st->dev_own);
    free(st->ws);
    free(st->written);
    free(st->seqs);
    free(st);
}

/* Commit or abort every sequence of the step, then free it. */
static void step_finish(attnd_ops *o, attnd_step *st, int commit)
{
    for (uint32_t i = 0; i < st->nseqs; i++) {
        if (commit)
            attnd_cache_commit(o->cache, st->seqs[i]);
        else
            attnd_cache_abort(o->cache, st->seqs[i]);
        st->seqs[i]->step = 0;
    }
    attnd_step **pp = &o->steps;
    while (*pp && *pp != st)
        pp = &(*pp)->next;
    if (*pp) *pp = st->next;
    step_destroy(o, st);
}

static attnd_step *step_find(attnd_ops *o, uint64_t owner, uint64_t id)
{
    for (attnd_step *st = o->steps; st; st = st->next)
        if (st->id == id && st->owner == owner) return st;
    return NULL;
}

uint64_t attnd_step_count(const attnd_ops *o)
{
    uint64_t n = 0;
    for (const attnd_step *st = o->steps; st; st = st->next)
        n++;
    return n;
}

void attnd_step_abort_session(attnd_ops *o, attnd_session *s)
{
    attnd_step *st = o->steps;
    while (st) {
        attnd_step *next = st->next;
        if (st->owner == s->id) step_finish(o, st, 0);
        st = next;
    }
    s->nsteps = 0;
}

void attnd_step_free_all(attnd_ops *o)
{
    while (o->steps)
        step_finish(o, o->steps, 0);
}

/* ---------------------------------------------------------------- BeginStep */

/* Look every sequence up and check it can join step id; marks them with the id (so a
 * duplicate shows), unmarked again by the caller on failure. */
static attnd_err begin_validate(attnd_ops *o, attnd_session *s, const Attnd__BeginStep *m,
                                uint64_t id, attnd_step *st, attnd_ops_reply *r)
{
    uint64_t total = 0;
    uint64_t cap = (uint64_t)o->geo.max_blocks_per_seq * o->geo.block_size;
    for (size_t i = 0; i < m->n_seqs; i++) {
        const Attnd__StepSeq *e = m->seqs[i];
        attnd_seq *q = e->seq_id ? attnd_cache_find(o->cache, s->id, e->seq_id) : NULL;
        if (q == NULL)
            return attnd_ops_fail(r, e->seq_id ? ATTND_ERR_NOT_FOUND : ATTND_ERR_INVALID_ARGUMENT,
                                  "seqs[%zu].seq_id: %llu %s", i, (unsigned long long)e->seq_id,
                                  e->seq_id ? "not found in this session" : "is reserved");
        if (q->step == id)
            return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                  "seqs[%zu].seq_id: %llu listed twice", i,
                                  (unsigned long long)q->id);
        if (q->step)
            return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                  "seqs[%zu].seq_id: %llu is in open step %llu", i,
                                  (unsigned long long)q->id, (unsigned long long)q->step);
        if (e->new_tokens == 0)
            return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seqs[%zu].new_tokens: 0", i);
        if ((uint64_t)q->num_tokens + e->new_tokens > cap)
            return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                                  "seqs[%zu].new_tokens: %u on %u tokens exceeds %llu "
                                  "(geometry.max_blocks_per_seq x block_size)",
                                  i, e->new_tokens, q->num_tokens, (unsigned long long)cap);
        total += e->new_tokens;
        q->step = id;
        st->seqs[st->nseqs++] = q;
    }
    if (total > o->limits.max_step_tokens)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                              "seqs: %llu new tokens, over limits.max_step_tokens (%u)",
                              (unsigned long long)total, o->limits.max_step_tokens);
    return ATTND_ERR_OK;
}

static attnd_err copy_block(attnd_ops *o, int32_t src, int32_t dst)
{
    size_t b = attnd_ops_block_bytes(o);
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < o->geo.num_layers && rv == ATTND_ERR_OK; l++) {
        char *k = o->k_cache[l], *v = o->v_cache[l];
        rv = attnd_backend_memcpy(o->be, k + (size_t)dst * b, k + (size_t)src * b, b,
                                  ATTND_MEMCPY_D2D);
        if (rv == ATTND_ERR_OK)
            rv = attnd_backend_memcpy(o->be, v + (size_t)dst * b, v + (size_t)src * b, b,
                                      ATTND_MEMCPY_D2D);
    }
    return rv;
}

/* Reserve every sequence's tokens (all or nothing) and copy shared partial blocks. */
static attnd_err begin_reserve(attnd_ops *o, const Attnd__BeginStep *m, attnd_step *st,
                               attnd_ops_reply *r)
{
    attnd_cache_copy cow;
    attnd_err rv;
    for (uint32_t i = 0; i < st->nseqs; i++) {
        rv = attnd_cache_reserve(o->cache, st->seqs[i], m->seqs[i]->new_tokens, &cow);
        if (rv == ATTND_ERR_OK && cow.src >= 0 &&
            (rv = copy_block(o, cow.src, cow.dst)) != ATTND_ERR_OK) {
            attnd_cache_abort(o->cache, st->seqs[i]);
            return attnd_ops_kernel_fail(o, r, rv, "copy-on-write");
        }
        if (rv != ATTND_ERR_OK)
            return attnd_ops_fail(r, rv, "seqs[%u].new_tokens: %u: %s (%u blocks free)", i,
                                  m->seqs[i]->new_tokens, attnd_strerror(rv),
                                  attnd_cache_blocks_free(o->cache));
    }
    return ATTND_ERR_OK;
}

/* A slot for st's index arrays: a free one, else the least recently used (its step uploads
 * again when it next runs). */
static int32_t index_slot_pick(attnd_ops *o)
{
    int32_t best = 0;
    for (uint32_t i = 0; i < o->index_slots; i++) {
        if (o->index_owner[i] == NULL) return (int32_t)i;
        if (o->index_used[i] < o->index_used[best]) best = (int32_t)i;
    }
    return best;
}

/* Upload a plan's arrays into index slot `slot` without waiting for the kernels queued before
 * (they may still read the slot's last owner; the copy runs after them, in stream order), so
 * the executor keeps the GPU fed across steps. The slot's page-locked staging is rewritten only
 * once its previous upload ran. */
static attnd_err index_upload(attnd_ops *o, int32_t slot, void *dst, const void *src, size_t bytes)
{
    attnd_err rv = ATTND_ERR_OK;
    void *host = (char *)o->index_host + (size_t)slot * o->index_slot_bytes;
    if (o->index_fence[slot] != NULL &&
        attnd_device_fence_query(o->be, o->index_fence[slot]) == ATTND_ERR_TIMEOUT)
        rv = attnd_backend_sync(o->be);
    attnd_device_fence_release(o->be, o->index_fence[slot]);
    o->index_fence[slot] = NULL;
    if (rv != ATTND_ERR_OK) return rv;
    memcpy(host, src, bytes);
    if ((rv = attnd_device_upload(o->be, dst, host, bytes)) != ATTND_ERR_OK) return rv;
    return attnd_device_fence_record(o->be, &o->index_fence[slot]);
}

/* Make st's index arrays readable by the backend: host backends read the plan in place; device
 * backends keep them in a slot uploaded at BeginStep (once per step, not per layer) and upload
 * again only when more steps are open than there are slots and st's slot was reused. */
static attnd_err step_index(attnd_ops *o, attnd_step *st)
{
    size_t bytes = st->plan.index_bytes;
    attnd_err rv;
    if (!attnd_backend_is_device(o->be)) {
        st->dev_index = st->ws;
        return ATTND_ERR_OK;
    }
    if (st->dev_own != NULL) return ATTND_ERR_OK;
    if (st->slot >= 0 && o->index_owner[st->slot] == st) {
        o->index_used[st->slot] = ++o->index_clock;
        return ATTND_ERR_OK;
    }
    if (o->index_slots == 0 || bytes > o->index_slot_bytes) {
        /* limits raised by a reload past what the slots were sized for */
        if ((rv = attnd_backend_alloc(o->be, bytes, &st->dev_own)) != ATTND_ERR_OK) return rv;
        st->dev_index = st->dev_own;
        return attnd_backend_memcpy(o->be, st->dev_own, st->ws, bytes, ATTND_MEMCPY_H2D);
    }
    int32_t slot = index_slot_pick(o);
    void *dst = (char *)o->index_dev + (size_t)slot * o->index_slot_bytes;
    if (o->index_owner[slot] != NULL) o->index_owner[slot]->slot = -1;
    o->index_owner[slot] = NULL;
    if ((rv = index_upload(o, slot, dst, st->ws, bytes)) != ATTND_ERR_OK) return rv;
    o->index_owner[slot] = st;
    o->index_used[slot] = ++o->index_clock;
    st->slot = slot;
    st->dev_index = dst;
    return ATTND_ERR_OK;
}

static attnd_err begin_plan(attnd_ops *o, attnd_step *st, attnd_ops_reply *r)
{
    attnd_plan_opts so =
        attnd_plan_opts_for((int32_t)o->geo.block_size, (int32_t)o->geo.num_q_heads,
                            (int32_t)o->geo.num_kv_heads, (int32_t)o->geo.head_size, o->units);
    attnd_plan_seq *in = calloc(st->nseqs, sizeof *in);
    attnd_err rv = ATTND_ERR_NO_MEMORY;
    if (in == NULL) goto done;
    for (uint32_t i = 0; i < st->nseqs; i++) {
        const attnd_seq *q = st->seqs[i];
        in[i] = (attnd_plan_seq){q->num_tokens, q->pend_tokens, q->blocks, q->nblocks};
    }
    size_t bytes = attnd_plan_workspace_size(in, (int32_t)st->nseqs, &so);
    if (bytes == 0 || (st->ws = malloc(bytes)) == NULL) goto done;
    if ((rv = attnd_plan_build(&st->plan, in, (int32_t)st->nseqs, &so, st->ws, bytes))) goto done;
    if (st->plan.workspace_3d > o->ws3d_bytes) {
        free(in);
        return attnd_ops_fail(r, ATTND_ERR_INTERNAL,
                              "step: the plan needs %zu bytes of split-KV workspace, %zu exist",
                              st->plan.workspace_3d, o->ws3d_bytes);
    }
    if ((rv = step_index(o, st)) != ATTND_ERR_OK) {
        free(in);
        return attnd_ops_kernel_fail(o, r, rv, "step: uploading block tables");
    }
done:
    free(in);
    return rv == ATTND_ERR_OK
               ? rv
               : attnd_ops_fail(r, rv, "step: planning failed: %s", attnd_strerror(rv));
}

static attnd_err begin_reply(attnd_step *st, attnd_ops_reply *r)
{
    Attnd__BeginStepReply *b = &r->step;
    attnd__begin_step_reply__init(b);
    b->query_start_loc = malloc((size_t)(st->nseqs + 1) * sizeof(uint32_t));
    if (b->query_start_loc == NULL)
        return attnd_ops_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
    for (uint32_t i = 0; i <= st->nseqs; i++)
        b->query_start_loc[i] = (uint32_t)st->plan.query_start_loc[i];
    b->n_query_start_loc = st->nseqs + 1;
    b->step = st->id;
    b->num_tokens = (uint32_t)st->plan.num_tokens;
    r->reply.body_case = ATTND__REPLY__BODY_STEP;
    r->reply.step = b;
    return ATTND_ERR_OK;
}

attnd_err attnd_step_begin(attnd_ops *o, attnd_session *s, const Attnd__BeginStep *m,
                           attnd_ops_reply *r)
{
    attnd_err rv;
    if (m->n_seqs == 0) return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "seqs: empty");
    if (m->n_seqs > o->limits.max_seqs)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT,
                              "seqs: %zu entries, over "
                              "limits.max_seqs (%u)",
                              m->n_seqs, o->limits.max_seqs);
    if (s->nsteps >= o->limits.max_steps)
        return attnd_ops_fail(r, ATTND_ERR_UNAVAILABLE,
                              "step: session has limits.max_steps (%u) "
                              "open",
                              o->limits.max_steps);
    attnd_step *st = calloc(1, sizeof *st);
    if (st == NULL || (st->seqs = calloc(m->n_seqs, sizeof *st->seqs)) == NULL ||
        (st->written = calloc(o->geo.num_layers, 1)) == NULL) {
        if (st) free(st->seqs);
        free(st);
        return attnd_ops_fail(r, ATTND_ERR_NO_MEMORY, "step: out of memory");
    }
    st->id = o->next_step;
    st->owner = s->id;
    st->slot = -1;
    if ((rv = begin_validate(o, s, m, st->id, st, r)) == ATTND_ERR_OK &&
        (rv = begin_reserve(o, m, st, r)) == ATTND_ERR_OK &&
        (rv = begin_plan(o, st, r)) == ATTND_ERR_OK)
        rv = begin_reply(st, r);
    st->next = o->steps;
    o->steps = st;
    if (rv != ATTND_ERR_OK) {
        step_finish(o, st, 0); /* aborts what was reserved, unmarks the sequences */
        return rv;
    }
    o->next_step++;
    s->nsteps++;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- Attend */

typedef struct attend_io {
    attnd_tensor q, k, v, out, lse;
} attend_io;

static attnd_err attend_resolve(attnd_ops *o, attnd_step *st, const Attnd__Attend *m,
                                attnd_handles_req *hr, attend_io *io, attnd_ops_reply *r)
{
    int64_t T = st->plan.num_tokens, Hq = o->geo.num_q_heads, Hk = o->geo.num_kv_heads;
    int64_t D = o->geo.head_size;
    const attnd_tref_spec sq = {"q", DT_FLOAT, 3, {T, Hq, D}, 0, 0};
    const attnd_tref_spec sk = {"k_new", DT_FLOAT, 3, {T, Hk, D}, 0, 0};
    const attnd_tref_spec sv = {"v_new", DT_FLOAT, 3, {T, Hk, D}, 0, 0};
    const attnd_tref_spec so = {"out", DT_FLOAT, 3, {T, Hq, D}, 1, 0};
    const attnd_tref_spec sl = {"out_lse", DT(F32), 2, {Hq, T}, 1, 1};
    attnd_err rv;
    if ((rv = attnd_ops_resolve(r, hr, m->q, &sq, &io->q))) return rv;
    if ((rv = attnd_ops_resolve(r, hr, m->k_new, &sk, &io->k))) return rv;
    if ((rv = attnd_ops_resolve(r, hr, m->v_new, &sv, &io->v))) return rv;
    if ((rv = attnd_ops_resolve(r, hr, m->out, &so, &io->out))) return rv;
    return attnd_ops_resolve(r, hr, m->out_lse, &sl, &io->lse);
}

static attnd_tensor cache_tensor(const attnd_ops *o, void *base)
{
    attnd_tensor t;
    int64_t shape[4] = {o->geo.num_blocks, o->geo.block_size, o->geo.num_kv_heads,
                        o->geo.head_size};
    attnd_tensor_init(&t, base, (attnd_dtype)o->geo.cache_dtype, 4, shape);
    return t;
}

/* Layer `layer` of the model with the new K/V rows k, v (and q, out, lse) as the planner runs
 * it. */
static attnd_plan_layer step_layer(const attnd_ops *o, uint32_t layer, const attend_io *io)
{
    attnd_plan_layer pl;
    int64_t hq[1] = {o->geo.num_q_heads};
    memset(&pl, 0, sizeof pl);
    pl.q = io->q;
    pl.k_new = io->k;
    pl.v_new = io->v;
    pl.out = io->out;
    pl.lse = io->lse;
    pl.k_cache = cache_tensor(o, o->k_cache[layer]);
    pl.v_cache = cache_tensor(o, o->v_cache[layer]);
    if (o->alibi) attnd_tensor_init(&pl.alibi_slopes, o->alibi, ATTND_DTYPE_F32, 1, hq);
    pl.scale = o->scale;
    pl.k_scale = o->geo.k_scale;
    pl.v_scale = o->geo.v_scale;
    pl.softcap = o->geo.softcap;
    pl.sliding_window = (int32_t)o->geo.sliding_window;
    return pl;
}

/* ---------------------------------------------------------------- kernel metrics */

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
    uint64_t now = attnd_metrics_now_ns();
    kc->ns[kind] += now - kc->t;
    kc->bytes[kind] += bytes;
    kc->t = now;
    kc->last = kind;
}

/* KV rows a launch reads, at most: every sequence at the launch's longest length. */
static uint64_t launch_kv_bytes(const attnd_ops *o, const attnd_launch *l)
{
    return (uint64_t)l->nseqs * (uint64_t)l->max_seq_len * o->geo.num_kv_heads * o->geo.head_size *
           attnd_dtype_size((attnd_dtype)o->geo.cache_dtype) * 2u;
}

static void clock_report(const attnd_ops *o, const kernel_clock *kc)
{
    if (o->metrics == NULL) return;
    for (int k = 0; k < ATTND_METRICS_KERNEL_COUNT; k++)
        if (kc->ns[k] != 0 || kc->bytes[k] != 0)
            attnd_metrics_kernel(o->metrics, (attnd_metrics_kernel_kind)k, kc->ns[k], kc->bytes[k]);
}

/* The reply waits for the kernels: with device-resident tensors only (no host copies to
 * make after them) it is deferred behind a fence, and the executor queues the next request
 * meanwhile; otherwise wait here. */
static attnd_err attend_finish(attnd_ops *o, int host_views, kernel_clock *kc, attnd_ops_reply *r)
{
    attnd_err rv;
    if (!host_views && attnd_backend_is_device(o->be) &&
        attnd_device_fence_record(o->be, &r->fence) == ATTND_ERR_OK) {
        clock_report(o, kc);
        r->fence_what = kc->last == ATTND_METRICS_KERNEL_PAGED_3D   ? "paged_attention_3d"
                        : kc->last == ATTND_METRICS_KERNEL_PAGED_2D ? "paged_attention_2d"
                                                                    : "cache_write";
        r->fence_kind = kc->last;
        r->fence_t_ns = attnd_metrics_now_ns();
        return ATTND_ERR_OK;
    }
    /* the reply tells the client its output is ready: wait for the device */
    if ((rv = attnd_backend_sync(o->be)) != ATTND_ERR_OK)
        return attnd_ops_kernel_fail(o, r, rv, "sync");
    clock_mark(kc, kc->last, 0); /* the device wait belongs to the last kernel queued */
    clock_report(o, kc);
    return ATTND_ERR_OK;
}

/* Bytes of q and out a launch touches: its rows. */
static uint64_t launch_io_bytes(const attend_io *io, const attnd_launch *l)
{
    uint64_t q = (uint64_t)io->q.shape[1] * io->q.shape[2] * attnd_dtype_size(io->q.dtype);
    uint64_t out = (uint64_t)io->out.shape[1] * io->out.shape[2] * attnd_dtype_size(io->out.dtype);
    return (uint64_t)l->nrows * (q + out);
}

static attnd_err attend_run(attnd_ops *o, attnd_step *st, uint32_t layer, const attend_io *io,
                            int host_views, attnd_ops_reply *r)
{
    attnd_plan_layer pl = step_layer(o, layer, io);
    attnd_err rv;
    kernel_clock kc = {.t = attnd_metrics_now_ns()};
    if ((rv = attnd_plan_write_kv(o->be, &st->plan, st->dev_index, &pl)) != ATTND_ERR_OK)
        return attnd_ops_kernel_fail(o, r, rv, "cache_write");
    st->written[layer] = 1;
    clock_mark(&kc, ATTND_METRICS_KERNEL_CACHE_WRITE,
               2 * (tensor_bytes(&io->k) + tensor_bytes(&io->v)));
    for (int32_t i = 0; i < st->plan.num_launches; i++) {
        const attnd_launch *l = &st->plan.launches[i];
        int is3d = l->kind == ATTND_LAUNCH_3D;
        if ((rv = attnd_plan_launch(o->be, &st->plan, st->dev_index, i, &pl, o->ws3d)))
            return attnd_ops_kernel_fail(o, r, rv,
                                         is3d ? "paged_attention_3d" : "paged_attention_2d");
        clock_mark(&kc, is3d ? ATTND_METRICS_KERNEL_PAGED_3D : ATTND_METRICS_KERNEL_PAGED_2D,
                   launch_io_bytes(io, l) + launch_kv_bytes(o, l));
    }
    return attend_finish(o, host_views, &kc, r);
}

static attnd_err attend_index(attnd_ops *o, attnd_step *st, attnd_ops_reply *r)
{
    attnd_err rv = step_index(o, st);
    return rv == ATTND_ERR_OK ? rv
                              : attnd_ops_kernel_fail(o, r, rv, "step: uploading block tables");
}

attnd_err attnd_step_attend(attnd_ops *o, attnd_session *s, const Attnd__Attend *m,
                            attnd_ops_reply *r)
{
    attnd_handles_req hr;
    attend_io io;
    attnd_err rv;
    attnd_step *st = step_find(o, s->id, m->step);
    if (st == NULL)
        return attnd_ops_fail(r, ATTND_ERR_NOT_FOUND, "step: %llu not open in this session",
                              (unsigned long long)m->step);
    if (m->layer >= o->geo.num_layers)
        return attnd_ops_fail(r, ATTND_ERR_INVALID_ARGUMENT, "layer: %u out of range (%u layers)",
                              m->layer, o->geo.num_layers);
    const Attnd__TensorRef *refs[] = {m->q, m->k_new, m->v_new, m->out, m->out_lse};
    attnd_tensor *const staged[] = {&io.q, &io.k, &io.v, &io.out, &io.lse};
    if ((rv = attnd_ops_handles_begin(o, s, r, &hr, refs, 5)) != ATTND_ERR_OK) return rv;
    if ((rv = attend_resolve(o, st, m, &hr, &io, r)) == ATTND_ERR_OK &&
        (rv = attend_index(o, st, r)) == ATTND_ERR_OK &&
        (rv = attnd_ops_stage_in(o, r, &hr, staged, 5)) == ATTND_ERR_OK &&
        (rv = attend_run(o, st, m->layer, &io, hr.nhost != 0, r)) == ATTND_ERR_OK &&
        (rv = attnd_ops_stage_out(o, r, &hr)) == ATTND_ERR_OK)
        attnd_ops_take_outputs(r, &hr);
    attnd_handles_req_fini(&hr);
    return rv;
}

/* ---------------------------------------------------------------- EndStep */

/* A committed layer that no Attend wrote reads as zeros, never as what an earlier owner of
 * the blocks (maybe another session) left in those slots. */
static attnd_err clear_unwritten(attnd_ops *o, attnd_step *st, attnd_ops_reply *r)
{
    int64_t shape[3] = {st->plan.num_tokens, o->geo.num_kv_heads, o->geo.head_size};
    size_t bytes = (size_t)shape[0] * (size_t)shape[1] * (size_t)shape[2] * sizeof(float);
    void *zeros = NULL, *dev = NULL;
    attend_io io;
    attnd_err rv = ATTND_ERR_OK;
    memset(&io, 0, sizeof io);
    for (uint32_t l = 0; l < o->geo.num_layers && rv == ATTND_ERR_OK; l++) {
        if (st->written[l]) continue;
        if (zeros == NULL && (zeros = calloc(1, bytes)) == NULL) rv = ATTND_ERR_NO_MEMORY;
        if (rv == ATTND_ERR_OK && dev == NULL) rv = attnd_ops_upload(o, zeros, bytes, &dev);
        if (rv != ATTND_ERR_OK) break;
        attnd_tensor_init(&io.k, dev, ATTND_DTYPE_F32, 3, shape);
        io.v = io.k;
        attnd_plan_layer pl = step_layer(o, l, &io);
        rv = attnd_plan_write_kv(o->be, &st->plan, st->dev_index, &pl);
    }
    attnd_ops_release(o, dev, zeros);
    free(zeros);
    if (rv != ATTND_ERR_OK)
        return attnd_ops_kernel_fail(o, r, rv,
                                     "end_step: clearing a layer no Attend wrote "
                                     "failed, step aborted");
    return ATTND_ERR_OK;
}

attnd_err attnd_step_end(attnd_ops *o, attnd_session *s, const Attnd__EndStep *m,
                         attnd_ops_reply *r)
{
    attnd_step *st = step_find(o, s->id, m->step);
    if (st == NULL)
        return attnd_ops_fail(r, ATTND_ERR_NOT_FOUND, "step: %llu not open in this session",
                              (unsigned long long)m->step);
    attnd_err rv = m->abort ? ATTND_ERR_OK : attend_index(o, st, r);
    if (rv == ATTND_ERR_OK && !m->abort) rv = clear_unwritten(o, st, r);
    step_finish(o, st, !m->abort && rv == ATTND_ERR_OK);
    s->nsteps--;
    return rv;
}
