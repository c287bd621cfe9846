// Where the sm90 core's K/V come from. Paged: the block-table cache (attnd_paged_params). The
// other two serve the packed ops on the same core: sequence b's keys are rows cu_k[b].. of a
// contiguous [rows][kv heads][head] tensor, fetched by TMA in pages of rows starting anywhere
// (varlen: every key; block-sparse: the key blocks a work tile's layout rows list, gathered in
// increasing order into one virtual key sequence).
#ifndef ATTND_CUDA_PAGED_SRC_SM90_H
#define ATTND_CUDA_PAGED_SRC_SM90_H

#include <cuda.h>
#include <stdint.h>

enum { ATTND_SRC_PAGED = 0, ATTND_SRC_CONTIG = 1, ATTND_SRC_SPARSE = 2 };

typedef struct attnd_sm90_src {
    const int32_t *cu_k; /* contiguous: key row offsets [batch + 1] */
    int64_t cu_k_st;
    int32_t causal;   /* 0: every row sees all keys of its sequence (contiguous) */
    int32_t kv_group; /* sparse: q heads per kv head (a work tile is one q head) */
    /* sparse: the CSR layout per q head, key block size 2^kb_log2, row block size 2^qb_log2 */
    const int32_t *crow, *col;
    int64_t crow_sh, crow_sm, col_sh, col_sm;
    int32_t kb_log2, qb_log2, n_row_blocks, n_cols;
    int32_t kb_max; /* key blocks a sequence may have (the gather list's capacity) */
} attnd_sm90_src;

/* The sm90 core's tensor maps of K and V (one kernel argument, so that the producer addresses
 * all four from one base): boxes of one page, and boxes of a whole K/V tile's pages (a run of
 * consecutive block ids, or contiguous rows, in one copy). */
typedef struct attnd_sm90_maps {
    CUtensorMap k, v, k_run, v_run; /* a map's run map: two maps on (the producer's tm + 2) */
    CUtensorMap q; /* where kargs.q_tma: Q [tokens][heads][head], boxes of 64 packed rows */
} attnd_sm90_maps;

#endif
