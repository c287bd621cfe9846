// Paged attention entry points of the cuda backend: turn validated descriptors into one
// attnd_paged_args, check what the kernels additionally need (unit innermost strides, 16-byte
// rows for cp.async), pick the tile configuration and launch on the backend's stream.
//
// Configuration: the 3D op always uses the decode tiles (16 packed rows, warps split the
// tokens), one CTA per (q-block, kv head, segment), then the reduce when num_segments > 1
// (num_segments == 1 writes the output directly). The 2D op uses the decode tiles with one
// segment when every sequence's packed rows (query_len * group) fit in 16, else the prefill
// tiles (128 packed rows; 64 for head sizes above 128).
#include <stdint.h>
#include <string.h>

#include "cuda_backend.h"
#include "paged_launch.h"
#include "validate.h"

static int pad_head(int64_t d)
{
    return d <= 64 ? 64 : (d <= 128 ? 128 : 256);
}

static int aligned(const void *ptr, int64_t bytes)
{
    return ((uintptr_t)ptr % (uintptr_t)bytes) == 0;
}

static attnd_err paged_prepare(attnd_backend *b, const attnd_paged_params *p, attnd_paged_args *a,
                               int *kv)
{
    const attnd_tensor *q = &p->q, *k = &p->k_cache, *v = &p->v_cache, *o = &p->out;
    memset(a, 0, sizeof *a);
    if (q->strides[2] != 1 || o->strides[2] != 1 || k->strides[3] != 1 || v->strides[3] != 1)
        return attnd_fail(b, "cuda paged attention: q, out, k_cache and v_cache need a unit "
                             "innermost stride");
    const int64_t bs = k->shape[1];
    if (bs != 16 && bs != 32 && bs != 64)
        return attnd_fail(b, "k_cache: block size %lld not 16, 32 or 64", (long long)bs);
    if (k->dtype != v->dtype) return attnd_fail(b, "v_cache: dtype differs from k_cache");
    if (p->block_tables.dtype != ATTND_DTYPE_I32 || p->seq_lens.dtype != ATTND_DTYPE_I32 ||
        p->query_start_loc.dtype != ATTND_DTYPE_I32)
        return attnd_fail(b, "cuda paged attention: block_tables, seq_lens and query_start_loc "
                             "must be i32");
    if (p->alibi_slopes.data && p->alibi_slopes.dtype != ATTND_DTYPE_F32)
        return attnd_fail(b, "alibi_slopes: must be f32");
    if (p->out_lse.data && p->out_lse.dtype != ATTND_DTYPE_F32)
        return attnd_fail(b, "out_lse: must be f32");

    const int64_t D = q->shape[2];
    const int fp8 = k->dtype == ATTND_DTYPE_FP8_E4M3;
    // the kernels address within a page row in 32 bits (page * stride is 64-bit)
    for (int i = 0; i < 2; i++) {
        const attnd_tensor *t = i ? v : k;
        const int64_t es = fp8 ? 1 : 2;
        if (t->strides[0] * es > INT32_MAX ||
            (t->strides[1] * 64 + t->strides[2] * t->shape[2] + D) * es > INT32_MAX)
            return attnd_fail(b, "%s: strides too large for the cuda backend (2^31 elements)",
                              i ? "v_cache" : "k_cache");
    }
    if (p->block_tables.strides[1] * p->block_tables.shape[1] > INT32_MAX)
        return attnd_fail(b, "block_tables: row longer than 2^31 elements");
    *kv = fp8 ? ATTND_KV_FP8 : (k->dtype == ATTND_DTYPE_BF16 ? ATTND_KV_BF16 : ATTND_KV_F16);
    // cp.async copies 16-byte chunks (8 elements; fp8: 16, or two 8-byte halves)
    const int64_t es = fp8 ? 1 : 2;
    int vec16 = 1;
    const attnd_tensor *cs[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        const attnd_tensor *t = cs[i];
        int ok8 = aligned(t->data, 8) && (t->strides[0] * es) % 8 == 0 &&
                  (t->strides[1] * es) % 8 == 0 && (t->strides[2] * es) % 8 == 0;
        int ok16 = aligned(t->data, 16) && (t->strides[0] * es) % 16 == 0 &&
                   (t->strides[1] * es) % 16 == 0 && (t->strides[2] * es) % 16 == 0 &&
                   (D * es) % 16 == 0;
        if (fp8 ? !ok8 : !ok16)
            return attnd_fail(b,
                              "%s: rows must start on %d-byte boundaries for the cuda "
                              "backend (base and strides)",
                              i ? "v_cache" : "k_cache", fp8 ? 8 : 16);
        vec16 = vec16 && ok16;
    }

    a->q = q->data;
    a->q_s0 = q->strides[0];
    a->q_s1 = q->strides[1];
    a->q_dt = q->dtype;
    {
        int64_t qe = (int64_t)attnd_dtype_size(q->dtype);
        a->q_vec = aligned(q->data, 16) && (q->strides[0] * qe) % 16 == 0 &&
                   (q->strides[1] * qe) % 16 == 0;
    }
    a->k = k->data;
    a->v = v->data;
    a->k_s0 = k->strides[0];
    a->k_s1 = k->strides[1];
    a->k_s2 = k->strides[2];
    a->v_s0 = v->strides[0];
    a->v_s1 = v->strides[1];
    a->v_s2 = v->strides[2];
    a->num_blocks = k->shape[0] < v->shape[0] ? k->shape[0] : v->shape[0];
    a->out = o->data;
    a->o_s0 = o->strides[0];
    a->o_s1 = o->strides[1];
    a->out_dt = o->dtype;
    {
        int64_t vb = (int64_t)attnd_dtype_size(o->dtype) * 4; /* bytes of a 4-element store */
        a->out_vec = aligned(o->data, vb) && o->strides[0] % 4 == 0 && o->strides[1] % 4 == 0;
    }
    if (p->out_lse.data) {
        a->lse = (float *)p->out_lse.data;
        a->lse_s0 = p->out_lse.strides[0];
        a->lse_s1 = p->out_lse.strides[1];
    }
    a->block_tables = (const int32_t *)p->block_tables.data;
    a->bt_s0 = p->block_tables.strides[0];
    a->bt_s1 = p->block_tables.strides[1];
    a->seq_lens = (const int32_t *)p->seq_lens.data;
    a->sl_s0 = p->seq_lens.strides[0];
    a->query_start_loc = (const int32_t *)p->query_start_loc.data;
    a->qsl_s0 = p->query_start_loc.strides[0];
    if (p->alibi_slopes.data) {
        a->alibi = (const float *)p->alibi_slopes.data;
        a->alibi_s0 = p->alibi_slopes.strides[0];
    }
    a->qk_scale = p->scale * (fp8 ? p->k_scale : 1.0f);
    a->qk_scale_log2 = a->qk_scale * 1.4426950408889634f;
    a->softcap = p->softcap > 0.0f ? p->softcap : 0.0f;
    a->out_scale = fp8 ? p->v_scale : 1.0f;
    a->plain = a->softcap == 0.0f && a->alibi == NULL && a->qk_scale > 0.0f;
    a->sliding_window = p->sliding_window > 0 ? p->sliding_window : 0;
    a->num_seqs = (int32_t)p->seq_lens.shape[0];
    a->num_q_heads = (int32_t)q->shape[1];
    a->num_kv_heads = (int32_t)k->shape[2];
    a->group = (int32_t)(q->shape[1] / k->shape[2]);
    a->head_size = (int32_t)D;
    a->bs_log2 = bs == 16 ? 4 : (bs == 32 ? 5 : 6);
    a->kv_vec16 = vec16;
    a->kv_same = k->strides[0] == v->strides[0] && k->strides[1] == v->strides[1] &&
                 k->strides[2] == v->strides[2];
    a->num_segments = 1;
    return ATTND_ERR_OK;
}

