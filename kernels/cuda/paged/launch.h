// Launch side of paged attention. attnd_paged_run<CORE, D_PAD, KV> launches one core at one
// padded head size and cache type; each (core, head, cache) is instantiated in its own
// generated file (paged/generate.cmake, one per file so they compile in parallel), and
// launch.cu picks one at run time by architecture and shape.
#ifndef ATTND_CUDA_PAGED_LAUNCH_H
#define ATTND_CUDA_PAGED_LAUNCH_H

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "paged/args.h"
#include "paged/src_sm90.h"

enum {
    ATTND_CORE_SM80_PREFILL = 0, // mma.sync, 128 (64) packed rows, whole context, 2D only
    ATTND_CORE_SM80_DECODE = 1,  // mma.sync, 16 packed rows, 4 warps over the tokens, 2D and 3D
                                 // (fp8 at head sizes >= 128 and <= 8 rows: narrow tiles of 8)
    ATTND_CORE_SM90_PREFILL = 2, // wgmma + TMA, warp-specialised, 2D prefill (sm_90a)
    ATTND_CORE_SM90_PREFILL_SINKS = 3, // the same, its epilogue folding attention sinks in
    ATTND_CORE_SM90_VARLEN = 4,        // the sm90 core on contiguous K/V (varlen.cu)
    ATTND_CORE_SM90_SPARSE = 5,        // the sm90 core on gathered key blocks (blocksparse.cu)
};

// Packed rows of the sm80 decode tiles (one CTA column of the 3D grid per q-block of 16).
#define ATTND_DECODE_BLOCK_M 16

// Features of the sm90 core that a measurement may turn off (attnd_paged_launch.sm90_off).
enum {
    ATTND_SM90_NO_PINGPONG = 1,    // consumers issue their GEMMs without taking turns
    ATTND_SM90_NO_SECTIONS = 2,    // tiles ordered without regard to the L2
    ATTND_SM90_NO_QPREFETCH = 4,   // Q loaded when its tile starts, not during the previous one
    ATTND_SM90_NO_DEEP = 8,        // as many K stages as V stages (no third stage at head 128)
    ATTND_SM90_NO_SMEM_EPI = 16,   // rows stored straight from the fragments, not via shared memory
    ATTND_SM90_NO_RANGE_MASK = 32, // masked tiles tested per logit, not by a column range per row
    ATTND_SM90_DEEP_K_NOT_V = 64,  // head 128: the third stage holds K, not V
    ATTND_SM90_NO_LATE_WAIT = 128, // P V waited for before the softmax of the next tile
    ATTND_SM90_NO_CHAIN = 256,     // general instantiation (the plain one never chains): a work
                                   // tile's first Q K^T and softmax after the previous tile's
                                   // last P V and epilogue, not under that P V
    ATTND_SM90_NO_FAST_EPI = 512,  // epilogue: 4-byte shared stores and a store loop per chunk,
                                   // not stmatrix and the rows' loads issued together
    ATTND_SM90_NO_HI_ONLY = 1024,  // masked tiles without a window still test the range's
                                   // lower bound
    ATTND_SM90_FEW_CTAS = 2048,    // tests: a grid of 3 CTAs, so that each runs many tiles in a row
    ATTND_SM90_NO_LATE_STORE = 4096, // chained tiles: rows stored before the next step's GEMMs
                                     // are issued, not under them
    ATTND_SM90_NO_PLAIN = 8192       // the general instantiation (chained tiles) even when the
                                     // plain one applies
};
// The switches the plain instantiation does not have (traits PLAIN): any of them set, the
// general one runs.
#define ATTND_SM90_NOT_PLAIN                                                                       \
    (ATTND_SM90_NO_RANGE_MASK | ATTND_SM90_NO_LATE_WAIT | ATTND_SM90_NO_FAST_EPI |                 \
     ATTND_SM90_NO_HI_ONLY | ATTND_SM90_NO_LATE_STORE | ATTND_SM90_NO_PLAIN)

