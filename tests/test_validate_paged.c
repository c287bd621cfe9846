/* Bad descriptors for paged attention (2D and 3D) and cache write: each one returns
 * ATTND_ERR_INVALID_ARGUMENT with a message naming the field, writes nothing, and never
 * crashes. Every case starts from a valid descriptor (checked to pass) and breaks one thing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/kernels.h"
#include "testutil.h"

/* Two sequences: a decode after 20 cached tokens (2 blocks) and a 3-token prefill (1 block). */
typedef struct pfix {
    attnd_backend *b;
    attnd_test_tensor q, k, v, out, lse, bt, sl, qsl, alibi, sinks;
    attnd_paged_params p;
    void *ws;
} pfix;

static void set_i32(attnd_test_tensor *tt, const int32_t *vals, size_t n)
{
    memcpy(tt->buf, vals, n * sizeof *vals);
}

static void pfix_init(pfix *f)
{
    static const int32_t bt[] = {0, 1, 7777, 2, -5, -5}, sl[] = {21, 3}, qsl[] = {0, 1, 4};
    int64_t qs[3] = {4, 4, 32}, cs[4] = {4, 16, 2, 32}, bts[2] = {2, 3}, two = 2, three = 3;
    int64_t lses[2] = {4, 4}, four = 4;
    attnd_backend_opts opts = {1, 0};
    attnd_rng r;
    memset(f, 0, sizeof *f);
    attnd_rng_seed(&r, 1);
    cr_assert_eq(attnd_backend_open(&f->b, "cpu", &opts), ATTND_ERR_OK);
    attnd_tt_alloc(&f->q, ATTND_DTYPE_BF16, 3, qs);
    attnd_tt_alloc(&f->out, ATTND_DTYPE_BF16, 3, qs);
    attnd_tt_alloc(&f->k, ATTND_DTYPE_FP8_E4M3, 4, cs);
    attnd_tt_alloc(&f->v, ATTND_DTYPE_FP8_E4M3, 4, cs);
    attnd_tt_alloc(&f->lse, ATTND_DTYPE_F32, 2, lses);
    attnd_tt_alloc(&f->bt, ATTND_DTYPE_I32, 2, bts);
    attnd_tt_alloc(&f->sl, ATTND_DTYPE_I32, 1, &two);
    attnd_tt_alloc(&f->qsl, ATTND_DTYPE_I32, 1, &three);
    attnd_tt_alloc(&f->alibi, ATTND_DTYPE_F32, 1, &four);
    attnd_tt_alloc(&f->sinks, ATTND_DTYPE_F32, 1, &four);
    attnd_tt_fill_normal(&f->sinks, &r, 1.0, 1.0);
    attnd_tt_fill_normal(&f->q, &r, 1.0, 1.0);
    attnd_tt_fill_normal(&f->k, &r, 1.0, 1.0);
    attnd_tt_fill_normal(&f->v, &r, 1.0, 1.0);
    attnd_tt_fill_normal(&f->alibi, &r, 0.1, 1.0);
    set_i32(&f->bt, bt, 6);
    set_i32(&f->sl, sl, 2);
    set_i32(&f->qsl, qsl, 3);
    attnd_paged_params *p = &f->p;
    p->q = f->q.t, p->k_cache = f->k.t, p->v_cache = f->v.t, p->out = f->out.t;
    p->out_lse = f->lse.t, p->block_tables = f->bt.t, p->seq_lens = f->sl.t;
    p->query_start_loc = f->qsl.t, p->alibi_slopes = f->alibi.t, p->sinks = f->sinks.t;
    p->scale = 0.17f, p->k_scale = 0.5f, p->v_scale = 2.0f;
    p->sliding_window = 8, p->softcap = 20.0f;
    p->max_query_len = 3, p->max_seq_len = 21;
    cr_assert_eq(attnd_backend_alloc(f->b, attnd_paged_3d_workspace_size(4, 4, 32, 4), &f->ws),
                 ATTND_ERR_OK);
}

static void pfix_fini(pfix *f)
{
    attnd_test_tensor *all[] = {&f->q,  &f->k,  &f->v,   &f->out,   &f->lse,
                                &f->bt, &f->sl, &f->qsl, &f->alibi, &f->sinks};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        attnd_tt_free(all[i]);
    attnd_backend_free(f->b, f->ws);
    attnd_backend_close(f->b);
}

