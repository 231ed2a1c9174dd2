/*
 * model/chat.c: the DeepSeek-V4 chat encoding (model/chat.h).
 *
 * Owns: turning plain-C messages and options into the prompt text that
 * DeepSeek's reference encoder produces, including its preprocessing (tool
 * messages folded into user turns and sorted into call order, history
 * reasoning and developer turns dropped), the Tools section and DSML tool
 * calls, and a Python-json.dumps-compatible serializer for the JSON parts
 * (tool schemas and non-string call arguments must match byte for byte,
 * because the model was trained on that exact spelling).
 * Written from the format; tests/model/data/chat_golden.json pins it.
 */
#include "model/chat.h"

#include "common/strbuf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- json.dumps(ensure_ascii=False) ----
 * Strings: strbuf_json_string escapes exactly as json.dumps does with
 * ensure_ascii=False (", \\, \n, \r, \t, \b, \f, other controls as \u00xx). */

/* Python's repr(float): the shortest digits that round-trip, fixed notation
 * for decimal exponents in [-4, 16), else d.ddde+XX; integral values get
 * ".0" in fixed notation. */
static void py_dump_real(struct strbuf *b, double x)
{
	char tmp[64];
	if (isnan(x)) {
		strbuf_puts(b, "NaN");
		return;
	}
	if (isinf(x)) {
		strbuf_puts(b, x < 0 ? "-Infinity" : "Infinity");
		return;
	}
	if (x == 0) {
		strbuf_puts(b, signbit(x) ? "-0.0" : "0.0");
		return;
	}
	int prec;
	for (prec = 1; prec <= 17; prec++) {
		snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
		if (strtod(tmp, NULL) == x)
			break;
	}
	/* tmp is [-]d[.ddd]e[+-]XX */
	char digits[32];
	size_t nd = 0;
	const char *q = tmp;
	bool neg = false;
	if (*q == '-') {
		neg = true;
		q++;
	}
	for (; *q && *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			digits[nd++] = *q;
	int exp10 = atoi(q + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	int decpt = exp10 + 1; /* value = 0.d1d2.. * 10^decpt */
	if (neg)
		strbuf_putc(b, '-');
	if (decpt <= -4 || decpt > 16) {
		strbuf_putc(b, digits[0]);
		if (nd > 1) {
			strbuf_putc(b, '.');
			strbuf_append(b, digits + 1, nd - 1);
		}
		snprintf(tmp, sizeof tmp, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
		strbuf_puts(b, tmp);
	} else if (decpt <= 0) {
		strbuf_puts(b, "0.");
		for (int i = 0; i < -decpt; i++)
			strbuf_putc(b, '0');
		strbuf_append(b, digits, nd);
	} else if ((size_t)decpt >= nd) {
		strbuf_append(b, digits, nd);
		for (size_t i = nd; i < (size_t)decpt; i++)
			strbuf_putc(b, '0');
		strbuf_puts(b, ".0");
	} else {
		strbuf_append(b, digits, (size_t)decpt);
		strbuf_putc(b, '.');
		strbuf_append(b, digits + decpt, nd - (size_t)decpt);
	}
}

/* ---- Numbers jansson cannot hold (issue 17) ----
 * Python's json keeps integers of any size and reads 1e400 as inf; jansson
 * refuses both ("too big integer", "real number overflow"). During a render,
 * such literals (outside strings) are swapped for placeholder strings
 * "\u0000dsv4num\u0000<index>" and read again; the thread-local table below
 * turns them back into the literal (integers) or Python's value (Infinity)
 * when dumped. */
struct chat__bignums {
	char **lit;
	size_t n, cap;
};
static _Thread_local const struct chat__bignums *chat__nums; /* set during a render */
static _Thread_local struct chat__bignums chat__tl_nums;      /* its storage */
#define CHAT_NUM_TAG "\0dsv4num\0"
#define CHAT_NUM_TAG_BYTES 9

static void chat__bignums_free(struct chat__bignums *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->lit[i]);
	free(t->lit);
	t->lit = NULL;
	t->n = t->cap = 0;
}

/* The literal behind a placeholder string, or NULL. */
static const char *chat__bignum(const char *s, size_t n)
{
	if (!chat__nums || n <= CHAT_NUM_TAG_BYTES || memcmp(s, CHAT_NUM_TAG, CHAT_NUM_TAG_BYTES))
		return NULL;
	size_t i = 0;
	for (size_t k = CHAT_NUM_TAG_BYTES; k < n; k++) {
		if (s[k] < '0' || s[k] > '9' || i > chat__nums->n)
			return NULL;
		i = i * 10 + (size_t)(s[k] - '0');
	}
	return i < chat__nums->n ? chat__nums->lit[i] : NULL;
}

/* Copies json with every number literal that overflows int64 / double
 * replaced by a placeholder; NULL when out of memory. */
static char *chat__shield_numbers(const char *json, size_t n, struct chat__bignums *t, size_t *out_len)
{
	struct strbuf o = {0};
	bool in_str = false;
	for (size_t i = 0; i < n;) {
		char c = json[i];
		if (in_str) {
			if (c == '\\' && i + 1 < n) {
				strbuf_append(&o, json + i, 2);
				i += 2;
				continue;
			}
			if (c == '"')
				in_str = false;
			strbuf_putc(&o, c);
			i++;
			continue;
		}
		if (c == '"') {
			in_str = true;
			strbuf_putc(&o, c);
			i++;
			continue;
		}
		if (c != '-' && (c < '0' || c > '9')) {
			strbuf_putc(&o, c);
			i++;
			continue;
		}
		size_t j = i + 1;
		bool real = false;
		while (j < n && ((json[j] >= '0' && json[j] <= '9') || json[j] == '.' || json[j] == 'e' || json[j] == 'E' ||
				 ((json[j] == '+' || json[j] == '-') && (json[j - 1] == 'e' || json[j - 1] == 'E')))) {
			real |= json[j] == '.' || json[j] == 'e' || json[j] == 'E';
			j++;
		}
		char lit[512];
		bool big;
		if (j - i >= sizeof lit) {
			big = true;
		} else {
			memcpy(lit, json + i, j - i);
			lit[j - i] = '\0';
			errno = 0;
			if (real) {
				big = isinf(strtod(lit, NULL));
			} else {
				(void)strtoll(lit, NULL, 10);
				big = errno == ERANGE;
			}
		}
		if (!big) {
			strbuf_append(&o, json + i, j - i);
			i = j;
			continue;
		}
		if (t->n == t->cap) {
			size_t cap = t->cap ? 2 * t->cap : 8;
			char **p = realloc(t->lit, cap * sizeof *p);
			if (!p) {
				free(o.data);
				return NULL;
			}
			t->lit = p;
			t->cap = cap;
		}
		char *keep = malloc(j - i + 1);
		if (!keep) {
			free(o.data);
			return NULL;
		}
		memcpy(keep, json + i, j - i);
		keep[j - i] = '\0';
		char ph[64];
		snprintf(ph, sizeof ph, "\"\\u0000dsv4num\\u0000%zu\"", t->n);
		t->lit[t->n++] = keep;
		strbuf_puts(&o, ph);
		i = j;
	}
	if (o.failed) {
		free(o.data);
		return NULL;
	}
	*out_len = o.len;
	strbuf_append(&o, "", 0);
	return o.data;
}

/* After a json_loadb that failed on a number out of range: load again with
 * such numbers as placeholders (only during a render). */
static json_t *chat__load_shielded(json_t *v, const char *text, size_t len, json_error_t *je)
{
	if (v || !chat__nums || json_error_code(je) != json_error_numeric_overflow)
		return v;
	size_t n = 0;
	char *t = chat__shield_numbers(text, len, &chat__tl_nums, &n);
	if (!t)
		return NULL;
	json_error_t je2;
	v = json_loadb(t, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je2);
	free(t);
	if (!v)
		*je = je2;
	return v;
}

/* A placeholder's value as Python's json.dumps writes it. */
static void py_dump_bignum(struct strbuf *b, const char *lit)
{
	if (strpbrk(lit, ".eE"))
		py_dump_real(b, strtod(lit, NULL)); /* inf: "Infinity" */
	else
		strbuf_puts(b, lit);
}

static void py_dump(struct strbuf *b, const json_t *v)
{
	char tmp[32];
	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		strbuf_putc(b, '{');
		const char *key;
		size_t key_len;
		json_t *val;
		bool first = true;
		json_object_keylen_foreach((json_t *)v, key, key_len, val) {
			if (!first)
				strbuf_puts(b, ", ");
			first = false;
			strbuf_json_string(b, key, key_len);
			strbuf_puts(b, ": ");
			py_dump(b, val);
		}
		strbuf_putc(b, '}');
		break;
	}
	case JSON_ARRAY:
		strbuf_putc(b, '[');
		for (size_t i = 0; i < json_array_size(v); i++) {
			if (i)
				strbuf_puts(b, ", ");
			py_dump(b, json_array_get(v, i));
		}
		strbuf_putc(b, ']');
		break;
	case JSON_STRING: {
		const char *lit = chat__bignum(json_string_value(v), json_string_length(v));
		if (lit)
			py_dump_bignum(b, lit);
		else
			strbuf_json_string(b, json_string_value(v), json_string_length(v));
		break;
	}
	case JSON_INTEGER:
		snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		strbuf_puts(b, tmp);
		break;
	case JSON_REAL:
		py_dump_real(b, json_real_value(v));
		break;
	case JSON_TRUE: strbuf_puts(b, "true"); break;
	case JSON_FALSE: strbuf_puts(b, "false"); break;
	case JSON_NULL: strbuf_puts(b, "null"); break;
	}
}

/* Parse JSON text (any value; \u0000 allowed as Python allows it). */
static enum status json_parse(const char *what, const char *text, size_t len, json_t **out,
			      struct err *e)
{
	json_error_t je;
	*out = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
	*out = chat__load_shielded(*out, text, len, &je);
	if (!*out && json_error_code(&je) == json_error_numeric_overflow)
		return err_set(e, ST_UNSUPPORTED, "%s: number out of range: %s", what, je.text);
	if (!*out)
		return err_set(e, ST_INVALID, "%s: invalid JSON at line %d column %d: %s", what,
			       je.line, je.column, je.text);
	return ST_OK;
}

static enum status chat__pydumps(const char *json, size_t json_len, char **out, size_t *out_len, struct err *e);

/* Runs one render with the big-number table live (see chat__nums). */
#define CHAT_WITH_BIGNUMS(call)                        \
	do {                                           \
		chat__nums = &chat__tl_nums;           \
		enum status st_ = (call);              \
		chat__nums = NULL;                     \
		chat__bignums_free(&chat__tl_nums);    \
		return st_;                            \
	} while (0)

enum status model_chat_json_pydumps(const char *json, size_t json_len, char **out,
				    size_t *out_len, struct err *e)
{
	CHAT_WITH_BIGNUMS(chat__pydumps(json, json_len, out, out_len, e));
}

static enum status chat__pydumps(const char *json, size_t json_len, char **out, size_t *out_len, struct err *e)
{
	json_t *v;
	*out = NULL;
	enum status st = json_parse("json", json, json_len, &v, e);
	if (st)
		return st;
	struct strbuf b = {0};
	py_dump(&b, v);
	json_decref(v);
	strbuf_append(&b, "", 0);
	if (b.failed || !b.data) {
		free(b.data);
		if (b.failed)
			return err_set(e, ST_NOMEM, "json: out of memory");
		b.data = strdup("");
		if (!b.data)
			return err_set(e, ST_NOMEM, "json: out of memory");
	}
	*out = b.data;
	if (out_len)
		*out_len = b.len;
	return ST_OK;
}

/* ---- fixed prompt text ---- */

#define DSML MODEL_CHAT_DSML

static const char effort_max_text[] =
	"Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
	"You MUST be very thorough in your thinking and comprehensively decompose the problem "
	"to resolve the root cause, rigorously stress-testing your logic against all potential "
	"paths, edge cases, and adversarial scenarios.\n"
	"Explicitly write out your entire deliberation process, documenting every intermediate "
	"step, considered alternative, and rejected hypothesis to ensure absolutely no "
	"assumption is left unchecked.\n\n";

static const char tools_head_text[] =
	"## Tools\n\n"
	"You have access to a set of tools to help answer the user's question. You can invoke "
	"tools by writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
	"<" DSML "tool_calls>\n"
	"<" DSML "invoke name=\"$TOOL_NAME\">\n"
	"<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
	"parameter>\n"
	"...\n"
	"</" DSML "invoke>\n"
	"<" DSML "invoke name=\"$TOOL_NAME2\">\n"
	"...\n"
	"</" DSML "invoke>\n"
	"</" DSML "tool_calls>\n\n"
	"String parameters should be specified as is and set `string=\"true\"`. For all other "
	"types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
	"`string=\"false\"`.\n\n"
	"If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
	"reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
	"Otherwise, output directly after </think> with tool calls or final response.\n\n"
	"### Available Tool Schemas\n\n";

static const char tools_tail_text[] =
	"\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
	"tool calls.\n";

static const char response_format_head_text[] =
	"## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* ---- preprocessing: the encoder's merged message list ---- */

enum item_role { IR_SYSTEM, IR_USER, IR_ASSISTANT, IR_DEVELOPER, IR_REMINDER };

/* One block of a merged user turn: user text, or a tool result. */
struct block {
	bool is_tool;
	const char *text;    /* user content or tool result content */
	const char *tool_id; /* tool results: tool_call_id ("" when absent) */
};

struct item {
	enum item_role role;
	const struct model_chat_message *src; /* NULL for the synthetic system */
	struct block *blocks;                 /* user turns */
	size_t n_blocks;
	bool has_tools; /* the system turn that carries tools / response_format */
};

struct enc {
	struct item *items;
	size_t n_items;
	struct block *blocks_mem; /* every user turn's blocks, one allocation */
	const struct model_chat_options *opt;
	char *tools_text;           /* rendered Tools section, or NULL */
	char *response_format_text; /* pydumps of response_format, or NULL */
	struct strbuf out;
	struct err *e;
};

static const char *nz(const char *s) { return s ? s : ""; }

/* Index of tool_id among the last tool-calling assistant's calls (last match
 * wins, as a dict built in order would); 0 when absent, like upstream. */
static size_t call_order(const struct model_chat_message *calls_msg, const char *tool_id)
{
	size_t order = 0;
	for (size_t i = 0; calls_msg && i < calls_msg->n_tool_calls; i++) {
		const char *id = calls_msg->tool_calls[i].id;
		if (id && id[0] && strcmp(id, tool_id) == 0)
			order = i;
	}
	return order;
}

static bool any_call_id(const struct model_chat_message *m)
{
	for (size_t i = 0; m && i < m->n_tool_calls; i++)
		if (m->tool_calls[i].id && m->tool_calls[i].id[0])
			return true;
	return false;
}

/* Stable insertion sort of the tool blocks of one user turn, in place in
 * the tool-block slots (text blocks keep their positions). */
static void sort_tool_blocks(struct item *it, const struct model_chat_message *calls_msg)
{
	size_t n_tool = 0;
	for (size_t i = 0; i < it->n_blocks; i++)
		n_tool += it->blocks[i].is_tool;
	if (n_tool < 2 || !any_call_id(calls_msg))
		return;
	for (size_t i = 1; i < it->n_blocks; i++) {
		if (!it->blocks[i].is_tool)
			continue;
		size_t key = call_order(calls_msg, it->blocks[i].tool_id);
		/* move it left past tool blocks with a larger order */
		size_t j = i;
		for (;;) {
			size_t k = j; /* previous tool slot */
			bool found = false;
			while (k > 0) {
				k--;
				if (it->blocks[k].is_tool) {
					found = true;
					break;
				}
			}
			if (!found || call_order(calls_msg, it->blocks[k].tool_id) <= key)
				break;
			struct block t = it->blocks[k];
			it->blocks[k] = it->blocks[j];
			it->blocks[j] = t;
			j = k;
		}
	}
}

static enum status build_items(struct enc *x, const struct model_chat_message *msgs, size_t n,
			       bool need_system)
{
	/* Upper bounds: one item per message (+1 synthetic system); one block
	 * per user/tool message. */
	x->items = calloc(n + 1, sizeof *x->items);
	struct block *blocks = calloc(n + 1, sizeof *blocks);
	x->blocks_mem = blocks;
	if (!x->items || !blocks)
		return err_set(x->e, ST_NOMEM, "chat: out of memory");
	size_t n_blocks_used = 0;
	if (need_system) {
		x->items[x->n_items++] = (struct item){.role = IR_SYSTEM, .has_tools = true};
	}
	for (size_t i = 0; i < n; i++) {
		const struct model_chat_message *m = &msgs[i];
		struct item *last = x->n_items ? &x->items[x->n_items - 1] : NULL;
		if (m->role == MODEL_CHAT_ROLE_USER || m->role == MODEL_CHAT_ROLE_TOOL) {
			struct block bl = {.is_tool = m->role == MODEL_CHAT_ROLE_TOOL,
					   .text = nz(m->content),
					   .tool_id = nz(m->tool_call_id)};
			if (!(last && last->role == IR_USER)) {
				last = &x->items[x->n_items++];
				*last = (struct item){.role = IR_USER, .src = m,
						      .blocks = blocks + n_blocks_used};
			}
			/* blocks of one turn are contiguous: turns are built in order */
			last->blocks[last->n_blocks++] = bl;
			n_blocks_used++;
			continue;
		}
		enum item_role r;
		switch (m->role) {
		case MODEL_CHAT_ROLE_SYSTEM: r = IR_SYSTEM; break;
		case MODEL_CHAT_ROLE_ASSISTANT: r = IR_ASSISTANT; break;
		case MODEL_CHAT_ROLE_DEVELOPER: r = IR_DEVELOPER; break;
		case MODEL_CHAT_ROLE_LATEST_REMINDER: r = IR_REMINDER; break;
		default:
			return err_set(x->e, ST_INVALID, "chat: message %zu: unknown role %d", i,
				       (int)m->role);
		}
		if (r == IR_DEVELOPER && !(m->content && m->content[0]))
			return err_set(x->e, ST_INVALID,
				       "chat: message %zu: developer message needs content", i);
		x->items[x->n_items++] = (struct item){.role = r, .src = m};
		if (i == 0 && r == IR_SYSTEM && !need_system)
			x->items[x->n_items - 1].has_tools = true;
	}
	/* Tool results follow the order of the latest tool-calling assistant. */
	const struct model_chat_message *calls_msg = NULL;
	for (size_t i = 0; i < x->n_items; i++) {
		struct item *it = &x->items[i];
		if (it->role == IR_ASSISTANT && it->src->n_tool_calls)
			calls_msg = it->src;
		else if (it->role == IR_USER)
			sort_tool_blocks(it, calls_msg);
	}
	return ST_OK;
}

static long last_user_index(const struct item *items, size_t n)
{
	for (size_t i = n; i-- > 0;)
		if (items[i].role == IR_USER || items[i].role == IR_DEVELOPER)
			return (long)i;
	return -1;
}

/* Drop developer turns before the last user turn (history reasoning is
 * dropped at render time). */
static void drop_history(struct enc *x)
{
	long last_user = last_user_index(x->items, x->n_items);
	size_t w = 0;
	for (size_t i = 0; i < x->n_items; i++) {
		if (x->items[i].role == IR_DEVELOPER && (long)i < last_user)
			continue;
		x->items[w++] = x->items[i];
	}
	x->n_items = w;
}

/* ---- rendering ---- */

static enum status put_raw_json_string(struct enc *x, const json_t *s, const char *what)
{
	const char *v = json_string_value(s);
	size_t n = json_string_length(s);
	if (memchr(v, 0, n))
		return err_set(x->e, ST_INVALID, "chat: %s: string with NUL cannot be rendered", what);
	strbuf_append(&x->out, v, n);
	return ST_OK;
}

static enum status render_tool_call(struct enc *x, const struct model_chat_tool_call *tc)
{
	struct strbuf *b = &x->out;
	strbuf_puts(b, "<" DSML "invoke name=\"");
	strbuf_puts(b, nz(tc->name));
	strbuf_puts(b, "\">\n");
	const char *args = nz(tc->arguments_json);
	json_error_t je;
	json_t *obj = json_loadb(args, strlen(args), JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
	obj = chat__load_shielded(obj, args, strlen(args), &je);
	if (!obj && json_error_code(&je) == json_error_numeric_overflow)
		return err_set(x->e, ST_UNSUPPORTED, "chat: tool call %s: arguments: %s", nz(tc->name),
			       je.text);
	if (!obj) {
		/* not JSON: one string parameter named "arguments" */
		strbuf_puts(b, "<" DSML "parameter name=\"arguments\" string=\"true\">");
		strbuf_puts(b, args);
		strbuf_puts(b, "</" DSML "parameter>");
	} else {
		if (!json_is_object(obj)) {
			json_decref(obj);
			return err_set(x->e, ST_INVALID,
				       "chat: tool call %s: arguments must be a JSON object",
				       nz(tc->name));
		}
		const char *key;
		size_t key_len;
		json_t *val;
		bool first = true;
		json_object_keylen_foreach(obj, key, key_len, val) {
			if (!first)
				strbuf_putc(b, '\n');
			first = false;
			if (memchr(key, 0, key_len)) {
				json_decref(obj);
				return err_set(x->e, ST_INVALID,
					       "chat: tool call %s: key with NUL", nz(tc->name));
			}
			strbuf_puts(b, "<" DSML "parameter name=\"");
			strbuf_append(b, key, key_len);
			if (json_is_string(val) && !chat__bignum(json_string_value(val), json_string_length(val))) {
				strbuf_puts(b, "\" string=\"true\">");
				enum status st = put_raw_json_string(x, val, "tool call argument");
				if (st) {
					json_decref(obj);
					return st;
				}
			} else {
				strbuf_puts(b, "\" string=\"false\">");
				py_dump(b, val);
			}
			strbuf_puts(b, "</" DSML "parameter>");
		}
		json_decref(obj);
	}
	strbuf_puts(b, "\n</" DSML "invoke>");
	return ST_OK;
}

static enum status render_assistant(struct enc *x, size_t idx, long last_user, bool drop)
{
	const struct model_chat_message *m = x->items[idx].src;
	struct strbuf *b = &x->out;
	if (x->opt->thinking && (!drop || (long)idx > last_user)) {
		strbuf_puts(b, nz(m->reasoning_content));
		strbuf_puts(b, MODEL_CHAT_THINK_END);
	}
	strbuf_puts(b, nz(m->content));
	if (m->n_tool_calls) {
		strbuf_puts(b, "\n\n<" DSML "tool_calls>\n");
		for (size_t i = 0; i < m->n_tool_calls; i++) {
			if (i)
				strbuf_putc(b, '\n');
			enum status st = render_tool_call(x, &m->tool_calls[i]);
			if (st)
				return st;
		}
		strbuf_puts(b, "\n</" DSML "tool_calls>");
	}
	if (!(x->opt->continue_final && idx + 1 == x->n_items))
		strbuf_puts(b, MODEL_CHAT_EOS);
	return ST_OK;
}

static void render_system_extras(struct enc *x)
{
	if (x->tools_text) {
		strbuf_puts(&x->out, "\n\n");
		strbuf_puts(&x->out, x->tools_text);
	}
	if (x->response_format_text) {
		strbuf_puts(&x->out, "\n\n");
		strbuf_puts(&x->out, response_format_head_text);
		strbuf_puts(&x->out, x->response_format_text);
	}
}

static enum status render_all(struct enc *x, bool drop)
{
	struct strbuf *b = &x->out;
	long last_user = last_user_index(x->items, x->n_items);
	bool thinking = x->opt->thinking;
	for (size_t i = 0; i < x->n_items; i++) {
		const struct item *it = &x->items[i];
		if (i == 0 && thinking && x->opt->effort == MODEL_CHAT_EFFORT_MAX)
			strbuf_puts(b, effort_max_text);
		switch (it->role) {
		case IR_SYSTEM:
			strbuf_puts(b, it->src ? nz(it->src->content) : "");
			if (it->has_tools)
				render_system_extras(x);
			break;
		case IR_DEVELOPER:
			strbuf_puts(b, MODEL_CHAT_USER);
			strbuf_puts(b, it->src->content);
			break;
		case IR_USER:
			strbuf_puts(b, MODEL_CHAT_USER);
			for (size_t k = 0; k < it->n_blocks; k++) {
				if (k)
					strbuf_puts(b, "\n\n");
				if (it->blocks[k].is_tool) {
					strbuf_puts(b, "<tool_result>");
					strbuf_puts(b, it->blocks[k].text);
					strbuf_puts(b, "</tool_result>");
				} else {
					strbuf_puts(b, it->blocks[k].text);
				}
			}
			break;
		case IR_REMINDER:
			strbuf_puts(b, MODEL_CHAT_LATEST_REMINDER);
			strbuf_puts(b, nz(it->src->content));
			break;
		case IR_ASSISTANT: {
			enum status st = render_assistant(x, i, last_user, drop);
			if (st)
				return st;
			break;
		}
		}
		/* The generation prompt follows a user/developer turn that ends the
		 * list or is followed by an assistant or latest_reminder turn. */
		bool next_opens = i + 1 == x->n_items || x->items[i + 1].role == IR_ASSISTANT ||
				  x->items[i + 1].role == IR_REMINDER;
		if (next_opens && (it->role == IR_USER || it->role == IR_DEVELOPER)) {
			strbuf_puts(b, MODEL_CHAT_ASSISTANT);
			bool open = thinking && (!drop || (long)i >= last_user);
			strbuf_puts(b, open ? MODEL_CHAT_THINK_START : MODEL_CHAT_THINK_END);
		}
	}
	return ST_OK;
}

/* Render the Tools section from the OpenAI tools array; *n_tools gets the
 * array length (0 means no tools, like an empty list upstream). */
static enum status prepare_tools(struct enc *x, size_t *n_tools)
{
	*n_tools = 0;
	const char *tj = x->opt->tools_json;
	if (!tj)
		return ST_OK;
	json_t *arr;
	enum status st = json_parse("chat: tools", tj, strlen(tj), &arr, x->e);
	if (st)
		return st;
	if (!json_is_array(arr)) {
		json_decref(arr);
		return err_set(x->e, ST_INVALID, "chat: tools must be a JSON array");
	}
	size_t n = json_array_size(arr);
	if (n == 0) {
		json_decref(arr);
		return ST_OK;
	}
	struct strbuf t = {0};
	strbuf_puts(&t, tools_head_text);
	for (size_t i = 0; i < n; i++) {
		json_t *fn = json_object_get(json_array_get(arr, i), "function");
		if (!fn) {
			free(t.data);
			json_decref(arr);
			return err_set(x->e, ST_INVALID, "chat: tools[%zu]: missing \"function\"", i);
		}
		if (i)
			strbuf_putc(&t, '\n');
		py_dump(&t, fn);
	}
	strbuf_puts(&t, tools_tail_text);
	json_decref(arr);
	if (t.failed) {
		free(t.data);
		return err_set(x->e, ST_NOMEM, "chat: out of memory");
	}
	x->tools_text = t.data;
	*n_tools = n;
	return ST_OK;
}

static enum status chat__encode(const struct model_chat_message *messages, size_t n_messages,
				const struct model_chat_options *opt, char **out_prompt, size_t *out_len,
				struct err *e);

enum status model_chat_encode(const struct model_chat_message *messages, size_t n_messages,
			      const struct model_chat_options *opt, char **out_prompt,
			      size_t *out_len, struct err *e)
{
	CHAT_WITH_BIGNUMS(chat__encode(messages, n_messages, opt, out_prompt, out_len, e));
}

static enum status chat__encode(const struct model_chat_message *messages, size_t n_messages,
				const struct model_chat_options *opt, char **out_prompt, size_t *out_len,
				struct err *e)
{
	static const struct model_chat_options defaults;
	struct enc x = {.opt = opt ? opt : &defaults, .e = e};
	enum status st;
	size_t n_tools = 0;
	*out_prompt = NULL;
	if (out_len)
		*out_len = 0;
	if (n_messages && !messages)
		return err_set(e, ST_INVALID, "chat: messages is NULL");

	st = prepare_tools(&x, &n_tools);
	if (st)
		goto done;
	if (x.opt->response_format_json) {
		const char *rf = x.opt->response_format_json;
		json_t *v;
		st = json_parse("chat: response_format", rf, strlen(rf), &v, e);
		if (st)
			goto done;
		/* upstream skips a falsy response_format ({} [] "" 0 false null) */
		bool falsy = json_is_null(v) || json_is_false(v) ||
			     (json_is_object(v) && json_object_size(v) == 0) ||
			     (json_is_array(v) && json_array_size(v) == 0) ||
			     (json_is_string(v) && json_string_length(v) == 0) ||
			     (json_is_integer(v) && json_integer_value(v) == 0) ||
			     (json_is_real(v) && json_real_value(v) == 0);
		if (!falsy) {
			struct strbuf t = {0};
			py_dump(&t, v);
			if (t.failed) {
				free(t.data);
				json_decref(v);
				st = err_set(e, ST_NOMEM, "chat: out of memory");
				goto done;
			}
			x.response_format_text = t.data;
		}
		json_decref(v);
	}
	bool extras = x.tools_text || x.response_format_text;
	bool need_system = extras && !(n_messages && messages[0].role == MODEL_CHAT_ROLE_SYSTEM);
	st = build_items(&x, messages, n_messages, need_system);
	if (st)
		goto done;

	bool drop = !x.opt->keep_thinking && n_tools == 0;
	if (x.opt->thinking && drop)
		drop_history(&x);
	if (!x.opt->no_bos)
		strbuf_puts(&x.out, MODEL_CHAT_BOS);
	st = render_all(&x, drop);
	if (st)
		goto done;
	strbuf_append(&x.out, "", 0);
	if (x.out.failed) {
		st = err_set(e, ST_NOMEM, "chat: out of memory");
		goto done;
	}
	if (!x.out.data) {
		x.out.data = strdup("");
		if (!x.out.data) {
			st = err_set(e, ST_NOMEM, "chat: out of memory");
			goto done;
		}
	}
	*out_prompt = x.out.data;
	if (out_len)
		*out_len = x.out.len;
	x.out.data = NULL;
done:
	free(x.out.data);
	free(x.items);
	free(x.blocks_mem);
	free(x.tools_text);
	free(x.response_format_text);
	return st;
}
