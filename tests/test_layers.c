/* Per-layer attention options through the daemon's request path (dispatch, model, plan, CPU
 * backend): a model whose layers differ in window, softcap, scale, ALiBi (given and standard),
 * sinks and fp8 scales, on every cache dtype, over prefill, decode and chunked steps. Every
 * layer's output and LSE is checked against the float64 reference run on the daemon's own cache
 * with the options the test spells out itself (not the daemon's resolution of them). A model
 * whose every layer is windowed releases blocks and still matches. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_paged.h"
#include "serve/dispatch.h"
#include "serve/reply.h"
#include "serve/serve.h"
#include "testutil.h"

#define HQ 4
#define HK 2
#define D 32
#define BS 16
#define NL 8   /* layers: the 4-entry pattern twice */
#define NSEQ 2 /* sequences per step */

/* What a layer applies, written out by the test (the config below, expanded by hand). */
typedef struct layer_want {
    int32_t window;
    float softcap, scale, k_scale, v_scale;
    int alibi; /* 0 off, 1 given (GIVEN_SLOPES), 2 standard */
    int sinks; /* 0 none, 1 SINKS */
} layer_want;

static const float GIVEN_SLOPES[HQ] = {0.5f, 0.125f, 0.03125f, 0.25f};
static const float SINKS[HQ] = {1.5f, -0.5f, 3.0f, -2.0f};
static const float STD_SLOPES[HQ] = {0.25f, 0.0625f, 0.015625f, 0.00390625f}; /* 2^(-8i/4) */

/* Each option alone (window, softcap + scale, given ALiBi), then all together with sinks,
 * standard ALiBi and a layer's own fp8 scales. */
#define LAYERS_JSON                                                                                \
    "\"layers\": [{\"sliding_window\": 7}, {\"softcap\": 5, \"scale\": 0.3},"                      \
    " {\"alibi_slopes\": [0.5, 0.125, 0.03125, 0.25]}, {\"sinks\": [1.5, -0.5, 3.0, -2],"          \
    " \"alibi_slopes\": true, \"sliding_window\": 20, \"softcap\": 8, \"k_scale\": 0.5,"           \
    " \"v_scale\": 2}]"

static layer_want want_mixed(uint32_t l)
{
    float s0 = 1.0f / sqrtf((float)D);
    layer_want w[4] = {{7, 0, s0, 0.7f, 1.3f, 0, 0},
                       {0, 5, 0.3f, 0.7f, 1.3f, 0, 0},
                       {0, 0, s0, 0.7f, 1.3f, 1, 0},
                       {20, 8, s0, 0.5f, 2.0f, 2, 1}};
    return w[l % 4];
}

static layer_want want_windowed(uint32_t l)
{
    layer_want w = {l % 2 ? 20 : 7, 0, 1.0f / sqrtf((float)D), 0.7f, 1.3f, 0, (int)(l % 2)};
    return w;
}

typedef struct fixture {
    attnd_backend *be;
    attnd_serve *sv;
    attnd_log log;
    uint64_t session;
    attnd_rng rng;
    layer_want (*want)(uint32_t);
} fixture;

static void setup(fixture *f, const char *dtype, const char *layers, layer_want (*want)(uint32_t))
{
    attnd_config cfg;
    char err[512], json[1024];
    snprintf(json, sizeof json,
             "{\"geometry\": {\"num_layers\": %d, \"num_q_heads\": %d, \"num_kv_heads\": %d,"
             " \"head_size\": %d, \"block_size\": %d, \"cache_dtype\": \"%s\", \"num_blocks\": 64,"
             " \"max_blocks_per_seq\": 8, \"k_scale\": 0.7, \"v_scale\": 1.3, %s},"
             " \"linear\": {\"slots\": 0}}",
             NL, HQ, HK, D, BS, dtype, layers);
    attnd_backend_opts bo = {2, 0};
    memset(f, 0, sizeof *f);
    f->want = want;
    attnd_rng_seed(&f->rng, 77);
    cr_assert_eq(attnd_config_load_string(&cfg, json, err, sizeof err), ATTND_ERR_OK, "%s", err);
    attnd_log_init(&f->log, ATTND_LOG_ERROR, NULL);
    cr_assert_eq(attnd_backend_open(&f->be, "cpu", &bo), ATTND_ERR_OK);
    cr_assert_eq(attnd_serve_alloc(&f->sv, &cfg, f->be, 2, &f->log, err, sizeof err), ATTND_ERR_OK,
                 "%s", err);
    attnd_config_fini(&cfg); /* the model keeps what it needs */
}

