/* attnctl: poke a running attnd daemon. Main, global options, the command table, connecting
 * (with a hint when nothing listens), status and info. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attnctl.h"

#define MAX_COMMANDS 256

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: attnctl [OPTIONS] COMMAND [ARGS] [+ COMMAND [ARGS]]...\n"
        "\n"
        "  -u, --url URL       daemon address: ipc://PATH, tcp://HOST:PORT or tls+tcp://HOST:PORT\n"
        "                      (default $ATTND_URL, else " ATTND_CLIENT_DEFAULT_URL ")\n"
        "  -t, --timeout MS    per-request timeout in ms: 0 = default (%d), -1 = none\n"
        "  -n, --name NAME     client name sent in Hello (default attnctl)\n"
        "  -k, --token TOKEN   shared token, when the daemon requires one (default $ATTND_TOKEN)\n"
        "  -c, --tls-ca FILE   tls+tcp://: CA certificate(s) the daemon's must be signed by\n"
        "                      (default $ATTND_TLS_CA)\n"
        "  -S, --socket-only   no shared-memory channel (opened on ipc:// otherwise)\n"
        "  -h, --help          this text\n"
        "  -V, --version       attnctl's version and protocol\n"
        "\n"
        "Commands run in order in one session, separated by a lone '+'. Sequences belong to\n"
        "the session: create, fork, attend and free them in one attnctl run. Every command\n"
        "line is checked before anything is sent.\n"
        "\n"
        "  status                      the daemon: version, backend, geometry, counters\n"
        "  info                        this session: Hello reply, geometry and limits\n"
        "  seqs                        this session's sequences\n"
        "  create ID...                create sequences\n"
        "  fork PARENT CHILD           fork a sequence (shared blocks, copy-on-write)\n"
        "  free ID...                  free sequences\n"
        "  truncate ID N               drop the last N tokens of a sequence\n"
        "  query ID                    one sequence\n"
        "  attend Q.npy K.npy V.npy OUT.npy [--seqs ID:N[,ID:N...]] [--layer L]\n"
        "         [--dtype f32|f16|bf16] [--lse LSE.npy] [--inline]\n"
        "                              one step: Q [T,q_heads,head], K/V [T,kv_heads,head];\n"
        "                              without --seqs a temporary sequence takes all T rows\n"
        "  bench [--seqs N] [--context L] [--steps S] [--layers L] [--dtype DT] [--inline]\n"
        "        [--clients C] [--warmup W] [--abort] [--json] [--progress]\n"
        "                              decode steps of N x 1 token after an L-token prefill:\n"
        "                              requests/s, latency percentiles per request kind\n"
        "                              (--json: one JSON object on stdout); the daemon's free\n"
        "                              blocks are checked first; a progress line on stderr\n"
        "                              during a long prefill when stderr is a terminal\n"
        "                              (--progress: always)\n"
        "\n"
        "Exit status: 0, 1 when a request failed or the daemon cannot do what was asked,\n"
        "2 for a bad command line.\n",
        ATTND_CLIENT_DEFAULT_TIMEOUT_MS);
}

int attnctl_fail(attnctl *ctl, const char *what, attnd_err rv)
{
    fprintf(stderr, "attnctl: %s: %s: %s\n", what, attnd_err_name(rv),
            ctl->c != NULL ? attnd_client_last_error(ctl->c) : attnd_strerror(rv));
    return ATTNCTL_FAILED;
}

int attnctl_session(attnctl *ctl)
{
    attnd_err rv;
    if (ctl->have_session) return ATTNCTL_OK;
    if ((rv = attnd_client_hello(ctl->c, NULL)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "hello", rv);
    /* as attnd_client_connect does; without one (refused, -S) the socket carries everything */
    if (strncmp(attnd_client_url(ctl->c), "ipc://", 6) == 0 && ctl->opts.channel_slots >= 0)
        (void)attnd_client_channel_open(ctl->c, 0);
    ctl->have_session = 1;
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- status, info */

