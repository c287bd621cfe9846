/* Bad descriptors for merge, varlen, block-sparse and linear attention: each mutation of a valid
 * request must return ATTND_ERR_INVALID_ARGUMENT with a message naming the field, leave the
 * (poisoned) output untouched, and never crash. The unmutated request must run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

#define MAX_TT 10

/* Host tensors of one request; params point into them. */
typedef struct fixture {
    attnd_test_tensor tt[MAX_TT];
    int count;
    attnd_backend *b;
} fixture;

static attnd_tensor fx_add(fixture *f, attnd_dtype dt, int32_t ndim, const int64_t *shape)
{
    attnd_test_tensor *t = &f->tt[f->count++];
    attnd_tt_alloc(t, dt, ndim, shape);
    if (dt != ATTND_DTYPE_I32 && dt != ATTND_DTYPE_I64) {
        attnd_rng r;
        attnd_rng_seed(&r, (uint64_t)f->count);
        attnd_tt_fill_normal(t, &r, 1.0, 1.0);
    }
    return t->t;
}

static int32_t *fx_i32(fixture *f, int idx)
{
    return f->tt[idx].buf;
}

static void fx_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    attnd_backend_opts opts = {2, 0};
    cr_assert_eq(attnd_backend_open(&f->b, "cpu", &opts), ATTND_ERR_OK);
}

static void fx_fini(fixture *f)
{
    for (int i = 0; i < f->count; i++)
        attnd_tt_free(&f->tt[i]);
    attnd_backend_close(f->b);
}

/* The call failed as it should: code, field named in the message, output (tensor out_idx)
 * still poisoned. */
static void expect_invalid(fixture *f, attnd_err rv, const char *want, int out_idx, int i)
{
    const char *msg = attnd_backend_last_error(f->b);
    cr_assert_eq(rv, ATTND_ERR_INVALID_ARGUMENT, "mutation %d (%s): got %s (%s)", i, want,
                 attnd_err_name(rv), msg);
    cr_assert(strstr(msg, want) != NULL, "mutation %d: message \"%s\" lacks \"%s\"", i, msg, want);
    const unsigned char *o = f->tt[out_idx].buf;
    for (size_t k = 0; k < f->tt[out_idx].bytes; k++)
        cr_assert_eq(o[k], 0xff, "mutation %d: output written before validation", i);
}

/* ---------------------------------------------------------------- merge */

enum { M_OUT, M_LSE, M_PO, M_PL, M_SO, M_SL };

static attnd_merge_params merge_fixture(fixture *f)
{
    fx_init(f);
    attnd_merge_params p = {0};
    p.out = fx_add(f, ATTND_DTYPE_BF16, 3, (int64_t[]){5, 2, 64});
    p.out_lse = fx_add(f, ATTND_DTYPE_F32, 2, (int64_t[]){2, 5});
    p.prefix_out = fx_add(f, ATTND_DTYPE_F16, 3, (int64_t[]){5, 2, 64});
    p.prefix_lse = fx_add(f, ATTND_DTYPE_F32, 2, (int64_t[]){2, 5});
    p.suffix_out = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){5, 2, 64});
    p.suffix_lse = fx_add(f, ATTND_DTYPE_F32, 2, (int64_t[]){2, 5});
    attnd_tt_poison(&f->tt[M_OUT]);
    return p;
}

