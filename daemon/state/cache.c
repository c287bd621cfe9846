#include "cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct attnd_cache {
    uint32_t num_blocks, block_size, max_blocks_per_seq;
    uint32_t window;     /* every layer windowed: the largest window; 0 = no release */
    uint32_t *refs;      /* [num_blocks] */
    int32_t *free_stack; /* [num_blocks] ids of free blocks */
    uint32_t nfree;
    uint32_t linear_slots;
    int32_t *linear_free; /* [linear_slots] */
    uint32_t nlinear_free;
    attnd_seq **buckets; /* chained hash of (owner, id) */
    uint32_t nbuckets;   /* power of two */
    uint32_t nseqs;
};

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finaliser: owner and id are small counters, spread them */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t bucket_of(const attnd_cache *c, uint64_t owner, uint64_t id)
{
    return (uint32_t)(mix64(owner * 0x100000001b3ull ^ mix64(id)) & (c->nbuckets - 1));
}

attnd_err attnd_cache_alloc(attnd_cache **out, uint32_t num_blocks, uint32_t block_size,
                            uint32_t max_blocks_per_seq, uint32_t linear_slots)
{
    *out = NULL;
    if (num_blocks == 0 || num_blocks > INT32_MAX || block_size == 0 || max_blocks_per_seq == 0)
        return ATTND_ERR_INVALID_ARGUMENT;
    attnd_cache *c = calloc(1, sizeof *c);
    if (c == NULL) return ATTND_ERR_NO_MEMORY;
    c->num_blocks = num_blocks;
    c->block_size = block_size;
    c->max_blocks_per_seq = max_blocks_per_seq;
    c->linear_slots = linear_slots;
    c->nbuckets = 64;
    c->refs = calloc(num_blocks, sizeof *c->refs);
    c->free_stack = malloc((size_t)num_blocks * sizeof *c->free_stack);
    c->linear_free = malloc((size_t)(linear_slots ? linear_slots : 1) * sizeof(int32_t));
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->refs || !c->free_stack || !c->linear_free || !c->buckets) {
        attnd_cache_free(c);
        return ATTND_ERR_NO_MEMORY;
    }
    /* pushed in reverse so block 0 is handed out first (readable tests and dumps) */
    for (uint32_t i = 0; i < num_blocks; i++)
        c->free_stack[i] = (int32_t)(num_blocks - 1 - i);
    c->nfree = num_blocks;
    for (uint32_t i = 0; i < linear_slots; i++)
        c->linear_free[i] = (int32_t)(linear_slots - 1 - i);
    c->nlinear_free = linear_slots;
    *out = c;
    return ATTND_ERR_OK;
}

static void seq_destroy(attnd_seq *s)
{
    free(s->blocks);
    free(s);
}

void attnd_cache_free(attnd_cache *c)
{
    if (c == NULL) return;
    for (uint32_t b = 0; c->buckets && b < c->nbuckets; b++) {
        attnd_seq *s = c->buckets[b];
        while (s) {
            attnd_seq *next = s->next;
            seq_destroy(s);
            s = next;
        }
    }
    free(c->buckets);
    free(c->refs);
    free(c->free_stack);
    free(c->linear_free);
    free(c);
}

uint32_t attnd_cache_blocks_free(const attnd_cache *c)
{
    return c->nfree;
}

uint32_t attnd_cache_num_blocks(const attnd_cache *c)
{
    return c->num_blocks;
}

uint32_t attnd_cache_block_size(const attnd_cache *c)
{
    return c->block_size;
}

uint32_t attnd_cache_num_seqs(const attnd_cache *c)
{
    return c->nseqs;
}

uint32_t attnd_cache_block_refs(const attnd_cache *c, int32_t block)
{
    return (block >= 0 && (uint32_t)block < c->num_blocks) ? c->refs[block] : 0;
}

uint32_t attnd_cache_linear_free(const attnd_cache *c)
{
    return c->nlinear_free;
}

void attnd_cache_set_window(attnd_cache *c, uint32_t window)
{
    c->window = window;
}

