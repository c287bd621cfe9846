/* attnd: wires config, log, executor, the serving state, the wire (socket and channels),
 * observability and the loop together. Policy lives in the modules (core/ < obs/ < state/ <
 * wire/ < serve/); here only the order of construction and the small callbacks that connect
 * them. */
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/exec.h"
#include "core/log.h"
#include "core/loop.h"
#include "obs/observe.h"
#include "serve/dispatch.h"
#include "serve/serve.h"
#include "wire/socket.h"
#include "wire/wire.h"

#define TICK_MS 100

typedef struct daemon_ctx {
    const char *config_path;
    attnd_config cfg;
    attnd_log log;
    attnd_loop loop;
    attnd_exec *ex;
    attnd_serve *sv;
    attnd_wire wire;
    attnd_socket *sock;
    attnd_observe *obs;
    uint64_t ticks;
} daemon_ctx;

static const char *const backend_names[] = {"cpu", "cuda", "auto"};

/* ---------------------------------------------------------------- executor-side glue */

static void exec_sweep(void *sv, uint64_t v)
{
    (void)v;
    attnd_serve_sweep(sv);
}

/* Executor thread (which owns the cache): refresh the gauges /metrics and /status show. */
static void exec_gauges(void *arg, uint64_t v)
{
    daemon_ctx *d = arg;
    (void)v;
    attnd_serve_gauges(d->sv, d->obs);
}

static void exec_stats(void *sv, uint64_t v)
{
    (void)v;
    attnd_serve_log_stats(sv);
}

typedef struct live_update {
    attnd_serve *sv;
    attnd_config cfg;
} live_update;

static void exec_apply_live(void *arg, uint64_t v)
{
    live_update *u = arg;
    (void)v;
    attnd_serve_apply_live(u->sv, &u->cfg);
    free(u);
}

/* ---------------------------------------------------------------- loop hooks */

static void hook_drain(void *arg)
{
    daemon_ctx *d = arg;
    attnd_observe_drain(d->obs);
    attnd_socket_drain(d->sock);
}

static int hook_drained(void *arg)
{
    daemon_ctx *d = arg;
    return attnd_wire_busy(&d->wire) == 0 && attnd_exec_pending(d->ex) == 0;
}

static void hook_reload(void *arg)
{
    daemon_ctx *d = arg;
    attnd_config next;
    char err[512], restart[512];
    attnd_err rv = attnd_config_load_file(&next, d->config_path, err, sizeof err);
    if (rv != ATTND_ERR_OK) {
        ATTND_LOG(&d->log, ATTND_LOG_ERROR, "event=reload_failed code=%s err=\"%s\" kept=old",
                  attnd_err_name(rv), err);
        attnd_observe_reload(d->obs, rv, err);
        return;
    }
    int differ = attnd_config_apply_live(&d->cfg, &next, restart, sizeof restart);
    attnd_config_fini(&next); /* its geometry (layers included) is not applied: restart-only */
    attnd_log_set_level(&d->log, (attnd_log_level)d->cfg.log.level);
    live_update *u = malloc(sizeof *u);
    if (u != NULL) {
        u->sv = d->sv;
        u->cfg = d->cfg;
        if (attnd_exec_post(d->ex, exec_apply_live, u, 0) != ATTND_ERR_OK) free(u);
    }
    ATTND_LOG(&d->log, ATTND_LOG_INFO, "event=reload applied=live restart_needed=\"%s\"",
              differ ? restart : "");
    attnd_observe_reload(d->obs, ATTND_ERR_OK, NULL);
}

static void hook_tick(void *arg)
{
    daemon_ctx *d = arg;
    uint64_t every = (uint64_t)d->cfg.log.stats_interval_s * 1000 / TICK_MS;
    uint64_t replies, ok;
    d->ticks++;
    attnd_observe_tick(d->obs, attnd_exec_pending(d->ex));
    attnd_wire_counts(&d->wire, &replies, &ok);
    attnd_observe_serving(d->obs, attnd_wire_busy(&d->wire), replies);
    attnd_socket_tick(d->sock);
    attnd_exec_post(d->ex, exec_sweep, d->sv, 0);
    attnd_exec_post(d->ex, exec_gauges, d, 0);
    if (every && d->ticks % every == 0) attnd_exec_post(d->ex, exec_stats, d->sv, 0);
}

