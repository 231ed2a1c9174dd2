/*
 * tests/model/test_chat.c: model_chat_encode() against the official encoder.
 *
 * Replays every case of tests/model/data/chat_golden.json (written by
 * scripts/gen_chat_golden.py from DeepSeek's encoding_dsv4.py) and demands
 * the same prompt byte for byte; then checks the error paths and the
 * json.dumps-style serializer on values the golden file cannot pin.
 */
#include <jansson.h>
#include <stdint.h>

#include "model/chat.h"
#include "tests/test.h"

#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static enum model_chat_role role_of(const char *r)
{
	static const struct {
		const char *name;
		enum model_chat_role role;
	} map[] = {{"system", MODEL_CHAT_ROLE_SYSTEM},       {"user", MODEL_CHAT_ROLE_USER},
		   {"assistant", MODEL_CHAT_ROLE_ASSISTANT}, {"tool", MODEL_CHAT_ROLE_TOOL},
		   {"developer", MODEL_CHAT_ROLE_DEVELOPER},
		   {"latest_reminder", MODEL_CHAT_ROLE_LATEST_REMINDER}};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (r && strcmp(r, map[i].name) == 0)
			return map[i].role;
	return (enum model_chat_role)99;
}

static void report_diff(const char *name, const char *got, size_t got_len, const char *want)
{
	size_t want_len = strlen(want), i = 0;
	while (i < got_len && i < want_len && got[i] == want[i])
		i++;
	size_t from = i > 60 ? i - 60 : 0;
	fprintf(stderr, "case %s: differs at byte %zu (got %zu bytes, want %zu)\n", name, i,
		got_len, want_len);
	fprintf(stderr, "  got:  ...%.*s\n", (int)(got_len - from < 160 ? got_len - from : 160),
		got + from);
	fprintf(stderr, "  want: ...%.*s\n", (int)(want_len - from < 160 ? want_len - from : 160),
		want + from);
}

static void run_case(json_t *c)
{
	const char *name = jstr(c, "name");
	json_t *jm = json_object_get(c, "messages");
	size_t n = json_array_size(jm);
	struct model_chat_message *msgs = calloc(n + 1, sizeof *msgs);
	struct model_chat_tool_call **calls = calloc(n + 1, sizeof *calls);
	T_CHECK(msgs && calls);
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(jm, i);
		msgs[i].role = role_of(jstr(m, "role"));
		msgs[i].content = jstr(m, "content");
		msgs[i].reasoning_content = jstr(m, "reasoning_content");
		msgs[i].tool_call_id = jstr(m, "tool_call_id");
		msgs[i].name = jstr(m, "name");
		json_t *tc = json_object_get(m, "tool_calls");
		size_t ntc = json_array_size(tc);
		if (ntc) {
			calls[i] = calloc(ntc, sizeof *calls[i]);
			for (size_t k = 0; k < ntc; k++) {
				json_t *t = json_array_get(tc, k);
				json_t *fn = json_object_get(t, "function");
				calls[i][k].id = jstr(t, "id");
				calls[i][k].name = jstr(fn, "name");
				calls[i][k].arguments_json = jstr(fn, "arguments");
			}
			msgs[i].tool_calls = calls[i];
			msgs[i].n_tool_calls = ntc;
		}
	}
	struct model_chat_options opt = {
		.thinking = json_is_true(json_object_get(c, "thinking")),
		.keep_thinking = json_is_true(json_object_get(c, "keep_thinking")),
		.continue_final = json_is_true(json_object_get(c, "continue_final")),
		.tools_json = jstr(c, "tools_json"),
		.response_format_json = jstr(c, "response_format_json"),
	};
	const char *eff = jstr(c, "effort");
	opt.effort = strcmp(eff, "max") == 0    ? MODEL_CHAT_EFFORT_MAX
		     : strcmp(eff, "high") == 0 ? MODEL_CHAT_EFFORT_HIGH
						: MODEL_CHAT_EFFORT_NONE;
	char *got = NULL;
	size_t got_len = 0;
	struct err e = {0};
	enum status st = model_chat_encode(msgs, n, &opt, &got, &got_len, &e);
	T_CHECKF(st == ST_OK, "case %s: %s", name, e.msg);
	const char *want = jstr(c, "expected");
	if (st == ST_OK) {
		bool same = got_len == strlen(want) && memcmp(got, want, got_len) == 0;
		T_CHECKF(same, "case %s", name);
		if (!same)
			report_diff(name, got, got_len, want);
		T_CHECK(strlen(got) == got_len);
	}
	free(got);
	for (size_t i = 0; i < n; i++)
		free(calls[i]);
	free(calls);
	free(msgs);
}