static const char *merge_mutate(attnd_merge_params *p, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->out.data = NULL; return "out: missing";
    case 1: p->prefix_out.data = NULL; return "prefix_out: missing";
    case 2: p->suffix_lse.data = NULL; return "suffix_lse: missing";
    case 3: p->out.shape[2] = 20; return "out: head size 20";
    case 4: p->prefix_out.shape[1] = 3; return "prefix_out: shape[1]";
    case 5: p->suffix_out.dtype = ATTND_DTYPE_I32; return "suffix_out: dtype i32";
    case 6: p->prefix_lse.dtype = ATTND_DTYPE_BF16; return "prefix_lse: dtype bf16";
    case 7: p->prefix_lse.shape[1] = 4; return "prefix_lse: shape[1]";
    case 8: p->out_lse.shape[0] = 1; return "out_lse: shape[0]";
    case 9: p->out.ndim = 2; return "out: expected 3 dims";
    case 10: p->out.strides[2] = 2; return "out: innermost stride";
    case 11: p->prefix_out.strides[0] = -1; return "prefix_out: strides[0] is negative";
    case 12: p->out.dtype = (attnd_dtype)99; return "out: dtype";
    case 13: p->out.strides[0] = 0; return "out: strides overlap";
    case 14: p->out_lse.strides[0] = 4; return "out_lse: strides overlap";
    default: return NULL;
    }
    /* clang-format on */
}

Test(validate_ops, merge, .timeout = 120)
{
    fixture f;
    attnd_merge_params p = merge_fixture(&f);
    cr_assert_eq(attnd_merge_states(f.b, &p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    fx_fini(&f);
    for (int i = 0;; i++) {
        p = merge_fixture(&f);
        const char *want = merge_mutate(&p, i);
        if (want == NULL) {
            fx_fini(&f);
            break;
        }
        expect_invalid(&f, attnd_merge_states(f.b, &p), want, M_OUT, i);
        fx_fini(&f);
    }
}

/* ---------------------------------------------------------------- varlen */

enum { V_Q, V_K, V_V, V_OUT, V_CUQ, V_CUK, V_BIAS };

/* Two sequences: (Lq, Lk) = (3, 5) and (4, 4); 4 q heads over 2 kv heads; bias present. */
static attnd_varlen_params varlen_fixture(fixture *f, attnd_dtype dt)
{
    fx_init(f);
    attnd_varlen_params p = {.max_seqlen_q = 4, .max_seqlen_k = 5, .causal = 1, .scale = 0.125f};
    p.q = fx_add(f, dt, 3, (int64_t[]){7, 4, 64});
    p.k = fx_add(f, dt, 3, (int64_t[]){9, 2, 64});
    p.v = fx_add(f, dt, 3, (int64_t[]){9, 2, 64});
    p.out = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){7, 4, 64});
    p.cu_seqlens_q = fx_add(f, ATTND_DTYPE_I32, 1, (int64_t[]){3});
    p.cu_seqlens_k = fx_add(f, ATTND_DTYPE_I32, 1, (int64_t[]){3});
    p.bias = fx_add(f, ATTND_DTYPE_F32, 4, (int64_t[]){2, 4, 4, 5});
    memcpy(fx_i32(f, V_CUQ), (int32_t[]){0, 3, 7}, 3 * sizeof(int32_t));
    memcpy(fx_i32(f, V_CUK), (int32_t[]){0, 5, 9}, 3 * sizeof(int32_t));
    p.q_scale = p.k_scale = p.v_scale = 0.5f, p.p_scale = 1.0f / 448.0f, p.out_scale = 1.0f;
    attnd_tt_poison(&f->tt[V_OUT]);
    return p;
}