static int all_poisoned(const attnd_test_tensor *tt)
{
    for (size_t i = 0; i < tt->bytes; i++)
        if (((const unsigned char *)tt->buf)[i] != 0xff) return 0;
    return 1;
}

/* Both forms refuse with INVALID_ARGUMENT, name the field (substring), and write nothing. */
static void expect_bad(pfix *f, const char *want, int line)
{
    for (int form = 0; form < 2; form++) {
        attnd_tt_poison(&f->out);
        attnd_tt_poison(&f->lse);
        attnd_err rv = form == 0 ? attnd_paged_attention_2d(f->b, &f->p)
                                 : attnd_paged_attention_3d(f->b, &f->p, 4, f->ws);
        const char *msg = attnd_backend_last_error(f->b);
        cr_assert_eq(rv, ATTND_ERR_INVALID_ARGUMENT, "line %d (%s): got %s, message '%s'", line,
                     form ? "3d" : "2d", attnd_err_name(rv), msg);
        cr_assert(strstr(msg, want) != NULL, "line %d (%s): message '%s' lacks '%s'", line,
                  form ? "3d" : "2d", msg, want);
        cr_assert(all_poisoned(&f->out) && all_poisoned(&f->lse), "line %d: output written", line);
    }
}

/* Fresh valid fixture, apply the statements, expect the refusal naming `want`. */
#define EXPECT_BAD(want, ...)                                                                      \
    do {                                                                                           \
        pfix f;                                                                                    \
        pfix_init(&f);                                                                             \
        __VA_ARGS__;                                                                               \
        expect_bad(&f, want, __LINE__);                                                            \
        pfix_fini(&f);                                                                             \
    } while (0)

Test(validate_paged, valid_descriptor_passes, .timeout = 120)
{
    pfix f;
    pfix_init(&f);
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, 4, f.ws), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    /* optional tensors absent, features off */
    f.p.out_lse.data = NULL, f.p.alibi_slopes.data = NULL, f.p.sinks.data = NULL;
    f.p.sliding_window = 0, f.p.softcap = 0.0f;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK);
    /* table entries past a sequence's blocks are never read, so garbage there is fine */
    ((int32_t *)f.bt.buf)[2] = -1;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK);
    pfix_fini(&f);
}