static void teardown(fixture *f)
{
    attnd_serve_free(f->sv);
    attnd_backend_close(f->be);
}

static attnd_err call(fixture *f, Attnd__Request *req, attnd_reply *r)
{
    req->session = f->session;
    attnd_reply_init(r, req->id);
    attnd_dispatch(f->sv, req, 1, 0, r);
    return (attnd_err)r->reply.code;
}

static void hello_and_create(fixture *f)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello h = ATTND__HELLO__INIT;
    attnd_reply r;
    h.protocol_version = ATTND_PROTOCOL_VERSION;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &h;
    cr_assert_eq(call(f, &req, &r), ATTND_ERR_OK, "%s", r.msg);
    f->session = r.hello.session;
    attnd_reply_fini(&r);
    for (uint64_t id = 1; id <= NSEQ; id++) {
        Attnd__Request c = ATTND__REQUEST__INIT;
        Attnd__CreateSequence m = ATTND__CREATE_SEQUENCE__INIT;
        m.seq_id = id;
        c.body_case = ATTND__REQUEST__BODY_CREATE;
        c.create = &m;
        cr_assert_eq(call(f, &c, &r), ATTND_ERR_OK, "%s", r.msg);
        attnd_reply_fini(&r);
    }
}

static uint64_t begin(fixture *f, const uint32_t *n)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep m = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq e[NSEQ], *ep[NSEQ];
    attnd_reply r;
    for (int i = 0; i < NSEQ; i++) {
        attnd__step_seq__init(&e[i]);
        e[i].seq_id = (uint64_t)i + 1, e[i].new_tokens = n[i], ep[i] = &e[i];
    }
    m.n_seqs = NSEQ, m.seqs = ep;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &m;
    cr_assert_eq(call(f, &req, &r), ATTND_ERR_OK, "%s", r.msg);
    uint64_t step = r.step.step;
    attnd_reply_fini(&r);
    return step;
}

static void end(fixture *f, uint64_t step)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__EndStep m = ATTND__END_STEP__INIT;
    attnd_reply r;
    m.step = step;
    req.body_case = ATTND__REQUEST__BODY_END_STEP;
    req.end_step = &m;
    cr_assert_eq(call(f, &req, &r), ATTND_ERR_OK, "%s", r.msg);
    attnd_reply_fini(&r);
}

static void tref(Attnd__TensorRef *t, int64_t *shape, int ndim, const float *buf, size_t n)
{
    attnd__tensor_ref__init(t);
    t->dtype = ATTND__DTYPE__F32;
    t->n_shape = (size_t)ndim;
    t->shape = shape;
    if (buf == NULL) return; /* an INLINE output */
    t->data.data = (uint8_t *)buf;
    t->data.len = n * sizeof(float);
}

/* ---------------------------------------------------------------- the reference */

/* The block table, lengths and query offsets of the step's sequences as the cache holds them
 * (from each sequence's first held block: a windowed model released the others). */
typedef struct step_index {
    int32_t bt[NSEQ][16], sl[NSEQ], qsl[NSEQ + 1];
} step_index;

static void index_of(fixture *f, const uint32_t *n, step_index *ix)
{
    memset(ix, 0, sizeof *ix);
    for (int i = 0; i < NSEQ; i++) {
        attnd_seq *s = attnd_cache_find(f->sv->cache, f->session, (uint64_t)i + 1);
        cr_assert_not_null(s);
        cr_assert_leq(s->nblocks, 16);
        memcpy(ix->bt[i], s->blocks, s->nblocks * sizeof(int32_t));
        ix->sl[i] = (int32_t)(s->num_tokens + s->pend_tokens - s->base * BS);
        ix->qsl[i + 1] = ix->qsl[i] + (int32_t)n[i];
    }
}

