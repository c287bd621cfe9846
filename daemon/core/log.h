/* Logging: levelled key=value lines on stderr, one write per line (journald-friendly).
 *
 * The logger is an object the daemon owns (no global state); modules keep a pointer to it.
 * ATTND_LOG checks the level before any argument is formatted, so debug lines cost one load. */
#ifndef ATTND_CORE_LOG_H
#define ATTND_CORE_LOG_H

#include <stdatomic.h>
#include <stdio.h>

typedef enum attnd_log_level {
    ATTND_LOG_ERROR = 0,
    ATTND_LOG_WARN = 1,
    ATTND_LOG_INFO = 2,
    ATTND_LOG_DEBUG = 3,
} attnd_log_level;

typedef struct attnd_log {
    atomic_int level; /* changed live by SIGHUP from the loop thread, read everywhere */
    int journal;      /* stderr is journald's: prefix <N> priorities, no timestamp */
    FILE *out;
} attnd_log;

/* Log to out (stderr when NULL) at the given level; journald mode when JOURNAL_STREAM is set. */
void attnd_log_init(attnd_log *lg, attnd_log_level level, FILE *out);
void attnd_log_set_level(attnd_log *lg, attnd_log_level level);
int attnd_log_enabled(const attnd_log *lg, attnd_log_level level);
/* Write one line: "<time> level=<name> " then the formatted text (key=value pairs). */
void attnd_log_write(attnd_log *lg, attnd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "error", "warn", "info", "debug". */
const char *attnd_log_level_name(attnd_log_level level);

#define ATTND_LOG(lg, lvl, ...)                                                                    \
    do {                                                                                           \
        if (attnd_log_enabled((lg), (lvl))) attnd_log_write((lg), (lvl), __VA_ARGS__);             \
    } while (0)

#endif
