/* libFuzzer target: the daemon's request path after the socket, decode (protobuf-c), validation
 * and dispatch (attnd_dispatch on the CPU backend), reply packing, connection drops and the
 * reclaim of their sessions.
 *
 * An input is a sequence of frames (fuzz/gen_corpus.py writes the seeds): u8 flags, u16 LE
 * length, then an attnd.Request. flags bit 0 picks connection 1 or 2, bit 1 drops that
 * connection after the frame. session 1..4 in a frame means "the session of the 1st..4th Hello
 * that succeeded", step 1..4 "the 1st..4th step begun", so inputs get past the handshake
 * whatever ids the daemon hands out.
 *
 * Beyond crashes and sanitizer reports, each input must leave the daemon clean: every reply a
 * known code, an error reply names what was wrong, and once both connections are dropped (reclaim
 * timeout 0) no sequence is left and every block is free. A violation aborts.
 *
 * Built with -DATTND_FUZZ_REPLAY (no libFuzzer), main() runs the files given on the command line
 * through the same function: the regression test over fuzz/corpus and fuzz/regressions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd.pb-c.h"
#include "state/cache.h"
#include "core/config.h"
#include "core/log.h"
#include "serve/dispatch.h"

#define MAX_IDS 4

typedef struct fuzz_env {
    attnd_backend *be;
    attnd_config cfg;
    attnd_log log;
    FILE *devnull;
} fuzz_env;

typedef struct fuzz_state {
    attnd_serve *sv;
    uint64_t sessions[MAX_IDS], steps[MAX_IDS];
    int nsessions, nsteps;
} fuzz_state;

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
    if (attnd_config_validate(&env.cfg, err, sizeof err) != ATTND_ERR_OK) {
        fprintf(stderr, "fuzz: bad harness config: %s\n", err);
        abort();
    }
    env.devnull = fopen("/dev/null", "w");
    attnd_log_init(&env.log, ATTND_LOG_ERROR, env.devnull);
    attnd_backend_opts bo = {1, 0};
    if (attnd_backend_open(&env.be, "cpu", &bo) != ATTND_ERR_OK) abort();
    ready = 1;
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

static void run_frame(fuzz_state *st, const uint8_t *msg, size_t len, uint32_t pipe)
{
    Attnd__Request *req = attnd__request__unpack(NULL, len, msg);
    attnd_reply r;
    if (req == NULL) return; /* the server answers PROTOCOL; nothing past decode to exercise */
    map_ids(st, req);
    attnd_reply_init(&r, req->id);
    attnd_dispatch(st->sv, req, pipe, 0, &r);
    check_reply(&r);
#ifdef ATTND_FUZZ_REPLAY
    if (getenv("ATTND_FUZZ_VERBOSE"))
        fprintf(stderr, "  body %d -> %s %s\n", (int)req->body_case,
                attnd_err_name((attnd_err)r.reply.code), r.reply.message ? r.reply.message : "");
#endif
    if (r.reply.code == ATTND_ERR_OK && r.reply.body_case == ATTND__REPLY__BODY_HELLO &&
        st->nsessions < MAX_IDS)
        st->sessions[st->nsessions++] = r.reply.hello->session;
    if (r.reply.code == ATTND_ERR_OK && r.reply.body_case == ATTND__REPLY__BODY_STEP &&
        st->nsteps < MAX_IDS)
        st->steps[st->nsteps++] = r.reply.step->step;
    attnd_reply_fini(&r);
    attnd__request__free_unpacked(req, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_env *env = fuzz_env_get();
    fuzz_state st = {0};
    /* pipe ids as NNG hands them out: arbitrary non-zero */
    static const uint32_t pipes[2] = {0x2f000001u, 0x2f000002u};
    if (attnd_serve_alloc(&st.sv, &env->cfg, env->be, 1, &env->log) != ATTND_ERR_OK) abort();
    while (size >= 3) {
        uint8_t flags = data[0];
        size_t len = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3, size -= 3;
        if (len > size) len = size;
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
