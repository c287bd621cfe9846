/* attnctl: poke a running attnd daemon. Main, the command table, status and info. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnctl.h"

#define ATTNCTL_DEFAULT_URL "ipc:///tmp/attnd.sock"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: attnctl [-u URL] [-t MS] [-n NAME] [-k TOKEN] [-c CA.pem] [-S] COMMAND [ARGS]\n"
            "               [+ COMMAND [ARGS]]...\n"
            "\n"
            "  -u URL    daemon address: ipc://PATH, tcp://HOST:PORT or tls+tcp://HOST:PORT\n"
            "            (default $ATTND_URL, else " ATTNCTL_DEFAULT_URL ")\n"
            "  -t MS     per-request timeout in ms (default %d)\n"
            "  -n NAME   client name sent in Hello\n"
            "  -k TOKEN  shared token, when the daemon requires one (default $ATTND_TOKEN)\n"
            "  -c FILE   tls+tcp://: CA certificate(s) the daemon's must be signed by\n"
            "            (default $ATTND_TLS_CA)\n"
            "  -S        the socket only: no shared-memory channel (opened on ipc:// otherwise)\n"
            "\n"
            "Commands run in order in one session, separated by a lone '+'. Sequences belong to\n"
            "the session: create, fork, attend and free them in one attnctl run.\n"
            "\n"
            "  status                      the daemon: version, backend, geometry, counters\n"
            "  info                        this session: Hello reply, geometry and limits\n"
            "  seqs                        this session's sequences\n"
            "  create ID...                create sequences\n"
            "  fork PARENT CHILD           fork a sequence (shared blocks, copy-on-write)\n"
            "  free ID...                  free sequences\n"
            "  query ID                    one sequence\n"
            "  attend Q.npy K.npy V.npy OUT.npy [--seqs ID:N[,ID:N...]] [--layer L]\n"
            "         [--dtype f32|f16|bf16] [--lse LSE.npy] [--inline]\n"
            "                              one step: Q [T,q_heads,head], K/V [T,kv_heads,head];\n"
            "                              without --seqs a temporary sequence takes all T rows\n"
            "  bench [--seqs N] [--context L] [--steps S] [--layers L] [--dtype DT] [--inline]\n"
            "        [--clients C] [--warmup W] [--abort]\n"
            "                              decode steps of N x 1 token: requests/s, latency\n"
            "                              percentiles per request kind\n",
            ATTND_CLIENT_DEFAULT_TIMEOUT_MS);
}

int attnctl_fail(attnctl *ctl, const char *what, attnd_err rv)
{
    fprintf(stderr, "attnctl: %s: %s: %s\n", what, attnd_err_name(rv),
            ctl->c != NULL ? attnd_client_last_error(ctl->c) : attnd_strerror(rv));
    return ATTNCTL_FAILED;
}

int attnctl_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "attnctl: %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return ATTNCTL_USAGE;
}

int attnctl_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (s == NULL || *s == '\0' || *s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0') return -1;
    *out = v;
    return 0;
}

int attnctl_parse_dtype(const char *s, attnd_dtype *out)
{
    if (strcmp(s, "float32") == 0) s = "f32";
    if (strcmp(s, "float16") == 0) s = "f16";
    if (strcmp(s, "bfloat16") == 0) s = "bf16";
    return attnd_dtype_parse(s, out);
}

int attnctl_session(attnctl *ctl)
{
    attnd_err rv;
    if (ctl->have_session) return ATTNCTL_OK;
    if ((rv = attnd_client_hello(ctl->c, NULL)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "hello", rv);
    /* as attnd_client_connect does; without one (refused, -S) the socket carries everything */
    if (strncmp(ctl->url, "ipc://", 6) == 0 && ctl->opts.channel_slots >= 0)
        (void)attnd_client_channel_open(ctl->c, 0);
    ctl->have_session = 1;
    return ATTNCTL_OK;
}