/* ---------------------------------------------------------------- startup */

/* The wire (socket, and channels through the executor's poller) in front of the handlers. */
static attnd_err start_wire(daemon_ctx *d, char *err, size_t n)
{
    attnd_wire_handler handler = attnd_dispatch_wire_handler(d->sv);
    attnd_wire_init(&d->wire, &handler, &d->log);
    attnd_wire_set_observe(&d->wire, d->obs);
    attnd_serve_attach(d->sv, &d->wire, d->cfg.server.spin_us);
    attnd_exec_poller poller = attnd_serve_poller(d->sv);
    attnd_exec_set_poller(d->ex, &poller, d->cfg.server.spin_us);
    return attnd_socket_alloc(&d->sock, &d->cfg, &d->wire, d->ex, &d->log, err, n);
}

static int start_modules(daemon_ctx *d)
{
    char err[512] = "";
    attnd_err rv;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    attnd_backend_opts bo = {(int32_t)d->cfg.threads, (int32_t)d->cfg.device};
    const char *be = backend_names[d->cfg.backend];
    rv = attnd_exec_alloc(&d->ex, be, &bo, d->cfg.server.queue_depth, &d->log);
    if (rv != ATTND_ERR_OK) {
        snprintf(err, sizeof err, "backend: cannot open \"%s\": %s", be, attnd_strerror(rv));
        goto fail;
    }
    /* cpu: the planner fills the worker threads; cuda: the SMs, counted by state/devmem */
    int32_t units = d->cfg.threads ? (int32_t)d->cfg.threads : (int32_t)(cores > 0 ? cores : 1);
    rv = attnd_serve_alloc(&d->sv, &d->cfg, attnd_exec_backend(d->ex), units, &d->log, err,
                           sizeof err);
    if (rv != ATTND_ERR_OK) goto fail;
    if ((rv = attnd_observe_alloc(&d->obs, &d->cfg, &d->log)) != ATTND_ERR_OK) goto fail;
    attnd_observe_set_memory(d->obs, d->sv->model.geo.num_blocks, d->sv->dm->device_name,
                             d->sv->dm->device_bytes);
    if ((rv = attnd_observe_start(d->obs, attnd_backend_name(attnd_exec_backend(d->ex)), err,
                                  sizeof err)) != ATTND_ERR_OK)
        goto fail;
    attnd_serve_set_observe(d->sv, d->obs);
    if ((rv = attnd_serve_open_shm(d->sv, &d->cfg, err, sizeof err)) != ATTND_ERR_OK) goto fail;
    if ((rv = start_wire(d, err, sizeof err)) != ATTND_ERR_OK) goto fail;
    if ((rv = attnd_exec_start(d->ex)) != ATTND_ERR_OK) {
        snprintf(err, sizeof err, "executor: cannot start its thread");
        goto fail;
    }
    attnd_socket_start(d->sock);
    return 0;
fail:
    ATTND_LOG(&d->log, ATTND_LOG_ERROR, "event=start_failed code=%s err=\"%s\"", attnd_err_name(rv),
              err);
    return -1;
}

static void stop_modules(daemon_ctx *d)
{
    /* the executor first: it may still send replies on the socket's contexts */
    if (d->ex) attnd_exec_stop(d->ex);
    attnd_socket_free(d->sock);
    attnd_serve_free(d->sv);
    attnd_exec_free(d->ex);
    attnd_observe_free(d->obs); /* last: the server and executor count into its metrics */
}

