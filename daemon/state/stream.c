#include "stream.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "attnd/clock.h"

void attnd_streams_init(attnd_streams *ss, attnd_steps *steps, attnd_log *lg, uint32_t max,
                        uint64_t step_ms, uint64_t drain_ms)
{
    memset(ss, 0, sizeof *ss);
    ss->steps = steps;
    ss->log = lg;
    ss->max = max;
    ss->next_id = 1;
    ss->t = (attnd_sx_timeouts){step_ms, drain_ms};
}

void attnd_streams_set_reply(attnd_streams *ss, attnd_stream_reply_fn fn, void *arg)
{
    ss->reply = fn;
    ss->reply_arg = arg;
}

static attnd_backend *chan_be(const attnd_streams *ss)
{
    return ss->steps->dm->be;
}

/* ---------------------------------------------------------------- flag words */

/* Host backends: qkv in a POSIX shm object the worker maps by name, watched by the guard (a
 * worker that truncates it makes the daemon read zeros, not die). */
static attnd_err flags_shm(attnd_streams *ss, attnd_stream_chan *ch, char *err, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ch->qkv_bytes = (ch->qkv_bytes + page - 1) / page * page;
    snprintf(ch->shm_name, sizeof ch->shm_name, "/attnd-sx-%d-%u-%08x", (int)getpid(), ch->id,
             (unsigned)(attnd_clock_ns() & 0xffffffffu));
    int fd = shm_open(ch->shm_name, O_CREAT | O_EXCL | O_RDWR, 0660);
    if (fd < 0) return attnd_errf(err, n, ATTND_ERR_INTERNAL, "stream: shm_open: %m");
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)ch->qkv_bytes) == 0)
        p = mmap(NULL, ch->qkv_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(ch->shm_name);
        ch->shm_name[0] = '\0';
        return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "stream: mapping the flag words: %m");
    }
    ch->qkv = p;
    ch->guard_id = ss->guard ? attnd_shmguard_add(ss->guard, p, ch->qkv_bytes) : -1;
    return ATTND_ERR_OK;
}

/* Device backends: qkv in device memory, zeroed, exported by CUDA IPC. */
static attnd_err flags_device(attnd_streams *ss, attnd_stream_chan *ch, char *err, size_t n)
{
    attnd_backend *be = chan_be(ss);
    void *p = NULL;
    attnd_err rv = attnd_backend_alloc(be, ch->qkv_bytes, &p);
    if (rv == ATTND_ERR_OK) rv = attnd_device_memset(be, p, 0, ch->qkv_bytes);
    if (rv == ATTND_ERR_OK) rv = attnd_device_ipc_export(be, p, ch->ipc_handle);
    if (rv != ATTND_ERR_OK) {
        attnd_backend_free(be, p);
        return attnd_errf(err, n, rv, "stream: flag words: %s", attnd_backend_last_error(be));
    }
    ch->qkv = p;
    return ATTND_ERR_OK;
}

static void flags_unlink(attnd_stream_chan *ch)
{
    if (ch->shm_name[0]) shm_unlink(ch->shm_name);
    ch->shm_name[0] = '\0';
}

/* ---------------------------------------------------------------- open, free */

/* Destroy ch's stream (work still queued runs out on its own) and free its memory. On a device
 * backend the frees that wait for the whole device are put off while any stream has work queued
 * (attnd_stream_collect, from the tick), so none of them runs under a waiting stream. */
static void chan_free(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_backend *be = chan_be(ss);
    attnd_stream_destroy(be, ch->stream);
    ch->stream = NULL;
    if (attnd_backend_is_device(be)) {
        attnd_backend_free(be, ch->qkv);
    } else if (ch->qkv != NULL) {
        if (ch->guard_id >= 0) attnd_shmguard_remove(ss->guard, ch->guard_id);
        munmap(ch->qkv, ch->qkv_bytes);
    }
    flags_unlink(ch);
    attnd_backend_free(be, ch->ws3d);
    attnd_backend_free(be, ch->index_dev);
    attnd_device_host_free(be, ch->index_host);
    free(ch->arm_io);
    free(ch);
}

/* Unlink ch from the channels and free it. */
static void chan_remove(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_stream_chan **pp = &ss->head;
    while (*pp && *pp != ch)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = ch->next;
        ss->count--;
    }
    chan_free(ss, ch);
}

