/*
 * model/output_parser.c: the streaming reasoning / content / DSML tool-call
 * parser (model/output_parser.h).
 *
 * Owns: a byte-driven state machine over the generated text. Text states
 * (reasoning, content, a parameter value) hold back only the longest suffix
 * that may still become a marker; DSML structure states accept whitespace
 * and the tags the grammar allows there, and anything else is "malformed":
 * the open call is closed with valid JSON and the unparsed markup goes back
 * to content. Because every decision is made per byte on content alone, the
 * output does not depend on how the input was split into deltas.
 */
#include "model/output_parser.h"

#include "common/strbuf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSML "｜DSML｜"
#define EOS_TEXT "<｜end▁of▁sentence｜>"

/* ---- markers ---- */

enum action {
	A_END_THINK, /* </think> in reasoning */
	A_EOS,       /* end of sentence as text */
	A_TOOLS,     /* a tool_calls block opens */
	A_TOOLS_END, /* </｜DSML｜tool_calls> */
	A_INVOKE,    /* <｜DSML｜invoke (head follows) */
	A_INVOKE_END,
	A_PARAM, /* <｜DSML｜parameter (head follows) */
	A_PARAM_END,
	A_PARAM_INVOKE_END, /* </｜DSML｜invoke> while a value is open */
};

struct marker {
	const char *text;
	size_t len;
	enum action act;
};

#define M(s, a) {s, sizeof(s) - 1, a}
/* Longest first where one marker ends another (the \n\n form wins). */
static const struct marker reasoning_markers[] = {
	M("\n\n<" DSML "tool_calls>", A_TOOLS), M("<" DSML "tool_calls>", A_TOOLS),
	M("</think>", A_END_THINK), M(EOS_TEXT, A_EOS)};
static const struct marker content_markers[] = {
	M("\n\n<" DSML "tool_calls>", A_TOOLS), M("<" DSML "tool_calls>", A_TOOLS),
	M(EOS_TEXT, A_EOS)};
static const struct marker value_markers[] = {
	M("</" DSML "parameter>", A_PARAM_END), M("</" DSML "invoke>", A_PARAM_INVOKE_END),
	M(EOS_TEXT, A_EOS)};
static const struct marker block_tags[] = {
	M("<" DSML "invoke", A_INVOKE), M("</" DSML "tool_calls>", A_TOOLS_END), M(EOS_TEXT, A_EOS)};
static const struct marker invoke_tags[] = {
	M("<" DSML "parameter", A_PARAM), M("</" DSML "invoke>", A_INVOKE_END), M(EOS_TEXT, A_EOS)};
#undef M

#define MARKER_MAX_BYTES 48 /* longer than every marker above */

enum state {
	S_REASONING,
	S_CONTENT,
	S_BLOCK,       /* inside tool_calls, between invokes */
	S_INVOKE_HEAD, /* after <｜DSML｜invoke, up to > */
	S_INVOKE_BODY, /* inside an invoke, between parameters */
	S_PARAM_HEAD,  /* after <｜DSML｜parameter, up to > */
	S_PARAM_VALUE,
	S_DONE, /* after EOS: everything is ignored */
};

struct model_oparse {
	struct model_oparse_options opt;
	enum state state;
	enum status sticky;
	bool finished;

	/* text states: bytes that may still be a marker */
	char hold[MARKER_MAX_BYTES];
	size_t hold_len;
	/* structure states: a tag being matched, whitespace seen before it */
	char tag[MARKER_MAX_BYTES];
	size_t tag_len, ws_bytes;
	/* invoke / parameter head text (bounded by max_tag_bytes) */
	struct strbuf head;
	bool head_unquoted; /* no quote seen yet: a bare > ends the head */
	/* markup consumed but not yet accounted for: given back as content on
	 * malformation (bounded: whitespace and heads are bounded) */
	struct strbuf raw;

	/* the pending event run, flushed on kind change and at feed end */
	struct strbuf run;
	enum model_oparse_event_kind run_kind;

	/* the open call */
	bool call_open;
	size_t call_index, n_params;
	size_t block_calls; /* calls started in the current tool_calls block */
	bool value_is_string;
	struct strbuf value; /* string="false" value held for validation */
	unsigned char u8[4];
	size_t u8_len, u8_need;

	struct model_oparse_finish fin;
};

/* ---- emission ---- */

static void fail_nomem(struct model_oparse *p)
{
	if (p->sticky == ST_OK)
		p->sticky = ST_NOMEM;
}