static attnd_tensor host_tensor(void *data, attnd_dtype dt, int ndim, int64_t a, int64_t b,
                                int64_t c)
{
    attnd_tensor t;
    int64_t shape[3] = {a, b, c};
    attnd_tensor_init(&t, data, dt, ndim, shape);
    return t;
}

/* Layer l's reference over the daemon's cache, with the options the test expects. */
static void reference(fixture *f, uint32_t l, const float *q, int64_t T, step_index *ix,
                      double *out, double *lse)
{
    layer_want w = f->want(l);
    attnd_paged_params p;
    memset(&p, 0, sizeof p);
    p.q = host_tensor((void *)q, ATTND_DTYPE_F32, 3, T, HQ, D);
    p.k_cache = attnd_devmem_cache(f->sv->dm, l, 0);
    p.v_cache = attnd_devmem_cache(f->sv->dm, l, 1);
    p.block_tables = host_tensor(ix->bt, ATTND_DTYPE_I32, 2, NSEQ, 16, 0);
    p.seq_lens = host_tensor(ix->sl, ATTND_DTYPE_I32, 1, NSEQ, 0, 0);
    p.query_start_loc = host_tensor(ix->qsl, ATTND_DTYPE_I32, 1, NSEQ + 1, 0, 0);
    if (w.alibi)
        p.alibi_slopes = host_tensor((void *)(w.alibi == 1 ? GIVEN_SLOPES : STD_SLOPES),
                                     ATTND_DTYPE_F32, 1, HQ, 0, 0);
    if (w.sinks) p.sinks = host_tensor((void *)SINKS, ATTND_DTYPE_F32, 1, HQ, 0, 0);
    p.scale = w.scale, p.softcap = w.softcap, p.sliding_window = w.window;
    p.k_scale = w.k_scale, p.v_scale = w.v_scale;
    attnd_ref_paged(&p, out, lse);
}

/* ---------------------------------------------------------------- one layer */

static void fill(fixture *f, float *x, int64_t n, double sigma)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(sigma * attnd_rng_normal(&f->rng));
}

/* Attend layer l of the step and check out and LSE against the reference. */
static void attend_and_check(fixture *f, uint64_t step, uint32_t l, const uint32_t *n)
{
    int64_t T = n[0] + n[1], sq[3] = {T, HQ, D}, sk[3] = {T, HK, D}, sl[2] = {HQ, T};
    float *q = malloc(sizeof(float) * T * HQ * D), *k = malloc(sizeof(float) * T * HK * D);
    float *v = malloc(sizeof(float) * T * HK * D);
    fill(f, q, T * HQ * D, 1.5), fill(f, k, T * HK * D, 1.0), fill(f, v, T * HK * D, 1.0);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Attend m = ATTND__ATTEND__INIT;
    Attnd__TensorRef tq, tk, tv, to, tl;
    attnd_reply r;
    tref(&tq, sq, 3, q, (size_t)(T * HQ * D)), tref(&tk, sk, 3, k, (size_t)(T * HK * D));
    tref(&tv, sk, 3, v, (size_t)(T * HK * D)), tref(&to, sq, 3, NULL, 0);
    tref(&tl, sl, 2, NULL, 0);
    m.step = step, m.layer = l, m.q = &tq, m.k_new = &tk, m.v_new = &tv, m.out = &to;
    m.out_lse = &tl;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &m;
    cr_assert_eq(call(f, &req, &r), ATTND_ERR_OK, "layer %u: %s", l, r.msg);
    cr_assert_eq(r.outputs.n_data, 2);
    const float *o = (const float *)r.outputs.data[0].data,
                *ls = (const float *)r.outputs.data[1].data;
    step_index ix;
    double *ref = calloc((size_t)(T * HQ * D), sizeof *ref),
           *rl = calloc((size_t)(T * HQ), sizeof *rl);
    index_of(f, n, &ix);
    reference(f, l, q, T, &ix, ref, rl);
    for (int64_t row = 0; row < T * HQ; row++) {
        double got[D];
        for (int e = 0; e < D; e++)
            got[e] = o[row * D + e];
        double err = attnd_rel_l2(got, ref + row * D, D);
        cr_assert(err <= 1e-4, "layer %u token %lld head %lld: rel L2 %g", l, (long long)(row / HQ),
                  (long long)(row % HQ), err);
        int64_t h = row % HQ, t = row / HQ;
        cr_assert(fabs(ls[h * T + t] - rl[h * T + t]) <= 1e-4 * (1 + fabs(rl[h * T + t])),
                  "layer %u lse[%lld][%lld] %g vs %g", l, (long long)h, (long long)t, ls[h * T + t],
                  rl[h * T + t]);
    }
    attnd_reply_fini(&r);
    free(q), free(k), free(v), free(ref), free(rl);
}