static attnd_err chan_alloc(attnd_streams *ss, attnd_stream_chan *ch, char *err, size_t n)
{
    attnd_backend *be = chan_be(ss);
    attnd_err rv = attnd_stream_create(be, &ch->stream);
    if (rv != ATTND_ERR_OK)
        return attnd_errf(err, n, rv, "stream: %s", attnd_backend_last_error(be));
    if ((rv = attnd_backend_alloc(be, ss->steps->dm->ws3d_bytes, &ch->ws3d)) != ATTND_ERR_OK)
        return attnd_errf(err, n, rv, "stream: its split-KV workspace: %s", attnd_strerror(rv));
    /* index arrays of any step the limits allow, allocated now: no allocation while streams
     * wait (device backends; host ones read the plan's arrays in place) */
    if (attnd_backend_is_device(be) && (ch->index_cap = ss->steps->dm->index_slot_bytes) &&
        ((rv = attnd_backend_alloc(be, ch->index_cap, &ch->index_dev)) != ATTND_ERR_OK ||
         (rv = attnd_device_host_alloc(be, ch->index_cap, &ch->index_host)) != ATTND_ERR_OK))
        return attnd_errf(err, n, rv, "stream: its index arrays: %s", attnd_strerror(rv));
    ch->qkv_bytes = (size_t)ch->layers * sizeof(uint32_t);
    return attnd_backend_is_device(be) ? flags_device(ss, ch, err, n) : flags_shm(ss, ch, err, n);
}

attnd_err attnd_stream_open(attnd_streams *ss, attnd_session *s, uint32_t *o, uint32_t o_region,
                            attnd_stream_chan **out, char *err, size_t n)
{
    *out = NULL;
    if (ss->max == 0)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "stream: off (server.streams is 0)");
    if (ss->count >= ss->max)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "stream: all server.streams (%u) in use",
                          ss->max);
    attnd_stream_chan *ch = calloc(1, sizeof *ch);
    if (ch == NULL) return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "stream: out of memory");
    ch->id = ss->next_id++;
    ch->session = s->id;
    ch->sess = s;
    ch->layers = ss->steps->model->geo.num_layers;
    ch->o = o;
    ch->o_region = o_region;
    ch->guard_id = -1;
    attnd_sx_init(&ch->sx);
    attnd_err rv = chan_alloc(ss, ch, err, n);
    if (rv != ATTND_ERR_OK) {
        chan_free(ss, ch);
        return rv;
    }
    ch->next = ss->head;
    ss->head = ch;
    ss->count++;
    *out = ch;
    return ATTND_ERR_OK;
}

attnd_err attnd_stream_find(attnd_streams *ss, uint64_t session, uint32_t id,
                            attnd_stream_chan **out, char *err, size_t n)
{
    for (attnd_stream_chan *ch = ss->head; ch; ch = ch->next)
        if (ch->id == id && ch->session == session && ch->sx.state != ATTND_SX_CLOSED &&
            ch->sess != NULL) {
            *out = ch;
            return ATTND_ERR_OK;
        }
    *out = NULL;
    return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "stream: %u not open in this session", id);
}

/* ---------------------------------------------------------------- actions */

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

/* Write every qkv word from the host: each wait of the channel's stream passes. */
static void chan_release(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_backend *be = chan_be(ss);
    attnd_err rv = ATTND_ERR_OK;
    for (uint32_t l = 0; l < ch->layers && rv == ATTND_ERR_OK; l++)
        rv = attnd_stream_release(be, &ch->qkv[l], 1);
    if (ss->metrics) attnd_metrics_event(ss->metrics, ATTND_METRICS_EVENT_STREAM_RELEASES);
    ATTND_LOG(ss->log, ATTND_LOG_WARN,
              "event=stream_release stream=%u session=%llu step=%llu why=\"%s\" code=%s err=\"%s\"",
              ch->id, (unsigned long long)ch->session, (unsigned long long)ch->step_id,
              attnd_sx_why_name(ch->sx.why), attnd_err_name(rv),
              rv == ATTND_ERR_OK ? "" : attnd_backend_last_error(be));
}

/* Commit or abort the channel's step; the code its EndStep then gets. */
static attnd_err chan_finish(attnd_streams *ss, attnd_stream_chan *ch, int commit, attnd_err code,
                             char *msg, size_t n)
{
    attnd_step *st = ch->step;
    ch->step = NULL;
    if (st == NULL) return code;
    if (ch->sess == NULL) { /* quarantined: its sequences may be gone */
        attnd_step_free_detached(ss->steps, st);
        return code;
    }
    attnd_err rv = attnd_step_end(ss->steps, ch->sess, st, !commit, msg, n);
    if (rv != ATTND_ERR_OK) { /* a commit refused leaves the step open: abort it */
        attnd_step_end(ss->steps, ch->sess, st, 1, NULL, 0);
        return rv;
    }
    return code;
}

