// Hopper primitives as inline PTX, in the style of prims/sm80.cuh: programmatic dependent launch
// (sm_90), mbarriers, the bulk tensor copy (TMA) into 128-byte-swizzled shared memory, named
// barriers, register reallocation, and warpgroup MMA (wgmma, sm_90a) with shared-memory matrix
// descriptors. Everything past the PDL pair exists only when compiling for sm_90a
// (ATTND_SM90A_DEVICE); the host decides whether such code was built (ATTND_CUDA_SM90A).
//
// Shared-memory tiles for wgmma and TMA are "slabs": rows of 64 16-bit elements (128 bytes),
// 16-byte chunk c of row r stored at chunk c ^ (r % 8) (the TMA's 128-byte swizzle), each slab
// 1024-byte aligned. A row-major [rows][D] tile is D / 64 slabs side by side.
//   K-major operand (Q, K: the reduction dim is contiguous): rows are the M / N dim; a k16 step
//   is 32 bytes into the row; 8-row groups 1024 bytes apart (SBO), slabs follow in k.
//   MN-major operand (V as B of P V: N = head dim contiguous): 8-row groups (the k dim) 1024
//   bytes apart (SBO), 64-column slabs LBO apart (the n dim); a k16 step is 16 rows = 2048 bytes.
// wgmma accumulators (m64nN, f32): lane 4 g + t of warp w holds rows 16 w + g and 16 w + g + 8,
// columns 8 n + 2 t, +1 of chunk n, as d[n][0..1] and d[n][2..3] (prims/sm80.cuh's C fragment).
// A from registers (m64k16): the mma.sync A fragment of the warp's 16 rows.
#ifndef ATTND_CUDA_PRIMS_SM90_CUH
#define ATTND_CUDA_PRIMS_SM90_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTND_SM90A_DEVICE 1
#endif

// griddepcontrol (programmatic dependent launch, sm_90): let the next kernel on the stream
// launch / wait for the previous one. No-ops before sm_90.
__device__ __forceinline__ void attnd_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// stmatrix (sm_90): four 8x8 16-bit matrices from a warp's C-fragment words into shared memory;
// word i of lane 4 g + t is row g, columns 2 t, 2 t + 1 of matrix i; lane 8 i + r gives the
// address of row r of matrix i (16 bytes).
__device__ __forceinline__ void attnd_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1,
                                                  uint32_t r2, uint32_t r3)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#else
    (void)addr, (void)r0, (void)r1, (void)r2, (void)r3;
    __trap();
#endif
}

__device__ __forceinline__ void attnd_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#ifdef ATTND_SM90A_DEVICE

// ------------------------------------------------------------------ mbarrier

__device__ __forceinline__ void attnd_mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Make initialised barriers visible to the other threads (and the async proxy).
__device__ __forceinline__ void attnd_mbar_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void attnd_mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrive and add bytes to the transaction count the current phase waits for.
__device__ __forceinline__ void attnd_mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// Wait until the phase of the given parity completed (a fresh barrier: parity 1 passes at once).
__device__ __forceinline__ void attnd_mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// ------------------------------------------------------------------ proxies, barriers, registers

// Order this thread's ordinary shared-memory writes before later async-proxy reads (wgmma, TMA).
__device__ __forceinline__ void attnd_fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier id (1..15) over n threads (a multiple of 32): wait / arrive without waiting.
__device__ __forceinline__ void attnd_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void attnd_bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// Hand registers back to / take them from the SM's pool (all warps of the warpgroup execute it).
template <int N> __device__ __forceinline__ void attnd_regs_dealloc(void)
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

template <int N> __device__ __forceinline__ void attnd_regs_alloc(void)
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// ------------------------------------------------------------------ TMA

__device__ __forceinline__ void attnd_tma_prefetch(const void *tmap)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)tmap) : "memory");
}

// One lane of the (converged) warp: true there, false in the others (elect.sync).
__device__ __forceinline__ bool attnd_elect_one(void)
{
    uint32_t pred;
    asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(pred));
    return pred != 0;
}

// Box (c0, c1, c2, c3) of a 4D tensor map into shared memory at dst; completes on bar.
__device__ __forceinline__ void attnd_tma_load4(uint32_t dst, const void *tmap, uint32_t bar,
                                                int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
                 "l"((uint64_t)tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

// ------------------------------------------------------------------ wgmma

// Descriptor of a 128-byte-swizzled operand at shared address addr (see the header comment).
__device__ __forceinline__ uint64_t attnd_wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr >> 4) & 0x3fff) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3fff) << 32) | (1ull << 62);
}