Test(validate_paged, null_arguments, .timeout = 120)
{
    pfix f;
    pfix_init(&f);
    cr_assert_eq(attnd_paged_attention_2d(f.b, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_paged_attention_2d(NULL, &f.p), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_paged_attention_3d(f.b, NULL, 2, f.ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_cache_write(f.b, NULL), ATTND_ERR_INVALID_ARGUMENT);
    pfix_fini(&f);
}

Test(validate_paged, missing_tensors, .timeout = 120)
{
    EXPECT_BAD("q: missing", f.p.q.data = NULL);
    EXPECT_BAD("k_cache: missing", f.p.k_cache.data = NULL);
    EXPECT_BAD("v_cache: missing", f.p.v_cache.data = NULL);
    EXPECT_BAD("out: missing", f.p.out.data = NULL);
    EXPECT_BAD("block_tables: missing", f.p.block_tables.data = NULL);
    EXPECT_BAD("seq_lens: missing", f.p.seq_lens.data = NULL);
    EXPECT_BAD("query_start_loc: missing", f.p.query_start_loc.data = NULL);
}

Test(validate_paged, wrong_dtypes, .timeout = 120)
{
    EXPECT_BAD("q: dtype i32", f.p.q.dtype = ATTND_DTYPE_I32);
    EXPECT_BAD("q: dtype fp8_e4m3", f.p.q.dtype = ATTND_DTYPE_FP8_E4M3);
    EXPECT_BAD("q: dtype ?", f.p.q.dtype = (attnd_dtype)99);
    EXPECT_BAD("q: dtype ?", f.p.q.dtype = (attnd_dtype)-3);
    EXPECT_BAD("k_cache: dtype i64", f.p.k_cache.dtype = ATTND_DTYPE_I64);
    EXPECT_BAD("v_cache: dtype bf16 differs", f.p.v_cache.dtype = ATTND_DTYPE_BF16);
    EXPECT_BAD("out: dtype fp8_e4m3", f.p.out.dtype = ATTND_DTYPE_FP8_E4M3);
    EXPECT_BAD("out_lse: dtype f16", f.p.out_lse.dtype = ATTND_DTYPE_F16);
    EXPECT_BAD("block_tables: dtype i64", f.p.block_tables.dtype = ATTND_DTYPE_I64);
    EXPECT_BAD("seq_lens: dtype f32", f.p.seq_lens.dtype = ATTND_DTYPE_F32);
    EXPECT_BAD("query_start_loc: dtype i64", f.p.query_start_loc.dtype = ATTND_DTYPE_I64);
    EXPECT_BAD("alibi_slopes: dtype bf16", f.p.alibi_slopes.dtype = ATTND_DTYPE_BF16);
    EXPECT_BAD("sinks: dtype f16", f.p.sinks.dtype = ATTND_DTYPE_F16);
}

Test(validate_paged, sinks, .timeout = 120)
{
    EXPECT_BAD("sinks: shape[0] is 3, expected 4", f.p.sinks.shape[0] = 3);
    EXPECT_BAD("sinks: expected 1 dims", f.p.sinks.ndim = 2);
    EXPECT_BAD("sinks[2]: nan is not a logit", ((float *)f.sinks.buf)[2] = NAN);
    EXPECT_BAD("sinks[0]: inf is not a logit", ((float *)f.sinks.buf)[0] = INFINITY);
    /* -inf is no sink for that head */
    pfix f;
    pfix_init(&f);
    ((float *)f.sinks.buf)[1] = -INFINITY;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    pfix_fini(&f);
}

/* A backend without a feature refuses an op that needs it (UNSUPPORTED, naming it) before it
 * writes anything; the cache write on an f32 cache likewise. */
Test(validate_paged, features_the_backend_lacks, .timeout = 120)
{
    pfix f;
    pfix_init(&f);
    attnd_backend_ops bare = *f.b->ops;
    const attnd_backend_ops *cpu = f.b->ops;
    bare.features = 0;
    f.b->ops = &bare;
    attnd_tt_poison(&f.out);
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_UNSUPPORTED);
    cr_assert(strstr(attnd_backend_last_error(f.b), "sinks: not implemented by backend cpu"));
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, 4, f.ws), ATTND_ERR_UNSUPPORTED);
    cr_assert(all_poisoned(&f.out));
    f.p.sinks.data = NULL;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    f.p.k_cache.dtype = f.p.v_cache.dtype = ATTND_DTYPE_F32;
    f.p.k_cache.shape[0] = f.p.v_cache.shape[0] = 1; /* the same bytes hold one f32 block */
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_UNSUPPORTED);
    cr_assert(strstr(attnd_backend_last_error(f.b), "f32 cache is not implemented"));
    f.b->ops = cpu;
    pfix_fini(&f);
}

Test(validate_paged, ranks_and_strides, .timeout = 120)
{
    EXPECT_BAD("q: expected 3 dims, got 2", f.p.q.ndim = 2);
    EXPECT_BAD("k_cache: expected 4 dims, got 9", f.p.k_cache.ndim = 9);
    EXPECT_BAD("out_lse: expected 2 dims", f.p.out_lse.ndim = 1);
    EXPECT_BAD("q: innermost stride must be 1, got 2", f.p.q.strides[2] = 2);
    EXPECT_BAD("out: strides[0] is negative", f.p.out.strides[0] = -128);
    EXPECT_BAD("k_cache: shape[0] is negative", f.p.k_cache.shape[0] = -1);
    EXPECT_BAD("v_cache: shape x strides overflows", f.p.v_cache.shape[0] = INT64_MAX / 2,
               f.p.v_cache.strides[0] = 1024);
}

Test(validate_paged, mismatched_shapes, .timeout = 120)
{
    EXPECT_BAD("num_q_heads 6 is not a positive multiple of num_kv_heads 4", f.p.q.shape[1] = 6,
               f.p.out.shape[1] = 6, f.p.k_cache.shape[2] = 4, f.p.v_cache.shape[2] = 4);
    EXPECT_BAD("k_cache: num_kv_heads is 0", f.p.k_cache.shape[2] = 0, f.p.v_cache.shape[2] = 0);
    EXPECT_BAD("k_cache: shape[3] is 64, expected 32", f.p.k_cache.shape[3] = 64,
               f.p.v_cache.shape[3] = 64);
    EXPECT_BAD("v_cache: shape[0] is 3, expected 4", f.p.v_cache.shape[0] = 3);
    EXPECT_BAD("v_cache: shape[2] is 1, expected 2", f.p.v_cache.shape[2] = 1);
    EXPECT_BAD("out: shape[1] is 8, expected 4", f.p.out.shape[1] = 8);
    EXPECT_BAD("out: shape[0] is 3, expected 4", f.p.out.shape[0] = 3);
    EXPECT_BAD("out_lse: shape[0] is 2, expected 4", f.p.out_lse.shape[0] = 2);
    EXPECT_BAD("out_lse: shape[1] is 5, expected 4", f.p.out_lse.shape[1] = 5);
    EXPECT_BAD("alibi_slopes: shape[0] is 3, expected 4", f.p.alibi_slopes.shape[0] = 3);
    EXPECT_BAD("block_tables: shape[0] is 1, expected 2", f.p.block_tables.shape[0] = 1);
    EXPECT_BAD("query_start_loc: shape[0] is 2, expected 3", f.p.query_start_loc.shape[0] = 2);
}

