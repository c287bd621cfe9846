#include "listen.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "attnd/clock.h"
#include "attnd_nng_err.h"

#define LISTEN_PROBE_TIMEOUT_MS 500 /* the listener's ADD_PRE after the probe's handshake */
#define LISTEN_PROBE_GIVEUP_MS 5000 /* a probe whose own handshake takes longer: unreachable */
#define LISTEN_MAX_RETIRED 8        /* replaced ipc listeners kept for their connections */
#define LISTEN_GEN_DIGITS 11        /* ".<generation>" */

typedef struct listen_pipe {
    uint32_t pipe, listener;
} listen_pipe;

struct attnd_listen {
    attnd_log *log;
    attnd_metrics *metrics;
    nng_socket sock;
    char key[32];
    char url[ATTND_CFG_URL_MAX];                            /* the public URL */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* ipc: the public path */
    int ipc, rebind;                 /* ipc; generations on private paths (else: recreate) */
    int mode;                        /* ipc: NNG_OPT_IPC_PERMISSIONS */
    gid_t gid;                       /* ipc: server.ipc_group, (gid_t)-1 = none */
    nng_tls_config *tls, *tls_probe; /* tls+tcp: the listener's and the probe's */
    int lock_fd;
    /* the current listener and the replaced ones still serving their connections */
    nng_listener cur;
    char cur_url[ATTND_CFG_URL_MAX + LISTEN_GEN_DIGITS];
    dev_t cur_dev;
    ino_t cur_ino;
    uint32_t gen;
    nng_listener retired[LISTEN_MAX_RETIRED];
    uint32_t nretired;
    atomic_uint cur_id, adds; /* ADD_PRE events on the current listener */
    pthread_mutex_t mu;       /* the live connections and their listeners (NNG threads) */
    listen_pipe *pipes;
    uint32_t npipes, pipes_cap;
    /* the watch: one probe at a time */
    uint32_t interval_ms, confirm;
    nng_socket probe;
    nng_dialer probe_d;
    atomic_uint probe_d_id;
    atomic_int probe_up; /* the probe's own side completed its handshake */
    int probing, reported;
    int lost; /* recreate failed: the URL has no listener of ours */
    uint32_t adds_at_start, fails;
    uint64_t start_ms, up_ms, next_ms; /* up_ms: the tick that first saw the handshake done */
};

/* ---------------------------------------------------------------- connections */

/* Room for one more connection (caller holds mu). */
static int listen_pipes_room(attnd_listen *l)
{
    if (l->npipes < l->pipes_cap) return 1;
    uint32_t cap = l->pipes_cap ? l->pipes_cap * 2 : 64;
    listen_pipe *np = realloc(l->pipes, (size_t)cap * sizeof *np);
    if (np == NULL) return 0;
    l->pipes = np;
    l->pipes_cap = cap;
    return 1;
}

void attnd_listen_pipe(attnd_listen *l, nng_pipe p, int added)
{
    uint32_t id = (uint32_t)nng_pipe_id(p), lid = (uint32_t)nng_listener_id(nng_pipe_listener(p));
    if (lid == 0 || lid == (uint32_t)-1) return; /* not accepted by a listener of ours */
    if (added && lid == atomic_load(&l->cur_id)) atomic_fetch_add(&l->adds, 1);
    pthread_mutex_lock(&l->mu);
    if (added && listen_pipes_room(l)) {
        l->pipes[l->npipes++] = (listen_pipe){id, lid};
    } else if (!added) {
        for (uint32_t i = 0; i < l->npipes; i++)
            if (l->pipes[i].pipe == id) {
                l->pipes[i] = l->pipes[--l->npipes];
                break;
            }
    }
    pthread_mutex_unlock(&l->mu);
}

/* Connections listener lid has. */
static uint32_t listen_live(attnd_listen *l, nng_listener ln)
{
    uint32_t lid = (uint32_t)nng_listener_id(ln), k = 0;
    pthread_mutex_lock(&l->mu);
    for (uint32_t i = 0; i < l->npipes; i++)
        k += l->pipes[i].listener == lid;
    pthread_mutex_unlock(&l->mu);
    return k;
}

/* ---------------------------------------------------------------- one listener */

/* A listener on url with the mode, TLS and group of this one, started; ipc's file complete
 * (mode, group) before the caller publishes it. */