// Descriptor d moved on by bytes (a multiple of 16): its address field only, which cannot carry
// into the next field (shared addresses stay under 256 KB), so one 32-bit add on the low word
// instead of the whole descriptor rebuilt per k step.
__device__ __forceinline__ uint64_t attnd_wgmma_desc_add(uint64_t d, uint32_t bytes)
{
    return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

__device__ __forceinline__ void attnd_wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void attnd_wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int N> __device__ __forceinline__ void attnd_wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keep the softmax ahead of the wgmma wait that follows: ptxas schedules a wgmma.wait_group as
// early in its block as it can, so the P V a warpgroup issued before its softmax was waited for
// before the softmax instead of running under it. A shared store of a value the softmax computed
// last (each thread its own word, never read) stays ahead of the wait, and with it the softmax.
__device__ __forceinline__ void attnd_order_before_wait(uint32_t addr, float v)
{
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// Pin registers at this point of the program: the compiler may not move their reads or writes
// across it (around the asynchronous wgmma, which it does not see through).
template <int R> __device__ __forceinline__ void attnd_fence_regs(float (&d)[R][4])
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[i][e])::"memory");
}

template <int R> __device__ __forceinline__ void attnd_fence_regs(uint32_t (&d)[R][4])
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(d[i][e])::"memory");
}

#define ATTND_ACC1(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define ATTND_ACC4(d, i)                                                                           \
    ATTND_ACC1(d, i), ATTND_ACC1(d, i + 1), ATTND_ACC1(d, i + 2), ATTND_ACC1(d, i + 3)
#define ATTND_ACC8(d) ATTND_ACC4(d, 0), ATTND_ACC4(d, 4)
#define ATTND_ACC16(d) ATTND_ACC4(d, 0), ATTND_ACC4(d, 4), ATTND_ACC4(d, 8), ATTND_ACC4(d, 12)

#define ATTND_ACC_ASM32                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ATTND_ACC_ASM64                                                                            \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}"

// D (+)= A B for one m64nNk16 step, N = 8 * R (64 or 128), f32 accumulators, T = f16 or bf16.
//   ss: A and B from shared memory (K-major both: Q K^T);
//   rs: A from registers, B MN-major from shared memory (P V).
// scale_d 0: D = A B (the first step of a product), 1: D += A B. wgmma reads its register
// operands asynchronously: neither d nor a may be touched until attnd_wgmma_wait says it is done.
template <typename T, int R> struct attnd_wgmma;

#define ATTND_WGMMA_SPEC(T, TS)                                                                    \
    template <> struct attnd_wgmma<T, 8> {                                                         \
        static __device__ __forceinline__ void ss(float (&d)[8][4], uint64_t da, uint64_t db,      \
                                                  int scale_d)                                     \
        {                                                                                          \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                              \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32" TS " " ATTND_ACC_ASM32       \
                         ", %32, %33, p, 1, 1, 0, 0;\n}"                                           \
                         : ATTND_ACC8(d)                                                           \
                         : "l"(da), "l"(db), "r"(scale_d));                                        \
        }                                                                                          \
        static __device__ __forceinline__ void rs(float (&d)[8][4], const uint32_t (&a)[4],        \
                                                  uint64_t db, int scale_d)                        \
        {                                                                                          \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                              \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32" TS " " ATTND_ACC_ASM32       \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"                             \
                         : ATTND_ACC8(d)                                                           \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));     \
        }                                                                                          \
    };                                                                                             \
    template <> struct attnd_wgmma<T, 16> {                                                        \
        static __device__ __forceinline__ void ss(float (&d)[16][4], uint64_t da, uint64_t db,     \
                                                  int scale_d)                                     \
        {                                                                                          \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                              \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32" TS " " ATTND_ACC_ASM64      \
                         ", %64, %65, p, 1, 1, 0, 0;\n}"                                           \
                         : ATTND_ACC16(d)                                                          \
                         : "l"(da), "l"(db), "r"(scale_d));                                        \
        }                                                                                          \
        static __device__ __forceinline__ void rs(float (&d)[16][4], const uint32_t (&a)[4],       \
                                                  uint64_t db, int scale_d)                        \
        {                                                                                          \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                              \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32" TS " " ATTND_ACC_ASM64      \
                         ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"                             \
                         : ATTND_ACC16(d)                                                          \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));     \
        }                                                                                          \
    };

ATTND_WGMMA_SPEC(__nv_bfloat16, ".bf16.bf16")
ATTND_WGMMA_SPEC(__half, ".f16.f16")

#undef ATTND_WGMMA_SPEC

#endif // ATTND_SM90A_DEVICE

#endif
