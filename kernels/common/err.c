#include "attnd/err.h"

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
