/* gpu_daemon_e2e's checks of index tensors in device memory (e2e_indices.c). */
#ifndef ATTND_TESTS_GPU_E2E_INDICES_H
#define ATTND_TESTS_GPU_E2E_INDICES_H

#include "attnd/kernels.h"
#include "daemon_proc.h"

/* One check's result: ok, and what was checked. */
typedef void (*attnd_e2e_check_fn)(void *arg, int ok, const char *what);

/* Varlen and block-sparse with cu_seqlens and layouts in a CUDA_IPC region, against daemon d
 * (backend cuda): outputs against cpu on the same inputs, bad values refused, and the values
 * flipped by another thread during requests; each check reported through check. */
void attnd_e2e_device_indices(const attnd_daemon_proc *d, attnd_backend *cpu,
                              attnd_e2e_check_fn check, void *arg);

#endif