/* A released stream that does not drain: keep its memory forever, report the device. */
static void chan_quarantine(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_devmem *dm = ss->steps->dm;
    ss->stuck++;
    if (ch->step != NULL) attnd_step_detach(ss->steps, ch->step);
    if (ch->step != NULL && ch->sess != NULL) ch->sess->nsteps--;
    ch->sess = NULL;
    ATTND_LOG(ss->log, ATTND_LOG_ERROR,
              "event=stream_stuck stream=%u session=%llu step=%llu drain_ms=%llu "
              "action=quarantined (restart the daemon)",
              ch->id, (unsigned long long)ch->session, (unsigned long long)ch->step_id,
              (unsigned long long)ss->t.drain_ms);
    if (attnd_backend_is_device(dm->be) && !dm->device_failed) {
        dm->device_failed = 1;
        snprintf(dm->device_error, sizeof dm->device_error,
                 "stream %u did not drain after its release", ch->id);
    }
}

/* The message an EndStep answered with code gets. */
static void chan_message(const attnd_streams *ss, const attnd_stream_chan *ch, attnd_err code,
                         char *msg, size_t n)
{
    unsigned long long step = (unsigned long long)ch->step_id;
    const char *dev = attnd_backend_last_error(ss->steps->dm->be);
    if (code == ATTND_ERR_OK || msg[0] != '\0') return;
    if (code == ATTND_ERR_TIMEOUT)
        attnd_errf(msg, n, code,
                   "stream %u: step %llu not run within limits.stream_timeout_ms (%llu): "
                   "released, its writes discarded; the channel failed (open a new one)",
                   ch->id, step, (unsigned long long)ss->t.step_ms);
    else if (code == ATTND_ERR_UNAVAILABLE)
        attnd_errf(msg, n, code, "stream %u: step %llu released: the stream was closed", ch->id,
                   step);
    else if (code == ATTND_ERR_FAILED_PRECONDITION)
        attnd_errf(msg, n, code, "stream %u: step %llu was aborted while its layers were queued",
                   ch->id, step);
    else if (ch->sx.state == ATTND_SX_STUCK)
        attnd_errf(msg, n, code, "stream %u: step %llu did not drain after its release", ch->id,
                   step);
    else
        attnd_errf(msg, n, code, "stream %u: step %llu failed on the device: %s", ch->id, step,
                   dev);
}

/* Take the actions a; 1 when ch was freed. */
static int chan_act(attnd_streams *ss, attnd_stream_chan *ch, unsigned a)
{
    char msg[400] = "";
    attnd_err code = ch->sx.reply_code;
    if (a & ATTND_SX_DO_RELEASE) chan_release(ss, ch);
    if (a & (ATTND_SX_DO_COMMIT | ATTND_SX_DO_ABORT))
        code = chan_finish(ss, ch, (a & ATTND_SX_DO_COMMIT) != 0, code, msg, sizeof msg);
    if (a & ATTND_SX_DO_QUARANTINE) chan_quarantine(ss, ch);
    if ((a & ATTND_SX_DO_REPLY) && ch->owed != NULL) {
        chan_message(ss, ch, code, msg, sizeof msg);
        void *owed = ch->owed;
        ch->owed = NULL;
        if (ss->reply) ss->reply(ss->reply_arg, owed, code, msg);
    }
    if (a & ATTND_SX_DO_FREE) {
        chan_remove(ss, ch);
        return 1;
    }
    return 0;
}

/* Feed a running channel what its stream says (drained, failed); 1 when ch was freed. */
static int chan_observe(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_backend *be = chan_be(ss);
    if (!attnd_sx_running(&ch->sx)) return 0;
    attnd_err rv = attnd_stream_query(be, ch->stream);
    if (rv == ATTND_ERR_TIMEOUT) return 0;
    if (rv != ATTND_ERR_OK) {
        char m[256];
        attnd_devmem_kernel_err(ss->steps->dm, rv, "stream", m, sizeof m);
    }
    unsigned a = attnd_sx_on(&ch->sx, rv == ATTND_ERR_OK ? ATTND_SX_DRAINED : ATTND_SX_FAULT,
                             attnd_clock_ms(), &ss->t);
    return chan_act(ss, ch, a);
}

