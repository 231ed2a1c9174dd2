/*
 * tests/scheduler/test_sched_blocks.c: the block pool alone: reference
 * counts, the LRU order of eviction, publish/lookup, hash chaining, and the
 * hash table under many insertions and evictions (checked against a
 * brute-force model after every operation).
 */
#include <time.h>

#include "scheduler/blocks.h"
#include "tests/test.h"

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((g_rng >> 33) % n);
}

static void check(struct sched_blocks *bm, const uint32_t *ref)
{
	struct err e = {0};
	T_CHECKF(sched_blocks_check(bm, ref, &e) == ST_OK, "%s", e.msg);
}

static void test_hash(void)
{
	int32_t a[16], b[16];
	for (int i = 0; i < 16; i++)
		a[i] = b[i] = (int32_t)rnd(129280);
	struct sched_block_hash r0 = sched_block_hash_root(0), r1 = sched_block_hash_root(1);
	struct sched_block_hash h1 = sched_block_hash_next(r0, a, 16), h2 = sched_block_hash_next(r0, b, 16);
	T_CHECK(h1.a == h2.a && h1.b == h2.b);
	b[15] ^= 1;
	h2 = sched_block_hash_next(r0, b, 16);
	T_CHECK(h1.a != h2.a && h1.b != h2.b);
	/* same tokens under a different parent or salt hash differently */
	struct sched_block_hash h3 = sched_block_hash_next(h1, a, 16), h4 = sched_block_hash_next(h2, a, 16);
	T_CHECK(h3.a != h4.a && h3.b != h4.b);
	h4 = sched_block_hash_next(r1, a, 16);
	T_CHECK(h1.a != h4.a && h1.b != h4.b);
	/* order matters */
	int32_t c[16];
	for (int i = 0; i < 16; i++)
		c[i] = a[15 - i];
	h4 = sched_block_hash_next(r0, c, 16);
	T_CHECK(h1.a != h4.a);
}

static void test_lru(void)
{
	struct sched_blocks bm;
	T_CHECK(sched_blocks_init(&bm, 6) == ST_OK);
	uint32_t ref[6] = {0};
	uint32_t ids[6];
	for (int i = 0; i < 6; i++) {
		ids[i] = sched_blocks_alloc(&bm);
		T_CHECK(ids[i] != SCHED_BLOCK_NONE);
		ref[ids[i]] = 1;
	}
	T_CHECK(sched_blocks_alloc(&bm) == SCHED_BLOCK_NONE && sched_blocks_n_free(&bm) == 0);
	check(&bm, ref);
	struct sched_block_hash hs[6];
	for (int i = 0; i < 6; i++) {
		hs[i] = sched_block_hash_root(100 + i);
		T_CHECK(sched_blocks_publish(&bm, ids[i], hs[i]));
	}
	T_CHECK(!sched_blocks_publish(&bm, ids[0], hs[1])); /* already published */
	/* release 0..3 in this order: cached, so evicted in the same order */
	for (int i = 0; i < 4; i++) {
		sched_blocks_release(&bm, ids[i]);
		ref[ids[i]] = 0;
	}
	T_CHECK(bm.n_cached_free == 4 && sched_blocks_n_free(&bm) == 4);
	check(&bm, ref);
	/* a hit revives block 1 (ref 1, off the free list) */
	T_CHECK(sched_blocks_lookup(&bm, hs[1]) == ids[1]);
	sched_blocks_ref(&bm, ids[1]);
	ref[ids[1]] = 1;
	check(&bm, ref);
	/* allocation evicts the least recently released cached block: 0, then 2 */
	uint32_t x = sched_blocks_alloc(&bm);
	T_CHECK(x == ids[0] && sched_blocks_lookup(&bm, hs[0]) == SCHED_BLOCK_NONE);
	ref[x] = 1;
	uint32_t y = sched_blocks_alloc(&bm);
	T_CHECK(y == ids[2] && sched_blocks_lookup(&bm, hs[2]) == SCHED_BLOCK_NONE);
	ref[y] = 1;
	check(&bm, ref);
	/* an unpublished block released goes to the head: taken before cached ones */
	sched_blocks_release(&bm, x);
	ref[x] = 0;
	T_CHECK(sched_blocks_alloc(&bm) == x);
	ref[x] = 1;
	/* a second reference keeps the block out of the free list */
	sched_blocks_ref(&bm, ids[4]);
	ref[ids[4]]++;
	sched_blocks_release(&bm, ids[4]);
	ref[ids[4]]--;
	T_CHECK(!bm.b[ids[4]].in_free);
	check(&bm, ref);
	/* duplicate content: the second publisher stays unpublished */
	T_CHECK(!sched_blocks_publish(&bm, x, hs[3]));
	T_CHECK(sched_blocks_lookup(&bm, hs[3]) == ids[3]);
	sched_blocks_fini(&bm);
}

/* Random operations against a brute-force model of the table. */
static void test_random(void)
{
	enum { N = 97 };
	struct sched_blocks bm;
	T_CHECK(sched_blocks_init(&bm, N) == ST_OK);
	uint32_t ref[N] = {0};
	bool pub[N] = {0};
	struct sched_block_hash h[N];
	uint64_t next = 1;
	for (int it = 0; it < 20000; it++) {
		uint32_t op = rnd(4);
		if (op == 0) {
			uint32_t id = sched_blocks_alloc(&bm);
			if (id == SCHED_BLOCK_NONE) {
				for (uint32_t i = 0; i < N; i++)
					T_CHECK(ref[i] > 0);
				continue;
			}
			T_CHECK(ref[id] == 0);
			ref[id] = 1;
			pub[id] = false;
		} else if (op == 1) {
			uint32_t id = rnd(N);
			if (ref[id]) {
				sched_blocks_release(&bm, id);
				ref[id]--;
			}
		} else if (op == 2) {
			uint32_t id = rnd(N);
			if (ref[id] && !pub[id]) {
				/* low bits collide on purpose to exercise probing and backward shift */
				uint64_t lo = next & 7, hi = (uint64_t)rnd(1u << 30) << 8;
				struct sched_block_hash x = {lo | hi, next++};
				T_CHECK(sched_blocks_publish(&bm, id, x));
				h[id] = x;
				pub[id] = true;
			}
		} else {
			uint32_t id = rnd(N);
			if (pub[id]) {
				T_CHECK(sched_blocks_lookup(&bm, h[id]) == id);
				sched_blocks_ref(&bm, id);
				ref[id]++;
			}
		}
		/* a block is evicted exactly when it is allocated again */
		for (uint32_t i = 0; i < N; i++)
			if (pub[i] && !bm.b[i].hashed)
				pub[i] = false;
		if (it % 97 == 0)
			check(&bm, ref);
	}
	check(&bm, ref);
	for (uint32_t i = 0; i < N; i++)
		if (pub[i])
			T_CHECK(sched_blocks_lookup(&bm, h[i]) == i);
	sched_blocks_fini(&bm);
}

int main(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	g_rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
	test_hash();
	test_lru();
	test_random();
	return test_exit();
}
