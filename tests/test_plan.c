/* Step planner: query_start_loc, seq_lens, block tables and slot mapping from the sequences'
 * blocks; the split into launches (decode runs -> 3D with enough segments, others -> 2D, one
 * launch per run of one kind, offsets rebased); the workspace size and its checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/dtype.h"
#include "attnd/kernels.h"
#include "attnd/plan.h"

#define BS 16

static const attnd_plan_opts opts8 = {BS, 8, 2, 64, 8, 0, 0, 0}; /* 8 parallel units */

static void *plan_for(attnd_plan *p, const attnd_plan_seq *s, int32_t n, const attnd_plan_opts *o)
{
    size_t bytes = attnd_plan_workspace_size(s, n, o);
    cr_assert_gt(bytes, 0);
    void *ws = malloc(bytes);
    memset(ws, 0xa5, bytes); /* garbage: every entry must be written */
    cr_assert_eq(attnd_plan_build(p, s, n, o, ws, bytes), ATTND_ERR_OK);
    return ws;
}

Test(plan, one_prefill_sequence, .timeout = 60)
{
    int32_t blocks[] = {7, 3, 9};
    attnd_plan_seq s = {0, 40, blocks, 3};
    attnd_plan p;
    void *ws = plan_for(&p, &s, 1, &opts8);
    cr_assert_eq(p.num_seqs, 1);
    cr_assert_eq(p.num_tokens, 40);
    cr_assert_eq(p.table_width, 3);
    cr_assert_eq(p.query_start_loc[0], 0);
    cr_assert_eq(p.query_start_loc[1], 40);
    cr_assert_eq(p.seq_lens[0], 40);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(p.block_tables[i], blocks[i]);
    for (int t = 0; t < 40; t++)
        cr_assert_eq(p.slot_mapping[t], (int64_t)blocks[t / BS] * BS + t % BS, "token %d", t);
    cr_assert_eq(p.num_launches, 1);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(p.launches[0].nrows, 40);
    cr_assert_eq(p.launches[0].max_query_len, 40);
    cr_assert_eq(p.launches[0].max_seq_len, 40);
    cr_assert_eq(p.workspace_3d, 0);
    free(ws);
}

Test(plan, context_offsets_the_slots, .timeout = 60)
{
    /* 20 tokens cached: the 5 new ones start at row 4 of the second block */
    int32_t blocks[] = {2, 5};
    attnd_plan_seq s = {20, 5, blocks, 2};
    attnd_plan p;
    void *ws = plan_for(&p, &s, 1, &opts8);
    cr_assert_eq(p.seq_lens[0], 25);
    for (int t = 0; t < 5; t++)
        cr_assert_eq(p.slot_mapping[t], 5 * BS + 4 + t);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D, "5 queries is not a decode");
    free(ws);
}

Test(plan, decodes_go_to_3d_with_segments_that_fill_the_machine, .timeout = 60)
{
    /* one sequence, 64 blocks of context: 2 waves over 8 units / (1 seq x 2 kv heads) = 8 */
    int32_t *blocks = calloc(64, sizeof *blocks);
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    attnd_plan_seq s = {64 * BS - 1, 1, blocks, 64};
    attnd_plan p;
    void *ws = plan_for(&p, &s, 1, &opts8);
    cr_assert_eq(p.num_launches, 1);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_3D);
    cr_assert_eq(p.launches[0].num_segments, 8);
    cr_assert_eq(p.slot_mapping[0], 63 * BS + BS - 1);
    cr_assert_eq(p.workspace_3d, attnd_paged_3d_workspace_size(1, 8, 64, 8));
    free(ws);
    free(blocks);
}