/* ---------------------------------------------------------------- BeginStep */

/* The step's index arrays where the channel's kernels read them: in place on host backends; on
 * device backends uploaded on the channel's stream into its own buffer (its previous step drained
 * before this one began, so the staging is free). */
static attnd_err chan_index(attnd_streams *ss, attnd_stream_chan *ch, attnd_step *st, char *err,
                            size_t n)
{
    attnd_backend *be = chan_be(ss);
    size_t bytes = st->plan.index_bytes;
    attnd_err rv;
    if (!attnd_backend_is_device(be)) {
        st->index.dev = st->ws;
        return ATTND_ERR_OK;
    }
    if (bytes > ch->index_cap)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "step: its index arrays take %zu bytes, the stream channel holds %zu "
                          "(limits raised since it opened: open a new one)",
                          bytes, ch->index_cap);
    memcpy(ch->index_host, st->ws, bytes);
    if ((rv = attnd_stream_select(be, ch->stream)) != ATTND_ERR_OK) return rv;
    rv = attnd_device_upload(be, ch->index_dev, ch->index_host, bytes);
    attnd_stream_select(be, NULL);
    st->index.dev = ch->index_dev;
    return rv;
}

/* Queue layer l: wait for the worker's qkv word, cache write + attention, signal o. Every qkv
 * word is reset to 0 once, after the last layer's attention and before its o word (off the path
 * from one layer's handoff to the next): the worker's stream may signal the next step's layers as
 * soon as that last wait passes (a replay launched before this step's StreamEnd), so no reset may
 * come after it. */
static attnd_err arm_layer(attnd_streams *ss, attnd_stream_chan *ch, attnd_step *st, uint32_t l,
                           const attnd_attend_io *io)
{
    attnd_backend *be = chan_be(ss);
    attnd_plan_layer pl = attnd_step_plan_layer(ss->steps, l, io);
    attnd_err rv = attnd_stream_wait_value(be, ch->stream, &ch->qkv[l], 1);
    if (rv == ATTND_ERR_OK && (rv = attnd_stream_select(be, ch->stream)) == ATTND_ERR_OK) {
        rv = attnd_plan_run_layer(be, &st->plan, st->index.dev, &pl, ch->ws3d);
        attnd_stream_select(be, NULL);
    }
    if (rv == ATTND_ERR_OK && l + 1 == ch->layers)
        rv = attnd_stream_write_values(be, ch->stream, ch->qkv, ch->layers, 0);
    if (rv == ATTND_ERR_OK) rv = attnd_stream_write_value(be, ch->stream, &ch->o[l], 1);
    if (rv == ATTND_ERR_OK) st->attended[l] = ATTND_LAYER_ATTENDED;
    return rv;
}

/* Layers queued per executor turn after BeginStep's reply: other requests interleave. */
#define ARM_LAYERS_PER_TURN 4u
#define ARM_ALL UINT32_MAX

/* The step's index arrays in place and the copies it reads queued before it; its tensors kept for
 * the layers queued after the reply. */
static attnd_err chan_arm_start(attnd_streams *ss, attnd_stream_chan *ch, attnd_step *st,
                                const attnd_attend_io *io, uint32_t nio, char *err, size_t en)
{
    attnd_backend *be = chan_be(ss);
    attnd_err rv = chan_index(ss, ch, st, err, en);
    if (rv != ATTND_ERR_OK) return rv;
    /* copy-on-write copies were queued on the backend's stream: the layers run after them */
    if ((rv = attnd_stream_after_backend(be, ch->stream)) != ATTND_ERR_OK)
        return attnd_errf(err, en, rv, "stream %u: ordering after the backend: %s", ch->id,
                          attnd_backend_last_error(be));
    if ((ch->arm_io = malloc(nio * sizeof *io)) == NULL)
        return attnd_errf(err, en, ATTND_ERR_NO_MEMORY, "stream: out of memory");
    memcpy(ch->arm_io, io, nio * sizeof *io);
    ch->arm_nio = nio;
    ch->arm_next = 0;
    return ATTND_ERR_OK;
}

/* Queueing stopped at layer arm_next after BeginStep answered: the worker's stream would wait
 * for o words no layer writes, so write them from the host; release what was queued (the step
 * fails, its EndStep learns it). 1 when ch was freed. */