uint64_t attnd_cache_blocks_for(const attnd_cache *c, uint64_t tokens, uint32_t base)
{
    uint64_t logical = (tokens + c->block_size - 1) / c->block_size;
    return logical > base ? logical - base : 0;
}

/* ---------------------------------------------------------------- blocks */

/* Callers check nfree first: popping from an empty stack is a bug, not a condition. */
static int32_t block_take(attnd_cache *c)
{
    int32_t b = c->free_stack[--c->nfree];
    c->refs[b] = 1;
    return b;
}

static void block_unref(attnd_cache *c, int32_t b)
{
    if (--c->refs[b] == 0) c->free_stack[c->nfree++] = b;
}

/* Blocks [0, n) of a list, the last first: the stack then hands them out again in their order,
 * so a prompt's blocks stay runs of consecutive ids (the GPU reads a run as one copy). */
static void blocks_unref(attnd_cache *c, const int32_t *blocks, uint32_t n)
{
    while (n > 0)
        block_unref(c, blocks[--n]);
}

/* ---------------------------------------------------------------- sequences */

attnd_seq *attnd_cache_find(const attnd_cache *c, uint64_t owner, uint64_t id)
{
    for (attnd_seq *s = c->buckets[bucket_of(c, owner, id)]; s; s = s->next)
        if (s->owner == owner && s->id == id) return s;
    return NULL;
}

static void table_grow(attnd_cache *c)
{
    uint32_t nb = c->nbuckets * 2;
    attnd_seq **nbk = calloc(nb, sizeof *nbk);
    if (nbk == NULL) return; /* longer chains, still correct */
    attnd_seq **old = c->buckets;
    uint32_t oldn = c->nbuckets;
    c->buckets = nbk;
    c->nbuckets = nb;
    for (uint32_t b = 0; b < oldn; b++) {
        attnd_seq *s = old[b];
        while (s) {
            attnd_seq *next = s->next;
            uint32_t h = bucket_of(c, s->owner, s->id);
            s->next = nbk[h];
            nbk[h] = s;
            s = next;
        }
    }
    free(old);
}

static void table_insert(attnd_cache *c, attnd_seq *s)
{
    if (c->nseqs >= c->nbuckets) table_grow(c);
    uint32_t h = bucket_of(c, s->owner, s->id);
    s->next = c->buckets[h];
    c->buckets[h] = s;
    c->nseqs++;
}

static void table_remove(attnd_cache *c, attnd_seq *s)
{
    attnd_seq **pp = &c->buckets[bucket_of(c, s->owner, s->id)];
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = s->next;
        c->nseqs--;
    }
}

static attnd_err seq_new(attnd_cache *c, uint64_t owner, uint64_t id, uint32_t cap, attnd_seq **out)
{
    if (id == 0) return ATTND_ERR_INVALID_ARGUMENT;
    if (attnd_cache_find(c, owner, id)) return ATTND_ERR_ALREADY_EXISTS;
    attnd_seq *s = calloc(1, sizeof *s);
    if (s == NULL) return ATTND_ERR_NO_MEMORY;
    s->cap = cap ? cap : 4;
    s->blocks = malloc((size_t)s->cap * sizeof *s->blocks);
    if (s->blocks == NULL) {
        free(s);
        return ATTND_ERR_NO_MEMORY;
    }
    s->owner = owner;
    s->id = id;
    s->linear_slot = -1;
    s->pend_cow_old = -1;
    *out = s;
    return ATTND_ERR_OK;
}

attnd_err attnd_cache_create(attnd_cache *c, uint64_t owner, uint64_t id, attnd_seq **out)
{
    attnd_seq *s;
    attnd_err rv = seq_new(c, owner, id, 0, &s);
    if (rv != ATTND_ERR_OK) return rv;
    table_insert(c, s);
    *out = s;
    return ATTND_ERR_OK;
}

