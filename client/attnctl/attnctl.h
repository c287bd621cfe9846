/* attnctl internals: the shared state of one run, option parsing and the commands. */
#ifndef ATTND_ATTNCTL_ATTNCTL_H
#define ATTND_ATTNCTL_ATTNCTL_H

#include <getopt.h>
#include <stdint.h>

#include "attnd/client.h"
#include "attnd/clock.h"

/* Exit statuses. */
#define ATTNCTL_OK 0
#define ATTNCTL_FAILED 1 /* a request failed, or the daemon cannot do what was asked */
#define ATTNCTL_USAGE 2  /* bad command line */

/* One attnctl run: one connection, one session shared by all its commands. */
typedef struct attnctl {
    const char *url; /* -u; NULL = the library's default ($ATTND_URL, else its default) */
    attnd_client_opts opts;
    const char *tls_ca; /* -c / $ATTND_TLS_CA */
    attnd_client *c;
    int have_session;
    /* commands only parse their arguments (the pass before connecting: a bad command line
     * anywhere in a chain fails before anything is sent) */
    int check_only;
} attnctl;

/* A command: argv[0] is its name; returns an exit status. With ctl->check_only it parses its
 * arguments and returns. */
typedef int (*attnctl_cmd_fn)(attnctl *ctl, int argc, char **argv);

/* Open the session if not yet open; prints and returns ATTNCTL_FAILED on failure. */
int attnctl_session(attnctl *ctl);
/* Print "attnctl: <what>: <CODE>: <message>" and return ATTNCTL_FAILED. */
int attnctl_fail(attnctl *ctl, const char *what, attnd_err rv);
/* Print "attnctl: <cmd>: <message>" ("attnctl: <message>" when cmd is NULL) and return
 * ATTNCTL_USAGE. */
int attnctl_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* getopt_long over one command line (argv[0] its name; GNU permutation, so options may follow
 * the operands): the next option's val, -1 after the last (operands are then
 * argv[optind..argc)), or '?' once an error ("attnctl: <cmd>: --x needs a value", unknown
 * option, value given to a flag) is printed. Set optind = 0 before the first call. */
int attnctl_getopt(const char *cmd, int argc, char **argv, const char *shortopts,
                   const struct option *longopts);
/* Parse an unsigned integer (decimal or 0x hex); 0 on success, -1 otherwise. */
int attnctl_parse_u64(const char *s, uint64_t *out);
/* An option's value as a uint32_t: ATTNCTL_OK, or ATTNCTL_USAGE with
 * "attnctl: <cmd>: <opt>: 'x' is not a number ..." printed. */
int attnctl_opt_u32(const char *cmd, const char *opt, const char *val, uint32_t *out);
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
int attnctl_cmd_truncate(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_attend(attnctl *ctl, int argc, char **argv);
int attnctl_cmd_bench(attnctl *ctl, int argc, char **argv);

#endif