static int chan_arm_failed(attnd_streams *ss, attnd_stream_chan *ch, attnd_err rv)
{
    attnd_backend *be = chan_be(ss);
    ATTND_LOG(ss->log, ATTND_LOG_ERROR,
              "event=stream_queue_failed stream=%u session=%llu step=%llu layer=%u code=%s "
              "err=\"%s\"",
              ch->id, (unsigned long long)ch->session, (unsigned long long)ch->step_id,
              ch->arm_next, attnd_err_name(rv), attnd_backend_last_error(be));
    for (uint32_t l = ch->arm_next; l < ch->layers; l++)
        attnd_stream_release(be, &ch->o[l], 1);
    free(ch->arm_io);
    ch->arm_io = NULL;
    return chan_act(ss, ch, attnd_sx_on(&ch->sx, ATTND_SX_QUEUE_FAILED, attnd_clock_ms(), &ss->t));
}

/* Queue up to count more layers of ch's step. 1 when ch was freed. */
static int chan_arm_more(attnd_streams *ss, attnd_stream_chan *ch, uint32_t count)
{
    attnd_err rv = ATTND_ERR_OK;
    if (ch->arm_io == NULL) return 0;
    for (; count > 0 && ch->arm_next < ch->layers && rv == ATTND_ERR_OK; count--) {
        uint32_t l = ch->arm_next;
        rv = arm_layer(ss, ch, ch->step, l, &ch->arm_io[ch->arm_nio == 1 ? 0 : l]);
        if (rv == ATTND_ERR_OK) ch->arm_next++;
    }
    if (rv != ATTND_ERR_OK) return chan_arm_failed(ss, ch, rv);
    if (ch->arm_next == ch->layers) {
        free(ch->arm_io);
        ch->arm_io = NULL;
    }
    return 0;
}

attnd_err attnd_stream_begin(attnd_streams *ss, attnd_stream_chan *ch, const attnd_step_req *seqs,
                             uint32_t n, uint32_t max_step_tokens, const attnd_attend_io *io,
                             uint32_t nio, attnd_step **out, char *err, size_t en)
{
    attnd_step *st;
    attnd_err rv;
    *out = NULL;
    if ((rv = attnd_sx_can_begin(&ch->sx, err, en)) != ATTND_ERR_OK) return rv;
    if (nio != 1 && nio != ch->layers)
        return attnd_errf(err, en, ATTND_ERR_INVALID_ARGUMENT,
                          "layers: %u entries (1 for every layer, or one per layer: %u)", nio,
                          ch->layers);
    rv = attnd_step_begin_stream(ss->steps, ch->sess, seqs, n, max_step_tokens, ch->id, &st, err,
                                 en);
    if (rv != ATTND_ERR_OK) return rv;
    flags_unlink(ch); /* the worker mapped the flag words before its first step */
    ch->step = st;
    ch->step_id = st->id;
    attnd_sx_on(&ch->sx, ATTND_SX_BEGIN, attnd_clock_ms(), &ss->t);
    if ((rv = chan_arm_start(ss, ch, st, io, nio, err, en)) != ATTND_ERR_OK) {
        /* the index upload may be queued: release; the step aborts once the stream drained */
        unsigned a = attnd_sx_on(&ch->sx, ATTND_SX_ABORT, attnd_clock_ms(), &ss->t);
        ch->sx.end_owed = 0; /* the BeginStep's own reply carries the error */
        chan_act(ss, ch, a);
        return rv;
    }
    *out = st;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- EndStep, close */

attnd_err attnd_stream_end(attnd_streams *ss, attnd_stream_chan *ch, uint64_t step, int abort,
                           void *owed, int *owed_taken, char *err, size_t n)
{
    *owed_taken = 0;
    if (step == 0 || step != ch->step_id || !(ch->step != NULL || ch->sx.state == ATTND_SX_FAILED))
        return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "step: %llu is not open on stream %u",
                          (unsigned long long)step, ch->id);
    if (ch->sx.end_owed)
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "step: %llu already has an EndStep waiting", (unsigned long long)step);
    chan_arm_more(ss, ch, ARM_ALL); /* never frees: not closing with a step to end */
    chan_observe(ss, ch); /* a stream already drained answers now (never frees: not closing) */
    unsigned a =
        attnd_sx_on(&ch->sx, abort ? ATTND_SX_ABORT : ATTND_SX_END, attnd_clock_ms(), &ss->t);
    if (a & ATTND_SX_DO_REPLY) {
        char msg[400] = "";
        attnd_err code = ch->sx.reply_code;
        a &= ~(unsigned)ATTND_SX_DO_REPLY;
        if (a & (ATTND_SX_DO_COMMIT | ATTND_SX_DO_ABORT))
            code = chan_finish(ss, ch, (a & ATTND_SX_DO_COMMIT) != 0, code, msg, sizeof msg);
        chan_message(ss, ch, code, msg, sizeof msg);
        return attnd_errf(err, n, code, "%s", msg);
    }
    if (ch->sx.end_owed) {
        ch->owed = owed;
        *owed_taken = 1;
    }
    chan_act(ss, ch, a);
    return ATTND_ERR_OK;
}

