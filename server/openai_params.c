/*
 * server/openai_params.c: parses and validates /v1/chat/completions,
 * /v1/completions, /tokenize and /detokenize bodies (jansson) into the
 * plain structs of openai_params.h.
 *
 * Every top-level key is looked up in one table: a known key is checked for
 * type and range; a key in the "ignored" list (client bookkeeping with no
 * effect here) is skipped; anything else is a 400 naming it, so a client
 * never gets behaviour it did not ask for (style.md rule 5). The json_t tree
 * is freed before returning; strings are copied into the request's arena.
 */
#include "openai_params.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/limits.h"

/* ---- arena: a list of individually malloc'd blocks, freed together ---- */

struct oai_arena {
	struct arena_blk {
		struct arena_blk *next;
		max_align_t align[];
	} *head;
};

static void *ar_alloc(struct oai_arena *a, size_t n)
{
	struct arena_blk *b = malloc(sizeof *b + (n ? n : 1));
	if (!b)
		return NULL;
	b->next = a->head;
	a->head = b;
	return b->align;
}

static char *ar_strndup(struct oai_arena *a, const char *s, size_t n)
{
	char *p = ar_alloc(a, n + 1);
	if (p) {
		memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

static void ar_free(struct oai_arena *a)
{
	if (!a)
		return;
	while (a->head) {
		struct arena_blk *b = a->head;
		a->head = b->next;
		free(b);
	}
	free(a);
}

/* ---- errors ---- */

static enum status fail(struct oai_error *why, enum status st, const char *param, const char *fmt, ...)
	DSV4_PRINTF(4, 5);
/* fail() with OpenAI's error code given (fail derives it from st). */
#define FAILC(why, code_, ...) (fail(why, __VA_ARGS__), (why)->code = (code_), ST_INVALID)
static enum status fail(struct oai_error *why, enum status st, const char *param, const char *fmt, ...)
{
	why->status = st == ST_NOMEM ? 500 : 400;
	why->code = st == ST_NOMEM ? NULL : st == ST_UNSUPPORTED ? "unsupported_value" : "invalid_value";
	snprintf(why->param, sizeof why->param, "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why->message, sizeof why->message, fmt, ap);
	va_end(ap);
	return st;
}

#define NOMEM(why) fail(why, ST_NOMEM, "", "out of memory")

/* ---- typed getters; JSON null counts as absent (the caller skips it) ---- */

static enum status get_bool(json_t *v, const char *name, bool *out, struct oai_error *why)
{
	if (!json_is_boolean(v))
		return FAILC(why, "invalid_type", ST_INVALID, name, "'%s' must be a boolean", name);
	*out = json_is_true(v);
	return ST_OK;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static enum status get_num_in(json_t *v, const char *name, double lo, bool lo_open, double hi, double *out,
			      struct oai_error *why)
{
	if (!json_is_number(v))
		return FAILC(why, "invalid_type", ST_INVALID, name, "'%s' must be a number", name);
	double d = json_number_value(v);
	if (!isfinite(d) || d < lo || (lo_open && d <= lo) || d > hi)
		return fail(why, ST_INVALID, name, "'%s' must be in %c%g, %g], got %g", name, lo_open ? '(' : '[', lo,
			    hi, d);
	*out = d;
	return ST_OK;
}

static enum status get_num(json_t *v, const char *name, double lo, double hi, double *out, struct oai_error *why)
{
	return get_num_in(v, name, lo, false, hi, out, why);
}

static enum status get_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
			   struct oai_error *why)
{
	if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
	    fabs(json_real_value(v)) < 9e15) {
		*out = (long long)json_real_value(v); /* 1.0 from clients that only have doubles */
	} else if (json_is_integer(v)) {
		*out = json_integer_value(v);
	} else {
		return FAILC(why, "invalid_type", ST_INVALID, name, "'%s' must be an integer", name);
	}
	if (*out < lo || *out > hi)
		return fail(why, ST_INVALID, name, "'%s' must be in [%lld, %lld], got %lld", name, lo, hi, *out);
	return ST_OK;
}

static enum status get_str(struct oai_arena *a, json_t *v, const char *name, const char **out, size_t *len,
			   bool allow_nul, struct oai_error *why)
{
	if (!json_is_string(v))
		return FAILC(why, "invalid_type", ST_INVALID, name, "'%s' must be a string", name);
	size_t n = json_string_length(v);
	const char *s = json_string_value(v);
	if (!allow_nul && strlen(s) != n)
		return fail(why, ST_INVALID, name, "'%s' must not contain NUL characters", name);
	char *c = ar_strndup(a, s, n);
	if (!c)
		return NOMEM(why);
	*out = c;
	if (len)
		*len = n;
	return ST_OK;
}

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h ? h : 1;
}

/* ---- shared fields ---- */

static enum status parse_stop(struct oai_request *r, json_t *v, struct oai_error *why)
{
	json_t *one = NULL;
	size_t n = 1;
	if (json_is_string(v)) {
		one = v;
	} else if (json_is_array(v)) {
		n = json_array_size(v);
	} else {
		return fail(why, ST_INVALID, "stop", "'stop' must be a string or an array of strings");
	}
	if (n > SCHED_MAX_STOP_STRINGS)
		return fail(why, ST_INVALID, "stop", "at most %d stop strings, got %zu", SCHED_MAX_STOP_STRINGS, n);
	const char **s = ar_alloc(r->arena, (n ? n : 1) * sizeof *s);
	if (!s)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *e = one ? one : json_array_get(v, i);
		size_t len;
		if (get_str(r->arena, e, "stop", &s[i], &len, false, why))
			return ST_INVALID;
		if (len == 0 || len > SCHED_MAX_STOP_STRING_BYTES)
			return fail(why, ST_INVALID, "stop", "each stop string must have 1..%d bytes",
				    SCHED_MAX_STOP_STRING_BYTES);
	}
	r->stop = s;
	r->n_stop = (uint32_t)n;
	return ST_OK;
}

static enum status parse_ids(struct oai_arena *a, json_t *v, const char *name, uint32_t max, int32_t vocab,
			     int32_t **out, uint32_t *n_out, struct oai_error *why)
{
	if (!json_is_array(v))
		return fail(why, ST_INVALID, name, "'%s' must be an array of token ids", name);
	size_t n = json_array_size(v);
	if (n > max)
		return fail(why, ST_INVALID, name, "'%s' has %zu entries, at most %u allowed", name, n, max);
	int32_t *ids = ar_alloc(a, (n ? n : 1) * sizeof *ids);
	if (!ids)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		long long x = 0; /* -O3: gcc cannot see get_int set it on success */
		if (get_int(json_array_get(v, i), name, 0, vocab - 1, &x, why))
			return ST_INVALID;
		ids[i] = (int32_t)x;
	}
	*out = ids;
	*n_out = (uint32_t)n;
	return ST_OK;
}

