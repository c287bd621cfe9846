/* attnd error codes: one space for kernels, daemon and client.
 * Generated from one X-macro list so codes, names and messages cannot drift. */
#ifndef ATTND_ERR_H
#define ATTND_ERR_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XX(name, value, message). Values are stable: they travel on the wire. */
#define ATTND_ERR_MAP(XX)                                                        \
    XX(OK, 0, "ok")                                                              \
    XX(INVALID_ARGUMENT, 1, "invalid argument")                                  \
    XX(NOT_FOUND, 2, "not found")                                                \
    XX(ALREADY_EXISTS, 3, "already exists")                                      \
    XX(OUT_OF_BLOCKS, 4, "out of cache blocks")                                  \
    XX(NO_MEMORY, 5, "out of memory")                                            \
    XX(UNAVAILABLE, 6, "unavailable")                                            \
    XX(UNSUPPORTED, 7, "unsupported")                                            \
    XX(PERMISSION_DENIED, 8, "permission denied")                                \
    XX(TIMEOUT, 9, "timed out")                                                  \
    XX(PROTOCOL, 10, "protocol error")                                           \
    XX(INTERNAL, 11, "internal error")                                           \
    XX(FAILED_PRECONDITION, 12, "failed precondition")

typedef enum attnd_err {
#define ATTND_ERR_ENUM(name, value, msg) ATTND_ERR_##name = value,
    ATTND_ERR_MAP(ATTND_ERR_ENUM)
#undef ATTND_ERR_ENUM
} attnd_err;

/* Human-readable message for a code ("unknown error" for values outside the list). */
const char *attnd_strerror(attnd_err err);

/* Stable upper-case name of a code ("INVALID_ARGUMENT"); "UNKNOWN" otherwise. */
const char *attnd_err_name(attnd_err err);

/* printf into a caller's message buffer (nothing when buf is NULL or n is 0); returns code, so
 * that `return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "x: %d", v);` fails in one line. */
attnd_err attnd_errf(char *buf, size_t n, attnd_err code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The same for a va_list (for wrappers that take their own format). */
attnd_err attnd_verrf(char *buf, size_t n, attnd_err code, const char *fmt, va_list ap);

#ifdef __cplusplus
}
#endif
#endif
