/* Cache manager: the KV block allocator (reference counted), sequences and their block lists,
 * fork with copy-on-write of a shared partial last block, slot mapping, and the linear-attention
 * state slots of sequences.
 *
 * Bookkeeping only: it never touches cache memory. Where data must move (a COW block, a linear
 * state copied by fork) it says which block or slot to copy and the caller copies it. Not thread
 * safe: the executor thread owns it.
 *
 * A step reserves room (attnd_cache_reserve) and then either commits (the tokens become part of
 * the sequence) or aborts (every block it took goes back and the sequence is as it was).
 *
 * Windowed memory: with a window set (every layer of the model windowed, the largest window w),
 * a commit releases the sequence's leading blocks that lie wholly before its next query's window
 * (keys < num_tokens - w + 1): they are never read again. The sequence then holds logical blocks
 * base.. only, and max_blocks_per_seq bounds the blocks it holds, not its length. Attention is
 * invariant to a shift of every position by the same amount (causal, window and ALiBi see only
 * key - query), so a step presents such a sequence to the kernels from block `base` on. */
#ifndef ATTND_STATE_CACHE_H
#define ATTND_STATE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "attnd/err.h"

typedef struct attnd_seq {
    uint64_t owner;       /* session id */
    uint64_t id;          /* client-chosen, non-zero */
    uint32_t num_tokens;  /* committed tokens */
    uint32_t nblocks;     /* blocks held, including those of a pending reservation */
    uint32_t cap;         /* capacity of blocks */
    uint32_t base;        /* leading logical blocks released by the window: blocks[i] is logical
                             block base + i (tokens from base * block_size) */
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
/* Every layer is windowed and the largest window is `window` tokens: commits release the blocks
 * wholly before it (0 = keep every block, the default). */
void attnd_cache_set_window(attnd_cache *c, uint32_t window);
/* Held blocks a sequence of `tokens` tokens with `base` released leading blocks needs. */
uint64_t attnd_cache_blocks_for(const attnd_cache *c, uint64_t tokens, uint32_t base);

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
 * layer before writing. INVALID_ARGUMENT (n == 0, already reserved, more held blocks than
 * max_blocks_per_seq), OUT_OF_BLOCKS (nothing changed then), NO_MEMORY. */
attnd_err attnd_cache_reserve(attnd_cache *c, attnd_seq *s, uint32_t n, attnd_cache_copy *cow);
/* The reserved tokens become part of the sequence; with a window, blocks wholly before the next
 * query's window are released. */
void attnd_cache_commit(attnd_cache *c, attnd_seq *s);
/* Drop the last `drop` tokens of s (no reservation pending): blocks past the new end are
 * released (a block another sequence shares keeps its rows; the next write to a shared partial
 * block copies it first). INVALID_ARGUMENT (pending reservation, drop > num_tokens),
 * FAILED_PRECONDITION when the shorter sequence's next query would need keys the window already
 * released, or when s has linear-attention state (a recurrence cannot be rolled back); err says
 * which, naming `field`. */
attnd_err attnd_cache_truncate(attnd_cache *c, attnd_seq *s, uint32_t drop, const char *field,
                               char *err, size_t n);
/* Undo the reservation: blocks it took are freed, a COW'd block is put back. */
void attnd_cache_abort(attnd_cache *c, attnd_seq *s);
/* Slot (block * block_size + row) of token position pos (committed or reserved, not released). */
int64_t attnd_cache_slot(const attnd_cache *c, const attnd_seq *s, uint32_t pos);

/* The sequence's linear state slot, assigned on first use (*fresh = 1: the caller zeroes it).
 * OUT_OF_BLOCKS when none is free, UNSUPPORTED when the cache has no linear slots. */
attnd_err attnd_cache_linear_slot(attnd_cache *c, attnd_seq *s, int32_t *slot, int *fresh);

/* Call fn for every sequence of owner (fn must not release sequences). */
void attnd_cache_foreach(const attnd_cache *c, uint64_t owner, void (*fn)(attnd_seq *, void *),
                         void *arg);

#endif
