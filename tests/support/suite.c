#include "suite.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>

attnd_backend *attnd_test_open_cpu(int32_t threads)
{
    attnd_backend_opts opts = {threads, 0};
    attnd_backend *b = NULL;
    cr_assert_eq(attnd_backend_open(&b, "cpu", &opts), ATTND_ERR_OK);
    return b;
}

void attnd_test_daemon_start(attnd_daemon_proc *d, const char *config_template)
{
    cr_assert_eq(attnd_daemon_start(d, config_template), 0, "daemon did not start");
}

attnd_client *attnd_test_connect(const attnd_daemon_proc *d)
{
    attnd_client *c = attnd_daemon_connect(d, 20000);
    cr_assert_not_null(c);
    return c;
}

void attnd_test_mirror_client(const attnd_daemon_proc *d, const attnd_mirror_opts *mo,
                              int32_t max_tokens, attnd_dtype dt, int64_t io_rows, attnd_client **c,
                              attnd_mirror *m, attnd_shm *shm)
{
    *c = attnd_test_connect(d);
    const attnd_geometry *g = &attnd_client_server(*c)->geometry;
    cr_assert_eq(attnd_mirror_init(m, g, mo, max_tokens), 0);
    cr_assert_eq(attnd_client_shm_create(*c, attnd_e2e_io_bytes(g, dt, io_rows), shm), ATTND_ERR_OK,
                 "%s", attnd_client_last_error(*c));
}

void attnd_test_mirror_seqs(attnd_client *c, attnd_mirror *m, uint64_t n)
{
    for (uint64_t id = 1; id <= n; id++) {
        cr_assert_eq(attnd_client_seq_create(c, id, NULL), ATTND_ERR_OK);
        cr_assert_eq(attnd_mirror_create(m, id), 0);
    }
}

void attnd_test_expect_errs(const attnd_e2e_errs *e, attnd_dtype dt, const char *who)
{
    cr_expect_leq(e->direct, attnd_e2e_direct_tol(dt), "%s: out vs CPU op %.3g", who, e->direct);
    cr_expect_leq(e->direct_lse, ATTND_E2E_DIRECT_LSE_TOL, "%s: lse vs CPU op %.3g", who,
                  e->direct_lse);
    cr_expect_leq(e->ref, attnd_tol_for(dt), "%s: out vs reference %.3g", who, e->ref);
    cr_expect_leq(e->ref_lse, ATTND_E2E_REF_LSE_TOL, "%s: lse vs reference %.3g", who, e->ref_lse);
}

extern char **environ;

pid_t attnd_test_spawn_self(const char *argv0, const char *url_env, const char *fd_env,
                            const char *url, uint64_t *session)
{
    int p[2];
    char url_kv[512], fd_kv[128];
    size_t n = 0;
    cr_assert_eq(pipe(p), 0);
    snprintf(url_kv, sizeof url_kv, "%s=%s", url_env, url);
    snprintf(fd_kv, sizeof fd_kv, "%s=%d", fd_env, p[1]);
    while (environ[n] != NULL)
        n++;
    char **envp = calloc(n + 3, sizeof *envp); /* built before fork: the child only execs */
    cr_assert_not_null(envp);
    memcpy(envp, environ, n * sizeof *envp);
    envp[n] = url_kv;
    envp[n + 1] = fd_kv;
    char *argv[] = {(char *)argv0, NULL};
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    free(envp);
    close(p[1]);
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 10000), 1, "the child never reported");
    cr_assert_eq(read(p[0], session, sizeof *session), (ssize_t)sizeof *session,
                 "the child failed before reporting");
    close(p[0]);
    return pid;
}