static const char *varlen_mutate_tensors(attnd_varlen_params *p, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->q.data = NULL; return "q: missing";
    case 1: p->q.dtype = ATTND_DTYPE_F32; return "q: dtype f32";
    case 2: p->k.dtype = ATTND_DTYPE_F16; return "k: dtype f16 differs from q";
    case 3: p->v.dtype = ATTND_DTYPE_F16; return "v: dtype f16 differs from q";
    case 4: p->q.shape[2] = 264; return "q: head size 264";
    case 5: p->q.shape[2] = 36; return "q: head size 36";
    case 6: p->k.shape[2] = 32; return "k: shape[2]";
    case 7: p->k.shape[1] = p->v.shape[1] = 3; return "num_kv_heads 3";
    case 8: p->v.shape[0] = 2; return "v: shape[0]";
    case 9: p->out.shape[1] = 2; return "out: shape[1]";
    case 10: p->out.dtype = ATTND_DTYPE_I32; return "out: dtype i32";
    case 11: p->cu_seqlens_q.dtype = ATTND_DTYPE_I64; return "cu_seqlens_q: dtype i64";
    case 12: p->cu_seqlens_k.shape[0] = 2; return "cu_seqlens_k: shape[0]";
    case 13: p->cu_seqlens_q.shape[0] = 0; return "cu_seqlens_q: needs";
    case 14: p->bias.shape[2] = 2; return "bias: shape[2]";
    case 15: p->bias.shape[0] = 3; return "bias: shape[0]";
    case 16: p->bias.ndim = 3; return "bias: expected 4 dims";
    case 17: p->scale = NAN; return "scale";
    case 18: p->max_seqlen_q = -1; return "max_seqlen_q: -1";
    case 19: p->out.dtype = ATTND_DTYPE_FP8_E4M3, p->out_scale = 0; return "out_scale";
    case 20: p->q.strides[2] = 2; return "q: innermost stride";
    case 21: p->out.strides[1] = 32; return "out: strides overlap";
    default: return NULL;
    }
    /* clang-format on */
}

/* Mutations of index contents (cu_seqlens) and limits they must respect. */
static const char *varlen_mutate_contents(attnd_varlen_params *p, fixture *f, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: fx_i32(f, V_CUQ)[2] = 2; return "cu_seqlens_q[2]: 2 is below";
    case 1: fx_i32(f, V_CUK)[2] = 10; return "cu_seqlens_k: last entry 10 exceeds the 9";
    case 2: fx_i32(f, V_CUQ)[0] = -1; return "cu_seqlens_q[0]";
    case 3: p->bias.data = NULL, p->max_seqlen_q = 3; return "sequence 1 has length 4";
    case 4: p->bias.data = NULL, p->max_seqlen_k = 4; return "max_seqlen_k 4";
    default: return NULL;
    }
    /* clang-format on */
}

/* fp8 inputs need finite positive scales. */
static const char *varlen_mutate_fp8(attnd_varlen_params *p, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->q_scale = 0; return "q_scale";
    case 1: p->k_scale = -1; return "k_scale";
    case 2: p->v_scale = INFINITY; return "v_scale";
    case 3: p->p_scale = NAN; return "p_scale";
    default: return NULL;
    }
    /* clang-format on */
}

Test(validate_ops, varlen, .timeout = 120)
{
    fixture f;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        attnd_dtype dt = fp8 ? ATTND_DTYPE_FP8_E4M3 : ATTND_DTYPE_BF16;
        attnd_varlen_params p = varlen_fixture(&f, dt);
        cr_assert_eq(attnd_varlen_attention(f.b, &p), ATTND_ERR_OK, "%s",
                     attnd_backend_last_error(f.b));
        fx_fini(&f);
    }
    for (int set = 0; set < 3; set++)
        for (int i = 0;; i++) {
            attnd_varlen_params p =
                varlen_fixture(&f, set == 2 ? ATTND_DTYPE_FP8_E4M3 : ATTND_DTYPE_BF16);
            const char *want = set == 0   ? varlen_mutate_tensors(&p, i)
                               : set == 1 ? varlen_mutate_contents(&p, &f, i)
                                          : varlen_mutate_fp8(&p, i);
            if (want != NULL) expect_invalid(&f, attnd_varlen_attention(f.b, &p), want, V_OUT, i);
            fx_fini(&f);
            if (want == NULL) break;
        }
}

/* ---------------------------------------------------------------- block-sparse */

enum { B_Q, B_K, B_V, B_OUT, B_CUQ, B_CUK, B_CROW, B_COL };

