/* The same-host shared-memory channel (proto/attnd_channel.h has the layout and the protocols),
 * the client's side, as a transport (transport.h): its shm object, its slots, posting a request
 * and waiting for the reply, spinning first, then asleep on a futex. Registering the object with
 * the daemon (OpenChannel / CloseChannel) is its owner's business; the channel reaches back only
 * through the hooks it is given. */
#ifndef ATTND_CLIENT_CHANNEL_TRANSPORT_H
#define ATTND_CLIENT_CHANNEL_TRANSPORT_H

#include <stdint.h>

#include "attnd/client.h"
#include "transport.h"

typedef struct attnd_client_chan attnd_client_chan;

/* What a channel needs from its owner, called from within a call. */
typedef struct attnd_client_chan_hooks {
    void *arg;
    /* Tell the daemon to poll channel id again (WakeChannel); only a hint, its result unused. */
    void (*wake)(void *arg, uint32_t channel);
    /* 1 once the connection (and with it the session) is lost: a waiting call gives up. */
    int (*lost)(void *arg);
} attnd_client_chan_hooks;

/* How to make a channel. */
typedef struct attnd_client_chan_config {
    int32_t slots;   /* 0 = ATTND_CLIENT_DEFAULT_CHANNEL_SLOTS, else 1..ATTND_CHANNEL_MAX_SLOTS */
    int32_t spin_us; /* as attnd_client_opts.spin_us */
    const attnd_limits *limits; /* the session's: they size the slots */
    int64_t shm_gid;            /* the object's group (attnd_client_shm_group) */
    attnd_client_chan_hooks hooks;
} attnd_client_chan_config;

/* Make a channel's object (mapped, header written, name still linked; not active yet). On
 * failure nothing is left and err says why: INVALID_ARGUMENT (slots), NO_MEMORY / INTERNAL (the
 * system call is named). */
attnd_err attnd_client_chan_alloc(attnd_client_chan **ch, const attnd_client_chan_config *cfg,
                                  char *err, size_t errlen);
/* The object's shm name and size, for OpenChannel. */
const char *attnd_client_chan_shm_name(const attnd_client_chan *ch);
uint64_t attnd_client_chan_size(const attnd_client_chan *ch);
/* Drop the object's name once the daemon mapped it (or refused it). */
void attnd_client_chan_unlink(attnd_client_chan *ch);
/* The daemon registered it as channel id: requests may go through it from now on. */
void attnd_client_chan_start(attnd_client_chan *ch, uint32_t id);
/* The daemon's id of the channel. */
uint32_t attnd_client_chan_id(const attnd_client_chan *ch);

/* The channel as a transport (self: an attnd_client_chan). It carries the per-step and
 * per-layer requests without INLINE outputs when they fit a slot and a slot is free, and
 * declines the rest; active until the daemon closes it. */
extern const attnd_client_transport_ops attnd_client_chan_transport;

#endif
