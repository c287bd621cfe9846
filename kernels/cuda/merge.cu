// merge states on the GPU: one launch, no allocation, no host sync. The vectorised kernel runs
// when the three rows share a dtype and every row start is 16-byte aligned; anything else takes
// the element-wise kernel (same math).
#include "cuda_backend.h"
#include "merge_kernel.cuh"
#include "ops_util.h"

static int merge_aligned(const attnd_tensor *t, size_t esize)
{
    const size_t a = 16;
    return ((uintptr_t)t->data % a) == 0 && ((size_t)t->strides[0] * esize) % a == 0 &&
           ((size_t)t->strides[1] * esize) % a == 0 && ((size_t)t->shape[2] * esize) % a == 0;
}

template <typename T>
static void merge_launch_vec(const attnd_merge_kparams &k, cudaStream_t s, int64_t total_vecs)
{
    const int threads = 256;
    const unsigned blocks = (unsigned)((total_vecs + threads - 1) / threads);
    attnd_merge_vec_kernel<T><<<blocks, threads, 0, s>>>(k);
}

extern "C" attnd_err attnd_cuda_merge_states(attnd_backend *b, const attnd_merge_params *p)
{
    attnd_cuda *c = attnd_cuda_of(b);
    attnd_merge_kparams k;
    const attnd_tensor *o = &p->out;
    k.out = o->data;
    k.out_lse = (float *)p->out_lse.data;
    k.p_out = p->prefix_out.data;
    k.s_out = p->suffix_out.data;
    k.p_lse = (const float *)p->prefix_lse.data;
    k.s_lse = (const float *)p->suffix_lse.data;
    k.o_st = o->strides[0];
    k.o_sh = o->strides[1];
    k.p_st = p->prefix_out.strides[0];
    k.p_sh = p->prefix_out.strides[1];
    k.s_st = p->suffix_out.strides[0];
    k.s_sh = p->suffix_out.strides[1];
    k.pl_sh = p->prefix_lse.strides[0];
    k.pl_st = p->prefix_lse.strides[1];
    k.sl_sh = p->suffix_lse.strides[0];
    k.sl_st = p->suffix_lse.strides[1];
    k.ol_sh = p->out_lse.data ? p->out_lse.strides[0] : 0;
    k.ol_st = p->out_lse.data ? p->out_lse.strides[1] : 0;
    if (o->shape[0] > INT32_MAX || o->shape[1] > INT32_MAX)
        return attnd_fail_unsupported(b, "out: more than 2^31 tokens or heads");
    k.num_tokens = (int32_t)o->shape[0];
    k.num_heads = (int32_t)o->shape[1];
    k.head_size = (int32_t)o->shape[2];
    k.out_dt = o->dtype;
    k.p_dt = p->prefix_out.dtype;
    k.s_dt = p->suffix_out.dtype;
    const int64_t elems = o->shape[0] * o->shape[1] * o->shape[2];
    if (elems == 0) return ATTND_ERR_OK;

    const size_t es = attnd_dtype_size(o->dtype);
    const int same = k.p_dt == k.out_dt && k.s_dt == k.out_dt;
    const int vec = (int)(16 / es);
    if (same && merge_aligned(o, es) && merge_aligned(&p->prefix_out, es) &&
        merge_aligned(&p->suffix_out, es) && elems / vec < (int64_t)INT32_MAX) {
        k.vecs_per_row = k.head_size / vec;
        const int64_t total = elems / vec;
        switch (o->dtype) {
        case ATTND_DTYPE_F32:
            merge_launch_vec<float>(k, c->stream, total);
            break;
        case ATTND_DTYPE_F16:
            merge_launch_vec<__half>(k, c->stream, total);
            break;
        default:
            merge_launch_vec<__nv_bfloat16>(k, c->stream, total);
            break;
        }
        return attnd_cuda_check_launch(b, "attnd_merge_vec_kernel");
    }
    k.vecs_per_row = 0;
    const int threads = 256;
    const int64_t blocks = (elems + threads - 1) / threads;
    if (blocks > INT32_MAX) return attnd_fail_unsupported(b, "out: too many elements");
    attnd_merge_any_kernel<<<(unsigned)blocks, threads, 0, c->stream>>>(k);
    return attnd_cuda_check_launch(b, "attnd_merge_any_kernel");
}
