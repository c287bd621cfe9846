/* Steps through the request handlers, in process (no socket), looking at cache memory itself:
 * an Attend writes its K/V rows into the reserved slots; a commit needs every layer attended
 * exactly once (else FAILED_PRECONDITION, the step stays open); abort returns every block; fork +
 * COW copies the shared partial block before the child writes; sessions are bound to their
 * connection, a Hello from a connection already gone opens nothing, and a dropped connection's
 * sequences are reclaimed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/dtype.h"
#include "serve/dispatch.h"

#define L 2
#define HQ 4
#define HK 2
#define D 32
#define BS 16
#define NB 64

typedef struct fixture {
    attnd_backend *be;
    attnd_serve *sv;
    attnd_log log;
    uint64_t session;
} fixture;

static void setup(fixture *f)
{
    attnd_config cfg;
    char err[256];
    const char *json = "{\"geometry\": {\"num_layers\": 2, \"num_q_heads\": 4, \"num_kv_heads\": 2,"
                       " \"head_size\": 32, \"block_size\": 16, \"cache_dtype\": \"bf16\","
                       " \"num_blocks\": 64, \"max_blocks_per_seq\": 16},"
                       " \"limits\": {\"reclaim_timeout_ms\": 0}}";
    attnd_backend_opts bo = {1, 0};
    memset(f, 0, sizeof *f);
    cr_assert_eq(attnd_config_load_string(&cfg, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    attnd_log_init(&f->log, ATTND_LOG_ERROR, NULL);
    cr_assert_eq(attnd_backend_open(&f->be, "cpu", &bo), ATTND_ERR_OK);
    cr_assert_eq(attnd_serve_alloc(&f->sv, &cfg, f->be, 1, &f->log, err, sizeof err), ATTND_ERR_OK);
}

static void teardown(fixture *f)
{
    attnd_serve_free(f->sv);
    attnd_backend_close(f->be);
}

/* Handle req from pipe; returns the code, the reply left in r (caller finis it). */
static attnd_err call(fixture *f, Attnd__Request *req, uint32_t pipe, attnd_reply *r)
{
    attnd_reply_init(r, req->id);
    attnd_dispatch(f->sv, req, pipe, 0, r);
    return (attnd_err)r->reply.code;
}

static attnd_err call_simple(fixture *f, Attnd__Request *req, uint32_t pipe)
{
    attnd_reply r;
    attnd_err rv = call(f, req, pipe, &r);
    attnd_reply_fini(&r);
    return rv;
}

static uint64_t hello(fixture *f, uint32_t pipe)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello h = ATTND__HELLO__INIT;
    attnd_reply r;
    h.protocol_version = ATTND_PROTOCOL_VERSION;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &h;
    cr_assert_eq(call(f, &req, pipe, &r), ATTND_ERR_OK, "%s", r.msg);
    uint64_t s = r.hello.session;
    attnd_reply_fini(&r);
    return s;
}

static attnd_err create(fixture *f, uint64_t id)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__CreateSequence m = ATTND__CREATE_SEQUENCE__INIT;
    m.seq_id = id;
    req.session = f->session;
    req.body_case = ATTND__REQUEST__BODY_CREATE;
    req.create = &m;
    return call_simple(f, &req, 1);
}

static uint64_t begin(fixture *f, uint64_t id, uint32_t n)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep m = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq e = ATTND__STEP_SEQ__INIT, *ep = &e;
    attnd_reply r;
    e.seq_id = id;
    e.new_tokens = n;
    m.n_seqs = 1;
    m.seqs = &ep;
    req.session = f->session;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &m;
    cr_assert_eq(call(f, &req, 1, &r), ATTND_ERR_OK, "%s", r.msg);
    uint64_t step = r.step.step;
    attnd_reply_fini(&r);
    return step;
}

static attnd_err end(fixture *f, uint64_t step, int abort)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__EndStep m = ATTND__END_STEP__INIT;
    m.step = step;
    m.abort = abort;
    req.session = f->session;
    req.body_case = ATTND__REQUEST__BODY_END_STEP;
    req.end_step = &m;
    return call_simple(f, &req, 1);
}

/* An INLINE f32 tensor [T, H, D] with values base + index / 1024. */
static void inline_ref(Attnd__TensorRef *t, int64_t *shape, float *buf, int64_t T, int64_t H,
                       float base)
{
    attnd__tensor_ref__init(t);
    shape[0] = T, shape[1] = H, shape[2] = D;
    t->dtype = ATTND__DTYPE__F32;
    t->n_shape = 3;
    t->shape = shape;
    if (buf == NULL) return; /* an output */
    for (int64_t i = 0; i < T * H * D; i++)
        buf[i] = base + (float)(i % 97) / 128.0f;
    t->data.data = (uint8_t *)buf;
    t->data.len = (size_t)(T * H * D) * sizeof(float);
}

