/* Channel requests: OpenChannel, CloseChannel, WakeChannel, the session side of the
 * shared-memory channels (wire/channel.h). Served on the socket only. */
#include "handler.h"
#include "reply.h"
#include "serve.h"

static attnd_err req_open(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    const Attnd__OpenChannel *m = c->req->open_channel;
    uint32_t id = 0;
    if (sv->channels == NULL)
        return attnd_reply_fail(r, ATTND_ERR_UNAVAILABLE, "channels: not served by this daemon");
    attnd_err rv =
        attnd_channels_open(sv->channels, c->s->id, c->s->pipe, m->shm_name ? m->shm_name : "",
                            m->size, &id, r->msg, sizeof r->msg);
    if (rv != ATTND_ERR_OK) return attnd_reply_code(r, rv);
    attnd__open_channel_reply__init(&r->channel);
    r->channel.channel = id;
    r->channel.spin_us = sv->spin_us;
    r->reply.body_case = ATTND__REPLY__BODY_CHANNEL;
    r->reply.channel = &r->channel;
    return ATTND_ERR_OK;
}

/* OK when s has channel id open; else NOT_FOUND in r. */
static attnd_err channel_find(attnd_serve *sv, const attnd_session *s, uint32_t id, attnd_reply *r)
{
    if (sv->channels == NULL)
        return attnd_reply_fail(r, ATTND_ERR_NOT_FOUND, "channel: %u not open in this session", id);
    return attnd_reply_code(r,
                            attnd_channels_check(sv->channels, s->id, id, r->msg, sizeof r->msg));
}

static attnd_err req_close(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    uint32_t id = c->req->close_channel->channel;
    attnd_err rv = channel_find(sv, c->s, id, r);
    if (rv != ATTND_ERR_OK) return rv;
    attnd_inflight_drain(&sv->inflight); /* replies still owed through it go out first */
    return attnd_reply_code(
        r, attnd_channels_close(sv->channels, c->s->id, id, r->msg, sizeof r->msg));
}

/* Nothing to do but answer: handling it woke the executor, which polls its channels next. */
static attnd_err req_wake(attnd_serve *sv, const attnd_req_ctx *c, attnd_reply *r)
{
    return channel_find(sv, c->s, c->req->wake_channel->channel, r);
}

static const attnd_req_entry channel_entries[] = {
    {ATTND__REQUEST__BODY_OPEN_CHANNEL, "open_channel", req_open, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_CLOSE_CHANNEL, "close_channel", req_close, ATTND_REQ_SESSION},
    {ATTND__REQUEST__BODY_WAKE_CHANNEL, "wake_channel", req_wake, ATTND_REQ_SESSION},
};

const attnd_req_table attnd_req_channel = {channel_entries,
                                           sizeof channel_entries / sizeof channel_entries[0]};
