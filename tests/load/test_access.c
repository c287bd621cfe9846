/* Access control against the real daemon: one client cannot read, use or free another's
 * sequences, regions or session; the ipc socket's mode and group; tcp:// only when configured,
 * with the shared token asked in Hello (and changed by a reload); hostile sizes rejected before
 * anything is allocated. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "loadutil.h"

/* ---------------------------------------------------------------- isolation */

Test(access, one_client_cannot_touch_anothers_sequences_regions_or_session, .timeout = 120)
{
    attnd_daemon_proc d;
    char why[256];
    attnd_shm shm;
    attnd_seq_info info;
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG("")), 0);
    attnd_client *a = attnd_daemon_connect(&d, 5000), *b = attnd_daemon_connect(&d, 5000);
    cr_assert(a && b);
    cr_assert_eq(attnd_client_seq_create(a, 5, NULL), ATTND_ERR_OK);
    cr_assert_eq(lu_step_const_v(a, 5, 7, 2.5f, why, sizeof why), 0, "%s", why);
    cr_assert_eq(attnd_client_shm_create(a, 1 << 16, &shm), ATTND_ERR_OK);

    /* B names A's sequence 5 in every way it can: it does not exist for B */
    attnd_step_seq ss = {5, 1};
    attnd_step step;
    cr_assert_eq(attnd_client_seq_query(b, 5, &info), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_client_seq_free(b, 5), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_client_seq_fork(b, 5, 6, NULL), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_client_step_begin(b, &ss, 1, &step, NULL), ATTND_ERR_NOT_FOUND);
    size_t n = 99;
    cr_assert_eq(attnd_client_seq_list(b, &info, 1, &n), ATTND_ERR_OK);
    cr_assert_eq(n, 0, "B lists A's sequences");
    /* B's own sequence 5 is a different one */
    cr_assert_eq(attnd_client_seq_create(b, 5, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_seq_query(b, 5, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 0);

    /* A's region: B can neither unregister it nor read or write through it */
    cr_assert_eq(attnd_client_region_unregister(b, shm.region), ATTND_ERR_NOT_FOUND);
    ss.seq_id = 5;
    cr_assert_eq(attnd_client_step_begin(b, &ss, 1, &step, NULL), ATTND_ERR_OK);
    const attnd_geometry *g = &attnd_client_server(b)->geometry;
    int64_t qs[3] = {1, g->num_q_heads, g->head_size}, ks[3] = {1, g->num_kv_heads, g->head_size};
    attnd_ref q, k, v, out;
    attnd_ref_region(&q, shm.region, 0, ATTND_DTYPE_F32, 3, qs);
    attnd_ref_region(&k, shm.region, 4096, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_region(&v, shm.region, 8192, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_region(&out, shm.region, 16384, ATTND_DTYPE_F32, 3, qs);
    memset(shm.base, 0x5a, shm.size);
    cr_assert_eq(attnd_client_attend(b, step.id, 0, &q, &k, &v, &out, NULL), ATTND_ERR_NOT_FOUND);
    for (size_t i = 0; i < shm.size; i++)
        cr_assert_eq(((unsigned char *)shm.base)[i], 0x5a, "B wrote into A's region at %zu", i);
    cr_assert_eq(attnd_client_step_end(b, step.id, 1), ATTND_ERR_OK);
    /* nor end A's steps */
    ss.seq_id = 5;
    cr_assert_eq(attnd_client_step_begin(a, &ss, 1, &step, NULL), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_step_end(b, step.id, 0), ATTND_ERR_NOT_FOUND);
    cr_assert_eq(attnd_client_step_end(a, step.id, 1), ATTND_ERR_OK);

    /* B's connection cannot borrow A's session id */
    uint32_t raw;
    Attnd__Reply *rep = NULL;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__FreeSequence fr = ATTND__FREE_SEQUENCE__INIT;
    cr_assert_eq(lu_raw_open(d.url, 5000, &raw), 0);
    fr.seq_id = 5;
    req.id = 42;
    req.session = attnd_client_session(a);
    req.body_case = ATTND__REQUEST__BODY_FREE;
    req.free = &fr;
    cr_assert_eq(lu_raw_call(raw, &req, &rep), 0);
    cr_assert_eq(rep->code, ATTND_ERR_PERMISSION_DENIED, "%s", rep->message);
    attnd__reply__free_unpacked(rep, NULL);
    lu_raw_close(raw);

    /* A is untouched: its sequence, its cache contents and its region */
    cr_assert_eq(attnd_client_seq_query(a, 5, &info), ATTND_ERR_OK);
    cr_assert_eq(info.num_tokens, 7);
    cr_assert_eq(lu_step_const_v(a, 5, 1, 2.5f, why, sizeof why), 0, "%s", why);
    cr_assert_eq(attnd_client_shm_destroy(a, &shm), ATTND_ERR_OK);
    attnd_client_free(a);
    attnd_client_free(b);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- the ipc socket */

Test(access, ipc_socket_mode_defaults_to_0660_and_is_configurable, .timeout = 120)
{
    attnd_daemon_proc d;
    struct stat st;
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG("")), 0);
    cr_assert_eq(stat(d.sock_path, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(st.st_mode & 07777, 0660, "mode %o", st.st_mode & 07777);
    cr_assert_eq(attnd_daemon_stop(&d), 0);

    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG(", \"ipc_mode\": \"0600\"")), 0);
    cr_assert_eq(stat(d.sock_path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* A group this process may give a file to: any group as root, else one of ours that is not
 * the primary group (so that the chown is observable). NULL when there is none. */
static const char *other_group(char *name, size_t n)
{
    gid_t groups[64];
    if (geteuid() == 0) {
        struct group *gr = getgrnam("nogroup");
        if (gr == NULL) gr = getgrgid(1);
        if (gr == NULL) return NULL;
        snprintf(name, n, "%s", gr->gr_name);
        return name;
    }
    int k = getgroups(64, groups);
    for (int i = 0; i < k; i++) {
        struct group *gr = groups[i] != getegid() ? getgrgid(groups[i]) : NULL;
        if (gr) {
            snprintf(name, n, "%s", gr->gr_name);
            return name;
        }
    }
    return NULL;
}

Test(access, ipc_socket_group_is_set_and_a_bad_group_stops_the_start, .timeout = 120)
{
    attnd_daemon_proc d;
    struct stat st;
    char grp[64], cfg[1024];
    if (other_group(grp, sizeof grp) == NULL)
        cr_skip_test("no second group to give the socket to (not root, one group)");
    snprintf(cfg, sizeof cfg, LU_SERVER_CONFIG(", \"ipc_group\": \"%s\""), grp);
    cr_assert_eq(attnd_daemon_start(&d, cfg), 0);
    cr_assert_eq(stat(d.sock_path, &st), 0);
    cr_assert_eq(st.st_gid, getgrnam(grp)->gr_gid, "socket group %u, want %s", st.st_gid, grp);
    cr_assert_eq(st.st_mode & 07777, 0660);
    cr_assert_eq(attnd_daemon_stop(&d), 0);

    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG(", \"ipc_group\": \"no-such-group-x\"")),
                 -1, "the daemon started with a group that does not exist");
    cr_assert_geq(lu_log_count(&d, "server.ipc_group"), 1, "the log does not name the key");
    unlink(d.log_path);
}

/* ---------------------------------------------------------------- tcp and the token */

/* TCP sockets of pid in state LISTEN (from /proc/pid/net/tcp{,6} and its fds). */
static int tcp_listeners(pid_t pid)
{
    char path[128], link[64], line[512];
    unsigned long inodes[256];
    int ninodes = 0, count = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL && ninodes < 256;) {
        char fd_path[400];
        snprintf(fd_path, sizeof fd_path, "%s/%s", path, e->d_name);
        ssize_t k = readlink(fd_path, link, sizeof link - 1);
        if (k <= 0) continue;
        link[k] = '\0';
        if (sscanf(link, "socket:[%lu]", &inodes[ninodes]) == 1) ninodes++;
    }
    closedir(dir);
    for (int v6 = 0; v6 < 2; v6++) {
        snprintf(path, sizeof path, "/proc/%d/net/tcp%s", (int)pid, v6 ? "6" : "");
        FILE *f = fopen(path, "r");
        if (f == NULL) continue;
        while (fgets(line, sizeof line, f) != NULL) {
            unsigned st;
            unsigned long inode;
            if (sscanf(line, "%*d: %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &inode) != 2) continue;
            for (int i = 0; i < ninodes; i++)
                count += st == 0x0A && inodes[i] == inode;
        }
        fclose(f);
    }
    return count;
}

static uint16_t free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* Rewrite d's configuration file with cfg (its @URL@ replaced) and reload it (SIGHUP). */
static void reload_config(attnd_daemon_proc *d, const char *cfg)
{
    FILE *f = fopen(d->config_path, "w");
    cr_assert_not_null(f);
    for (const char *p = cfg; *p; p++) {
        if (strncmp(p, "@URL@", 5) == 0) {
            fputs(d->url, f);
            p += 4;
        } else {
            fputc(*p, f);
        }
    }
    fclose(f);
    int before = lu_log_count(d, "event=reload applied=live");
    cr_assert_eq(attnd_daemon_signal(d, SIGHUP), 0);
    for (int i = 0; i < 500 && lu_log_count(d, "event=reload applied=live") == before; i++)
        lu_sleep_ms(10);
    cr_assert_gt(lu_log_count(d, "event=reload applied=live"), before, "the reload was not logged");
    /* the executor applies it after the log line; control events run before requests, so once
     * a request sent now is answered the new values are in force */
    uint32_t s;
    Attnd__Reply *rep = NULL;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    cr_assert_eq(lu_raw_open(d->url, 5000, &s), 0);
    cr_assert_eq(lu_raw_call(s, &req, &rep), 0, "no reply after the reload");
    attnd__reply__free_unpacked(rep, NULL);
    lu_raw_close(s);
}

static attnd_err hello_over(const char *url, const char *token)
{
    attnd_client_opts opts = {.name = "access-test", .token = token, .timeout_ms = 5000};
    attnd_client *c = NULL;
    cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
    attnd_err rv = attnd_client_connect(c, url, NULL);
    attnd_client_free(c);
    return rv;
}

Test(access, tcp_only_when_configured_and_the_token_is_required, .timeout = 120)
{
    attnd_daemon_proc d;
    char cfg[1024], tcp[64];
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG("")), 0);
    cr_assert_eq(tcp_listeners(d.pid), 0, "a TCP listener without server.listen_tcp");
    cr_assert_eq(attnd_daemon_stop(&d), 0);

    snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%u", free_port());
    snprintf(cfg, sizeof cfg, LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\""), tcp);
    cr_assert_eq(attnd_daemon_start(&d, cfg), 0);
    cr_assert_eq(tcp_listeners(d.pid), 1);
    cr_assert_eq(hello_over(tcp, NULL), ATTND_ERR_OK, "no token configured: Hello is open");

    /* the token is a live key: a reload turns it on for new sessions */
    snprintf(cfg, sizeof cfg,
             LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\", \"token\": \"s3cret-t0ken\""), tcp);
    reload_config(&d, cfg);
    cr_assert_eq(hello_over(tcp, NULL), ATTND_ERR_PERMISSION_DENIED);
    cr_assert_eq(hello_over(tcp, "s3cret-t0kem"), ATTND_ERR_PERMISSION_DENIED);
    cr_assert_eq(hello_over(tcp, "s3cret-t0ken-and-more"), ATTND_ERR_PERMISSION_DENIED);
    cr_assert_eq(hello_over(tcp, "s3cret-t0ken"), ATTND_ERR_OK);
    cr_assert_eq(hello_over(d.url, NULL), ATTND_ERR_PERMISSION_DENIED, "ipc asks for it too");
    cr_assert_eq(hello_over(d.url, "s3cret-t0ken"), ATTND_ERR_OK);
    cr_assert_eq(lu_log_count(&d, "s3cret"), 0, "the token appears in the log");
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* The code of a raw Status on a fresh connection to url, carrying session. */
static uint32_t raw_status_code(const char *url, uint64_t session)
{
    uint32_t s;
    Attnd__Reply *rep = NULL;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    req.id = 11;
    req.session = session;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    cr_assert_eq(lu_raw_open(url, 5000, &s), 0);
    cr_assert_eq(lu_raw_call(s, &req, &rep), 0, "no reply to Status on %s", url);
    uint32_t code = rep->code;
    if (code != ATTND_ERR_OK)
        cr_assert(rep->message && strstr(rep->message, "token"), "message \"%s\" names no token",
                  rep->message ? rep->message : "");
    else
        cr_assert_eq(rep->body_case, ATTND__REPLY__BODY_STATUS);
    attnd__reply__free_unpacked(rep, NULL);
    lu_raw_close(s);
    return code;
}

/* Issue 13, item 12: with a token configured, Status (which tells the geometry, the sessions and
 * the traffic) answers only a connection whose Hello gave the token, on tcp and ipc alike. */
Test(access, status_needs_the_token_when_one_is_configured, .timeout = 120)
{
    attnd_daemon_proc d;
    attnd_status st;
    char cfg[1024], tcp[64];
    snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%u", free_port());
    snprintf(cfg, sizeof cfg, LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\""), tcp);
    cr_assert_eq(attnd_daemon_start(&d, cfg), 0);
    cr_assert_eq(raw_status_code(tcp, 0), ATTND_ERR_OK, "no token configured: Status is open");
    /* the token on (a live key; daemon_proc's start-up Hello has none) */
    snprintf(cfg, sizeof cfg,
             LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\", \"token\": \"st4tus-t0ken\""), tcp);
    reload_config(&d, cfg);
    cr_assert_eq(raw_status_code(tcp, 0), ATTND_ERR_PERMISSION_DENIED, "tcp, no Hello");
    cr_assert_eq(raw_status_code(d.url, 0), ATTND_ERR_PERMISSION_DENIED, "ipc, no Hello");
    /* another connection's session id proves nothing */
    attnd_client_opts opts = {.name = "access-test", .token = "st4tus-t0ken", .timeout_ms = 5000};
    attnd_client *c = NULL;
    attnd_server_info si;
    cr_assert_eq(attnd_client_alloc(&c, &opts), ATTND_ERR_OK);
    cr_assert_eq(attnd_client_connect(c, tcp, &si), ATTND_ERR_OK);
    cr_assert_eq(raw_status_code(tcp, si.session), ATTND_ERR_PERMISSION_DENIED, "stolen session");
    /* the client that gave the token is answered */
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK, "%s", attnd_client_last_error(c));
    cr_assert_geq(st.num_sessions, 1);
    attnd_client_free(c);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- hostile sizes */

