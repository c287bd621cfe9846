// varlen and block-sparse prefill on the sm90 core. The packed ops become the core's kernel
// arguments: q, out and cu_seqlens_q as the paged op's q, out and query_start_loc; K/V as a
// "cache" [rows][page][kv heads][head] whose pages start at any row (the tensor maps'
// coordinates are rows; the V tail reads row pid + r); the lengths from cu_seqlens_k
// (paged/src_sm90.h). Block-sparse tiles are one q head each (group 1), the kv head from
// src.kv_group.
#include <string.h>

#include "ops_util.h"
#include "paged/launch.h"
#include "varlen_sm90.h"

// Packed K or V [rows, kv heads, head]: dims (head, kv head, row, 1), boxes of one page of rows
// (run maps: of a whole K/V tile's), rows past the tensor read as zeros.
static int encode_packed(const attnd_cuda *c, const attnd_tensor *t, int page, CUtensorMap *m)
{
    if (t->shape[0] <= 0) return 0;
    const cuuint64_t es = (cuuint64_t)attnd_dtype_size(t->dtype);
    const cuuint64_t dims[4] = {(cuuint64_t)t->shape[2], (cuuint64_t)t->shape[1],
                                (cuuint64_t)t->shape[0], 1};
    const cuuint64_t strides[3] = {(cuuint64_t)t->strides[1] * es, (cuuint64_t)t->strides[0] * es,
                                   (cuuint64_t)t->strides[0] * es * (cuuint64_t)t->shape[0]};
    return attnd_sm90_encode_map(c, t, dims, strides, (cuuint32_t)page, 1, m);
}

// A packed tensor [rows, heads, head] as the core's [rows][page][heads][head] cache: page i
// starts at row pid (strides[0] == strides[1], one row).
static attnd_tensor as_cache(const attnd_tensor *t, int64_t heads, int page)
{
    attnd_tensor c = *t;
    c.ndim = 4;
    c.shape[0] = t->shape[0];
    c.shape[1] = page;
    c.shape[2] = heads;
    c.shape[3] = t->shape[2];
    c.strides[0] = c.strides[1] = t->strides[0];
    c.strides[2] = t->strides[1];
    c.strides[3] = 1;
    return c;
}

static int aligned_to(const void *ptr, int64_t bytes)
{
    return ((uintptr_t)ptr % (uintptr_t)bytes) == 0;
}

// The kernel arguments of a packed op (no window, softcap, ALiBi, sinks or LSE); heads: the
// tile heads (kv heads, or q heads for block-sparse), page: rows per TMA box (2^page_log2).
static void packed_kargs(const attnd_tensor *q, const attnd_tensor *k, const attnd_tensor *v,
                         const attnd_tensor *out, const attnd_tensor *cu_q, int64_t heads,
                         int page_log2, float scale, attnd_paged_kargs *a)
{
    memset(a, 0, sizeof *a);
    a->p.q = *q;
    a->p.out = *out;
    a->p.query_start_loc = *cu_q;
    a->p.seq_lens.shape[0] = cu_q->shape[0] - 1;
    a->p.k_cache = as_cache(k, heads, 1 << page_log2);
    a->p.v_cache = as_cache(v, heads, 1 << page_log2);
    const int64_t qe = (int64_t)attnd_dtype_size(q->dtype), ob = 4 * attnd_dtype_size(out->dtype);
    a->q_vec =
        aligned_to(q->data, 16) && (q->strides[0] * qe) % 16 == 0 && (q->strides[1] * qe) % 16 == 0;
    a->out_vec = aligned_to(out->data, ob) && out->strides[0] % 4 == 0 && out->strides[1] % 4 == 0;
    a->nblocks32 = (int32_t)(k->shape[0] < INT32_MAX ? k->shape[0] : INT32_MAX);
    a->qk_scale = scale;
    a->qk_scale_log2 = scale * 1.4426950408889634f;
    a->out_scale = 1.0f;
    a->plain = scale > 0.0f;
    a->group = (int32_t)(q->shape[1] / heads);
    a->bs_log2 = page_log2;
    a->num_segments = 1;
}

// The core can run here: sm_90 device, sm_90a code built, 16-bit inputs (fp8 where fp8_ok),
// not forced to sm80, row counts the kernels address in 32 bits.
static int sm90_ok(const attnd_cuda *c, const attnd_tensor *q, const attnd_tensor *k, int fp8_ok)
{
#ifdef ATTND_CUDA_SM90A
    return c->cc == 90 && c->paged_core != 80 && c->encode_tmap != NULL &&
           (q->dtype == ATTND_DTYPE_F16 || q->dtype == ATTND_DTYPE_BF16 ||
            (fp8_ok && q->dtype == ATTND_DTYPE_FP8_E4M3)) &&
           k->shape[0] < INT32_MAX && q->shape[0] < INT32_MAX;
#else
    (void)c, (void)q, (void)k, (void)fp8_ok;
    return 0;
#endif
}

// [varlen / sparse][head 64 / 128 / 256][f16 / bf16 / fp8 (varlen)]
static const attnd_paged_fn kCore[2][3][3] = {
    {ATTND_PAGED_ROW(ATTND_CORE_SM90_VARLEN, 64), ATTND_PAGED_ROW(ATTND_CORE_SM90_VARLEN, 128),
     ATTND_PAGED_ROW(ATTND_CORE_SM90_VARLEN, 256)},
    {ATTND_PAGED_ROW16(ATTND_CORE_SM90_SPARSE, 64), ATTND_PAGED_ROW16(ATTND_CORE_SM90_SPARSE, 128),
     ATTND_PAGED_ROW16(ATTND_CORE_SM90_SPARSE, 256)},
};