/* Attend one layer with K = 1 + i/128, V = 2 + i/128 (INLINE), out INLINE. */
static attnd_err attend(fixture *f, uint64_t step, uint32_t layer, int64_t T)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend m = ATTND__ATTEND__INIT;
    Attnd__TensorRef q, k, v, out;
    int64_t sq[3], sk[3], sv[3], so[3];
    float *bq = malloc(sizeof(float) * T * HQ * D), *bk = malloc(sizeof(float) * T * HK * D);
    float *bv = malloc(sizeof(float) * T * HK * D);
    inline_ref(&q, sq, bq, T, HQ, 0.0f);
    inline_ref(&k, sk, bk, T, HK, 1.0f);
    inline_ref(&v, sv, bv, T, HK, 2.0f);
    inline_ref(&out, so, NULL, T, HQ, 0.0f);
    m.step = step, m.layer = layer, m.q = &q, m.k_new = &k, m.v_new = &v, m.out = &out;
    req.session = f->session;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &m;
    attnd_reply r;
    attnd_err rv = call(f, &req, 1, &r);
    if (rv == ATTND_ERR_OK) {
        cr_assert_eq(r.reply.body_case, ATTND__REPLY__BODY_OUTPUTS);
        cr_assert_eq(r.outputs.n_data, 1);
        cr_assert_eq(r.outputs.data[0].len, sizeof(float) * T * HQ * D);
    }
    attnd_reply_fini(&r);
    free(bq);
    free(bk);
    free(bv);
    return rv;
}

/* Element e of row `slot` of layer l's K (or V) cache, as float. */
static float cache_at(fixture *f, int v, uint32_t l, int64_t slot, int64_t e)
{
    const uint16_t *base = (v ? f->sv->dm->v_cache : f->sv->dm->k_cache)[l];
    return attnd_bf16_to_f32(base[slot * HK * D + e]);
}

static void poison_cache(fixture *f)
{
    size_t bytes = attnd_model_block_bytes(&f->sv->model) * NB;
    for (int l = 0; l < L; l++) {
        memset(f->sv->dm->k_cache[l], 0x3f, bytes);
        memset(f->sv->dm->v_cache[l], 0x3f, bytes);
    }
}

/* call, expecting code and a message containing part */
static void expect_msg(fixture *f, Attnd__Request *req, attnd_err code, const char *part)
{
    attnd_reply r;
    attnd_err rv = call(f, req, 1, &r);
    cr_assert_eq(rv, code, "got %s (%s), expected %s", attnd_err_name(rv), r.msg,
                 attnd_err_name(code));
    cr_assert_not_null(strstr(r.msg, part), "\"%s\" not in \"%s\"", part, r.msg);
    attnd_reply_fini(&r);
}

Test(step, attend_writes_its_rows_and_commit_needs_every_layer_once, .timeout = 60)
{
    fixture f;
    setup(&f);
    f.session = hello(&f, 1);
    poison_cache(&f); /* what an earlier owner of the blocks left */
    cr_assert_eq(create(&f, 1), ATTND_ERR_OK);
    uint64_t st = begin(&f, 1, 5);
    cr_assert_eq(attend(&f, st, 0, 5), ATTND_ERR_OK);
    /* layer 1 never attended: no commit (its rows would hold the poison), the step stays open */
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__EndStep em = ATTND__END_STEP__INIT;
    em.step = st;
    req.session = f.session, req.body_case = ATTND__REQUEST__BODY_END_STEP, req.end_step = &em;
    expect_msg(&f, &req, ATTND_ERR_FAILED_PRECONDITION, "layer 1 not attended");
    cr_assert_eq(attnd_cache_find(f.sv->cache, f.session, 1)->step, st);
    cr_assert_eq(attend(&f, st, 1, 5), ATTND_ERR_OK);
    cr_assert_eq(end(&f, st, 0), ATTND_ERR_OK);
    attnd_seq *q = attnd_cache_find(f.sv->cache, f.session, 1);
    cr_assert_eq(q->num_tokens, 5);
    for (int64_t t = 0; t < 5; t++) {
        int64_t slot = attnd_cache_slot(f.sv->cache, q, (uint32_t)t);
        for (int64_t e = 0; e < HK * D; e++) {
            float want = (float)((t * HK * D + e) % 97) / 128.0f;
            for (uint32_t l = 0; l < L; l++) {
                cr_assert_eq(cache_at(&f, 0, l, slot, e),
                             attnd_bf16_to_f32(attnd_f32_to_bf16(1.0f + want)));
                cr_assert_eq(cache_at(&f, 1, l, slot, e),
                             attnd_bf16_to_f32(attnd_f32_to_bf16(2.0f + want)));
            }
        }
    }
    /* a second Attend of a layer is refused, and the step can then only abort */
    st = begin(&f, 1, 2);
    cr_assert_eq(attend(&f, st, 1, 2), ATTND_ERR_OK);
    cr_assert_eq(attend(&f, st, 1, 2), ATTND_ERR_FAILED_PRECONDITION);
    cr_assert_eq(attend(&f, st, 0, 2), ATTND_ERR_OK);
    em.step = st;
    expect_msg(&f, &req, ATTND_ERR_FAILED_PRECONDITION, "layer 1 attended more than once");
    cr_assert_eq(end(&f, st, 1), ATTND_ERR_OK);
    cr_assert_eq(q->num_tokens, 5);
    teardown(&f);
}

