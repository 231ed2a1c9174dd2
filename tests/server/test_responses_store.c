/*
 * tests/server/test_responses_store.c: the bounded /v1/responses store
 * against a reference model: random puts (fresh and replacing ids, random
 * sizes, some larger than the whole store), gets and deletes; after every
 * operation the held bytes never exceed the bound, eviction took the oldest
 * entries first (the store holds exactly the model's newest entries that
 * fit), every held entry reads back byte for byte and every evicted or
 * deleted id is ST_NOTFOUND.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/responses_store.h"
#include "tests/test.h"

#define MAX_IDS 64

struct ref {
	char id[32];
	size_t resp_len, hist_len;
	unsigned fill;
	unsigned long long order; /* insertion stamp; 0 = not held */
};

static void fill_text(char *buf, size_t n, unsigned fill)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)('a' + (fill + i * 7) % 26);
}

int main(void)
{
	unsigned seed = getenv("DSV4_TEST_SEED") ? (unsigned)atoi(getenv("DSV4_TEST_SEED")) : (unsigned)time(NULL);
	printf("seed %u\n", seed);
	srand(seed);
	const size_t max_bytes = 4096 + (size_t)(rand() % 4096);
	struct resp_store *s = NULL;
	struct err e = {0};
	T_CHECK(resp_store_create(&s, max_bytes, &e) == ST_OK);
	struct ref ref[MAX_IDS];
	memset(ref, 0, sizeof ref);
	for (int i = 0; i < MAX_IDS; i++)
		snprintf(ref[i].id, sizeof ref[i].id, "resp_%d_%d", i, rand() % 1000);
	unsigned long long stamp = 0;
	char *buf = malloc(2 * max_bytes + 64);
	char *want = malloc(2 * max_bytes + 64);
	for (int op = 0; op < 3000; op++) {
		int k = rand() % MAX_IDS;
		int what = rand() % 10;
		if (what < 6) { /* put */
			size_t rl = (size_t)(rand() % (rand() % 8 ? 600 : (int)max_bytes + 200));
			size_t hl = (size_t)(rand() % 300);
			unsigned fill = (unsigned)rand();
			fill_text(buf, rl, fill);
			fill_text(buf + rl, hl, fill + 1);
			enum status st = resp_store_put(s, ref[k].id, buf, rl, buf + rl, hl);
			size_t bytes = strlen(ref[k].id) + rl + hl;
			if (bytes > max_bytes) {
				T_CHECKF(st == ST_INVALID, "op %d: an entry larger than the store is refused", op);
				continue; /* the old entry, if any, stays */
			}
			T_CHECKF(st == ST_OK, "op %d: put", op);
			ref[k].order = 0; /* replaced */
			/* evict the model's oldest until the new one fits */
			for (;;) {
				size_t held = 0;
				int oldest = -1;
				for (int i = 0; i < MAX_IDS; i++)
					if (ref[i].order) {
						held += strlen(ref[i].id) + ref[i].resp_len + ref[i].hist_len;
						if (oldest < 0 || ref[i].order < ref[oldest].order)
							oldest = i;
					}
				if (held + bytes <= max_bytes || oldest < 0)
					break;
				ref[oldest].order = 0;
			}
			ref[k].resp_len = rl;
			ref[k].hist_len = hl;
			ref[k].fill = fill;
			ref[k].order = ++stamp;
		} else if (what < 8) { /* delete */
			bool had = resp_store_delete(s, ref[k].id);
			T_CHECKF(had == (ref[k].order != 0), "op %d: delete %s (held %d)", op, ref[k].id, ref[k].order != 0);
			ref[k].order = 0;
		}
		/* compare everything */
		size_t held = 0;
		uint32_t n = 0;
		for (int i = 0; i < MAX_IDS; i++) {
			char *r = NULL, *h = NULL;
			size_t rl = 0, hl = 0;
			enum status st = resp_store_get(s, ref[i].id, &r, &rl, &h, &hl);
			if (!ref[i].order) {
				T_CHECKF(st == ST_NOTFOUND, "op %d: %s not held", op, ref[i].id);
			} else {
				n++;
				held += strlen(ref[i].id) + ref[i].resp_len + ref[i].hist_len;
				T_CHECKF(st == ST_OK && rl == ref[i].resp_len && hl == ref[i].hist_len, "op %d: %s held", op,
					 ref[i].id);
				if (st == ST_OK) {
					fill_text(want, rl, ref[i].fill);
					fill_text(want + rl, hl, ref[i].fill + 1);
					T_CHECKF(!memcmp(r, want, rl) && !memcmp(h, want + rl, hl) && !r[rl] && !h[hl],
						 "op %d: %s reads back", op, ref[i].id);
				}
			}
			free(r);
			free(h);
		}
		T_CHECKF(resp_store_bytes(s) == held && held <= max_bytes, "op %d: bytes %zu (model %zu, max %zu)", op,
			 resp_store_bytes(s), held, max_bytes);
		T_CHECKF(resp_store_count(s) == n, "op %d: count", op);
		if (test_n_failed > 20)
			break;
	}
	/* an unknown id */
	T_CHECK(resp_store_get(s, "resp_nope", NULL, NULL, NULL, NULL) == ST_NOTFOUND);
	free(buf);
	free(want);
	resp_store_destroy(s);
	resp_store_destroy(NULL);
	return test_exit();
}
