/* The planner: a step's sequences -> index arrays and launches (attnd/plan.h). */
#include "attnd/plan.h"

#include <string.h>

#define PLAN_MAX_SEGMENTS 1024

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

static int is_decode(const attnd_plan_seq *s)
{
    return s->new_tokens == 1;
}

/* Whether sequences a and b go to one launch: both decode or both not (or one launch for all). */
static int same_launch(const attnd_plan_opts *o, const attnd_plan_seq *a, const attnd_plan_seq *b)
{
    return o->one_launch || is_decode(a) == is_decode(b);
}

/* Number of launches: maximal runs of sequences of one class. */
static int32_t count_runs(const attnd_plan_seq *seqs, int32_t n, const attnd_plan_opts *o)
{
    int32_t runs = 0;
    for (int32_t i = 0; i < n; i++)
        if (i == 0 || !same_launch(o, &seqs[i], &seqs[i - 1])) runs++;
    return runs;
}

static attnd_err check_input(const attnd_plan_seq *seqs, int32_t n, const attnd_plan_opts *o,
                             int64_t *tokens, int32_t *width)
{
    int64_t t = 0;
    *width = 1;
    if (n <= 0 || o->block_size <= 0) return ATTND_ERR_INVALID_ARGUMENT;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = (uint64_t)seqs[i].context_len + seqs[i].new_tokens;
        if (seqs[i].new_tokens == 0 || len > INT32_MAX) return ATTND_ERR_INVALID_ARGUMENT;
        if ((uint64_t)seqs[i].nblocks * (uint64_t)o->block_size < len)
            return ATTND_ERR_INVALID_ARGUMENT;
        if (seqs[i].nblocks > (uint32_t)*width) *width = (int32_t)seqs[i].nblocks;
        t += seqs[i].new_tokens;
        if (t > INT32_MAX) return ATTND_ERR_INVALID_ARGUMENT;
    }
    *tokens = t;
    return ATTND_ERR_OK;
}

/* The one layout code path: offsets (and, with ws, pointers) of every array. */
static size_t plan_layout(attnd_plan *p, int32_t n, int64_t tokens, int32_t width, int32_t runs,
                          char *ws)
{
    size_t off = 0;
    p->slot_mapping = (int64_t *)(ws ? ws + off : NULL);
    off += (size_t)tokens * sizeof(int64_t);
    p->block_tables = (int32_t *)(ws ? ws + off : NULL);
    off += (size_t)n * (size_t)width * sizeof(int32_t);
    p->seq_lens = (int32_t *)(ws ? ws + off : NULL);
    off += (size_t)n * sizeof(int32_t);
    p->query_start_loc = (int32_t *)(ws ? ws + off : NULL);
    off += (size_t)(n + 1) * sizeof(int32_t);
    p->qsl_local = (int32_t *)(ws ? ws + off : NULL);
    off += (size_t)(n + runs) * sizeof(int32_t);
    p->index_bytes = off;
    off = align8(off);
    p->launches = (attnd_launch *)(ws ? ws + off : NULL);
    off += (size_t)runs * sizeof(attnd_launch);
    return off;
}

size_t attnd_plan_workspace_size(const attnd_plan_seq *seqs, int32_t num_seqs,
                                 const attnd_plan_opts *opts)
{
    attnd_plan p;
    int64_t tokens;
    int32_t width;
    if (check_input(seqs, num_seqs, opts, &tokens, &width) != ATTND_ERR_OK) return 0;
    return plan_layout(&p, num_seqs, tokens, width, count_runs(seqs, num_seqs, opts), NULL);
}

size_t attnd_plan_index_bound(int32_t num_seqs, int64_t num_tokens, int32_t table_width)
{
    attnd_plan p;
    if (num_seqs < 1) num_seqs = 1;
    if (table_width < 1) table_width = 1;
    plan_layout(&p, num_seqs, num_tokens, table_width, num_seqs, NULL);
    return p.index_bytes;
}

attnd_plan_opts attnd_plan_opts_for(int32_t block_size, int32_t num_q_heads, int32_t num_kv_heads,
                                    int32_t head_size, int32_t units)
{
    attnd_plan_opts o = {.block_size = block_size,
                         .num_q_heads = num_q_heads,
                         .num_kv_heads = num_kv_heads,
                         .head_size = head_size,
                         .parallel_units = units,
                         .max_split_rows = attnd_plan_split_rows(units),
                         .min_segment_tokens = ATTND_PLAN_MIN_SEGMENT_TOKENS};
    return o;
}

int32_t attnd_plan_split_rows(int32_t units)
{
    return 8 * (units > 0 ? units : 1) + 256;
}