/* A prefill of 40 tokens and a decode at k_len 70; block 16, 5 layout rows, causal band. */
static attnd_blocksparse_params bs_fixture(fixture *f)
{
    fx_init(f);
    attnd_blocksparse_params p = {
        .block_size = 16, .max_seqlen_q = 40, .max_seqlen_k = 70, .scale = 0.17f};
    p.q = fx_add(f, ATTND_DTYPE_F16, 3, (int64_t[]){41, 2, 32});
    p.k = fx_add(f, ATTND_DTYPE_F16, 3, (int64_t[]){110, 1, 32});
    p.v = fx_add(f, ATTND_DTYPE_F16, 3, (int64_t[]){110, 1, 32});
    p.out = fx_add(f, ATTND_DTYPE_F16, 3, (int64_t[]){41, 2, 32});
    p.cu_seqlens_q = fx_add(f, ATTND_DTYPE_I32, 1, (int64_t[]){3});
    p.cu_seqlens_k = fx_add(f, ATTND_DTYPE_I32, 1, (int64_t[]){3});
    p.layout_crow = fx_add(f, ATTND_DTYPE_I32, 2, (int64_t[]){2, 6});
    p.layout_col = fx_add(f, ATTND_DTYPE_I32, 2, (int64_t[]){2, 10});
    memcpy(fx_i32(f, B_CUQ), (int32_t[]){0, 40, 41}, 3 * sizeof(int32_t));
    memcpy(fx_i32(f, B_CUK), (int32_t[]){0, 40, 110}, 3 * sizeof(int32_t));
    static const int32_t crow[6] = {0, 1, 3, 5, 7, 9}, col[9] = {0, 0, 1, 1, 2, 2, 3, 3, 4};
    for (int h = 0; h < 2; h++) {
        memcpy(fx_i32(f, B_CROW) + h * 6, crow, sizeof crow);
        memcpy(fx_i32(f, B_COL) + h * 10, col, sizeof col);
    }
    attnd_tt_poison(&f->tt[B_OUT]);
    return p;
}

static const char *bs_mutate_tensors(attnd_blocksparse_params *p, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->q.dtype = ATTND_DTYPE_FP8_E4M3; return "q: dtype fp8_e4m3";
    case 1: p->k.data = NULL; return "k: missing";
    case 2: p->block_size = 48; return "block_size: 48";
    case 3: p->q_block_size = 8; return "q_block_size: 8";
    case 4: p->layout_crow.shape[0] = 1; return "layout_crow: shape[0]";
    case 5: p->layout_col.dtype = ATTND_DTYPE_I64; return "layout_col: dtype i64";
    case 6: p->layout_crow.shape[1] = 0; return "layout_crow: needs";
    case 7: p->out.shape[0] = 40; return "out: shape[0]";
    case 8: p->q.shape[2] = 24; return "q: head size 24";
    case 9: p->k.shape[1] = p->v.shape[1] = 3; return "num_kv_heads 3";
    case 10: p->scale = INFINITY; return "scale";
    case 11: p->layout_crow.shape[1] = 3; return "2 row blocks do not cover sequence";
    case 12: p->v.shape[1] = 2; return "v: shape[1]";
    case 13: p->out.strides[0] = 0; return "out: strides overlap";
    default: return NULL;
    }
    /* clang-format on */
}

static const char *bs_mutate_contents(attnd_blocksparse_params *p, fixture *f, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: fx_i32(f, B_CUQ)[2] = 42; return "cu_seqlens_q: last entry 42";
    case 1: fx_i32(f, B_CUQ)[1] = 39; return "q_len 39 and k_len 40";
    case 2: fx_i32(f, B_CROW)[2] = 0; return "layout_crow[0][2]: 0 out of range";
    case 3: fx_i32(f, B_CROW)[6 + 5] = 11; return "layout_crow[1][5]: 11 out of range";
    case 4: fx_i32(f, B_COL)[3] = -1; return "layout_col[0][3]: block -1 out of range";
    case 5: fx_i32(f, B_COL)[10 + 8] = 5; return "layout_col[1][8]: block 5 out of range";
    case 6: fx_i32(f, B_COL)[2] = 0; return "layout_col[0][2]: block 0 not above 0";
    case 7: p->max_seqlen_k = 80, fx_i32(f, B_CUK)[2] = 111; return "last entry 111";
    case 8: p->max_seqlen_k = 69; return "sequence 1 has length 70 > max_seqlen_k 69";
    case 9: fx_i32(f, B_CUK)[2] = 40; return "q_len 1 and k_len 0";
    default: return NULL;
    }
    /* clang-format on */
}

