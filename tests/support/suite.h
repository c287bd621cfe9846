/* Setup the Criterion suites share: a failed step fails the calling test with the reason. */
#ifndef ATTND_TESTS_SUITE_H
#define ATTND_TESTS_SUITE_H

#include <stdint.h>
#include <sys/types.h>

#include "attnd/client.h"
#include "attnd/kernels.h"
#include "daemon_proc.h"
#include "e2e_mirror.h"

/* Fork and re-execute this test binary as a child (argv0) with url_env=url and fd_env=<the write
 * end of a pipe> added to its environment; the child (a constructor that looks for url_env)
 * writes a uint64_t session id into the pipe once it is where the test wants it. Returns its pid
 * with *session set; fails the test when it does not report within 10 s. The child dies with the
 * test (PR_SET_PDEATHSIG). */
pid_t attnd_test_spawn_self(const char *argv0, const char *url_env, const char *fd_env,
                            const char *url, uint64_t *session);
/* The cpu backend with `threads` workers (0: the machine's cores). */
attnd_backend *attnd_test_open_cpu(int32_t threads);
/* Start the daemon of config_template (attnd_daemon_start). */
void attnd_test_daemon_start(attnd_daemon_proc *d, const char *config_template);
/* A client of d with a session (20 s per call). */
attnd_client *attnd_test_connect(const attnd_daemon_proc *d);
/* A client of d whose session the test mirrors: the client, its mirror (mo may be NULL; room for
 * max_tokens per sequence) and a shm region for io_rows rows of dt (attnd_e2e_io_bytes). */
void attnd_test_mirror_client(const attnd_daemon_proc *d, const attnd_mirror_opts *mo,
                              int32_t max_tokens, attnd_dtype dt, int64_t io_rows, attnd_client **c,
                              attnd_mirror *m, attnd_shm *shm);
/* Sequences 1..n created in c's session and in m. */
void attnd_test_mirror_seqs(attnd_client *c, attnd_mirror *m, uint64_t n);
/* The worst errors of a mirrored client's outputs within bounds for dt: out and LSE against the
 * CPU op and against the reference (each a cr_expect naming who). */
void attnd_test_expect_errs(const attnd_e2e_errs *e, attnd_dtype dt, const char *who);

#endif