Test(validate_paged, head_and_block_sizes, .timeout = 120)
{
    static const int64_t bad_heads[] = {0, 8, 24, 36, 100, 264, 512};
    for (size_t i = 0; i < sizeof bad_heads / sizeof *bad_heads; i++) {
        int64_t hs = bad_heads[i];
        EXPECT_BAD("head size", f.p.q.shape[2] = hs, f.p.out.shape[2] = hs,
                   f.p.k_cache.shape[3] = hs, f.p.v_cache.shape[3] = hs);
    }
    static const int64_t bad_blocks[] = {0, 1, 8, 24, 48, 128};
    for (size_t i = 0; i < sizeof bad_blocks / sizeof *bad_blocks; i++) {
        int64_t bs = bad_blocks[i];
        EXPECT_BAD("k_cache: block size", f.p.k_cache.shape[1] = bs, f.p.v_cache.shape[1] = bs);
    }
}

Test(validate_paged, scalars, .timeout = 120)
{
    EXPECT_BAD("scale: nan is not finite", f.p.scale = NAN);
    EXPECT_BAD("scale: inf", f.p.scale = INFINITY);
    EXPECT_BAD("softcap: -1", f.p.softcap = -1.0f);
    EXPECT_BAD("softcap: nan", f.p.softcap = NAN);
    EXPECT_BAD("sliding_window: -4", f.p.sliding_window = -4);
    EXPECT_BAD("k_scale: 0", f.p.k_scale = 0.0f);
    EXPECT_BAD("k_scale: -1", f.p.k_scale = -1.0f);
    EXPECT_BAD("v_scale: inf", f.p.v_scale = INFINITY);
    EXPECT_BAD("max_query_len: -1 is negative", f.p.max_query_len = -1);
    EXPECT_BAD("max_query_len: 2 is less than the query length 3 of sequence 1",
               f.p.max_query_len = 2);
    EXPECT_BAD("max_seq_len: 20 is less than seq_lens[0] = 21", f.p.max_seq_len = 20);
    /* scales only matter for fp8 caches */
    pfix f;
    pfix_init(&f);
    int64_t cs[4] = {4, 16, 2, 32};
    attnd_tt_free(&f.k);
    attnd_tt_free(&f.v);
    attnd_tt_alloc(&f.k, ATTND_DTYPE_F16, 4, cs);
    attnd_tt_alloc(&f.v, ATTND_DTYPE_F16, 4, cs);
    f.p.k_cache = f.k.t, f.p.v_cache = f.v.t;
    f.p.k_scale = 0.0f, f.p.v_scale = NAN;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK);
    pfix_fini(&f);
}

Test(validate_paged, query_start_loc_contents, .timeout = 120)
{
    EXPECT_BAD("query_start_loc[0]: is 1, must be 0", ((int32_t *)f.qsl.buf)[0] = 1);
    EXPECT_BAD("query_start_loc[0]: is -1", ((int32_t *)f.qsl.buf)[0] = -1);
    EXPECT_BAD("query_start_loc[2]: 0 is less than the previous entry 1",
               ((int32_t *)f.qsl.buf)[2] = 0);
    EXPECT_BAD("query_start_loc[2]: last entry 3 != num_tokens 4", ((int32_t *)f.qsl.buf)[2] = 3);
    EXPECT_BAD("query_start_loc[2]: last entry 5", ((int32_t *)f.qsl.buf)[2] = 5);
    EXPECT_BAD("query_start_loc[2]: 4 is less than the previous entry 7",
               ((int32_t *)f.qsl.buf)[1] = 7);
}