Test(validate_ops, blocksparse, .timeout = 120)
{
    fixture f;
    attnd_blocksparse_params p = bs_fixture(&f);
    cr_assert_eq(attnd_blocksparse_attention(f.b, &p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(f.b));
    fx_fini(&f);
    for (int set = 0; set < 2; set++)
        for (int i = 0;; i++) {
            p = bs_fixture(&f);
            const char *want = set ? bs_mutate_contents(&p, &f, i) : bs_mutate_tensors(&p, i);
            if (want != NULL)
                expect_invalid(&f, attnd_blocksparse_attention(f.b, &p), want, B_OUT, i);
            fx_fini(&f);
            if (want == NULL) break;
        }
}

/* ---------------------------------------------------------------- linear */

enum { L_Q, L_K, L_V, L_OUT, L_SLOPES, L_STATE, L_SLOTS };

static attnd_linear_prefill_params lp_fixture(fixture *f)
{
    fx_init(f);
    attnd_linear_prefill_params p = {.block_size = 16};
    p.q = fx_add(f, ATTND_DTYPE_BF16, 4, (int64_t[]){1, 2, 10, 32});
    p.k = fx_add(f, ATTND_DTYPE_BF16, 4, (int64_t[]){1, 2, 10, 32});
    p.v = fx_add(f, ATTND_DTYPE_BF16, 4, (int64_t[]){1, 2, 10, 64});
    p.out = fx_add(f, ATTND_DTYPE_F32, 4, (int64_t[]){1, 2, 10, 64});
    p.slopes = fx_add(f, ATTND_DTYPE_F32, 1, (int64_t[]){2});
    p.kv_state = fx_add(f, ATTND_DTYPE_F32, 4, (int64_t[]){1, 2, 32, 64});
    attnd_tt_poison(&f->tt[L_OUT]);
    return p;
}

static const char *lp_mutate(attnd_linear_prefill_params *p, int i)
{
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->q.data = NULL; return "q: missing";
    case 1: p->q.ndim = 3; return "q: expected 4 dims";
    case 2: p->k.dtype = ATTND_DTYPE_F16; return "k: dtype f16 differs from q";
    case 3: p->k.shape[2] = 9; return "k: shape[2]";
    case 4: p->v.shape[3] = 20; return "v: head size 20";
    case 5: p->out.shape[3] = 32; return "out: shape[3]";
    case 6: p->slopes.dtype = ATTND_DTYPE_BF16; return "slopes: dtype bf16";
    case 7: p->slopes.shape[0] = 3; return "slopes: shape[0]";
    case 8: p->kv_state.shape[2] = 64; return "kv_state: shape[2]";
    case 9: p->kv_state.dtype = ATTND_DTYPE_BF16; return "kv_state: dtype bf16";
    case 10: p->kv_state.shape[0] = 2; return "kv_state: shape[0]";
    case 11: p->block_size = 20; return "block_size: 20";
    case 12: p->block_size = 2048; return "block_size: 2048";
    case 13: p->q.shape[3] = 300; return "q: head size 300";
    case 14: p->v.dtype = ATTND_DTYPE_FP8_E4M3; return "v: dtype fp8_e4m3";
    case 15: p->kv_state.strides[3] = 3; return "kv_state: innermost stride";
    case 16: p->kv_state.strides[1] = 0; return "kv_state: strides overlap";
    default: return NULL;
    }
    /* clang-format on */
}