static Attnd__Reply *raw_call(uint32_t s, Attnd__Request *req)
{
    Attnd__Reply *rep = NULL;
    cr_assert_eq(lu_raw_call(s, req, &rep), 0, "no reply");
    return rep;
}

static void expect_code(uint32_t s, Attnd__Request *req, uint32_t code, const char *what)
{
    Attnd__Reply *rep = raw_call(s, req);
    cr_assert_eq(rep->code, code, "%s: got %u (%s)", what, rep->code, rep->message);
    if (code != ATTND_ERR_OK) cr_assert(rep->message && rep->message[0], "%s: no message", what);
    attnd__reply__free_unpacked(rep, NULL);
}

Test(access, hostile_sizes_are_rejected_before_any_allocation, .timeout = 120)
{
    attnd_daemon_proc d;
    uint32_t s;
    char shm_name[64];
    cr_assert_eq(attnd_daemon_start(&d, LU_SERVER_CONFIG("")), 0);
    cr_assert_eq(lu_raw_open(d.url, 5000, &s), 0);
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__Hello hello = ATTND__HELLO__INIT;
    hello.protocol_version = 1;
    req.body_case = ATTND__REQUEST__BODY_HELLO;
    req.hello = &hello;
    Attnd__Reply *rep = raw_call(s, &req);
    cr_assert_eq(rep->code, ATTND_ERR_OK);
    req.session = rep->hello->session;
    attnd__reply__free_unpacked(rep, NULL);
    long rss0 = lu_rss_kib(d.pid);

    /* a real 4 KiB shm object registered as 2^63 bytes */
    snprintf(shm_name, sizeof shm_name, "/attnd-access-%d", (int)getpid());
    int fd = shm_open(shm_name, O_CREAT | O_RDWR, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 4096), 0);
    close(fd);
    Attnd__RegisterRegion rr = ATTND__REGISTER_REGION__INIT;
    rr.region = 1;
    rr.kind = ATTND__REGION_KIND__HOST_SHM;
    rr.shm_name = shm_name;
    rr.size = 1ull << 63;
    req.body_case = ATTND__REQUEST__BODY_REGISTER_REGION;
    req.register_region = &rr;
    expect_code(s, &req, ATTND_ERR_INVALID_ARGUMENT, "region of 2^63 bytes");
    rr.size = 4096;
    expect_code(s, &req, ATTND_ERR_OK, "the real size");

    /* a step of 2^32 - 1 tokens */
    Attnd__CreateSequence cr = ATTND__CREATE_SEQUENCE__INIT;
    cr.seq_id = 1;
    req.body_case = ATTND__REQUEST__BODY_CREATE;
    req.create = &cr;
    expect_code(s, &req, ATTND_ERR_OK, "create");
    Attnd__StepSeq sq = ATTND__STEP_SEQ__INIT, *sqs[1] = {&sq};
    Attnd__BeginStep bs = ATTND__BEGIN_STEP__INIT;
    sq.seq_id = 1;
    sq.new_tokens = 0xFFFFFFFFu;
    bs.n_seqs = 1;
    bs.seqs = sqs;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &bs;
    expect_code(s, &req, ATTND_ERR_INVALID_ARGUMENT, "2^32 - 1 new tokens");
    sq.new_tokens = 1;
    rep = raw_call(s, &req);
    cr_assert_eq(rep->code, ATTND_ERR_OK);
    uint64_t step = rep->step->step;
    attnd__reply__free_unpacked(rep, NULL);

    /* Attend with shapes whose products and strides overflow 64 bits */
    int64_t huge[3] = {1ll << 40, 1ll << 40, 64}, ok_shape[3] = {1, 8, 64};
    int64_t big_strides[3] = {1ll << 62, 1ll << 62, 1};
    Attnd__TensorRef q = ATTND__TENSOR_REF__INIT, kv = ATTND__TENSOR_REF__INIT,
                     out = ATTND__TENSOR_REF__INIT;
    Attnd__Attend at = ATTND__ATTEND__INIT;
    q.region = 1;
    q.dtype = ATTND__DTYPE__F32;
    q.n_shape = 3;
    q.shape = huge;
    kv = q;
    out = q;
    at.step = step;
    at.q = &q;
    at.k_new = &kv;
    at.v_new = &kv;
    at.out = &out;
    req.body_case = ATTND__REQUEST__BODY_ATTEND;
    req.attend = &at;
    expect_code(s, &req, ATTND_ERR_INVALID_ARGUMENT, "2^80-element tensors");
    q.shape = ok_shape;
    q.n_strides = 3;
    q.strides = big_strides;
    expect_code(s, &req, ATTND_ERR_INVALID_ARGUMENT, "strides of 2^62");
    q.n_strides = 0;
    q.offset = UINT64_MAX - 16;
    expect_code(s, &req, ATTND_ERR_INVALID_ARGUMENT, "an offset at 2^64");

    /* the daemon allocated nothing for any of it and serves on */
    long rss1 = lu_rss_kib(d.pid);
    cr_assert_lt(rss1 - rss0, 4096, "RSS grew by %ld KiB", rss1 - rss0);
    attnd_status st;
    attnd_client *c = attnd_daemon_connect(&d, 5000);
    cr_assert_eq(attnd_client_status(c, &st), ATTND_ERR_OK);
    attnd_client_free(c);
    lu_raw_close(s);
    shm_unlink(shm_name);
    cr_assert_eq(attnd_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- TLS */

/* A TLS client's Status over url (CA: the daemon's self-signed certificate). */
static int tls_status(const char *url, const char *ca_file)
{
    nng_socket s;
    nng_dialer dl;
    nng_tls_config *tc = NULL;
    nng_msg *m = NULL;
    int rv, code = -1;
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
    req.id = 3;
    req.body_case = ATTND__REQUEST__BODY_STATUS;
    req.status = &sr;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    if ((rv = nng_dialer_create(&dl, s, url)) == 0 &&
        (rv = nng_tls_config_alloc(&tc, NNG_TLS_MODE_CLIENT)) == 0 &&
        (rv = nng_tls_config_ca_file(tc, ca_file)) == 0 &&
        (rv = nng_tls_config_server_name(tc, "localhost")) == 0 &&
        (rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, tc)) == 0 &&
        (rv = nng_dialer_start(dl, 0)) == 0 &&
        (rv = nng_msg_alloc(&m, attnd__request__get_packed_size(&req))) == 0) {
        attnd__request__pack(&req, nng_msg_body(m));
        if (nng_sendmsg(s, m, 0) != 0)
            nng_msg_free(m);
        else if (nng_recvmsg(s, &m, 0) == 0) {
            Attnd__Reply *rep = attnd__reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
            code = rep ? (int)rep->code : -1;
            if (rep) attnd__reply__free_unpacked(rep, NULL);
            nng_msg_free(m);
        }
    }
    if (tc) nng_tls_config_free(tc);
    nng_close(s);
    return code;
}

