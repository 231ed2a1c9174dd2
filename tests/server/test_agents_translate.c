/*
 * tests/server/test_agents_translate.c: the agent front-ends' request
 * translations (server/anthropic.h anth_translate, server/responses.h
 * resp_translate) into chat completions bodies: known Anthropic and
 * Responses requests give the expected messages, tools, tool_choice,
 * thinking and formats, and the chat parser accepts what they produce;
 * refusals carry their status (400, 404 for an unknown
 * previous_response_id). Then the fuzz target (fuzz/fuzz_agents.c) runs
 * over randomly mutated seeds (byte flips, cuts, splices; DSV4_TEST_SEED
 * repeats a run): no crash or leak under the sanitizers, and every
 * translation that succeeds is a JSON object with a messages array.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/anthropic.h"
#include "server/responses.h"
#include "tests/test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *anth(const char *body, bool count, struct anth_info *info, struct oai_error *why)
{
	char *out = NULL;
	size_t n = 0;
	if (anth_translate(body, strlen(body), count, &out, &n, info, why))
		return NULL;
	json_t *j = json_loadb(out, n, 0, NULL);
	struct oai_request r;
	struct oai_error w2;
	enum status st = oai_parse_request(OAI_CHAT, out, n, 129280, &r, &w2);
	T_CHECKF(st == ST_OK || strstr(w2.message, "tool_choice") || strstr(w2.message, "response_format"),
		 "chat parser takes the translation: %s (%s)", w2.message, out);
	if (st == ST_OK)
		oai_request_free(&r);
	free(out);
	return j;
}

static const char *role_at(json_t *j, size_t i)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(j, "messages"), i), "role"));
}

static json_t *msg_at(json_t *j, size_t i)
{
	return json_array_get(json_object_get(j, "messages"), i);
}

static void test_anthropic(void)
{
	struct anth_info info;
	struct oai_error why;
	json_t *j = anth("{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"system\":[{\"type\":\"text\",\"text\":\"S1\"},"
			 "{\"type\":\"text\",\"text\":\"S2\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
			 "\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
			 "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"T\",\"signature\":\"s\"},"
			 "{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"tool_use\",\"id\":\"tu1\",\"name\":\"f\",\"input\":{\"x\":1}}]},"
			 "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\",\"is_error\":true,"
			 "\"content\":[{\"type\":\"text\",\"text\":\"bad\"}]},{\"type\":\"text\",\"text\":\"next\"}]}],"
			 "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
			 "\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
			 "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":100,\"display\":\"omitted\"},"
			 "\"stop_sequences\":[\"Z\"],\"metadata\":{\"user_id\":\"u\"},\"context_management\":{}}",
			 false, &info, &why);
	T_CHECKF(j != NULL, "anthropic translation: %s", why.message);
	if (j) {
		T_CHECK(info.stream && info.omit_thinking && info.one_tool);
		T_CHECK(!strcmp(role_at(j, 0), "system") && !strcmp(role_at(j, 1), "user") &&
			!strcmp(role_at(j, 2), "assistant") && !strcmp(role_at(j, 3), "tool") && !strcmp(role_at(j, 4), "user"));
		T_CHECK(!strcmp(json_string_value(json_object_get(msg_at(j, 0), "content")), "S1\nS2"));
		json_t *a = msg_at(j, 2);
		T_CHECK(!strcmp(json_string_value(json_object_get(a, "reasoning_content")), "T"));
		json_t *tc = json_array_get(json_object_get(a, "tool_calls"), 0);
		T_CHECK(!strcmp(json_string_value(json_object_get(tc, "id")), "tu1"));
		T_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{\"x\":1}"));
		T_CHECK(!strcmp(json_string_value(json_object_get(msg_at(j, 3), "tool_call_id")), "tu1"));
		T_CHECK(!strcmp(json_string_value(json_object_get(msg_at(j, 3), "content")), "Error: bad"));
		T_CHECK(!strcmp(json_string_value(json_object_get(j, "tool_choice")), "auto"));
		json_t *fn = json_object_get(json_array_get(json_object_get(j, "tools"), 0), "function");
		T_CHECK(json_is_object(json_object_get(fn, "parameters")) &&
			!strcmp(json_string_value(json_object_get(fn, "description")), "d"));
		T_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "thinking"), "type")), "enabled"));
		T_CHECK(!strcmp(json_string_value(json_array_get(json_object_get(j, "stop"), 0)), "Z"));
		T_CHECK(json_integer_value(json_object_get(j, "max_tokens")) == 9);
		T_CHECK(!json_object_get(j, "metadata") && !json_object_get(j, "context_management"));
	}
	json_decref(j);
	/* tool_choice any / tool, output_config.format, prefill */
	j = anth("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"{\"}],"
		 "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\"},"
		 "\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\"}}}}",
		 false, &info, &why);
	T_CHECKF(j != NULL, "any + format: %s", why.message);
	if (j) {
		T_CHECK(!strcmp(json_string_value(json_object_get(j, "tool_choice")), "required"));
		T_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "response_format"), "type")), "json_schema"));
		T_CHECK(json_is_true(json_object_get(j, "continue_final_message")));
	}
	json_decref(j);
	j = anth("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
		 "\"tools\":[{\"name\":\"f\"}]}", false, &info, &why);
	T_CHECK(j && !strcmp(json_string_value(json_object_get(json_object_get(json_object_get(j, "tool_choice"), "function"),
								 "name")), "f"));
	json_decref(j);
	/* count_tokens needs no max_tokens; messages does */
	j = anth("{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"stream\":true}", true, &info, &why);
	T_CHECK(j && !info.stream && !json_object_get(j, "stream"));
	json_decref(j);
	static const char *bad[] = {
		"{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}]}",                         /* max_tokens */
		"{\"max_tokens\":1,\"messages\":[]}",                                              /* empty */
		"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
		"{\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
		"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"b\"}]}",
		"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"maybe\"}}",
		"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
		"[1]", "{", "",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *out = NULL;
		size_t n;
		T_CHECKF(anth_translate(bad[i], strlen(bad[i]), false, &out, &n, &info, &why) != ST_OK && !out &&
				 why.status == 400 && why.message[0],
			 "refused: %s", bad[i]);
	}
}

