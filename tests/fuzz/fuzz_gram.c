/*
 * tests/fuzz/fuzz_gram.c: libFuzzer target for the structured-output
 * grammar compiler (model/gram.h) on arbitrary bytes: the first byte picks
 * a JSON Schema (response_format json_schema) or an OpenAI tools array
 * (required / auto, thinking or not), the rest is the JSON. A grammar that
 * compiles is walked over a byte vocabulary (256 one-byte tokens + eos):
 * at each step the mask is filled, and the token chosen from it (by the
 * input's bytes, cycling) must be accepted: a mask that allows a token the
 * state then refuses is a finding, as is any sanitizer report.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gram.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct gram_vocab *g_vocab;
static char g_bytes[256];

static const char *piece(void *ctx, int32_t id, size_t *len)
{
	(void)ctx;
	if (id < 0 || id >= 256) {
		*len = 0;
		return NULL;
	}
	*len = 1;
	return &g_bytes[id];
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	for (int i = 0; i < 256; i++)
		g_bytes[i] = (char)i;
	struct gram_vocab_options o = {.n_tokens = 257, .piece = piece, .eos_id = 256};
	struct err e = {0};
	if (gram_vocab_create(&g_vocab, &o, &e) != ST_OK)
		abort(); /* the harness itself is broken */
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *json = (const char *)data + 1;
	size_t len = size - 1;
	struct gram *g = NULL;
	struct err e = {0};
	enum status st;
	switch (data[0] & 3) {
	case 0: st = gram_compile_json_schema(&g, json, len, &e); break;
	case 1: st = gram_compile_tool_calls(&g, json, len, GRAM_TOOLS_REQUIRED, NULL, 1 + (data[0] >> 4), false, &e); break;
	case 2: st = gram_compile_tool_calls(&g, json, len, GRAM_TOOLS_AUTO, NULL, 2, (data[0] >> 2) & 1, &e); break;
	default: st = gram_compile_json_schema(&g, json, len, &e); break;
	}
	if (st != ST_OK)
		return 0;
	struct gram_state *gs = NULL;
	if (gram_state_create(&gs, g, g_vocab, &e) == ST_OK) {
		uint32_t words = gram_vocab_mask_words(g_vocab);
		uint32_t *mask = calloc(words, sizeof *mask);
		for (size_t step = 0; mask && step < 96 && !gram_state_is_final(gs); step++) {
			gram_state_fill_mask(gs, mask);
			uint32_t want = len ? (uint8_t)json[step % len] : 0;
			int32_t pick = -1;
			for (uint32_t k = 0; k < 257; k++) {
				uint32_t t = (want + k) % 257;
				if (mask[t / 32] >> (t % 32) & 1u) {
					if (pick < 0)
						pick = (int32_t)t;
				}
			}
			if (pick < 0)
				break; /* a dead end: nothing allowed (and not final) */
			if (gram_state_accept_token(gs, pick) != ST_OK)
				__builtin_trap(); /* the mask allowed it */
			if (pick == 256)
				break; /* eos */
		}
		free(mask);
		gram_state_destroy(gs);
	}
	gram_release(g);
	return 0;
}
