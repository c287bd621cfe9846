/* A client to be killed while it makes shared-memory objects: connects to URL (no channel),
 * prints "ready" and then, until killed, creates and destroys regions (MODE "region"), opens
 * and closes channels ("channel"), or both in turn ("both"). test_shm kills it, some time while
 * an object exists but is not registered yet, and looks for what it left in /dev/shm. Exits 1
 * if a call fails.
 *   usage: attnd_shm_client URL MODE
 * A separate program (not a fork of the test) so the test's NNG threads never cross a fork. */
#include <stdio.h>
#include <string.h>

#include "attnd/client.h"

int main(int argc, char **argv)
{
    attnd_client_opts opts = {.name = "shm-client", .timeout_ms = 60000, .channel_slots = -1};
    attnd_client *c = NULL;
    attnd_shm shm;
    if (argc != 3) {
        fprintf(stderr, "usage: attnd_shm_client URL region|channel|both\n");
        return 2;
    }
    int regions = strcmp(argv[2], "channel") != 0, channels = strcmp(argv[2], "region") != 0;
    if (attnd_client_alloc(&c, &opts) != ATTND_ERR_OK ||
        attnd_client_connect(c, argv[1], NULL) != ATTND_ERR_OK)
        return 1;
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        if (regions && (attnd_client_shm_create(c, 1 << 16, &shm) != ATTND_ERR_OK ||
                        attnd_client_shm_destroy(c, &shm) != ATTND_ERR_OK))
            return 1;
        if (channels && (attnd_client_channel_open(c, 4) != ATTND_ERR_OK ||
                         attnd_client_channel_close(c) != ATTND_ERR_OK))
            return 1;
    }
}
