/* libattnd-client's environment against a real daemon: $ATTND_URL is what a NULL url dials
 * (else ATTND_CLIENT_DEFAULT_URL), $ATTND_TOKEN the Hello token when the options carry none or an
 * empty one; an explicit url or token wins; attnd_client_url names what was dialed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/client.h"
#include "daemon_proc.h"

#define TOKEN_CONFIG                                                                               \
    "{\"backend\": \"cpu\", \"threads\": 1,"                                                       \
    " \"server\": {\"listen\": \"@URL@\", \"token\": \"s3cret\"},"                                 \
    " \"geometry\": {\"num_layers\": 1, \"num_q_heads\": 2, \"num_kv_heads\": 1,"                  \
    " \"head_size\": 32, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 64,"       \
    " \"max_blocks_per_seq\": 16},"                                                                \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

/* Connect a fresh client (opts may be NULL) to url (NULL: the environment's). */
static attnd_err connect_with(const attnd_client_opts *opts, const char *url, char *dialed,
                              size_t n)
{
    attnd_client *c;
    attnd_server_info info;
    cr_assert_eq(attnd_client_alloc(&c, opts), ATTND_ERR_OK);
    attnd_err rv = attnd_client_connect(c, url, &info);
    if (rv == ATTND_ERR_OK) cr_assert_gt(info.session, 0);
    if (dialed != NULL) snprintf(dialed, n, "%s", attnd_client_url(c));
    attnd_client_free(c);
    return rv;
}

Test(client_env, the_url_comes_from_the_environment, .timeout = 60)
{
    attnd_daemon_proc d;
    char dialed[512];
    attnd_client *c;
    unsetenv("ATTND_TOKEN");
    cr_assert_eq(attnd_daemon_start(&d, ATTND_TEST_CONFIG_SMALL), 0);
    setenv("ATTND_URL", d.url, 1);
    cr_assert_str_eq(attnd_client_default_url(), d.url);
    cr_assert_eq(connect_with(NULL, NULL, dialed, sizeof dialed), ATTND_ERR_OK);
    cr_assert_str_eq(dialed, d.url);
    /* the ipc:// check of connect looks at the resolved URL: the channel opens */
    cr_assert_eq(attnd_client_alloc(&c, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_connect(c, NULL, NULL), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    cr_assert_eq(attnd_client_channel_active(c), 1, "%s", attnd_client_channel_error(c));
    attnd_client_free(c);
    /* an explicit url wins over the environment */
    setenv("ATTND_URL", "ipc:///tmp/attnd-env-test-nobody-listens.sock", 1);
    cr_assert_eq(connect_with(NULL, d.url, dialed, sizeof dialed), ATTND_ERR_OK);
    cr_assert_str_eq(dialed, d.url);
    /* a failed dial still names the URL it tried */
    cr_assert_eq(connect_with(NULL, NULL, dialed, sizeof dialed), ATTND_ERR_UNAVAILABLE);
    cr_assert_str_eq(dialed, "ipc:///tmp/attnd-env-test-nobody-listens.sock");
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

Test(client_env, unset_or_empty_url_is_the_default, .timeout = 30)
{
    attnd_client *c;
    unsetenv("ATTND_URL");
    cr_assert_str_eq(attnd_client_default_url(), ATTND_CLIENT_DEFAULT_URL);
    cr_assert_str_eq(ATTND_CLIENT_DEFAULT_URL, "ipc:///tmp/attnd.sock");
    setenv("ATTND_URL", "", 1);
    cr_assert_str_eq(attnd_client_default_url(), ATTND_CLIENT_DEFAULT_URL);
    cr_assert_eq(attnd_client_alloc(&c, NULL), ATTND_ERR_OK);
    cr_assert_str_eq(attnd_client_url(c), "");
    (void)attnd_client_dial(c, NULL); /* a daemon may or may not listen there */
    cr_assert_str_eq(attnd_client_url(c), ATTND_CLIENT_DEFAULT_URL);
    attnd_client_free(c);
}

Test(client_env, the_token_comes_from_the_environment, .timeout = 60)
{
    attnd_daemon_proc d;
    attnd_client_opts empty = {.token = ""}, wrong = {.token = "wr0ng"},
                      right = {.token = "s3cret"};
    /* daemon_proc's own Hello (opts NULL) finds the token in the environment */
    setenv("ATTND_TOKEN", "s3cret", 1);
    cr_assert_eq(attnd_daemon_start(&d, TOKEN_CONFIG), 0);
    unsetenv("ATTND_TOKEN");
    cr_assert_eq(connect_with(NULL, d.url, NULL, 0), ATTND_ERR_PERMISSION_DENIED);
    cr_assert_eq(connect_with(&right, d.url, NULL, 0), ATTND_ERR_OK);
    setenv("ATTND_TOKEN", "s3cret", 1);
    cr_assert_eq(connect_with(NULL, d.url, NULL, 0), ATTND_ERR_OK);
    cr_assert_eq(connect_with(&empty, d.url, NULL, 0), ATTND_ERR_OK);
    /* an explicit token wins over the environment */
    cr_assert_eq(connect_with(&wrong, d.url, NULL, 0), ATTND_ERR_PERMISSION_DENIED);
    setenv("ATTND_TOKEN", "", 1);
    cr_assert_eq(connect_with(NULL, d.url, NULL, 0), ATTND_ERR_PERMISSION_DENIED);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