static void test_responses(void)
{
	struct resp_store *store = NULL;
	struct err e = {0};
	T_CHECK(resp_store_create(&store, 1 << 20, &e) == ST_OK);
	static const char hist[] = "[{\"role\":\"user\",\"content\":\"old\"},{\"role\":\"assistant\",\"content\":\"ans\"}]";
	T_CHECK(resp_store_put(store, "resp_prev", "{}", 2, hist, sizeof hist - 1) == ST_OK);
	const char *body =
		"{\"model\":\"m\",\"instructions\":\"I\",\"previous_response_id\":\"resp_prev\",\"max_output_tokens\":7,"
		"\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"R\"}]},"
		"{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
		"{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"},"
		"{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"o1\"},"
		"{\"role\":\"developer\",\"content\":\"D\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"U\"}]}],"
		"\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
		"\"reasoning\":{\"effort\":\"high\"},\"text\":{\"format\":{\"type\":\"text\"}},\"store\":false,"
		"\"parallel_tool_calls\":false,\"metadata\":{\"k\":\"v\"},\"include\":[\"x\"]}";
	char *chat = NULL, *history = NULL, *echo = NULL;
	size_t n = 0;
	struct resp_info info;
	struct oai_error why;
	enum status st = resp_translate(body, strlen(body), store, &chat, &n, &history, &echo, &info, &why);
	T_CHECKF(st == ST_OK, "responses translation: %s", why.message);
	if (!st) {
		json_t *j = json_loads(chat, 0, NULL), *h = json_loads(history, 0, NULL), *ec = json_loads(echo, 0, NULL);
		T_CHECK(!info.store && !info.stream && !strcmp(info.previous_id, "resp_prev") && info.one_call);
		static const char *roles[] = {"system", "user", "assistant", "assistant", "tool", "system", "user"};
		for (size_t i = 0; i < 7; i++)
			T_CHECKF(role_at(j, i) && !strcmp(role_at(j, i), roles[i]), "role %zu: %s", i, role_at(j, i));
		T_CHECK(json_array_size(json_object_get(j, "messages")) == 7);
		T_CHECK(json_array_size(h) == 6); /* history without the instructions */
		json_t *a = msg_at(j, 3);
		T_CHECK(json_array_size(json_object_get(a, "tool_calls")) == 2);
		T_CHECK(!strcmp(json_string_value(json_object_get(a, "reasoning_content")), "R"));
		T_CHECK(json_integer_value(json_object_get(j, "max_tokens")) == 7);
		T_CHECK(!strcmp(json_string_value(json_object_get(j, "reasoning_effort")), "high"));
		T_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(ec, "metadata"), "k")), "v"));
		T_CHECK(!json_object_get(j, "response_format"));
		struct oai_request r;
		struct oai_error w2;
		T_CHECKF(oai_parse_request(OAI_CHAT, chat, n, 129280, &r, &w2) == ST_OK, "chat parser: %s", w2.message);
		oai_request_free(&r);
		json_decref(j);
		json_decref(h);
		json_decref(ec);
	}
	free(chat);
	free(history);
	free(echo);
	/* text.format json_schema -> response_format; tool_choice function */
	body = "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"},"
	       "\"strict\":true}},\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}";
	st = resp_translate(body, strlen(body), NULL, &chat, &n, &history, &echo, &info, &why);
	T_CHECKF(st == ST_OK, "json_schema: %s", why.message);
	if (!st) {
		json_t *j = json_loads(chat, 0, NULL);
		json_t *rf = json_object_get(j, "response_format");
		T_CHECK(!strcmp(json_string_value(json_object_get(rf, "type")), "json_schema") &&
			json_is_true(json_object_get(json_object_get(rf, "json_schema"), "strict")));
		T_CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_object_get(j, "tool_choice"), "function"),
								  "name")), "f"));
		T_CHECK(info.store);
		json_decref(j);
		free(chat);
		free(history);
		free(echo);
	}
	/* refusals and their status */
	static const struct {
		const char *body;
		int status;
	} bad[] = {
		{"{\"input\":\"x\",\"previous_response_id\":\"resp_gone\"}", 404},
		{"{\"model\":\"m\"}", 400},
		{"{\"input\":\"x\",\"frobnicate\":1}", 400},
		{"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400},
		{"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}", 400},
		{"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", 400},
		{"{\"input\":\"x\",\"background\":true}", 400},
		{"{\"input\":[]}", 400},
		{"nope", 400},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		chat = NULL;
		st = resp_translate(bad[i].body, strlen(bad[i].body), store, &chat, &n, &history, &echo, &info, &why);
		T_CHECKF(st != ST_OK && !chat && why.status == bad[i].status, "refused %d: %s (%d %s)", bad[i].status,
			 bad[i].body, why.status, why.message);
	}
	resp_store_destroy(store);
}

