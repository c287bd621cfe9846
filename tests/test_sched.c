/* Step planner: query_start_loc, seq_lens, block tables and slot mapping from the sequences'
 * blocks; the split into launches (decode runs -> 3D with enough segments, others -> 2D, one
 * launch per run of one kind, offsets rebased); the workspace size and its checks. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/kernels.h"
#include "sched.h"

#define BS 16

static const attnd_sched_opts opts8 = {BS, 8, 2, 64, 8, 0}; /* 8 parallel units */

static void *plan_for(attnd_plan *p, const attnd_sched_seq *s, int32_t n, const attnd_sched_opts *o)
{
    size_t bytes = attnd_sched_workspace_size(s, n, o);
    cr_assert_gt(bytes, 0);
    void *ws = malloc(bytes);
    memset(ws, 0xa5, bytes); /* garbage: every entry must be written */
    cr_assert_eq(attnd_sched_plan(p, s, n, o, ws, bytes), ATTND_ERR_OK);
    return ws;
}

Test(sched, one_prefill_sequence, .timeout = 60)
{
    int32_t blocks[] = {7, 3, 9};
    attnd_sched_seq s = {0, 40, blocks, 3};
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

Test(sched, context_offsets_the_slots, .timeout = 60)
{
    /* 20 tokens cached: the 5 new ones start at row 4 of the second block */
    int32_t blocks[] = {2, 5};
    attnd_sched_seq s = {20, 5, blocks, 2};
    attnd_plan p;
    void *ws = plan_for(&p, &s, 1, &opts8);
    cr_assert_eq(p.seq_lens[0], 25);
    for (int t = 0; t < 5; t++)
        cr_assert_eq(p.slot_mapping[t], 5 * BS + 4 + t);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D, "5 queries is not a decode");
    free(ws);
}

Test(sched, decodes_go_to_3d_with_segments_that_fill_the_machine, .timeout = 60)
{
    /* one sequence, 64 blocks of context: 2 waves over 8 units / (1 seq x 2 kv heads) = 8 */
    int32_t *blocks = calloc(64, sizeof *blocks);
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    attnd_sched_seq s = {64 * BS - 1, 1, blocks, 64};
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

Test(sched, split_rows_bound_the_segments, .timeout = 60)
{
    /* as above (8 segments wanted) with a workspace for 5 rows x segments: 5; with 1, 2D */
    int32_t *blocks = calloc(64, sizeof *blocks);
    for (int i = 0; i < 64; i++)
        blocks[i] = i;
    attnd_sched_seq s = {64 * BS - 1, 1, blocks, 64};
    attnd_sched_opts o = opts8;
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

Test(sched, segment_count_bounds, .timeout = 60)
{
    attnd_sched_opts o = opts8;
    cr_assert_eq(attnd_sched_segments(&o, 1, 64), 8);
    cr_assert_eq(attnd_sched_segments(&o, 1, 3), 3, "never more segments than context blocks");
    cr_assert_eq(attnd_sched_segments(&o, 64, 100), 1, "a big batch fills the machine alone");
    cr_assert_eq(attnd_sched_segments(&o, 3, 100), 3); /* ceil(16 / 6) */
    o.parallel_units = 100000;
    cr_assert_eq(attnd_sched_segments(&o, 1, 1 << 20), 1024, "capped at the kernel's limit");
    o.parallel_units = 0;
    cr_assert_eq(attnd_sched_segments(&o, 1, 10), 1);
    cr_assert_eq(attnd_sched_segments(&o, 1, 0), 1, "at least one");
}

Test(sched, a_short_decode_batch_stays_2d, .timeout = 60)
{
    /* one block of context each: a split cannot help */
    int32_t b0[] = {1}, b1[] = {2};
    attnd_sched_seq s[2] = {{3, 1, b0, 1}, {9, 1, b1, 1}};
    attnd_plan p;
    void *ws = plan_for(&p, s, 2, &opts8);
    cr_assert_eq(p.num_launches, 1);
    cr_assert_eq(p.launches[0].kind, ATTND_LAUNCH_2D);
    cr_assert_eq(p.launches[0].num_segments, 1);
    cr_assert_eq(p.workspace_3d, 0);
    free(ws);
}

Test(sched, mixed_batch_splits_into_runs_with_rebased_offsets, .timeout = 60)
{
    int32_t d0[] = {10, 11, 12, 13}, d1[] = {20, 21, 22, 23}, pf[] = {30, 31}, d2[] = {40, 41, 42};
    attnd_sched_seq s[4] = {
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

Test(sched, index_arrays_are_contiguous_at_the_start, .timeout = 60)
{
    int32_t b[] = {1, 2};
    attnd_sched_seq s[2] = {{0, 17, b, 2}, {3, 1, b, 1}};
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

Test(sched, bad_input_and_short_workspace, .timeout = 60)
{
    int32_t b[] = {1};
    attnd_sched_seq ok = {0, 16, b, 1}, zero = {0, 0, b, 1}, uncovered = {0, 17, b, 1};
    attnd_plan p;
    char ws[4096];
    cr_assert_eq(attnd_sched_plan(&p, &ok, 0, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_sched_plan(&p, &zero, 1, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_sched_plan(&p, &uncovered, 1, &opts8, ws, sizeof ws),
                 ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_sched_workspace_size(&uncovered, 1, &opts8), 0);
    size_t need = attnd_sched_workspace_size(&ok, 1, &opts8);
    cr_assert_eq(attnd_sched_plan(&p, &ok, 1, &opts8, ws, need - 1), ATTND_ERR_NO_MEMORY);
    cr_assert_eq(attnd_sched_plan(&p, &ok, 1, &opts8, NULL, need), ATTND_ERR_NO_MEMORY);
    cr_assert_eq(attnd_sched_plan(&p, &ok, 1, &opts8, ws, need), ATTND_ERR_OK);
    attnd_sched_seq huge = {0x7fffffff, 1, b, 1};
    cr_assert_eq(attnd_sched_plan(&p, &huge, 1, &opts8, ws, sizeof ws), ATTND_ERR_INVALID_ARGUMENT);
}
