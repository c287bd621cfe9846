/* The NNG REQ socket transport (transport.h): the socket, its dialer (TLS included), one REQ
 * context per call in flight (so threads can share the socket), and the lost connection: once
 * the daemon's end drops, calls in flight fail at once and every later one too. */
#ifndef ATTND_CLIENT_SOCKET_TRANSPORT_H
#define ATTND_CLIENT_SOCKET_TRANSPORT_H

#include <stddef.h>

#include "transport.h"

typedef struct attnd_client_socket attnd_client_socket;

/* Called once the daemon's end of the connection drops (on an NNG thread; never after the
 * socket is freed): the owner releases what waits on the daemon outside a call (stream.c). */
typedef void (*attnd_client_socket_lost_cb)(void *arg);

/* Open a REQ socket that never resends a request and takes replies of any size; lost (may be
 * NULL) is called with arg when the connection drops. The NNG error mapped
 * (attnd_err_from_nng), or NO_MEMORY. */
attnd_err attnd_client_socket_alloc(attnd_client_socket **s, attnd_client_socket_lost_cb lost,
                                    void *arg);
/* Dial url (synchronous). ca_file / server_name ("" = none) for tls+tcp:// URLs, where a CA is
 * required. On failure err says why (without the URL): the NNG error mapped, or
 * INVALID_ARGUMENT for TLS settings. */
attnd_err attnd_client_socket_dial(attnd_client_socket *s, const char *url, const char *ca_file,
                                   const char *server_name, char *err, size_t errlen);

/* The socket as a transport (self: an attnd_client_socket). It carries every request; active
 * until the connection is lost; free closes the socket. */
extern const attnd_client_transport_ops attnd_client_socket_transport;

#endif