static void golden(void)
{
	const char *root = getenv("DSV4_SOURCE_ROOT");
	char path[4096];
	snprintf(path, sizeof path, "%s/tests/model/data/chat_golden.json", root ? root : ".");
	json_error_t je;
	json_t *doc = json_load_file(path, 0, &je);
	T_CHECKF(doc != NULL, "%s: %s", path, je.text);
	if (!doc)
		return;
	json_t *cases = json_object_get(doc, "cases");
	T_CHECK(json_array_size(cases) >= 40);
	for (size_t i = 0; i < json_array_size(cases); i++)
		run_case(json_array_get(cases, i));
	fprintf(stderr, "golden: %zu conversations replayed\n", json_array_size(cases));
	json_decref(doc);
}

static enum status enc1(const struct model_chat_message *m, size_t n,
			const struct model_chat_options *o, char **out)
{
	struct err e = {0};
	return model_chat_encode(m, n, o, out, NULL, &e);
}

static void errors(void)
{
	char *out = (char *)1;
	struct model_chat_message u = {.role = MODEL_CHAT_ROLE_USER, .content = "hi"};
	struct model_chat_options o = {.tools_json = "[{\"function\": {\"name\": \"f\"}"};
	T_CHECK(enc1(&u, 1, &o, &out) == ST_INVALID && out == NULL);
	o.tools_json = "{\"function\": {}}";
	T_CHECK(enc1(&u, 1, &o, &out) == ST_INVALID);
	o.tools_json = "[{\"type\": \"function\"}]";
	T_CHECK(enc1(&u, 1, &o, &out) == ST_INVALID);
	o.tools_json = NULL;
	o.response_format_json = "{bad";
	T_CHECK(enc1(&u, 1, &o, &out) == ST_INVALID);

	struct model_chat_message dev = {.role = MODEL_CHAT_ROLE_DEVELOPER, .content = ""};
	T_CHECK(enc1(&dev, 1, NULL, &out) == ST_INVALID);
	struct model_chat_message bad_role = {.role = (enum model_chat_role)42};
	T_CHECK(enc1(&bad_role, 1, NULL, &out) == ST_INVALID);

	struct model_chat_tool_call tc = {.id = "x", .name = "f", .arguments_json = "[1, 2]"};
	struct model_chat_message a[2] = {
		{.role = MODEL_CHAT_ROLE_USER, .content = "u"},
		{.role = MODEL_CHAT_ROLE_ASSISTANT, .tool_calls = &tc, .n_tool_calls = 1}};
	T_CHECK(enc1(a, 2, NULL, &out) == ST_INVALID);
	tc.arguments_json = "{\"n\": 123456789012345678901234567890, \"f\": 1e400}"; /* Python keeps it; inf */
	out = NULL;
	T_CHECK(enc1(a, 2, NULL, &out) == ST_OK); /* issue 17: was ST_UNSUPPORTED */
	T_STR_CONTAINS(out, "string=\"false\">123456789012345678901234567890<");
	T_STR_CONTAINS(out, "string=\"false\">Infinity<");
	free(out);
	tc.arguments_json = "{\"s\": \"a\\u0000b\"}"; /* raw NUL cannot go in the prompt */
	T_CHECK(enc1(a, 2, NULL, &out) == ST_INVALID);
	tc.arguments_json = "{\"s\": [\"a\\u0000b\"]}"; /* escaped inside JSON is fine */
	out = NULL;
	T_CHECK(enc1(a, 2, NULL, &out) == ST_OK);
	T_STR_CONTAINS(out, "[\"a\\u0000b\"]");
	free(out);

	/* NULL opt and no messages: just BOS; no_bos: empty string */
	out = NULL;
	T_CHECK(enc1(NULL, 0, NULL, &out) == ST_OK && out && strcmp(out, MODEL_CHAT_BOS) == 0);
	free(out);
	struct model_chat_options nb = {.no_bos = true};
	out = NULL;
	T_CHECK(enc1(NULL, 0, &nb, &out) == ST_OK && out && out[0] == 0);
	free(out);
}

static void pydumps_case(const char *in, const char *want)
{
	char *out = NULL;
	size_t len = 0;
	struct err e = {0};
	enum status st = model_chat_json_pydumps(in, strlen(in), &out, &len, &e);
	T_CHECKF(st == ST_OK && out && strcmp(out, want) == 0, "%s -> %s (want %s)", in,
		 out ? out : e.msg, want);
	free(out);
}

