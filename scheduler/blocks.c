/*
 * scheduler/blocks.c: the block pool, its LRU free list and the prefix-cache
 * hash table (see blocks.h). All operations are O(1) except hashing, which is
 * O(block_tokens). Single-threaded: the step loop owns it.
 */
#include "blocks.h"

#include <stdlib.h>
#include <string.h>

/* ---- Hashing ---- */

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 31;
	return x;
}

struct sched_block_hash sched_block_hash_root(uint64_t salt)
{
	struct sched_block_hash h = {mix64(salt ^ 0x243F6A8885A308D3ull), mix64(salt + 0x13198A2E03707344ull)};
	return h;
}

struct sched_block_hash sched_block_hash_next(struct sched_block_hash parent, const int32_t *tokens, uint32_t n)
{
	uint64_t a = parent.a ^ 0xA4093822299F31D0ull, b = parent.b ^ 0x082EFA98EC4E6C89ull;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t t = (uint32_t)tokens[i];
		a = mix64(a ^ (t + 0x9E3779B97F4A7C15ull)) + i;
		b = mix64((b + t) * 0xD6E8FEB86659FD93ull) ^ (b >> 17);
	}
	struct sched_block_hash h = {mix64(a ^ n), mix64(b + n)};
	return h;
}

/* ---- Free list ---- */

static void list_unlink(struct sched_blocks *bm, uint32_t id)
{
	struct sched__blk *k = &bm->b[id];
	if (k->prev != SCHED_BLOCK_NONE)
		bm->b[k->prev].next = k->next;
	else
		bm->free_head = k->next;
	if (k->next != SCHED_BLOCK_NONE)
		bm->b[k->next].prev = k->prev;
	else
		bm->free_tail = k->prev;
	k->prev = k->next = SCHED_BLOCK_NONE;
	k->in_free = false;
	bm->n_free--;
	if (k->hashed)
		bm->n_cached_free--;
}

static void list_push_head(struct sched_blocks *bm, uint32_t id)
{
	struct sched__blk *k = &bm->b[id];
	k->prev = SCHED_BLOCK_NONE;
	k->next = bm->free_head;
	if (bm->free_head != SCHED_BLOCK_NONE)
		bm->b[bm->free_head].prev = id;
	else
		bm->free_tail = id;
	bm->free_head = id;
	k->in_free = true;
	bm->n_free++;
}

static void list_push_tail(struct sched_blocks *bm, uint32_t id)
{
	struct sched__blk *k = &bm->b[id];
	k->next = SCHED_BLOCK_NONE;
	k->prev = bm->free_tail;
	if (bm->free_tail != SCHED_BLOCK_NONE)
		bm->b[bm->free_tail].next = id;
	else
		bm->free_head = id;
	bm->free_tail = id;
	k->in_free = true;
	bm->n_free++;
	if (k->hashed)
		bm->n_cached_free++;
}

/* ---- Hash table (linear probing, backward-shift deletion) ---- */

static inline bool hash_eq(struct sched_block_hash x, struct sched_block_hash y)
{
	return x.a == y.a && x.b == y.b;
}

static uint32_t table_find_slot(const struct sched_blocks *bm, struct sched_block_hash h)
{
	uint32_t i = (uint32_t)h.a & bm->table_mask;
	while (bm->table[i] && !hash_eq(bm->b[bm->table[i] - 1].hash, h))
		i = (i + 1) & bm->table_mask;
	return i;
}

static void table_remove(struct sched_blocks *bm, uint32_t id)
{
	uint32_t i = table_find_slot(bm, bm->b[id].hash);
	if (bm->table[i] != id + 1)
		return;
	bm->table[i] = 0;
	/* Shift later entries of the same probe run back into the hole. */
	uint32_t j = i;
	for (;;) {
		j = (j + 1) & bm->table_mask;
		if (!bm->table[j])
			break;
		uint32_t home = (uint32_t)bm->b[bm->table[j] - 1].hash.a & bm->table_mask;
		/* Entry at j may move to i iff its home is not in (i, j] cyclically. */
		bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
		if (!in_range) {
			bm->table[i] = bm->table[j];
			bm->table[j] = 0;
			i = j;
		}
	}
	bm->b[id].hashed = false;
	bm->n_hashed--;
}

/* ---- API ---- */

