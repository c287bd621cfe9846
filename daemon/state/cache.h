/* Cache manager: the KV block allocator (reference counted), sequences and their block lists,
 * fork with copy-on-write of a shared partial last block, slot mapping, and the linear-attention
 * state slots of sequences.
 *
 * Bookkeeping only: it never touches cache memory. Where data must move (a COW block, a linear
 * state copied by fork) it says which block or slot to copy and the caller copies it. Not thread
 * safe: the executor thread owns it.
 *
 * A step reserves room (attnd_cache_reserve) and then either commits (the tokens become part of
 * the sequence) or aborts (every block it took goes back and the sequence is as it was). */
#ifndef ATTND_STATE_CACHE_H
#define ATTND_STATE_CACHE_H

#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_seq {
    uint64_t owner;       /* session id */
    uint64_t id;          /* client-chosen, non-zero */
    uint32_t num_tokens;  /* committed tokens */
    uint32_t nblocks;     /* blocks in use, including those of a pending reservation */
    uint32_t cap;         /* capacity of blocks */
    int32_t *blocks;      /* physical block ids */
    uint64_t step;        /* open step holding it, 0 if none (set by the caller) */
    int32_t linear_slot;  /* linear-attention state slot, -1 if none */
    uint32_t pend_tokens; /* tokens reserved by an open step */
    uint32_t pend_nblocks_old;
    int32_t pend_cow_old; /* block replaced by copy-on-write, kept until commit; -1 none */
    struct attnd_seq *next;
} attnd_seq;

/* A block (or a linear state slot) to copy: dst = src. */
typedef struct attnd_cache_copy {
    int32_t src, dst; /* -1, -1 when nothing is to be copied */
} attnd_cache_copy;

typedef struct attnd_cache attnd_cache;

attnd_err attnd_cache_alloc(attnd_cache **c, uint32_t num_blocks, uint32_t block_size,
                            uint32_t max_blocks_per_seq, uint32_t linear_slots);
void attnd_cache_free(attnd_cache *c);

uint32_t attnd_cache_blocks_free(const attnd_cache *c);
uint32_t attnd_cache_num_blocks(const attnd_cache *c);
uint32_t attnd_cache_block_size(const attnd_cache *c);
uint32_t attnd_cache_num_seqs(const attnd_cache *c);
/* Reference count of a block (0 = free). */
uint32_t attnd_cache_block_refs(const attnd_cache *c, int32_t block);
uint32_t attnd_cache_linear_free(const attnd_cache *c);

attnd_seq *attnd_cache_find(const attnd_cache *c, uint64_t owner, uint64_t id);
/* New empty sequence. INVALID_ARGUMENT for id 0, ALREADY_EXISTS, NO_MEMORY. */
attnd_err attnd_cache_create(attnd_cache *c, uint64_t owner, uint64_t id, attnd_seq **out);
/* New sequence child_id of the parent's owner sharing all of the parent's blocks. When the
 * parent has a linear state slot the child gets its own (OUT_OF_BLOCKS when none is free) and
 * linear_copy says which slot to copy; otherwise linear_copy is {-1, -1}. The parent must have
 * no pending reservation (INVALID_ARGUMENT). */
attnd_err attnd_cache_fork(attnd_cache *c, attnd_seq *parent, uint64_t child_id, attnd_seq **out,
                           attnd_cache_copy *linear_copy);
/* Drop a sequence (aborting its pending reservation): blocks are unreferenced, its linear slot
 * freed. */
void attnd_cache_release(attnd_cache *c, attnd_seq *s);
/* Release every sequence of owner; returns how many. */
uint32_t attnd_cache_release_owner(attnd_cache *c, uint64_t owner);

/* Reserve n >= 1 new tokens at the end of s. When the last block is partial and shared, it is
 * replaced by a fresh block and cow says {old, new}: the caller copies the block's rows in every
 * layer before writing. INVALID_ARGUMENT (n == 0, already reserved, over max_blocks_per_seq),
 * OUT_OF_BLOCKS (nothing changed then), NO_MEMORY. */
attnd_err attnd_cache_reserve(attnd_cache *c, attnd_seq *s, uint32_t n, attnd_cache_copy *cow);
/* The reserved tokens become part of the sequence. */
void attnd_cache_commit(attnd_cache *c, attnd_seq *s);
/* Undo the reservation: blocks it took are freed, a COW'd block is put back. */
void attnd_cache_abort(attnd_cache *c, attnd_seq *s);
/* Slot (block * block_size + row) of token position pos (committed or reserved). */
int64_t attnd_cache_slot(const attnd_cache *c, const attnd_seq *s, uint32_t pos);

/* The sequence's linear state slot, assigned on first use (*fresh = 1: the caller zeroes it).
 * OUT_OF_BLOCKS when none is free, UNSUPPORTED when the cache has no linear slots. */
attnd_err attnd_cache_linear_slot(attnd_cache *c, attnd_seq *s, int32_t *slot, int *fresh);

/* Call fn for every sequence of owner (fn must not release sequences). */
void attnd_cache_foreach(const attnd_cache *c, uint64_t owner, void (*fn)(attnd_seq *, void *),
                         void *arg);

#endif
