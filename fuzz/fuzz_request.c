/* libFuzzer target: the daemon's request path after the socket, decode (protobuf-c), validation
 * and dispatch (attnd_dispatch on the CPU backend), reply packing, connection drops and the
 * reclaim of their sessions; and, as a client could, its shared memory: two POSIX shm objects
 * it may register as HOST_SHM regions (and write into between requests: index tensors, outputs
 * over inputs), and a shared-memory channel it may open and post requests through (taken by the
 * daemon's channel transport, answered in the slot).
 *
 * An input is a sequence of frames (fuzz/gen_corpus.py writes the seeds): u8 flags, u16 LE
 * length, then that many bytes. flags bit 0 picks connection 1 or 2, bit 1 drops that
 * connection after the frame. The bytes are an attnd.Request sent on the connection, unless
 *   bit 2: they are written into shm object b[0] & 1 at offset b[1] | b[2] << 8 (b[3..]);
 *   bit 3: they are a Request posted in channel slot (flags & 1), then the channel polled.
 * session 1..4 in a request means "the session of the 1st..4th Hello that succeeded", step 1..4
 * "the 1st..4th step begun", so inputs get past the handshake whatever ids the daemon hands
 * out; RegisterRegion shm_name "/0" and "/1" name the two objects, OpenChannel shm_name "/c" the
 * channel object (size 0: its actual size).
 *
 * Beyond crashes and sanitizer reports, each input must leave the daemon clean: every reply a
 * known code, an error reply names what was wrong, and once both connections are dropped (reclaim
 * timeout 0) no sequence is left and every block is free. A violation aborts.
 *
 * Built with -DATTND_FUZZ_REPLAY (no libFuzzer), main() runs the files given on the command line
 * through the same function: the regression test over fuzz/corpus and fuzz/regressions.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "attnd.pb-c.h"
#include "attnd_channel.h"
#include "state/cache.h"
#include "core/config.h"
#include "core/log.h"
#include "serve/dispatch.h"

#define MAX_IDS 4
#define FUZZ_SHM_BYTES 65536u
#define FUZZ_CHAN_SLOTS 2u
#define FUZZ_CHAN_REQ 65536u
#define FUZZ_CHAN_REP 8192u

/* A POSIX shm object the harness keeps mapped (and linked, for the daemon to open by name). */
typedef struct fuzz_obj {
    char name[64];
    void *base;
    size_t size;
} fuzz_obj;

typedef struct fuzz_env {
    attnd_backend *be;
    attnd_config cfg;
    attnd_log log;
    FILE *devnull;
    fuzz_obj shm[2], chan;
} fuzz_env;

typedef struct fuzz_state {
    attnd_serve *sv;
    attnd_wire wire;
    attnd_exec_poller poller;
    fuzz_env *env;
    uint64_t sessions[MAX_IDS], steps[MAX_IDS];
    int nsessions, nsteps;
} fuzz_state;

/* ---------------------------------------------------------------- shared memory */

static fuzz_env *fuzz_env_get(void);

static void fuzz_obj_make(fuzz_obj *o, const char *what, size_t size)
{
    snprintf(o->name, sizeof o->name, "/attnd-fuzz-%ld-%s", (long)getpid(), what);
    int fd = shm_open(o->name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) abort();
    o->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (o->base == MAP_FAILED) abort();
    o->size = size;
}

static void fuzz_objs_unlink(void)
{
    fuzz_env *env = fuzz_env_get();
    shm_unlink(env->shm[0].name);
    shm_unlink(env->shm[1].name);
    shm_unlink(env->chan.name);
}

/* Every input starts from the same memory: object 0 an i32 ramp (0, 1, 2...: offsets for
 * cu_seqlens and layouts), object 1 zeros, the channel a fresh header with idle slots. */
static void fuzz_objs_reset(fuzz_env *env)
{
    int32_t *ramp = env->shm[0].base;
    for (size_t i = 0; i < env->shm[0].size / sizeof *ramp; i++)
        ramp[i] = (int32_t)i;
    memset(env->shm[1].base, 0, env->shm[1].size);
    memset(env->chan.base, 0, env->chan.size);
    attnd_channel_header *h = env->chan.base;
    h->magic = ATTND_CHANNEL_MAGIC;
    h->version = ATTND_CHANNEL_VERSION;
    h->nslots = FUZZ_CHAN_SLOTS;
    h->req_bytes = FUZZ_CHAN_REQ;
    h->rep_bytes = FUZZ_CHAN_REP;
}