enum status sched_blocks_init(struct sched_blocks *bm, uint32_t n_blocks)
{
	memset(bm, 0, sizeof(*bm));
	uint32_t cap = 16;
	while (cap < 2 * n_blocks)
		cap *= 2;
	bm->b = calloc(n_blocks ? n_blocks : 1, sizeof(*bm->b));
	bm->table = calloc(cap, sizeof(*bm->table));
	if (!bm->b || !bm->table) {
		sched_blocks_fini(bm);
		return ST_NOMEM;
	}
	bm->n = n_blocks;
	bm->table_mask = cap - 1;
	bm->free_head = bm->free_tail = SCHED_BLOCK_NONE;
	for (uint32_t i = 0; i < n_blocks; i++)
		list_push_tail(bm, i);
	return ST_OK;
}

void sched_blocks_fini(struct sched_blocks *bm)
{
	free(bm->b);
	free(bm->table);
	memset(bm, 0, sizeof(*bm));
}

uint32_t sched_blocks_alloc(struct sched_blocks *bm)
{
	uint32_t id = bm->free_head;
	if (id == SCHED_BLOCK_NONE)
		return id;
	list_unlink(bm, id);
	if (bm->b[id].hashed)
		table_remove(bm, id); /* eviction of the least recently used cached block */
	bm->b[id].ref = 1;
	return id;
}

void sched_blocks_ref(struct sched_blocks *bm, uint32_t id)
{
	struct sched__blk *k = &bm->b[id];
	if (k->in_free)
		list_unlink(bm, id);
	k->ref++;
}

void sched_blocks_release(struct sched_blocks *bm, uint32_t id)
{
	struct sched__blk *k = &bm->b[id];
	if (!k->ref)
		return;
	if (--k->ref)
		return;
	if (k->hashed)
		list_push_tail(bm, id);
	else
		list_push_head(bm, id);
}

uint32_t sched_blocks_lookup(const struct sched_blocks *bm, struct sched_block_hash h)
{
	uint32_t i = table_find_slot(bm, h);
	return bm->table[i] ? bm->table[i] - 1 : SCHED_BLOCK_NONE;
}

bool sched_blocks_publish(struct sched_blocks *bm, uint32_t id, struct sched_block_hash h)
{
	if (bm->b[id].hashed)
		return false;
	uint32_t i = table_find_slot(bm, h);
	if (bm->table[i])
		return false;
	bm->table[i] = id + 1;
	bm->b[id].hash = h;
	bm->b[id].hashed = true;
	bm->n_hashed++;
	if (bm->b[id].in_free)
		bm->n_cached_free++;
	return true;
}

enum status sched_blocks_check(const struct sched_blocks *bm, const uint32_t *ref_expect, struct err *e)
{
	uint32_t n_free = 0, n_cached = 0, prev = SCHED_BLOCK_NONE;
	for (uint32_t id = bm->free_head; id != SCHED_BLOCK_NONE; id = bm->b[id].next) {
		if (++n_free > bm->n)
			return err_set(e, ST_INVALID, "free list has a cycle");
		if (bm->b[id].prev != prev)
			return err_set(e, ST_INVALID, "block %u: bad prev link", id);
		if (!bm->b[id].in_free || bm->b[id].ref)
			return err_set(e, ST_INVALID, "block %u on the free list with ref %u", id, bm->b[id].ref);
		n_cached += bm->b[id].hashed;
		prev = id;
	}
	if (prev != bm->free_tail)
		return err_set(e, ST_INVALID, "free list tail mismatch");
	if (n_free != bm->n_free || n_cached != bm->n_cached_free)
		return err_set(e, ST_INVALID, "free counts %u/%u, list has %u/%u", bm->n_free, bm->n_cached_free,
			       n_free, n_cached);
	uint32_t n_hashed = 0;
	for (uint32_t id = 0; id < bm->n; id++) {
		const struct sched__blk *k = &bm->b[id];
		if (!k->in_free && !k->ref)
			return err_set(e, ST_INVALID, "block %u leaked: ref 0 and not free", id);
		if (ref_expect && ref_expect[id] != k->ref)
			return err_set(e, ST_INVALID, "block %u: ref %u, sequences hold %u", id, k->ref, ref_expect[id]);
		if (k->hashed) {
			n_hashed++;
			if (sched_blocks_lookup(bm, k->hash) != id)
				return err_set(e, ST_INVALID, "block %u hashed but not found in the table", id);
		}
	}
	uint32_t n_table = 0;
	for (uint32_t i = 0; i <= bm->table_mask; i++)
		if (bm->table[i]) {
			n_table++;
			if (!bm->b[bm->table[i] - 1].hashed)
				return err_set(e, ST_INVALID, "table slot %u names unhashed block %u", i, bm->table[i] - 1);
		}
	if (n_hashed != bm->n_hashed || n_table != n_hashed)
		return err_set(e, ST_INVALID, "hashed count %u, table %u, flags %u", bm->n_hashed, n_table, n_hashed);
	return ST_OK;
}