void attnd_stream_close(attnd_streams *ss, attnd_stream_chan *ch)
{
    if (chan_arm_more(ss, ch, ARM_ALL)) return;
    chan_act(ss, ch, attnd_sx_on(&ch->sx, ATTND_SX_CLOSE, attnd_clock_ms(), &ss->t));
}

/* ---------------------------------------------------------------- polling */

static int chan_hot(const attnd_stream_chan *ch)
{
    return ch->sx.end_owed || ch->sx.state == ATTND_SX_RELEASING;
}

uint32_t attnd_streams_poll(attnd_streams *ss, int *hot)
{
    uint32_t changed = 0;
    *hot = 0;
    for (attnd_stream_chan *ch = ss->head, *next; ch; ch = next) {
        next = ch->next;
        if (ch->arm_io != NULL) { /* observed once every layer is queued */
            changed++;
            if (!chan_arm_more(ss, ch, ARM_LAYERS_PER_TURN) && ch->arm_io != NULL) *hot = 1;
            continue;
        }
        if (!chan_hot(ch)) continue;
        attnd_sx_state before = ch->sx.state;
        if (chan_observe(ss, ch) || ch->sx.state != before) {
            changed++;
            continue;
        }
        *hot = 1;
    }
    return changed;
}

void attnd_streams_tick(attnd_streams *ss)
{
    for (attnd_stream_chan *ch = ss->head, *next; ch; ch = next) {
        next = ch->next;
        if (chan_arm_more(ss, ch, ARM_ALL)) continue;
        if (!attnd_sx_running(&ch->sx) || chan_observe(ss, ch)) continue;
        chan_act(ss, ch, attnd_sx_on(&ch->sx, ATTND_SX_TICK, attnd_clock_ms(), &ss->t));
    }
    attnd_stream_collect(chan_be(ss));
}

int attnd_streams_holds_region(const attnd_streams *ss, uint64_t session, uint32_t region)
{
    for (const attnd_stream_chan *ch = ss->head; ch; ch = ch->next)
        if (ch->session == session && ch->sess != NULL &&
            (ch->o_region == region || attnd_sx_running(&ch->sx)))
            return 1;
    return 0;
}

/* Disconnect ch and wait (at most drain_ms) for its stream to run out; then it is freed, or
 * quarantined when it did not drain. */
static void chan_drop(attnd_streams *ss, attnd_stream_chan *ch)
{
    attnd_backend *be = chan_be(ss);
    if (chan_arm_more(ss, ch, ARM_ALL)) return;
    if (chan_act(ss, ch, attnd_sx_on(&ch->sx, ATTND_SX_DISCONNECT, attnd_clock_ms(), &ss->t)))
        return;
    uint64_t end = attnd_clock_ms() + ss->t.drain_ms;
    while (attnd_sx_running(&ch->sx) && attnd_stream_query(be, ch->stream) == ATTND_ERR_TIMEOUT &&
           attnd_clock_ms() < end)
        nap_us(100);
    if (chan_observe(ss, ch)) return;
    chan_act(ss, ch, attnd_sx_on(&ch->sx, ATTND_SX_TICK, end, &ss->t));
}

void attnd_streams_drop_session(attnd_streams *ss, uint64_t session)
{
    for (attnd_stream_chan *ch = ss->head, *next; ch; ch = next) {
        next = ch->next;
        if (ch->session == session && ch->sess != NULL) chan_drop(ss, ch);
    }
}

void attnd_streams_fini(attnd_streams *ss)
{
    for (attnd_stream_chan *ch = ss->head, *next; ch; ch = next) {
        next = ch->next;
        if (ch->sess != NULL) chan_drop(ss, ch);
    }
    while (ss->head) { /* quarantined ones: the process is ending */
        attnd_stream_chan *ch = ss->head;
        if (ch->step != NULL) attnd_step_free_detached(ss->steps, ch->step);
        ch->step = NULL;
        chan_remove(ss, ch);
    }
    attnd_stream_collect(chan_be(ss));
}