Test(validate_paged, sequence_lengths_and_block_ids, .timeout = 120)
{
    EXPECT_BAD("seq_lens[1]: 2 is less than the sequence's query length 3",
               ((int32_t *)f.sl.buf)[1] = 2);
    EXPECT_BAD("seq_lens[0]: -5 is less", ((int32_t *)f.sl.buf)[0] = -5);
    EXPECT_BAD("seq_lens[0]: 49 exceeds max_blocks_per_seq 3 x block size 16",
               ((int32_t *)f.sl.buf)[0] = 49, f.p.max_seq_len = 100);
    EXPECT_BAD("block_tables[1][0]: block id 4 out of range [0, 4)", ((int32_t *)f.bt.buf)[3] = 4);
    EXPECT_BAD("block_tables[0][1]: block id -1", ((int32_t *)f.bt.buf)[1] = -1);
    EXPECT_BAD("block_tables[0][1]: block id 2147483647", ((int32_t *)f.bt.buf)[1] = INT32_MAX);
    /* growing a sequence into its third table entry makes that entry live */
    EXPECT_BAD("block_tables[0][2]: block id 7777", ((int32_t *)f.sl.buf)[0] = 33,
               f.p.max_seq_len = 33);
    /* a strided table is read through its strides */
    EXPECT_BAD("block_tables[1][0]: block id 1", f.p.block_tables.shape[1] = 2,
               f.p.block_tables.strides[1] = 2, f.p.block_tables.strides[0] = 1,
               ((int32_t *)f.bt.buf)[1] = 1, ((int32_t *)f.bt.buf)[0] = 0,
               ((int32_t *)f.bt.buf)[2] = 0, f.p.k_cache.shape[0] = 1, f.p.v_cache.shape[0] = 1);
}

/* A sequence without queries reads nothing, so its table may hold anything. */
Test(validate_paged, sequence_without_queries_reads_no_blocks, .timeout = 120)
{
    static const int32_t qsl[] = {0, 0, 4};
    pfix f;
    pfix_init(&f);
    set_i32(&f.qsl, qsl, 3);
    ((int32_t *)f.sl.buf)[1] = 4;
    ((int32_t *)f.bt.buf)[0] = -9, ((int32_t *)f.bt.buf)[1] = 1 << 30;
    f.p.max_query_len = 4;
    cr_assert_eq(attnd_paged_attention_2d(f.b, &f.p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, 4, f.ws), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    pfix_fini(&f);
}

/* Random index contents and scalars (within the buffers the shapes describe): every call either
 * runs, giving finite outputs, or is refused with a message; none crashes. */
Test(validate_paged, random_contents_never_crash, .timeout = 120)
{
    attnd_rng r;
    attnd_rng_seed(&r, 77);
    for (int it = 0; it < 400; it++) {
        pfix f;
        pfix_init(&f);
        for (int k = (int)attnd_rng_int(&r, 1, 3); k > 0; k--) {
            switch (attnd_rng_int(&r, 0, 5)) {
            case 0:
                ((int32_t *)f.qsl.buf)[attnd_rng_int(&r, 0, 2)] = (int32_t)attnd_rng_int(&r, -2, 6);
                break;
            case 1:
                ((int32_t *)f.sl.buf)[attnd_rng_int(&r, 0, 1)] = (int32_t)attnd_rng_int(&r, -3, 60);
                break;
            case 2:
                ((int32_t *)f.bt.buf)[attnd_rng_int(&r, 0, 5)] = (int32_t)attnd_rng_int(&r, -2, 8);
                break;
            case 3:
                f.p.sliding_window = (int32_t)attnd_rng_int(&r, -2, 30);
                break;
            case 4:
                f.p.max_query_len = (int32_t)attnd_rng_int(&r, -1, 5);
                break;
            default:
                f.p.max_seq_len = (int32_t)attnd_rng_int(&r, -1, 60);
                break;
            }
        }
        for (int form = 0; form < 2; form++) {
            attnd_tt_poison(&f.out);
            attnd_err rv = form == 0 ? attnd_paged_attention_2d(f.b, &f.p)
                                     : attnd_paged_attention_3d(f.b, &f.p, 4, f.ws);
            if (rv == ATTND_ERR_OK) {
                double *o = attnd_tt_to_f64(&f.out);
                for (int64_t i = 0; i < attnd_tensor_numel(&f.out.t); i++)
                    cr_assert(isfinite(o[i]), "iteration %d: output %lld not finite", it,
                              (long long)i);
                free(o);
                continue;
            }
            cr_assert_eq(rv, ATTND_ERR_INVALID_ARGUMENT, "iteration %d: %s", it,
                         attnd_err_name(rv));
            cr_assert(attnd_backend_last_error(f.b)[0] != '\0', "iteration %d: no message", it);
        }
        pfix_fini(&f);
    }
}

Test(validate_paged, three_d_arguments, .timeout = 120)
{
    pfix f;
    pfix_init(&f);
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, 0, f.ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(attnd_backend_last_error(f.b), "num_segments") != NULL);
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, -2, f.ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_paged_attention_3d(f.b, &f.p, 2, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(attnd_backend_last_error(f.b), "workspace") != NULL);
    pfix_fini(&f);
}

