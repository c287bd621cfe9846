/* Service manager notifications (systemd's sd_notify protocol): READY=1 once the request socket
 * listens and the cache is allocated, WATCHDOG=1 from a libuv timer, RELOADING=1 / READY=1
 * around a SIGHUP reload, STOPPING=1 when a SIGTERM drain starts, STATUS= lines for
 * `systemctl status`.
 *
 * Uses libsystemd's sd_notify() when the build found it (ATTND_HAVE_LIBSYSTEMD), else a built-in
 * sender of the same documented datagram protocol (a unix datagram to $NOTIFY_SOCKET, abstract
 * when it starts with '@'). Outside systemd ($NOTIFY_SOCKET unset) every call is a no-op that
 * returns OK, so the daemon calls them unconditionally.
 *
 * Wiring (daemon/main.c or loop.c): attnd_notify_init at start; attnd_notify_ready after the
 * server listens and the cache is allocated; if attnd_notify_watchdog_usec() > 0, a uv_timer
 * every half of it calling attnd_notify_watchdog (from the loop, so a wedged loop stops the
 * pings and systemd restarts the daemon); attnd_notify_stopping on SIGTERM.
 */
#ifndef ATTND_OBS_NOTIFY_H
#define ATTND_OBS_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_notify {
    bool enabled;           /* $NOTIFY_SOCKET was set */
    uint64_t watchdog_usec; /* 0 = no watchdog asked for */
    char socket_path[108];  /* sizeof(sun_path) */
} attnd_notify;

/* Read $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID (the watchdog applies only when
 * WATCHDOG_PID is unset or is this process). Leaves the environment as it is. */
void attnd_notify_init(attnd_notify *n);

/* Whether a service manager listens (NOTIFY_SOCKET set). */
bool attnd_notify_enabled(const attnd_notify *n);

/* The watchdog interval systemd asked for, in microseconds; 0 when none. Ping at half of it. */
uint64_t attnd_notify_watchdog_usec(const attnd_notify *n);

/* Send "READY=1" plus a STATUS= line (status may be NULL). */
attnd_err attnd_notify_ready(attnd_notify *n, const char *status);
/* Send "WATCHDOG=1". */
attnd_err attnd_notify_watchdog(attnd_notify *n);
/* Send "RELOADING=1" (status may be NULL). Follow with attnd_notify_ready when done. */
attnd_err attnd_notify_reloading(attnd_notify *n, const char *status);
/* Send "STOPPING=1" (status may be NULL). */
attnd_err attnd_notify_stopping(attnd_notify *n, const char *status);
/* Send a STATUS= line alone. */
attnd_err attnd_notify_status(attnd_notify *n, const char *status);

/* Send a raw notification ("KEY=value\n..."). UNAVAILABLE when the datagram could not be sent,
 * INVALID_ARGUMENT when the message is too long (over 4 KiB). */
attnd_err attnd_notify_send(attnd_notify *n, const char *msg);

/* Which implementation this build uses: "libsystemd" or "builtin". */
const char *attnd_notify_impl(void);

#endif