static enum status parse_logit_bias(struct oai_request *r, json_t *v, int32_t vocab, struct oai_error *why)
{
	if (!json_is_object(v))
		return fail(why, ST_INVALID, "logit_bias", "'logit_bias' must be an object {\"token_id\": bias}");
	size_t n = json_object_size(v);
	if (n > SCHED_MAX_LOGIT_BIAS)
		return fail(why, ST_INVALID, "logit_bias", "at most %d logit_bias entries, got %zu",
			    SCHED_MAX_LOGIT_BIAS, n);
	struct kern_logit_bias *b = ar_alloc(r->arena, (n ? n : 1) * sizeof *b);
	if (!b)
		return NOMEM(why);
	const char *k;
	json_t *x;
	size_t i = 0;
	json_object_foreach(v, k, x) {
		char *end = NULL;
		long id = strtol(k, &end, 10);
		if (!k[0] || *end || id < 0 || id >= vocab)
			return fail(why, ST_INVALID, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)",
				    k, vocab);
		double d = 0; /* -O3: see above */
		if (get_num(x, "logit_bias", -100, 100, &d, why))
			return ST_INVALID;
		b[i].token_id = (int32_t)id;
		b[i].bias = (float)d;
		i++;
	}
	r->sampling.logit_bias = b;
	r->sampling.n_logit_bias = (uint32_t)n;
	return ST_OK;
}

/* ---- chat messages ---- */

/* Text of content: a string, null, or an array of {"type":"text","text":...} parts joined with "\n". */
static enum status parse_content(struct oai_arena *a, json_t *v, const char **out, struct oai_error *why)
{
	if (!v || json_is_null(v)) {
		*out = NULL;
		return ST_OK;
	}
	if (json_is_string(v))
		return get_str(a, v, "messages.content", out, NULL, false, why);
	if (!json_is_array(v))
		return fail(why, ST_INVALID, "messages.content", "message content must be a string or an array of parts");
	size_t n = json_array_size(v), total = 0;
	if (n > OAI_MAX_CONTENT_PARTS)
		return fail(why, ST_INVALID, "messages.content", "at most %d content parts", OAI_MAX_CONTENT_PARTS);
	for (size_t i = 0; i < n; i++) {
		json_t *p = json_array_get(v, i);
		const char *type = json_string_value(json_object_get(p, "type"));
		if (!json_is_object(p) || !type)
			return fail(why, ST_INVALID, "messages.content", "each content part must be an object with a type");
		if (strcmp(type, "text") && strcmp(type, "input_text"))
			return fail(why, ST_UNSUPPORTED, "messages.content",
				    "content part type '%.40s' is not supported (this model takes text only)", type);
		json_t *t = json_object_get(p, "text");
		if (!json_is_string(t) || strlen(json_string_value(t)) != json_string_length(t))
			return fail(why, ST_INVALID, "messages.content", "a text part needs a string 'text'");
		total += json_string_length(t) + 1;
	}
	char *s = ar_alloc(a, total + 1), *w = s;
	if (!s)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_object_get(json_array_get(v, i), "text");
		if (i)
			*w++ = '\n';
		memcpy(w, json_string_value(t), json_string_length(t));
		w += json_string_length(t);
	}
	*w = '\0';
	*out = s;
	return ST_OK;
}

static enum status parse_tool_calls(struct oai_arena *a, json_t *v, struct model_chat_message *m,
				    struct oai_error *why)
{
	if (json_is_null(v))
		return ST_OK;
	if (!json_is_array(v))
		return fail(why, ST_INVALID, "messages.tool_calls", "'tool_calls' must be an array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_TOOL_CALLS)
		return fail(why, ST_INVALID, "messages.tool_calls", "at most %d tool calls per message",
			    OAI_MAX_TOOL_CALLS);
	struct model_chat_tool_call *tc = ar_alloc(a, (n ? n : 1) * sizeof *tc);
	if (!tc)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *c = json_array_get(v, i), *f = json_object_get(c, "function");
		memset(&tc[i], 0, sizeof tc[i]);
		const char *type = json_string_value(json_object_get(c, "type"));
		if (!json_is_object(c) || !json_is_object(f) || (type && strcmp(type, "function")))
			return fail(why, ST_INVALID, "messages.tool_calls",
				    "each tool call must be {\"type\":\"function\",\"function\":{...}}");
		json_t *id = json_object_get(c, "id"), *name = json_object_get(f, "name"),
		       *args = json_object_get(f, "arguments");
		if (id && !json_is_null(id) && get_str(a, id, "messages.tool_calls.id", &tc[i].id, NULL, false, why))
			return ST_INVALID;
		if (get_str(a, name, "messages.tool_calls.function.name", &tc[i].name, NULL, false, why))
			return ST_INVALID;
		if (json_is_string(args)) {
			if (get_str(a, args, "messages.tool_calls.function.arguments", &tc[i].arguments_json, NULL,
				    false, why))
				return ST_INVALID;
		} else if (json_is_object(args)) { /* some clients send the object itself */
			char *s = json_dumps(args, JSON_COMPACT);
			if (!s)
				return NOMEM(why);
			tc[i].arguments_json = ar_strndup(a, s, strlen(s));
			free(s);
			if (!tc[i].arguments_json)
				return NOMEM(why);
		} else if (args && !json_is_null(args)) {
			return fail(why, ST_INVALID, "messages.tool_calls.function.arguments",
				    "tool call arguments must be a JSON string");
		} else {
			tc[i].arguments_json = "{}";
		}
	}
	m->tool_calls = tc;
	m->n_tool_calls = n;
	return ST_OK;
}

