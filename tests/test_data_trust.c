/* What a client shares with the daemon is never trusted past the check (issue 13), against the
 * real daemon (cpu backend) over its socket and its shared-memory channel:
 *   - an output that overlaps any other tensor of its request is refused, naming both, for
 *     every op (Attend, merge, varlen, block-sparse, linear prefill and decode), in one region
 *     or in two regions mapping the same object; neighbours that only touch are fine;
 *   - a client thread flipping cu_seqlens / layout values (negative, out of range, shifted onto
 *     another session's memory) and scribbling on outputs while varlen and block-sparse
 *     requests run: the daemon stays up, every reply is OK or INVALID_ARGUMENT, an OK output is
 *     the right one, and another session's region is never written;
 *   - a step commits only when every layer was attended exactly once: a repeated Attend is
 *     refused, EndStep names the missing or repeated layers and leaves the step open, abort is
 *     always accepted.
 * The race runs again against a daemon built with ASan + UBSan (tests/sanitize_race.sh). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon_proc.h"
#include "e2e_mirror.h"
#include "suite.h"
#include "testutil.h"

#define CONFIG                                                                                     \
    "{\"backend\": \"cpu\", \"threads\": 2, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 8, \"num_q_heads\": 4, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 32, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 32},"                                                                \
    " \"linear\": {\"slots\": 4, \"heads\": 2, \"head_dim\": 32},"                                 \
    " \"log\": {\"level\": \"error\", \"stats_interval_s\": 0}}"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static attnd_client *connect_opts(const attnd_daemon_proc *d, int channel)
{
    attnd_client_opts o = {
        .name = "data-trust", .timeout_ms = 20000, .channel_slots = channel ? 0 : -1};
    attnd_client *c = NULL;
    cr_assert_eq(attnd_client_alloc(&c, &o), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_connect(c, d->url, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    cr_assert_eq(attnd_client_channel_active(c), channel, "channel: %s",
                 attnd_client_channel_error(c));
    return c;
}

/* A failed call: its code, and every part in the daemon's message. */
static void expect_refused(attnd_client *c, attnd_err rv, attnd_err code, const char *what,
                           const char *part1, const char *part2)
{
    const char *msg = attnd_client_last_error(c);
    cr_assert_eq(rv, code, "%s: %s (%s), expected %s", what, attnd_err_name(rv), msg,
                 attnd_err_name(code));
    cr_assert_not_null(strstr(msg, part1), "%s: \"%s\" not in \"%s\"", what, part1, msg);
    if (part2) cr_assert_not_null(strstr(msg, part2), "%s: \"%s\" not in \"%s\"", what, part2, msg);
}

/* ---------------------------------------------------------------- varlen and block-sparse */

#define VH 4    /* q heads */
#define VK 2    /* kv heads */
#define VD 32   /* head size */
#define NSEQ 3  /* sequences of lengths 20, 40, 8 (q_len == k_len) */
#define VT 68   /* rows */
#define VMAX 40 /* longest sequence */
#define BSZ 16  /* block-sparse key and query block size */
#define ROWS 3  /* layout rows: ceil(40 / 16) */
#define COLS 6  /* a lower-triangular layout lists 1 + 2 + 3 blocks */
#define VOUT ((size_t)VT * VH * VD)

/* One client's varlen / block-sparse tensors in one region: q | k | v | out | cu_q | cu_k |
 * crow | col, 64-byte aligned, and the outputs they must give. */
typedef struct vl {
    attnd_shm shm;
    uint64_t off[8];
    attnd_ref q, k, v, out, cu_q, cu_k, crow, col;
    int32_t cu[NSEQ + 1], crow_v[VH][ROWS + 1], col_v[VH][COLS];
    float want_varlen[VOUT], want_bs[VOUT];
} vl;

enum { VQ, VKK, VV, VO, VCQ, VCK, VCR, VCL };

static void *at(const vl *x, int which)
{
    return (char *)x->shm.base + x->off[which];
}