/* ---------------------------------------------------------------- cache write */

typedef struct cfix {
    attnd_backend *b;
    attnd_test_tensor key, value, kc, vc, slots;
    attnd_cache_write_params p;
} cfix;

static void cfix_init(cfix *f)
{
    static const int64_t slots[] = {5, -1, 63, 0};
    int64_t ks[3] = {4, 2, 32}, cs[4] = {4, 16, 2, 32}, four = 4;
    attnd_backend_opts opts = {1, 0};
    memset(f, 0, sizeof *f);
    cr_assert_eq(attnd_backend_open(&f->b, "cpu", &opts), ATTND_ERR_OK);
    attnd_tt_alloc(&f->key, ATTND_DTYPE_F16, 3, ks);
    attnd_tt_alloc(&f->value, ATTND_DTYPE_F16, 3, ks);
    attnd_tt_alloc(&f->kc, ATTND_DTYPE_FP8_E4M3, 4, cs);
    attnd_tt_alloc(&f->vc, ATTND_DTYPE_FP8_E4M3, 4, cs);
    attnd_tt_alloc(&f->slots, ATTND_DTYPE_I64, 1, &four);
    memcpy(f->slots.buf, slots, sizeof slots);
    f->p.key = f->key.t, f->p.value = f->value.t;
    f->p.k_cache = f->kc.t, f->p.v_cache = f->vc.t;
    f->p.slot_mapping = f->slots.t;
    f->p.k_scale = 0.5f, f->p.v_scale = 1.5f;
}

static void cfix_fini(cfix *f)
{
    attnd_tt_free(&f->key);
    attnd_tt_free(&f->value);
    attnd_tt_free(&f->kc);
    attnd_tt_free(&f->vc);
    attnd_tt_free(&f->slots);
    attnd_backend_close(f->b);
}

static void expect_bad_write(cfix *f, const char *want, int line)
{
    attnd_tt_poison(&f->kc);
    attnd_tt_poison(&f->vc);
    attnd_err rv = attnd_cache_write(f->b, &f->p);
    const char *msg = attnd_backend_last_error(f->b);
    cr_assert_eq(rv, ATTND_ERR_INVALID_ARGUMENT, "line %d: got %s, message '%s'", line,
                 attnd_err_name(rv), msg);
    cr_assert(strstr(msg, want) != NULL, "line %d: message '%s' lacks '%s'", line, msg, want);
    cr_assert(all_poisoned(&f->kc) && all_poisoned(&f->vc), "line %d: cache written", line);
}

#define EXPECT_BAD_WRITE(want, ...)                                                                \
    do {                                                                                           \
        cfix f;                                                                                    \
        cfix_init(&f);                                                                             \
        __VA_ARGS__;                                                                               \
        expect_bad_write(&f, want, __LINE__);                                                      \
        cfix_fini(&f);                                                                             \
    } while (0)

