/* Index tensors in device memory (issue 13 items 1 to 3 on the GPU). A worker cudaMallocs
 * q | k | v | out | cu_seqlens_q | cu_seqlens_k | layout_crow | layout_col in one buffer,
 * exports it and registers it as a CUDA_IPC region, so the daemon's host never holds the index
 * values: it must copy them to the host before checking them, never dereference them there.
 *   - varlen and block-sparse over it: OK, outputs matching the cpu backend on the same inputs;
 *   - a bad cu_seqlens_q[0] and a layout_col entry out of range, written with cudaMemcpy:
 *     INVALID_ARGUMENT naming them; out over cu_seqlens_q in the same region: refused;
 *   - a thread flipping cu_seqlens and layout values (and later scribbling on out) with
 *     cudaMemcpy while requests run: every reply OK or INVALID_ARGUMENT, every OK output right
 *     (while out is left alone), another session's CUDA_IPC region untouched, and the daemon
 *     answers correctly afterwards. */
#include "e2e_indices.h"

#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnd/client.h"
#include "attnd/kernels.h"
#include "testutil.h"

#define IH 8  /* q heads */
#define IK 2  /* kv heads */
#define ID 64 /* head size */
#define NS 3  /* sequences of 20, 40 and 8 tokens (q_len == k_len) */
#define IT 68 /* rows */
#define IMAX 40
#define IB 16 /* block-sparse key and query block */
#define IR 3  /* layout rows */
#define IC 6  /* lower-triangular layout: 1 + 2 + 3 blocks */
#define NQ ((size_t)IT * IH * ID)
#define NKV ((size_t)IT * IK * ID)
#define VICTIM_BYTES ((size_t)8 << 20)

enum { TQ, TK, TV, TO, TCQ, TCK, TCR, TCL, NT };

typedef struct ix {
    attnd_e2e_check_fn check;
    void *arg;
    attnd_client *c, *victim;
    char *dbuf, *dvictim;
    size_t bytes;
    uint64_t off[NT];
    uint32_t region;
    attnd_ref ref[NT];
    uint16_t hq[NQ], hk[NKV], hv[NKV];
    int32_t cu[NS + 1], crow[IH][IR + 1], col[IH][IC];
    float want_varlen[NQ], want_bs[NQ], got[NQ];
} ix;