static void vl_layout(vl *x)
{
    static const int64_t sq[3] = {VT, VH, VD}, sk[3] = {VT, VK, VD}, scu[1] = {NSEQ + 1};
    static const int64_t scr[2] = {VH, ROWS + 1}, scl[2] = {VH, COLS};
    const int64_t *shapes[8] = {sq, sk, sk, sq, scu, scu, scr, scl};
    const int32_t nd[8] = {3, 3, 3, 3, 1, 1, 2, 2};
    const attnd_dtype dt[8] = {ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16,
                               ATTND_DTYPE_F32,  ATTND_DTYPE_I32,  ATTND_DTYPE_I32,
                               ATTND_DTYPE_I32,  ATTND_DTYPE_I32};
    attnd_ref *refs[8] = {&x->q, &x->k, &x->v, &x->out, &x->cu_q, &x->cu_k, &x->crow, &x->col};
    uint64_t off = 0;
    for (int i = 0; i < 8; i++) {
        x->off[i] = off;
        attnd_ref_shm(refs[i], &x->shm, off, dt[i], nd[i], shapes[i]);
        off += (attnd_ref_nbytes(dt[i], nd[i], shapes[i]) + 63) / 64 * 64;
    }
    cr_assert_leq(off, x->shm.size);
}

/* The good index values, written into the region. */
static void vl_write_indices(vl *x)
{
    memcpy(at(x, VCQ), x->cu, sizeof x->cu);
    memcpy(at(x, VCK), x->cu, sizeof x->cu);
    memcpy(at(x, VCR), x->crow_v, sizeof x->crow_v);
    memcpy(at(x, VCL), x->col_v, sizeof x->col_v);
}

static attnd_tensor host_t(void *p, attnd_dtype dt, int32_t nd, int64_t a, int64_t b, int64_t c)
{
    attnd_tensor t;
    int64_t shape[3] = {a, b, c};
    attnd_tensor_init(&t, p, dt, nd, shape);
    return t;
}

/* What the cpu backend, called here on the same bytes, gives for both ops. */
static void vl_expect(vl *x)
{
    attnd_backend *cpu = attnd_test_open_cpu(1);
    attnd_tensor q = host_t(at(x, VQ), ATTND_DTYPE_BF16, 3, VT, VH, VD);
    attnd_tensor k = host_t(at(x, VKK), ATTND_DTYPE_BF16, 3, VT, VK, VD);
    attnd_tensor v = host_t(at(x, VV), ATTND_DTYPE_BF16, 3, VT, VK, VD);
    attnd_tensor cu = host_t(x->cu, ATTND_DTYPE_I32, 1, NSEQ + 1, 0, 0);
    attnd_varlen_params p = {.q = q, .k = k, .v = v, .cu_seqlens_q = cu, .cu_seqlens_k = cu};
    p.out = host_t(x->want_varlen, ATTND_DTYPE_F32, 3, VT, VH, VD);
    p.max_seqlen_q = p.max_seqlen_k = VMAX;
    p.causal = 1;
    p.scale = 1.0f / sqrtf((float)VD);
    p.q_scale = p.k_scale = p.v_scale = p.p_scale = p.out_scale = 1.0f;
    cr_assert_eq(attnd_varlen_attention(cpu, &p), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(cpu));
    attnd_blocksparse_params b = {.q = q, .k = k, .v = v, .cu_seqlens_q = cu, .cu_seqlens_k = cu};
    b.out = host_t(x->want_bs, ATTND_DTYPE_F32, 3, VT, VH, VD);
    b.layout_crow = host_t(x->crow_v, ATTND_DTYPE_I32, 2, VH, ROWS + 1, 0);
    b.layout_col = host_t(x->col_v, ATTND_DTYPE_I32, 2, VH, COLS, 0);
    b.block_size = b.q_block_size = BSZ;
    b.max_seqlen_q = b.max_seqlen_k = VMAX;
    b.scale = p.scale;
    cr_assert_eq(attnd_blocksparse_attention(cpu, &b), ATTND_ERR_OK, "%s",
                 attnd_backend_last_error(cpu));
    attnd_backend_close(cpu);
}