// sm_90+: the reduce is launched as a programmatic dependent of the segment kernel.
static int device_has_pdl(int device)
{
    static int cc[ATTND_CUDA_MAX_DEVICES]; // 0: not read yet (benign race)
    if (device < 0 || device >= ATTND_CUDA_MAX_DEVICES) return 0;
    if (cc[device] == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) !=
            cudaSuccess)
            return 0;
        cc[device] = major;
    }
    return cc[device] >= 9;
}

static attnd_err launch_status(attnd_backend *b, cudaError_t e, const char *what)
{
    if (e == cudaErrorInvalidConfiguration) {
        snprintf(b->last_error, sizeof b->last_error,
                 "%s: shapes exceed the launch limits of this device", what);
        cudaGetLastError();
        return ATTND_ERR_UNSUPPORTED;
    }
    return attnd_cuda_check(b, e, what);
}

extern "C" attnd_err attnd_cuda_paged_2d(attnd_backend *b, const attnd_paged_params *p)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_paged_args a;
    int kv;
    attnd_err rv = paged_prepare(b, p, &a, &kv);
    if (rv != ATTND_ERR_OK) return rv;
    const int64_t T = p->q.shape[0];
    if (T == 0 || a.num_seqs == 0) return ATTND_ERR_OK;
    const int d_pad = pad_head(a.head_size);
    cudaError_t e;
    if ((int64_t)p->max_query_len * a.group <= 16)
        e = attnd_paged_run_decode(a, d_pad, kv, T, p->max_query_len, c->device, c->max_smem_optin,
                                   c->stream);
    else
        e = attnd_paged_run_prefill(a, d_pad, kv, T, p->max_query_len, c->device, c->max_smem_optin,
                                    c->stream);
    return launch_status(b, e, "paged_attention_2d");
}

extern "C" attnd_err attnd_cuda_paged_3d(attnd_backend *b, const attnd_paged_params *p,
                                         int32_t num_segments, void *workspace)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_paged_args a;
    int kv;
    attnd_err rv = paged_prepare(b, p, &a, &kv);
    if (rv != ATTND_ERR_OK) return rv;
    const int64_t T = p->q.shape[0];
    if (T == 0 || a.num_seqs == 0) return ATTND_ERR_OK;
    const int d_pad = pad_head(a.head_size);
    a.num_segments = num_segments;
    if (num_segments > 1) {
        if (!aligned(workspace, 16)) return attnd_fail(b, "workspace: must be 16-byte aligned");
        const int64_t rows = T * a.num_q_heads * num_segments;
        a.ws_o = (float *)workspace;
        a.ws_m = a.ws_o + rows * a.head_size;
        a.ws_l = a.ws_m + rows;
    }
    cudaError_t e = attnd_paged_run_decode(a, d_pad, kv, T, p->max_query_len, c->device,
                                           c->max_smem_optin, c->stream);
    if (e == cudaSuccess && num_segments > 1)
        e = attnd_paged_run_reduce(a, T, device_has_pdl(c->device), c->stream);
    return launch_status(b, e, "paged_attention_3d");
}
