#include "daemon_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 20000
#define STOP_TIMEOUT_MS 30000

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Fresh names under /tmp: pid plus the clock, so tests and their reruns never collide. */
static void make_paths(attnd_daemon_proc *d)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long tag = (unsigned long)ts.tv_nsec ^ ((unsigned long)ts.tv_sec << 20);
    snprintf(d->sock_path, sizeof d->sock_path, "/tmp/attnd-t%ld-%lx.sock", (long)getpid(), tag);
    snprintf(d->config_path, sizeof d->config_path, "/tmp/attnd-t%ld-%lx.json", (long)getpid(),
             tag);
    snprintf(d->log_path, sizeof d->log_path, "/tmp/attnd-t%ld-%lx.log", (long)getpid(), tag);
    snprintf(d->url, sizeof d->url, "ipc://%s", d->sock_path);
}

/* A TCP port nobody listens on right now (the kernel's pick for port 0). */
int attnd_daemon_free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* The next placeholder in p: its position and replacement (NULL when none is left). */
static const char *next_placeholder(const attnd_daemon_proc *d, const char *p, const char **with)
{
    const char *u = strstr(p, "@URL@"), *t = strstr(p, "@TCP@");
    if (u != NULL && (t == NULL || u < t)) {
        *with = d->url;
        return u;
    }
    *with = d->tcp_url;
    return t;
}

static int write_config(attnd_daemon_proc *d, const char *tmpl)
{
    FILE *f;
    const char *p = tmpl, *hit, *with;
    if (strstr(tmpl, "@TCP@") != NULL) {
        int port = attnd_daemon_free_port();
        if (port <= 0) {
            fprintf(stderr, "daemon_proc: no free TCP port\n");
            return -1;
        }
        snprintf(d->tcp_url, sizeof d->tcp_url, "tcp://127.0.0.1:%d", port);
    }
    if ((f = fopen(d->config_path, "w")) == NULL) {
        fprintf(stderr, "daemon_proc: %s: %s\n", d->config_path, strerror(errno));
        return -1;
    }
    while ((hit = next_placeholder(d, p, &with)) != NULL) {
        fwrite(p, 1, (size_t)(hit - p), f);
        fputs(with, f);
        p = hit + 5;
    }
    fputs(p, f);
    return fclose(f) == 0 ? 0 : -1;
}

/* In the child: die with the test, output to the log, become the daemon. */
static void exec_daemon(const attnd_daemon_proc *d, const char *bin, pid_t parent)
{
    int fd;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if ((fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
    execl(bin, bin, "--config", d->config_path, (char *)NULL);
    fprintf(stderr, "daemon_proc: exec %s: %s\n", bin, strerror(errno));
    _exit(127);
}

void attnd_daemon_dump_log(const attnd_daemon_proc *d)
{
    char buf[4096];
    size_t n;
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL) return;
    fprintf(stderr, "---- attnd log (%s)\n", d->log_path);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end of attnd log\n");
    fclose(f);
}

/* Exit status in attnd_daemon_stop's terms. */
static int exit_code(int status)
{
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/* Does the daemon answer Hello? */
static int answers(const attnd_daemon_proc *d)
{
    attnd_client_opts opts = {.name = "daemon_proc", .timeout_ms = 500};
    attnd_client *c = NULL;
    int ok;
    if (attnd_client_alloc(&c, &opts) != ATTND_ERR_OK) return 0;
    ok = attnd_client_connect(c, d->url, NULL) == ATTND_ERR_OK;
    attnd_client_free(c);
    return ok;
}

static int wait_ready(attnd_daemon_proc *d)
{
    int64_t deadline = mono_ms() + START_TIMEOUT_MS;
    int status;
    while (mono_ms() < deadline) {
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr, "daemon_proc: attnd exited during start-up (status %d)\n",
                    exit_code(status));
            d->pid = 0;
            return -1;
        }
        if (access(d->sock_path, F_OK) == 0 && answers(d)) return 0;
        sleep_ms(20);
    }
    fprintf(stderr, "daemon_proc: attnd did not answer Hello on %s within %d ms\n", d->url,
            START_TIMEOUT_MS);
    return -1;
}

