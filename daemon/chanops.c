#include "chanops.h"

#include "channel.h"

attnd_err attnd_chanops_open(attnd_ops *o, attnd_session *s, const Attnd__OpenChannel *m,
                             attnd_ops_reply *r)
{
    uint32_t id = 0;
    if (o->channels == NULL)
        return attnd_ops_fail(r, ATTND_ERR_UNAVAILABLE, "channels: not served by this daemon");
    attnd_err rv = attnd_channels_open(o->channels, s->id, s->pipe, m->shm_name ? m->shm_name : "",
                                       m->size, &id, r->msg, sizeof r->msg);
    if (rv != ATTND_ERR_OK) return (attnd_err)(r->reply.code = (uint32_t)rv);
    attnd__open_channel_reply__init(&r->channel);
    r->channel.channel = id;
    r->channel.spin_us = o->spin_us;
    r->reply.body_case = ATTND__REPLY__BODY_CHANNEL;
    r->reply.channel = &r->channel;
    return ATTND_ERR_OK;
}

/* OK when s has channel id open; else NOT_FOUND in r. */
static attnd_err chanops_find(attnd_ops *o, attnd_session *s, uint32_t id, attnd_ops_reply *r)
{
    if (o->channels == NULL)
        return attnd_ops_fail(r, ATTND_ERR_NOT_FOUND, "channel: %u not open in this session", id);
    attnd_err rv = attnd_channels_check(o->channels, s->id, id, r->msg, sizeof r->msg);
    return rv == ATTND_ERR_OK ? rv : (attnd_err)(r->reply.code = (uint32_t)rv);
}

attnd_err attnd_chanops_close(attnd_ops *o, attnd_session *s, const Attnd__CloseChannel *m,
                              attnd_ops_reply *r)
{
    attnd_err rv = chanops_find(o, s, m->channel, r);
    if (rv != ATTND_ERR_OK) return rv;
    attnd_ops_drain(o); /* replies still owed through it go out first */
    rv = attnd_channels_close(o->channels, s->id, m->channel, r->msg, sizeof r->msg);
    return rv == ATTND_ERR_OK ? rv : (attnd_err)(r->reply.code = (uint32_t)rv);
}

attnd_err attnd_chanops_wake(attnd_ops *o, attnd_session *s, const Attnd__WakeChannel *m,
                             attnd_ops_reply *r)
{
    return chanops_find(o, s, m->channel, r);
}

void attnd_chanops_session_gone(attnd_ops *o, attnd_session *s)
{
    if (o->channels == NULL) return;
    attnd_ops_drain(o);
    attnd_channels_close_session(o->channels, s->id);
}
