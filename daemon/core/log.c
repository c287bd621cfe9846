#include "log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};
/* syslog priorities that journald reads from a "<N>" line prefix */
static const int journal_prio[] = {3, 4, 6, 7};

void attnd_log_init(attnd_log *lg, attnd_log_level level, FILE *out)
{
    atomic_init(&lg->level, (int)level);
    lg->out = out ? out : stderr;
    /* systemd sets JOURNAL_STREAM when stderr is connected to the journal */
    lg->journal = (out == NULL && getenv("JOURNAL_STREAM") != NULL);
}

void attnd_log_set_level(attnd_log *lg, attnd_log_level level)
{
    atomic_store_explicit(&lg->level, (int)level, memory_order_relaxed);
}

int attnd_log_enabled(const attnd_log *lg, attnd_log_level level)
{
    return lg != NULL &&
           (int)level <= atomic_load_explicit(&((attnd_log *)lg)->level, memory_order_relaxed);
}

const char *attnd_log_level_name(attnd_log_level level)
{
    return (unsigned)level <= ATTND_LOG_DEBUG ? level_names[level] : "?";
}

static size_t log_prefix(const attnd_log *lg, attnd_log_level level, char *buf, size_t n)
{
    if (lg->journal)
        return (size_t)snprintf(buf, n, "<%d>level=%s ", journal_prio[level], level_names[level]);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    k += (size_t)snprintf(buf + k, n - k, ".%03ldZ level=%s ", ts.tv_nsec / 1000000L,
                          level_names[level]);
    return k;
}

void attnd_log_write(attnd_log *lg, attnd_log_level level, const char *fmt, ...)
{
    /* One buffer, one fputs: lines from several threads never interleave. */
    char buf[1024];
    if ((unsigned)level > ATTND_LOG_DEBUG) level = ATTND_LOG_DEBUG;
    size_t k = log_prefix(lg, level, buf, sizeof buf);
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + k, sizeof buf - k - 1, fmt, ap);
    va_end(ap);
    if (w < 0) w = 0;
    k += (size_t)w < sizeof buf - k - 1 ? (size_t)w : sizeof buf - k - 2;
    /* newlines inside a message would split the record: flatten them */
    for (size_t i = 0; i < k; i++)
        if (buf[i] == '\n') buf[i] = ' ';
    buf[k++] = '\n';
    buf[k] = '\0';
    fputs(buf, lg->out);
    fflush(lg->out);
}
