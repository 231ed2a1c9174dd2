/*
 * fuzz/fuzz_agents.c: libFuzzer target for the agent front-ends' request
 * parsers: the bytes as a /v1/messages body (anth_translate, both forms)
 * and as a /v1/responses body (resp_translate, with a small store holding
 * one response so previous_response_id can hit), and every translation
 * that succeeds through the chat parser (oai_parse_request) it feeds.
 * Built as a plain object too: tests/server/test_agents_translate.c drives
 * it over mutated seeds in the unit suite.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/responses.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void chat_parse(const char *chat, size_t len)
{
	struct oai_request r;
	struct oai_error why;
	if (oai_parse_request(OAI_CHAT, chat, len, 129280, &r, &why) == ST_OK)
		oai_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct resp_store *store;
	if (!store) {
		struct err e = {0};
		if (resp_store_create(&store, 1 << 16, &e))
			return 0;
		static const char hist[] = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]";
		if (resp_store_put(store, "resp_1", "{}", 2, hist, sizeof hist - 1))
			return 0;
	}
	const char *body = (const char *)data;
	char *chat = NULL, *history = NULL, *echo = NULL;
	size_t chat_len = 0;
	struct oai_error why;
	struct anth_info ai;
	for (int count = 0; count < 2; count++) {
		if (anth_translate(body, size, count == 1, &chat, &chat_len, &ai, &why) == ST_OK) {
			chat_parse(chat, chat_len);
			free(chat);
		}
	}
	struct resp_info ri;
	if (resp_translate(body, size, store, &chat, &chat_len, &history, &echo, &ri, &why) == ST_OK) {
		chat_parse(chat, chat_len);
		free(chat);
		free(history);
		free(echo);
	}
	return 0;
}
