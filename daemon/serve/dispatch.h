/* Dispatch: a decoded request to its handler (serve/handler.h tables), with the checks every
 * request shares in one place (known body, queue timeout, session, device health), the kernel
 * time of timed handlers, and one log line per request (errors rate limited). Also the handler
 * the wire is given: each request gets a reply that leaves now or when its kernels pass. */
#ifndef ATTND_SERVE_DISPATCH_H
#define ATTND_SERVE_DISPATCH_H

#include <stdint.h>

#include "../wire/wire.h"
#include "attnd.pb-c.h"
#include "reply.h"
#include "serve.h"

/* Handle one decoded request from connection pipe (0: the connection is already gone, so a
 * Hello opens no session that nothing would ever reclaim), queued for age_ms. r was
 * initialised (attnd_reply_init); its code and message are set on return, and r->wait.fence
 * when the reply must wait for kernels. */
void attnd_dispatch(attnd_serve *sv, const Attnd__Request *req, uint32_t pipe, uint64_t age_ms,
                    attnd_reply *r);
/* The wire's handler: requests dispatched and answered, connection drops to
 * attnd_serve_pipe_closed. */
attnd_wire_handler attnd_dispatch_wire_handler(attnd_serve *sv);

#endif
