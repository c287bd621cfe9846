/* SIGBUS guard: one guard per process, truncated client objects read as zeros and take writes,
 * also when another process truncates, untouched ranges keep their data, faults outside every
 * range (or after remove, or sent by kill) still kill the process or reach the previous handler,
 * capacity, and add/remove racing with faults. Deaths are observed in forked children. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/shmguard.h"

typedef struct shmobj {
    char name[64];
    int fd;        /* the daemon's, mapped */
    int client_fd; /* the client's, which it truncates */
    unsigned char *p;
    size_t len;
} shmobj;

static size_t page_size(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* A client's object: created and sized by the "client", opened and mapped shared by the
 * "daemon", filled with a pattern from seed. The name is unlinked as soon as both descriptors are
 * open, so that no name outlives the test, whatever assertion fails. */
static void obj_create(shmobj *o, const char *tag, size_t len, unsigned char seed)
{
    snprintf(o->name, sizeof o->name, "/attnd-shmguard-%d-%s", (int)getpid(), tag);
    shm_unlink(o->name);
    o->client_fd = shm_open(o->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(o->client_fd, 0, "shm_open %s", o->name);
    o->fd = shm_open(o->name, O_RDWR, 0);
    shm_unlink(o->name);
    cr_assert_geq(o->fd, 0, "shm_open %s", o->name);
    cr_assert_eq(ftruncate(o->client_fd, (off_t)len), 0);
    o->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    cr_assert_neq(o->p, MAP_FAILED);
    o->len = len;
    for (size_t i = 0; i < len; i++)
        o->p[i] = (unsigned char)(1 + (seed + i) % 255); /* never 0 */
}

static void obj_destroy(shmobj *o)
{
    munmap(o->p, o->len);
    close(o->fd);
    close(o->client_fd);
}

/* What a hostile client does: ftruncate the object through its own descriptor. */
static int obj_truncate(const shmobj *o, off_t len)
{
    return ftruncate(o->client_fd, len);
}

/* Bytes of [p, p+n) that are not zero (reads every byte). */
static size_t count_nonzero(const volatile unsigned char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += p[i] != 0;
    return c;
}

static int pattern_intact(const shmobj *o, unsigned char seed)
{
    for (size_t i = 0; i < o->len; i++)
        if (o->p[i] != (unsigned char)(1 + (seed + i) % 255)) return 0;
    return 1;
}

/* In a child about to die on purpose: no core file. */
static void no_core(void)
{
    struct rlimit rl = {0, 0};
    setrlimit(RLIMIT_CORE, &rl);
}

static int wait_child(pid_t pid)
{
    int st = 0;
    cr_assert_gt(pid, 0, "fork");
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return st;
}

Test(shmguard, one_guard_per_process_and_free_restores_the_handler, .timeout = 120)
{
    attnd_shmguard *g = NULL, *g2 = (attnd_shmguard *)&g2;
    struct sigaction before, during, after;
    cr_assert_eq(sigaction(SIGBUS, NULL, &before), 0);
    cr_assert_eq(attnd_shmguard_alloc(NULL, 4), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_shmguard_alloc(&g, 0), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_shmguard_alloc(&g, (uint32_t)INT32_MAX + 1), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_shmguard_alloc(&g, 4), ATTND_ERR_OK);
    cr_assert_not_null(g);
    cr_assert_eq(attnd_shmguard_alloc(&g2, 4), ATTND_ERR_ALREADY_EXISTS);
    cr_assert_null(g2);
    cr_assert_eq(attnd_shmguard_faults(g), 0);
    cr_assert_eq(sigaction(SIGBUS, NULL, &during), 0);
    cr_assert(during.sa_flags & SA_SIGINFO);
    cr_assert(during.sa_flags & SA_NODEFER);
    attnd_shmguard_free(g);
    cr_assert_eq(sigaction(SIGBUS, NULL, &after), 0);
    cr_assert_eq((void *)after.sa_handler, (void *)before.sa_handler);
    cr_assert_eq(after.sa_flags & SA_SIGINFO, before.sa_flags & SA_SIGINFO);
    attnd_shmguard_free(NULL);
    cr_assert_eq(attnd_shmguard_alloc(&g, 1), ATTND_ERR_OK);
    attnd_shmguard_free(g);
}

Test(shmguard, truncated_mapping_reads_zeros_and_takes_writes, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a, b, c;
    size_t pg = page_size();
    cr_assert_eq(attnd_shmguard_alloc(&g, 8), ATTND_ERR_OK);
    obj_create(&a, "read", 3 * pg, 7);
    obj_create(&b, "untouched", 3 * pg, 9);
    obj_create(&c, "write", 2 * pg, 11);
    int32_t ha = attnd_shmguard_add(g, a.p, a.len);
    int32_t hb = attnd_shmguard_add(g, b.p, b.len);
    int32_t hc = attnd_shmguard_add(g, c.p, c.len);
    cr_assert_eq(ha, 0);
    cr_assert_eq(hb, 1);
    cr_assert_eq(hc, 2);
    cr_assert_eq(count_nonzero(a.p, a.len), a.len, "the pattern is there before the truncation");
    cr_assert_eq(attnd_shmguard_faulted(g, ha), 0);

    /* reads: every byte, no crash, all zero after the truncation */
    cr_assert_eq(obj_truncate(&a, 0), 0);
    cr_assert_eq(count_nonzero(a.p, a.len), 0);
    cr_assert_eq(attnd_shmguard_faulted(g, ha), 1);
    cr_assert_eq(attnd_shmguard_faults(g), 1);
    cr_assert_eq(count_nonzero(a.p, a.len), 0, "a second pass faults no more");
    cr_assert_eq(attnd_shmguard_faults(g), 1);

    /* writes: land in the private copy */
    cr_assert_eq(obj_truncate(&c, 0), 0);
    ((volatile unsigned char *)c.p)[c.len - 1] = 0xab;
    ((volatile unsigned char *)c.p)[0] = 0xcd;
    cr_assert_eq(attnd_shmguard_faulted(g, hc), 1);
    cr_assert_eq(attnd_shmguard_faults(g), 2);
    cr_assert_eq(c.p[0], 0xcd);
    cr_assert_eq(c.p[c.len - 1], 0xab);
    cr_assert_eq(count_nonzero(c.p, c.len), 2);
    struct stat st;
    cr_assert_eq(fstat(c.fd, &st), 0);
    cr_assert_eq(st.st_size, 0, "the write did not reach the client's object");

    /* the untouched range keeps its data and is not faulted */
    cr_assert_eq(attnd_shmguard_faulted(g, hb), 0);
    cr_assert(pattern_intact(&b, 9));
    cr_assert_eq(attnd_shmguard_faults(g), 2);

    attnd_shmguard_remove(g, ha);
    attnd_shmguard_remove(g, hb);
    attnd_shmguard_remove(g, hc);
    obj_destroy(&a);
    obj_destroy(&b);
    obj_destroy(&c);
    attnd_shmguard_free(g);
}

Test(shmguard, partial_truncation_zeroes_the_whole_range, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a;
    size_t pg = page_size();
    cr_assert_eq(attnd_shmguard_alloc(&g, 2), ATTND_ERR_OK);
    obj_create(&a, "partial", 3 * pg, 3);
    int32_t h = attnd_shmguard_add(g, a.p, a.len);
    cr_assert_geq(h, 0);
    /* one page left: reading it still works; touching the second replaces the whole range */
    cr_assert_eq(obj_truncate(&a, (off_t)pg), 0);
    cr_assert_eq(count_nonzero(a.p, pg), pg);
    cr_assert_eq(attnd_shmguard_faulted(g, h), 0);
    cr_assert_eq(count_nonzero(a.p + pg, 2 * pg), 0);
    cr_assert_eq(attnd_shmguard_faulted(g, h), 1);
    cr_assert_eq(count_nonzero(a.p, pg), 0, "the first page was replaced too");
    cr_assert_eq(attnd_shmguard_faults(g), 1);
    attnd_shmguard_remove(g, h);
    obj_destroy(&a);
    attnd_shmguard_free(g);
}

Test(shmguard, truncation_by_another_process_is_absorbed, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a;
    cr_assert_eq(attnd_shmguard_alloc(&g, 4), ATTND_ERR_OK);
    obj_create(&a, "child-truncates", 3 * page_size(), 5);
    int32_t h = attnd_shmguard_add(g, a.p, a.len);
    cr_assert_geq(h, 0);
    pid_t pid = fork();
    if (pid == 0) _exit(obj_truncate(&a, 0) == 0 ? 0 : 1);
    int st = wait_child(pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    cr_assert_eq(count_nonzero(a.p, a.len), 0);
    cr_assert_eq(attnd_shmguard_faulted(g, h), 1);
    cr_assert_eq(attnd_shmguard_faults(g), 1);
    attnd_shmguard_remove(g, h);
    obj_destroy(&a);
    attnd_shmguard_free(g);
}

Test(shmguard, fault_outside_every_range_kills_by_sigbus, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj guarded, bare;
    cr_assert_eq(attnd_shmguard_alloc(&g, 4), ATTND_ERR_OK);
    obj_create(&guarded, "guarded", 2 * page_size(), 1);
    obj_create(&bare, "bare", 2 * page_size(), 2);
    int32_t h = attnd_shmguard_add(g, guarded.p, guarded.len);
    cr_assert_geq(h, 0);
    pid_t pid = fork();
    if (pid == 0) {
        /* the child inherits the guard; bare was never added */
        no_core();
        if (obj_truncate(&bare, 0) != 0) _exit(1);
        (void)count_nonzero(bare.p, bare.len);
        _exit(0);
    }
    int st = wait_child(pid);
    cr_assert(WIFSIGNALED(st), "child status %#x", st);
    cr_assert_eq(WTERMSIG(st), SIGBUS);
    cr_assert_eq(attnd_shmguard_faulted(g, h), 0);
    cr_assert(pattern_intact(&guarded, 1));
    attnd_shmguard_remove(g, h);
    obj_destroy(&guarded);
    obj_destroy(&bare);
    attnd_shmguard_free(g);
}

/* The handler a process had before the guard: exits 42 on a bad access, 43 on anything else. */
static void chained_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    _exit(sig == SIGBUS && si->si_code == BUS_ADRERR ? 42 : 43);
}

Test(shmguard, fault_outside_every_range_reaches_the_previous_handler, .timeout = 120)
{
    shmobj bare;
    obj_create(&bare, "chained", page_size(), 4);
    pid_t pid = fork();
    if (pid == 0) {
        attnd_shmguard *g;
        struct sigaction sa;
        no_core();
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = chained_sigbus;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_SIGINFO;
        if (sigaction(SIGBUS, &sa, NULL) != 0) _exit(1);
        if (attnd_shmguard_alloc(&g, 2) != ATTND_ERR_OK) _exit(2);
        if (obj_truncate(&bare, 0) != 0) _exit(3);
        (void)count_nonzero(bare.p, bare.len);
        _exit(0);
    }
    int st = wait_child(pid);
    cr_assert(WIFEXITED(st), "child status %#x", st);
    cr_assert_eq(WEXITSTATUS(st), 42);
    obj_destroy(&bare);
}

Test(shmguard, sigbus_sent_by_kill_is_not_absorbed, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a;
    cr_assert_eq(attnd_shmguard_alloc(&g, 2), ATTND_ERR_OK);
    obj_create(&a, "kill", page_size(), 6);
    int32_t h = attnd_shmguard_add(g, a.p, a.len);
    cr_assert_geq(h, 0);
    pid_t pid = fork();
    if (pid == 0) {
        no_core();
        kill(getpid(), SIGBUS);
        _exit(0);
    }
    int st = wait_child(pid);
    cr_assert(WIFSIGNALED(st), "child status %#x", st);
    cr_assert_eq(WTERMSIG(st), SIGBUS);
    cr_assert_eq(attnd_shmguard_faults(g), 0);
    attnd_shmguard_remove(g, h);
    obj_destroy(&a);
    attnd_shmguard_free(g);
}

Test(shmguard, capacity_full_then_remove_frees_an_entry, .timeout = 120)
{
    attnd_shmguard *g;
    size_t pg = page_size();
    unsigned char *m =
        mmap(NULL, 5 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(attnd_shmguard_alloc(&g, 4), ATTND_ERR_OK);
    for (int32_t i = 0; i < 4; i++)
        cr_assert_eq(attnd_shmguard_add(g, m + (size_t)i * pg, pg), i);
    cr_assert_eq(attnd_shmguard_add(g, m + 4 * pg, pg), -1);
    attnd_shmguard_remove(g, 2);
    attnd_shmguard_remove(g, 2); /* already free: ignored */
    attnd_shmguard_remove(g, -1);
    attnd_shmguard_remove(g, 4);
    cr_assert_eq(attnd_shmguard_add(g, m + 4 * pg, pg), 2);
    cr_assert_eq(attnd_shmguard_add(g, m + 4 * pg, pg), -1);
    cr_assert_eq(attnd_shmguard_faulted(g, -1), 0);
    cr_assert_eq(attnd_shmguard_faulted(g, 4), 0);
    cr_assert_eq(attnd_shmguard_faults(g), 0);
    attnd_shmguard_free(g);
    munmap(m, 5 * pg);
}

Test(shmguard, add_rejects_a_misaligned_base_or_an_empty_range, .timeout = 120)
{
    attnd_shmguard *g;
    size_t pg = page_size();
    unsigned char *m = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(attnd_shmguard_alloc(&g, 2), ATTND_ERR_OK);
    cr_assert_eq(attnd_shmguard_add(NULL, m, pg), -1);
    cr_assert_eq(attnd_shmguard_add(g, m + 1, pg - 1), -1);
    cr_assert_eq(attnd_shmguard_add(g, m, 0), -1);
    cr_assert_eq(attnd_shmguard_add(g, m, 1), 0, "a partial page is watched as a whole page");
    attnd_shmguard_free(g);
    munmap(m, pg);
}

Test(shmguard, removed_range_is_no_longer_guarded, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a;
    cr_assert_eq(attnd_shmguard_alloc(&g, 4), ATTND_ERR_OK);
    obj_create(&a, "removed", 2 * page_size(), 8);
    int32_t h = attnd_shmguard_add(g, a.p, a.len);
    cr_assert_eq(h, 0);
    attnd_shmguard_remove(g, h);
    pid_t pid = fork();
    if (pid == 0) {
        no_core();
        if (obj_truncate(&a, 0) != 0) _exit(1);
        (void)count_nonzero(a.p, a.len);
        _exit(0);
    }
    int st = wait_child(pid);
    cr_assert(WIFSIGNALED(st), "child status %#x", st);
    cr_assert_eq(WTERMSIG(st), SIGBUS);
    cr_assert_eq(attnd_shmguard_faults(g), 0);
    obj_destroy(&a);
    attnd_shmguard_free(g);
}

#define CHURN_THREADS 4
#define ROUNDS 200

typedef struct churn_arg {
    attnd_shmguard *g;
    _Atomic int *stop;
    unsigned char *page;
    _Atomic long adds;
} churn_arg;

/* Adds and removes a range of its own as fast as it can while the main thread takes faults. */
static void *churn(void *p)
{
    churn_arg *c = p;
    while (!atomic_load(c->stop)) {
        int32_t h = attnd_shmguard_add(c->g, c->page, page_size());
        if (h < 0) continue;
        atomic_fetch_add(&c->adds, 1);
        attnd_shmguard_remove(c->g, h);
    }
    return NULL;
}

Test(shmguard, add_and_remove_race_with_faults, .timeout = 120)
{
    attnd_shmguard *g;
    pthread_t th[CHURN_THREADS];
    churn_arg args[CHURN_THREADS];
    _Atomic int stop = 0;
    size_t pg = page_size();
    unsigned char *pages =
        mmap(NULL, CHURN_THREADS * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(pages, MAP_FAILED);
    cr_assert_eq(attnd_shmguard_alloc(&g, CHURN_THREADS + 2), ATTND_ERR_OK);
    for (int i = 0; i < CHURN_THREADS; i++) {
        args[i] = (churn_arg){.g = g, .stop = &stop, .page = pages + (size_t)i * pg};
        cr_assert_eq(pthread_create(&th[i], NULL, churn, &args[i]), 0);
    }
    for (int i = 0; i < CHURN_THREADS; i++) /* every thread churning before the first fault */
        while (atomic_load(&args[i].adds) == 0)
            sched_yield();
    for (int r = 0; r < ROUNDS; r++) {
        shmobj a;
        char tag[32];
        snprintf(tag, sizeof tag, "race-%d", r);
        obj_create(&a, tag, 2 * pg, (unsigned char)r);
        int32_t h = attnd_shmguard_add(g, a.p, a.len);
        cr_assert_geq(h, 0);
        cr_assert_eq(obj_truncate(&a, 0), 0);
        cr_assert_eq(count_nonzero(a.p, a.len), 0);
        cr_assert_eq(attnd_shmguard_faulted(g, h), 1);
        attnd_shmguard_remove(g, h);
        obj_destroy(&a);
    }
    atomic_store(&stop, 1);
    long adds = 0;
    for (int i = 0; i < CHURN_THREADS; i++) {
        pthread_join(th[i], NULL);
        adds += atomic_load(&args[i].adds);
    }
    cr_assert_gt(adds, 0);
    cr_assert_eq(attnd_shmguard_faults(g), ROUNDS);
    attnd_shmguard_free(g);
    munmap(pages, CHURN_THREADS * pg);
}

#define READERS 8

typedef struct reader_arg {
    pthread_barrier_t *start;
    const unsigned char *p;
    size_t len;
    size_t nonzero;
} reader_arg;

static void *reader(void *p)
{
    reader_arg *r = p;
    pthread_barrier_wait(r->start);
    r->nonzero = count_nonzero(r->p, r->len);
    return NULL;
}

Test(shmguard, threads_faulting_in_one_range_replace_it_once, .timeout = 120)
{
    attnd_shmguard *g;
    shmobj a;
    pthread_t th[READERS];
    reader_arg args[READERS];
    pthread_barrier_t start;
    cr_assert_eq(attnd_shmguard_alloc(&g, 2), ATTND_ERR_OK);
    obj_create(&a, "readers", 64 * page_size(), 12);
    int32_t h = attnd_shmguard_add(g, a.p, a.len);
    cr_assert_geq(h, 0);
    cr_assert_eq(obj_truncate(&a, 0), 0);
    cr_assert_eq(pthread_barrier_init(&start, NULL, READERS), 0);
    for (int i = 0; i < READERS; i++) {
        args[i] = (reader_arg){.start = &start, .p = a.p, .len = a.len};
        cr_assert_eq(pthread_create(&th[i], NULL, reader, &args[i]), 0);
    }
    for (int i = 0; i < READERS; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].nonzero, 0);
    }
    cr_assert_eq(attnd_shmguard_faulted(g, h), 1);
    cr_assert_eq(attnd_shmguard_faults(g), 1);
    pthread_barrier_destroy(&start);
    attnd_shmguard_remove(g, h);
    obj_destroy(&a);
    attnd_shmguard_free(g);
}