Test(step, abort_returns_every_block_and_keeps_the_sequence, .timeout = 60)
{
    fixture f;
    setup(&f);
    f.session = hello(&f, 1);
    cr_assert_eq(create(&f, 1), ATTND_ERR_OK);
    uint64_t st = begin(&f, 1, 40);
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), NB - 3);
    cr_assert_eq(attnd_cache_find(f.sv->cache, f.session, 1)->step, st);
    cr_assert_eq(end(&f, st, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), NB);
    attnd_seq *q = attnd_cache_find(f.sv->cache, f.session, 1);
    cr_assert_eq(q->num_tokens, 0);
    cr_assert_eq(q->step, 0);
    cr_assert_eq(end(&f, st, 0), ATTND_ERR_NOT_FOUND, "a step ends once");
    /* a step larger than the pool: nothing reserved, nothing leaked */
    cr_assert_eq(create(&f, 2), ATTND_ERR_OK);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep m = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq a = ATTND__STEP_SEQ__INIT, b = ATTND__STEP_SEQ__INIT, *e[2] = {&a, &b};
    a.seq_id = 1, a.new_tokens = 16 * 16, b.seq_id = 2, b.new_tokens = 16 * 16;
    m.n_seqs = 2, m.seqs = e;
    req.session = f.session, req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP, req.begin_step = &m;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_OK, "32 blocks each fit in 64");
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), 32);
    a.seq_id = 3;
    cr_assert_eq(create(&f, 3), ATTND_ERR_OK);
    b.seq_id = 1; /* in the open step */
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_find(f.sv->cache, f.session, 3)->step, 0, "unmarked after failure");
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), 32);
    teardown(&f);
}

Test(step, fork_then_cow_copies_the_partial_block, .timeout = 60)
{
    fixture f;
    setup(&f);
    f.session = hello(&f, 1);
    cr_assert_eq(create(&f, 1), ATTND_ERR_OK);
    uint64_t st = begin(&f, 1, 20);
    for (uint32_t l = 0; l < L; l++)
        attend(&f, st, l, 20);
    cr_assert_eq(end(&f, st, 0), ATTND_ERR_OK);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__ForkSequence fk = ATTND__FORK_SEQUENCE__INIT;
    fk.parent = 1, fk.child = 2;
    req.session = f.session, req.body_case = ATTND__REQUEST__BODY_FORK, req.fork = &fk;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_OK);
    attnd_seq *p = attnd_cache_find(f.sv->cache, f.session, 1);
    attnd_seq *c = attnd_cache_find(f.sv->cache, f.session, 2);
    int32_t shared = p->blocks[1];
    float before = cache_at(&f, 0, 1, (int64_t)shared * BS + 3, 5);
    st = begin(&f, 2, 1);
    cr_assert_neq(c->blocks[1], shared, "the child got its own copy of the partial block");
    for (uint32_t l = 0; l < L; l++)
        for (int64_t row = 0; row < 4; row++)
            for (int64_t e = 0; e < HK * D; e++) {
                cr_assert_eq(cache_at(&f, 0, l, (int64_t)c->blocks[1] * BS + row, e),
                             cache_at(&f, 0, l, (int64_t)shared * BS + row, e));
                cr_assert_eq(cache_at(&f, 1, l, (int64_t)c->blocks[1] * BS + row, e),
                             cache_at(&f, 1, l, (int64_t)shared * BS + row, e));
            }
    for (uint32_t l = 0; l < L; l++)
        attend(&f, st, l, 1);
    cr_assert_eq(end(&f, st, 0), ATTND_ERR_OK);
    cr_assert_eq(cache_at(&f, 0, 1, (int64_t)shared * BS + 3, 5), before, "parent untouched");
    cr_assert_eq(p->blocks[1], shared);
    cr_assert_eq(c->num_tokens, 21);
    teardown(&f);
}