/* x's region, random q/k/v, the indices, the expected outputs. */
static void vl_init(vl *x, attnd_client *c, uint64_t seed)
{
    static const int32_t lens[NSEQ] = {20, 40, 8};
    attnd_rng r;
    memset(x, 0, sizeof *x);
    cr_assert_eq(attnd_client_shm_create(c, 192 * 1024, &x->shm), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    vl_layout(x);
    attnd_rng_seed(&r, seed);
    uint16_t *qkv[3] = {at(x, VQ), at(x, VKK), at(x, VV)};
    size_t n[3] = {VOUT, (size_t)VT * VK * VD, (size_t)VT * VK * VD};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n[t]; i++)
            qkv[t][i] = attnd_f32_to_bf16((float)attnd_rng_normal(&r));
    for (int s = 0; s < NSEQ; s++)
        x->cu[s + 1] = x->cu[s] + lens[s];
    for (int h = 0; h < VH; h++) { /* row r lists blocks 0..r */
        int k = 0;
        for (int row = 0; row < ROWS; row++) {
            x->crow_v[h][row] = k;
            for (int b = 0; b <= row; b++)
                x->col_v[h][k++] = b;
        }
        x->crow_v[h][ROWS] = k;
    }
    vl_write_indices(x);
    vl_expect(x);
}

static attnd_err vl_varlen(attnd_client *c, const vl *x, attnd_ref *out)
{
    attnd_varlen_args a = {.q = &x->q, .k = &x->k, .v = &x->v, .out = out, .causal = 1};
    a.cu_seqlens_q = &x->cu_q;
    a.cu_seqlens_k = &x->cu_k;
    return attnd_client_varlen(c, &a);
}

static attnd_err vl_blocksparse(attnd_client *c, const vl *x, attnd_ref *out)
{
    attnd_blocksparse_args a = {.q = &x->q, .k = &x->k, .v = &x->v, .out = out};
    a.cu_seqlens_q = &x->cu_q;
    a.cu_seqlens_k = &x->cu_k;
    a.layout_crow = &x->crow;
    a.layout_col = &x->col;
    a.block_size = a.q_block_size = BSZ;
    return attnd_client_blocksparse(c, &a);
}

