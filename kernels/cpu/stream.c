/* Streams on the CPU backend (kernels.h "streams"): a stream is a thread running its queue in
 * order. Ops launched while a stream is selected are copied into its queue (their tensors must
 * stay valid until the stream ran them, as on a GPU); waits poll the flag word; every op, from the
 * caller or a stream, runs under the backend's run lock (the thread pool runs one job at a time).
 * This is the emulation the protocol's CPU tests run on, not a fast path. */
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"

typedef enum { ITEM_WAIT, ITEM_WRITE, ITEM_CALL } item_kind;

typedef struct stream_item {
    item_kind kind;
    uint32_t *flag;
    uint32_t value;
    attnd_cpu_call fn;
    int32_t n;
    void *ws;
    struct stream_item *next;
    alignas(max_align_t) unsigned char params[]; /* ITEM_CALL: a copy of the op's params */
} stream_item;

struct attnd_stream {
    attnd_backend *b;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    stream_item *head, *tail;
    int busy;         /* the thread is running an item */
    atomic_int stop;  /* destroy: leave the queue and any wait */
    attnd_err err;    /* the first failure of a queued op */
    char errmsg[200]; /* its message */
};

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

/* Poll the word until it holds value (a short spin, then 20 us naps) or the stream stops. */
static void item_wait(attnd_stream *s, const uint32_t *flag, uint32_t value)
{
    for (uint32_t i = 0; !atomic_load(&s->stop); i++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == value) return;
        if (i > 200) nap_us(20);
    }
}

/* Run an op copied into the queue, on a copy of the backend whose last_error is the stream's. */
static void item_call(attnd_stream *s, stream_item *it)
{
    attnd_backend shadow = *s->b;
    attnd_cpu *cpu = s->b->impl;
    shadow.last_error[0] = '\0';
    pthread_mutex_lock(&cpu->run_mu);
    attnd_err rv = it->fn(&shadow, it->params, it->n, it->ws);
    pthread_mutex_unlock(&cpu->run_mu);
    if (rv != ATTND_ERR_OK && s->err == ATTND_ERR_OK) {
        s->err = rv;
        snprintf(s->errmsg, sizeof s->errmsg, "%s", shadow.last_error);
    }
}

static void item_run(attnd_stream *s, stream_item *it)
{
    switch (it->kind) {
    case ITEM_WAIT:
        item_wait(s, it->flag, it->value);
        break;
    case ITEM_WRITE:
        for (int32_t i = 0; i < it->n; i++)
            __atomic_store_n(it->flag + i, it->value, __ATOMIC_RELEASE);
        break;
    case ITEM_CALL:
        item_call(s, it);
        break;
    }
}

static void *stream_main(void *arg)
{
    attnd_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !atomic_load(&s->stop))
            pthread_cond_wait(&s->cv, &s->mu);
        if (atomic_load(&s->stop)) break;
        stream_item *it = s->head;
        s->head = it->next;
        if (s->head == NULL) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        item_run(s, it);
        free(it);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static attnd_err stream_push(attnd_stream *s, stream_item *it)
{
    if (it == NULL) return ATTND_ERR_NO_MEMORY;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ATTND_ERR_OK;
}

static stream_item *item_new(item_kind kind, size_t params)
{
    stream_item *it = calloc(1, sizeof *it + params);
    if (it) it->kind = kind;
    return it;
}

attnd_err attnd_cpu_run(attnd_backend *b, attnd_cpu_call fn, const void *params, size_t size,
                        int32_t n, void *ws)
{
    attnd_cpu *cpu = b->impl;
    if (cpu->cur != NULL) {
        stream_item *it = item_new(ITEM_CALL, size);
        if (it == NULL) return ATTND_ERR_NO_MEMORY;
        memcpy(it->params, params, size);
        it->fn = fn;
        it->n = n;
        it->ws = ws;
        return stream_push(cpu->cur, it);
    }
    pthread_mutex_lock(&cpu->run_mu);
    attnd_err rv = fn(b, params, n, ws);
    pthread_mutex_unlock(&cpu->run_mu);
    return rv;
}

attnd_err attnd_cpu_stream_create(attnd_backend *b, attnd_stream **out)
{
    attnd_stream *s = calloc(1, sizeof *s);
    *out = NULL;
    if (s == NULL) return ATTND_ERR_NO_MEMORY;
    s->b = b;
    atomic_init(&s->stop, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        snprintf(b->last_error, sizeof b->last_error, "stream: cannot start its thread");
        return ATTND_ERR_INTERNAL;
    }
    *out = s;
    return ATTND_ERR_OK;
}

void attnd_cpu_stream_destroy(attnd_backend *b, attnd_stream *s)
{
    attnd_cpu *cpu = b->impl;
    if (cpu->cur == s) cpu->cur = NULL;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stop, 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    while (s->head) {
        stream_item *it = s->head;
        s->head = it->next;
        free(it);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

attnd_err attnd_cpu_stream_select(attnd_backend *b, attnd_stream *s)
{
    ((attnd_cpu *)b->impl)->cur = s;
    return ATTND_ERR_OK;
}

attnd_err attnd_cpu_stream_value(attnd_stream *s, int write, uint32_t *flag, uint32_t count,
                                 uint32_t value)
{
    stream_item *it = item_new(write ? ITEM_WRITE : ITEM_WAIT, 0);
    if (it == NULL) return ATTND_ERR_NO_MEMORY;
    it->flag = flag;
    it->n = (int32_t)count;
    it->value = value;
    return stream_push(s, it);
}

attnd_err attnd_cpu_stream_query(attnd_backend *b, attnd_stream *s)
{
    pthread_mutex_lock(&s->mu);
    attnd_err rv = s->err != ATTND_ERR_OK            ? ATTND_ERR_INTERNAL
                   : s->head == NULL && s->busy == 0 ? ATTND_ERR_OK
                                                     : ATTND_ERR_TIMEOUT;
    if (rv == ATTND_ERR_INTERNAL)
        snprintf(b->last_error, sizeof b->last_error, "stream: %s", s->errmsg);
    pthread_mutex_unlock(&s->mu);
    return rv;
}
