#include "attnd/err.h"

#include <stdarg.h>
#include <stdio.h>

const char *attnd_strerror(attnd_err err)
{
    switch (err) {
#define ATTND_ERR_MSG(name, value, msg)                                                            \
    case ATTND_ERR_##name:                                                                         \
        return msg;
        ATTND_ERR_MAP(ATTND_ERR_MSG)
#undef ATTND_ERR_MSG
    }
    return "unknown error";
}

const char *attnd_err_name(attnd_err err)
{
    switch (err) {
#define ATTND_ERR_STR(name, value, msg)                                                            \
    case ATTND_ERR_##name:                                                                         \
        return #name;
        ATTND_ERR_MAP(ATTND_ERR_STR)
#undef ATTND_ERR_STR
    }
    return "UNKNOWN";
}

attnd_err attnd_errf(char *buf, size_t n, attnd_err code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    attnd_verrf(buf, n, code, fmt, ap);
    va_end(ap);
    return code;
}

attnd_err attnd_verrf(char *buf, size_t n, attnd_err code, const char *fmt, va_list ap)
{
    if (buf != NULL && n > 0) vsnprintf(buf, n, fmt, ap);
    return code;
}