// Encode the maps and launch the core (sparse or not) on the backend's stream (a: its kargs.q_tma
// set here).
static attnd_err packed_launch(attnd_backend *b, int sparse, const attnd_tensor *k,
                               const attnd_tensor *v, attnd_paged_kargs a,
                               const attnd_sm90_src &src, int max_q, int max_k, int *ran)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_sm90_maps m;
    memset(&m, 0, sizeof m);
    const int page = 1 << a.bs_log2, tile = attnd_sm90_block_n(attnd_paged_d_pad(k->shape[2]));
    const int run = tile > page ? tile : page;
    *ran = 0;
    if (!encode_packed(c, k, page, &m.k) || !encode_packed(c, v, page, &m.v) ||
        !encode_packed(c, k, run, &m.k_run) || !encode_packed(c, v, run, &m.v_run))
        return ATTND_ERR_OK; // not expressible as tensor maps: the mma.sync kernel
    attnd_paged_launch l;
    attnd_paged_launch_init(&l, c, a.p.q.shape[0], max_q, max_k);
    l.maps = &m;
    l.src = &src;
    const int kv = a.p.q.dtype == ATTND_DTYPE_FP8_E4M3 ? 2 : a.p.q.dtype == ATTND_DTYPE_BF16;
    a.q_tma = !sparse && attnd_sm90_q_map(c, &a, kv, &m);
    const attnd_paged_fn f = kCore[sparse][attnd_paged_d_row(a.p.q.shape[2])][kv];
    if (f == NULL) return ATTND_ERR_OK;
    cudaError_t e = f(a, l);
    if (e == cudaErrorInvalidConfiguration) {
        cudaGetLastError();
        return ATTND_ERR_OK; // over this core's limits: the mma.sync kernel
    }
    *ran = 1;
    return attnd_cuda_check(b, e, sparse ? "blocksparse (sm90 core)" : "varlen (sm90 core)");
}

attnd_err attnd_varlen_sm90(attnd_backend *b, const attnd_varlen_params *p, int *ran)
{
    *ran = 0;
    if (!sm90_ok(attnd_cuda_of(b), &p->q, &p->k, 1) || p->bias.data != NULL) return ATTND_ERR_OK;
    const int fp8_in = p->q.dtype == ATTND_DTYPE_FP8_E4M3;
    attnd_paged_kargs a;
    packed_kargs(&p->q, &p->k, &p->v, &p->out, &p->cu_seqlens_q, p->k.shape[1], 6,
                 fp8_in ? p->scale * p->q_scale * p->k_scale : p->scale, &a);
    // fp8 inputs (the seed's semantics, kernels/cpu/varlen.c): P V of fp8(p / p_scale) and V's
    // codes, times p_scale * v_scale
    if (fp8_in) {
        a.p_descale = 1.0f / p->p_scale;
        a.out_scale = p->p_scale * p->v_scale;
    }
    if (p->out.dtype == ATTND_DTYPE_FP8_E4M3) a.out_scale /= p->out_scale;
    attnd_sm90_src src;
    memset(&src, 0, sizeof src);
    src.cu_k = (const int32_t *)p->cu_seqlens_k.data;
    src.cu_k_st = p->cu_seqlens_k.strides[0];
    src.causal = p->causal != 0;
    return packed_launch(b, 0, &p->k, &p->v, a, src, p->max_seqlen_q, p->max_seqlen_k, ran);
}

static int ilog2i(int v)
{
    int l = 0;
    while ((1 << (l + 1)) <= v)
        l++;
    return l;
}

attnd_err attnd_blocksparse_sm90(attnd_backend *b, const attnd_blocksparse_params *p, int *ran)
{
    *ran = 0;
    const int qbs = p->q_block_size > 0 ? p->q_block_size : p->block_size;
    const int64_t kblocks = ((int64_t)p->max_seqlen_k + p->block_size - 1) / p->block_size;
    if (!sm90_ok(attnd_cuda_of(b), &p->q, &p->k, 0) || kblocks > 2048) return ATTND_ERR_OK;
    const int page = p->block_size < 64 ? p->block_size : 64;
    attnd_paged_kargs a;
    packed_kargs(&p->q, &p->k, &p->v, &p->out, &p->cu_seqlens_q, p->q.shape[1], ilog2i(page),
                 p->scale, &a);
    attnd_sm90_src src;
    memset(&src, 0, sizeof src);
    src.cu_k = (const int32_t *)p->cu_seqlens_k.data;
    src.cu_k_st = p->cu_seqlens_k.strides[0];
    src.causal = 1;
    src.kv_group = (int32_t)(p->q.shape[1] / p->k.shape[1]);
    src.crow = (const int32_t *)p->layout_crow.data;
    src.col = (const int32_t *)p->layout_col.data;
    src.crow_sh = p->layout_crow.strides[0];
    src.crow_sm = p->layout_crow.strides[1];
    src.col_sh = p->layout_col.strides[0];
    src.col_sm = p->layout_col.strides[1];
    src.kb_log2 = ilog2i(p->block_size);
    src.qb_log2 = ilog2i(qbs);
    src.n_row_blocks = (int32_t)(p->layout_crow.shape[1] - 1);
    src.n_cols = (int32_t)p->layout_col.shape[1];
    src.kb_max = 2048;
    return packed_launch(b, 1, &p->k, &p->v, a, src, p->max_seqlen_q, p->max_seqlen_k, ran);
}