static void print_geometry(const attnd_geometry *g)
{
    printf("geometry:     %u layers, %u q heads, %u kv heads, head %u, block %u, cache %s\n",
           g->num_layers, g->num_q_heads, g->num_kv_heads, g->head_size, g->block_size,
           attnd_dtype_name(g->cache_dtype));
    printf("cache:        %u blocks, at most %u per sequence, scale %g\n", g->num_blocks,
           g->max_blocks_per_seq, (double)g->scale);
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
    /* a daemon with a token answers Status only in a session that gave it */
    if (ctl->opts.token && ctl->opts.token[0] && (rc = attnctl_session(ctl)) != ATTNCTL_OK)
        return rc;
    if ((rv = attnd_client_status(ctl->c, &st)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "status", rv);
    printf("daemon:       attnd %s, backend %s, up %.1f s\n", st.version, st.backend, st.uptime_s);
    print_geometry(&st.geometry);
    printf("blocks free:  %u of %u\n", st.blocks_free, st.geometry.num_blocks);
    printf("sessions:     %u, sequences %u\n", st.num_sessions, st.num_sequences);
    printf("requests:     %llu, errors %llu\n", (unsigned long long)st.requests,
           (unsigned long long)st.errors);
    return ATTNCTL_OK;
}

static int cmd_info(attnctl *ctl, int argc, char **argv)
{
    const attnd_server_info *si;
    int rc;
    (void)argv;
    if (argc != 1) return attnctl_usage_error("info", "takes no arguments");
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

static const struct {
    const char *name;
    attnctl_cmd_fn fn;
} commands[] = {
    {"status", cmd_status},       {"info", cmd_info},
    {"seqs", attnctl_cmd_seqs},   {"create", attnctl_cmd_create},
    {"fork", attnctl_cmd_fork},   {"free", attnctl_cmd_free},
    {"query", attnctl_cmd_query}, {"attend", attnctl_cmd_attend},
    {"bench", attnctl_cmd_bench},
};

static attnctl_cmd_fn find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return commands[i].fn;
    return NULL;
}

/* Check every command name before anything is sent. */
static int check_commands(int argc, char **argv)
{
    int start = 0;
    for (int i = 0; i <= argc; i++) {
        if (i < argc && strcmp(argv[i], "+") != 0) continue;
        if (i == start) return attnctl_usage_error("+", "empty command");
        if (find_command(argv[start]) == NULL)
            return attnctl_usage_error(argv[start], "unknown command (attnctl -h lists them)");
        start = i + 1;
    }
    return ATTNCTL_OK;
}

static int run_commands(attnctl *ctl, int argc, char **argv)
{
    int start = 0, rc;
    for (int i = 0; i <= argc; i++) {
        if (i < argc && strcmp(argv[i], "+") != 0) continue;
        argv[i < argc ? i : argc] = NULL;
        if ((rc = find_command(argv[start])(ctl, i - start, argv + start)) != ATTNCTL_OK) return rc;
        start = i + 1;
    }
    return ATTNCTL_OK;
}

/* Global options; returns the index of the first command word, or -1 (usage printed). */
static int parse_globals(attnctl *ctl, int argc, char **argv, int32_t *timeout)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *o = argv[i];
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            usage(stdout);
            exit(ATTNCTL_OK);
        }
        if (strcmp(o, "-S") == 0) {
            ctl->opts.channel_slots = -1;
            continue;
        }
        if (i + 1 >= argc || strlen(o) != 2 || strchr("utnkc", o[1]) == NULL) {
            usage(stderr);
            return -1;
        }
        const char *v = argv[++i];
        if (o[1] == 'u') ctl->url = v;
        if (o[1] == 'n') ctl->opts.name = v;
        if (o[1] == 'k') ctl->opts.token = v;
        if (o[1] == 'c') ctl->tls_ca = v;
        if (o[1] == 't') *timeout = atoi(v);
    }
    if (i >= argc) {
        usage(stderr);
        return -1;
    }
    return i;
}

int main(int argc, char **argv)
{
    attnctl ctl;
    int32_t timeout = 0;
    int first, rc;
    attnd_err rv;
    memset(&ctl, 0, sizeof ctl);
    ctl.url = getenv("ATTND_URL") ? getenv("ATTND_URL") : ATTNCTL_DEFAULT_URL;
    ctl.opts.name = "attnctl";
    ctl.opts.token = getenv("ATTND_TOKEN");
    ctl.tls_ca = getenv("ATTND_TLS_CA");
    if ((first = parse_globals(&ctl, argc, argv, &timeout)) < 0) return ATTNCTL_USAGE;
    ctl.opts.timeout_ms = timeout;
    if ((rc = check_commands(argc - first, argv + first)) != ATTNCTL_OK) return rc;
    if ((rv = attnd_client_alloc(&ctl.c, &ctl.opts)) != ATTND_ERR_OK) {
        fprintf(stderr, "attnctl: %s\n", attnd_strerror(rv));
        return ATTNCTL_FAILED;
    }
    if ((rv = attnd_client_set_tls(ctl.c, ctl.tls_ca, NULL)) != ATTND_ERR_OK ||
        (rv = attnd_client_dial(ctl.c, ctl.url)) != ATTND_ERR_OK)
        rc = attnctl_fail(&ctl, "connect", rv);
    else
        rc = run_commands(&ctl, argc - first, argv + first);
    attnd_client_free(ctl.c);
    return rc;
}