attnd_err attnd_cache_fork(attnd_cache *c, attnd_seq *parent, uint64_t child_id, attnd_seq **out,
                           attnd_cache_copy *linear_copy)
{
    attnd_seq *s;
    attnd_err rv;
    linear_copy->src = linear_copy->dst = -1;
    if (parent->pend_tokens || parent->pend_cow_old >= 0) return ATTND_ERR_INVALID_ARGUMENT;
    if (parent->linear_slot >= 0 && c->nlinear_free == 0) return ATTND_ERR_OUT_OF_BLOCKS;
    if ((rv = seq_new(c, parent->owner, child_id, parent->nblocks, &s)) != ATTND_ERR_OK) return rv;
    for (uint32_t i = 0; i < parent->nblocks; i++) {
        s->blocks[i] = parent->blocks[i];
        c->refs[parent->blocks[i]]++;
    }
    s->nblocks = parent->nblocks;
    s->base = parent->base;
    s->num_tokens = parent->num_tokens;
    if (parent->linear_slot >= 0) {
        s->linear_slot = c->linear_free[--c->nlinear_free];
        linear_copy->src = parent->linear_slot;
        linear_copy->dst = s->linear_slot;
    }
    table_insert(c, s);
    *out = s;
    return ATTND_ERR_OK;
}

void attnd_cache_release(attnd_cache *c, attnd_seq *s)
{
    attnd_cache_abort(c, s);
    blocks_unref(c, s->blocks, s->nblocks);
    if (s->linear_slot >= 0) c->linear_free[c->nlinear_free++] = s->linear_slot;
    table_remove(c, s);
    seq_destroy(s);
}

uint32_t attnd_cache_release_owner(attnd_cache *c, uint64_t owner)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < c->nbuckets; b++) {
        attnd_seq *s = c->buckets[b];
        while (s) {
            attnd_seq *next = s->next;
            if (s->owner == owner) {
                attnd_cache_release(c, s);
                n++;
            }
            s = next;
        }
    }
    return n;
}

void attnd_cache_foreach(const attnd_cache *c, uint64_t owner, void (*fn)(attnd_seq *, void *),
                         void *arg)
{
    for (uint32_t b = 0; b < c->nbuckets; b++)
        for (attnd_seq *s = c->buckets[b]; s; s = s->next)
            if (s->owner == owner) fn(s, arg);
}

/* ---------------------------------------------------------------- steps */

static attnd_err seq_reserve_room(attnd_cache *c, attnd_seq *s, uint32_t need)
{
    if (need <= s->cap) return ATTND_ERR_OK;
    uint32_t cap = s->cap * 2 > need ? s->cap * 2 : need;
    if (cap > c->max_blocks_per_seq) cap = c->max_blocks_per_seq;
    int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
    if (nb == NULL) return ATTND_ERR_NO_MEMORY;
    s->blocks = nb;
    s->cap = cap;
    return ATTND_ERR_OK;
}

attnd_err attnd_cache_reserve(attnd_cache *c, attnd_seq *s, uint32_t n, attnd_cache_copy *cow)
{
    uint32_t bs = c->block_size;
    cow->src = cow->dst = -1;
    if (n == 0 || s->pend_tokens || s->pend_cow_old >= 0) return ATTND_ERR_INVALID_ARGUMENT;
    uint64_t held = attnd_cache_blocks_for(c, (uint64_t)s->num_tokens + n, s->base);
    if (held > c->max_blocks_per_seq) return ATTND_ERR_INVALID_ARGUMENT;
    uint32_t want = (uint32_t)held;
    uint32_t fresh = want - s->nblocks;
    /* a shared partial last block is written by this step: copy it first */
    int cow_needed =
        (s->num_tokens % bs) != 0 && s->nblocks > 0 && c->refs[s->blocks[s->nblocks - 1]] > 1;
    attnd_err rv;
    if (fresh + (uint32_t)cow_needed > c->nfree) return ATTND_ERR_OUT_OF_BLOCKS;
    if ((rv = seq_reserve_room(c, s, want)) != ATTND_ERR_OK) return rv;
    s->pend_nblocks_old = s->nblocks;
    if (cow_needed) {
        /* the old block keeps our reference until commit, so an abort can put it back */
        cow->src = s->blocks[s->nblocks - 1];
        cow->dst = block_take(c);
        s->pend_cow_old = cow->src;
        s->blocks[s->nblocks - 1] = cow->dst;
    }
    while (s->nblocks < want)
        s->blocks[s->nblocks++] = block_take(c);
    s->pend_tokens = n;
    return ATTND_ERR_OK;
}

