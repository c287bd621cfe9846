/* NNG failures in attnd's error space: the one mapping the daemon and the client share. */
#ifndef ATTND_PROTO_NNG_ERR_H
#define ATTND_PROTO_NNG_ERR_H

#include "attnd/err.h"

/* An nng_err value (0 = OK) as an attnd_err: timeouts TIMEOUT, bad addresses and arguments
 * INVALID_ARGUMENT, an address in use or a broken connection UNAVAILABLE. */
attnd_err attnd_err_from_nng(int rv);

#endif