// What a launch needs besides the kernel arguments; the caller owns the stream.
typedef struct attnd_paged_launch {
    cudaStream_t stream;
    int device, num_sms, max_smem; // max_smem: the device's opt-in shared-memory limit
    int64_t num_tokens;
    int max_query_len;
    const attnd_sm90_maps *maps; // sm90: tensor maps of k_cache and v_cache
    int sm90_off;                // sm90: ATTND_SM90_NO_* features turned off (measurements)
    int64_t l2_bytes;            // sm90: the device's L2 (sizes the tile sections)
    int max_seq_len;
    const attnd_sm90_src *src; // sm90 varlen / sparse: where K/V come from
    attnd_smem_optin *optin;   // the backend's record of raised shared-memory limits
} attnd_paged_launch;

// A launch on the backend's stream and device, with its limits and records; tensor maps and
// sources are the caller's to add.
void attnd_paged_launch_init(attnd_paged_launch *l, attnd_cuda *c, int64_t num_tokens,
                             int max_query_len, int max_seq_len);

// A 16-bit tensor as the sm90 core's TMA reads it: dims innermost first, the byte strides of the
// outer three, boxes of 64 columns x box_rows rows x box_pages (dim 3), 128-byte swizzle,
// out-of-bounds boxes as zeros. 0 when the driver has no cuTensorMapEncodeTiled or refuses the
// map.
int attnd_sm90_encode_map(const attnd_cuda *c, const attnd_tensor *t, const cuuint64_t dims[4],
                          const cuuint64_t strides[3], cuuint32_t box_rows, cuuint32_t box_pages,
                          CUtensorMap *m);

// Q [tokens][heads][head] for the sm90 plain core's TMA (maps->q): 1 when the kernel can take its
// rows that way (16-bit Q of the compute type kv, 16-byte rows, a group dividing 64, head <= 128,
// plain), else 0 and kargs.q_tma stays 0.
int attnd_sm90_q_map(const attnd_cuda *c, const attnd_paged_kargs *a, int kv,
                     attnd_sm90_maps *maps);

// Keys per K/V tile of the sm90 core at a padded head size (its traits' BLOCK_N): the rows a run
// map's box covers.
static inline constexpr int attnd_sm90_block_n(int d_pad)
{
    return d_pad <= 128 ? 128 : 64;
}

// Paged attention on an f32 cache (paged/f32.cu), exact f32 math, 2D and 3D alike.
cudaError_t attnd_paged_f32_run(const attnd_paged_kargs &a, cudaStream_t stream);

// Launch the core on the launch's stream; cudaErrorInvalidConfiguration when the shapes exceed
// the launch limits or the device's shared memory.
template <int CORE, int D_PAD, int KV>
cudaError_t attnd_paged_run(attnd_paged_kargs a, const attnd_paged_launch &l);

typedef cudaError_t (*attnd_paged_fn)(attnd_paged_kargs, const attnd_paged_launch &);
// A row of a launch table: one core at one head size, per cache type f16 / bf16 / fp8 (ROW16:
// no fp8 instantiation, NULL).
#define ATTND_PAGED_ROW(CORE, D)                                                                   \
    {                                                                                              \
        &attnd_paged_run<CORE, D, ATTND_KV_F16>, &attnd_paged_run<CORE, D, ATTND_KV_BF16>,         \
            &attnd_paged_run<CORE, D, ATTND_KV_FP8>                                                \
    }
#define ATTND_PAGED_ROW16(CORE, D)                                                                 \
    {                                                                                              \
        &attnd_paged_run<CORE, D, ATTND_KV_F16>, &attnd_paged_run<CORE, D, ATTND_KV_BF16>, NULL    \
    }

// The padded head size a head of d columns runs at (the instantiations' D_PAD).
static inline int attnd_paged_d_pad(int64_t d)
{
    return d <= 64 ? 64 : (d <= 128 ? 128 : 256);
}

// Its row in the launch tables ([head 64 / 128 / 256]).
static inline int attnd_paged_d_row(int64_t d)
{
    const int dp = attnd_paged_d_pad(d);
    return dp == 64 ? 0 : (dp == 128 ? 1 : 2);
}

#endif