static enum status parse_messages(struct oai_request *r, json_t *v, struct oai_error *why)
{
	if (!json_is_array(v) || json_array_size(v) == 0)
		return fail(why, ST_INVALID, "messages", "'messages' must be a non-empty array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_MESSAGES)
		return fail(why, ST_INVALID, "messages", "at most %d messages, got %zu", OAI_MAX_MESSAGES, n);
	struct model_chat_message *ms = ar_alloc(r->arena, n * sizeof *ms);
	if (!ms)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(v, i);
		struct model_chat_message *o = &ms[i];
		memset(o, 0, sizeof *o);
		if (!json_is_object(m))
			return fail(why, ST_INVALID, "messages", "messages[%zu] must be an object", i);
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!role)
			return fail(why, ST_INVALID, "messages.role", "messages[%zu] needs a string 'role'", i);
		if (!strcmp(role, "system") || !strcmp(role, "developer"))
			o->role = MODEL_CHAT_ROLE_SYSTEM;
		else if (!strcmp(role, "user"))
			o->role = MODEL_CHAT_ROLE_USER;
		else if (!strcmp(role, "assistant"))
			o->role = MODEL_CHAT_ROLE_ASSISTANT;
		else if (!strcmp(role, "tool"))
			o->role = MODEL_CHAT_ROLE_TOOL;
		else if (!strcmp(role, "latest_reminder"))
			o->role = MODEL_CHAT_ROLE_LATEST_REMINDER;
		else
			return fail(why, ST_INVALID, "messages.role",
				    "messages[%zu]: role '%.40s' is not one of system, developer, user, assistant, tool",
				    i, role);
		if (parse_content(r->arena, json_object_get(m, "content"), &o->content, why))
			return why->status == 500 ? ST_NOMEM : ST_INVALID;
		if (o->role == MODEL_CHAT_ROLE_ASSISTANT) {
			json_t *rc = json_object_get(m, "reasoning_content");
			if (!rc || json_is_null(rc))
				rc = json_object_get(m, "reasoning");
			if (rc && !json_is_null(rc) &&
			    get_str(r->arena, rc, "messages.reasoning_content", &o->reasoning_content, NULL, false, why))
				return ST_INVALID;
			json_t *tc = json_object_get(m, "tool_calls");
			if (tc && parse_tool_calls(r->arena, tc, o, why))
				return ST_INVALID;
			if (!o->content && !o->n_tool_calls && !(i == n - 1 && r->continue_final))
				o->content = "";
		} else if (!o->content) {
			return fail(why, ST_INVALID, "messages.content", "messages[%zu] (%s) needs 'content'", i, role);
		}
		if (o->role == MODEL_CHAT_ROLE_TOOL) {
			json_t *id = json_object_get(m, "tool_call_id");
			if (id && !json_is_null(id) &&
			    get_str(r->arena, id, "messages.tool_call_id", &o->tool_call_id, NULL, false, why))
				return ST_INVALID;
		}
		json_t *name = json_object_get(m, "name");
		if (name && json_is_string(name) &&
		    get_str(r->arena, name, "messages.name", &o->name, NULL, false, why))
			return ST_INVALID;
	}
	r->messages = ms;
	r->n_messages = n;
	return ST_OK;
}

static enum status parse_tools(struct oai_request *r, json_t *v, struct oai_error *why)
{
	if (!json_is_array(v))
		return fail(why, ST_INVALID, "tools", "'tools' must be an array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_TOOLS)
		return fail(why, ST_INVALID, "tools", "at most %d tools, got %zu", OAI_MAX_TOOLS, n);
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(v, i), *f = json_object_get(t, "function");
		const char *type = json_string_value(json_object_get(t, "type"));
		if (!json_is_object(t) || !type || strcmp(type, "function"))
			return fail(why, ST_UNSUPPORTED, "tools", "tools[%zu]: only {\"type\": \"function\"} tools are supported", i);
		if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
			return fail(why, ST_INVALID, "tools", "tools[%zu].function needs a string 'name'", i);
		json_t *p = json_object_get(f, "parameters");
		if (p && !json_is_object(p) && !json_is_null(p))
			return fail(why, ST_INVALID, "tools", "tools[%zu].function.parameters must be an object", i);
	}
	if (n == 0)
		return ST_OK;
	char *s = json_dumps(v, JSON_COMPACT);
	if (!s)
		return NOMEM(why);
	r->tools_json = ar_strndup(r->arena, s, strlen(s));
	free(s);
	if (!r->tools_json)
		return NOMEM(why);
	r->n_tools = n;
	return ST_OK;
}

