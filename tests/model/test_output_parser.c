/*
 * tests/model/test_output_parser.c: the streaming DSML / reasoning parser.
 *
 * Generates random well-formed assistant outputs (reasoning, content, tool
 * calls with string and JSON parameters, shaped like DeepSeek's encoder
 * renders them) with the result they must parse to, and checks:
 *   - one-shot, byte-at-a-time and random-split parsing give that result;
 *   - truncated, corrupted and spliced variants parse identically however
 *     they are split, never leave invalid JSON arguments, and (under ASan)
 *     never leak or read out of bounds, also with tiny buffer limits;
 * plus a few hand-written cases. Seed: $DSV4_TEST_SEED or the clock.
 */
#include <jansson.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "model/output_parser.h"
#include "tests/test.h"

#define DSML "｜DSML｜"
#define EOS_TEXT "<｜end▁of▁sentence｜>"
#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- small helpers ---- */

struct tb {
	char *p;
	size_t len, cap;
};

static void tb_put(struct tb *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		while (cap < b->len + n + 1)
			cap *= 2;
		b->p = realloc(b->p, cap);
		if (!b->p)
			abort();
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

static void tb_puts(struct tb *b, const char *s) { tb_put(b, s, strlen(s)); }

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t x = (rng_state += 0x9e3779b97f4a7c15ull);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* Python json.dumps(str, ensure_ascii=False) of valid UTF-8 text. */
static void py_escape(struct tb *b, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char tmp[8];
		switch (c) {
		case '"': tb_puts(b, "\\\""); break;
		case '\\': tb_puts(b, "\\\\"); break;
		case '\n': tb_puts(b, "\\n"); break;
		case '\r': tb_puts(b, "\\r"); break;
		case '\t': tb_puts(b, "\\t"); break;
		case '\b': tb_puts(b, "\\b"); break;
		case '\f': tb_puts(b, "\\f"); break;
		default:
			if (c < 0x20) {
				snprintf(tmp, sizeof tmp, "\\u%04x", c);
				tb_puts(b, tmp);
			} else {
				tb_put(b, (const char *)&c, 1);
			}
		}
	}
}

/* ---- the parse result ---- */

#define MAX_CALLS 64

struct call_res {
	char id[40];
	struct tb name, args;
};

struct res {
	struct tb reasoning, content;
	struct call_res calls[MAX_CALLS];
	size_t n_calls;
	struct model_oparse_finish fin;
	int n_finish;
	bool bad_order; /* an event that broke the protocol */
};

static void res_free(struct res *r)
{
	free(r->reasoning.p);
	free(r->content.p);
	for (size_t i = 0; i < r->n_calls; i++) {
		free(r->calls[i].name.p);
		free(r->calls[i].args.p);
	}
	memset(r, 0, sizeof *r);
}

static void on_event(void *user, const struct model_oparse_event *ev)
{
	struct res *r = user;
	if (r->n_finish)
		r->bad_order = true;
	switch (ev->kind) {
	case MODEL_OPARSE_REASONING:
		if (ev->len == 0)
			r->bad_order = true;
		tb_put(&r->reasoning, ev->text, ev->len);
		break;
	case MODEL_OPARSE_CONTENT:
		if (ev->len == 0)
			r->bad_order = true;
		tb_put(&r->content, ev->text, ev->len);
		break;
	case MODEL_OPARSE_TOOL_CALL_START:
		if (ev->tool_index != r->n_calls || r->n_calls == MAX_CALLS || !ev->tool_id ||
		    !ev->tool_name) {
			r->bad_order = true;
			break;
		}
		snprintf(r->calls[r->n_calls].id, sizeof r->calls[0].id, "%s", ev->tool_id);
		tb_puts(&r->calls[r->n_calls].name, ev->tool_name);
		r->n_calls++;
		break;
	case MODEL_OPARSE_TOOL_CALL_ARGS:
		if (r->n_calls == 0 || ev->tool_index != r->n_calls - 1 || ev->len == 0) {
			r->bad_order = true;
			break;
		}
		tb_put(&r->calls[r->n_calls - 1].args, ev->text, ev->len);
		break;
	case MODEL_OPARSE_FINISH:
		r->fin = *ev->finish;
		r->n_finish++;
		break;
	}
}

