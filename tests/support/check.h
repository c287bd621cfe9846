/* The checks the programs outside Criterion share (bench/, tests/gpu/): a failed call prints
 * file, line, the call and why, then exits: a benchmark or a GPU program has nothing to recover.
 * ATTND_CHECK_CUDA needs <cuda_runtime.h> where it is used. */
#ifndef ATTND_TESTS_CHECK_H
#define ATTND_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "attnd/kernels.h"

/* An attnd call; be (may be NULL) gives the backend's last message. */
#define ATTND_CHECK(call, be)                                                                      \
    do {                                                                                           \
        attnd_err rv_ = (call);                                                                    \
        if (rv_ != ATTND_ERR_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                     \
                    attnd_strerror(rv_), (be) ? attnd_backend_last_error(be) : "");                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A CUDA runtime call. */
#define ATTND_CHECK_CUDA(call)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
