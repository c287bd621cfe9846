#include "attnd_nng_err.h"

#include <nng/nng.h>

attnd_err attnd_err_from_nng(int rv)
{
    switch (rv) {
    case 0:
        return ATTND_ERR_OK;
    case NNG_ETIMEDOUT:
        return ATTND_ERR_TIMEOUT;
    case NNG_ENOMEM:
        return ATTND_ERR_NO_MEMORY;
    case NNG_EADDRINVAL:
    case NNG_ENOTSUP:
    case NNG_EINVAL:
    case NNG_EMSGSIZE:
        return ATTND_ERR_INVALID_ARGUMENT;
    case NNG_ENOENT:
        return ATTND_ERR_NOT_FOUND;
    case NNG_EPERM:
        return ATTND_ERR_PERMISSION_DENIED;
    case NNG_EPROTO:
        return ATTND_ERR_PROTOCOL;
    default: /* NNG_EADDRINUSE, NNG_ECLOSED, NNG_ECONNREFUSED, ... */
        return ATTND_ERR_UNAVAILABLE;
    }
}