static attnd_err listen_start(attnd_listen *l, const char *url, nng_listener *out, char *err,
                              size_t n)
{
    nng_listener ln;
    int rv = nng_listener_create(&ln, l->sock, url);
    if (rv == 0 && l->ipc) rv = nng_listener_set_int(ln, NNG_OPT_IPC_PERMISSIONS, l->mode);
    if (rv == 0 && l->tls) rv = nng_listener_set_ptr(ln, NNG_OPT_TLS_CONFIG, l->tls);
    if (rv == 0) rv = nng_listener_start(ln, 0);
    if (rv != 0) {
        if (nng_listener_id(ln) > 0) nng_listener_close(ln);
        return attnd_errf(err, n, attnd_err_from_nng(rv), "%s: cannot listen on %s: %s", l->key,
                          l->url, nng_strerror(rv));
    }
    if (l->ipc && l->gid != (gid_t)-1 && chown(url + 6, (uid_t)-1, l->gid) != 0) {
        nng_listener_close(ln);
        return attnd_errf(err, n, ATTND_ERR_PERMISSION_DENIED,
                          "server.ipc_group: cannot chown %s: %s", url + 6, strerror(errno));
    }
    *out = ln;
    return ATTND_ERR_OK;
}

/* The public path names private path priv from now on, atomically (never missing). */
static int listen_publish(attnd_listen *l, const char *priv)
{
    char tmp[sizeof l->path + 8];
    snprintf(tmp, sizeof tmp, "%s.lnk", l->path);
    (void)unlink(tmp);
    if (link(priv, tmp) != 0) return -1;
    if (rename(tmp, l->path) != 0) {
        (void)unlink(tmp);
        return -1;
    }
    return 0;
}

/* The next listener: on its private path, published (rebind), or on the URL itself. */
static attnd_err listen_generation(attnd_listen *l, nng_listener *out, char *err, size_t n)
{
    char url[sizeof l->cur_url];
    struct stat st;
    attnd_err rv;
    l->gen++;
    if (l->rebind) {
        snprintf(url, sizeof url, "%s.%u", l->url, l->gen);
        (void)unlink(url + 6); /* a crashed run's: ours by the lock */
    } else {
        snprintf(url, sizeof url, "%s", l->url);
    }
    if ((rv = listen_start(l, url, out, err, n)) != ATTND_ERR_OK) return rv;
    if (l->rebind && listen_publish(l, url + 6) != 0) {
        int e = errno;
        nng_listener_close(*out);
        return attnd_errf(err, n, ATTND_ERR_PERMISSION_DENIED, "%s: cannot link %s to %s: %s",
                          l->key, l->path, url + 6, strerror(e));
    }
    snprintf(l->cur_url, sizeof l->cur_url, "%s", url);
    if (l->ipc && stat(url + 6, &st) == 0) {
        l->cur_dev = st.st_dev;
        l->cur_ino = st.st_ino;
    }
    atomic_store(&l->adds, 0);
    atomic_store(&l->cur_id, (unsigned)nng_listener_id(*out));
    return ATTND_ERR_OK;
}

/* 1: the public path is the current listener's socket; 0: something else; -1: missing. tcp: 1. */
static int listen_name_ours(const attnd_listen *l)
{
    struct stat st;
    if (!l->ipc) return 1;
    if (stat(l->path, &st) != 0) return -1;
    return st.st_dev == l->cur_dev && st.st_ino == l->cur_ino;
}

/* ---------------------------------------------------------------- the lock (ipc) */

/* Listeners a crashed run left on private paths "<path>.<digits>": ours, by the lock. The
 * directory is read (no glob: the configured path may hold glob characters). */
static void listen_remove_generations(const attnd_listen *l)
{
    char dir[sizeof l->path], path[sizeof l->path + 260];
    const char *slash = strrchr(l->path, '/'), *base = slash ? slash + 1 : l->path;
    size_t blen = strlen(base);
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - l->path) : 1, slash ? l->path : ".");
    DIR *d = opendir(dir[0] ? dir : "/");
    if (d == NULL) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const char *tail = e->d_name + blen + 1;
        if (strncmp(e->d_name, base, blen) != 0 || e->d_name[blen] != '.' || *tail == '\0' ||
            strspn(tail, "0123456789") != strlen(tail))
            continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            (void)unlink(path);
    }
    closedir(d);
}