/* One layer's options in a line: "window 4096, softcap 50, scale 0.0625, ALiBi, 64 sinks". */
static void describe_layer(const attnd_layer_opts *l, char *buf, size_t n)
{
    snprintf(buf, n, "window %u, softcap %g, scale %g, %s, %s sinks, k/v scales %g/%g",
             l->sliding_window, (double)l->softcap, (double)l->scale,
             l->alibi ? "ALiBi" : "no ALiBi", l->num_sinks ? "with" : "no", (double)l->k_scale,
             (double)l->v_scale);
}

/* Every layer's options: one line when they are all alike, else a line per layer. */
static void print_layers(const attnd_geometry *g)
{
    char first[256], cur[256];
    uint32_t same = 1;
    if (g->layers == NULL || g->num_layers == 0) return;
    describe_layer(&g->layers[0], first, sizeof first);
    for (uint32_t l = 1; l < g->num_layers && same; l++) {
        describe_layer(&g->layers[l], cur, sizeof cur);
        same = strcmp(cur, first) == 0 && g->layers[l].num_sinks == 0;
    }
    if (same && g->layers[0].num_sinks == 0) {
        printf("layers:       all %u: %s\n", g->num_layers, first);
    } else {
        for (uint32_t l = 0; l < g->num_layers; l++) {
            describe_layer(&g->layers[l], cur, sizeof cur);
            printf("layer %-6u  %s\n", l, cur);
        }
    }
    if (g->window_release)
        printf("windowed:     blocks more than %u tokens behind a sequence's end are released\n",
               g->window_release);
}

static void print_geometry(const attnd_geometry *g)
{
    printf("geometry:     %u layers, %u q heads, %u kv heads, head %u, block %u, cache %s\n",
           g->num_layers, g->num_q_heads, g->num_kv_heads, g->head_size, g->block_size,
           attnd_dtype_name(g->cache_dtype));
    printf("cache:        %u blocks, at most %u per sequence, scale %g\n", g->num_blocks,
           g->max_blocks_per_seq, (double)g->scale);
    print_layers(g);
    if (g->linear_slots > 0)
        printf("linear state: %u slots, %u heads, dim %u\n", g->linear_slots, g->linear_heads,
               g->linear_head_dim);
}