static void flush_run(struct model_oparse *p)
{
	if (p->run.len == 0)
		return;
	struct model_oparse_event ev = {.kind = p->run_kind, .text = p->run.data, .len = p->run.len,
					.tool_index = p->call_index};
	p->opt.emit(p->opt.user, &ev);
	p->run.len = 0;
}

static void emit(struct model_oparse *p, enum model_oparse_event_kind kind, const char *s,
		 size_t n)
{
	if (n == 0)
		return;
	if (p->run.len && p->run_kind != kind)
		flush_run(p);
	p->run_kind = kind;
	strbuf_append(&p->run, s, n);
	if (strbuf_failed(&p->run))
		fail_nomem(p);
}

static void emit_args(struct model_oparse *p, const char *s)
{
	emit(p, MODEL_OPARSE_TOOL_CALL_ARGS, s, strlen(s));
}

/* ---- JSON string escaping with UTF-8 repair (json.dumps style) ---- */

static void esc_byte_raw(struct model_oparse *p, unsigned char c)
{
	char tmp[7];
	const char *s = strbuf_json_escape(c, tmp);
	if (s)
		emit_args(p, s);
	else
		emit(p, MODEL_OPARSE_TOOL_CALL_ARGS, (const char *)&c, 1);
}

static void u8_bad_flush(struct model_oparse *p)
{
	for (size_t i = 0; i < p->u8_len; i++)
		emit_args(p, "\xEF\xBF\xBD"); /* U+FFFD per byte of a broken sequence */
	p->u8_len = p->u8_need = 0;
}

/* One byte of a JSON string's content: ASCII is escaped, valid UTF-8 is
 * copied, anything else becomes U+FFFD. Incomplete sequences wait. */
static void esc_byte(struct model_oparse *p, unsigned char c)
{
	if (p->u8_len) {
		unsigned char lead = p->u8[0];
		unsigned char lo = 0x80, hi = 0xBF;
		if (p->u8_len == 1) {
			if (lead == 0xE0)
				lo = 0xA0;
			else if (lead == 0xED)
				hi = 0x9F;
			else if (lead == 0xF0)
				lo = 0x90;
			else if (lead == 0xF4)
				hi = 0x8F;
		}
		if (c >= lo && c <= hi) {
			p->u8[p->u8_len++] = c;
			if (p->u8_len == p->u8_need) {
				emit(p, MODEL_OPARSE_TOOL_CALL_ARGS, (const char *)p->u8, p->u8_len);
				p->u8_len = p->u8_need = 0;
			}
			return;
		}
		u8_bad_flush(p); /* then c starts afresh */
	}
	if (c < 0x80) {
		esc_byte_raw(p, c);
	} else if (c >= 0xC2 && c <= 0xF4) {
		p->u8[0] = c;
		p->u8_len = 1;
		p->u8_need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
	} else {
		emit_args(p, "\xEF\xBF\xBD");
	}
}

static void esc_str(struct model_oparse *p, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		esc_byte(p, (unsigned char)s[i]);
	u8_bad_flush(p);
}

/* ---- tool call pieces ---- */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void call_start(struct model_oparse *p, const char *name)
{
	flush_run(p);
	char id[32];
	p->call_index = p->fin.n_tool_calls++;
	snprintf(id, sizeof id, "call_%016llx",
		 (unsigned long long)splitmix64(p->opt.call_id_seed * 0x100000001b3ull +
						p->call_index));
	struct model_oparse_event ev = {.kind = MODEL_OPARSE_TOOL_CALL_START,
					.tool_index = p->call_index, .tool_id = id,
					.tool_name = name};
	p->opt.emit(p->opt.user, &ev);
	p->call_open = true;
	p->block_calls++;
	p->n_params = 0;
	emit_args(p, "{");
}

static void param_begin(struct model_oparse *p, const char *key, size_t key_len,
			bool is_string)
{
	emit_args(p, p->n_params ? ", \"" : "\"");
	esc_str(p, key, key_len);
	emit_args(p, is_string ? "\": \"" : "\": ");
	p->value_is_string = is_string;
	p->value.len = 0;
	p->n_params++;
}

static bool json_valid(const char *s, size_t n)
{
	json_error_t je;
	json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL,
			       &je);
	if (!v)
		return false;
	json_decref(v);
	return true;
}

