/* attnctl internals: the shared state of one run and the commands. */
#ifndef ATTND_ATTNCTL_ATTNCTL_H
#define ATTND_ATTNCTL_ATTNCTL_H

#include <stdint.h>

#include "attnd/client.h"
#include "attnd/clock.h"

/* Exit statuses. */
#define ATTNCTL_OK 0
#define ATTNCTL_FAILED 1 /* a request failed */
#define ATTNCTL_USAGE 2  /* bad command line */

/* One attnctl run: one connection, one session shared by all its commands. */
typedef struct attnctl {
    const char *url;
    attnd_client_opts opts;
    const char *tls_ca; /* -c / $ATTND_TLS_CA */
    attnd_client *c;
    int have_session;
} attnctl;

/* A command: argv[0] is its name; returns an exit status. */
typedef int (*attnctl_cmd_fn)(attnctl *ctl, int argc, char **argv);

/* Open the session if not yet open; prints and returns ATTNCTL_FAILED on failure. */
int attnctl_session(attnctl *ctl);
/* Print "attnctl: <what>: <CODE>: <message>" and return ATTNCTL_FAILED. */
int attnctl_fail(attnctl *ctl, const char *what, attnd_err rv);
/* Print "attnctl: <cmd>: <message>" and return ATTNCTL_USAGE. */
int attnctl_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Parse an unsigned integer argument (decimal or 0x hex); 0 on success, -1 otherwise. */
int attnctl_parse_u64(const char *s, uint64_t *out);
/* Parse a dtype name (f32, f16, bf16 as well as attnd_dtype_parse's names). */
int attnctl_parse_dtype(const char *s, attnd_dtype *out);
/* Monotonic time in seconds (attnd_clock_ns). */
static inline double attnctl_now(void)
{
    return (double)attnd_clock_ns() * 1e-9;
}

int attnctl_cmd_seqs(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_create(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_fork(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_free(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_query(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_attend(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_bench(attnctl *ctl, int argc, char **argv);

#endif
