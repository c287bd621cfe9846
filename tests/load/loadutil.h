/* Helpers of the load and fault suites: the daemon's log (wait for a line, read a number), the
 * operator HTTP endpoint (a plain GET), raw requests over NNG (exact reply accounting), and a
 * step whose outputs are known in advance (V constant per sequence). */
#ifndef ATTND_TESTS_LOADUTIL_H
#define ATTND_TESTS_LOADUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "attnd.pb-c.h"
#include "attnd/client.h"
#include "daemon_proc.h"

/* A small CPU daemon on @URL@ with extra "server" keys (server_extra: `, "key": value...`). */
#define LU_SERVER_CONFIG(server_extra)                                                             \
    "{\"backend\": \"cpu\", \"threads\": 1,"                                                       \
    " \"server\": {\"listen\": \"@URL@\"" server_extra "},"                                        \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 32},"                                                                \
    " \"log\": {\"level\": \"info\", \"stats_interval_s\": 0}}"

/* Wait (at most timeout_ms) for a log line containing `needle`; 0 when found. */
int lu_log_wait(const attnd_daemon_proc *d, const char *needle, int timeout_ms);
/* How many log lines contain `needle`. */
int lu_log_count(const attnd_daemon_proc *d, const char *needle);
/* The unsigned number after "key=" in the last log line containing `event` (-1 if none). */
long long lu_log_value(const attnd_daemon_proc *d, const char *event, const char *key);

/* GET path on 127.0.0.1:port; returns the status code (0 on failure) and the body (malloc'd,
 * NUL-terminated) in *body when body is not NULL. */
int lu_http_get(uint16_t port, const char *path, char **body);
/* The value of a sample line ("name{labels}") in a Prometheus text; -1 when absent. */
double lu_metric(const char *text, const char *series);

/* Run $ATTND_BUILD_DIR/tests/load/<name> url [arg] with its stdout on a pipe and read its first
 * line into line (n bytes): the child's pid, or -1 when it could not start or wrote nothing. */
pid_t lu_spawn(const char *name, const char *url, const char *arg, char *line, size_t n);

/* A raw REQ socket dialed to url (recv timeout ms). 0 on success. */
int lu_raw_open(const char *url, int timeout_ms, uint32_t *sock_id);
void lu_raw_close(uint32_t sock_id);
/* Send req, wait for its reply (decoded into *out, free with attnd__reply__free_unpacked).
 * 0: a reply arrived; -1: the send failed (never accepted); -2: no reply in time. */
int lu_raw_call(uint32_t sock_id, const Attnd__Request *req, Attnd__Reply **out);

/* A plain AF_UNIX connection to the socket of an ipc:// url (no SP header sent): the fd, or
 * -1. With handshake, the SP header of a REQ peer is exchanged as NNG's ipc transport does. */
int lu_unix_connect(const char *url, int handshake);
/* Send req on such a connection (handshake done) as REQ request rid, framed as NNG's ipc
 * transport frames it: 0 sent, 1 would block (with MSG_DONTWAIT), -1 failed (closed). */
int lu_sp_send(int fd, uint32_t rid, const Attnd__Request *req, int dontwait);
/* Read and discard what fd has until the peer closes it (0) or timeout_ms passes (-1). */
int lu_drain_until_closed(int fd, int timeout_ms);

/* One step over one existing sequence: new tokens with V = value in every element; runs every
 * layer and checks each output element is value (softmax weights sum to one). 0 when correct;
 * otherwise -1 with the reason in why. */
int lu_step_const_v(attnd_client *c, uint64_t seq, uint32_t new_tokens, float value, char *why,
                    size_t n);

/* VmRSS of a process in KiB (-1 if unknown). */
long lu_rss_kib(pid_t pid);
/* VmHWM (peak RSS) of a process in KiB (-1 if unknown). */
long lu_hwm_kib(pid_t pid);
/* Microsecond sleep and a monotonic clock in ms. */
void lu_sleep_ms(int ms);
int64_t lu_now_ms(void);

#endif