struct limits {
	size_t tag, value;
};

/* Parse text cut at the given sorted offsets (n_cuts of them). */
static void parse(struct res *r, const char *text, size_t len, const size_t *cuts, size_t n_cuts,
		  bool in_reasoning, struct limits lim)
{
	memset(r, 0, sizeof *r);
	struct model_oparse *p = NULL;
	struct err e = {0};
	struct model_oparse_options o = {.emit = on_event, .user = r, .in_reasoning = in_reasoning,
					 .max_tag_bytes = lim.tag, .max_value_bytes = lim.value,
					 .call_id_seed = 7};
	if (model_oparse_create(&p, &o, &e) != ST_OK) {
		T_CHECKF(0, "create: %s", e.msg);
		return;
	}
	size_t at = 0;
	for (size_t i = 0; i <= n_cuts; i++) {
		size_t end = i < n_cuts ? cuts[i] : len;
		if (model_oparse_feed(p, text + at, end - at) != ST_OK)
			r->bad_order = true;
		at = end;
	}
	if (model_oparse_finish(p) != ST_OK)
		r->bad_order = true;
	T_CHECK(model_oparse_feed(p, "x", 1) == ST_INVALID);
	model_oparse_destroy(p);
}

static int cmp_size(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	return x < y ? -1 : x > y;
}

static void parse_random_split(struct res *r, const char *text, size_t len, bool in_reasoning,
			       struct limits lim)
{
	size_t n = len ? rndn(len < 40 ? len : 40) + 1 : 0;
	size_t *cuts = calloc(n + 1, sizeof *cuts);
	for (size_t i = 0; i < n; i++)
		cuts[i] = rndn(len + 1);
	qsort(cuts, n, sizeof *cuts, cmp_size);
	parse(r, text, len, cuts, n, in_reasoning, lim);
	free(cuts);
}

static void parse_bytewise(struct res *r, const char *text, size_t len, bool in_reasoning,
			   struct limits lim)
{
	size_t *cuts = calloc(len + 1, sizeof *cuts);
	for (size_t i = 0; i < len; i++)
		cuts[i] = i;
	parse(r, text, len, cuts, len, in_reasoning, lim);
	free(cuts);
}