/* Prefills of 37 and 5, ten decode steps, then chunks of 9 and 1: every layer of every step. */
static void run_steps(fixture *f, int steps)
{
    uint32_t shapes[3][NSEQ] = {{37, 5}, {1, 1}, {1, 9}};
    hello_and_create(f);
    for (int s = 0; s < steps; s++) {
        const uint32_t *n = shapes[s == 0 ? 0 : (s % 6 == 5 ? 2 : 1)];
        uint64_t step = begin(f, n);
        for (uint32_t l = 0; l < NL; l++)
            attend_and_check(f, step, l, n);
        end(f, step);
    }
}

Test(layers, each_option_alone_and_together_on_every_cache_dtype, .timeout = 120)
{
    static const char *dtypes[] = {"f32", "f16", "bf16", "fp8_e4m3"};
    for (int i = 0; i < 4; i++) {
        fixture f;
        setup(&f, dtypes[i], LAYERS_JSON, want_mixed);
        run_steps(&f, 12);
        teardown(&f);
    }
}

/* The options really differ per layer: the same inputs give different outputs on layers 0-3,
 * and the same on layers l and l + 4 (the pattern repeats). */
Test(layers, the_pattern_repeats_and_the_options_change_the_result, .timeout = 120)
{
    fixture f;
    setup(&f, "f32", LAYERS_JSON, want_mixed);
    for (uint32_t l = 0; l < 4; l++) {
        layer_want a = want_mixed(l), b = want_mixed(l + 4);
        cr_assert(memcmp(&a, &b, sizeof a) == 0);
        const attnd_model_layer *m = &f.sv->model.layers[l], *m4 = &f.sv->model.layers[l + 4];
        cr_assert_eq(m->sliding_window, m4->sliding_window);
        cr_assert_eq(m->softcap, m4->softcap);
    }
    cr_assert_eq(f.sv->model.layers[3].sinks[2], 3.0f);
    cr_assert_null(f.sv->model.layers[2].sinks);
    cr_assert_eq(f.sv->model.window_all, 0, "not every layer is windowed");
    teardown(&f);
}

/* Every layer windowed: blocks wholly before the largest window are released as the sequences
 * grow, and every layer still matches the reference over the blocks held. */
Test(layers, a_windowed_model_releases_blocks_and_stays_exact, .timeout = 120)
{
    fixture f;
    setup(&f, "bf16",
          "\"layers\": [{\"sliding_window\": 7}, {\"sliding_window\": 20,"
          " \"sinks\": [1.5, -0.5, 3.0, -2]}]",
          want_windowed);
    cr_assert_eq(f.sv->model.window_all, 20);
    run_steps(&f, 30);
    attnd_seq *s = attnd_cache_find(f.sv->cache, f.session, 1);
    /* 37 + 29 tokens: the next query (position 66) sees keys 47.., from block 2 on */
    cr_assert_eq(s->num_tokens, 66);
    cr_assert_eq(s->base, 2);
    cr_assert_eq(s->nblocks, 3, "holds %u blocks, not 5", s->nblocks);
    teardown(&f);
}