static void fuzz_objs_write(fuzz_env *env, const uint8_t *b, size_t len)
{
    if (len < 3) return;
    fuzz_obj *o = &env->shm[b[0] & 1];
    size_t off = (size_t)b[1] | (size_t)b[2] << 8, n = len - 3;
    if (off >= o->size) return;
    if (n > o->size - off) n = o->size - off;
    memcpy((char *)o->base + off, b + 3, n);
}

/* libFuzzer calls one function with no context: the environment lives for the process. */
static fuzz_env *fuzz_env_get(void)
{
    static fuzz_env env;
    static int ready;
    char err[256];
    if (ready) return &env;
    attnd_config_defaults(&env.cfg);
    env.cfg.backend = ATTND_CFG_BACKEND_CPU;
    env.cfg.threads = 1;
    env.cfg.geometry.num_layers = 2;
    env.cfg.geometry.num_q_heads = 4;
    env.cfg.geometry.num_kv_heads = 2;
    env.cfg.geometry.head_size = 32;
    env.cfg.geometry.block_size = 16;
    env.cfg.geometry.cache_dtype = ATTND_DTYPE_F16;
    env.cfg.geometry.num_blocks = 64;
    env.cfg.geometry.max_blocks_per_seq = 16;
    env.cfg.linear.slots = 4;
    env.cfg.linear.heads = 2;
    env.cfg.linear.head_dim = 32;
    env.cfg.limits.max_seqs = 16;
    env.cfg.limits.max_step_tokens = 256;
    env.cfg.limits.max_inline_bytes = 1 << 20;
    env.cfg.limits.request_timeout_ms = 0;
    env.cfg.limits.reclaim_timeout_ms = 0;
    env.cfg.server.channels = 2;
    if (attnd_config_validate(&env.cfg, err, sizeof err) != ATTND_ERR_OK) {
        fprintf(stderr, "fuzz: bad harness config: %s\n", err);
        abort();
    }
    env.devnull = fopen("/dev/null", "w");
    attnd_log_init(&env.log, ATTND_LOG_ERROR, env.devnull);
    attnd_backend_opts bo = {1, 0};
    if (attnd_backend_open(&env.be, "cpu", &bo) != ATTND_ERR_OK) abort();
    ready = 1;
    fuzz_obj_make(&env.shm[0], "0", FUZZ_SHM_BYTES);
    fuzz_obj_make(&env.shm[1], "1", FUZZ_SHM_BYTES);
    fuzz_obj_make(&env.chan, "c",
                  (size_t)attnd_channel_size(FUZZ_CHAN_SLOTS, FUZZ_CHAN_REQ, FUZZ_CHAN_REP));
    atexit(fuzz_objs_unlink);
    return &env;
}

static void fuzz_fail(const char *what, const attnd_reply *r)
{
    fprintf(stderr, "fuzz: invariant broken: %s (code %u, message \"%s\")\n", what,
            r ? r->reply.code : 0, r && r->reply.message ? r->reply.message : "");
    abort();
}

/* Map the small session / step indexes of an input to the ids the daemon handed out. */
static void map_ids(const fuzz_state *st, Attnd__Request *req)
{
    if (req->session >= 1 && req->session <= (uint64_t)st->nsessions)
        req->session = st->sessions[req->session - 1];
    uint64_t *step = NULL;
    if (req->body_case == ATTND__REQUEST__BODY_ATTEND && req->attend) step = &req->attend->step;
    if (req->body_case == ATTND__REQUEST__BODY_END_STEP && req->end_step)
        step = &req->end_step->step;
    if (step && *step >= 1 && *step <= (uint64_t)st->nsteps) *step = st->steps[*step - 1];
}

/* The harness's objects for the names "/0", "/1" (RegisterRegion) and "/c" (OpenChannel);
 * returns the field it changed, whose decoded value goes back before the request is freed. */
static char **map_names(const fuzz_state *st, Attnd__Request *req, char **orig)
{
    char **name = NULL;
    const fuzz_env *env = st->env;
    if (req->body_case == ATTND__REQUEST__BODY_REGISTER_REGION && req->register_region)
        name = &req->register_region->shm_name;
    if (req->body_case == ATTND__REQUEST__BODY_OPEN_CHANNEL && req->open_channel) {
        name = &req->open_channel->shm_name;
        if (req->open_channel->size == 0) req->open_channel->size = env->chan.size;
    }
    if (name == NULL || *name == NULL) return NULL;
    const char *real = strcmp(*name, "/0") == 0   ? env->shm[0].name
                       : strcmp(*name, "/1") == 0 ? env->shm[1].name
                       : strcmp(*name, "/c") == 0 ? env->chan.name
                                                  : NULL;
    if (real == NULL) return NULL;
    *orig = *name;
    *name = (char *)real;
    return name;
}

