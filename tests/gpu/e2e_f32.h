/* gpu_daemon_e2e's f32-cache check (e2e_f32.c): a cuda daemon and a cpu daemon on one f32-cache
 * configuration with per-layer options (window, softcap, sinks, standard ALiBi, scale), the same
 * steps sent to both. */
#ifndef ATTND_TESTS_GPU_E2E_F32_H
#define ATTND_TESTS_GPU_E2E_F32_H

#include <stddef.h>

#include "daemon_proc.h"

/* Start both daemons (before this process initialises CUDA: they fork). 0 on success. */
int attnd_e2e_f32_start(attnd_daemon_proc *cuda, attnd_daemon_proc *cpu);
/* Prefills, decodes and a chunk over every layer, INLINE f32 tensors to both daemons: 0 when
 * every output and LSE of the cuda daemon is within f32 accuracy (1e-5 relative L2) of the cpu
 * daemon's; report says what was checked or what failed. */
int attnd_e2e_f32_run(const attnd_daemon_proc *cuda, const attnd_daemon_proc *cpu, char *report,
                      size_t n);

#endif
