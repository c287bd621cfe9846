/* The shared-memory channel transport: the requests clients post in their channels
 * (channel.h) are decoded and handed up through the wire's handler like the socket's, and each
 * reply is packed into its slot's reply area. A channel carries every request but the socket's
 * own business (Hello, OpenChannel, CloseChannel, WakeChannel), and only for the session that
 * opened it. While the daemon drains, channels keep being served: a posted request was sent,
 * like one the socket received before the drain. Executor thread only. */
#ifndef ATTND_WIRE_CHANNEL_TRANSPORT_H
#define ATTND_WIRE_CHANNEL_TRANSPORT_H

#include <stdint.h>

#include "channel.h"
#include "wire.h"

/* Take the requests posted in cs's channels since the last poll and hand each up; returns how
 * many were taken (the executor's poller calls it every turn). */
uint32_t attnd_channel_transport_poll(attnd_wire *w, attnd_channels *cs);

#endif