int32_t attnd_plan_segments(const attnd_plan_opts *o, int32_t nseqs, int32_t max_ctx_blocks)
{
    int64_t units = o->parallel_units > 0 ? o->parallel_units : 1;
    int64_t per_segment = (int64_t)nseqs * (o->num_kv_heads > 0 ? o->num_kv_heads : 1);
    int64_t segs = 2 * units / per_segment;
    if (segs > max_ctx_blocks) segs = max_ctx_blocks;
    if (o->min_segment_tokens > 0 && o->block_size > 0) {
        /* unsplit, this launch keeps fewer than half the units busy: short segments pay off */
        int64_t min_tokens = o->min_segment_tokens;
        if (2 * per_segment <= units && min_tokens > ATTND_PLAN_IDLE_SEGMENT_TOKENS)
            min_tokens = ATTND_PLAN_IDLE_SEGMENT_TOKENS;
        int64_t longest = (int64_t)max_ctx_blocks * o->block_size / min_tokens;
        if (segs > longest) segs = longest;
    }
    if (segs > PLAN_MAX_SEGMENTS) segs = PLAN_MAX_SEGMENTS;
    if (segs > 8) segs -= segs % 8; /* whole rounds of the merge, segments of one length */
    return segs < 1 ? 1 : (int32_t)segs;
}

static void fill_seq(attnd_plan *p, const attnd_plan_seq *s, int32_t i)
{
    int32_t bs = p->block_size;
    int32_t *row = p->block_tables + (size_t)i * (size_t)p->table_width;
    memcpy(row, s->blocks, (size_t)s->nblocks * sizeof(int32_t));
    memset(row + s->nblocks, 0, (size_t)(p->table_width - (int32_t)s->nblocks) * sizeof(int32_t));
    p->seq_lens[i] = (int32_t)(s->context_len + s->new_tokens);
    p->query_start_loc[i + 1] = p->query_start_loc[i] + (int32_t)s->new_tokens;
    int64_t *slots = p->slot_mapping + p->query_start_loc[i];
    for (uint32_t t = 0; t < s->new_tokens; t++) {
        uint32_t pos = s->context_len + t;
        slots[t] = (int64_t)s->blocks[pos / (uint32_t)bs] * bs + pos % (uint32_t)bs;
    }
}

/* Close the launch of sequences [seq0, end): rebased offsets, bounds, kind, segments. */
static void fill_launch(attnd_plan *p, const attnd_plan_seq *seqs, const attnd_plan_opts *o,
                        attnd_launch *l, int32_t seq0, int32_t end, int32_t *qsl_next)
{
    int32_t max_blocks = 1;
    l->seq0 = seq0;
    l->nseqs = end - seq0;
    l->row0 = p->query_start_loc[seq0];
    l->nrows = p->query_start_loc[end] - l->row0;
    l->qsl_off = *qsl_next;
    l->max_query_len = l->max_seq_len = 0;
    for (int32_t i = seq0; i <= end; i++)
        p->qsl_local[(*qsl_next)++] = p->query_start_loc[i] - l->row0;
    for (int32_t i = seq0; i < end; i++) {
        if ((int32_t)seqs[i].new_tokens > l->max_query_len)
            l->max_query_len = (int32_t)seqs[i].new_tokens;
        if (p->seq_lens[i] > l->max_seq_len) l->max_seq_len = p->seq_lens[i];
        int32_t blocks = (p->seq_lens[i] + p->block_size - 1) / p->block_size;
        if (blocks > max_blocks) max_blocks = blocks;
    }
    l->kind = ATTND_LAUNCH_2D;
    l->num_segments = 1;
    if (!o->one_launch && is_decode(&seqs[seq0])) {
        /* a split of one segment is the 2D kernel's work without the merge */
        int32_t segs = attnd_plan_segments(o, l->nseqs, max_blocks);
        if (o->max_split_rows > 0 && (int64_t)segs * l->nrows > o->max_split_rows)
            segs = o->max_split_rows / (l->nrows > 0 ? l->nrows : 1);
        if (segs > 1) {
            l->kind = ATTND_LAUNCH_3D;
            l->num_segments = segs;
            size_t need =
                attnd_paged_3d_workspace_size(l->nrows, o->num_q_heads, o->head_size, segs);
            if (need > p->workspace_3d) p->workspace_3d = need;
        }
    }
}

attnd_err attnd_plan_build(attnd_plan *p, const attnd_plan_seq *seqs, int32_t n,
                           const attnd_plan_opts *o, void *ws, size_t ws_bytes)
{
    int64_t tokens;
    int32_t width;
    attnd_err rv;
    memset(p, 0, sizeof *p);
    if ((rv = check_input(seqs, n, o, &tokens, &width)) != ATTND_ERR_OK) return rv;
    int32_t runs = count_runs(seqs, n, o);
    if (ws == NULL || plan_layout(p, n, tokens, width, runs, NULL) > ws_bytes)
        return ATTND_ERR_NO_MEMORY;
    plan_layout(p, n, tokens, width, runs, ws);
    p->num_seqs = n;
    p->num_tokens = (int32_t)tokens;
    p->block_size = o->block_size;
    p->table_width = width;
    p->query_start_loc[0] = 0;
    for (int32_t i = 0; i < n; i++)
        fill_seq(p, &seqs[i], i);
    int32_t seq0 = 0, qsl_next = 0;
    for (int32_t i = 1; i <= n; i++) {
        if (i < n && same_launch(o, &seqs[i], &seqs[seq0])) continue;
        fill_launch(p, seqs, o, &p->launches[p->num_launches++], seq0, i, &qsl_next);
        seq0 = i;
    }
    return ATTND_ERR_OK;
}