static void remove_files(const attnd_daemon_proc *d, int keep_log)
{
    char path[sizeof d->sock_path + 16];
    glob_t g;
    unlink(d->config_path);
    unlink(d->sock_path);
    /* the socket's lock, and listeners on private paths a killed daemon left (wire/listen.h) */
    snprintf(path, sizeof path, "%s.lock", d->sock_path);
    unlink(path);
    snprintf(path, sizeof path, "%s.[0-9]*", d->sock_path);
    if (glob(path, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
        globfree(&g);
    }
    if (!keep_log) unlink(d->log_path);
}

int attnd_daemon_start(attnd_daemon_proc *d, const char *config_template)
{
    const char *dir = getenv("ATTND_BUILD_DIR");
    char bin[512];
    pid_t parent = getpid();
    memset(d, 0, sizeof *d);
    if (dir == NULL) {
        fprintf(stderr, "daemon_proc: ATTND_BUILD_DIR is not set (run the tests with ctest)\n");
        return -1;
    }
    snprintf(bin, sizeof bin, "%s/daemon/attnd", dir);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "daemon_proc: %s: %s\n", bin, strerror(errno));
        return -1;
    }
    make_paths(d);
    if (write_config(d, config_template) != 0) return -1;
    if ((d->pid = fork()) < 0) {
        fprintf(stderr, "daemon_proc: fork: %s\n", strerror(errno));
        d->pid = 0;
        return -1;
    }
    if (d->pid == 0) exec_daemon(d, bin, parent);
    if (wait_ready(d) != 0) {
        attnd_daemon_dump_log(d);
        if (d->pid > 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
            d->pid = 0;
        }
        remove_files(d, 1);
        return -1;
    }
    return 0;
}

int attnd_daemon_signal(const attnd_daemon_proc *d, int sig)
{
    return d->pid > 0 ? kill(d->pid, sig) : -1;
}

int attnd_daemon_wait(attnd_daemon_proc *d, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    int status;
    if (d->pid <= 0) return -1;
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid) {
            d->pid = 0;
            return exit_code(status);
        }
        if (r < 0) {
            d->pid = 0;
            return -1;
        }
        if (mono_ms() >= deadline) return -2;
        sleep_ms(5);
    }
}

int attnd_daemon_stop(attnd_daemon_proc *d)
{
    int rc;
    if (d->pid <= 0) { /* already reaped: only the files are left */
        remove_files(d, 0);
        return -1;
    }
    kill(d->pid, SIGTERM);
    if ((rc = attnd_daemon_wait(d, STOP_TIMEOUT_MS)) == -2) {
        fprintf(stderr, "daemon_proc: attnd ignored SIGTERM for %d ms, killing it\n",
                STOP_TIMEOUT_MS);
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
        rc = -1;
    }
    if (rc != 0) attnd_daemon_dump_log(d);
    remove_files(d, rc != 0);
    return rc;
}

attnd_client *attnd_daemon_connect(const attnd_daemon_proc *d, int32_t timeout_ms)
{
    return attnd_daemon_connect_url(d->url, timeout_ms, NULL);
}

attnd_client *attnd_daemon_connect_url(const char *url, int32_t timeout_ms, const char *tls_ca)
{
    attnd_client_opts opts = {.name = "attnd-test", .timeout_ms = timeout_ms};
    attnd_client *c = NULL;
    attnd_err rv;
    if (attnd_client_alloc(&c, &opts) != ATTND_ERR_OK) return NULL;
    if ((rv = attnd_client_set_tls(c, tls_ca, NULL)) != ATTND_ERR_OK ||
        (rv = attnd_client_connect(c, url, NULL)) != ATTND_ERR_OK) {
        fprintf(stderr, "daemon_proc: connect %s: %s: %s\n", url, attnd_err_name(rv),
                attnd_client_last_error(c));
        attnd_client_free(c);
        return NULL;
    }
    return c;
}