/* Pack the reply as the server does (a reply that cannot be packed would be a bug too). */
static void check_reply(const attnd_reply *r)
{
    if (r->reply.code > ATTND_ERR_FAILED_PRECONDITION) fuzz_fail("reply code out of range", r);
    if (r->reply.code != ATTND_ERR_OK && (r->reply.message == NULL || !r->reply.message[0]))
        fuzz_fail("an error reply without a message", r);
    size_t n = attnd__reply__get_packed_size(&r->reply);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL || attnd__reply__pack(&r->reply, buf) != n) fuzz_fail("reply packing", r);
    Attnd__Reply *back = attnd__reply__unpack(NULL, n, buf);
    if (back == NULL || back->id != r->reply.id || back->code != r->reply.code)
        fuzz_fail("reply does not round-trip", r);
    attnd__reply__free_unpacked(back, NULL);
    free(buf);
}

/* What a reply teaches the later frames: sessions and steps, by the order they were made. */
static void note_reply(fuzz_state *st, const Attnd__Reply *rep)
{
    if (rep->code == ATTND_ERR_OK && rep->body_case == ATTND__REPLY__BODY_HELLO &&
        st->nsessions < MAX_IDS)
        st->sessions[st->nsessions++] = rep->hello->session;
    if (rep->code == ATTND_ERR_OK && rep->body_case == ATTND__REPLY__BODY_STEP &&
        st->nsteps < MAX_IDS)
        st->steps[st->nsteps++] = rep->step->step;
}

static void run_frame(fuzz_state *st, const uint8_t *msg, size_t len, uint32_t pipe)
{
    Attnd__Request *req = attnd__request__unpack(NULL, len, msg);
    attnd_reply r;
    char *orig = NULL, **named;
    if (req == NULL) return; /* the server answers PROTOCOL; nothing past decode to exercise */
    map_ids(st, req);
    named = map_names(st, req, &orig);
    attnd_reply_init(&r, req->id);
    attnd_dispatch(st->sv, req, pipe, 0, &r);
    check_reply(&r);
#ifdef ATTND_FUZZ_REPLAY
    if (getenv("ATTND_FUZZ_VERBOSE"))
        fprintf(stderr, "  body %d -> %s %s\n", (int)req->body_case,
                attnd_err_name((attnd_err)r.reply.code), r.reply.message ? r.reply.message : "");
#endif
    note_reply(st, &r.reply);
    attnd_reply_fini(&r);
    if (named) *named = orig;
    attnd__request__free_unpacked(req, NULL);
}

/* The request bytes to post in a channel slot: the frame's request with ids and names mapped
 * (re-packed into area), or the frame's bytes as they are when they do not decode. */
static size_t channel_bytes(fuzz_state *st, const uint8_t *msg, size_t len, uint8_t *area)
{
    Attnd__Request *req = attnd__request__unpack(NULL, len, msg);
    char *orig = NULL, **named;
    size_t n = len <= FUZZ_CHAN_REQ ? len : FUZZ_CHAN_REQ;
    if (req == NULL) {
        memcpy(area, msg, n);
        return len; /* over req_bytes: the daemon must refuse the length */
    }
    map_ids(st, req);
    named = map_names(st, req, &orig);
    n = attnd__request__get_packed_size(req);
    if (n <= FUZZ_CHAN_REQ) attnd__request__pack(req, area);
    if (named) *named = orig;
    attnd__request__free_unpacked(req, NULL);
    return n;
}

/* Post a request in channel slot i and let the daemon poll its channels; a reply written
 * there must decode and follow the reply rules. */