Test(validate_cache_write, valid_descriptor_passes, .timeout = 120)
{
    cfix f;
    cfix_init(&f);
    cr_assert_eq(attnd_cache_write(f.b, &f.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    f.p.slot_mapping.dtype = ATTND_DTYPE_I32; /* reinterpreted: 5, 0, -1, -1 */
    cr_assert_eq(attnd_cache_write(f.b, &f.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    cfix_fini(&f);
}

Test(validate_cache_write, bad_descriptors, .timeout = 120)
{
    EXPECT_BAD_WRITE("key: missing", f.p.key.data = NULL);
    EXPECT_BAD_WRITE("value: missing", f.p.value.data = NULL);
    EXPECT_BAD_WRITE("k_cache: missing", f.p.k_cache.data = NULL);
    EXPECT_BAD_WRITE("v_cache: missing", f.p.v_cache.data = NULL);
    EXPECT_BAD_WRITE("slot_mapping: missing", f.p.slot_mapping.data = NULL);
    EXPECT_BAD_WRITE("key: dtype fp8_e4m3", f.p.key.dtype = ATTND_DTYPE_FP8_E4M3);
    EXPECT_BAD_WRITE("value: dtype bf16 differs from key's f16",
                     f.p.value.dtype = ATTND_DTYPE_BF16);
    EXPECT_BAD_WRITE("k_cache: dtype i32", f.p.k_cache.dtype = ATTND_DTYPE_I32);
    EXPECT_BAD_WRITE("v_cache: dtype f16 differs", f.p.v_cache.dtype = ATTND_DTYPE_F16);
    EXPECT_BAD_WRITE("slot_mapping: dtype f32", f.p.slot_mapping.dtype = ATTND_DTYPE_F32);
    EXPECT_BAD_WRITE("value: shape[0] is 3, expected 4", f.p.value.shape[0] = 3);
    EXPECT_BAD_WRITE("k_cache: shape[2] is 2, expected 1", f.p.key.shape[1] = 1,
                     f.p.value.shape[1] = 1);
    EXPECT_BAD_WRITE("k_cache: shape[3] is 32, expected 40", f.p.key.shape[2] = 40,
                     f.p.value.shape[2] = 40);
    EXPECT_BAD_WRITE("head size 20", f.p.key.shape[2] = 20, f.p.value.shape[2] = 20,
                     f.p.k_cache.shape[3] = 20, f.p.v_cache.shape[3] = 20);
    EXPECT_BAD_WRITE("block size 48", f.p.k_cache.shape[1] = 48, f.p.v_cache.shape[1] = 48);
    EXPECT_BAD_WRITE("slot_mapping: shape[0] is 3, expected 4", f.p.slot_mapping.shape[0] = 3);
    EXPECT_BAD_WRITE("slot_mapping: expected 1 dims", f.p.slot_mapping.ndim = 2);
    EXPECT_BAD_WRITE("key: innermost stride", f.p.key.strides[2] = 3);
    EXPECT_BAD_WRITE("k_scale: nan", f.p.k_scale = NAN);
    EXPECT_BAD_WRITE("v_scale: 0", f.p.v_scale = 0.0f);
}

/* f32 caches take the rows exactly (no scale); a backend without them refuses. */
Test(validate_cache_write, f32_cache, .timeout = 120)
{
    cfix f;
    cfix_init(&f);
    f.p.k_cache.dtype = f.p.v_cache.dtype = ATTND_DTYPE_F32;
    f.p.k_cache.shape[0] = f.p.v_cache.shape[0] = 1; /* the fp8 bytes hold one f32 block */
    ((int64_t *)f.slots.buf)[2] = 15;
    cr_assert_eq(attnd_cache_write(f.b, &f.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    attnd_backend_ops bare = *f.b->ops;
    const attnd_backend_ops *cpu = f.b->ops;
    bare.features = 0;
    f.b->ops = &bare;
    cr_assert_eq(attnd_cache_write(f.b, &f.p), ATTND_ERR_UNSUPPORTED);
    cr_assert(strstr(attnd_backend_last_error(f.b), "f32 cache is not implemented by backend"));
    f.b->ops = cpu;
    cfix_fini(&f);
}

Test(validate_cache_write, slot_contents, .timeout = 120)
{
    EXPECT_BAD_WRITE("slot_mapping[2]: slot 64 out of range (num_blocks 4 x block size 16)",
                     ((int64_t *)f.slots.buf)[2] = 64);
    EXPECT_BAD_WRITE("slot_mapping[0]: slot 9223372036854775807",
                     ((int64_t *)f.slots.buf)[0] = INT64_MAX);
    EXPECT_BAD_WRITE("slot_mapping[3]: slot 5 already written by token 0",
                     ((int64_t *)f.slots.buf)[3] = 5);
    /* several negative slots are all padding, never duplicates */
    cfix f;
    cfix_init(&f);
    ((int64_t *)f.slots.buf)[0] = -1;
    ((int64_t *)f.slots.buf)[2] = -7;
    cr_assert_eq(attnd_cache_write(f.b, &f.p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    cfix_fini(&f);
}