Test(plan, split_rows_bound_the_segments, .timeout = 60)
{
    /* as above (8 segments wanted) with a workspace for 5 rows x segments: 5; with 1, 2D */
    int32_t *blocks = calloc(64, sizeof *blocks);
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    attnd_plan_seq s = {64 * BS - 1, 1, blocks, 64};
    attnd_plan_opts o = opts8;
    attnd_plan p;
    o.max_split_rows = 5;
    void *ws = plan_for(&p, &s, 1, &o);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_3D);
    cr_assert_eq(p.launches[0].num_segments, 5);
    cr_assert_eq(p.workspace_3d, attnd_paged_3d_workspace_size(1, 8, 64, 5));
    free(ws);
    o.max_split_rows = 1;
    ws = plan_for(&p, &s, 1, &o);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(p.workspace_3d, 0);
    free(ws);
    free(blocks);
}

Test(plan, segment_count_bounds, .timeout = 60)
{
    attnd_plan_opts o = opts8;
    cr_assert_eq(attnd_plan_segments(&o, 1, 64), 8);
    cr_assert_eq(attnd_plan_segments(&o, 1, 3), 3, "never more segments than context blocks");
    cr_assert_eq(attnd_plan_segments(&o, 64, 100), 1, "a big batch fills the machine alone");
    cr_assert_eq(attnd_plan_segments(&o, 3, 100), 2, "whole waves: floor(16 / 6)");
    o.parallel_units = 100000;
    cr_assert_eq(attnd_plan_segments(&o, 1, 1 << 20), 1024, "capped at the kernel's limit");
    o.parallel_units = 0;
    cr_assert_eq(attnd_plan_segments(&o, 1, 10), 1);
    cr_assert_eq(attnd_plan_segments(&o, 1, 0), 1, "at least one");
}

Test(plan, segments_keep_a_minimum_context_each, .timeout = 60)
{
    /* the daemon's options on an H100 (132 SMs) for Llama-3-8B (8 kv heads, block 16) */
    attnd_plan_opts o = attnd_plan_opts_for(16, 32, 8, 128, 132);
    cr_assert_eq(o.min_segment_tokens, ATTND_PLAN_MIN_SEGMENT_TOKENS);
    cr_assert_eq(attnd_plan_segments(&o, 1, 32768 / 16), 32,
                 "1 x 32k: floor(264 / 8) = 33 rounded to 32");
    cr_assert_eq(attnd_plan_segments(&o, 8, 8192 / 16), 4, "8 x 8k: floor(264 / 64)");
    cr_assert_eq(attnd_plan_segments(&o, 16, 1056 / 16), 1, "16 x 1056: segments of 528 tokens");
    cr_assert_eq(attnd_plan_segments(&o, 32, 2080 / 16), 1, "32 x 2080: one wave already");
    cr_assert_eq(attnd_plan_segments(&o, 4, 1024 / 16), 8,
                 "4 x 1024: 32 of 132 units busy unsplit, so segments of 128 tokens");
    cr_assert_eq(attnd_plan_segments(&o, 4, 512 / 16), 4, "4 x 512: 128 tokens each at least");
    cr_assert_eq(attnd_plan_segments(&o, 2, 32768 / 16), 16, "2 x 32k: floor(264 / 16)");
    cr_assert_eq(attnd_plan_segments(&o, 1, 1000 / 16), 7, "1 x 1000: 62 blocks, 992 / 128 = 7");
    cr_assert_eq(attnd_plan_segments(&o, 1, 5), 1, "80 tokens: under 128, no split");
    o.min_segment_tokens = 0;
    cr_assert_eq(attnd_plan_segments(&o, 16, 1056 / 16), 2);
}

Test(plan, segments_come_in_whole_rounds_of_eight, .timeout = 60)
{
    attnd_plan_opts o = attnd_plan_opts_for(16, 32, 8, 128, 132);
    cr_assert_eq(attnd_plan_segments(&o, 1, 1 << 16), 32, "floor(264 / 8) = 33 rounded to 32");
    cr_assert_eq(attnd_plan_segments(&o, 1, 40), 5, "up to 8 kept as they are (640 / 128)");
    o.num_kv_heads = 1;
    cr_assert_eq(attnd_plan_segments(&o, 3, 1 << 16), 88, "floor(264 / 3) = 88");
    cr_assert_eq(attnd_plan_segments(&o, 5, 1 << 16), 48, "floor(264 / 5) = 52 rounded to 48");
}

