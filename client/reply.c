/* Replies and errors: decoding a reply for its request, the last error (the daemon's message or
 * the client's own) and the request names messages start with. */
#include <stdarg.h>
#include <string.h>

#include "client_int.h"

static void set_error(attnd_client *c, const char *msg, int remote)
{
    pthread_mutex_lock(&c->mu);
    attnd_client_copy_str(c->last_error, sizeof c->last_error, msg);
    c->last_remote = remote;
    pthread_mutex_unlock(&c->mu);
}

attnd_err attnd_client_fail(attnd_client *c, attnd_err err, const char *fmt, ...)
{
    char msg[sizeof c->last_error];
    va_list ap;
    va_start(ap, fmt);
    attnd_verrf(msg, sizeof msg, err, fmt, ap);
    va_end(ap);
    set_error(c, msg, 0);
    return err;
}

attnd_err attnd_client_fail_lost(attnd_client *c, const Attnd__Request *req)
{
    return attnd_client_fail(
        c, ATTND_ERR_UNAVAILABLE, "%s: connection to the daemon lost (session %llu is gone)",
        attnd_client_body_name(req->body_case), (unsigned long long)c->session);
}

void attnd_client_error_save(attnd_client *c, attnd_client_error *e)
{
    pthread_mutex_lock(&c->mu);
    attnd_client_copy_str(e->message, sizeof e->message, c->last_error);
    e->remote = c->last_remote;
    pthread_mutex_unlock(&c->mu);
}

void attnd_client_error_restore(attnd_client *c, const attnd_client_error *e)
{
    set_error(c, e->message, e->remote);
}

const char *attnd_client_last_error(const attnd_client *c)
{
    return c->last_error;
}

int attnd_client_last_error_remote(const attnd_client *c)
{
    attnd_client *m = (attnd_client *)c; /* the lock is not part of the logical state */
    int remote;
    pthread_mutex_lock(&m->mu);
    remote = c->last_remote;
    pthread_mutex_unlock(&m->mu);
    return remote;
}

size_t attnd_client_last_error_copy(const attnd_client *c, char *buf, size_t len)
{
    attnd_client *m = (attnd_client *)c; /* the lock is not part of the logical state */
    size_t n;
    pthread_mutex_lock(&m->mu);
    n = strlen(c->last_error);
    if (len > 0) attnd_client_copy_str(buf, len, c->last_error);
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* Decode a reply and turn an error reply into its code and message. */
attnd_err attnd_client_decode(attnd_client *c, const Attnd__Request *req, const void *buf,
                              size_t len, Attnd__Reply **out)
{
    Attnd__Reply *rep = attnd__reply__unpack(NULL, len, buf);
    const char *what = attnd_client_body_name(req->body_case);
    attnd_err code;
    if (rep == NULL)
        return attnd_client_fail(c, ATTND_ERR_PROTOCOL, "%s: reply of %zu bytes does not decode",
                                 what, len);
    if (rep->id != req->id) {
        code = attnd_client_fail(c, ATTND_ERR_PROTOCOL, "%s: reply id %llu for request %llu", what,
                                 (unsigned long long)rep->id, (unsigned long long)req->id);
        attnd__reply__free_unpacked(rep, NULL);
        return code;
    }
    if (rep->code != 0) {
        code = (attnd_err)rep->code;
        if (rep->message != NULL && rep->message[0] != '\0')
            set_error(c, rep->message, 1);
        else
            set_error(c, attnd_strerror(code), 1);
        attnd__reply__free_unpacked(rep, NULL);
        return code;
    }
    *out = rep;
    return ATTND_ERR_OK;
}
const char *attnd_client_body_name(Attnd__Request__BodyCase k)
{
    switch (k) {
    case ATTND__REQUEST__BODY_HELLO:
        return "hello";
    case ATTND__REQUEST__BODY_REGISTER_REGION:
        return "register_region";
    case ATTND__REQUEST__BODY_UNREGISTER_REGION:
        return "unregister_region";
    case ATTND__REQUEST__BODY_CREATE:
        return "create";
    case ATTND__REQUEST__BODY_FORK:
        return "fork";
    case ATTND__REQUEST__BODY_FREE:
        return "free";
    case ATTND__REQUEST__BODY_TRUNCATE:
        return "truncate";
    case ATTND__REQUEST__BODY_QUERY:
        return "query";
    case ATTND__REQUEST__BODY_LIST:
        return "list";
    case ATTND__REQUEST__BODY_BEGIN_STEP:
        return "begin_step";
    case ATTND__REQUEST__BODY_ATTEND:
        return "attend";
    case ATTND__REQUEST__BODY_END_STEP:
        return "end_step";
    case ATTND__REQUEST__BODY_MERGE:
        return "merge";
    case ATTND__REQUEST__BODY_VARLEN:
        return "varlen";
    case ATTND__REQUEST__BODY_BLOCKSPARSE:
        return "blocksparse";
    case ATTND__REQUEST__BODY_LINEAR_PREFILL:
        return "linear_prefill";
    case ATTND__REQUEST__BODY_LINEAR_DECODE:
        return "linear_decode";
    case ATTND__REQUEST__BODY_STATUS:
        return "status";
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
        return "open_channel";
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
        return "close_channel";
    case ATTND__REQUEST__BODY_WAKE_CHANNEL:
        return "wake_channel";
    default:
        return "request";
    }
}