static int run(daemon_ctx *d)
{
    attnd_loop_hooks hooks = {d, hook_drain, hook_drained, hook_reload, hook_tick};
    attnd_err rv =
        attnd_loop_init(&d->loop, &hooks, TICK_MS, d->cfg.server.drain_timeout_ms, &d->log);
    if (rv != ATTND_ERR_OK) {
        ATTND_LOG(&d->log, ATTND_LOG_ERROR, "event=start_failed err=\"event loop: %s\"",
                  attnd_strerror(rv));
        return 1;
    }
    if (start_modules(d) != 0) {
        attnd_loop_fini(&d->loop);
        stop_modules(d);
        return 1;
    }
    ATTND_LOG(&d->log, ATTND_LOG_INFO,
              "event=ready version=%s backend=%s layers=%u blocks=%u listen=%s pid=%d",
              ATTND_VERSION_STRING, attnd_backend_name(attnd_exec_backend(d->ex)),
              d->cfg.geometry.num_layers, d->sv->model.geo.num_blocks, d->cfg.server.listen,
              (int)getpid());
    attnd_observe_ready(d->obs);
    int lrv = attnd_loop_run(&d->loop);
    stop_modules(d);
    ATTND_LOG(&d->log, ATTND_LOG_INFO, "event=exit loop_close=%d", lrv);
    return lrv == 0 ? 0 : 1;
}

/* The whole text for --help; the synopsis alone after a bad command line. */
static void usage(FILE *f, int full)
{
    fprintf(f, "usage: attnd --config FILE [--check-config]\n"
               "       attnd --version | --help\n");
    if (!full) {
        fprintf(f, "(attnd --help describes the options)\n");
        return;
    }
    fprintf(f,
            "\n"
            "attnd, an attention daemon: owns the paged KV cache of one model on one device and\n"
            "serves batched attention to engine workers over NNG (ipc://, tcp://, tls+tcp://) and\n"
            "same-host shared-memory channels.\n"
            "\n"
            "  -c, --config FILE   the JSON configuration (required): backend, device, server\n"
            "                      (listen URL, tcp, TLS, token), geometry, limits, http, log;\n"
            "                      every key is documented in attnd.schema.json (config/ in the\n"
            "                      sources, share/attnd/ when installed)\n"
            "  -k, --check-config  validate FILE, print \"attnd: FILE: ok\" and exit 0 (1 when it\n"
            "                      is invalid, with the key and the value that are wrong)\n"
            "  -v, --version       print the version and the protocol version, exit 0\n"
            "  -h, --help          this text\n"
            "\n"
            "Signals: SIGHUP re-reads FILE and applies its live keys (limits, server.token,\n"
            "log); SIGTERM or SIGINT drains (requests already accepted are answered, for at most\n"
            "server.drain_timeout_ms) and exits. Under systemd (Type=notify) it reports READY=1\n"
            "and watchdog pings through $NOTIFY_SOCKET. Logs go to stderr as key=value lines.\n"
            "Exit status: 0 after a stop, 1 when the configuration is invalid or start-up fails,\n"
            "2 for a bad command line.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"check-config", no_argument, NULL, 'k'},
                                         {"version", no_argument, NULL, 'v'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    daemon_ctx d;
    int check = 0, c;
    char err[512];
    memset(&d, 0, sizeof d);
    /* Stream channels queue waits on GPU streams; a kernel loaded lazily at its first launch
     * (CUDA 12+'s default) may wait for those streams to drain, which they never do until the
     * host answers: load every module when the context is made (before any CUDA call). */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    while ((c = getopt_long(argc, argv, "c:kvh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            d.config_path = optarg;
            break;
        case 'k':
            check = 1;
            break;
        case 'v':
            printf("attnd %s (protocol %d)\n", ATTND_VERSION_STRING, ATTND_PROTOCOL_VERSION);
            return 0;
        case 'h':
            usage(stdout, 1);
            return 0;
        default:
            usage(stderr, 0);
            return 2;
        }
    }
    if (d.config_path == NULL || optind != argc) {
        usage(stderr, 0);
        return 2;
    }
    attnd_err rv = attnd_config_load_file(&d.cfg, d.config_path, err, sizeof err);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "attnd: %s: %s\n", d.config_path, err);
        return 1;
    }
    if (check) {
        printf("attnd: %s: ok\n", d.config_path);
        attnd_config_fini(&d.cfg);
        return 0;
    }
    /* a client that goes away mid-write must not kill us; NNG reports it as an error */
    signal(SIGPIPE, SIG_IGN);
    attnd_log_init(&d.log, (attnd_log_level)d.cfg.log.level, NULL);
    int status = run(&d);
    attnd_config_fini(&d.cfg);
    return status;
}
