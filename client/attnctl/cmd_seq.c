/* attnctl sequence commands: seqs, create, fork, free, truncate, query. */
#include <stdio.h>
#include <stdlib.h>

#include "attnctl.h"

static void print_seq(const attnd_seq_info *s)
{
    printf("%20llu %10u %10u %10llu\n", (unsigned long long)s->seq_id, s->num_tokens, s->num_blocks,
           (unsigned long long)s->step);
}

static void print_header(void)
{
    printf("%20s %10s %10s %10s\n", "seq_id", "tokens", "blocks", "step");
}

int attnctl_cmd_seqs(attnctl *ctl, int argc, char **argv)
{
    attnd_seq_info *seqs = NULL;
    size_t n = 0, cap = 0;
    attnd_err rv;
    int rc;
    (void)argv;
    if (argc != 1) return attnctl_usage_error("seqs", "takes no arguments");
    if (ctl->check_only) return ATTNCTL_OK;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    /* Ask for the count, then for all of them (the list may grow in between: ask again). */
    do {
        free(seqs);
        cap = n + 16;
        if ((seqs = calloc(cap, sizeof *seqs)) == NULL)
            return attnctl_fail(ctl, "seqs", ATTND_ERR_NO_MEMORY);
        if ((rv = attnd_client_seq_list(ctl->c, seqs, cap, &n)) != ATTND_ERR_OK) {
            free(seqs);
            return attnctl_fail(ctl, "seqs", rv);
        }
    } while (n > cap);
    print_header();
    for (size_t i = 0; i < n; i++)
        print_seq(&seqs[i]);
    printf("%zu sequence(s)\n", n);
    free(seqs);
    return ATTNCTL_OK;
}

/* Parse argv[1..argc) as sequence ids into ids. */
static int parse_ids(const char *cmd, int argc, char **argv, uint64_t *ids)
{
    for (int i = 1; i < argc; i++)
        if (attnctl_parse_u64(argv[i], &ids[i - 1]) != 0)
            return attnctl_usage_error(cmd, "'%s' is not a sequence id", argv[i]);
    return ATTNCTL_OK;
}

/* create / free: one request per id, stop at the first failure. */
static int send_per_id(attnctl *ctl, const char *cmd, const uint64_t *ids, int n, int create)
{
    int rc = attnctl_session(ctl);
    for (int i = 0; rc == ATTNCTL_OK && i < n; i++) {
        attnd_err rv = create ? attnd_client_seq_create(ctl->c, ids[i], NULL)
                              : attnd_client_seq_free(ctl->c, ids[i]);
        if (rv != ATTND_ERR_OK)
            rc = attnctl_fail(ctl, cmd, rv);
        else
            printf("%s %llu\n", create ? "created" : "freed", (unsigned long long)ids[i]);
    }
    return rc;
}

static int per_id(attnctl *ctl, int argc, char **argv, int create)
{
    uint64_t *ids;
    int rc;
    if (argc < 2) return attnctl_usage_error(argv[0], "needs at least one sequence id");
    if ((ids = calloc((size_t)argc, sizeof *ids)) == NULL)
        return attnctl_fail(ctl, argv[0], ATTND_ERR_NO_MEMORY);
    rc = parse_ids(argv[0], argc, argv, ids);
    if (rc == ATTNCTL_OK && !ctl->check_only) rc = send_per_id(ctl, argv[0], ids, argc - 1, create);
    free(ids);
    return rc;
}

int attnctl_cmd_create(attnctl *ctl, int argc, char **argv)
{
    return per_id(ctl, argc, argv, 1);
}

int attnctl_cmd_free(attnctl *ctl, int argc, char **argv)
{
    return per_id(ctl, argc, argv, 0);
}

int attnctl_cmd_fork(attnctl *ctl, int argc, char **argv)
{
    uint64_t ids[2];
    attnd_seq_info info;
    attnd_err rv;
    int rc;
    if (argc != 3) return attnctl_usage_error("fork", "needs PARENT and CHILD");
    if ((rc = parse_ids("fork", argc, argv, ids)) != ATTNCTL_OK || ctl->check_only) return rc;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    if ((rv = attnd_client_seq_fork(ctl->c, ids[0], ids[1], &info)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "fork", rv);
    printf("forked %llu -> %llu (%u tokens, %u blocks)\n", (unsigned long long)ids[0],
           (unsigned long long)ids[1], info.num_tokens, info.num_blocks);
    return ATTNCTL_OK;
}

int attnctl_cmd_query(attnctl *ctl, int argc, char **argv)
{
    uint64_t id;
    attnd_seq_info info;
    attnd_err rv;
    int rc;
    if (argc != 2) return attnctl_usage_error("query", "needs one sequence id");
    if ((rc = parse_ids("query", argc, argv, &id)) != ATTNCTL_OK || ctl->check_only) return rc;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    if ((rv = attnd_client_seq_query(ctl->c, id, &info)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "query", rv);
    print_header();
    print_seq(&info);
    return ATTNCTL_OK;
}

int attnctl_cmd_truncate(attnctl *ctl, int argc, char **argv)
{
    uint64_t id, n;
    attnd_seq_info info;
    attnd_err rv;
    int rc;
    if (argc != 3) return attnctl_usage_error("truncate", "needs a sequence id and a token count");
    if ((rc = parse_ids("truncate", 2, argv, &id)) != ATTNCTL_OK) return rc;
    if (attnctl_parse_u64(argv[2], &n) != 0 || n > UINT32_MAX)
        return attnctl_usage_error("truncate", "'%s' is not a token count", argv[2]);
    if (ctl->check_only) return ATTNCTL_OK;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    if ((rv = attnd_client_seq_truncate(ctl->c, id, (uint32_t)n, &info)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "truncate", rv);
    printf("truncated %llu by %llu: %u tokens, %u blocks\n", (unsigned long long)id,
           (unsigned long long)n, info.num_tokens, info.num_blocks);
    return ATTNCTL_OK;
}
