/* Run the real daemon in a test: $ATTND_BUILD_DIR/daemon/attnd --config <temp json>, listening
 * on a fresh ipc:// path under /tmp, its output in a log file shown when something fails. */
#ifndef ATTND_TESTS_DAEMON_PROC_H
#define ATTND_TESTS_DAEMON_PROC_H

#include <stddef.h>
#include <sys/types.h>

#include "attnd/client.h"

typedef struct attnd_daemon_proc {
    pid_t pid;
    char url[160];
    char tcp_url[64]; /* when the template asked for one (@TCP@) */
    char sock_path[128];
    char config_path[128];
    char log_path[128];
} attnd_daemon_proc;

/* A small CPU configuration: 2 layers, 8 q / 2 kv heads, head 64, block 16, bf16 cache. "@URL@"
 * is replaced by the daemon's listen URL. */
#define ATTND_TEST_CONFIG_SMALL                                                                    \
    "{\"backend\": \"cpu\", \"threads\": 2,"                                                       \
    " \"server\": {\"listen\": \"@URL@\"},"                                                        \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 512,"      \
    " \"max_blocks_per_seq\": 64},"                                                                \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

/* Write the configuration (every "@URL@" replaced by a fresh ipc:// URL, every "@TCP@" by
 * tcp://127.0.0.1:<a free port>), start the daemon and wait until it answers Hello on the ipc
 * URL (at most 20 s). 0 on success; -1 with the reason and the daemon's
 * log on stderr. */
int attnd_daemon_start(attnd_daemon_proc *d, const char *config_template);
/* SIGTERM, wait for the exit (at most 30 s, then SIGKILL), remove the files. Returns the exit
 * status (0 is a clean exit), 128 + signal when killed by one, -1 when it could not be reaped
 * or was reaped before (attnd_daemon_wait): then only the files are removed. */
int attnd_daemon_stop(attnd_daemon_proc *d);
/* Send a signal without waiting. */
int attnd_daemon_signal(const attnd_daemon_proc *d, int sig);
/* Wait for the exit (at most timeout_ms) and return as attnd_daemon_stop does; -2 on time out. */
int attnd_daemon_wait(attnd_daemon_proc *d, int timeout_ms);
/* Print the daemon's log to stderr (after a failure). */
void attnd_daemon_dump_log(const attnd_daemon_proc *d);

/* A client connected to d with a session (timeout_ms per call, 0 = default); NULL on failure
 * (the reason on stderr). */
attnd_client *attnd_daemon_connect(const attnd_daemon_proc *d, int32_t timeout_ms);
/* Same, to url, with the CA file tls+tcp:// needs (NULL otherwise). */
attnd_client *attnd_daemon_connect_url(const char *url, int32_t timeout_ms, const char *tls_ca);
/* A TCP port on 127.0.0.1 nobody listens on right now; -1 if none. */
int attnd_daemon_free_port(void);

#endif
