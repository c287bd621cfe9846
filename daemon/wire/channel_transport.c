#include "channel_transport.h"

#include <stdio.h>
#include <stdlib.h>

/* One request taken from a channel slot, until its reply is written there. */
typedef struct chan_call {
    attnd_wire_call call; /* first: the wire's view of it */
    attnd_channels *cs;
    uint32_t channel, slot;
    int heap;  /* malloc'd (freed once answered), else on the poller's stack */
    void *big; /* the packed reply when it does not fit in small */
    uint8_t small[1024];
} chan_call;

static size_t chan_reply_cap(attnd_wire_call *c)
{
    chan_call *cc = (chan_call *)c;
    return attnd_channels_rep_bytes(cc->cs, cc->channel);
}

static void *chan_reply_buf(attnd_wire_call *c, size_t n)
{
    chan_call *cc = (chan_call *)c;
    if (n <= sizeof cc->small) return cc->small;
    return cc->big = malloc(n);
}

static void chan_end(chan_call *cc)
{
    attnd_wire_done(cc->call.wire);
    free(cc->big);
    if (cc->heap) free(cc);
}

static void chan_reply_send(attnd_wire_call *c, void *buf, size_t n)
{
    chan_call *cc = (chan_call *)c;
    if (attnd_channels_reply(cc->cs, cc->channel, cc->slot, buf, n) != ATTND_ERR_OK)
        ATTND_LOG(cc->call.wire->log, ATTND_LOG_DEBUG,
                  "event=channel_reply_lost channel=%u slot=%u", cc->channel, cc->slot);
    chan_end(cc);
}

static void chan_reply_drop(attnd_wire_call *c)
{
    chan_end((chan_call *)c);
}

/* no Hello travels in a channel: it is opened inside a session */
static const attnd_transport_ops channel_ops = {chan_reply_cap, chan_reply_buf, chan_reply_send,
                                                chan_reply_drop, NULL};

/* Why a channel may not carry req (NULL when it may): the socket's own business, or another
 * session's request. */
static const char *chan_refused(const Attnd__Request *req, const attnd_channel_req *cr, char *msg,
                                size_t n)
{
    switch (req->body_case) {
    case ATTND__REQUEST__BODY_HELLO:
    case ATTND__REQUEST__BODY_OPEN_CHANNEL:
    case ATTND__REQUEST__BODY_CLOSE_CHANNEL:
    case ATTND__REQUEST__BODY_WAKE_CHANNEL:
        snprintf(msg, n, "body: %u is served on the socket only", (unsigned)req->body_case);
        return msg;
    default:
        break;
    }
    if (req->session != cr->session) {
        snprintf(msg, n, "session: %llu is not the channel's (%llu)",
                 (unsigned long long)req->session, (unsigned long long)cr->session);
        return msg;
    }
    return NULL;
}

/* Decode one taken request and hand it up, or answer it with the reason it cannot be. */
static void chan_request(chan_call *cc, const attnd_channel_req *cr)
{
    char text[160];
    uint64_t id = 0;
    attnd_err code = ATTND_ERR_PROTOCOL;
    Attnd__Request *req;
    if (cr->bytes == NULL) {
        snprintf(text, sizeof text, "request: req_len %zu out of 1..req_bytes", cr->len);
        attnd_wire_fail(&cc->call, 0, ATTND_ERR_PROTOCOL, text);
        return;
    }
    if ((req = attnd_wire_decode_max(cr->bytes, cr->len, attnd_wire_max_elements(cc->call.wire),
                                     &id, &code, text, sizeof text)) == NULL) {
        attnd_wire_fail(&cc->call, id, code, text);
        return;
    }
    cc->call.req_type = attnd_metrics_req_from_field((uint32_t)req->body_case);
    const char *refused = chan_refused(req, cr, text, sizeof text);
    if (refused) {
        attnd__request__free_unpacked(req, NULL);
        attnd_wire_fail(&cc->call, id, ATTND_ERR_INVALID_ARGUMENT, refused);
        return;
    }
    attnd_wire_deliver(&cc->call, req, cr->pipe, 0);
}

typedef struct chan_poll_ctx {
    attnd_wire *w;
    attnd_channels *cs;
} chan_poll_ctx;

static void chan_taken_cb(void *arg, const attnd_channel_req *cr)
{
    chan_poll_ctx *p = arg;
    chan_call tmp, *cc = malloc(sizeof *cc);
    if (cc == NULL) cc = &tmp; /* answered at once: "out of memory" */
    cc->cs = p->cs;
    cc->channel = cr->channel;
    cc->slot = cr->slot;
    cc->heap = cc != &tmp;
    cc->big = NULL;
    attnd_wire_received(p->w, &cc->call, &channel_ops, cr->len);
    if (cc == &tmp)
        attnd_wire_fail(&cc->call, 0, ATTND_ERR_NO_MEMORY, "request: out of memory");
    else
        chan_request(cc, cr);
}

uint32_t attnd_channel_transport_poll(attnd_wire *w, attnd_channels *cs)
{
    chan_poll_ctx p = {w, cs};
    return attnd_channels_poll(cs, chan_taken_cb, &p);
}
