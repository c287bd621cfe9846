// merge states: out = w_p * prefix_out + w_s * suffix_out with w from the two LSEs
// (merge_attn_states). One pass: each thread owns VEC consecutive elements of one (token, head)
// row, reads its two LSEs (cached: every thread of the row reads the same two words), and
// streams 16-byte vectors. Semantics as the CPU backend: +inf reads as -inf, both -inf gives
// zeros and out_lse = -inf, and a side whose weight is 0 is not read (garbage there cannot leak).
#ifndef ATTND_CUDA_MERGE_KERNEL_CUH
#define ATTND_CUDA_MERGE_KERNEL_CUH

#include "ops_kernel.cuh"

typedef struct attnd_merge_kparams {
    void *out;
    float *out_lse; // NULL: not asked for
    const void *p_out, *s_out;
    const float *p_lse, *s_lse;
    int64_t o_st, o_sh;   // out strides: token, head (elements)
    int64_t p_st, p_sh;   // prefix_out
    int64_t s_st, s_sh;   // suffix_out
    int64_t pl_sh, pl_st; // prefix_lse strides: head, token
    int64_t sl_sh, sl_st;
    int64_t ol_sh, ol_st;
    int32_t num_tokens, num_heads, head_size;
    int32_t vecs_per_row; // head_size / VEC
    int32_t out_dt, p_dt, s_dt;
} attnd_merge_kparams;

template <typename T> struct attnd_vec8;
template <> struct attnd_vec8<float> { // 4 floats per 16 bytes
    enum { N = 4 };
    static __device__ __forceinline__ void load(float *f, uint4 u)
    {
        f[0] = __uint_as_float(u.x);
        f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z);
        f[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 store(const float *f)
    {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};
template <typename H, bool B> struct attnd_vec16 { // 8 halves per 16 bytes
    enum { N = 8 };
    static __device__ __forceinline__ void load(float *f, uint4 u)
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 v = attnd_unpack2<B>(w[i]);
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
    static __device__ __forceinline__ uint4 store(const float *f)
    {
        return make_uint4(attnd_pack2<B>(f[0], f[1]), attnd_pack2<B>(f[2], f[3]),
                          attnd_pack2<B>(f[4], f[5]), attnd_pack2<B>(f[6], f[7]));
    }
};
template <> struct attnd_vec8<__half> : attnd_vec16<__half, false> {
};
template <> struct attnd_vec8<__nv_bfloat16> : attnd_vec16<__nv_bfloat16, true> {
};

// All three rows of dtype T, 16-byte aligned: one 16-byte vector per thread and side.
template <typename T>
__global__ void __launch_bounds__(256) attnd_merge_vec_kernel(const attnd_merge_kparams p)
{
    typedef attnd_vec8<T> V;
    const uint32_t total =
        (uint32_t)p.num_tokens * (uint32_t)p.num_heads * (uint32_t)p.vecs_per_row;
    const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const uint32_t c = idx % (uint32_t)p.vecs_per_row, row = idx / (uint32_t)p.vecs_per_row;
    const int32_t h = (int32_t)(row % (uint32_t)p.num_heads);
    const int32_t tok = (int32_t)(row / (uint32_t)p.num_heads);
    const float pl = __ldg(p.p_lse + h * p.pl_sh + tok * p.pl_st);
    const float sl = __ldg(p.s_lse + h * p.sl_sh + tok * p.sl_st);
    float wp, ws;
    const float lse = attnd_lse_merge2(pl, sl, &wp, &ws);
    const int64_t col = (int64_t)c * V::N;
    uint4 up = make_uint4(0, 0, 0, 0), us = make_uint4(0, 0, 0, 0);
    if (wp != 0.0f)
        up = __ldcs((const uint4 *)((const T *)p.p_out + tok * p.p_st + h * p.p_sh + col));
    if (ws != 0.0f)
        us = __ldcs((const uint4 *)((const T *)p.s_out + tok * p.s_st + h * p.s_sh + col));
    float a[V::N], b[V::N], o[V::N];
    V::load(a, up);
    V::load(b, us);
#pragma unroll
    for (int i = 0; i < V::N; i++) {
        float x = wp != 0.0f ? wp * a[i] : 0.0f;
        o[i] = ws != 0.0f ? fmaf(ws, b[i], x) : x;
    }
    __stcs((uint4 *)((T *)p.out + tok * p.o_st + h * p.o_sh + col), V::store(o));
    if (p.out_lse != NULL && c == 0) p.out_lse[h * p.ol_sh + tok * p.ol_st] = lse;
}

// Any dtypes and alignments: one element per thread.
__global__ void __launch_bounds__(256) attnd_merge_any_kernel(const attnd_merge_kparams p)
{
    const int64_t total = (int64_t)p.num_tokens * p.num_heads * p.head_size;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int64_t c = idx % p.head_size, row = idx / p.head_size;
    const int64_t h = row % p.num_heads, tok = row / p.num_heads;
    float wp, ws;
    const float lse = attnd_lse_merge2(p.p_lse[h * p.pl_sh + tok * p.pl_st],
                                       p.s_lse[h * p.sl_sh + tok * p.sl_st], &wp, &ws);
    float o = 0.0f;
    if (wp != 0.0f) o = wp * attnd_ld_elem(p.p_out, p.p_dt, tok * p.p_st + h * p.p_sh + c);
    if (ws != 0.0f) o = fmaf(ws, attnd_ld_elem(p.s_out, p.s_dt, tok * p.s_st + h * p.s_sh + c), o);
    attnd_st_elem(p.out, p.out_dt, tok * p.o_st + h * p.o_sh + c, o);
    if (p.out_lse != NULL && c == 0) p.out_lse[h * p.ol_sh + tok * p.ol_st] = lse;
}

#endif