static int cu_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 1;
    printf("      %s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

/* A cudaMemcpy from pageable memory may return before its DMA lands: synchronize, so that the
 * daemon's next read sees the value. */
static void put(const ix *x, int t, const void *src, size_t n)
{
    cu_ok(cudaMemcpy(x->dbuf + x->off[t], src, n, cudaMemcpyHostToDevice), "cudaMemcpy");
    cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/* One i32 at byte off of the buffer. */
static void put_at(const ix *x, uint64_t off, const int32_t *v)
{
    cu_ok(cudaMemcpy(x->dbuf + off, v, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void put_indices(const ix *x)
{
    put(x, TCQ, x->cu, sizeof x->cu);
    put(x, TCK, x->cu, sizeof x->cu);
    put(x, TCR, x->crow, sizeof x->crow);
    put(x, TCL, x->col, sizeof x->col);
}

static attnd_tensor tensor(void *p, attnd_dtype dt, int32_t nd, int64_t a, int64_t b, int64_t c)
{
    attnd_tensor t;
    int64_t shape[3] = {a, b, c};
    attnd_tensor_init(&t, p, dt, nd, shape);
    return t;
}

/* What the cpu backend gives on the same inputs. */
static int expect(ix *x, attnd_backend *cpu)
{
    attnd_tensor q = tensor(x->hq, ATTND_DTYPE_BF16, 3, IT, IH, ID);
    attnd_tensor k = tensor(x->hk, ATTND_DTYPE_BF16, 3, IT, IK, ID);
    attnd_tensor v = tensor(x->hv, ATTND_DTYPE_BF16, 3, IT, IK, ID);
    attnd_tensor cu = tensor(x->cu, ATTND_DTYPE_I32, 1, NS + 1, 0, 0);
    attnd_varlen_params p = {.q = q, .k = k, .v = v, .cu_seqlens_q = cu, .cu_seqlens_k = cu};
    p.out = tensor(x->want_varlen, ATTND_DTYPE_F32, 3, IT, IH, ID);
    p.max_seqlen_q = p.max_seqlen_k = IMAX;
    p.causal = 1;
    p.scale = 1.0f / sqrtf((float)ID);
    p.q_scale = p.k_scale = p.v_scale = p.p_scale = p.out_scale = 1.0f;
    attnd_blocksparse_params b = {.q = q, .k = k, .v = v, .cu_seqlens_q = cu, .cu_seqlens_k = cu};
    b.out = tensor(x->want_bs, ATTND_DTYPE_F32, 3, IT, IH, ID);
    b.layout_crow = tensor(x->crow, ATTND_DTYPE_I32, 2, IH, IR + 1, 0);
    b.layout_col = tensor(x->col, ATTND_DTYPE_I32, 2, IH, IC, 0);
    b.block_size = b.q_block_size = IB;
    b.max_seqlen_q = b.max_seqlen_k = IMAX;
    b.scale = p.scale;
    return attnd_varlen_attention(cpu, &p) == ATTND_ERR_OK &&
           attnd_blocksparse_attention(cpu, &b) == ATTND_ERR_OK;
}

static void fill_host(ix *x)
{
    static const int32_t lens[NS] = {20, 40, 8};
    attnd_rng r;
    attnd_rng_seed(&r, 1313);
    for (size_t i = 0; i < NQ; i++)
        x->hq[i] = attnd_f32_to_bf16((float)attnd_rng_normal(&r));
    for (size_t i = 0; i < NKV; i++) {
        x->hk[i] = attnd_f32_to_bf16((float)attnd_rng_normal(&r));
        x->hv[i] = attnd_f32_to_bf16((float)attnd_rng_normal(&r));
    }
    for (int s = 0; s < NS; s++)
        x->cu[s + 1] = x->cu[s] + lens[s];
    for (int h = 0; h < IH; h++) {
        int k = 0;
        for (int row = 0; row < IR; row++) {
            x->crow[h][row] = k;
            for (int b = 0; b <= row; b++)
                x->col[h][k++] = b;
        }
        x->crow[h][IR] = k;
    }
}

/* The buffer, its layout and references (region x->region), its contents. */
static int lay_out(ix *x)
{
    static const int64_t sq[3] = {IT, IH, ID}, sk[3] = {IT, IK, ID}, scu[1] = {NS + 1};
    static const int64_t scr[2] = {IH, IR + 1}, scl[2] = {IH, IC};
    const int64_t *shapes[NT] = {sq, sk, sk, sq, scu, scu, scr, scl};
    const int32_t nd[NT] = {3, 3, 3, 3, 1, 1, 2, 2};
    const attnd_dtype dt[NT] = {ATTND_DTYPE_BF16, ATTND_DTYPE_BF16, ATTND_DTYPE_BF16,
                                ATTND_DTYPE_F32,  ATTND_DTYPE_I32,  ATTND_DTYPE_I32,
                                ATTND_DTYPE_I32,  ATTND_DTYPE_I32};
    uint64_t off = 0;
    for (int i = 0; i < NT; i++) {
        x->off[i] = off;
        attnd_ref_region(&x->ref[i], x->region, off, dt[i], nd[i], shapes[i]);
        off += (attnd_ref_nbytes(dt[i], nd[i], shapes[i]) + 255) / 256 * 256;
    }
    x->bytes = off + ((size_t)1 << 20); /* room past the layout for misplaced outputs */
    if (!cu_ok(cudaMalloc((void **)&x->dbuf, x->bytes), "cudaMalloc")) return -1;
    put(x, TQ, x->hq, sizeof x->hq);
    put(x, TK, x->hk, sizeof x->hk);
    put(x, TV, x->hv, sizeof x->hv);
    put_indices(x);
    return 0;
}

/* Another session with a CUDA_IPC region of its own, filled with 0x5a (registered first). */
static int victim_open(ix *x, const attnd_daemon_proc *d)
{
    cudaIpcMemHandle_t h;
    if ((x->victim = attnd_daemon_connect(d, 60000)) == NULL) return -1;
    if (!cu_ok(cudaMalloc((void **)&x->dvictim, VICTIM_BYTES), "cudaMalloc") ||
        !cu_ok(cudaMemset(x->dvictim, 0x5a, VICTIM_BYTES), "cudaMemset") ||
        !cu_ok(cudaIpcGetMemHandle(&h, x->dvictim), "cudaIpcGetMemHandle"))
        return -1;
    return attnd_client_region_register_cuda(x->victim, attnd_client_region_next_id(x->victim), &h,
                                             VICTIM_BYTES, 0) == ATTND_ERR_OK
               ? 0
               : -1;
}

static int victim_intact(const ix *x)
{
    uint8_t *h = malloc(VICTIM_BYTES);
    int ok = h != NULL &&
             cu_ok(cudaMemcpy(h, x->dvictim, VICTIM_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; ok && i < VICTIM_BYTES; i++)
        if (h[i] != 0x5a) {
            printf("      the other session's region changed at byte %zu\n", i);
            ok = 0;
        }
    free(h);
    return ok;
}

static attnd_err run_varlen(ix *x, const attnd_ref *out)
{
    attnd_ref o = *out;
    attnd_varlen_args a = {.q = &x->ref[TQ], .k = &x->ref[TK], .v = &x->ref[TV], .out = &o};
    a.cu_seqlens_q = &x->ref[TCQ];
    a.cu_seqlens_k = &x->ref[TCK];
    a.causal = 1;
    return attnd_client_varlen(x->c, &a);
}

static attnd_err run_bs(ix *x)
{
    attnd_ref o = x->ref[TO];
    attnd_blocksparse_args a = {.q = &x->ref[TQ], .k = &x->ref[TK], .v = &x->ref[TV], .out = &o};
    a.cu_seqlens_q = &x->ref[TCQ];
    a.cu_seqlens_k = &x->ref[TCK];
    a.layout_crow = &x->ref[TCR];
    a.layout_col = &x->ref[TCL];
    a.block_size = a.q_block_size = IB;
    return attnd_client_blocksparse(x->c, &a);
}

/* Relative L2 error of the daemon's out (in device memory) against want. */
static double out_err(ix *x, const float *want)
{
    double *a = malloc(NQ * sizeof *a), *b = malloc(NQ * sizeof *b), e = INFINITY;
    if (a && b &&
        cu_ok(cudaMemcpy(x->got, x->dbuf + x->off[TO], sizeof x->got, cudaMemcpyDeviceToHost),
              "cudaMemcpy")) {
        for (size_t i = 0; i < NQ; i++)
            a[i] = x->got[i], b[i] = want[i];
        e = attnd_rel_l2(a, b, (int64_t)NQ);
    }
    free(a);
    free(b);
    return e;
}

static void report(ix *x, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(ix *x, int ok, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    x->check(x->arg, ok, what);
}

static double tol(void)
{
    return attnd_tol_for(ATTND_DTYPE_BF16);
}

/* Item 1: the daemon copies device-resident indices to its host, checks them there. */
static void check_reads(ix *x)
{
    attnd_err rv = run_varlen(x, &x->ref[TO]);
    double e = rv == ATTND_ERR_OK ? out_err(x, x->want_varlen) : INFINITY;
    report(x, rv == ATTND_ERR_OK && e <= tol(),
           "varlen, cu_seqlens in CUDA_IPC memory: %s, out vs cpu %.2e", attnd_err_name(rv), e);
    rv = run_bs(x);
    e = rv == ATTND_ERR_OK ? out_err(x, x->want_bs) : INFINITY;
    report(x, rv == ATTND_ERR_OK && e <= tol(),
           "block-sparse, cu_seqlens and layout in CUDA_IPC memory: %s, out vs cpu %.2e",
           attnd_err_name(rv), e);
    int32_t bad = 3;
    put(x, TCQ, &bad, sizeof bad);
    rv = run_varlen(x, &x->ref[TO]);
    report(x,
           rv == ATTND_ERR_INVALID_ARGUMENT &&
               strstr(attnd_client_last_error(x->c), "cu_seqlens_q[0]: 3"),
           "cu_seqlens_q[0] = 3 in device memory: %s (%s)", attnd_err_name(rv),
           attnd_client_last_error(x->c));
    put_indices(x);
    bad = 1 << 20;
    put(x, TCL, &bad, sizeof bad);
    rv = run_bs(x);
    report(x,
           rv == ATTND_ERR_INVALID_ARGUMENT &&
               strstr(attnd_client_last_error(x->c), "layout_col[0][0]"),
           "layout_col[0][0] out of range in device memory: %s (%s)", attnd_err_name(rv),
           attnd_client_last_error(x->c));
    put_indices(x);
    attnd_ref out = x->ref[TO];
    out.offset = x->off[TCQ] - 256;
    rv = run_varlen(x, &out);
    report(x,
           rv == ATTND_ERR_INVALID_ARGUMENT &&
               strstr(attnd_client_last_error(x->c), "cu_seqlens_q"),
           "out over cu_seqlens_q in one CUDA_IPC region: %s (%s)", attnd_err_name(rv),
           attnd_client_last_error(x->c));
}

/* Item 3: a thread writing bad index values (and, later, garbage over out) with cudaMemcpy. */
typedef struct flip {
    ix *x;
    atomic_int stop, scribble;
    long flips;
} flip;

static void *flip_loop(void *arg)
{
    flip *f = arg;
    ix *x = f->x;
    int32_t shift[2] = {(int32_t)(x->bytes / (IH * ID * 4)) + 64, 0};
    shift[1] = shift[0] + IT;
    const int32_t neg = -1000000, far = 1 << 20;
    for (int k = 0; !atomic_load(&f->stop); k = (k + 1) % 5, f->flips++) {
        switch (k) {
        case 0:
            put(x, TCQ, &neg, 4);
            break;
        case 1:
            put(x, TCQ, shift, 8);
            break;
        case 2:
            put_at(x, x->off[TCL] + 12, &neg);
            break;
        case 3:
            put_at(x, x->off[TCL] + 4 * IC, &far);
            break;
        default:
            put_at(x, x->off[TCR] + 4, &neg);
            break;
        }
        put_indices(x);
        if (atomic_load(&f->scribble)) cudaMemset(x->dbuf + x->off[TO], k * 17, NQ * 4);
    }
    put_indices(x);
    return NULL;
}

typedef struct tally {
    long ok, refused, checked;
    double worst;
    char failure[256];
} tally;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void race(ix *x, flip *f, int64_t ms, tally *t)
{
    int64_t end = now_ms() + ms;
    for (long i = 0; now_ms() < end && !t->failure[0]; i++) {
        int bs = i % 2;
        attnd_err rv = bs ? run_bs(x) : run_varlen(x, &x->ref[TO]);
        if (rv != ATTND_ERR_OK && rv != ATTND_ERR_INVALID_ARGUMENT)
            snprintf(t->failure, sizeof t->failure, "request %ld: %s: %s", i, attnd_err_name(rv),
                     attnd_client_last_error(x->c));
        if (rv != ATTND_ERR_OK) {
            t->refused++;
            continue;
        }
        t->ok++;
        if (atomic_load(&f->scribble)) continue;
        double e = out_err(x, bs ? x->want_bs : x->want_varlen);
        t->checked++;
        t->worst = fmax(t->worst, e);
        if (!(e <= tol()))
            snprintf(t->failure, sizeof t->failure, "request %ld (%s) OK with a wrong out (%.3g)",
                     i, bs ? "block-sparse" : "varlen", e);
    }
}

static void check_race(ix *x)
{
    flip f = {.x = x};
    tally t = {0};
    pthread_t th;
    if (pthread_create(&th, NULL, flip_loop, &f) != 0) {
        report(x, 0, "flipping thread");
        return;
    }
    race(x, &f, 1500, &t);
    atomic_store(&f.scribble, 1);
    race(x, &f, 700, &t);
    atomic_store(&f.stop, 1);
    pthread_join(th, NULL);
    report(x, t.failure[0] == 0 && t.refused > 0,
           "index values flipped by cudaMemcpy during requests (%ld flips): %ld OK (%ld checked, "
           "worst %.2e), %ld refused%s%s",
           f.flips, t.ok, t.checked, t.worst, t.refused, t.failure[0] ? ": " : "", t.failure);
    report(x, victim_intact(x), "another session's CUDA_IPC region untouched by the race");
    attnd_err rv = run_varlen(x, &x->ref[TO]);
    double e = rv == ATTND_ERR_OK ? out_err(x, x->want_varlen) : INFINITY;
    report(x, rv == ATTND_ERR_OK && e <= tol(), "after the race: varlen %s, out vs cpu %.2e",
           attnd_err_name(rv), e);
}

void attnd_e2e_device_indices(const attnd_daemon_proc *d, attnd_backend *cpu,
                              attnd_e2e_check_fn check, void *arg)
{
    ix *x = calloc(1, sizeof *x);
    cudaIpcMemHandle_t h;
    if (x == NULL) {
        check(arg, 0, "device indices: out of memory");
        return;
    }
    x->check = check;
    x->arg = arg;
    fill_host(x);
    int ok =
        expect(x, cpu) && victim_open(x, d) == 0 && (x->c = attnd_daemon_connect(d, 60000)) != NULL;
    if (ok) x->region = attnd_client_region_next_id(x->c);
    ok = ok && lay_out(x) == 0 && cu_ok(cudaIpcGetMemHandle(&h, x->dbuf), "cudaIpcGetMemHandle") &&
         attnd_client_region_register_cuda(x->c, x->region, &h, x->bytes, 0) == ATTND_ERR_OK;
    report(x, ok, "device indices: a second worker's CUDA_IPC region with the index tensors");
    if (ok) {
        check_reads(x);
        check_race(x);
    }
    attnd_client_free(x->c);
    attnd_client_free(x->victim);
    cudaFree(x->dbuf);
    cudaFree(x->dvictim);
    free(x);
}