Test(step, sessions_are_bound_to_their_connection_and_reclaimed, .timeout = 60)
{
    fixture f;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello h = ATTND__HELLO__INIT;
    Attnd__QuerySequence qm = ATTND__QUERY_SEQUENCE__INIT;
    setup(&f);
    /* a Hello whose connection is already gone opens no session */
    h.protocol_version = ATTND_PROTOCOL_VERSION;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &h;
    cr_assert_eq(call_simple(&f, &req, 0), ATTND_ERR_UNAVAILABLE);
    cr_assert_eq(f.sv->sessions.count, 0);
    h.protocol_version = 2;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_UNSUPPORTED);
    f.session = hello(&f, 1);
    cr_assert_eq(create(&f, 1), ATTND_ERR_OK);
    cr_assert_eq(create(&f, 1), ATTND_ERR_ALREADY_EXISTS);
    cr_assert_eq(create(&f, 0), ATTND_ERR_INVALID_ARGUMENT);
    begin(&f, 1, 33);
    /* the same session named from another connection, and an unknown one */
    qm.seq_id = 1;
    req.session = f.session, req.body_case = ATTND__REQUEST__BODY_QUERY, req.query = &qm;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_OK);
    cr_assert_eq(call_simple(&f, &req, 2), ATTND_ERR_PERMISSION_DENIED);
    req.session = f.session + 7;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_NOT_FOUND);
    /* another session cannot see sequence 1 */
    uint64_t other = hello(&f, 2);
    req.session = other;
    cr_assert_eq(call_simple(&f, &req, 2), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), NB - 3);
    /* connection 1 drops (reclaim timeout 0): its open step is aborted, its blocks return */
    attnd_serve_pipe_closed(f.sv, 1);
    cr_assert_eq(attnd_cache_blocks_free(f.sv->cache), NB);
    cr_assert_eq(attnd_cache_num_seqs(f.sv->cache), 0);
    cr_assert_eq(f.sv->sessions.count, 1);
    req.session = f.session;
    cr_assert_eq(call_simple(&f, &req, 1), ATTND_ERR_NOT_FOUND);
    teardown(&f);
}

Test(step, bad_tensor_references_name_the_field, .timeout = 60)
{
    fixture f;
    setup(&f);
    f.session = hello(&f, 1);
    cr_assert_eq(create(&f, 1), ATTND_ERR_OK);
    uint64_t st = begin(&f, 1, 3);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend m = ATTND__ATTEND__INIT;
    Attnd__TensorRef q, k, v, out;
    int64_t sq[3], sk[3], sv[3], so[3], strides[3] = {HQ * D, D, 1};
    float bq[3 * HQ * D], bk[3 * HK * D], bv[3 * HK * D];
    inline_ref(&q, sq, bq, 3, HQ, 0);
    inline_ref(&k, sk, bk, 3, HK, 0);
    inline_ref(&v, sv, bv, 3, HK, 0);
    inline_ref(&out, so, NULL, 3, HQ, 0);
    m.step = st, m.q = &q, m.k_new = &k, m.v_new = &v, m.out = &out;
    req.session = f.session, req.body_case = ATTND__REQUEST__BODY_ATTEND, req.attend = &m;
    attnd_reply r;
    /* each case: break one thing, expect the code and the field in the message */
    q.region = 9;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(r.msg, "q.region"), "%s", r.msg);
    attnd_reply_fini(&r);
    q.region = 0;
    sk[1] = 3;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "k_new.shape"), "%s", r.msg);
    attnd_reply_fini(&r);
    sk[1] = HK;
    v.dtype = ATTND__DTYPE__I32;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "v_new.dtype"), "%s", r.msg);
    attnd_reply_fini(&r);
    v.dtype = 77;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "v_new.dtype: 77"), "%s", r.msg);
    attnd_reply_fini(&r);
    v.dtype = ATTND__DTYPE__F32;
    /* strides whose products overflow 64 bits, before anything is allocated */
    strides[0] = INT64_MAX / 2;
    out.n_strides = 3, out.strides = strides;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "out: shape x strides x element size overflows"), "%s", r.msg);
    attnd_reply_fini(&r);
    /* an INLINE output larger than limits.max_inline_bytes */
    strides[0] = (int64_t)1 << 30;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "limits.max_inline_bytes"), "%s", r.msg);
    attnd_reply_fini(&r);
    out.n_strides = 0;
    q.data.len -= 4;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "q.data"), "%s", r.msg);
    attnd_reply_fini(&r);
    q.data.len += 4;
    m.layer = L;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(r.msg, "layer"), "%s", r.msg);
    attnd_reply_fini(&r);
    m.layer = 0;
    m.step = st + 1;
    cr_assert_eq(call(&f, &req, 1, &r), ATTND_ERR_NOT_FOUND);
    cr_assert_not_null(strstr(r.msg, "step"), "%s", r.msg);
    attnd_reply_fini(&r);
    teardown(&f);
}