static enum status parse_tool_choice(struct oai_request *r, json_t *v, struct oai_error *why)
{
	const char *s = json_string_value(v);
	if (s && !strcmp(s, "auto")) {
		r->tool_choice = OAI_TOOL_AUTO;
		return ST_OK;
	}
	if (s && !strcmp(s, "none")) {
		r->tool_choice = OAI_TOOL_NONE;
		return ST_OK;
	}
	if (s && !strcmp(s, "required")) {
		r->tool_choice = OAI_TOOL_REQUIRED;
		return ST_OK;
	}
	const char *name = json_string_value(json_object_get(json_object_get(v, "function"), "name"));
	const char *type = json_string_value(json_object_get(v, "type"));
	if (json_is_object(v)) {
		if (!name || (type && strcmp(type, "function")))
			return fail(why, ST_INVALID, "tool_choice",
				    "a tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
		r->tool_choice = OAI_TOOL_NAMED;
		r->tool_choice_name = ar_strndup(r->arena, name, strlen(name));
		return r->tool_choice_name ? ST_OK : NOMEM(why);
	}
	return fail(why, ST_INVALID, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object");
}

static enum status parse_template_kwargs(struct oai_request *r, json_t *v, bool *thinking_set,
					 struct oai_error *why)
{
	if (!json_is_object(v))
		return fail(why, ST_INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
	const char *k;
	json_t *x;
	json_object_foreach(v, k, x) {
		if (!strcmp(k, "thinking") || !strcmp(k, "enable_thinking")) {
			if (get_bool(x, "chat_template_kwargs.thinking", &r->thinking, why))
				return ST_INVALID;
			*thinking_set = true;
		} else {
			return fail(why, ST_UNSUPPORTED, "chat_template_kwargs",
				    "chat_template_kwargs.%.40s is not supported (known: thinking, enable_thinking)", k);
		}
	}
	return ST_OK;
}

/* Structured outputs: response_format, guided_json, guided_choice, structured_outputs. */
static enum status parse_format(struct oai_request *r, const char *param, json_t *v, struct oai_error *why)
{
	json_t *schema = NULL, *choice = NULL;
	if (!strcmp(param, "response_format")) {
		const char *t = json_string_value(json_object_get(v, "type"));
		if (!json_is_object(v) || !t)
			return fail(why, ST_INVALID, param, "'response_format' must be {\"type\": ...}");
		if (!strcmp(t, "text"))
			return ST_OK;
		if (!strcmp(t, "json_object")) {
			r->format = OAI_FORMAT_JSON_OBJECT;
		} else if (!strcmp(t, "json_schema")) {
			schema = json_object_get(json_object_get(v, "json_schema"), "schema");
			if (!json_is_object(schema) && !json_is_boolean(schema))
				return fail(why, ST_INVALID, param, "response_format json_schema needs json_schema.schema");
		} else {
			return fail(why, ST_UNSUPPORTED, param,
				    "response_format type '%.40s' is not supported; \"text\", \"json_object\" or \"json_schema\"", t);
		}
		char *d = json_dumps(v, JSON_COMPACT);
		r->response_format_json = d ? ar_strndup(r->arena, d, strlen(d)) : NULL;
		free(d);
		if (!r->response_format_json)
			return NOMEM(why);
	} else if (!strcmp(param, "guided_json")) {
		schema = v;
	} else if (!strcmp(param, "guided_choice")) {
		choice = v;
	} else { /* structured_outputs */
		schema = json_object_get(v, "json");
		choice = json_object_get(v, "choice");
		if (!json_is_object(v) || (!schema && !choice) || json_object_size(v) != 1)
			return fail(why, ST_UNSUPPORTED, param, "structured_outputs supports one of 'json' and 'choice'");
	}
	if (json_is_string(schema)) { /* vLLM accepts the schema as a string too */
		json_t *p = json_loads(json_string_value(schema), 0, NULL);
		char *d = p ? json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		json_decref(p);
		r->format_schema = d ? ar_strndup(r->arena, d, strlen(d)) : NULL;
		free(d);
		if (!r->format_schema)
			return fail(why, ST_INVALID, param, "the schema string is not JSON");
		r->format = OAI_FORMAT_JSON_SCHEMA;
	} else if (schema) {
		char *d = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
		r->format_schema = d ? ar_strndup(r->arena, d, strlen(d)) : NULL;
		free(d);
		if (!r->format_schema)
			return NOMEM(why);
		r->format = OAI_FORMAT_JSON_SCHEMA;
	}
	if (choice) {
		size_t n = json_is_array(choice) ? json_array_size(choice) : 0;
		if (!n || n > 4096)
			return fail(why, ST_INVALID, param, "the choice list must be an array of 1..4096 strings");
		const char **c = ar_alloc(r->arena, n * sizeof *c);
		if (!c)
			return NOMEM(why);
		for (size_t i = 0; i < n; i++) {
			json_t *x = json_array_get(choice, i);
			if (!json_is_string(x))
				return fail(why, ST_INVALID, param, "the choice list must be an array of 1..4096 strings");
			if (!(c[i] = ar_strndup(r->arena, json_string_value(x), json_string_length(x))))
				return NOMEM(why);
		}
		r->format_choices = c;
		r->n_format_choices = (uint32_t)n;
		r->format = OAI_FORMAT_CHOICE;
	}
	return ST_OK;
}

/* ---- the key table ---- */

enum key {
	K_IGNORED = 0, K_MODEL, K_STREAM, K_STREAM_OPTIONS, K_N, K_MAX_TOKENS, K_MAX_COMPLETION_TOKENS,
	K_TEMPERATURE, K_TOP_P, K_TOP_K, K_MIN_P, K_SEED, K_PRESENCE, K_FREQUENCY, K_REPETITION, K_LOGIT_BIAS,
	K_STOP, K_STOP_TOKEN_IDS, K_IGNORE_EOS, K_LOGPROBS, K_TOP_LOGPROBS, K_PRIORITY, K_CACHE_SALT,
	K_MIN_TOKENS, K_INCLUDE_STOP, K_SKIP_SPECIAL, K_SPACES_SPECIAL, K_PARALLEL_TOOL_CALLS, K_RESPONSE_FORMAT,
	K_PROMPT_LOGPROBS, /* evaluation */
	K_FORMAT, /* structured outputs: guided_json, guided_choice, structured_outputs */
	/* chat */
	K_MESSAGES, K_TOOLS, K_TOOL_CHOICE, K_TEMPLATE_KWARGS, K_REASONING_EFFORT, K_THINKING,
	K_INCLUDE_REASONING, K_ADD_GENERATION_PROMPT, K_CONTINUE_FINAL, K_MODALITIES,
	/* completions */
	K_PROMPT, K_ECHO, K_SUFFIX, K_BEST_OF,
	/* tokenize */
	K_ADD_SPECIAL, K_RETURN_TOKEN_STRS,
};

#define F_CHAT 1
#define F_COMPL 2
#define F_TOKENIZE 4
#define F_GEN (F_CHAT | F_COMPL)

static const struct key_def {
	const char *name;
	enum key key;
	unsigned where;
} key_defs[] = {
	{"model", K_MODEL, F_GEN | F_TOKENIZE},
	{"stream", K_STREAM, F_GEN},
	{"stream_options", K_STREAM_OPTIONS, F_GEN},
	{"n", K_N, F_GEN},
	{"max_tokens", K_MAX_TOKENS, F_GEN},
	{"max_completion_tokens", K_MAX_COMPLETION_TOKENS, F_CHAT},
	{"temperature", K_TEMPERATURE, F_GEN},
	{"top_p", K_TOP_P, F_GEN},
	{"top_k", K_TOP_K, F_GEN},
	{"min_p", K_MIN_P, F_GEN},
	{"seed", K_SEED, F_GEN},
	{"presence_penalty", K_PRESENCE, F_GEN},
	{"frequency_penalty", K_FREQUENCY, F_GEN},
	{"repetition_penalty", K_REPETITION, F_GEN},
	{"logit_bias", K_LOGIT_BIAS, F_GEN},
	{"stop", K_STOP, F_GEN},
	{"stop_token_ids", K_STOP_TOKEN_IDS, F_GEN},
	{"ignore_eos", K_IGNORE_EOS, F_GEN},
	{"logprobs", K_LOGPROBS, F_GEN},
	{"prompt_logprobs", K_PROMPT_LOGPROBS, F_GEN},
	{"top_logprobs", K_TOP_LOGPROBS, F_CHAT},
	{"priority", K_PRIORITY, F_GEN},
	{"cache_salt", K_CACHE_SALT, F_GEN},
	{"min_tokens", K_MIN_TOKENS, F_GEN},
	{"include_stop_str_in_output", K_INCLUDE_STOP, F_GEN},
	{"skip_special_tokens", K_SKIP_SPECIAL, F_GEN},
	{"spaces_between_special_tokens", K_SPACES_SPECIAL, F_GEN},
	{"parallel_tool_calls", K_PARALLEL_TOOL_CALLS, F_CHAT},
	{"response_format", K_RESPONSE_FORMAT, F_GEN},
	{"guided_json", K_FORMAT, F_GEN},
	{"guided_choice", K_FORMAT, F_GEN},
	{"structured_outputs", K_FORMAT, F_GEN},
	{"messages", K_MESSAGES, F_CHAT | F_TOKENIZE},
	{"tools", K_TOOLS, F_CHAT | F_TOKENIZE},
	{"tool_choice", K_TOOL_CHOICE, F_CHAT | F_TOKENIZE},
	{"chat_template_kwargs", K_TEMPLATE_KWARGS, F_CHAT | F_TOKENIZE},
	{"reasoning_effort", K_REASONING_EFFORT, F_CHAT | F_TOKENIZE},
	{"thinking", K_THINKING, F_CHAT | F_TOKENIZE},
	{"include_reasoning", K_INCLUDE_REASONING, F_CHAT},
	{"add_generation_prompt", K_ADD_GENERATION_PROMPT, F_CHAT | F_TOKENIZE},
	{"continue_final_message", K_CONTINUE_FINAL, F_CHAT | F_TOKENIZE},
	{"modalities", K_MODALITIES, F_CHAT},
	{"prompt", K_PROMPT, F_COMPL | F_TOKENIZE},
	{"echo", K_ECHO, F_COMPL},
	{"suffix", K_SUFFIX, F_COMPL},
	{"best_of", K_BEST_OF, F_COMPL},
	{"add_special_tokens", K_ADD_SPECIAL, F_GEN | F_TOKENIZE},
	{"return_token_strs", K_RETURN_TOKEN_STRS, F_TOKENIZE},
	/* Client bookkeeping that changes nothing for one local model (docs/api.md). */
	{"user", K_IGNORED, F_GEN | F_TOKENIZE},
	{"metadata", K_IGNORED, F_GEN},
	{"store", K_IGNORED, F_GEN},
	{"service_tier", K_IGNORED, F_GEN},
	{"request_id", K_IGNORED, F_GEN},
	{"safety_identifier", K_IGNORED, F_GEN},
	{"prompt_cache_key", K_IGNORED, F_GEN},
};

static const struct key_def *find_key(const char *name, unsigned where)
{
	for (size_t i = 0; i < sizeof key_defs / sizeof key_defs[0]; i++)
		if (!strcmp(key_defs[i].name, name) && (key_defs[i].where & where))
			return &key_defs[i];
	return NULL;
}

static enum status parse_prompt(struct oai_request *r, json_t *v, int32_t vocab, struct oai_error *why)
{
	/* string | [int] | [string] | [[int]] */
	size_t n = 1;
	bool list = false;
	if (json_is_array(v) && json_array_size(v) && !json_is_integer(json_array_get(v, 0))) {
		list = true;
		n = json_array_size(v);
	} else if (!json_is_string(v) && !json_is_array(v)) {
		return fail(why, ST_INVALID, "prompt", "'prompt' must be a string, an array of token ids, or an array of those");
	}
	if (n > OAI_MAX_PROMPTS)
		return fail(why, ST_INVALID, "prompt", "at most %d prompts per request, got %zu", OAI_MAX_PROMPTS, n);
	struct oai_prompt *ps = ar_alloc(r->arena, n * sizeof *ps);
	if (!ps)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *p = list ? json_array_get(v, i) : v;
		memset(&ps[i], 0, sizeof ps[i]);
		if (json_is_string(p)) {
			if (get_str(r->arena, p, "prompt", &ps[i].text, &ps[i].text_len, true, why))
				return ST_INVALID;
		} else if (json_is_array(p)) {
			int32_t *ids;
			if (parse_ids(r->arena, p, "prompt", OAI_MAX_PROMPT_IDS, vocab, &ids, &ps[i].n_ids, why))
				return why->status == 500 ? ST_NOMEM : ST_INVALID;
			if (!ps[i].n_ids)
				return fail(why, ST_INVALID, "prompt", "a token-id prompt must not be empty");
			ps[i].ids = ids;
		} else {
			return fail(why, ST_INVALID, "prompt", "each prompt must be a string or an array of token ids");
		}
	}
	r->prompts = ps;
	r->n_prompts = (uint32_t)n;
	return ST_OK;
}

static enum status reasoning_effort(struct oai_request *r, const char *s, struct oai_error *why)
{
	if (!strcmp(s, "none")) {
		r->thinking = false;
	} else if (!strcmp(s, "minimal") || !strcmp(s, "low") || !strcmp(s, "medium") || !strcmp(s, "high")) {
		r->thinking = true;
		r->effort = MODEL_CHAT_EFFORT_HIGH;
	} else if (!strcmp(s, "xhigh") || !strcmp(s, "max")) {
		r->thinking = true;
		r->effort = MODEL_CHAT_EFFORT_MAX;
	} else {
		return fail(why, ST_INVALID, "reasoning_effort",
			    "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max");
	}
	return ST_OK;
}

/* ---- hardening: a bound on what parsing one body may allocate ---- */
/* True when body holds more than OAI_MAX_JSON_VALUES values (counted as
 * separators and openings outside strings; an upper bound, cheap). */
static bool too_many_values(const char *body, size_t len)
{
	size_t n = 1;
	bool in_str = false;
	for (size_t i = 0; i < len; i++) {
		char c = body[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (c == ',' || c == '[' || c == '{') {
			if (++n > OAI_MAX_JSON_VALUES)
				return true;
		}
	}
	return false;
}

/* The shared parser. where: F_CHAT, F_COMPL or F_TOKENIZE (then tok is filled too). */
static enum status parse_body(unsigned where, const char *body, size_t len, int32_t vocab, struct oai_request *r,
			      struct oai_tokenize_request *tok, struct oai_error *why)
{
	memset(why, 0, sizeof *why);
	if (too_many_values(body, len))
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body holds more than %u JSON values", OAI_MAX_JSON_VALUES);
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
	if (!root)
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body is not valid JSON: %s (line %d, column %d)", je.text,
			    je.line, je.column);
	enum status st = ST_OK;
	if (!json_is_object(root)) {
		st = FAILC(why, "invalid_json", ST_INVALID, "", "request body must be a JSON object");
		goto out;
	}
	/* Defaults (OpenAI's). */
	r->n = 1;
	r->sampling.temperature = 1.0f;
	r->sampling.top_p = 1.0f;
	r->sampling.repetition_penalty = 1.0f;
	r->skip_special_tokens = true;
	r->include_reasoning = true;
	json_t *max_completion = NULL, *reasoning = NULL, *messages = NULL, *top_lp = NULL, *lp = NULL;
	json_t *thinking_obj = NULL, *stream_opts = NULL;
	bool thinking_set = false, add_gen = true;
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v) {
		if (json_is_null(v)) /* null means absent, for every field (docs/api.md) */
			continue;
		const struct key_def *d = find_key(k, where);
		if (!d) {
			st = fail(why, ST_UNSUPPORTED, k, "unsupported parameter '%.60s'%s", k,
				  find_key(k, F_GEN | F_TOKENIZE) ? " for this endpoint" : "");
			why->code = "unknown_parameter";
			goto out;
		}
		if (json_is_null(v) || d->key == K_IGNORED)
			continue;
		double dv = 0;
		long long iv = 0;
		bool bv = false;
		switch (d->key) {
		case K_IGNORED:
			break;
		case K_MODEL:
			st = get_str(r->arena, v, "model", &r->model, NULL, false, why);
			break;
		case K_STREAM:
			st = get_bool(v, "stream", &r->stream, why);
			break;
		case K_STREAM_OPTIONS: {
			stream_opts = v;
			if (!json_is_object(v)) {
				st = fail(why, ST_INVALID, "stream_options", "'stream_options' must be an object");
				break;
			}
			const char *sk;
			json_t *sv;
			json_object_foreach(v, sk, sv) {
				if (json_is_null(sv))
					continue;
				if (!strcmp(sk, "include_usage")) {
					st = get_bool(sv, "stream_options.include_usage", &r->include_usage, why);
				} else if (!strcmp(sk, "continuous_usage_stats") || !strcmp(sk, "include_obfuscation")) {
					st = get_bool(sv, sk, &bv, why);
					if (!st && bv && sk[0] == 'c')
						st = fail(why, ST_UNSUPPORTED, "stream_options.continuous_usage_stats",
							  "stream_options.continuous_usage_stats is not supported");
				} else {
					st = fail(why, ST_UNSUPPORTED, "stream_options",
						  "unsupported stream_options.%.40s", sk);
				}
				if (st)
					break;
			}
			break;
		}
		case K_N:
			if (!(st = get_int(v, "n", 1, SCHED_MAX_N, &iv, why)))
				r->n = (uint32_t)iv;
			break;
		case K_MAX_TOKENS:
			/* 0: score the prompt only (vLLM; checked below) */
			if (!(st = get_int(v, "max_tokens", 0, OAI_MAX_TOKENS_PARAM, &iv, why)) && !max_completion) {
				r->max_tokens = (uint32_t)iv;
				r->score_only = iv == 0;
			}
			break;
		case K_PROMPT_LOGPROBS:
			if (!(st = get_int(v, "prompt_logprobs", 0, KERN_SAMPLE_MAX_TOP_LOGPROBS, &iv, why))) {
				r->prompt_logprobs = true;
				r->prompt_top_logprobs = (uint32_t)iv;
			}
			break;
		case K_MAX_COMPLETION_TOKENS:
			max_completion = v;
			if (!(st = get_int(v, "max_completion_tokens", 1, OAI_MAX_TOKENS_PARAM, &iv, why)))
				r->max_tokens = (uint32_t)iv;
			break;
		case K_TEMPERATURE:
			if (!(st = get_num(v, "temperature", 0, 2, &dv, why)))
				r->sampling.temperature = (float)dv;
			break;
		case K_TOP_P:
			if (!(st = get_num_in(v, "top_p", 0, true, 1, &dv, why)))
				r->sampling.top_p = (float)dv;
			break;
		case K_TOP_K:
			if (!(st = get_int(v, "top_k", -1, 1 << 30, &iv, why)))
				r->sampling.top_k = iv <= 0 ? 0 : (int32_t)iv;
			break;
		case K_MIN_P:
			if (!(st = get_num(v, "min_p", 0, 1, &dv, why)))
				r->sampling.min_p = (float)dv;
			break;
		case K_SEED:
			if (!(st = get_int(v, "seed", INT64_MIN, INT64_MAX, &iv, why))) {
				r->sampling.seed = (uint64_t)iv;
				r->has_seed = true;
			}
			break;
		case K_PRESENCE:
			if (!(st = get_num(v, "presence_penalty", -2, 2, &dv, why)))
				r->sampling.presence_penalty = (float)dv;
			break;
		case K_FREQUENCY:
			if (!(st = get_num(v, "frequency_penalty", -2, 2, &dv, why)))
				r->sampling.frequency_penalty = (float)dv;
			break;
		case K_REPETITION:
			if (!(st = get_num_in(v, "repetition_penalty", 0, true, 2, &dv, why)))
				r->sampling.repetition_penalty = (float)dv;
			break;
		case K_LOGIT_BIAS:
			st = parse_logit_bias(r, v, vocab, why);
			break;
		case K_STOP:
			st = parse_stop(r, v, why);
			break;
		case K_STOP_TOKEN_IDS: {
			int32_t *ids;
			st = parse_ids(r->arena, v, "stop_token_ids", SCHED_MAX_STOP_TOKEN_IDS, vocab, &ids,
				       &r->n_stop_token_ids, why);
			r->stop_token_ids = ids;
			break;
		}
		case K_IGNORE_EOS:
			st = get_bool(v, "ignore_eos", &r->ignore_eos, why);
			break;
		case K_LOGPROBS:
			lp = v;
			if (where == F_CHAT) {
				st = get_bool(v, "logprobs", &r->logprobs, why);
			} else if (!(st = get_int(v, "logprobs", 0, KERN_SAMPLE_MAX_TOP_LOGPROBS, &iv, why))) {
				r->logprobs = true;
				r->top_logprobs = (uint32_t)iv;
			}
			break;
		case K_TOP_LOGPROBS:
			top_lp = v;
			if (!(st = get_int(v, "top_logprobs", 0, KERN_SAMPLE_MAX_TOP_LOGPROBS, &iv, why)))
				r->top_logprobs = (uint32_t)iv;
			break;
		case K_PRIORITY:
			if (!(st = get_int(v, "priority", INT32_MIN, INT32_MAX, &iv, why)))
				r->priority = (int32_t)iv;
			break;
		case K_CACHE_SALT: {
			const char *s;
			size_t n;
			if (!(st = get_str(r->arena, v, "cache_salt", &s, &n, true, why)))
				r->cache_salt = fnv1a(s, n);
			break;
		}
		case K_MIN_TOKENS:
			if (!(st = get_int(v, "min_tokens", 0, OAI_MAX_TOKENS_PARAM, &iv, why)))
				r->min_tokens = (uint32_t)iv;
			break;
		case K_INCLUDE_STOP:
			st = get_bool(v, "include_stop_str_in_output", &r->include_stop_str_in_output, why);
			break;
		case K_SKIP_SPECIAL:
			st = get_bool(v, "skip_special_tokens", &r->skip_special_tokens, why);
			break;
		case K_SPACES_SPECIAL:
			/* vLLM's fast-tokenizer detokenizer (this model's) joins special
			 * tokens' text without spaces whatever the flag says; so do we */
			st = get_bool(v, "spaces_between_special_tokens", &bv, why);
			break;
		case K_PARALLEL_TOOL_CALLS:
			if (!(st = get_bool(v, "parallel_tool_calls", &bv, why)) && !bv)
				st = fail(why, ST_UNSUPPORTED, "parallel_tool_calls",
					  "parallel_tool_calls=false is not supported (the model may emit several calls)");
			break;
		case K_RESPONSE_FORMAT:
		case K_FORMAT:
			st = parse_format(r, k, v, why);
			break;
		case K_MESSAGES:
			messages = v; /* after continue_final_message is known */
			break;
		case K_TOOLS:
			st = parse_tools(r, v, why);
			break;
		case K_TOOL_CHOICE:
			st = parse_tool_choice(r, v, why);
			break;
		case K_TEMPLATE_KWARGS:
			st = parse_template_kwargs(r, v, &thinking_set, why);
			break;
		case K_REASONING_EFFORT:
			if (!json_is_string(v))
				st = fail(why, ST_INVALID, "reasoning_effort", "'reasoning_effort' must be a string");
			else
				reasoning = v;
			break;
		case K_THINKING: {
			const char *t = json_string_value(json_object_get(v, "type"));
			if (json_is_boolean(v)) {
				thinking_obj = v;
			} else if (!json_is_object(v) || !t || (strcmp(t, "enabled") && strcmp(t, "disabled"))) {
				st = fail(why, ST_INVALID, "thinking",
					  "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
			} else {
				thinking_obj = v;
			}
			break;
		}
		case K_INCLUDE_REASONING:
			st = get_bool(v, "include_reasoning", &r->include_reasoning, why);
			break;
		case K_ADD_GENERATION_PROMPT:
			st = get_bool(v, "add_generation_prompt", &add_gen, why);
			break;
		case K_CONTINUE_FINAL:
			st = get_bool(v, "continue_final_message", &r->continue_final, why);
			break;
		case K_MODALITIES:
			if (!json_is_array(v) || json_array_size(v) != 1 ||
			    strcmp(json_string_value(json_array_get(v, 0)) ? json_string_value(json_array_get(v, 0)) : "",
				   "text"))
				st = fail(why, ST_UNSUPPORTED, "modalities", "only modalities [\"text\"] is supported");
			break;
		case K_PROMPT:
			if (where == F_TOKENIZE) {
				st = get_str(tok->arena, v, "prompt", &tok->prompt, &tok->prompt_len, true, why);
			} else {
				st = parse_prompt(r, v, vocab, why);
			}
			break;
		case K_ECHO:
			st = get_bool(v, "echo", &r->echo, why);
			break;
		case K_SUFFIX:
			if (!json_is_string(v) || json_string_length(v))
				st = fail(why, ST_UNSUPPORTED, "suffix", "'suffix' is not supported");
			break;
		case K_BEST_OF:
			st = get_int(v, "best_of", 1, SCHED_MAX_N, &iv, why);
			if (!st && iv != 1) {
				json_t *nv = json_object_get(root, "n");
				long long nn = json_is_integer(nv) ? json_integer_value(nv) : 1;
				if (iv != nn)
					st = fail(why, ST_UNSUPPORTED, "best_of", "'best_of' other than n is not supported");
			}
			break;
		case K_ADD_SPECIAL:
			st = get_bool(v, "add_special_tokens", tok ? &tok->add_special_tokens : &bv, why);
			break;
		case K_RETURN_TOKEN_STRS:
			st = get_bool(v, "return_token_strs", &tok->return_token_strs, why);
			break;
		}
		if (st)
			goto out;
	}
	if (thinking_obj && !thinking_set) {
		if (json_is_boolean(thinking_obj))
			r->thinking = json_is_true(thinking_obj);
		else
			r->thinking = !strcmp(json_string_value(json_object_get(thinking_obj, "type")), "enabled");
		thinking_set = true;
	}
	if (reasoning) {
		bool explicit_thinking = r->thinking;
		if ((st = reasoning_effort(r, json_string_value(reasoning), why)))
			goto out;
		if (thinking_set) /* an explicit switch wins over the effort's implied one */
			r->thinking = explicit_thinking;
	}
	if (!r->thinking)
		r->effort = MODEL_CHAT_EFFORT_NONE;
	if (r->tool_choice == OAI_TOOL_NONE)
		r->tools_json = NULL;
	if ((r->tool_choice == OAI_TOOL_REQUIRED || r->tool_choice == OAI_TOOL_NAMED) && !r->tools_json) {
		st = fail(why, ST_INVALID, "tool_choice", "tool_choice \"required\" or a named function needs 'tools'");
		goto out;
	}
	if ((r->tool_choice == OAI_TOOL_REQUIRED || r->tool_choice == OAI_TOOL_NAMED) && r->format) {
		st = fail(why, ST_UNSUPPORTED, "tool_choice", "tool_choice \"required\" or a named function cannot be "
							      "combined with a response format");
		goto out;
	}
	if (where & (F_CHAT | F_TOKENIZE)) {
		if (!messages && where == F_CHAT) {
			st = FAILC(why, "missing_required_parameter", ST_INVALID, "messages", "'messages' is required");
			goto out;
		}
		if (!add_gen && !r->continue_final) {
			st = fail(why, ST_UNSUPPORTED, "add_generation_prompt",
				  "add_generation_prompt=false is only supported with continue_final_message=true");
			goto out;
		}
		if (messages && (st = parse_messages(r, messages, why)))
			goto out;
		if (r->continue_final && r->messages[r->n_messages - 1].role != MODEL_CHAT_ROLE_ASSISTANT) {
			st = fail(why, ST_INVALID, "continue_final_message",
				  "continue_final_message needs an assistant message last");
			goto out;
		}
	}
	if (stream_opts && !r->stream) {
		st = fail(why, ST_INVALID, "stream_options", "'stream_options' is only allowed with \"stream\": true");
		goto out;
	}
	if (r->max_tokens && r->min_tokens > r->max_tokens) {
		st = fail(why, ST_INVALID, "min_tokens", "'min_tokens' (%u) must not exceed max_tokens (%u)", r->min_tokens,
			  r->max_tokens);
		goto out;
	}
	if (where == F_CHAT && top_lp && r->top_logprobs && !r->logprobs) {
		st = fail(why, ST_INVALID, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
		goto out;
	}
	(void)lp;
	if (where == F_COMPL) {
		if (!r->n_prompts) {
			st = FAILC(why, "missing_required_parameter", ST_INVALID, "prompt", "'prompt' is required");
			goto out;
		}
	}
	if (r->score_only && !r->prompt_logprobs && !r->echo) {
		st = fail(why, ST_INVALID, "max_tokens", "'max_tokens' 0 scores the prompt only: it needs 'echo' or "
							 "'prompt_logprobs'");
		goto out;
	}
	if (r->prompt_logprobs && r->stream && where == F_CHAT) {
		st = fail(why, ST_UNSUPPORTED, "prompt_logprobs", "'prompt_logprobs' with \"stream\": true is supported on "
								  "/v1/completions only");
		goto out;
	}
	if (where == F_TOKENIZE && !tok->prompt && !messages) {
		st = FAILC(why, "missing_required_parameter", ST_INVALID, "prompt", "'prompt' or 'messages' is required");
		goto out;
	}
	if (where == F_TOKENIZE && tok->prompt && messages) {
		st = fail(why, ST_INVALID, "prompt", "give either 'prompt' or 'messages', not both");
		goto out;
	}
	r->sampling.logprobs = r->logprobs;
	r->sampling.top_logprobs = r->logprobs ? r->top_logprobs : 0;
out:
	json_decref(root);
	return st;
}

enum status oai_parse_request(enum oai_kind kind, const char *body, size_t len, int32_t vocab_size,
			      struct oai_request *out, struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	out->kind = kind;
	out->arena = calloc(1, sizeof *out->arena);
	if (!out->arena)
		return fail(why, ST_NOMEM, "", "out of memory");
	enum status st = parse_body(kind == OAI_CHAT ? F_CHAT : F_COMPL, body, len, vocab_size, out, NULL, why);
	if (st)
		oai_request_free(out);
	return st;
}

void oai_request_free(struct oai_request *r)
{
	if (!r)
		return;
	ar_free(r->arena);
	memset(r, 0, sizeof *r);
}

enum status oai_parse_tokenize(const char *body, size_t len, struct oai_tokenize_request *out,
			       struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	out->add_special_tokens = true;
	out->arena = calloc(1, sizeof *out->arena);
	if (!out->arena)
		return fail(why, ST_NOMEM, "", "out of memory");
	out->chat.kind = OAI_CHAT;
	out->chat.arena = out->arena;
	enum status st = parse_body(F_TOKENIZE, body, len, INT32_MAX, &out->chat, out, why);
	if (st) {
		oai_tokenize_request_free(out);
		return st;
	}
	out->model = out->chat.model;
	out->is_chat = out->chat.n_messages > 0;
	return ST_OK;
}

void oai_tokenize_request_free(struct oai_tokenize_request *r)
{
	if (!r)
		return;
	ar_free(r->arena);
	memset(r, 0, sizeof *r);
}

enum status oai_parse_detokenize(const char *body, size_t len, int32_t vocab_size,
				 struct oai_detokenize_request *out, struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	memset(why, 0, sizeof *why);
	if (too_many_values(body, len))
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body holds more than %u JSON values", OAI_MAX_JSON_VALUES);
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body is not valid JSON: %s (line %d, column %d)", je.text,
			    je.line, je.column);
	enum status st = ST_OK;
	struct oai_arena tmp = {0};
	json_t *toks = NULL;
	const char *k;
	json_t *v;
	if (!json_is_object(root)) {
		st = FAILC(why, "invalid_json", ST_INVALID, "", "request body must be a JSON object");
		goto out;
	}
	json_object_foreach(root, k, v) {
		if (json_is_null(v))
			continue;
		if (!strcmp(k, "tokens")) {
			toks = v;
		} else if (!strcmp(k, "model")) {
			if (json_is_null(v))
				continue;
			if (!json_is_string(v)) {
				st = fail(why, ST_INVALID, "model", "'model' must be a string");
				goto out;
			}
			out->model_buf = strdup(json_string_value(v));
			if (!out->model_buf) {
				st = NOMEM(why);
				goto out;
			}
			out->model = out->model_buf;
		} else {
			st = fail(why, ST_UNSUPPORTED, k, "unsupported parameter '%.60s'", k);
			why->code = "unknown_parameter";
			goto out;
		}
	}
	if (!toks) {
		st = FAILC(why, "missing_required_parameter", ST_INVALID, "tokens", "'tokens' is required");
		goto out;
	}
	int32_t *ids;
	if ((st = parse_ids(&tmp, toks, "tokens", OAI_MAX_PROMPT_IDS, vocab_size, &ids, &out->n_tokens, why)))
		goto out;
	out->tokens = malloc((out->n_tokens ? out->n_tokens : 1) * sizeof(int32_t));
	if (!out->tokens) {
		st = NOMEM(why);
		goto out;
	}
	memcpy(out->tokens, ids, out->n_tokens * sizeof(int32_t));
out:
	while (tmp.head) {
		struct arena_blk *b = tmp.head;
		tmp.head = b->next;
		free(b);
	}
	json_decref(root);
	if (st)
		oai_detokenize_request_free(out);
	return st;
}

void oai_detokenize_request_free(struct oai_detokenize_request *r)
{
	if (!r)
		return;
	free(r->tokens);
	free(r->model_buf);
	memset(r, 0, sizeof *r);
}

void oai_chat_options(const struct oai_request *r, struct model_chat_options *opt)
{
	memset(opt, 0, sizeof *opt);
	opt->thinking = r->thinking;
	opt->effort = r->effort;
	opt->tools_json = r->tools_json;
	opt->response_format_json = r->response_format_json;
	opt->continue_final = r->continue_final;
}
