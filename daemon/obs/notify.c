#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef ATTND_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#define NOTIFY_MSG_MAX 4096

#ifndef ATTND_HAVE_LIBSYSTEMD
static uint64_t env_u64(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    if (v == NULL || *v == '\0') return 0;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') return 0;
    return (uint64_t)x;
}

static uint64_t watchdog_from_env(void)
{
    uint64_t pid = env_u64("WATCHDOG_PID");
    if (getenv("WATCHDOG_PID") != NULL && pid != (uint64_t)getpid()) return 0;
    return env_u64("WATCHDOG_USEC");
}
#endif

void attnd_notify_init(attnd_notify *n)
{
    const char *path = getenv("NOTIFY_SOCKET");
    memset(n, 0, sizeof(*n));
    if (path == NULL || *path == '\0' || strlen(path) >= sizeof(n->socket_path)) return;
    if (path[0] != '/' && path[0] != '@') return;
    strcpy(n->socket_path, path);
    n->enabled = true;
#ifdef ATTND_HAVE_LIBSYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0) n->watchdog_usec = usec;
#else
    n->watchdog_usec = watchdog_from_env();
#endif
}

bool attnd_notify_enabled(const attnd_notify *n)
{
    return n->enabled;
}

uint64_t attnd_notify_watchdog_usec(const attnd_notify *n)
{
    return n->enabled ? n->watchdog_usec : 0;
}

const char *attnd_notify_impl(void)
{
#ifdef ATTND_HAVE_LIBSYSTEMD
    return "libsystemd";
#else
    return "builtin";
#endif
}

#ifndef ATTND_HAVE_LIBSYSTEMD
/* One datagram to the notify socket, as sd_notify(3) documents the protocol. */
static attnd_err builtin_send(const char *path, const char *msg)
{
    struct sockaddr_un sa;
    socklen_t len;
    attnd_err rv = ATTND_ERR_OK;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    if (path[0] == '@') sa.sun_path[0] = '\0';
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ATTND_ERR_UNAVAILABLE;
    ssize_t n;
    do {
        n = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)strlen(msg)) rv = ATTND_ERR_UNAVAILABLE;
    close(fd);
    return rv;
}
#endif

attnd_err attnd_notify_send(attnd_notify *n, const char *msg)
{
    if (strlen(msg) > NOTIFY_MSG_MAX) return ATTND_ERR_INVALID_ARGUMENT;
    if (!n->enabled) return ATTND_ERR_OK;
#ifdef ATTND_HAVE_LIBSYSTEMD
    return sd_notify(0, msg) > 0 ? ATTND_ERR_OK : ATTND_ERR_UNAVAILABLE;
#else
    return builtin_send(n->socket_path, msg);
#endif
}

/* "<head>\nSTATUS=<status>" (or head alone), status cut at the first newline. */
static attnd_err send_with_status(attnd_notify *n, const char *head, const char *status)
{
    char msg[NOTIFY_MSG_MAX + 1];
    if (status == NULL) return attnd_notify_send(n, head);
    int len = (int)strcspn(status, "\n");
    int w = snprintf(msg, sizeof(msg), "%s%sSTATUS=%.*s", head, *head ? "\n" : "", len, status);
    if (w < 0 || w >= (int)sizeof(msg)) return ATTND_ERR_INVALID_ARGUMENT;
    return attnd_notify_send(n, msg);
}

attnd_err attnd_notify_ready(attnd_notify *n, const char *status)
{
    return send_with_status(n, "READY=1", status);
}

attnd_err attnd_notify_watchdog(attnd_notify *n)
{
    return attnd_notify_send(n, "WATCHDOG=1");
}

attnd_err attnd_notify_reloading(attnd_notify *n, const char *status)
{
    return send_with_status(n, "RELOADING=1", status);
}

attnd_err attnd_notify_stopping(attnd_notify *n, const char *status)
{
    return send_with_status(n, "STOPPING=1", status);
}

attnd_err attnd_notify_status(attnd_notify *n, const char *status)
{
    return send_with_status(n, "", status);
}