Test(plan, a_short_decode_batch_stays_2d, .timeout = 60)
{
    /* one block of context each: a split cannot help */
    int32_t b0[] = {1}, b1[] = {2};
    attnd_plan_seq s[2] = {{3, 1, b0, 1}, {9, 1, b1, 1}};
    attnd_plan p;
    void *ws = plan_for(&p, s, 2, &opts8);
    cr_assert_eq(p.num_launches, 1);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(p.launches[0].num_segments, 1);
    cr_assert_eq(p.workspace_3d, 0);
    free(ws);
}

Test(plan, mixed_batch_splits_into_runs_with_rebased_offsets, .timeout = 60)
{
    int32_t d0[] = {10, 11, 12, 13}, d1[] = {20, 21, 22, 23}, pf[] = {30, 31}, d2[] = {40, 41, 42};
    attnd_plan_seq s[4] = {
        {60, 1, d0, 4}, /* decode */
        {50, 1, d1, 4}, /* decode */
        {0, 30, pf, 2}, /* prefill */
        {40, 1, d2, 3}, /* decode */
    };
    attnd_plan p;
    void *ws = plan_for(&p, s, 4, &opts8);
    cr_assert_eq(p.num_tokens, 33);
    int32_t qsl[] = {0, 1, 2, 32, 33};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(p.query_start_loc[i], qsl[i]);
    int32_t lens[] = {61, 51, 30, 41};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(p.seq_lens[i], lens[i]);
    cr_assert_eq(p.table_width, 4);
    cr_assert_eq(p.block_tables[2 * 4 + 2], 0, "short rows are padded with block 0");
    cr_assert_eq(p.block_tables[3 * 4 + 2], 42);
    cr_assert_eq(p.num_launches, 3);
    const attnd_launch *l = p.launches;
    cr_assert_eq(l[0].kind, ATTND_LAUNCH_3D);
    cr_assert_eq(l[0].seq0, 0);
    cr_assert_eq(l[0].nseqs, 2);
    cr_assert_eq(l[0].row0, 0);
    cr_assert_eq(l[0].nrows, 2);
    cr_assert_eq(l[0].num_segments, 4); /* ceil(16 / (2 seqs x 2 heads)), within 4 blocks */
    cr_assert_eq(l[1].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(l[1].seq0, 2);
    cr_assert_eq(l[1].row0, 2);
    cr_assert_eq(l[1].nrows, 30);
    cr_assert_eq(l[1].max_query_len, 30);
    cr_assert_eq(l[2].seq0, 3);
    cr_assert_eq(l[2].row0, 32);
    cr_assert_eq(l[2].kind, ATTND_LAUNCH_3D);
    cr_assert_eq(l[2].num_segments, 3, "3 blocks of context");
    /* each launch's offsets start at 0 and end at its row count */
    for (int i = 0; i < 3; i++) {
        const int32_t *q = p.qsl_local + l[i].qsl_off;
        cr_assert_eq(q[0], 0);
        cr_assert_eq(q[l[i].nseqs], l[i].nrows);
    }
    /* slot of the prefill's last token and of the last decode */
    cr_assert_eq(p.slot_mapping[31], 31 * BS + 13);
    cr_assert_eq(p.slot_mapping[32], 42 * BS + 8);
    size_t w0 = attnd_paged_3d_workspace_size(2, 8, 64, l[0].num_segments);
    size_t w2 = attnd_paged_3d_workspace_size(1, 8, 64, l[2].num_segments);
    cr_assert_eq(p.workspace_3d, w0 > w2 ? w0 : w2);
    free(ws);
}

Test(plan, index_arrays_are_contiguous_at_the_start, .timeout = 60)
{
    int32_t b[] = {1, 2};
    attnd_plan_seq s[2] = {{0, 17, b, 2}, {3, 1, b, 1}};
    attnd_plan p;
    char *ws = plan_for(&p, s, 2, &opts8);
    char *arrays[] = {(char *)p.slot_mapping, (char *)p.block_tables, (char *)p.seq_lens,
                      (char *)p.query_start_loc, (char *)p.qsl_local};
    for (int i = 0; i < 5; i++) {
        cr_assert_geq(arrays[i], ws);
        cr_assert_lt(arrays[i], ws + p.index_bytes, "array %d outside the index bytes", i);
    }
    cr_assert_geq((char *)p.launches, ws + p.index_bytes, "launches after the index arrays");
    cr_assert_eq((uintptr_t)p.slot_mapping % 8, 0);
    cr_assert_eq((uintptr_t)p.launches % 8, 0);
    free(ws);
}

Test(plan, bad_input_and_short_workspace, .timeout = 60)
{
    int32_t b[] = {1};
    attnd_plan_seq ok = {0, 16, b, 1}, zero = {0, 0, b, 1}, uncovered = {0, 17, b, 1};
    attnd_plan p;
    char ws[4096];
    cr_assert_eq(attnd_plan_build(&p, &ok, 0, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_plan_build(&p, &zero, 1, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_plan_build(&p, &uncovered, 1, &opts8, ws, sizeof ws),
                 ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_plan_workspace_size(&uncovered, 1, &opts8), 0);
    size_t need = attnd_plan_workspace_size(&ok, 1, &opts8);
    cr_assert_eq(attnd_plan_build(&p, &ok, 1, &opts8, ws, need - 1), ATTND_ERR_NO_MEMORY);
    cr_assert_eq(attnd_plan_build(&p, &ok, 1, &opts8, NULL, need), ATTND_ERR_NO_MEMORY);
    cr_assert_eq(attnd_plan_build(&p, &ok, 1, &opts8, ws, need), ATTND_ERR_OK);
    attnd_plan_seq huge = {0x7fffffff, 1, b, 1};
    cr_assert_eq(attnd_plan_build(&p, &huge, 1, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
}

Test(plan, one_launch_takes_the_whole_batch_into_2d, .timeout = 60)
{
    int32_t d0[] = {10, 11, 12, 13}, pf[] = {30, 31}, d1[] = {40, 41, 42};
    attnd_plan_seq s[3] = {{60, 1, d0, 4}, {0, 30, pf, 2}, {40, 1, d1, 3}};
    attnd_plan_opts o = opts8;
    attnd_plan p;
    o.one_launch = 1;
    void *ws = plan_for(&p, s, 3, &o);
    cr_assert_eq(p.num_launches, 1);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(p.launches[0].num_segments, 1);
    cr_assert_eq(p.launches[0].nseqs, 3);
    cr_assert_eq(p.launches[0].nrows, 32);
    cr_assert_eq(p.launches[0].max_query_len, 30);
    cr_assert_eq(p.launches[0].max_seq_len, 61);
    for (int i = 0; i <= 3; i++)
        cr_assert_eq(p.qsl_local[p.launches[0].qsl_off + i], p.query_start_loc[i]);
    cr_assert_eq(p.workspace_3d, 0);
    free(ws);
}

/* A layer of f32 tensors: q/out [T, 8, 64], k/v [T, 2, 64], lse [8, T]; a bf16 cache. */
static attnd_plan_layer host_layer(float *q, float *k, float *v, float *out, float *lse, int64_t T,
                                   uint16_t *kc, uint16_t *vc, int64_t nblocks)
{
    attnd_plan_layer l;
    int64_t sq[3] = {T, 8, 64}, skv[3] = {T, 2, 64}, sl[2] = {8, T}, sc[4] = {nblocks, BS, 2, 64};
    memset(&l, 0, sizeof l);
    attnd_tensor_init(&l.q, q, ATTND_DTYPE_F32, 3, sq);
    attnd_tensor_init(&l.k_new, k, ATTND_DTYPE_F32, 3, skv);
    attnd_tensor_init(&l.v_new, v, ATTND_DTYPE_F32, 3, skv);
    attnd_tensor_init(&l.out, out, ATTND_DTYPE_F32, 3, sq);
    attnd_tensor_init(&l.lse, lse, ATTND_DTYPE_F32, 2, sl);
    attnd_tensor_init(&l.k_cache, kc, ATTND_DTYPE_BF16, 4, sc);
    attnd_tensor_init(&l.v_cache, vc, ATTND_DTYPE_BF16, 4, sc);
    l.scale = 0.125f;
    l.k_scale = l.v_scale = 1.0f;
    return l;
}

Test(plan, params_slice_each_launch_and_point_into_the_index, .timeout = 60)
{
    int32_t d0[] = {10, 11, 12, 13}, pf[] = {30, 31}, d1[] = {40, 41, 42};
    attnd_plan_seq s[3] = {{60, 1, d0, 4}, {0, 30, pf, 2}, {40, 1, d1, 3}};
    static float q[32 * 8 * 64], out[32 * 8 * 64], lse[8 * 32];
    char index[4096];
    attnd_plan p;
    char *ws = plan_for(&p, s, 3, &opts8);
    attnd_plan_layer l = host_layer(q, NULL, NULL, out, lse, 32, NULL, NULL, 64);
    l.softcap = 30.0f;
    l.sliding_window = 7;
    static float sinks[8];
    int64_t hq = 8;
    attnd_tensor_init(&l.sinks, sinks, ATTND_DTYPE_F32, 1, &hq);
    attnd_paged_params pp;
    attnd_plan_paged_params(&p, index, 1, &l, &pp); /* the prefill: rows 1..30, sequence 1 */
    cr_assert_eq(pp.q.data, (void *)(q + 1 * 8 * 64));
    cr_assert_eq(pp.q.shape[0], 30);
    cr_assert_eq(pp.out.data, (void *)(out + 1 * 8 * 64));
    cr_assert_eq(pp.out_lse.data, (void *)(lse + 1), "lse is [heads, tokens]: a column slice");
    cr_assert_eq(pp.out_lse.shape[1], 30);
    cr_assert_eq(pp.out_lse.strides[0], 32);
    cr_assert_eq((char *)pp.block_tables.data - index,
                 (char *)(p.block_tables + 1 * p.table_width) - ws);
    cr_assert_eq(pp.block_tables.shape[0], 1);
    cr_assert_eq(pp.block_tables.shape[1], p.table_width);
    cr_assert_eq((char *)pp.seq_lens.data - index, (char *)(p.seq_lens + 1) - ws);
    cr_assert_eq((char *)pp.query_start_loc.data - index,
                 (char *)(p.qsl_local + p.launches[1].qsl_off) - ws);
    cr_assert_eq(pp.query_start_loc.shape[0], 2);
    cr_assert_eq(pp.max_query_len, 30);
    cr_assert_eq(pp.max_seq_len, 30);
    cr_assert_eq(pp.softcap, 30.0f);
    cr_assert_eq(pp.sliding_window, 7);
    cr_assert_null(pp.alibi_slopes.data);
    cr_assert_eq(pp.sinks.data, (void *)sinks, "the layer's sinks go to every launch");
    attnd_cache_write_params cw;
    attnd_plan_cache_write_params(&p, index, &l, &cw);
    cr_assert_eq(cw.slot_mapping.data, (void *)index, "the slot mapping opens the index");
    cr_assert_eq(cw.slot_mapping.shape[0], 32);
    cr_assert_eq(cw.k_scale, 1.0f);
    free(ws);
}

Test(plan, a_run_of_split_launches_matches_one_2d_launch, .timeout = 60)
{
    /* decodes (3D), a prefill (2D), a decode (3D) against the whole batch in one 2D launch */
    enum { NB = 64, T = 32 };
    int32_t d0[] = {10, 11, 12, 13}, pf[] = {30, 31}, d1[] = {40, 41, 42};
    attnd_plan_seq s[3] = {{60, 1, d0, 4}, {0, 30, pf, 2}, {40, 1, d1, 3}};
    attnd_backend_opts bo = {2, 0};
    attnd_backend *be;
    attnd_plan split, one;
    attnd_plan_opts o = opts8;
    uint16_t *kc = malloc(sizeof(uint16_t) * NB * BS * 2 * 64);
    uint16_t *vc = malloc(sizeof(uint16_t) * NB * BS * 2 * 64);
    float *q = malloc(sizeof(float) * T * 8 * 64), *k = malloc(sizeof(float) * T * 2 * 64);
    float *v = malloc(sizeof(float) * T * 2 * 64), *o1 = malloc(sizeof(float) * T * 8 * 64);
    float *o2 = malloc(sizeof(float) * T * 8 * 64), lse1[8 * T], lse2[8 * T];
    for (int i = 0; i < NB * BS * 2 * 64; i++) {
        kc[i] = attnd_f32_to_bf16((float)((i * 7) % 13) / 13.0f - 0.5f);
        vc[i] = attnd_f32_to_bf16((float)((i * 5) % 11) / 11.0f - 0.5f);
    }
    for (int i = 0; i < T * 8 * 64; i++)
        q[i] = (float)((i * 3) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < T * 2 * 64; i++) {
        k[i] = (float)((i * 11) % 19) / 19.0f - 0.5f;
        v[i] = (float)((i * 13) % 23) / 23.0f - 0.5f;
    }
    cr_assert_eq(attnd_backend_open(&be, "cpu", &bo), ATTND_ERR_OK);
    void *ws1 = plan_for(&split, s, 3, &o);
    o.one_launch = 1;
    void *ws2 = plan_for(&one, s, 3, &o);
    cr_assert_eq(split.num_launches, 3);
    void *ws3d = malloc(split.workspace_3d);
    attnd_plan_layer l1 = host_layer(q, k, v, o1, lse1, T, kc, vc, NB);
    attnd_plan_layer l2 = host_layer(q, k, v, o2, lse2, T, kc, vc, NB);
    float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -INFINITY, 3.0f, 0.25f};
    int64_t hq = 8;
    attnd_tensor_init(&l1.sinks, sinks, ATTND_DTYPE_F32, 1, &hq); /* once per row, also in 3D */
    l2.sinks = l1.sinks;
    cr_assert_eq(attnd_plan_run_layer(be, &split, split.slot_mapping, &l1, ws3d), ATTND_ERR_OK,
                 "%s", attnd_backend_last_error(be));
    cr_assert_eq(attnd_plan_run_layer(be, &one, one.slot_mapping, &l2, NULL), ATTND_ERR_OK);
    for (int i = 0; i < T * 8 * 64; i++)
        cr_assert_float_eq(o1[i], o2[i], 1e-4, "out[%d]: %g vs %g", i, o1[i], o2[i]);
    for (int i = 0; i < 8 * T; i++)
        cr_assert_float_eq(lse1[i], lse2[i], 1e-4, "lse[%d]", i);
    /* the new rows went to their slots: the prefill's token 17 is row 1 of block 31 */
    cr_assert_eq(kc[(31 * BS + 1) * 2 * 64], attnd_f32_to_bf16(k[(1 + 17) * 2 * 64]));
    attnd_backend_close(be);
    free(ws1), free(ws2), free(ws3d), free(kc), free(vc), free(q), free(k), free(v), free(o1),
        free(o2);
}
