#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void attnd_sessions_init(attnd_sessions *ss)
{
    memset(ss, 0, sizeof *ss);
    ss->next_id = 1;
}

static void session_unmap(attnd_session *s)
{
    for (uint32_t i = 0; i < s->nregions; i++)
        attnd_handles_unmap(&s->regions[i]);
    s->nregions = 0;
}

static void session_destroy(attnd_session *s)
{
    session_unmap(s);
    free(s->regions);
    free(s);
}

void attnd_sessions_fini(attnd_sessions *ss)
{
    while (ss->head)
        attnd_session_close(ss, ss->head);
}

attnd_err attnd_session_open(attnd_sessions *ss, uint32_t pipe, const char *name,
                             uint32_t max_sessions, uint32_t max_per_pipe, attnd_session **out,
                             char *err, size_t n)
{
    uint32_t on_pipe = 0;
    if (ss->count >= max_sessions)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "session: limits.max_sessions (%u) are open", max_sessions);
    for (const attnd_session *o = ss->head; o; o = o->next)
        on_pipe += o->connected && o->pipe == pipe;
    if (on_pipe >= max_per_pipe)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "session: this connection holds limits.max_sessions_per_connection (%u)",
                          max_per_pipe);
    attnd_session *s = calloc(1, sizeof *s);
    if (s == NULL) return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "session: out of memory");
    s->id = ss->next_id++;
    s->pipe = pipe;
    s->connected = 1;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    s->next = ss->head;
    ss->head = s;
    ss->count++;
    *out = s;
    return ATTND_ERR_OK;
}

attnd_err attnd_session_get(attnd_sessions *ss, uint64_t id, uint32_t pipe, attnd_session **out,
                            char *err, size_t n)
{
    *out = NULL;
    for (attnd_session *s = ss->head; s; s = s->next) {
        if (s->id != id) continue;
        if (!s->connected)
            return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "session: %llu is closed",
                              (unsigned long long)id);
        if (s->pipe != pipe)
            return attnd_errf(err, n, ATTND_ERR_PERMISSION_DENIED,
                              "session: %llu belongs to another connection",
                              (unsigned long long)id);
        *out = s;
        return ATTND_ERR_OK;
    }
    return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "session: %llu unknown (send Hello first)",
                      (unsigned long long)id);
}

void attnd_session_close(attnd_sessions *ss, attnd_session *s)
{
    attnd_session **pp = &ss->head;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp == NULL) return;
    *pp = s->next;
    ss->count--;
    session_destroy(s);
}

static attnd_region *region_find(attnd_session *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->nregions; i++)
        if (s->regions[i].id == id) return &s->regions[i];
    return NULL;
}

/* Room for one more region id (the checks every kind shares). */
static attnd_err region_room(attnd_session *s, uint32_t id, uint32_t max_regions, char *err,
                             size_t n)
{
    if (id == 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT, "region: 0 is reserved (INLINE)");
    if (region_find(s, id))
        return attnd_errf(err, n, ATTND_ERR_ALREADY_EXISTS, "region: %u already registered", id);
    if (s->nregions >= max_regions)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE,
                          "region: session holds limits.max_regions (%u)", max_regions);
    if (s->nregions == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 4;
        attnd_region *r = realloc(s->regions, (size_t)cap * sizeof *r);
        if (r == NULL) return attnd_errf(err, n, ATTND_ERR_NO_MEMORY, "region: out of memory");
        s->regions = r;
        s->cap = cap;
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_session_region_add(attnd_session *s, uint32_t id, attnd_shmguard *guard,
                                   const char *shm_name, uint64_t size, uint32_t max_regions,
                                   char *err, size_t n)
{
    attnd_err rv = region_room(s, id, max_regions, err, n);
    if (rv == ATTND_ERR_OK)
        rv = attnd_handles_map_shm(&s->regions[s->nregions], guard, id, shm_name, size, err, n);
    if (rv == ATTND_ERR_OK) s->nregions++;
    return rv;
}

attnd_err attnd_session_region_add_ipc(attnd_session *s, uint32_t id, attnd_backend *be,
                                       const void *handle, size_t handle_len, uint64_t size,
                                       uint32_t max_regions, char *err, size_t n)
{
    attnd_err rv = region_room(s, id, max_regions, err, n);
    if (rv == ATTND_ERR_OK)
        rv = attnd_handles_open_ipc(&s->regions[s->nregions], be, id, handle, handle_len, size, err,
                                    n);
    if (rv == ATTND_ERR_OK) s->nregions++;
    return rv;
}

attnd_err attnd_session_region_remove(attnd_session *s, uint32_t id, char *err, size_t n)
{
    attnd_region *r = region_find(s, id);
    if (r == NULL) return attnd_errf(err, n, ATTND_ERR_NOT_FOUND, "region: %u not registered", id);
    attnd_handles_unmap(r);
    *r = s->regions[--s->nregions];
    return ATTND_ERR_OK;
}

void attnd_sessions_disconnect(attnd_sessions *ss, uint32_t pipe, uint64_t now_ms,
                               void (*fn)(attnd_session *, void *), void *arg)
{
    for (attnd_session *s = ss->head; s; s = s->next) {
        if (!s->connected || s->pipe != pipe) continue;
        s->connected = 0;
        s->gone_ms = now_ms;
        session_unmap(s);
        if (fn) fn(s, arg);
    }
}

attnd_session *attnd_sessions_expired(const attnd_sessions *ss, uint64_t now_ms,
                                      uint64_t timeout_ms)
{
    for (attnd_session *s = ss->head; s; s = s->next)
        if (!s->connected && (s->nseqs == 0 || now_ms - s->gone_ms >= timeout_ms)) return s;
    return NULL;
}
