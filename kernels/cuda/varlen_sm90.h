/* varlen and block-sparse prefill on the sm90 core (paged/mainloop_sm90.cuh): packed K/V read by
 * TMA in pages of rows that start anywhere. Each returns with *ran = 0 (and nothing launched)
 * where the core cannot take the call (device, build, dtype, bias, sizes): the caller then runs
 * the mma.sync kernel. */
#ifndef ATTND_CUDA_VARLEN_SM90_H
#define ATTND_CUDA_VARLEN_SM90_H

#include "cuda_backend.h"

attnd_err attnd_varlen_sm90(attnd_backend *b, const attnd_varlen_params *p, int *ran);
attnd_err attnd_blocksparse_sm90(attnd_backend *b, const attnd_blocksparse_params *p, int *ran);

#endif
