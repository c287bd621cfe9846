/* Host-side helpers of the merge / varlen / block-sparse / linear launchers. */
#ifndef ATTND_CUDA_OPS_UTIL_H
#define ATTND_CUDA_OPS_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_backend.h"

/* Record why the CUDA backend cannot run this call and return ATTND_ERR_UNSUPPORTED. */
static inline attnd_err attnd_fail_unsupported(attnd_backend *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(b->last_error, sizeof b->last_error, "cuda: ");
    vsnprintf(b->last_error + n, sizeof b->last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return ATTND_ERR_UNSUPPORTED;
}

/* Data pointer and the given strides (elements of esize bytes) all multiples of align bytes. */
static inline int attnd_aligned(const attnd_tensor *t, size_t esize, size_t align, int nstrides)
{
    if ((uintptr_t)t->data % align) return 0;
    for (int i = 0; i < nstrides; i++)
        if (((size_t)t->strides[i] * esize) % align) return 0;
    return 1;
}

#ifdef __CUDACC__
/* Raise a kernel's dynamic shared-memory limit (first call per kernel) and check the budget. */
template <typename K>
static inline attnd_err attnd_smem_opt_in(attnd_backend *b, K kernel, size_t bytes,
                                          const char *name)
{
    if (bytes > (size_t)attnd_cuda_of(b)->max_smem_optin)
        return attnd_fail_unsupported(b, "%s needs %zu bytes of shared memory (device has %d)",
                                      name, bytes, attnd_cuda_of(b)->max_smem_optin);
    if (bytes <= 48 * 1024) return ATTND_ERR_OK;
    return attnd_cuda_check(
        b, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
        name);
}
#endif

#endif
