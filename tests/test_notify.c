/* sd_notify: what the daemon sends to a service manager, read back from a datagram socket that
 * stands in for systemd's (path and abstract), the watchdog interval, and no-ops outside
 * systemd. Criterion runs each test in its own process, so setenv stays local to a test. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "obs/notify.h"

/* A bound datagram socket standing in for systemd's notify socket; sets NOTIFY_SOCKET. */
static int fake_manager(char *path, size_t cap, bool abstract)
{
    struct sockaddr_un sa;
    socklen_t len;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (abstract) {
        snprintf(path, cap, "@attnd-test-notify-%d", (int)getpid());
        memcpy(sa.sun_path + 1, path + 1, strlen(path) - 1);
    } else {
        snprintf(path, cap, "/tmp/attnd-test-notify-%d.sock", (int)getpid());
        unlink(path);
        memcpy(sa.sun_path, path, strlen(path));
    }
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, len), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    cr_assert_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
    return fd;
}

static void expect_datagram(int fd, const char *want)
{
    char buf[4200];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    cr_assert_gt(n, 0, "no notification arrived (want %s)", want);
    buf[n] = '\0';
    cr_assert_str_eq(buf, want);
}

Test(notify, outside_systemd_everything_is_a_no_op, .timeout = 120)
{
    attnd_notify n;
    unsetenv("NOTIFY_SOCKET");
    setenv("WATCHDOG_USEC", "1000000", 1);
    attnd_notify_init(&n);
    cr_assert_not(attnd_notify_enabled(&n));
    cr_assert_eq(attnd_notify_watchdog_usec(&n), 0);
    cr_assert_eq(attnd_notify_ready(&n, "serving"), ATTND_ERR_OK);
    cr_assert_eq(attnd_notify_watchdog(&n), ATTND_ERR_OK);
    cr_assert_eq(attnd_notify_stopping(&n, NULL), ATTND_ERR_OK);
}

static void lifecycle(bool abstract)
{
    char path[108];
    attnd_notify n;
    int fd = fake_manager(path, sizeof(path), abstract);
    attnd_notify_init(&n);
    cr_assert(attnd_notify_enabled(&n));
    cr_assert_eq(attnd_notify_ready(&n, "serving ipc:///run/attnd/attnd.sock"), ATTND_ERR_OK);
    expect_datagram(fd, "READY=1\nSTATUS=serving ipc:///run/attnd/attnd.sock");
    cr_assert_eq(attnd_notify_watchdog(&n), ATTND_ERR_OK);
    expect_datagram(fd, "WATCHDOG=1");
    cr_assert_eq(attnd_notify_reloading(&n, "reloading /etc/attnd/attnd.json"), ATTND_ERR_OK);
    expect_datagram(fd, "RELOADING=1\nSTATUS=reloading /etc/attnd/attnd.json");
    cr_assert_eq(attnd_notify_status(&n, "draining: 3 in flight\nsecond line dropped"),
                 ATTND_ERR_OK);
    expect_datagram(fd, "STATUS=draining: 3 in flight");
    cr_assert_eq(attnd_notify_stopping(&n, NULL), ATTND_ERR_OK);
    expect_datagram(fd, "STOPPING=1");
    close(fd);
    if (!abstract) unlink(path);
}

Test(notify, sends_the_lifecycle_to_a_path_socket, .timeout = 120)
{
    lifecycle(false);
}

Test(notify, sends_the_lifecycle_to_an_abstract_socket, .timeout = 120)
{
    lifecycle(true);
}

Test(notify, watchdog_interval_applies_to_this_process_only, .timeout = 120)
{
    char path[108], pid[32];
    attnd_notify n;
    int fd = fake_manager(path, sizeof(path), true);
    setenv("WATCHDOG_USEC", "2000000", 1);
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    attnd_notify_init(&n);
    cr_assert_eq(attnd_notify_watchdog_usec(&n), 2000000);
    snprintf(pid, sizeof(pid), "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    attnd_notify_init(&n);
    cr_assert_eq(attnd_notify_watchdog_usec(&n), 0, "the watchdog was meant for another pid");
    unsetenv("WATCHDOG_PID");
    setenv("WATCHDOG_USEC", "not a number", 1);
    attnd_notify_init(&n);
    cr_assert_eq(attnd_notify_watchdog_usec(&n), 0);
    close(fd);
}

Test(notify, a_missing_manager_is_unavailable, .timeout = 120)
{
    attnd_notify n;
    setenv("NOTIFY_SOCKET", "/tmp/attnd-test-notify-nobody-listens.sock", 1);
    unlink("/tmp/attnd-test-notify-nobody-listens.sock");
    attnd_notify_init(&n);
    cr_assert(attnd_notify_enabled(&n));
    cr_assert_eq(attnd_notify_ready(&n, NULL), ATTND_ERR_UNAVAILABLE);
}

Test(notify, oversized_messages_are_refused, .timeout = 120)
{
    char path[108];
    attnd_notify n;
    static char big[5000];
    int fd = fake_manager(path, sizeof(path), true);
    memset(big, 'x', sizeof(big) - 1);
    attnd_notify_init(&n);
    cr_assert_eq(attnd_notify_send(&n, big), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_notify_status(&n, big), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_notify_send(&n, "STATUS=small"), ATTND_ERR_OK);
    expect_datagram(fd, "STATUS=small");
    close(fd);
}
