/* The client object: allocation with its socket, TLS settings, dialing, the per-call timeout,
 * what Hello left (server info, session) and region ids. */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "shm.h"

attnd_err attnd_client_alloc(attnd_client **cp, const attnd_client_opts *opts)
{
    attnd_client *c = calloc(1, sizeof *c);
    attnd_err rv;
    *cp = NULL;
    if (c == NULL) return ATTND_ERR_NO_MEMORY;
    pthread_mutex_init(&c->streams_mu, NULL);
    if ((rv = attnd_client_socket_alloc(&c->socket, attnd_client_streams_lost, c)) !=
        ATTND_ERR_OK) {
        pthread_mutex_destroy(&c->streams_mu);
        free(c);
        return rv;
    }
    c->shm_gid = -1;
    pthread_mutex_init(&c->mu, NULL);
    attnd_client_copy_str(c->name, sizeof c->name,
                          opts && opts->name ? opts->name : "attnd-client");
    /* an unset token falls back to $ATTND_TOKEN, as the URL to $ATTND_URL (attnd_client_dial) */
    attnd_client_copy_str(c->token, sizeof c->token,
                          opts && opts->token && opts->token[0] ? opts->token
                                                                : getenv("ATTND_TOKEN"));
    atomic_init(&c->timeout_ms, opts ? opts->timeout_ms : 0);
    c->channel_slots = opts ? opts->channel_slots : 0;
    c->spin_us = opts ? opts->spin_us : 0;
    atomic_init(&c->next_id, 1);
    atomic_init(&c->next_region, 1);
    *cp = c;
    return ATTND_ERR_OK;
}

void attnd_client_free(attnd_client *c)
{
    if (c == NULL) return;
    /* no CloseChannel: the daemon drops the channel with the connection, closed just below (a
     * round trip less, and no request the caller did not make) */
    attnd_client_channel_drop(c);
    attnd_client_socket_transport.free(c->socket);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->streams_mu);
    attnd_client_layers_free(&c->hello_layers);
    attnd_client_layers_free(&c->status_layers);
    attnd_client_expect_free(c);
    free(c);
}

attnd_err attnd_client_set_tls(attnd_client *c, const char *ca_file, const char *server_name)
{
    if ((ca_file && strlen(ca_file) >= sizeof c->tls_ca_file) ||
        (server_name && strlen(server_name) >= sizeof c->tls_server_name))
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "set_tls: path or name too long");
    attnd_client_copy_str(c->tls_ca_file, sizeof c->tls_ca_file, ca_file);
    attnd_client_copy_str(c->tls_server_name, sizeof c->tls_server_name, server_name);
    return ATTND_ERR_OK;
}

const char *attnd_client_default_url(void)
{
    const char *env = getenv("ATTND_URL");
    return env != NULL && env[0] != '\0' ? env : ATTND_CLIENT_DEFAULT_URL;
}

attnd_err attnd_client_dial(attnd_client *c, const char *url)
{
    char err[256];
    attnd_err rv;
    if (url == NULL) url = attnd_client_default_url();
    if (url[0] == '\0') return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "dial: empty url");
    if (c->dialed)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT, "dial %s: already dialed", url);
    if (strlen(url) >= sizeof c->url)
        return attnd_client_fail(c, ATTND_ERR_INVALID_ARGUMENT,
                                 "dial: url of %zu bytes is too long", strlen(url));
    attnd_client_copy_str(c->url, sizeof c->url, url);
    if ((rv = attnd_client_socket_dial(c->socket, url, c->tls_ca_file, c->tls_server_name, err,
                                       sizeof err)) != ATTND_ERR_OK)
        return attnd_client_fail(c, rv, "dial %s: %s", url, err);
    c->shm_gid = attnd_client_shm_group(url);
    c->dialed = 1;
    return ATTND_ERR_OK;
}

void attnd_client_set_timeout(attnd_client *c, int32_t timeout_ms)
{
    atomic_store(&c->timeout_ms, timeout_ms);
}

void attnd_client_set_spin(attnd_client *c, int32_t spin_us)
{
    c->spin_us = spin_us;
}

const attnd_server_info *attnd_client_server(const attnd_client *c)
{
    return c->have_server ? &c->server : NULL;
}

const char *attnd_client_url(const attnd_client *c)
{
    return c->url;
}

uint64_t attnd_client_session(const attnd_client *c)
{
    return c->session;
}

uint32_t attnd_client_region_next_id(attnd_client *c)
{
    return atomic_fetch_add(&c->next_region, 1);
}