/* Release the leading blocks no window reaches any more: the next query (position num_tokens)
 * sees keys from num_tokens - window + 1 on. */
static void release_before_window(attnd_cache *c, attnd_seq *s)
{
    if (c->window == 0 || s->num_tokens < c->window) return;
    uint32_t keep = (s->num_tokens - c->window + 1) / c->block_size; /* first logical block kept */
    if (keep <= s->base) return;
    uint32_t drop = keep - s->base;
    blocks_unref(c, s->blocks, drop);
    memmove(s->blocks, s->blocks + drop, (size_t)(s->nblocks - drop) * sizeof *s->blocks);
    s->nblocks -= drop;
    s->base = keep;
}

void attnd_cache_commit(attnd_cache *c, attnd_seq *s)
{
    if (s->pend_cow_old >= 0) block_unref(c, s->pend_cow_old);
    s->pend_cow_old = -1;
    s->num_tokens += s->pend_tokens;
    s->pend_tokens = 0;
    release_before_window(c, s);
}

attnd_err attnd_cache_truncate(attnd_cache *c, attnd_seq *s, uint32_t drop, const char *field,
                               char *err, size_t n)
{
    if (s->pend_tokens || s->pend_cow_old >= 0)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: sequence %llu has tokens "
                          "reserved by an open step",
                          field, (unsigned long long)s->id);
    if (drop > s->num_tokens)
        return attnd_errf(err, n, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: %u tokens to drop, sequence %llu has %u", field, drop,
                          (unsigned long long)s->id, s->num_tokens);
    if (drop > 0 && s->linear_slot >= 0)
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "%s: sequence %llu has linear-attention state, which cannot be rolled "
                          "back",
                          field, (unsigned long long)s->id);
    uint32_t len = s->num_tokens - drop;
    uint64_t first = c->window && len >= c->window ? len - c->window + 1 : 0;
    if (first < (uint64_t)s->base * c->block_size)
        return attnd_errf(err, n, ATTND_ERR_FAILED_PRECONDITION,
                          "%s: dropping %u of %u tokens leaves a next query that sees keys from "
                          "%llu, but the window released every key before %llu",
                          field, drop, s->num_tokens, (unsigned long long)first,
                          (unsigned long long)s->base * c->block_size);
    uint32_t keep = (uint32_t)attnd_cache_blocks_for(c, len, s->base);
    while (s->nblocks > keep)
        block_unref(c, s->blocks[--s->nblocks]);
    s->num_tokens = len;
    return ATTND_ERR_OK;
}

void attnd_cache_abort(attnd_cache *c, attnd_seq *s)
{
    if (s->pend_tokens == 0 && s->pend_cow_old < 0) return;
    while (s->nblocks > s->pend_nblocks_old)
        block_unref(c, s->blocks[--s->nblocks]);
    if (s->pend_cow_old >= 0) {
        block_unref(c, s->blocks[s->nblocks - 1]);
        s->blocks[s->nblocks - 1] = s->pend_cow_old;
    }
    s->pend_cow_old = -1;
    s->pend_tokens = 0;
}

int64_t attnd_cache_slot(const attnd_cache *c, const attnd_seq *s, uint32_t pos)
{
    uint32_t bs = c->block_size;
    return (int64_t)s->blocks[pos / bs - s->base] * bs + pos % bs;
}

attnd_err attnd_cache_linear_slot(attnd_cache *c, attnd_seq *s, int32_t *slot, int *fresh)
{
    *fresh = 0;
    if (s->linear_slot < 0) {
        if (c->linear_slots == 0) return ATTND_ERR_UNSUPPORTED;
        if (c->nlinear_free == 0) return ATTND_ERR_OUT_OF_BLOCKS;
        s->linear_slot = c->linear_free[--c->nlinear_free];
        *fresh = 1;
    }
    *slot = s->linear_slot;
    return ATTND_ERR_OK;
}