static void run_channel_frame(fuzz_state *st, const uint8_t *msg, size_t len, uint32_t i)
{
    fuzz_obj *ch = &st->env->chan;
    attnd_channel_slot *slot = attnd_channel_slot_at(ch->base, i);
    uint8_t *req =
        attnd_channel_req_area(ch->base, FUZZ_CHAN_SLOTS, FUZZ_CHAN_REQ, FUZZ_CHAN_REP, i);
    int inflight = 0;
    uint32_t seq = atomic_load(&slot->req_seq);
    if (atomic_load(&slot->rep_seq) != seq) return; /* still busy: a client waits */
    slot->req_len = (uint32_t)channel_bytes(st, msg, len, req);
    seq = seq + 1 ? seq + 1 : 1;
    atomic_store(&slot->req_seq, seq);
    st->poller.poll(st->poller.arg, &inflight);
    if (atomic_load(&slot->rep_seq) != seq) return; /* no channel open here: nobody answered */
    if (slot->rep_len > FUZZ_CHAN_REP) fuzz_fail("channel reply over rep_bytes", NULL);
    Attnd__Reply *rep = attnd__reply__unpack(
        NULL, slot->rep_len,
        attnd_channel_rep_area(ch->base, FUZZ_CHAN_SLOTS, FUZZ_CHAN_REQ, FUZZ_CHAN_REP, i));
    if (rep == NULL) fuzz_fail("a channel reply that does not decode", NULL);
    if (rep->code > ATTND_ERR_FAILED_PRECONDITION ||
        (rep->code && !(rep->message && rep->message[0])))
        fuzz_fail("a channel reply with a bad code or no message", NULL);
#ifdef ATTND_FUZZ_REPLAY
    if (getenv("ATTND_FUZZ_VERBOSE"))
        fprintf(stderr, "  channel slot %u -> %s %s\n", i, attnd_err_name((attnd_err)rep->code),
                rep->message ? rep->message : "");
#endif
    note_reply(st, rep);
    attnd__reply__free_unpacked(rep, NULL);
}

/* A daemon of env's configuration with its shm guard, channels and wire (the dispatcher). */
static void fuzz_serve_start(fuzz_state *st, fuzz_env *env)
{
    char err[256];
    st->env = env;
    if (attnd_serve_alloc(&st->sv, &env->cfg, env->be, 1, &env->log, NULL, 0) != ATTND_ERR_OK)
        abort();
    if (attnd_serve_open_shm(st->sv, &env->cfg, err, sizeof err) != ATTND_ERR_OK) {
        fprintf(stderr, "fuzz: %s\n", err);
        abort();
    }
    attnd_wire_handler h = attnd_dispatch_wire_handler(st->sv);
    attnd_wire_init(&st->wire, &h, &env->log);
    attnd_serve_attach(st->sv, &st->wire, 0);
    st->poller = attnd_serve_poller(st->sv);
    fuzz_objs_reset(env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_env *env = fuzz_env_get();
    fuzz_state st = {0};
    /* pipe ids as NNG hands them out: arbitrary non-zero */
    static const uint32_t pipes[2] = {0x2f000001u, 0x2f000002u};
    fuzz_serve_start(&st, env);
    while (size >= 3) {
        uint8_t flags = data[0];
        size_t len = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3, size -= 3;
        if (len > size) len = size;
        if (flags & 4)
            fuzz_objs_write(env, data, len);
        else if (flags & 8)
            run_channel_frame(&st, data, len, flags & 1);
        else
            run_frame(&st, data, len, pipes[flags & 1]);
        data += len, size -= len;
        if (flags & 2) attnd_serve_pipe_closed(st.sv, pipes[flags & 1]);
    }
    attnd_serve_pipe_closed(st.sv, pipes[0]);
    attnd_serve_pipe_closed(st.sv, pipes[1]);
    attnd_serve_sweep(st.sv);
    if (attnd_cache_num_seqs(st.sv->cache) != 0 ||
        attnd_cache_blocks_free(st.sv->cache) != env->cfg.geometry.num_blocks)
        fuzz_fail("sequences or blocks left after every connection dropped", NULL);
    if (attnd_wire_busy(&st.wire) != 0) fuzz_fail("a channel request left unanswered", NULL);
    attnd_serve_free(st.sv);
    return 0;
}

#ifdef ATTND_FUZZ_REPLAY
/* Replay: every file named on the command line through the target; prints a CTest-readable
 * summary. A crash or an abort fails the test by itself. */
int main(int argc, char **argv)
{
    int passed = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        static uint8_t buf[1 << 20];
        if (f == NULL) {
            fprintf(stderr, "fuzz_replay: cannot open %s\n", argv[i]);
            return 1;
        }
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (getenv("ATTND_FUZZ_VERBOSE")) fprintf(stderr, "%s\n", argv[i]);
        LLVMFuzzerTestOneInput(buf, n);
        passed++;
    }
    printf("fuzz_replay: %d inputs replayed\n%d passed, 0 failed\n", passed, passed);
    return passed > 0 ? 0 : 1;
}
#endif
