// PLACEHOLDER: replaced by the paged-attention kernels.
#include "cuda_backend.h"
extern "C" attnd_err attnd_cuda_paged_2d(attnd_backend *, const attnd_paged_params *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_paged_3d(attnd_backend *, const attnd_paged_params *, int32_t, void *) { return ATTND_ERR_UNSUPPORTED; }
extern "C" attnd_err attnd_cuda_cache_write(attnd_backend *, const attnd_cache_write_params *) { return ATTND_ERR_UNSUPPORTED; }