static attnd_err listen_lock(attnd_listen *l, char *err, size_t n)
{
    char lk[sizeof l->path + 8], holder[32] = "";
    snprintf(lk, sizeof lk, "%s.lock", l->path);
    if ((l->lock_fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        return attnd_errf(err, n, ATTND_ERR_PERMISSION_DENIED, "%s: cannot open %s: %s", l->key, lk,
                          strerror(errno));
    if (flock(l->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        ssize_t k = pread(l->lock_fd, holder, sizeof holder - 1, 0);
        holder[k > 0 ? k : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(l->lock_fd);
        l->lock_fd = -1;
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "%s: %s is in use by another attnd (pid %s holds %s)", l->key, l->url,
                          holder[0] ? holder : "?", lk);
    }
    int len = snprintf(holder, sizeof holder, "%ld\n", (long)getpid());
    if (ftruncate(l->lock_fd, 0) != 0 || pwrite(l->lock_fd, holder, (size_t)len, 0) != len)
        ATTND_LOG(l->log, ATTND_LOG_WARN, "event=lock_pid_unwritten path=%s", lk);
    listen_remove_generations(l);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- settings */

/* TLS configurations: the listener's (the configured certificate chain and key) and the
 * probe's (no peer authentication: it only checks that the listener accepts). */
static attnd_err listen_tls(attnd_listen *l, const attnd_cfg_server *c, char *err, size_t n)
{
    int rv = nng_tls_config_alloc(&l->tls, NNG_TLS_MODE_SERVER);
    if (rv == 0 && (rv = nng_tls_config_cert_key_file(l->tls, c->tls_cert_key_file, NULL)) != 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "server.tls_cert_key_file: %s: %s",
                          c->tls_cert_key_file, nng_strerror(rv));
    if (rv == 0 && nng_tls_config_alloc(&l->tls_probe, NNG_TLS_MODE_CLIENT) == 0 &&
        nng_tls_config_auth_mode(l->tls_probe, NNG_TLS_AUTH_MODE_NONE) != 0) {
        nng_tls_config_free(l->tls_probe);
        l->tls_probe = NULL; /* no watch for this one */
    }
    if (rv != 0)
        return attnd_errf(err, n, attnd_err_from_nng(rv), "%s: TLS: %s", l->key, nng_strerror(rv));
    return ATTND_ERR_OK;
}

static attnd_err listen_settings(attnd_listen *l, const attnd_cfg_server *c, char *err, size_t n)
{
    struct group gr, *res = NULL;
    char buf[4096];
    l->gid = (gid_t)-1;
    if (strncmp(l->url, "tls+tcp://", 10) == 0) return listen_tls(l, c, err, n);
    if (!l->ipc) return ATTND_ERR_OK;
    if (strlen(l->url + 6) >= sizeof l->path)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "%s: %s: path longer than %zu",
                          l->key, l->url, sizeof l->path - 1);
    snprintf(l->path, sizeof l->path, "%s", l->url + 6);
    /* generations need room for ".<n>" in a socket path; a longer one is recreated instead */
    l->rebind = strlen(l->path) + LISTEN_GEN_DIGITS < sizeof l->path;
    l->mode = (int)strtol(c->ipc_mode, NULL, 8);
    if (c->ipc_group[0] == '\0') return ATTND_ERR_OK;
    if (getgrnam_r(c->ipc_group, &gr, buf, sizeof buf, &res) != 0 || res == NULL)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "server.ipc_group: \"%s\" is not a group", c->ipc_group);
    l->gid = gr.gr_gid;
    return ATTND_ERR_OK;
}

/* NNG >= 1.6 carries the fix: nothing to watch. */
static int listen_nng_fixed(void)
{
    int major = 0, minor = 0;
    return sscanf(nng_version(), "%d.%d", &major, &minor) == 2 &&
           (major > 1 || (major == 1 && minor >= 6));
}

static void listen_probe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    attnd_listen *l = arg;
    if (ev == NNG_PIPE_EV_ADD_POST &&
        (uint32_t)nng_dialer_id(nng_pipe_dialer(p)) == atomic_load(&l->probe_d_id))
        atomic_store(&l->probe_up, 1);
}

/* The probe's socket (REQ: the REP socket's peer; it never sends), when the watch is on. */
static void listen_watch(attnd_listen *l, const attnd_cfg_server *c)
{
    const char *why = NULL;
    if (c->listener_check_ms == 0)
        why = "server.listener_check_ms is 0";
    else if (listen_nng_fixed())
        why = "this NNG accepts on (nanomsg/nng#1518 fixed in 1.6)";
    else if (strncmp(l->url, "tls+tcp://", 10) == 0 && l->tls_probe == NULL)
        why = "no TLS client configuration for the probe";
    else if (nng_req0_open(&l->probe) != 0 ||
             nng_pipe_notify(l->probe, NNG_PIPE_EV_ADD_POST, listen_probe_cb, l) != 0)
        why = "no probe socket";
    if (why == NULL) {
        l->interval_ms = c->listener_check_ms;
        l->confirm = l->rebind ? 1 : 2; /* recreating drops the listener's connections */
        l->next_ms = attnd_clock_ms() + l->interval_ms;
    }
    ATTND_LOG(l->log, ATTND_LOG_INFO,
              "event=listener_check url=%s state=%s interval_ms=%u nng=%s replace=%s%s%s%s", l->url,
              why ? "off" : "on", why ? 0 : l->interval_ms, nng_version(),
              l->rebind ? "rebind" : "recreate", why ? " reason=\"" : "", why ? why : "",
              why ? "\"" : "");
}

attnd_err attnd_listen_open(attnd_listen **out, nng_socket s, const char *key, const char *url,
                            const attnd_cfg_server *cfg, attnd_log *lg, attnd_metrics *metrics,
                            char *err, size_t n)
{
    attnd_err rv;
    attnd_listen *l = calloc(1, sizeof *l);
    *out = NULL;
    if (l == NULL) return ATTND_ERR_NO_MEMORY;
    l->log = lg;
    l->metrics = metrics;
    l->sock = s;
    l->lock_fd = -1;
    pthread_mutex_init(&l->mu, NULL);
    snprintf(l->key, sizeof l->key, "%s", key);
    snprintf(l->url, sizeof l->url, "%s", url);
    l->ipc = strncmp(url, "ipc://", 6) == 0;
    if ((rv = listen_settings(l, cfg, err, n)) != ATTND_ERR_OK ||
        (l->ipc && (rv = listen_lock(l, err, n)) != ATTND_ERR_OK) ||
        (rv = listen_generation(l, &l->cur, err, n)) != ATTND_ERR_OK) {
        attnd_listen_stop(l);
        attnd_listen_free(l);
        return rv;
    }
    ATTND_LOG(lg, ATTND_LOG_INFO, "event=listen url=%s", url);
    listen_watch(l, cfg);
    *out = l;
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- the watch */

/* The current listener is in the nng#1518 state: put a new one in its place. */
static void listen_replace(attnd_listen *l)
{
    nng_listener old = l->cur, fresh;
    char err[256];
    uint32_t live = listen_live(l, old);
    if (!l->rebind) nng_listener_close(old); /* the address is taken while it lives */
    if (listen_generation(l, &fresh, err, sizeof err) != ATTND_ERR_OK) {
        ATTND_LOG(l->log, ATTND_LOG_ERROR, "event=listener_replace_failed url=%s err=\"%s\"",
                  l->url, err);
        if (!l->rebind) l->lost = 1; /* nothing listens: tried again every interval */
        return;
    }
    if (l->rebind && live == 0) {
        nng_listener_close(old); /* nothing to keep; the connections parked in it drop */
    } else if (l->rebind) {
        if (l->nretired == LISTEN_MAX_RETIRED) { /* bounded: the oldest goes, with its clients */
            nng_listener_close(l->retired[0]);
            memmove(l->retired, l->retired + 1, --l->nretired * sizeof l->retired[0]);
        }
        l->retired[l->nretired++] = old;
    }
    ATTND_LOG(l->log, ATTND_LOG_WARN,
              "event=listener_replaced url=%s listener=%d new=%d now=%s connections=%u kept=%s "
              "reason=\"accepted nothing after a client closed before the SP handshake "
              "(nanomsg/nng#1518, NNG < 1.6)\"",
              l->url, nng_listener_id(old), nng_listener_id(fresh), l->cur_url, live,
              l->rebind ? "yes" : "no");
    if (l->metrics) attnd_metrics_event(l->metrics, ATTND_METRICS_EVENT_LISTENERS_REPLACED);
    l->cur = fresh;
    l->lost = 0;
}

/* Replaced listeners whose last connection ended go. */
static void listen_close_retired(attnd_listen *l)
{
    for (uint32_t i = 0; i < l->nretired;) {
        if (listen_live(l, l->retired[i]) == 0) {
            nng_listener_close(l->retired[i]);
            l->retired[i] = l->retired[--l->nretired];
        } else {
            i++;
        }
    }
}

/* Where the probe dials: the public name (ipc: name -> inode -> listener), a wildcard tcp host
 * replaced by loopback. */
static void listen_probe_url(const attnd_listen *l, char *url, size_t n)
{
    static const char *const wild[] = {"tcp://*:",     "tcp://:",     "tcp://0.0.0.0:",
                                       "tls+tcp://*:", "tls+tcp://:", "tls+tcp://0.0.0.0:"};
    for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++) {
        size_t k = strlen(wild[i]);
        if (strncmp(l->url, wild[i], k) == 0) {
            snprintf(url, n, "%s127.0.0.1:%s", wild[i][1] == 'l' ? "tls+tcp://" : "tcp://",
                     l->url + k);
            return;
        }
    }
    snprintf(url, n, "%s", l->url);
}

static void listen_probe_start(attnd_listen *l, uint64_t now)
{
    char url[sizeof l->url + 16];
    listen_probe_url(l, url, sizeof url);
    l->next_ms = now + l->interval_ms;
    l->adds_at_start = atomic_load(&l->adds);
    atomic_store(&l->probe_up, 0);
    if (nng_dialer_create(&l->probe_d, l->probe, url) != 0) return;
    if (l->tls_probe) nng_dialer_set_ptr(l->probe_d, NNG_OPT_TLS_CONFIG, l->tls_probe);
    atomic_store(&l->probe_d_id, (unsigned)nng_dialer_id(l->probe_d));
    if (nng_dialer_start(l->probe_d, NNG_FLAG_NONBLOCK) != 0) {
        nng_dialer_close(l->probe_d);
        return;
    }
    l->probing = 1;
    l->start_ms = now;
    l->up_ms = 0;
}

/* Log a state of the watch that is not the bug once, until it changes. */
static void listen_report(attnd_listen *l, int state, const char *what)
{
    if (l->reported == state) return;
    l->reported = state;
    ATTND_LOG(l->log, ATTND_LOG_WARN, "event=listener_check url=%s state=%s", l->url, what);
}

/* The probe's verdict: the listener took it (or any connection), or the bug's signature. */
static void listen_probe_judge(attnd_listen *l, uint64_t now)
{
    int healthy = atomic_load(&l->adds) != l->adds_at_start, up = atomic_load(&l->probe_up);
    /* the verdict waits LISTEN_PROBE_TIMEOUT_MS from the handshake, however late that came (a
     * loaded host): the server side normally adds the connection at the same moment */
    if (up && l->up_ms == 0) l->up_ms = now;
    if (!healthy && up && now - l->up_ms < LISTEN_PROBE_TIMEOUT_MS) return;
    if (!healthy && !up && now - l->start_ms < LISTEN_PROBE_GIVEUP_MS) return;
    nng_dialer_close(l->probe_d);
    l->probing = 0;
    if (healthy) {
        l->fails = 0;
        l->reported = 0;
    } else if (!up) {
        /* not even its own side got through: not this bug; a missing name is put back (link
         * never replaces an existing one), anything else is only reported */
        l->fails = 0;
        if (l->rebind && listen_name_ours(l) == -1 && link(l->cur_url + 6, l->path) == 0) {
            listen_report(l, 1, "name_missing action=relinked");
            l->next_ms = now;
        } else {
            listen_report(l, 2, "probe_unreachable action=none");
        }
    } else if (listen_name_ours(l) != 1) {
        l->fails = 0; /* another process answers on the name: never fight over it */
        listen_report(l, 3, "name_not_ours action=none");
    } else if (++l->fails >= l->confirm) {
        l->fails = 0;
        listen_replace(l);
        l->next_ms = now; /* check the new one at once */
    }
}

void attnd_listen_tick(attnd_listen *l, int draining)
{
    uint64_t now = attnd_clock_ms();
    if (l->nretired) listen_close_retired(l);
    if (l->interval_ms == 0) return;
    if (draining) {
        if (l->probing) nng_dialer_close(l->probe_d);
        l->probing = 0;
        return;
    }
    if (l->probing) {
        listen_probe_judge(l, now);
    } else if (now >= l->next_ms && l->lost) {
        char err[256];
        l->next_ms = now + l->interval_ms;
        if (listen_generation(l, &l->cur, err, sizeof err) == ATTND_ERR_OK) l->lost = 0;
    } else if (now >= l->next_ms) {
        listen_probe_start(l, now);
    }
}

void attnd_listen_stop(attnd_listen *l)
{
    if (l == NULL) return;
    if (l->probing) nng_dialer_close(l->probe_d);
    l->probing = 0;
    if (nng_socket_id(l->probe) > 0) nng_close(l->probe);
    l->interval_ms = 0;
}

void attnd_listen_free(attnd_listen *l)
{
    if (l == NULL) return;
    /* the socket closed its listeners (their private names); the public one, if still ours */
    if (l->rebind && l->lock_fd >= 0 && l->cur_ino != 0 && listen_name_ours(l) == 1)
        (void)unlink(l->path);
    if (l->lock_fd >= 0) close(l->lock_fd); /* last: a successor may start from here */
    if (l->tls) nng_tls_config_free(l->tls);
    if (l->tls_probe) nng_tls_config_free(l->tls_probe);
    pthread_mutex_destroy(&l->mu);
    free(l->pipes);
    free(l);
}