static void pydumps(void)
{
	/* Values checked against CPython's json.dumps(ensure_ascii=False). */
	pydumps_case("1.0", "1.0");
	pydumps_case("1e16", "1e+16");
	pydumps_case("1e15", "1000000000000000.0");
	pydumps_case("0.0001", "0.0001");
	pydumps_case("0.00001", "1e-05");
	pydumps_case("123.456e-10", "1.23456e-08");
	pydumps_case("-2.5E+3", "-2500.0");
	pydumps_case("1.7976931348623157e308", "1.7976931348623157e+308");
	pydumps_case("-0", "0");
	pydumps_case("-0.0", "-0.0");
	pydumps_case("9223372036854775807", "9223372036854775807");
	pydumps_case("{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\\ud83d\\ude00\\u001f\\/\"}",
		     "{\"a\": [1, {\"b\": null}], \"c\": \"é😀\\u001f/\"}");
	pydumps_case(" [ ] ", "[]");
	pydumps_case("{\"z\":1,\"a\":2}", "{\"z\": 1, \"a\": 2}");
	/* duplicate keys: the last value, in the first key's place (a dict) */
	pydumps_case("{\"a\":1,\"b\":2,\"a\":3}", "{\"a\": 3, \"b\": 2}");
	/* random doubles survive the round trip through the repr */
	uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&s;
	for (int i = 0; i < 2000; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t bits = s;
		double d;
		memcpy(&d, &bits, sizeof d);
		if (!isfinite(d))
			continue;
		char in[64];
		snprintf(in, sizeof in, "%.17g", d);
		if (!strpbrk(in, ".e"))
			strcat(in, ".0");
		char *out = NULL;
		struct err e = {0};
		if (model_chat_json_pydumps(in, strlen(in), &out, NULL, &e) != ST_OK) {
			T_CHECKF(0, "%s: %s", in, e.msg);
			continue;
		}
		T_CHECKF(strtod(out, NULL) == d, "%s -> %s", in, out);
		free(out);
	}
}

/* Random (often invalid) inputs: every call returns OK with a NUL-terminated
 * prompt of the stated length, or an error with a message and no prompt. */
static void fuzz(void)
{
	static const char *const strs[] = {
		NULL, "", "hi", "{", "{}", "[]", "{\"a\": 1}", "{\"a\": [1, {\"b\": \"\\u00e9\"}]}",
		"[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", "[1]", "null",
		"\"str\"", "1e999", "{\"x\": 1e400}", "</think>", "<｜User｜>", "\xff\xfe", "日本語",
		"[{\"function\": {\"name\": \"g\", \"parameters\": {\"type\": \"object\"}}}]",
		"{\"n\": -9223372036854775808, \"m\": 9223372036854775808}"};
	uint64_t s = 0x1234567ull ^ (uint64_t)(uintptr_t)&s;
#define PICK() (s = s * 6364136223846793005ull + 1442695040888963407ull, strs[(s >> 33) % ARRAY_N(strs)])
#define PICKN(n) (s = s * 6364136223846793005ull + 1442695040888963407ull, (size_t)((s >> 33) % (n)))
	for (int it = 0; it < 3000; it++) {
		struct model_chat_message m[6];
		struct model_chat_tool_call tc[6][2];
		size_t n = PICKN(7);
		for (size_t i = 0; i < n; i++) {
			for (size_t k = 0; k < 2; k++)
				tc[i][k] = (struct model_chat_tool_call){PICK(), PICK(), PICK()};
			m[i] = (struct model_chat_message){
				.role = (enum model_chat_role)PICKN(7), .content = PICK(),
				.reasoning_content = PICK(), .tool_calls = tc[i],
				.n_tool_calls = PICKN(3), .tool_call_id = PICK(), .name = PICK()};
		}
		struct model_chat_options o = {.thinking = PICKN(2), .effort = PICKN(3),
					       .keep_thinking = PICKN(2), .tools_json = PICK(),
					       .response_format_json = PICKN(4) ? NULL : PICK(),
					       .no_bos = PICKN(2), .continue_final = PICKN(2)};
		char *out = (char *)1;
		size_t len = 7;
		struct err e = {0};
		enum status st = model_chat_encode(m, n, &o, &out, &len, &e);
		if (st == ST_OK)
			T_CHECK(out && strlen(out) == len);
		else
			T_CHECK(out == NULL && len == 0 && e.msg[0]);
		free(st == ST_OK ? out : NULL);
	}
#undef PICK
#undef PICKN
}

int main(void)
{
	golden();
	fuzz();
	errors();
	pydumps();
	return test_exit();
}