static bool tb_eq(const struct tb *a, const struct tb *b)
{
	return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static bool res_eq(const struct res *a, const struct res *b)
{
	if (!tb_eq(&a->reasoning, &b->reasoning) || !tb_eq(&a->content, &b->content) ||
	    a->n_calls != b->n_calls || a->n_finish != b->n_finish || a->bad_order != b->bad_order)
		return false;
	if (memcmp(&a->fin, &b->fin, sizeof a->fin) != 0)
		return false;
	for (size_t i = 0; i < a->n_calls; i++)
		if (strcmp(a->calls[i].id, b->calls[i].id) || !tb_eq(&a->calls[i].name, &b->calls[i].name) ||
		    !tb_eq(&a->calls[i].args, &b->calls[i].args))
			return false;
	return true;
}

static void dump_res(const char *tag, const struct res *r)
{
	fprintf(stderr, "  %s: reasoning=[%s] content=[%s] calls=%zu finish=%d malformed=%zu bad=%d\n",
		tag, r->reasoning.p ? r->reasoning.p : "", r->content.p ? r->content.p : "",
		r->n_calls, r->n_finish, r->fin.n_malformed, r->bad_order);
	for (size_t i = 0; i < r->n_calls; i++)
		fprintf(stderr, "    call %zu %s %s %s\n", i, r->calls[i].id,
			r->calls[i].name.p ? r->calls[i].name.p : "",
			r->calls[i].args.p ? r->calls[i].args.p : "");
}

/* Every started call has arguments that are one JSON object. */
static bool args_all_valid(const struct res *r)
{
	for (size_t i = 0; i < r->n_calls; i++) {
		json_error_t je;
		json_t *v = json_loadb(r->calls[i].args.p ? r->calls[i].args.p : "",
				       r->calls[i].args.len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL,
				       &je);
		bool ok = v && json_is_object(v);
		json_decref(v);
		if (!ok) {
			fprintf(stderr, "  invalid args JSON: %s (%s)\n",
				r->calls[i].args.p ? r->calls[i].args.p : "", je.text);
			return false;
		}
	}
	return true;
}

/* ---- generator of well-formed outputs ---- */

static const char *const text_pieces[] = {
	"a", "xyz", " ", "\n", "\t", "\"", "\\", "<", ">", "</", "<think>", "é", "日本語", "😀",
	"\x01", "</" DSML "param", "<" DSML, "{", "}", "\n\n", "/", "=", "string=\"true\"", "Hello",
	"<｜end▁of", "tool_call", "<" DSML "invoke",
};
static const char *const names[] = {"get_weather", "web_search", "翻译", "f", "a.b-c_d",
				    "tool with space", "q\"uote"};
static const char *const keys[] = {"city", "q", "top_k", "ключ", "a b", "x_y", "empty", "日",
				   "say \"hi\"", "\"", "a\\b"};
static const char *const json_values[] = {
	"1", "-3", "0", "2.5", "1e-07", "1e+22", "true", "false", "null", "[]", "{}", "[1, 2, 3]",
	"{\"a\": {\"b\": [true, null, \"x\\\"y\"]}}", "\"quoted \\u00e9 \\n str\"",
	"123456789012345678901234567890", " 7 ", "[\"<\", \">\", \"</think>\"]",
	"{\"k\": \"日本\", \"n\": -0.0}",
};
static const char *const bad_json_values[] = {"abc", "{", "", "tru", "[1,", "1 2", "'s'"};

/* Random text from pieces; no_think: leave out "</think>" (reasoning). */
static void rnd_text(struct tb *b, size_t max_pieces, bool allow_think_end)
{
	size_t n = rndn(max_pieces + 1);
	for (size_t i = 0; i < n; i++) {
		tb_puts(b, text_pieces[rndn(ARRAY_N(text_pieces))]);
		if (allow_think_end && rndn(20) == 0)
			tb_puts(b, "</think>");
	}
}
struct gen {
	struct tb text;
	struct res want;
	bool in_reasoning;
};

static void gen_case(struct gen *g)
{
	memset(g, 0, sizeof *g);
	g->in_reasoning = rndn(2);
	struct res *w = &g->want;
	if (g->in_reasoning) {
		struct tb r = {0};
		rnd_text(&r, 12, false);
		tb_put(&g->text, r.p ? r.p : "", r.len);
		tb_put(&w->reasoning, r.p ? r.p : "", r.len);
		tb_puts(&g->text, "</think>");
		free(r.p);
	}
	struct tb c = {0};
	rnd_text(&c, 12, true);
	tb_put(&g->text, c.p ? c.p : "", c.len);
	tb_put(&w->content, c.p ? c.p : "", c.len);
	free(c.p);
	size_t n_calls = rndn(3) == 0 ? 0 : rndn(4) + 1;
	if (n_calls) {
		bool nl = rndn(5) != 0;
		tb_puts(&g->text, nl ? "\n\n<" DSML "tool_calls>\n" : "<" DSML "tool_calls>\n");
		/* without the \n\n, content's own trailing \n\n is the marker's */
		if (!nl && w->content.len >= 2 &&
		    memcmp(w->content.p + w->content.len - 2, "\n\n", 2) == 0)
			w->content.len -= 2;
		for (size_t i = 0; i < n_calls; i++) {
			const char *name = names[rndn(ARRAY_N(names))];
			tb_puts(&g->text, "<" DSML "invoke name=\"");
			tb_puts(&g->text, name);
			tb_puts(&g->text, "\">\n");
			struct call_res *cr = &w->calls[w->n_calls++];
			tb_puts(&cr->name, name);
			snprintf(cr->id, sizeof cr->id, "?");
			tb_puts(&cr->args, "{");
			size_t n_params = rndn(5);
			for (size_t k = 0; k < n_params; k++) {
				const char *key = keys[rndn(ARRAY_N(keys))];
				if (k) {
					tb_puts(&g->text, "\n");
					tb_puts(&cr->args, ", ");
				}
				tb_puts(&cr->args, "\"");
				py_escape(&cr->args, key, strlen(key));
				tb_puts(&cr->args, "\": ");
				tb_puts(&g->text, "<" DSML "parameter name=\"");
				tb_puts(&g->text, key);
				int kind = (int)rndn(5);
				if (kind <= 1) { /* raw string */
					struct tb v = {0};
					rnd_text(&v, 10, true);
					tb_puts(&g->text, "\" string=\"true\">");
					tb_put(&g->text, v.p ? v.p : "", v.len);
					tb_puts(&cr->args, "\"");
					py_escape(&cr->args, v.p ? v.p : "", v.len);
					tb_puts(&cr->args, "\"");
					free(v.p);
				} else if (kind <= 3) { /* valid JSON, inserted as-is */
					const char *v = json_values[rndn(ARRAY_N(json_values))];
					tb_puts(&g->text, "\" string=\"false\">");
					tb_puts(&g->text, v);
					tb_puts(&cr->args, v);
				} else { /* invalid JSON: becomes a string */
					const char *v = bad_json_values[rndn(ARRAY_N(bad_json_values))];
					tb_puts(&g->text, "\" string=\"false\">");
					tb_puts(&g->text, v);
					tb_puts(&cr->args, "\"");
					py_escape(&cr->args, v, strlen(v));
					tb_puts(&cr->args, "\"");
				}
				tb_puts(&g->text, "</" DSML "parameter>");
			}
			tb_puts(&cr->args, "}");
			tb_puts(&g->text, "\n</" DSML "invoke>");
			if (i + 1 < n_calls)
				tb_puts(&g->text, "\n");
		}
		tb_puts(&g->text, "\n</" DSML "tool_calls>");
	}
	w->n_finish = 1;
	w->fin.n_tool_calls = w->n_calls;
	if (rndn(2)) {
		tb_puts(&g->text, EOS_TEXT);
		w->fin.saw_eos = true;
	}
}

static void gen_free(struct gen *g)
{
	free(g->text.p);
	res_free(&g->want);
}

/* ids are the parser's; compare everything else */
static bool matches_want(const struct res *got, struct res *want)
{
	if (got->n_calls == want->n_calls)
		for (size_t i = 0; i < got->n_calls; i++)
			memcpy(want->calls[i].id, got->calls[i].id, sizeof got->calls[i].id);
	return res_eq(got, want);
}

static const struct limits default_limits = {0, 0};

static void valid_outputs(int n_cases)
{
	int bad = 0;
	for (int i = 0; i < n_cases && bad < 3; i++) {
		struct gen g;
		gen_case(&g);
		struct res r0, r1, r2;
		parse(&r0, g.text.p, g.text.len, NULL, 0, g.in_reasoning, default_limits);
		bool ok0 = matches_want(&r0, &g.want);
		T_CHECKF(ok0, "valid case %d: one-shot parse differs from the expected result", i);
		T_CHECK(args_all_valid(&r0));
		parse_bytewise(&r1, g.text.p, g.text.len, g.in_reasoning, default_limits);
		parse_random_split(&r2, g.text.p, g.text.len, g.in_reasoning, default_limits);
		bool ok12 = res_eq(&r0, &r1) && res_eq(&r0, &r2);
		T_CHECKF(ok12, "valid case %d: split parse differs", i);
		if (!ok0 || !ok12) {
			bad++;
			fprintf(stderr, "  text: [%s] in_reasoning=%d\n", g.text.p, g.in_reasoning);
			dump_res("want", &g.want);
			dump_res("got", &r0);
			dump_res("bytewise", &r1);
		}
		res_free(&r0);
		res_free(&r1);
		res_free(&r2);
		gen_free(&g);
	}
}

/* ---- adversarial variants ---- */

static const char *const frags[] = {
	"<" DSML "invoke", "</" DSML "invoke>", "<" DSML "parameter", "</" DSML "parameter>",
	"\n\n<" DSML "tool_calls>", "</" DSML "tool_calls>", "</think>", EOS_TEXT, "\"", ">",
	" name=\"x\"", " string=\"false\"", " string=\"true\">", "\xE6\x97", "\xFF", "\x80", "<",
	"｜", "\n", "{\"a\":", "\xF0\x9F\x98",
};

static void mutate(struct tb *t)
{
	int n_ops = (int)rndn(4) + 1;
	for (int op = 0; op < n_ops; op++) {
		size_t len = t->len, at = rndn(len + 1);
		switch (rndn(5)) {
		case 0: /* truncate */
			t->len = at;
			if (t->p)
				t->p[t->len] = 0;
			break;
		case 1: /* flip a byte */
			if (len)
				t->p[rndn(len)] = (char)"<>\"/\n x\xE2\xFF="[rndn(11)];
			break;
		case 2: { /* delete a range */
			size_t n = rndn(len - at + 1);
			if (n > 16)
				n = rndn(17);
			memmove(t->p + at, t->p + at + n, len - at - n + 1);
			t->len -= n;
			break;
		}
		default: { /* insert a fragment */
			const char *f = frags[rndn(ARRAY_N(frags))];
			size_t n = strlen(f);
			tb_put(t, f, n); /* grow */
			memmove(t->p + at + n, t->p + at, len - at);
			memcpy(t->p + at, f, n);
			t->p[t->len] = 0;
			break;
		}
		}
	}
}

static void adversarial(int n_cases, struct limits lim)
{
	int bad = 0;
	for (int i = 0; i < n_cases && bad < 3; i++) {
		struct gen g;
		gen_case(&g);
		mutate(&g.text);
		struct res r0, r1, r2;
		parse(&r0, g.text.p ? g.text.p : "", g.text.len, NULL, 0, g.in_reasoning, lim);
		parse_bytewise(&r1, g.text.p ? g.text.p : "", g.text.len, g.in_reasoning, lim);
		parse_random_split(&r2, g.text.p ? g.text.p : "", g.text.len, g.in_reasoning, lim);
		bool same = res_eq(&r0, &r1) && res_eq(&r0, &r2);
		bool valid = args_all_valid(&r0) && !r0.bad_order && r0.n_finish == 1 &&
			     r0.fin.n_tool_calls == r0.n_calls;
		T_CHECKF(same, "adversarial case %d (limits %zu/%zu): split parse differs", i,
			 lim.tag, lim.value);
		T_CHECKF(valid, "adversarial case %d: protocol or JSON broken", i);
		if (!same || !valid) {
			bad++;
			fprintf(stderr, "  text: [%s]\n", g.text.p ? g.text.p : "");
			dump_res("one-shot", &r0);
			dump_res("bytewise", &r1);
			dump_res("split", &r2);
		}
		res_free(&r0);
		res_free(&r1);
		res_free(&r2);
		gen_free(&g);
	}
}

/* Every prefix of a few valid outputs: no crash, valid JSON, invariance. */
static void all_truncations(int n_cases)
{
	for (int i = 0; i < n_cases; i++) {
		struct gen g;
		gen_case(&g);
		for (size_t cut = 0; cut <= g.text.len; cut++) {
			struct res r0, r1;
			parse(&r0, g.text.p, cut, NULL, 0, g.in_reasoning, default_limits);
			parse_random_split(&r1, g.text.p, cut, g.in_reasoning, default_limits);
			T_CHECK(res_eq(&r0, &r1));
			T_CHECK(args_all_valid(&r0) && r0.n_finish == 1 && !r0.bad_order);
			res_free(&r0);
			res_free(&r1);
		}
		gen_free(&g);
	}
}

/* ---- hand-written cases ---- */

static void one(struct res *r, const char *text, bool in_reasoning, struct limits lim)
{
	parse(r, text, strlen(text), NULL, 0, in_reasoning, lim);
	struct res b;
	parse_bytewise(&b, text, strlen(text), in_reasoning, lim);
	T_CHECKF(res_eq(r, &b), "bytewise differs for [%s]", text);
	res_free(&b);
}

#define STR(tb) ((tb).p ? (tb).p : "")

static void hand_cases(void)
{
	struct res r;
	one(&r, "Simple arithmetic.</think>2 + 2 = 4." EOS_TEXT "ignored", true, default_limits);
	T_CHECK(strcmp(STR(r.reasoning), "Simple arithmetic.") == 0);
	T_CHECK(strcmp(STR(r.content), "2 + 2 = 4.") == 0);
	T_CHECK(r.n_calls == 0 && r.fin.saw_eos && !r.fin.open_reasoning);
	res_free(&r);

	/* chat mode: </think> is just content */
	one(&r, "a</think>b", false, default_limits);
	T_CHECK(strcmp(STR(r.content), "a</think>b") == 0 && r.reasoning.len == 0);
	res_free(&r);

	/* unterminated reasoning */
	one(&r, "thinking <", true, default_limits);
	T_CHECK(strcmp(STR(r.reasoning), "thinking <") == 0 && r.fin.open_reasoning);
	res_free(&r);

	/* the encoder's exact shape */
	one(&r,
	    "The user wants the weather.</think>\n\n<" DSML "tool_calls>\n<" DSML
	    "invoke name=\"get_weather\">\n<" DSML "parameter name=\"city\" string=\"true\">Bei\"jing"
	    "</" DSML "parameter>\n<" DSML "parameter name=\"days\" string=\"false\">3</" DSML
	    "parameter>\n</" DSML "invoke>\n</" DSML "tool_calls>",
	    true, default_limits);
	T_CHECK(r.n_calls == 1 && r.fin.n_tool_calls == 1 && r.content.len == 0);
	T_CHECK(r.n_calls == 1 && strcmp(STR(r.calls[0].name), "get_weather") == 0);
	T_CHECK(r.n_calls == 1 &&
		strcmp(STR(r.calls[0].args), "{\"city\": \"Bei\\\"jing\", \"days\": 3}") == 0);
	T_CHECK(r.n_calls == 1 && strncmp(r.calls[0].id, "call_", 5) == 0 &&
		strlen(r.calls[0].id) == 21);
	res_free(&r);

	/* truncated inside a value: the call is closed, JSON stays valid */
	one(&r, "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML
		"parameter name=\"q\" string=\"true\">hal", false, default_limits);
	T_CHECK(r.n_calls == 1 && strcmp(STR(r.calls[0].args), "{\"q\": \"hal\"}") == 0);
	T_CHECK(r.fin.open_tool_call);
	res_free(&r);

	/* truncated before the call started: the markup is content */
	one(&r, "hi\n\n<" DSML "tool_calls>\n<" DSML "invoke na", false, default_limits);
	T_CHECK(r.n_calls == 0 &&
		strcmp(STR(r.content), "hi\n\n<" DSML "tool_calls>\n<" DSML "invoke na") == 0);
	res_free(&r);

	/* garbage inside a block: content, later text kept */
	one(&r, "x\n\n<" DSML "tool_calls>\nnot dsml", false, default_limits);
	T_CHECK(r.n_calls == 0 && strcmp(STR(r.content), "x\n\n<" DSML "tool_calls>\nnot dsml") == 0);
	T_CHECK(r.fin.n_malformed == 1);
	res_free(&r);

	/* a head that never closes is given back once it passes the limit */
	struct limits small = {16, 8};
	one(&r, "<" DSML "tool_calls><" DSML "invoke name=\"aaaaaaaaaaaaaaaaaaaaaaaaaaaa", false,
	    small);
	T_CHECK(r.n_calls == 0 && r.fin.n_malformed == 1);
	T_CHECK(strcmp(STR(r.content),
		       "<" DSML "tool_calls><" DSML "invoke name=\"aaaaaaaaaaaaaaaaaaaaaaaaaaaa") == 0);
	res_free(&r);

	/* a JSON value over the validation limit streams as a string */
	one(&r, "<" DSML "tool_calls><" DSML "invoke name=\"f\"><" DSML
		"parameter name=\"v\" string=\"false\">[1, 2, 3, 4, 5]</" DSML "parameter></" DSML
		"invoke></" DSML "tool_calls>",
	    false, (struct limits){64, 8});
	T_CHECK(r.n_calls == 1 && strcmp(STR(r.calls[0].args), "{\"v\": \"[1, 2, 3, 4, 5]\"}") == 0);
	res_free(&r);

	/* invalid UTF-8 in a string value is repaired; no parameters gives {} */
	one(&r, "<" DSML "tool_calls><" DSML "invoke name=\"f\"><" DSML
		"parameter name=\"v\" string=\"true\">a\xFF\xE6\x97</" DSML "parameter></" DSML
		"invoke><" DSML "invoke name=\"g\">\n\n</" DSML "invoke></" DSML "tool_calls>tail",
	    false, default_limits);
	T_CHECK(r.n_calls == 2 &&
		strcmp(STR(r.calls[0].args), "{\"v\": \"a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"}") == 0);
	T_CHECK(r.n_calls == 2 && strcmp(STR(r.calls[1].args), "{}") == 0);
	T_CHECK(strcmp(STR(r.content), "tail") == 0);
	res_free(&r);

	/* missing </parameter> before </invoke> is tolerated */
	one(&r, "<" DSML "tool_calls><" DSML "invoke name=\"f\"><" DSML
		"parameter name=\"n\" string=\"false\">5</" DSML "invoke></" DSML "tool_calls>",
	    false, default_limits);
	T_CHECK(r.n_calls == 1 && strcmp(STR(r.calls[0].args), "{\"n\": 5}") == 0);
	T_CHECK(r.fin.n_malformed == 0 && !r.fin.open_tool_call);
	res_free(&r);

	/* tool calls straight out of reasoning (no </think>) */
	one(&r, "plan\n\n<" DSML "tool_calls><" DSML "invoke name=\"f\"></" DSML "invoke></" DSML
		"tool_calls>",
	    true, default_limits);
	T_CHECK(strcmp(STR(r.reasoning), "plan") == 0 && r.n_calls == 1);
	res_free(&r);

	/* </think> split at every offset */
	const char *t = "abc</think>def";
	for (size_t cut = 0; cut <= strlen(t); cut++) {
		size_t cuts[1] = {cut};
		parse(&r, t, strlen(t), cuts, 1, true, default_limits);
		T_CHECK(strcmp(STR(r.reasoning), "abc") == 0 && strcmp(STR(r.content), "def") == 0);
		res_free(&r);
	}

	/* create without a callback fails cleanly; destroy(NULL) is a no-op */
	struct model_oparse *p = (struct model_oparse *)1;
	struct err e = {0};
	struct model_oparse_options o = {0};
	T_CHECK(model_oparse_create(&p, &o, &e) == ST_INVALID && p == NULL);
	model_oparse_destroy(NULL);
}

int main(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	rng_state = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
	fprintf(stderr, "seed %llu (set DSV4_TEST_SEED to repeat)\n", (unsigned long long)rng_state);
	hand_cases();
	valid_outputs(400);
	all_truncations(8);
	adversarial(1500, default_limits);
	adversarial(1500, (struct limits){8, 4});
	adversarial(500, (struct limits){1, 1});
	return test_exit();
}
