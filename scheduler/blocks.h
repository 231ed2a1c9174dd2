/*
 * scheduler/blocks.h: the paged block pool (internal to scheduler/).
 *
 * Every block is either referenced (ref > 0, held by one or more sequences)
 * or free (ref == 0, on the free list). A free block may still be CACHED: it
 * keeps its chained hash in the table and can be revived by a prefix hit
 * until an allocation evicts it. The free list is ordered for eviction:
 * uncached free blocks at the head (taken first), cached ones appended at
 * the tail when released (least recently used evicted first).
 */
#ifndef DSV4_SCHEDULER_BLOCKS_H
#define DSV4_SCHEDULER_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define SCHED_BLOCK_NONE UINT32_MAX

/* 128-bit chained block hash: two independent 64-bit lanes, so that a
 * collision (which would silently reuse a wrong block) has probability
 * ~2^-128 per lookup; blocks store no tokens to verify against. */
struct sched_block_hash {
	uint64_t a, b;
};

/* Hash of block k from the hash of block k-1 (parent, or {salt, 0} for the
 * first block) and its block_tokens token ids. */
struct sched_block_hash sched_block_hash_next(struct sched_block_hash parent, const int32_t *tokens, uint32_t n);
struct sched_block_hash sched_block_hash_root(uint64_t salt);

struct sched__blk {
	uint32_t ref;
	uint32_t prev, next; /* free-list links, SCHED_BLOCK_NONE at the ends */
	bool in_free;
	bool hashed;
	struct sched_block_hash hash;
};

struct sched_blocks {
	uint32_t n;
	struct sched__blk *b;
	uint32_t free_head, free_tail, n_free, n_cached_free;
	uint32_t *table; /* open addressing, linear probing: block id + 1, 0 = empty */
	uint32_t table_mask;
	uint32_t n_hashed;
};

enum status sched_blocks_init(struct sched_blocks *bm, uint32_t n_blocks) DSV4_WUR;
void sched_blocks_fini(struct sched_blocks *bm);

/* A fresh block (ref 1), evicting the least recently used cached one if
 * needed; SCHED_BLOCK_NONE when every block is referenced. */
uint32_t sched_blocks_alloc(struct sched_blocks *bm);
/* Add a reference (a shared or cache-hit block; revives a free cached one). */
void sched_blocks_ref(struct sched_blocks *bm, uint32_t id);
/* Drop a reference; at zero the block goes to the free list. */
void sched_blocks_release(struct sched_blocks *bm, uint32_t id);
/* Cached block with this hash, or SCHED_BLOCK_NONE. */
uint32_t sched_blocks_lookup(const struct sched_blocks *bm, struct sched_block_hash h);
/* Publish a complete block under h. False (and nothing changes) when another
 * block already holds h or this one is already published. */
bool sched_blocks_publish(struct sched_blocks *bm, uint32_t id, struct sched_block_hash h);

static inline uint32_t sched_blocks_n_free(const struct sched_blocks *bm) { return bm->n_free; }

/* Check list, counts and table against each other. ref_expect (may be NULL):
 * the reference count every block should have, recounted by the caller. */
enum status sched_blocks_check(const struct sched_blocks *bm, const uint32_t *ref_expect, struct err *e);

#endif
