/*
 * tests/fuzz/fuzz_request.c: libFuzzer target for what an HTTP thread does
 * with a request body: the OpenAI request parser (chat, completions,
 * tokenize, detokenize; the first input byte picks which), then for a chat
 * request the DeepSeek-V4 chat rendering and the tokenizer on its output.
 * The tokenizer is the real one from $DSV4_FUZZ_TOKENIZER (scripts/fuzz sets
 * it); without it the target stops after rendering. Any sanitizer report or
 * crash is a finding.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "model/tokenizer.h"
#include "server/openai_params.h"

static struct model_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *p = getenv("DSV4_FUZZ_TOKENIZER");
	struct err e = {0};
	if (p && p[0] && model_tokenizer_load(&g_tok, p, &e) != ST_OK)
		g_tok = NULL;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int which = data[0] & 3;
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	struct oai_error why;
	const int32_t vocab = 129280;
	if (which == 2) {
		struct oai_tokenize_request t;
		if (oai_parse_tokenize(body, len, &t, &why) == ST_OK)
			oai_tokenize_request_free(&t);
		return 0;
	}
	if (which == 3) {
		struct oai_detokenize_request d;
		if (oai_parse_detokenize(body, len, vocab, &d, &why) == ST_OK)
			oai_detokenize_request_free(&d);
		return 0;
	}
	struct oai_request r;
	if (oai_parse_request(which == 0 ? OAI_CHAT : OAI_COMPLETION, body, len, vocab, &r, &why) != ST_OK)
		return 0;
	if (which == 0) {
		struct model_chat_options co;
		oai_chat_options(&r, &co);
		char *prompt = NULL;
		size_t plen = 0;
		struct err e = {0};
		if (model_chat_encode(r.messages, r.n_messages, &co, &prompt, &plen, &e) == ST_OK && g_tok) {
			int32_t *ids = NULL;
			size_t n = 0;
			if (model_tokenizer_encode_alloc(g_tok, prompt, plen, MODEL_TOK_ADDED_ALL, &ids, &n, &e) == ST_OK)
				free(ids);
		}
		free(prompt);
	}
	oai_request_free(&r);
	return 0;
}
