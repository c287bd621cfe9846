// PLACEHOLDER: replaced by the merge / varlen / block-sparse / linear kernels (one file each).
#include "cuda_backend.h"
extern "C" attnd_err attnd_cuda_merge_states(attnd_backend *, const attnd_merge_params *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_varlen(attnd_backend *, const attnd_varlen_params *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_blocksparse(attnd_backend *, const attnd_blocksparse_params *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_linear_prefill(attnd_backend *, const attnd_linear_prefill_params *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_linear_decode(attnd_backend *, const attnd_linear_decode_params *) { return ATTND_ERR_UNSUPPORTED; }
