/* gpu_daemon_e2e's concurrency check (e2e_concurrent.c). */
#ifndef ATTND_TESTS_GPU_E2E_CONCURRENT_H
#define ATTND_TESTS_GPU_E2E_CONCURRENT_H

#include <stddef.h>

#include "daemon_proc.h"

#define NCLIENTS 4

/* A solo client, then NCLIENTS at once, against daemon d (32 layers, 32/8 heads, head 128,
 * bf16): 0 when every client's outputs equal the solo run's bit for bit; report says what was
 * checked or what failed. */
int attnd_e2e_concurrent(const attnd_daemon_proc *d, char *report, size_t n);

#endif