static void value_byte(struct model_oparse *p, unsigned char c)
{
	if (p->value_is_string) {
		esc_byte(p, c);
		return;
	}
	if (p->value.len >= p->opt.max_value_bytes) {
		/* too big to hold for validation: it streams on as a string */
		emit_args(p, "\"");
		for (size_t i = 0; i < p->value.len; i++)
			esc_byte(p, (unsigned char)p->value.data[i]);
		p->value.len = 0;
		p->value_is_string = true;
		esc_byte(p, c);
		return;
	}
	strbuf_putc(&p->value, (char)c);
	if (strbuf_failed(&p->value))
		fail_nomem(p);
}

static void value_end(struct model_oparse *p)
{
	if (p->value_is_string) {
		u8_bad_flush(p);
		emit_args(p, "\"");
	} else if (p->value.len && json_valid(p->value.data, p->value.len)) {
		emit(p, MODEL_OPARSE_TOOL_CALL_ARGS, p->value.data, p->value.len);
	} else {
		emit_args(p, "\"");
		esc_str(p, p->value.data ? p->value.data : "", p->value.len);
		emit_args(p, "\"");
	}
	p->value.len = 0;
}

static void call_end(struct model_oparse *p)
{
	if (!p->call_open)
		return;
	emit_args(p, "}");
	flush_run(p);
	p->call_open = false;
}

/* ---- state changes ---- */

static void enter(struct model_oparse *p, enum state s)
{
	p->state = s;
	p->tag_len = 0;
	p->ws_bytes = 0;
	p->head.len = 0;
	p->head_unquoted = true;
}

static void raw_put(struct model_oparse *p, const void *s, size_t n)
{
	strbuf_append(&p->raw, s, n);
	if (strbuf_failed(&p->raw))
		fail_nomem(p);
}

/* The markup broke: close the open call, give back the unaccounted markup
 * as content and continue in content. */
