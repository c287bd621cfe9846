// Tile primitives for sm_80+ (also used on sm_90a): cp.async copies into shared memory,
// ldmatrix, mma.sync m16n8k16 with f32 accumulators, and the XOR swizzle for rows of 16-byte
// chunks. Fragment layouts (g = lane / 4, t = lane % 4):
//   A (16x16, row-major):  a0a1 = A[g][2t..], a2a3 = A[g+8][2t..], a4a5 = A[g][2t+8..],
//                          a6a7 = A[g+8][2t+8..]
//   B (16x8, "col"):       b0b1 = B[2t..][g], b2b3 = B[2t+8..][g]
//   C (16x8, f32):         c0c1 = C[g][2t..], c2c3 = C[g+8][2t..]
#ifndef ATTND_CUDA_PRIMS_SM80_CUH
#define ATTND_CUDA_PRIMS_SM80_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t attnd_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// a * b as a 64-bit product of 32-bit operands (one IMAD.WIDE).
__device__ __forceinline__ int64_t attnd_mul_wide(int32_t a, int32_t b)
{
    int64_t r;
    asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
    return r;
}

// One 16-byte shared load at a shared-state-space address, ordered with the other shared
// accesses (volatile, memory clobber: the data may have been written by another proxy's copy).
__device__ __forceinline__ uint4 attnd_ld_shared16(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// One 8-byte shared load, as attnd_ld_shared16.
__device__ __forceinline__ uint2 attnd_ld_shared8(uint32_t addr)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
    return v;
}

// One 16-byte shared store at a shared-state-space address.
__device__ __forceinline__ void attnd_st_shared16(uint32_t addr, uint4 v)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// 16 bytes global -> shared, bypassing L1; src_bytes < 16 zero-fills the rest (0: all zeros,
// and src is not read).
__device__ __forceinline__ void attnd_cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

// 16 bytes global -> shared, or zeros when !ok (src not read): the predicate form (no byte count
// to turn into an address adjustment).
__device__ __forceinline__ void attnd_cp_async16_if(uint32_t dst, const void *src, bool ok)
{
    asm volatile("{\n .reg .pred p;\n setp.eq.u32 p, %2, 0;\n"
                 " cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst),
                 "l"(src), "r"((uint32_t)ok));
}

// 8 bytes global -> shared (L1-allocating form; .cg only exists for 16).
__device__ __forceinline__ void attnd_cp_async8(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

// The 8x8 matrix of 16-bit pairs the warp holds as a C-fragment row each (lane (g, t): row g,
// columns 2t, 2t + 1), transposed: lane (g, t) gets rows 2t, 2t + 1 of column g.
__device__ __forceinline__ uint32_t attnd_movm_trans(uint32_t x)
{
    uint32_t r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

__device__ __forceinline__ void attnd_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void attnd_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void attnd_ldsm_x4(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void attnd_ldsm_x4_trans(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// C += A * B for one m16n8k16 tile; T selects f16 or bf16 operands.
template <typename T> struct attnd_mma;

template <> struct attnd_mma<__half> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct attnd_mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Byte offset of 16-byte chunk c of row r in a tile whose rows are row_bytes long (a multiple
// of 128): the chunk index is XORed with r % 8, so ldmatrix's eight row reads and a warp's
// chunk writes hit distinct banks.
__device__ __forceinline__ uint32_t attnd_swz(int r, int c, int row_bytes)
{
    return (uint32_t)(r * row_bytes + ((c ^ (r & 7)) << 4));
}

#endif
