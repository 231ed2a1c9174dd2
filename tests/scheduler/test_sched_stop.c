/*
 * tests/scheduler/test_sched_stop.c: the stop-string matcher alone, on random
 * texts cut into random pieces (with multi-byte UTF-8 characters split
 * across pieces), against a brute-force reference: generation stops on the
 * first piece that completes an occurrence of any stop string, the released
 * bytes are exactly the text before the earliest-starting occurrence complete
 * by then, and before the end no release stops inside a UTF-8 character.
 * Stop strings are whole UTF-8 (the scheduler refuses others, as every API
 * gives them as JSON strings); they start and end anywhere in the text's
 * characters' sequence.
 */
#include <string.h>
#include <time.h>

#include "scheduler/stop.h"
#include "tests/test.h"

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((g_rng >> 33) % n);
}

static bool utf8_complete(const char *s, uint32_t n)
{
	uint32_t i = 0;
	while (i < n) {
		unsigned char c = (unsigned char)s[i];
		uint32_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
		if (i + len > n)
			return false;
		i += len;
	}
	return true;
}

int main(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	g_rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
	static const char *const atoms[] = {"a", "b", "c", "ab", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", " "};
	for (int trial = 0; trial < 3000; trial++) {
		char text[400];
		uint32_t n = 0, bnd[400], n_bnd = 0; /* character boundaries */
		while (n < 300) {
			const char *a = atoms[rnd(8)];
			bnd[n_bnd++] = n;
			memcpy(text + n, a, strlen(a));
			n += (uint32_t)strlen(a);
		}
		bnd[n_bnd] = n;
		/* stop strings: substrings of the text (so they usually match) or random atoms */
		struct sched_stop_set set = {0};
		char *strs[3];
		uint32_t lens[3];
		set.n = 1 + rnd(3);
		set.strs = strs;
		set.lens = lens;
		for (uint32_t i = 0; i < set.n; i++) {
			uint32_t b0 = rnd(n_bnd - 8), b1 = b0 + 1;
			while (b1 < n_bnd && bnd[b1 + 1] - bnd[b0] <= 8 && rnd(2))
				b1++;
			bool from_text = rnd(4) != 0;
			uint32_t L = from_text ? bnd[b1] - bnd[b0] : 1 + rnd(8), at = bnd[b0];
			strs[i] = malloc(L + 1);
			if (from_text) {
				memcpy(strs[i], text + at, L);
			} else {
				for (uint32_t k = 0; k < L; k++)
					strs[i][k] = "xyz"[rnd(3)];
			}
			strs[i][L] = 0;
			lens[i] = L;
		}
		/* the pieces, decided up front */
		uint32_t cut[400], n_cut = 0;
		for (uint32_t off = 0; off < n;) {
			uint32_t k = 1 + rnd(6);
			off = off + k > n ? n : off + k;
			cut[n_cut++] = off;
		}
		/* reference: generation stops on the first piece that completes any
		 * occurrence; among occurrences complete by then, the earliest start
		 * (lower index on ties) is where the text ends */
		uint32_t first = UINT32_MAX, stop_piece = n_cut;
		int32_t first_idx = -1;
		for (uint32_t c = 0; c < n_cut && first_idx < 0; c++) {
			for (uint32_t i = 0; i < set.n; i++)
				for (uint32_t at = 0; at + lens[i] <= cut[c]; at++)
					if (!memcmp(text + at, strs[i], lens[i]) && at < first) {
						first = at;
						first_idx = (int32_t)i;
						break;
					}
			if (first_idx >= 0)
				stop_piece = c;
		}
		struct sched_stop m = {0};
		char *out = NULL;
		uint32_t out_n = 0, off = 0, c = 0;
		int32_t hit = -1;
		bool nomem = false, bad_utf8 = false;
		for (; c < n_cut && hit < 0; c++) {
			bool final = c + 1 == n_cut;
			hit = sched_stop_feed(&m, &set, text + off, cut[c] - off, final, &out, &out_n, &nomem);
			off = cut[c];
			if (hit < 0 && !final && !utf8_complete(out ? out : "", out_n))
				bad_utf8 = true;
		}
		T_CHECK(!nomem && !bad_utf8);
		if (first_idx >= 0) {
			T_CHECKF(hit == first_idx && out_n == first && (!first || !memcmp(out, text, first)) &&
					 c == stop_piece + 1,
				 "trial %d: hit %d released %u at piece %u, want match %d at %u on piece %u", trial, hit,
				 out_n, c - 1, first_idx, first, stop_piece);
		} else {
			T_CHECKF(hit < 0 && out_n == n && !memcmp(out, text, n), "trial %d: released %u of %u", trial, out_n, n);
		}
		free(out);
		sched_stop_fini(&m);
		for (uint32_t i = 0; i < set.n; i++)
			free(strs[i]);
	}
	return test_exit();
}
