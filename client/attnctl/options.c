/* attnctl option parsing: getopt_long with attnctl's error messages, numbers, dtypes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnctl.h"

int attnctl_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, cmd != NULL ? "attnctl: %s: " : "attnctl: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return ATTNCTL_USAGE;
}

int attnctl_getopt(const char *cmd, int argc, char **argv, const char *shortopts,
                   const struct option *longopts)
{
    int c;
    opterr = 0; /* the messages are ours */
    c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != ':' && c != '?') return c;
    /* getopt has stepped past the word in error, except inside a cluster of short options */
    const char *word = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    if (c == ':')
        attnctl_usage_error(cmd, "%s needs a value", word);
    else if (strncmp(word, "--", 2) == 0 && strchr(word, '=') != NULL && optopt != 0)
        attnctl_usage_error(cmd, "'%s': the option takes no value", word);
    else if (strncmp(word, "--", 2) == 0)
        attnctl_usage_error(cmd, "unknown or ambiguous option '%s' (attnctl --help)", word);
    else
        attnctl_usage_error(cmd, "unknown option '-%c' (attnctl --help)", optopt);
    return '?';
}

int attnctl_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (s == NULL || *s == '\0' || *s == '-' || *s == '+' || *s == ' ') return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0') return -1;
    *out = v;
    return 0;
}

int attnctl_opt_u32(const char *cmd, const char *opt, const char *val, uint32_t *out)
{
    uint64_t v;
    if (attnctl_parse_u64(val, &v) != 0)
        return attnctl_usage_error(cmd, "%s: '%s' is not a number (0 or more)", opt, val);
    if (v > UINT32_MAX) return attnctl_usage_error(cmd, "%s: %s is above %u", opt, val, UINT32_MAX);
    *out = (uint32_t)v;
    return ATTNCTL_OK;
}

int attnctl_parse_dtype(const char *s, attnd_dtype *out)
{
    if (strcmp(s, "float32") == 0) s = "f32";
    if (strcmp(s, "float16") == 0) s = "f16";
    if (strcmp(s, "bfloat16") == 0) s = "bf16";
    return attnd_dtype_parse(s, out);
}