/* ---- the fuzz target over mutated seeds ---- */

static const char *seeds[] = {
	"{\"model\":\"m\",\"max_tokens\":9,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
	"\"text\":\"Q\"},{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":[{\"type\":\"text\",\"text\":\"r\"}]}]},"
	"{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}]}],"
	"\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
	"\"thinking\":{\"type\":\"enabled\"}}",
	"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
	"\"function_call_output\",\"call_id\":\"c\",\"output\":[{\"type\":\"input_text\",\"text\":\"o\"}]},{\"type\":"
	"\"reasoning\",\"summary\":[]}],\"previous_response_id\":\"resp_1\",\"instructions\":\"I\",\"text\":{\"format\":"
	"{\"type\":\"json_object\"}},\"reasoning\":{\"effort\":\"low\"},\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
	"{\"input\":\"hello\",\"stream\":true,\"store\":false,\"metadata\":{\"a\":\"b\"}}",
};

static const char *fragments[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "1e999", "-0", "\"type\"",
				  "\"text\"", "\"role\":\"user\"", "\"content\"", "\\u0000", "\xff", "\"tool_use\"",
				  "\"function_call\"", "{\"type\":\"image\"}", "[[[[", "\"messages\":", "\"input\":"};

int main(void)
{
	unsigned seed = getenv("DSV4_TEST_SEED") ? (unsigned)atoi(getenv("DSV4_TEST_SEED")) : (unsigned)time(NULL);
	printf("seed %u\n", seed);
	srand(seed);
	test_anthropic();
	test_responses();
	char buf[4096];
	for (int it = 0; it < 4000; it++) {
		const char *s = seeds[rand() % 3];
		size_t n = strlen(s);
		memcpy(buf, s, n);
		int muts = 1 + rand() % 4;
		for (int m = 0; m < muts; m++) {
			int kind = rand() % 4;
			size_t at = n ? (size_t)rand() % n : 0;
			if (kind == 0 && n) {
				buf[at] = (char)(rand() & 0xff);
			} else if (kind == 1) {
				n = at;
			} else if (kind == 2) {
				const char *f = fragments[rand() % (sizeof fragments / sizeof fragments[0])];
				size_t fl = strlen(f);
				if (n + fl < sizeof buf) {
					memmove(buf + at + fl, buf + at, n - at);
					memcpy(buf + at, f, fl);
					n += fl;
				}
			} else if (n > 2) {
				size_t len = 1 + (size_t)rand() % (n - at);
				memmove(buf + at, buf + at + len, n - at - len);
				n -= len;
			}
		}
		LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
		/* the property: a translation that succeeds is an object with messages */
		char *out = NULL;
		size_t ol;
		struct anth_info ai;
		struct oai_error why;
		if (anth_translate(buf, n, false, &out, &ol, &ai, &why) == ST_OK) {
			json_t *j = json_loadb(out, ol, 0, NULL);
			T_CHECKF(json_is_array(json_object_get(j, "messages")), "iteration %d: messages", it);
			json_decref(j);
			free(out);
		} else {
			T_CHECKF(why.status >= 400 && why.message[0], "iteration %d: a refusal says why", it);
		}
		if (test_n_failed > 20)
			break;
	}
	return test_exit();
}