/* Largest |out - want| relative to the largest |want| (+inf on NaN). */
static double vl_err(const vl *x, const float *want)
{
    const float *o = at(x, VO);
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < VOUT; i++) {
        double d = fabs((double)o[i] - want[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
    }
    return worst / scale;
}

/* ---------------------------------------------------------------- items 2 and 4: overlaps */

/* varlen and block-sparse: out onto each index tensor and onto q; one touching neighbour. */
static void overlap_varlen(attnd_client *c, vl *x)
{
    attnd_ref out = x->out;
    out.offset = x->off[VCQ] - 4 * 64; /* its last rows cover cu_seqlens_q */
    expect_refused(c, vl_varlen(c, x, &out), ATTND_ERR_INVALID_ARGUMENT, "varlen out on cu_q",
                   "out: bytes", "cu_seqlens_q");
    out.offset = x->off[VQ] + 64;
    expect_refused(c, vl_varlen(c, x, &out), ATTND_ERR_INVALID_ARGUMENT, "varlen out on q",
                   "out: bytes", "overlap q ");
    out.offset = x->off[VCK] + 4; /* from cu_seqlens_k[1] on */
    expect_refused(c, vl_varlen(c, x, &out), ATTND_ERR_INVALID_ARGUMENT, "varlen out on cu_k",
                   "out: bytes", "cu_seqlens_k");
    out.offset = x->off[VCL];
    expect_refused(c, vl_blocksparse(c, x, &out), ATTND_ERR_INVALID_ARGUMENT,
                   "block-sparse out on layout_col", "layout_col: bytes", "overlap out");
    out.offset = x->off[VCR] + 8;
    expect_refused(c, vl_blocksparse(c, x, &out), ATTND_ERR_INVALID_ARGUMENT,
                   "block-sparse out on layout_crow", "layout_crow: bytes", "overlap out");
    /* touching is not overlapping: out ending exactly where cu_seqlens_q starts */
    memset(at(x, VO), 0xff, VOUT * 4);
    out = x->out;
    cr_assert_eq(x->off[VO] + VOUT * 4, x->off[VCQ], "the layout packs out against cu_q");
    cr_assert_eq(vl_varlen(c, x, &out), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_leq(vl_err(x, x->want_varlen), 1e-5);
    cr_assert_eq(memcmp(at(x, VCQ), x->cu, sizeof x->cu), 0, "cu_seqlens_q written");
}

/* Attend (over the channel: outputs in a region): out onto k_new, out_lse onto out. */
static void overlap_attend(attnd_client *c, attnd_shm *shm, const attnd_geometry *g)
{
    attnd_e2e_io io;
    attnd_step st;
    attnd_step_seq s = {1, 3};
    attnd_rng r;
    attnd_rng_seed(&r, 5);
    attnd_e2e_io_layout(&io, g, shm, ATTND_DTYPE_F32, 3);
    attnd_e2e_io_fill(&io, &r, 1.0);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_step_begin(c, &s, 1, &st, NULL), ATTND_ERR_OK);
    attnd_ref out = io.rout, lse = io.rlse;
    out.offset = io.rk.offset + 128;
    expect_refused(c, attnd_client_attend(c, st.id, 0, &io.rq, &io.rk, &io.rv, &out, NULL),
                   ATTND_ERR_INVALID_ARGUMENT, "attend out on k_new", "out: bytes", "k_new");
    lse.offset = io.rout.offset + 64;
    expect_refused(c, attnd_client_attend(c, st.id, 0, &io.rq, &io.rk, &io.rv, &io.rout, &lse),
                   ATTND_ERR_INVALID_ARGUMENT, "attend out_lse on out", "out_lse: bytes",
                   "overlap out");
    /* refused before anything ran: layer 0 is still to do, and the step aborts cleanly */
    cr_assert_eq(attnd_client_attend(c, st.id, 0, &io.rq, &io.rk, &io.rv, &io.rout, &io.rlse),
                 ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_eq(attnd_client_step_end(c, st.id, 1), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_free(c, 1), ATTND_ERR_OK);
}

/* merge: [T=4, 4 heads, 32] f32 outputs and [4, 4] LSEs at the start of shm. */
static void overlap_merge(attnd_client *c, const attnd_shm *a, const attnd_shm *b)
{
    int64_t so[3] = {4, 4, 32}, sl[2] = {4, 4};
    size_t ob = 4 * 4 * 32 * 4, lb = 4 * 4 * 4;
    attnd_ref po, pl, xo, xl, out, olse;
    attnd_ref_shm(&po, a, 0, ATTND_DTYPE_F32, 3, so);
    attnd_ref_shm(&xo, a, ob, ATTND_DTYPE_F32, 3, so);
    attnd_ref_shm(&pl, a, 2 * ob, ATTND_DTYPE_F32, 2, sl);
    attnd_ref_shm(&xl, a, 2 * ob + lb, ATTND_DTYPE_F32, 2, sl);
    attnd_ref_shm(&out, b, 0, ATTND_DTYPE_F32, 3, so);
    attnd_ref_shm(&olse, b, ob, ATTND_DTYPE_F32, 2, sl);
    memset(a->base, 0, 2 * ob + 2 * lb);
    attnd_merge_args m = {&out, &olse, &po, &pl, &xo, &xl};
    cr_assert_eq(attnd_client_merge(c, &m), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    out.region = a->region;
    out.offset = ob / 2;
    expect_refused(c, attnd_client_merge(c, &m), ATTND_ERR_INVALID_ARGUMENT,
                   "merge out on prefix_out", "out: bytes", "prefix_out");
    out = (attnd_ref){0};
    attnd_ref_shm(&out, b, 0, ATTND_DTYPE_F32, 3, so);
    olse.offset = ob - 4;
    expect_refused(c, attnd_client_merge(c, &m), ATTND_ERR_INVALID_ARGUMENT, "merge out_lse on out",
                   "out_lse: bytes", "overlap out");
}

/* linear prefill ([1, 2, 4, 32] f32) and decode ([1, 2, 32] f32) of sequence 9. */
static void overlap_linear(attnd_client *c, const attnd_shm *shm)
{
    int64_t sp[4] = {1, 2, 4, 32}, sd[3] = {1, 2, 32};
    size_t pb = 1 * 2 * 4 * 32 * 4;
    uint64_t id = 9;
    float slopes[2] = {0.5f, 0.25f};
    attnd_ref q, k, v, out;
    memset(shm->base, 0, 4 * pb);
    attnd_ref_shm(&q, shm, 0, ATTND_DTYPE_F32, 4, sp);
    attnd_ref_shm(&k, shm, pb, ATTND_DTYPE_F32, 4, sp);
    attnd_ref_shm(&v, shm, 2 * pb, ATTND_DTYPE_F32, 4, sp);
    attnd_ref_shm(&out, shm, 3 * pb, ATTND_DTYPE_F32, 4, sp);
    attnd_linear_args a = {0, &id, 1, &q, &k, &v, &out, slopes, 2, 0};
    cr_assert_eq(attnd_client_seq_create(c, id, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_linear_prefill(c, &a), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    out.offset = 2 * pb + 256;
    expect_refused(c, attnd_client_linear_prefill(c, &a), ATTND_ERR_INVALID_ARGUMENT,
                   "linear prefill out on v", "out: bytes", "overlap v ");
    attnd_ref_shm(&q, shm, 0, ATTND_DTYPE_F32, 3, sd);
    attnd_ref_shm(&k, shm, pb, ATTND_DTYPE_F32, 3, sd);
    attnd_ref_shm(&v, shm, 2 * pb, ATTND_DTYPE_F32, 3, sd);
    attnd_ref_shm(&out, shm, 3 * pb, ATTND_DTYPE_F32, 3, sd);
    cr_assert_eq(attnd_client_linear_decode(c, &a), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    out.offset = 64;
    expect_refused(c, attnd_client_linear_decode(c, &a), ATTND_ERR_INVALID_ARGUMENT,
                   "linear decode out on q", "out: bytes", "overlap q ");
    cr_assert_eq(attnd_client_seq_free(c, id), ATTND_ERR_OK);
}

/* One object registered twice (two region ids, two mappings in the daemon): still the same
 * memory. */
static void overlap_aliased(attnd_client *c)
{
    char name[64];
    snprintf(name, sizeof name, "/attnd-data-trust-%ld", (long)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 65536), 0);
    attnd_shm a = {.region = 50,
                   .base = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
                   .size = 65536};
    close(fd);
    cr_assert_neq(a.base, MAP_FAILED);
    attnd_shm b = a;
    b.region = 51;
    cr_assert_eq(attnd_client_region_register_shm(c, 50, name, 65536), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_region_register_shm(c, 51, name, 65536), ATTND_ERR_OK);
    shm_unlink(name);
    int64_t so[3] = {4, 4, 32}, sl[2] = {4, 4};
    attnd_ref po, pl, xo, xl, out, olse;
    attnd_ref_shm(&po, &a, 0, ATTND_DTYPE_F32, 3, so);
    attnd_ref_shm(&xo, &a, 2048, ATTND_DTYPE_F32, 3, so);
    attnd_ref_shm(&pl, &a, 4096, ATTND_DTYPE_F32, 2, sl);
    attnd_ref_shm(&xl, &a, 4160, ATTND_DTYPE_F32, 2, sl);
    attnd_ref_shm(&out, &b, 1024, ATTND_DTYPE_F32, 3, so); /* region 51 over region 50's po */
    attnd_ref_shm(&olse, &b, 8192, ATTND_DTYPE_F32, 2, sl);
    attnd_merge_args m = {&out, &olse, &po, &pl, &xo, &xl};
    expect_refused(c, attnd_client_merge(c, &m), ATTND_ERR_INVALID_ARGUMENT,
                   "merge out in region 51 on prefix_out in region 50", "region 51",
                   "prefix_out (bytes 0..2048 of region 50)");
    out.offset = 12288;
    cr_assert_eq(attnd_client_merge(c, &m), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_eq(attnd_client_region_unregister(c, 50), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_region_unregister(c, 51), ATTND_ERR_OK);
    munmap(a.base, 65536);
}

Test(data_trust, outputs_overlapping_other_tensors_are_refused, .timeout = 120)
{
    attnd_daemon_proc d;
    attnd_status st;
    vl *x = calloc(1, sizeof *x);
    attnd_test_daemon_start(&d, CONFIG);
    attnd_client *c = connect_opts(&d, 1);
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    attnd_shm io, other;
    cr_assert_eq(attnd_client_shm_create(c, attnd_e2e_io_bytes(g, ATTND_DTYPE_F32, 8), &io),
                 ATTND_ERR_OK);
    cr_assert_eq(attnd_client_shm_create(c, 65536, &other), ATTND_ERR_OK);
    vl_init(x, c, 11);
    overlap_varlen(c, x);
    overlap_attend(c, &io, g);
    overlap_merge(c, &io, &other);
    overlap_linear(c, &io);
    overlap_aliased(c);
    /* the daemon served everything after each refusal */
    memset(at(x, VO), 0xff, VOUT * 4);
    cr_assert_eq(vl_blocksparse(c, x, &x->out), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_leq(vl_err(x, x->want_bs), 1e-5);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    cr_assert_eq(st.blocks_free, g->num_blocks);
    attnd_client_shm_destroy(c, &x->shm);
    attnd_client_shm_destroy(c, &io);
    attnd_client_shm_destroy(c, &other);
    attnd_client_free(c);
    free(x);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}

/* ---------------------------------------------------------------- item 3: values flipped */

/* The flipping client thread: over and over, one bad value (or a scribble over out) for a
 * moment, then the good value again. */
typedef struct flipper {
    vl *x;
    atomic_int stop;
    atomic_int scribble; /* also write garbage over out */
    int64_t shift_rows;  /* (cu[0], cu[1]) = (shift, shift + T): out rows far past the region */
    long flips;
    pthread_t thread;
} flipper;

static void spin(int n)
{
    for (volatile int i = 0; i < n; i++) {
    }
}

static void flip_once(flipper *f, int kind)
{
    vl *x = f->x;
    volatile int32_t *cq = at(x, VCQ), *ck = at(x, VCK), *cr = at(x, VCR), *cl = at(x, VCL);
    switch (kind) {
    case 0:
        cq[0] = -1000000;
        break;
    case 1:
        cq[0] = (int32_t)f->shift_rows, cq[1] = (int32_t)f->shift_rows + VT;
        break;
    case 2:
        ck[2] = -5;
        break;
    case 3:
        cl[3] = -7;
        break;
    case 4:
        cl[COLS + 1] = 1 << 20;
        break;
    case 5:
        cr[1] = -3;
        break;
    default:
        cr[ROWS + 1 + ROWS] = 1 << 24;
        break;
    }
    spin(200 + kind * 50);
    vl_write_indices(x);
    if (atomic_load(&f->scribble)) memset(at(x, VO), kind * 17, VOUT * 4);
    spin(100);
}

static void *flip_loop(void *arg)
{
    flipper *f = arg;
    for (int kind = 0; !atomic_load(&f->stop); kind = (kind + 1) % 7, f->flips++)
        flip_once(f, kind);
    vl_write_indices(f->x);
    return NULL;
}

typedef struct race_counts {
    long ok, refused, checked;
    double worst;
    char failure[640]; /* the first broken promise, "" if none */
} race_counts;

/* Requests for ms milliseconds while f flips: OK or INVALID_ARGUMENT only; OK outputs right
 * unless out is being scribbled on. Stops at the first failure (asserted once f stopped). */
static void race(attnd_client *c, flipper *f, int64_t ms, race_counts *n)
{
    vl *x = f->x;
    int64_t end = now_ms() + ms;
    for (long i = 0; now_ms() < end && !n->failure[0]; i++) {
        int bs = i % 2;
        const char *what = bs ? "blocksparse" : "varlen";
        attnd_err rv = bs ? vl_blocksparse(c, x, &x->out) : vl_varlen(c, x, &x->out);
        if (rv != ATTND_ERR_OK && rv != ATTND_ERR_INVALID_ARGUMENT)
            snprintf(n->failure, sizeof n->failure, "request %ld (%s) under flipping: %s: %s", i,
                     what, attnd_err_name(rv), attnd_client_last_error(c));
        if (rv != ATTND_ERR_OK) {
            n->refused++;
            continue;
        }
        n->ok++;
        if (atomic_load(&f->scribble)) continue;
        double e = vl_err(x, bs ? x->want_bs : x->want_varlen);
        n->checked++;
        n->worst = fmax(n->worst, e);
        if (!(e <= 1e-5))
            snprintf(n->failure, sizeof n->failure,
                     "request %ld (%s) answered OK with a wrong output (err %.3g)", i, what, e);
    }
}

static long race_ms(void)
{
    const char *s = getenv("ATTND_RACE_MS");
    return s ? atol(s) : 1500;
}

Test(data_trust, index_values_flipped_during_requests, .timeout = 180)
{
    attnd_daemon_proc d;
    attnd_status st;
    vl *x = calloc(1, sizeof *x);
    race_counts n = {0};
    attnd_test_daemon_start(&d, CONFIG);
    /* another session's region, mapped by the daemon before the racer's (so that it lies just
     * above it in the daemon's address space), filled with a pattern nobody may change */
    attnd_client *victim = connect_opts(&d, 0);
    attnd_shm vs;
    cr_assert_eq(attnd_client_shm_create(victim, 4 << 20, &vs), ATTND_ERR_OK);
    memset(vs.base, 0x5a, vs.size);
    attnd_client *c = connect_opts(&d, 0);
    vl_init(x, c, 12);
    flipper f = {.x = x, .shift_rows = (int64_t)(x->shm.size / (VH * VD * 4)) + 64};
    cr_assert_eq(pthread_create(&f.thread, NULL, flip_loop, &f), 0);
    long ms = race_ms();
    race(c, &f, ms, &n);
    atomic_store(&f.scribble, 1);
    race(c, &f, ms / 2, &n);
    atomic_store(&f.stop, 1);
    pthread_join(f.thread, NULL);
    fprintf(stderr, "data_trust: %ld flips; %ld OK (%ld checked, worst %.2g), %ld refused\n",
            f.flips, n.ok, n.checked, n.worst, n.refused);
    cr_assert_eq(n.failure[0], '\0', "%s", n.failure);
    cr_assert_gt(n.refused, 0, "the flips never showed: the race ran nothing");
    /* still serving, still right, and the other session's memory untouched */
    memset(at(x, VO), 0xff, VOUT * 4);
    cr_assert_eq(vl_varlen(c, x, &x->out), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_leq(vl_err(x, x->want_varlen), 1e-5);
    size_t changed = 0;
    while (changed < vs.size && ((uint8_t *)vs.base)[changed] == 0x5a)
        changed++;
    cr_assert_eq(changed, vs.size, "the other session's region changed at byte %zu", changed);
    cr_assert_eq(attnd_client_status(victim, &st), ATTND_ERR_OK);
    attnd_client_shm_destroy(c, &x->shm);
    attnd_client_shm_destroy(victim, &vs);
    attnd_client_free(c);
    attnd_client_free(victim);
    free(x);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}

/* ---------------------------------------------------------------- item 14: whole steps */

/* Attend one layer of the open step with fresh q/k/v in shm, on both sides. */
static attnd_err attend_both(attnd_client *c, attnd_mirror *m, const attnd_shm *shm, uint64_t step,
                             uint32_t layer, attnd_rng *r)
{
    attnd_e2e_io io;
    attnd_e2e_io_layout(&io, &m->g, shm, ATTND_DTYPE_F32, m->num_tokens);
    attnd_e2e_io_fill(&io, r, 1.0);
    attnd_err rv = attnd_client_attend(c, step, layer, &io.rq, &io.rk, &io.rv, &io.rout, &io.rlse);
    if (rv != ATTND_ERR_OK) return rv;
    int64_t so[3] = {m->num_tokens, m->g.num_q_heads, m->g.head_size};
    attnd_test_tensor direct;
    float *lse = malloc((size_t)(m->num_tokens * m->g.num_q_heads) * sizeof *lse + 4);
    attnd_tt_alloc(&direct, ATTND_DTYPE_F32, 3, so);
    cr_assert_eq(attnd_mirror_attend(m, layer, &io.q, &io.k, &io.v, &direct.t, lse, NULL, NULL),
                 ATTND_ERR_OK);
    cr_assert_leq(attnd_e2e_rel_l2_t(&io.out, &direct.t), attnd_e2e_direct_tol(ATTND_DTYPE_F32),
                  "layer %u out", layer);
    attnd_tt_free(&direct);
    free(lse);
    return ATTND_ERR_OK;
}

static void whole_steps(const attnd_daemon_proc *d, int channel)
{
    attnd_client *c = connect_opts(d, channel);
    attnd_mirror m;
    attnd_shm shm;
    attnd_rng r;
    attnd_e2e_errs errs = {0};
    attnd_seq_info info;
    attnd_step st;
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    attnd_step_seq s = {1, 5}, one = {1, 1};
    cr_assert_eq(g->num_layers, 8);
    cr_assert_eq(attnd_mirror_init(&m, g, NULL, 64), 0);
    cr_assert_eq(attnd_client_shm_create(c, attnd_e2e_io_bytes(g, ATTND_DTYPE_F32, 8), &shm),
                 ATTND_ERR_OK);
    attnd_rng_seed(&r, 14);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_create(&m, 1), 0);
    /* layers 0, 1, 6 only: no commit, the step stays open */
    cr_assert_eq(attnd_client_step_begin(c, &s, 1, &st, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_begin(&m, &s, 1), 0);
    static const uint32_t some[3] = {0, 1, 6};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(attend_both(c, &m, &shm, st.id, some[i], &r), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(c));
    expect_refused(c, attnd_client_step_end(c, st.id, 0), ATTND_ERR_FAILED_PRECONDITION,
                   "end with layers 2-5, 7 missing", "layers 2-5, 7 not attended", NULL);
    cr_assert_eq(attnd_client_seq_query(c, 1, &info), ATTND_ERR_OK);
    cr_assert_eq(info.step, st.id, "the refused commit closed the step");
    cr_assert_eq(info.num_tokens, 0);
    /* the missing layers, out of order; then the commit goes through */
    static const uint32_t rest[5] = {7, 3, 2, 5, 4};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(attend_both(c, &m, &shm, st.id, rest[i], &r), ATTND_ERR_OK, "%s",
                     attnd_client_last_error(c));
    cr_assert_eq(attnd_client_step_end(c, st.id, 0), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    attnd_mirror_end(&m, 1);
    cr_assert_eq(attnd_client_seq_query(c, 1, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 5);
    /* a layer attended twice: refused on the spot, and then the step can only abort */
    cr_assert_eq(attnd_client_step_begin(c, &one, 1, &st, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_mirror_begin(&m, &one, 1), 0);
    for (uint32_t l = 0; l < g->num_layers; l++)
        cr_assert_eq(attend_both(c, &m, &shm, st.id, l, &r), ATTND_ERR_OK);
    expect_refused(c, attend_both(c, &m, &shm, st.id, 3, &r), ATTND_ERR_FAILED_PRECONDITION,
                   "attend layer 3 again", "layer: 3 already attended", NULL);
    expect_refused(c, attnd_client_step_end(c, st.id, 0), ATTND_ERR_FAILED_PRECONDITION,
                   "end after a repeated layer", "layer 3 attended more than once", NULL);
    cr_assert_eq(attnd_client_step_end(c, st.id, 1), ATTND_ERR_OK, "abort is always accepted");
    attnd_mirror_end(&m, 0);
    /* the cache holds exactly what the mirror says: one more step, every layer checked */
    cr_assert_eq(attnd_e2e_step(c, &m, &shm, ATTND_DTYPE_F32, 0, &one, 1, 0, &r, &errs),
                 ATTND_ERR_OK);
    attnd_test_expect_errs(&errs, ATTND_DTYPE_F32, channel ? "channel" : "socket");
    cr_assert_eq(attnd_client_seq_query(c, 1, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 6);
    cr_assert_eq(attnd_client_seq_free(c, 1), ATTND_ERR_OK);
    attnd_client_shm_destroy(c, &shm);
    attnd_mirror_fini(&m);
    attnd_client_free(c);
}

Test(data_trust, end_step_commits_only_every_layer_once, .timeout = 120)
{
    attnd_daemon_proc d;
    attnd_test_daemon_start(&d, CONFIG);
    whole_steps(&d, 0);
    whole_steps(&d, 1);
    cr_assert_eq(attnd_daemon_stop(&d), 0, "daemon exit status");
}
