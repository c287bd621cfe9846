/* The listeners stay up (issue 13, items 5 and 6): a second attnd started on a socket or port in
 * use exits with a clear error and leaves the first one serving; plain connect()s that close at
 * once (a health probe, `nc -U`, a port scanner's FIN+RST on tcp) never take the socket away,
 * though NNG 1.5.2 stops accepting after one (nanomsg/nng#1518); a session that was open stays
 * open. Real bytes on real sockets against the real daemon. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loadutil.h"

/* ---------------------------------------------------------------- helpers */

/* A fresh client's Hello, with calls of 1 s, retried for at most wait_ms: OK once served. */
static attnd_err fresh_client_within(const char *url, int wait_ms, int64_t *took_ms)
{
    int64_t t0 = lu_now_ms();
    attnd_client_opts opts = {.name = "listen-test", .timeout_ms = 1000, .channel_slots = -1};
    attnd_err rv;
    do {
        attnd_client *c = NULL;
        cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
        rv = attnd_client_connect(c, url, NULL);
        attnd_client_free(c);
    } while (rv != ATTND_ERR_OK && lu_now_ms() - t0 < wait_ms);
    if (took_ms) *took_ms = lu_now_ms() - t0;
    return rv;
}

/* A client with a sequence that stays connected through the test; its session must live. */
static attnd_client *long_lived_client(const char *url)
{
    attnd_client *c = attnd_daemon_connect_url(url, 5000, NULL);
    char why[256];
    cr_assert_not_null(c);
    cr_assert_eq(attnd_client_seq_create(c, 1, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(c, 1, 3, 1.0f, why, sizeof why), 0, "%s", why);
    return c;
}

static void long_lived_still_served(attnd_client *c, const char *after)
{
    char why[256];
    cr_assert_eq(lu_step_const_v(c, 1, 1, 1.0f, why, sizeof why), 0, "session lost after %s: %s",
                 after, why);
}

/* Run a second attnd on cfg (a complete configuration) and wait for its exit (at most 30 s):
 * its exit status, its output in out. */
static int second_daemon(const char *cfg, char *out, size_t n)
{
    char cfg_path[64] = "/tmp/attnd-second-XXXXXX", log_path[80], bin[512];
    int fd = mkstemp(cfg_path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, cfg, strlen(cfg)), (ssize_t)strlen(cfg));
    close(fd);
    snprintf(log_path, sizeof log_path, "%s.log", cfg_path);
    snprintf(bin, sizeof bin, "%s/daemon/attnd", getenv("ATTND_BUILD_DIR"));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int lf = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(lf, STDOUT_FILENO);
        dup2(lf, STDERR_FILENO);
        execl(bin, bin, "--config", cfg_path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    int64_t end = lu_now_ms() + 30000;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (lu_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("the second attnd did not exit within 30 s");
        }
        lu_sleep_ms(10);
    }
    FILE *f = fopen(log_path, "r");
    size_t got = f ? fread(out, 1, n - 1, f) : 0;
    out[got] = '\0';
    if (f) fclose(f);
    unlink(cfg_path);
    unlink(log_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* d's configuration file with its placeholders filled in, as the second daemon's. */
static void config_of(const attnd_daemon_proc *d, char *out, size_t n)
{
    FILE *f = fopen(d->config_path, "r");
    cr_assert_not_null(f);
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    fclose(f);
}

/* A TCP connection to 127.0.0.1:port that sends a FIN and then an RST at once. */
static void tcp_fin_rst(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct linger lg = {1, 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    shutdown(fd, SHUT_WR);
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* ---------------------------------------------------------------- a second daemon (item 5) */

Test(listen, a_second_daemon_fails_cleanly_and_the_first_serves_on, .timeout = 240)
{
    attnd_daemon_proc d;
    char cfg[4096], out[8192];
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG(", \"listen_tcp\": \"@TCP@\"")), 0);
    attnd_client *keep = long_lived_client(d.url);
    config_of(&d, cfg, sizeof cfg);
    for (int i = 0; i < 5; i++) {
        int rc = second_daemon(cfg, out, sizeof out);
        cr_assert_eq(rc, 1, "second attnd, try %d: exit %d\n%s", i, rc, out);
        cr_assert_not_null(strstr(out, "server.listen"), "try %d: no key named\n%s", i, out);
        cr_assert_not_null(strstr(out, "in use"), "try %d: not said in use\n%s", i, out);
        cr_assert_null(strstr(out, "ERROR: AddressSanitizer"), "%s", out);
        int64_t took;
        attnd_err rv = fresh_client_within(d.url, 15000, &took);
        cr_assert_eq(rv, ATTND_ERR_OK, "try %d: the first daemon's ipc socket serves no new client",
                     i);
        fprintf(stderr, "listen: second daemon %d: exit %d; a fresh client served after %lld ms\n",
                i, rc, (long long)took);
        long_lived_still_served(keep, "a second daemon's start");
    }
    /* its own ipc socket elsewhere, the first's tcp port: refused as clearly, tcp serves on */
    char other[4200], *at = strstr(cfg, d.url);
    cr_assert_not_null(at);
    snprintf(other, sizeof other, "%.*s%s.other%s", (int)(at - cfg), cfg, d.url,
             at + strlen(d.url));
    int rc = second_daemon(other, out, sizeof out);
    cr_assert_eq(rc, 1, "exit %d\n%s", rc, out);
    cr_assert_not_null(strstr(out, "server.listen_tcp"), "%s", out);
    cr_assert_not_null(strstr(out, "in use"), "%s", out);
    cr_assert_eq(fresh_client_within(d.tcp_url, 15000, NULL), ATTND_ERR_OK);
    cr_assert_eq(fresh_client_within(d.url, 15000, NULL), ATTND_ERR_OK);
    char other_lock[sizeof d.sock_path + 16];
    snprintf(other_lock, sizeof other_lock, "%s.other.lock", d.sock_path);
    unlink(other_lock); /* the second daemon's lock on its own path (locks stay by design) */
    long_lived_still_served(keep, "all the second daemons");
    attnd_client_free(keep);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- stray connections (item 6) */

Test(listen, stray_connections_never_take_the_socket_away, .timeout = 240)
{
    attnd_daemon_proc d;
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG(", \"listen_tcp\": \"@TCP@\"")), 0);
    attnd_client *keep = long_lived_client(d.url);
    int port = atoi(strrchr(d.tcp_url, ':') + 1);
    /* connect()+close() (nc -zU, a probe), a partial SP header then close, on ipc; FIN+RST on
     * tcp: each one at least twice (NNG 1.5.2 loses the race now and then) */
    static const char *const kinds[] = {"connect+close", "3 header bytes+close", "tcp FIN+RST"};
    for (int round = 0; round < 6; round++) {
        int kind = round % 3;
        if (kind == 2) {
            tcp_fin_rst(port);
        } else {
            int fd = lu_unix_connect(d.url, 0);
            cr_assert_geq(fd, 0, "connect: %s", strerror(errno));
            if (kind == 1) cr_assert_eq(send(fd, "\0SP", 3, MSG_NOSIGNAL), 3);
            close(fd);
        }
        lu_sleep_ms(300);
        const char *url = kind == 2 ? d.tcp_url : d.url;
        int64_t took;
        attnd_err rv = fresh_client_within(url, 15000, &took);
        cr_assert_eq(rv, ATTND_ERR_OK, "after %s: no new client served on %s for 15 s", kinds[kind],
                     url);
        fprintf(stderr, "listen: after %s: a fresh client served after %lld ms\n", kinds[kind],
                (long long)took);
        if (kind != 2) long_lived_still_served(keep, kinds[kind]);
    }
    attnd_client_free(keep);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
