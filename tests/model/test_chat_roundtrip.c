/*
 * tests/model/test_chat_roundtrip.c: encoder -> output parser round trip.
 *
 * Every assistant message of the golden conversations is rendered by
 * model_chat_encode() exactly as the model would have generated it (after
 * <｜Assistant｜><think>), then fed to the streaming output parser in random
 * pieces; reasoning, content and tool calls (names, and arguments compared
 * as JSON values) must come back. This ties the parser to the real format.
 */
#include <jansson.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "model/chat.h"
#include "model/output_parser.h"
#include "tests/test.h"

struct got {
	char *reasoning, *content;
	size_t reasoning_len, content_len;
	char *names[32], *args[32];
	size_t args_len[32];
	size_t n_calls;
	struct model_oparse_finish fin;
};

static void append(char **p, size_t *len, const char *s, size_t n)
{
	*p = realloc(*p, *len + n + 1);
	if (!*p)
		abort();
	memcpy(*p + *len, s, n);
	*len += n;
	(*p)[*len] = 0;
}

static void on_event(void *user, const struct model_oparse_event *ev)
{
	struct got *g = user;
	switch (ev->kind) {
	case MODEL_OPARSE_REASONING:
		append(&g->reasoning, &g->reasoning_len, ev->text, ev->len);
		break;
	case MODEL_OPARSE_CONTENT:
		append(&g->content, &g->content_len, ev->text, ev->len);
		break;
	case MODEL_OPARSE_TOOL_CALL_START:
		if (g->n_calls < 32) {
			g->names[g->n_calls] = strdup(ev->tool_name);
			g->n_calls++;
		}
		break;
	case MODEL_OPARSE_TOOL_CALL_ARGS:
		if (ev->tool_index < 32)
			append(&g->args[ev->tool_index], &g->args_len[ev->tool_index], ev->text,
			       ev->len);
		break;
	case MODEL_OPARSE_FINISH:
		g->fin = *ev->finish;
		break;
	}
}

static void got_free(struct got *g)
{
	free(g->reasoning);
	free(g->content);
	for (size_t i = 0; i < 32; i++) {
		free(g->names[i]);
		free(g->args[i]);
	}
}

static uint64_t rng;
static size_t rndn(size_t n)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return n ? (size_t)((rng >> 33) % n) : 0;
}

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static size_t n_checked;

static void check_message(const char *case_name, json_t *m)
{
	struct model_chat_tool_call calls[32];
	json_t *tc = json_object_get(m, "tool_calls");
	size_t n_tc = json_array_size(tc);
	if (n_tc > 32)
		return;
	for (size_t k = 0; k < n_tc; k++) {
		json_t *fn = json_object_get(json_array_get(tc, k), "function");
		calls[k] = (struct model_chat_tool_call){.id = jstr(json_array_get(tc, k), "id"),
							 .name = jstr(fn, "name"),
							 .arguments_json = jstr(fn, "arguments")};
	}
	struct model_chat_message msgs[2] = {
		{.role = MODEL_CHAT_ROLE_USER, .content = "q"},
		{.role = MODEL_CHAT_ROLE_ASSISTANT, .content = jstr(m, "content"),
		 .reasoning_content = jstr(m, "reasoning_content"), .tool_calls = calls,
		 .n_tool_calls = n_tc}};
	struct model_chat_options opt = {.thinking = true, .keep_thinking = true, .no_bos = true};
	char *prompt = NULL;
	struct err e = {0};
	if (model_chat_encode(msgs, 2, &opt, &prompt, NULL, &e) != ST_OK) {
		T_CHECKF(0, "%s: encode: %s", case_name, e.msg);
		return;
	}
	const char *start = MODEL_CHAT_USER "q" MODEL_CHAT_ASSISTANT MODEL_CHAT_THINK_START;
	T_CHECK(strncmp(prompt, start, strlen(start)) == 0);
	const char *gen = prompt + strlen(start);
	size_t gen_len = strlen(gen);

	struct got g = {0};
	struct model_oparse *p = NULL;
	struct model_oparse_options po = {.emit = on_event, .user = &g, .in_reasoning = true};
	T_CHECK(model_oparse_create(&p, &po, &e) == ST_OK);
	size_t at = 0;
	while (at < gen_len) {
		size_t n = 1 + rndn(12);
		if (n > gen_len - at)
			n = gen_len - at;
		T_CHECK(model_oparse_feed(p, gen + at, n) == ST_OK);
		at += n;
	}
	T_CHECK(model_oparse_finish(p) == ST_OK);
	model_oparse_destroy(p);

	const char *want_r = jstr(m, "reasoning_content"), *want_c = jstr(m, "content");
	T_CHECKF(strcmp(g.reasoning ? g.reasoning : "", want_r ? want_r : "") == 0,
		 "%s: reasoning [%s]", case_name, g.reasoning ? g.reasoning : "");
	T_CHECKF(strcmp(g.content ? g.content : "", want_c ? want_c : "") == 0, "%s: content [%s]",
		 case_name, g.content ? g.content : "");
	T_CHECK(g.fin.saw_eos && g.fin.n_malformed == 0 && !g.fin.open_tool_call);
	T_CHECKF(g.n_calls == n_tc, "%s: %zu calls, want %zu", case_name, g.n_calls, n_tc);
	for (size_t k = 0; k < n_tc && k < g.n_calls; k++) {
		T_CHECK(strcmp(g.names[k], calls[k].name ? calls[k].name : "") == 0);
		json_error_t je;
		json_t *got_args = json_loads(g.args[k] ? g.args[k] : "", JSON_ALLOW_NUL, &je);
		const char *orig = calls[k].arguments_json ? calls[k].arguments_json : "";
		json_t *want = json_loads(orig, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		if (!want) /* not JSON: the encoder sent it as one "arguments" string */
			want = json_pack("{s:s}", "arguments", orig);
		T_CHECKF(got_args && json_equal(got_args, want), "%s: call %zu args %s, want %s",
			 case_name, k, g.args[k] ? g.args[k] : "(none)", orig);
		json_decref(got_args);
		json_decref(want);
	}
	got_free(&g);
	free(prompt);
	n_checked++;
}

int main(void)
{
	const char *seed = getenv("DSV4_TEST_SEED");
	rng = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
	fprintf(stderr, "seed %llu\n", (unsigned long long)rng);
	const char *root = getenv("DSV4_SOURCE_ROOT");
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/model/data/chat_golden.json", root ? root : ".");
	json_error_t je;
	json_t *doc = json_load_file(path, 0, &je);
	T_CHECKF(doc != NULL, "%s: %s", path, je.text);
	json_t *cases = json_object_get(doc, "cases");
	for (size_t i = 0; i < json_array_size(cases); i++) {
		json_t *c = json_array_get(cases, i);
		json_t *msgs = json_object_get(c, "messages");
		for (size_t k = 0; k < json_array_size(msgs); k++) {
			json_t *m = json_array_get(msgs, k);
			const char *role = jstr(m, "role");
			if (role && strcmp(role, "assistant") == 0)
				check_message(jstr(c, "name"), m);
		}
	}
	fprintf(stderr, "round trip: %zu assistant messages\n", n_checked);
	T_CHECK(n_checked >= 40);
	json_decref(doc);
	return test_exit();
}