Test(access, tls_listener_answers_tls_clients_only, .timeout = 120)
{
    attnd_daemon_proc d;
    char base[96], cmd[768], cfg[1024], url[64], crt[128], pem[128];
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        cr_skip_test("openssl is not installed (scripts/setup.sh installs it)");
    snprintf(base, sizeof base, "/tmp/attnd-tls-%d", (int)getpid());
    snprintf(crt, sizeof crt, "%s.crt", base);
    snprintf(pem, sizeof pem, "%s.pem", base);
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
             "-subj /CN=localhost -keyout %s.key -out %s >/dev/null 2>&1 && cat %s %s.key > %s",
             base, crt, crt, base, pem);
    cr_assert_eq(system(cmd), 0, "openssl could not make a certificate");
    snprintf(url, sizeof url, "tls+tcp://127.0.0.1:%u", free_port());
    snprintf(cfg, sizeof cfg,
             LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\", \"tls_cert_key_file\": \"%s\""), url, pem);
    cr_assert_eq(attnd_daemon_start(&d, cfg), 0);
    cr_assert_eq(tcp_listeners(d.pid), 1);
    cr_assert_eq(tls_status(url, crt), ATTND_ERR_OK, "a TLS client got no answer");
    /* plain tcp to the TLS port: no answer */
    uint32_t raw;
    char plain[64];
    snprintf(plain, sizeof plain, "tcp://%s", url + strlen("tls+tcp://"));
    if (lu_raw_open(plain, 1000, &raw) == 0) {
        Attnd__Reply *rep = NULL;
        Attnd__Request req = ATTND__REQUEST__INIT;
        Attnd__StatusRequest sr = ATTND__STATUS_REQUEST__INIT;
        req.body_case = ATTND__REQUEST__BODY_STATUS;
        req.status = &sr;
        cr_assert_neq(lu_raw_call(raw, &req, &rep), 0, "a plain tcp client was answered");
        lu_raw_close(raw);
    }
    cr_assert_eq(attnd_daemon_stop(&d), 0);

    /* a certificate file that is not one: the start fails and says which key */
    snprintf(cfg, sizeof cfg,
             LU_SERVER_CONFIG(", \"listen_tcp\": \"%s\", \"tls_cert_key_file\": \"%s\""), url, crt);
    cr_assert_eq(attnd_daemon_start(&d, cfg), -1);
    cr_assert_geq(lu_log_count(&d, "server.tls_cert_key_file"), 1);
    unlink(d.log_path);
    snprintf(cmd, sizeof cmd, "rm -f %s.key %s %s", base, crt, pem);
    cr_assert_eq(system(cmd), 0);
}