static int cmd_status(attnctl *ctl, int argc, char **argv)
{
    attnd_status st;
    attnd_err rv;
    int rc;
    (void)argv;
    if (argc != 1) return attnctl_usage_error("status", "takes no arguments");
    if (ctl->check_only) return ATTNCTL_OK;
    /* a daemon with a token answers Status only in a session that gave it ($ATTND_TOKEN too) */
    const char *token =
        ctl->opts.token && ctl->opts.token[0] ? ctl->opts.token : getenv("ATTND_TOKEN");
    if (token && token[0] && (rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    if ((rv = attnd_client_status(ctl->c, &st)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "status", rv);
    printf("daemon:       attnd %s, backend %s, up %.1f s\n", st.version, st.backend, st.uptime_s);
    print_geometry(&st.geometry);
    printf("blocks free:  %u of %u\n", st.blocks_free, st.geometry.num_blocks);
    printf("sessions:     %u, sequences %u\n", st.num_sessions, st.num_sequences);
    printf("requests:     %llu, errors %llu\n", (unsigned long long)st.requests,
           (unsigned long long)st.errors);
    printf("mps:          %s\n", st.mps == 1 ? "on" : st.mps == 0 ? "off" : "unknown");
    return ATTNCTL_OK;
}

static int cmd_info(attnctl *ctl, int argc, char **argv)
{
    const attnd_server_info *si;
    int rc;
    (void)argv;
    if (argc != 1) return attnctl_usage_error("info", "takes no arguments");
    if (ctl->check_only) return ATTNCTL_OK;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    si = attnd_client_server(ctl->c);
    printf("session:      %llu (protocol %u)\n", (unsigned long long)si->session,
           si->protocol_version);
    printf("daemon:       attnd %s, backend %s\n", si->version, si->backend);
    print_geometry(&si->geometry);
    printf("limits:       %u seqs, %u tokens per step, %u regions, %llu inline bytes, %u ms "
           "per request\n",
           si->limits.max_seqs, si->limits.max_step_tokens, si->limits.max_regions,
           (unsigned long long)si->limits.max_inline_bytes, si->limits.request_timeout_ms);
    printf("blocks free:  %u\n", si->blocks_free);
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- commands */

static const struct {
    const char *name;
    attnctl_cmd_fn fn;
} commands[] = {
    {"status", cmd_status},       {"info", cmd_info},
    {"seqs", attnctl_cmd_seqs},   {"create", attnctl_cmd_create},
    {"fork", attnctl_cmd_fork},   {"free", attnctl_cmd_free},
    {"query", attnctl_cmd_query}, {"attend", attnctl_cmd_attend},
    {"bench", attnctl_cmd_bench}, {"truncate", attnctl_cmd_truncate},
};

/* One command of the chain: its words (argv[argc] is NULL) and its function. */
typedef struct cmd_line {
    int argc;
    char **argv;
    attnctl_cmd_fn fn;
} cmd_line;

static attnctl_cmd_fn find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return commands[i].fn;
    return NULL;
}

/* Split the words at each lone '+' and look every command name up; the count, or -1 (printed). */
static int split_commands(int argc, char **argv, cmd_line *out)
{
    int start = 0, n = 0;
    for (int i = 0; i <= argc; i++) {
        if (i < argc && strcmp(argv[i], "+") != 0) continue;
        if (i == start) return attnctl_usage_error("+", "empty command"), -1;
        if (n == MAX_COMMANDS)
            return attnctl_usage_error("+", "more than %d commands", MAX_COMMANDS), -1;
        out[n].fn = find_command(argv[start]);
        if (out[n].fn == NULL)
            return attnctl_usage_error(argv[start], "unknown command (attnctl --help lists them)"),
                   -1;
        out[n].argc = i - start;
        out[n].argv = argv + start;
        if (i < argc) argv[i] = NULL;
        n++;
        start = i + 1;
    }
    return n;
}

static int run_commands(attnctl *ctl, cmd_line *cmds, int n)
{
    int rc;
    for (int i = 0; i < n; i++) {
        optind = 0; /* a fresh getopt scan per command (and per pass) */
        if ((rc = cmds[i].fn(ctl, cmds[i].argc, cmds[i].argv)) != ATTNCTL_OK) return rc;
    }
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- connecting */

/* Why a dial failed, in the words of the one who has to fix it. */
static void connect_hint(const attnctl *ctl, attnd_err rv)
{
    const char *url = attnd_client_url(ctl->c), *env = getenv("ATTND_URL");
    const char *from = ctl->url != NULL                ? "given by -u"
                       : env != NULL && env[0] != '\0' ? "from $ATTND_URL"
                                                       : "the default";
    int ipc = strncmp(url, "ipc://", 6) == 0;
    struct stat st;
    if (rv == ATTND_ERR_PERMISSION_DENIED && ipc) {
        fprintf(stderr,
                "attnctl: hint: %s is not yours to connect to: the daemon makes its socket mode "
                "server.ipc_mode (0660) and group server.ipc_group; join that group\n",
                url + 6);
        return;
    }
    if (rv != ATTND_ERR_UNAVAILABLE && rv != ATTND_ERR_NOT_FOUND) return;
    if (ipc && stat(url + 6, &st) != 0 && errno == ENOENT)
        fprintf(stderr, "attnctl: hint: no socket at %s", url + 6);
    else if (ipc)
        fprintf(stderr,
                "attnctl: hint: nothing accepts connections on %s (a daemon that was killed "
                "leaves its socket behind)",
                url + 6);
    else
        fprintf(stderr, "attnctl: hint: nothing answers at %s", url);
    fprintf(stderr,
            ": is attnd running, started with \"%s\": \"%s\" in its config (attnd --config "
            "FILE)? The URL is %s; -u or $ATTND_URL name another.\n",
            ipc ? "server.listen" : "server.listen_tcp", url, from);
}

static int connect_daemon(attnctl *ctl)
{
    attnd_err rv;
    if ((rv = attnd_client_alloc(&ctl->c, &ctl->opts)) != ATTND_ERR_OK) {
        fprintf(stderr, "attnctl: %s\n", attnd_strerror(rv));
        return ATTNCTL_FAILED;
    }
    if ((rv = attnd_client_set_tls(ctl->c, ctl->tls_ca, NULL)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "connect", rv);
    if ((rv = attnd_client_dial(ctl->c, ctl->url)) != ATTND_ERR_OK) {
        attnctl_fail(ctl, "connect", rv);
        connect_hint(ctl, rv);
        return ATTNCTL_FAILED;
    }
    return ATTNCTL_OK;
}

/* ---------------------------------------------------------------- main */

/* A signed timeout in ms: -1, 0 or more. */
static int parse_timeout(const char *s, int32_t *out)
{
    uint64_t v;
    if (s != NULL && strcmp(s, "-1") == 0) {
        *out = -1;
        return ATTNCTL_OK;
    }
    if (attnctl_parse_u64(s, &v) != 0 || v > INT32_MAX)
        return attnctl_usage_error("-t/--timeout", "'%s' is not a timeout in ms (-1, 0 .. %d)", s,
                                   INT32_MAX);
    *out = (int32_t)v;
    return ATTNCTL_OK;
}

/* Global options: the index of the first command word, or -1 with *status the exit status
 * (--help, --version, a bad option). */
static int parse_globals(attnctl *ctl, int argc, char **argv, int *status)
{
    static const struct option longopts[] = {{"url", required_argument, NULL, 'u'},
                                             {"timeout", required_argument, NULL, 't'},
                                             {"name", required_argument, NULL, 'n'},
                                             {"token", required_argument, NULL, 'k'},
                                             {"tls-ca", required_argument, NULL, 'c'},
                                             {"socket-only", no_argument, NULL, 'S'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"version", no_argument, NULL, 'V'},
                                             {NULL, 0, NULL, 0}};
    int c;
    *status = ATTNCTL_USAGE;
    optind = 0;
    /* '+': stop at the command, whose options are its own */
    while ((c = attnctl_getopt(NULL, argc, argv, "+:u:t:n:k:c:ShV", longopts)) != -1) {
        if (c == 'u')
            ctl->url = optarg;
        else if (c == 'n')
            ctl->opts.name = optarg;
        else if (c == 'k')
            ctl->opts.token = optarg;
        else if (c == 'c')
            ctl->tls_ca = optarg;
        else if (c == 'S')
            ctl->opts.channel_slots = -1;
        else if (c == 't' && parse_timeout(optarg, &ctl->opts.timeout_ms) != ATTNCTL_OK)
            return -1;
        else if (c == 'h' || c == 'V') {
            if (c == 'h')
                usage(stdout);
            else
                printf("attnctl %s (protocol %d)\n", ATTNCTL_VERSION,
                       ATTND_CLIENT_PROTOCOL_VERSION);
            *status = ATTNCTL_OK;
            return -1;
        } else if (c == '?')
            return -1;
    }
    if (ctl->url != NULL && ctl->url[0] == '\0')
        return attnctl_usage_error("-u/--url", "empty URL"), -1;
    if (optind >= argc)
        return attnctl_usage_error(NULL, "no command (attnctl --help lists them)"), -1;
    return optind;
}

int main(int argc, char **argv)
{
    cmd_line cmds[MAX_COMMANDS];
    attnctl ctl;
    int first, n, rc;
    memset(&ctl, 0, sizeof ctl);
    ctl.opts.name = "attnctl";
    ctl.tls_ca = getenv("ATTND_TLS_CA"); /* the URL and token: the library reads their variables */
    if ((first = parse_globals(&ctl, argc, argv, &rc)) < 0) return rc;
    if ((n = split_commands(argc - first, argv + first, cmds)) < 0) return ATTNCTL_USAGE;
    ctl.check_only = 1;
    if ((rc = run_commands(&ctl, cmds, n)) != ATTNCTL_OK) return rc;
    ctl.check_only = 0;
    if ((rc = connect_daemon(&ctl)) == ATTNCTL_OK) rc = run_commands(&ctl, cmds, n);
    attnd_client_free(ctl.c);
    return rc;
}
