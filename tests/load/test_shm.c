/* Shared-memory objects of clients killed before they registered them (issue 13, item 11): a
 * region or channel object exists from its creation until the daemon has mapped it and the
 * client drops its name; a client killed in between must leave nothing in /dev/shm once the
 * next client of the same user makes one. Real clients (attnd_shm_client, killed with SIGKILL)
 * against the real daemon. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loadutil.h"

#define SHM_CONFIG                                                                                 \
    "{\"backend\": \"cpu\", \"threads\": 1, \"server\": {\"listen\": \"@URL@\"},"                  \
    " \"geometry\": {\"num_layers\": 2, \"num_q_heads\": 8, \"num_kv_heads\": 2,"                  \
    " \"head_size\": 64, \"block_size\": 16, \"cache_dtype\": \"bf16\", \"num_blocks\": 256,"      \
    " \"max_blocks_per_seq\": 32},"                                                                \
    " \"log\": {\"level\": \"warn\", \"stats_interval_s\": 0}}"

/* Objects in /dev/shm that pid made (regions "attnd-<pid>-...", channels "attnd-ch-<pid>-..."). */
static int objects_of(pid_t pid)
{
    char region[32], channel[40];
    int n = 0;
    snprintf(region, sizeof region, "attnd-%d-", (int)pid);
    snprintf(channel, sizeof channel, "attnd-ch-%d-", (int)pid);
    DIR *dir = opendir("/dev/shm");
    cr_assert_not_null(dir, "no /dev/shm");
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += strncmp(e->d_name, region, strlen(region)) == 0 ||
             strncmp(e->d_name, channel, strlen(channel)) == 0;
    closedir(dir);
    return n;
}

/* Start the shm client in mode; returns its pid once it is connected. */
static pid_t start_shm_client(const attnd_daemon_proc *d, const char *mode)
{
    char line[64] = "";
    pid_t pid = lu_spawn("attnd_shm_client", d->url, mode, line, sizeof line);
    cr_assert(pid > 0 && strncmp(line, "ready", 5) == 0, "the shm client did not connect");
    return pid;
}

static void kill_and_reap(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status), "the shm client exited by itself (status %d)", status);
}

/* A client of this user makes a region and a channel of its own. */
static void next_client_makes_objects(const attnd_daemon_proc *d)
{
    attnd_client *c = attnd_daemon_connect(d, 10000);
    attnd_shm shm;
    cr_assert_not_null(c);
    cr_assert_eq(attnd_client_shm_create(c, 1 << 16, &shm), ATTND_ERR_OK, "%s",
                 attnd_client_last_error(c));
    cr_assert_eq(objects_of(getpid()), 0, "our own object is still named after it registered");
    cr_assert_eq(attnd_client_shm_destroy(c, &shm), ATTND_ERR_OK);
    attnd_client_free(c);
}

/* Killed for certain between create and Register: the daemon is stopped, so Register waits. */
Test(shm, a_client_killed_before_register_leaves_nothing, .timeout = 180)
{
    attnd_daemon_proc d;
    static const char *const modes[] = {"region", "channel"};
    pid_t victims[2];
    cr_assert_eq(attnd_daemon_start(&d, SHM_CONFIG), 0);
    for (int m = 0; m < 2; m++) {
        pid_t pid = start_shm_client(&d, modes[m]);
        cr_assert_eq(attnd_daemon_signal(&d, SIGSTOP), 0);
        int64_t end = lu_now_ms() + 20000;
        while (objects_of(pid) == 0 && lu_now_ms() < end)
            lu_sleep_ms(1);
        cr_assert_gt(objects_of(pid), 0, "%s: no object appeared", modes[m]);
        kill_and_reap(pid);
        cr_assert_eq(attnd_daemon_signal(&d, SIGCONT), 0);
        victims[m] = pid;
    }
    next_client_makes_objects(&d);
    for (int m = 0; m < 2; m++)
        cr_assert_eq(objects_of(victims[m]), 0, "a %s of a client killed before Register is left",
                     modes[m]);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* Killed at any moment while it makes and drops objects (the 60 kills). */
Test(shm, clients_killed_at_random_leave_nothing, .timeout = 240)
{
    attnd_daemon_proc d;
    enum { KILLS = 30 };
    pid_t victims[KILLS];
    int left = 0;
    cr_assert_eq(attnd_daemon_start(&d, SHM_CONFIG), 0);
    srand(1234);
    for (int i = 0; i < KILLS; i++) {
        victims[i] = start_shm_client(&d, "both");
        lu_sleep_ms(1 + rand() % 30);
        kill_and_reap(victims[i]);
        left += objects_of(victims[i]) > 0;
    }
    fprintf(stderr, "shm: %d of %d killed clients left objects before the next client\n", left,
            KILLS);
    next_client_makes_objects(&d);
    for (int i = 0; i < KILLS; i++)
        cr_assert_eq(objects_of(victims[i]), 0, "client %d (pid %d) left %d objects", i,
                     (int)victims[i], objects_of(victims[i]));
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}