static void malformed(struct model_oparse *p)
{
	p->fin.n_malformed++;
	call_end(p);
	emit(p, MODEL_OPARSE_CONTENT, p->raw.data, p->raw.len);
	p->raw.len = 0;
	enter(p, S_CONTENT);
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Parse a head the way DeepSeek's decoder reads it: ` name="N"` for an
 * invoke, ` name="K" string="true|false"` for a parameter. The name runs to
 * the last ` string="` (parameters) or the closing quote, so names that
 * contain quotes survive. *str is NULL when a parameter has no string attr. */
static bool head_parse(const char *h, size_t n, bool is_param, const char **name,
		       size_t *name_len, const char **str, size_t *str_len)
{
	static const char name_attr[] = "name=\"", str_attr[] = "\" string=\"";
	size_t i = 0;
	*str = NULL;
	*str_len = 0;
	while (i < n && is_ws(h[i]))
		i++;
	while (n > i && is_ws(h[n - 1]))
		n--;
	if (n - i < sizeof name_attr || memcmp(h + i, name_attr, sizeof name_attr - 1) != 0 ||
	    h[n - 1] != '"')
		return false;
	i += sizeof name_attr - 1;
	size_t end = n - 1; /* the closing quote */
	if (is_param) {
		for (size_t k = end; k-- > i;) {
			if (end - k >= sizeof str_attr - 1 &&
			    memcmp(h + k, str_attr, sizeof str_attr - 1) == 0) {
				*str = h + k + sizeof str_attr - 1;
				*str_len = end - (k + sizeof str_attr - 1);
				end = k;
				break;
			}
		}
	}
	*name = h + i;
	*name_len = end - i;
	return !memchr(*name, 0, *name_len);
}

static void head_done(struct model_oparse *p)
{
	const char *name, *str;
	size_t name_len, str_len;
	bool is_param = p->state == S_PARAM_HEAD;
	if (!head_parse(p->head.data, p->head.len, is_param, &name, &name_len, &str, &str_len)) {
		malformed(p);
		return;
	}
	if (!is_param) {
		char *nm = strndup(name, name_len);
		if (!nm) {
			fail_nomem(p);
			return;
		}
		call_start(p, nm);
		free(nm);
		p->raw.len = 0;
		enter(p, S_INVOKE_BODY);
	} else {
		/* string="false" or no attribute: a JSON value, validated at the
		 * end; anything else ("true"): a raw string */
		bool is_string = str && !(str_len == 5 && memcmp(str, "false", 5) == 0);
		param_begin(p, name, name_len, is_string);
		p->raw.len = 0;
		enter(p, S_PARAM_VALUE);
	}
}

static void act(struct model_oparse *p, const struct marker *m)
{
	switch (m->act) {
	case A_END_THINK:
		enter(p, S_CONTENT);
		break;
	case A_EOS:
		p->fin.saw_eos = true;
		if (p->state == S_PARAM_VALUE) {
			value_end(p);
			p->fin.n_malformed++;
		}
		if (p->call_open)
			call_end(p);
		else if (p->state != S_REASONING && p->state != S_CONTENT && !p->block_calls)
			emit(p, MODEL_OPARSE_CONTENT, p->raw.data, p->raw.len);
		p->raw.len = 0;
		enter(p, S_DONE);
		break;
	case A_TOOLS:
		p->block_calls = 0;
		p->raw.len = 0;
		raw_put(p, m->text, m->len);
		enter(p, S_BLOCK);
		break;
	case A_TOOLS_END:
		p->raw.len = 0;
		enter(p, S_CONTENT);
		break;
	case A_INVOKE:
		enter(p, S_INVOKE_HEAD);
		break;
	case A_INVOKE_END:
		call_end(p);
		p->raw.len = 0;
		enter(p, S_BLOCK);
		break;
	case A_PARAM:
		enter(p, S_PARAM_HEAD);
		break;
	case A_PARAM_END:
		value_end(p);
		enter(p, S_INVOKE_BODY);
		break;
	case A_PARAM_INVOKE_END:
		value_end(p);
		call_end(p);
		p->raw.len = 0;
		enter(p, S_BLOCK);
		break;
	}
}

/* ---- per-state byte handlers ---- */

static void text_sink(struct model_oparse *p, const char *s, size_t n)
{
	if (p->state == S_REASONING)
		emit(p, MODEL_OPARSE_REASONING, s, n);
	else if (p->state == S_CONTENT)
		emit(p, MODEL_OPARSE_CONTENT, s, n);
	else
		for (size_t i = 0; i < n; i++)
			value_byte(p, (unsigned char)s[i]);
}

static bool prefix_of_any(const struct marker *ms, size_t n_ms, const char *s, size_t n)
{
	for (size_t i = 0; i < n_ms; i++)
		if (n <= ms[i].len && memcmp(ms[i].text, s, n) == 0)
			return true;
	return false;
}

static void text_byte(struct model_oparse *p, unsigned char c, const struct marker *ms,
		      size_t n_ms)
{
	if (p->hold_len == 0 && c != '<' && c != '\n') {
		char ch = (char)c;
		text_sink(p, &ch, 1);
		return;
	}
	p->hold[p->hold_len++] = (char)c;
	for (size_t i = 0; i < n_ms; i++) {
		size_t ml = ms[i].len;
		if (p->hold_len >= ml && memcmp(p->hold + p->hold_len - ml, ms[i].text, ml) == 0) {
			text_sink(p, p->hold, p->hold_len - ml);
			p->hold_len = 0;
			act(p, &ms[i]);
			return;
		}
	}
	size_t s = 0;
	while (s < p->hold_len && !prefix_of_any(ms, n_ms, p->hold + s, p->hold_len - s))
		s++;
	text_sink(p, p->hold, s);
	memmove(p->hold, p->hold + s, p->hold_len - s);
	p->hold_len -= s;
}

static void feed_byte(struct model_oparse *p, unsigned char c);

/* Between tags: whitespace, or one of the allowed tags. */
static void tag_byte(struct model_oparse *p, unsigned char c, const struct marker *ms,
		     size_t n_ms)
{
	bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r';
	if (p->tag_len == 0 && ws) {
		if (++p->ws_bytes > p->opt.max_tag_bytes) {
			malformed(p);
			feed_byte(p, c);
			return;
		}
		raw_put(p, &c, 1);
		return;
	}
	p->tag[p->tag_len++] = (char)c;
	for (size_t i = 0; i < n_ms; i++) {
		if (p->tag_len == ms[i].len && memcmp(p->tag, ms[i].text, ms[i].len) == 0) {
			if (ms[i].act != A_EOS)
				raw_put(p, &c, 1);
			act(p, &ms[i]);
			return;
		}
	}
	if (prefix_of_any(ms, n_ms, p->tag, p->tag_len)) {
		raw_put(p, &c, 1);
		return;
	}
	malformed(p);
	feed_byte(p, c);
}

static void head_byte(struct model_oparse *p, unsigned char c)
{
	/* A head ends at `">`, or at `>` when it has no quote at all. */
	size_t k = p->head.len;
	while (k && is_ws(p->head.data[k - 1]))
		k--;
	if (c == '>' && (p->head_unquoted || (k && p->head.data[k - 1] == '"'))) {
		raw_put(p, &c, 1);
		head_done(p);
		return;
	}
	if (p->head.len >= p->opt.max_tag_bytes) {
		malformed(p);
		feed_byte(p, c);
		return;
	}
	if (c == '"')
		p->head_unquoted = false;
	raw_put(p, &c, 1);
	strbuf_putc(&p->head, (char)c);
	if (strbuf_failed(&p->head))
		fail_nomem(p);
}

static void feed_byte(struct model_oparse *p, unsigned char c)
{
	switch (p->state) {
	case S_REASONING:
		text_byte(p, c, reasoning_markers, sizeof reasoning_markers / sizeof *reasoning_markers);
		break;
	case S_CONTENT:
		text_byte(p, c, content_markers, sizeof content_markers / sizeof *content_markers);
		break;
	case S_PARAM_VALUE:
		text_byte(p, c, value_markers, sizeof value_markers / sizeof *value_markers);
		break;
	case S_BLOCK:
		tag_byte(p, c, block_tags, sizeof block_tags / sizeof *block_tags);
		break;
	case S_INVOKE_BODY:
		tag_byte(p, c, invoke_tags, sizeof invoke_tags / sizeof *invoke_tags);
		break;
	case S_INVOKE_HEAD:
	case S_PARAM_HEAD:
		head_byte(p, c);
		break;
	case S_DONE:
		break;
	}
}

/* ---- public ---- */

enum status model_oparse_create(struct model_oparse **out, const struct model_oparse_options *opt,
				struct err *e)
{
	*out = NULL;
	if (!opt || !opt->emit)
		return err_set(e, ST_INVALID, "output parser: an emit callback is required");
	struct model_oparse *p = calloc(1, sizeof *p);
	if (!p)
		return err_set(e, ST_NOMEM, "output parser: out of memory");
	p->opt = *opt;
	if (!p->opt.max_tag_bytes)
		p->opt.max_tag_bytes = MODEL_OPARSE_MAX_TAG_BYTES;
	if (!p->opt.max_value_bytes)
		p->opt.max_value_bytes = MODEL_OPARSE_MAX_VALUE_BYTES;
	p->state = opt->in_reasoning ? S_REASONING : S_CONTENT;
	*out = p;
	return ST_OK;
}

enum status model_oparse_feed(struct model_oparse *p, const char *text, size_t len)
{
	if (p->finished)
		return ST_INVALID;
	if (p->sticky)
		return p->sticky;
	for (size_t i = 0; i < len && p->state != S_DONE; i++)
		feed_byte(p, (unsigned char)text[i]);
	flush_run(p);
	return p->sticky;
}

enum status model_oparse_finish(struct model_oparse *p)
{
	if (p->finished)
		return ST_INVALID;
	p->finished = true;
	if (p->sticky)
		return p->sticky;
	switch (p->state) {
	case S_REASONING:
	case S_CONTENT:
		p->fin.open_reasoning = p->state == S_REASONING;
		text_sink(p, p->hold, p->hold_len);
		break;
	case S_PARAM_VALUE:
		text_sink(p, p->hold, p->hold_len);
		value_end(p);
		p->fin.open_tool_call = true;
		call_end(p);
		break;
	case S_BLOCK:
	case S_INVOKE_HEAD:
	case S_INVOKE_BODY:
	case S_PARAM_HEAD:
		p->fin.open_tool_call = true;
		if (p->call_open)
			call_end(p);
		else if (!p->block_calls)
			emit(p, MODEL_OPARSE_CONTENT, p->raw.data, p->raw.len);
		break;
	case S_DONE:
		break;
	}
	p->hold_len = 0;
	p->raw.len = 0;
	flush_run(p);
	if (p->sticky)
		return p->sticky;
	struct model_oparse_event ev = {.kind = MODEL_OPARSE_FINISH, .finish = &p->fin};
	p->opt.emit(p->opt.user, &ev);
	return ST_OK;
}

void model_oparse_destroy(struct model_oparse *p)
{
	if (!p)
		return;
	free(p->head.data);
	free(p->raw.data);
	free(p->run.data);
	free(p->value.data);
	free(p);
}