Test(validate_ops, linear_prefill, .timeout = 120)
{
    fixture f;
    attnd_linear_prefill_params p = lp_fixture(&f);
    cr_assert_eq(attnd_linear_prefill(f.b, &p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    fx_fini(&f);
    for (int i = 0;; i++) {
        p = lp_fixture(&f);
        const char *want = lp_mutate(&p, i);
        if (want != NULL) expect_invalid(&f, attnd_linear_prefill(f.b, &p), want, L_OUT, i);
        fx_fini(&f);
        if (want == NULL) break;
    }
}

/* Three rows over four cache slots: slots {2, -1, 0}. */
static attnd_linear_decode_params ld_fixture(fixture *f)
{
    fx_init(f);
    attnd_linear_decode_params p = {0};
    p.q = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){3, 2, 32});
    p.k = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){3, 2, 32});
    p.v = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){3, 2, 32});
    p.out = fx_add(f, ATTND_DTYPE_F32, 3, (int64_t[]){3, 2, 32});
    p.slopes = fx_add(f, ATTND_DTYPE_F32, 1, (int64_t[]){2});
    p.kv_cache = fx_add(f, ATTND_DTYPE_F32, 4, (int64_t[]){4, 2, 32, 32});
    p.slot_idx = fx_add(f, ATTND_DTYPE_I64, 1, (int64_t[]){3});
    memcpy(f->tt[L_SLOTS].buf, (int64_t[]){2, -1, 0}, 3 * sizeof(int64_t));
    attnd_tt_poison(&f->tt[L_OUT]);
    return p;
}

static const char *ld_mutate(attnd_linear_decode_params *p, fixture *f, int i)
{
    int64_t *slots = f->tt[L_SLOTS].buf;
    /* one mutation per line */
    /* clang-format off */
    switch (i) {
    case 0: p->slot_idx.dtype = ATTND_DTYPE_F32; return "slot_idx: dtype f32";
    case 1: p->slot_idx.shape[0] = 2; return "slot_idx: shape[0]";
    case 2: slots[1] = 4; return "slot_idx[1]: 4 is neither -1 nor in [0, 4)";
    case 3: slots[2] = -2; return "slot_idx[2]: -2";
    case 4: slots[1] = 2; return "slot 2 is used by two batch rows";
    case 5: p->kv_cache.shape[1] = 3; return "kv_cache: shape[1]";
    case 6: p->v.ndim = 4; return "v: expected 3 dims";
    case 7: p->kv_cache.data = NULL; return "kv_cache: missing";
    case 8: p->out.shape[0] = 2; return "out: shape[0]";
    case 9: p->k.shape[2] = 40; return "k: shape[2]";
    case 10: p->kv_cache.strides[0] = 2 * 32 * 32 - 1; return "kv_cache: strides overlap";
    default: return NULL;
    }
    /* clang-format on */
}

Test(validate_ops, linear_decode, .timeout = 120)
{
    fixture f;
    attnd_linear_decode_params p = ld_fixture(&f);
    cr_assert_eq(attnd_linear_decode(f.b, &p), ATTND_ERR_OK, "%s", attnd_backend_last_error(f.b));
    fx_fini(&f);
    for (int i = 0;; i++) {
        p = ld_fixture(&f);
        const char *want = ld_mutate(&p, &f, i);
        if (want != NULL) expect_invalid(&f, attnd_linear_decode(f.b, &p), want, L_OUT, i);
        fx_fini(&f);
        if (want == NULL) break;
    }
}

/* NULL backend or params: an error, not a crash. */
Test(validate_ops, null_params, .timeout = 120)
{
    fixture f;
    fx_init(&f);
    cr_assert_eq(attnd_merge_states(f.b, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_varlen_attention(f.b, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_blocksparse_attention(NULL, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_linear_prefill(f.b, NULL), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_linear_decode(NULL, NULL), ATTND_ERR_INVALID_ARGUMENT);
    fx_fini(&f);
}
