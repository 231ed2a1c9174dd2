/*
 * server/responses.c: the OpenAI Responses API (responses.h): the request
 * translated into a chat completions body, the answer written as a
 * response object or as the typed SSE events, the store routes.
 *
 * Output items, in the order the model produces them: reasoning (its text
 * as one summary_text part), message (one output_text part), one
 * function_call per DSML tool call (arguments: JSON text, streamed as
 * function_call_arguments deltas). status is "completed", or "incomplete"
 * with incomplete_details.reason "max_output_tokens" when the token limit
 * ended it. Every event carries a sequence_number from 0.
 */
#include "responses.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "model/output_parser.h"
#include "server/frontend.h"
#include "server/openai_format.h"

/* ---- request translation ---- */

/* The text of a message's content: a string or an array of text parts. */
static enum status content_text(json_t *c, const char *where, struct strbuf *b, struct oai_error *why)
{
	if (json_is_string(c)) {
		strbuf_append(b, json_string_value(c), json_string_length(c));
		return ST_OK;
	}
	if (!json_is_array(c))
		return fe_fail(why, 400, ST_INVALID, "input", "%s must be a string or an array of content parts", where);
	size_t i;
	json_t *p;
	json_array_foreach(c, i, p) {
		const char *t = json_string_value(json_object_get(p, "type"));
		if (!t)
			return fe_fail(why, 400, ST_INVALID, "input", "%s[%zu] needs a 'type'", where, i);
		json_t *tx = json_object_get(p, !strcmp(t, "refusal") ? "refusal" : "text");
		if (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text") || !strcmp(t, "refusal") ||
		    !strcmp(t, "summary_text") || !strcmp(t, "reasoning_text")) {
			if (!json_is_string(tx))
				return fe_fail(why, 400, ST_INVALID, "input", "%s[%zu] needs a string", where, i);
			strbuf_append(b, json_string_value(tx), json_string_length(tx));
		} else if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio")) {
			return fe_fail(why, 400, ST_UNSUPPORTED, "input",
				    "%s: '%s' parts are not supported: this model reads text only", where, t);
		} else {
			return fe_fail(why, 400, ST_UNSUPPORTED, "input", "%s: part type '%.40s' is not supported", where, t);
		}
	}
	return ST_OK;
}

/* The assistant message that tool calls of the input attach to: the last
 * message when this input made it and it is an assistant turn (and no
 * reasoning item came in between), else a new one. */
static json_t *assistant_for_calls(json_t *msgs, size_t first, struct strbuf *reasoning)
{
	size_t n = json_array_size(msgs);
	json_t *last = n > first ? json_array_get(msgs, n - 1) : NULL;
	const char *role = json_string_value(json_object_get(last, "role"));
	if (last && role && !strcmp(role, "assistant") && !reasoning->len)
		return last;
	json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
	if (reasoning->len) {
		json_object_set_new(m, "reasoning_content", json_stringn(reasoning->data, reasoning->len));
		strbuf_reset(reasoning);
	}
	json_array_append_new(msgs, m);
	return m;
}

static enum status translate_input(json_t *input, json_t *msgs, struct oai_error *why)
{
	if (json_is_string(input)) {
		json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
		return ST_OK;
	}
	if (!json_is_array(input))
		return fe_fail(why, 400, ST_INVALID, "input", "'input' must be a string or an array of items");
	if (json_array_size(input) > OAI_MAX_MESSAGES)
		return fe_fail(why, 400, ST_INVALID, "input", "too many input items (at most %d)", OAI_MAX_MESSAGES);
	struct strbuf reasoning;
	strbuf_init(&reasoning);
	enum status st = ST_OK;
	size_t i, first = json_array_size(msgs);
	json_t *it;
	char where[48];
	json_array_foreach(input, i, it) {
		snprintf(where, sizeof where, "input[%zu]", i);
		if (!json_is_object(it)) {
			st = fe_fail(why, 400, ST_INVALID, "input", "%s must be an object", where);
			break;
		}
		const char *t = json_string_value(json_object_get(it, "type"));
		const char *role = json_string_value(json_object_get(it, "role"));
		if (!t && role)
			t = "message";
		if (!t) {
			st = fe_fail(why, 400, ST_INVALID, "input", "%s needs a 'type'", where);
			break;
		}
		if (!strcmp(t, "message")) {
			if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
				      strcmp(role, "developer"))) {
				st = fe_fail(why, 400, ST_INVALID, "input",
					  "%s.role must be user, assistant, system or developer", where);
				break;
			}
			struct strbuf b;
			strbuf_init(&b);
			if ((st = content_text(json_object_get(it, "content"), where, &b, why))) {
				strbuf_free(&b);
				break;
			}
			json_t *m = json_pack("{s:s,s:s%}", "role", !strcmp(role, "developer") ? "system" : role, "content",
					      b.data ? b.data : "", b.len);
			strbuf_free(&b);
			if (!strcmp(role, "assistant") && reasoning.len) {
				json_object_set_new(m, "reasoning_content", json_stringn(reasoning.data, reasoning.len));
				strbuf_reset(&reasoning);
			}
			json_array_append_new(msgs, m);
		} else if (!strcmp(t, "function_call")) {
			json_t *cid = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
			json_t *args = json_object_get(it, "arguments");
			if (!json_is_string(cid) || !json_is_string(name) || !json_is_string(args)) {
				st = fe_fail(why, 400, ST_INVALID, "input",
					  "%s: a function_call needs string 'call_id', 'name' and 'arguments'", where);
				break;
			}
			json_t *m = assistant_for_calls(msgs, first, &reasoning);
			json_t *calls = json_object_get(m, "tool_calls");
			if (!calls) {
				calls = json_array();
				json_object_set_new(m, "tool_calls", calls);
			}
			json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", cid, "type", "function",
							       "function", "name", name, "arguments", args));
		} else if (!strcmp(t, "function_call_output")) {
			json_t *cid = json_object_get(it, "call_id");
			if (!json_is_string(cid)) {
				st = fe_fail(why, 400, ST_INVALID, "input", "%s: a function_call_output needs a 'call_id'", where);
				break;
			}
			struct strbuf b;
			strbuf_init(&b);
			if ((st = content_text(json_object_get(it, "output"), where, &b, why))) {
				strbuf_free(&b);
				break;
			}
			json_array_append_new(msgs, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id", cid,
							      "content", b.data ? b.data : "", b.len));
			strbuf_free(&b);
		} else if (!strcmp(t, "reasoning")) {
			/* fed back: its summary (and content) texts become the next assistant
			 * turn's reasoning_content; encrypted_content is not ours */
			json_t *parts[2] = {json_object_get(it, "summary"), json_object_get(it, "content")};
			for (int k = 0; k < 2 && !st; k++)
				if (json_is_array(parts[k]))
					st = content_text(parts[k], where, &reasoning, why);
			if (st)
				break;
		} else {
			st = fe_fail(why, 400, ST_UNSUPPORTED, "input", "%s: item type '%.40s' is not supported", where, t);
			break;
		}
	}
	strbuf_free(&reasoning);
	return st;
}

/* One of tools: a function tool (other types refused). */
static enum status one_tool(json_t *t, size_t i, json_t **out, struct oai_error *why)
{
	const char *type = json_string_value(json_object_get(t, "type"));
	json_t *name = json_object_get(t, "name");
	if (!type || strcmp(type, "function"))
		return fe_fail(why, 400, ST_UNSUPPORTED, "tools",
			       "tools[%zu]: tool type '%.40s' is not supported (only \"function\")", i, type ? type : "");
	if (!json_is_string(name))
		return fe_fail(why, 400, ST_INVALID, "tools", "tools[%zu] needs a 'name'", i);
	*out = fe_chat_tool(name, json_object_get(t, "description"), json_object_get(t, "parameters"));
	return ST_OK;
}

/* Keys accepted with no effect here. */
static const char *const ignored_keys[] = {"user", "truncation", "include", "service_tier", "prompt_cache_key",
					   "safety_identifier", "max_tool_calls", "top_logprobs", "stream_options",
					   "prompt_cache_retention", NULL};

/* tool_choice: auto / none / required as chat's; {"type":"function","name"}
 * as chat's function object. HOOK(structured): required and a named
 * function are constrained by the chat parser's tool_choice (refused while
 * it has none). */
static enum status translate_tool_choice(json_t *v, json_t *o, struct oai_error *why)
{
	const char *s = json_string_value(v);
	const char *t = json_string_value(json_object_get(v, "type"));
	json_t *name = json_object_get(v, "name");
	if (s)
		json_object_set(o, "tool_choice", v);
	else if (t && !strcmp(t, "function") && json_is_string(name))
		json_object_set_new(o, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name));
	else
		return fe_fail(why, 400, ST_INVALID, "tool_choice",
			       "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}");
	return ST_OK;
}

/* reasoning: effort becomes chat's reasoning_effort; the echo keeps effort
 * and summary (or generate_summary). */
static enum status translate_reasoning(json_t *v, json_t *o, json_t *ec, struct oai_error *why)
{
	if (!json_is_object(v))
		return fe_fail(why, 400, ST_INVALID, "reasoning", "'reasoning' must be an object");
	json_t *eff = json_object_get(v, "effort");
	if (eff && !json_is_null(eff))
		json_object_set(o, "reasoning_effort", eff);
	json_t *r = json_object_get(ec, "reasoning");
	json_object_set(r, "effort", eff ? eff : json_null());
	json_t *sum = json_object_get(v, "summary");
	if (!sum)
		sum = json_object_get(v, "generate_summary");
	json_object_set(r, "summary", sum ? sum : json_null());
	return ST_OK;
}

/* text.format: text, json_object, or json_schema (HOOK(structured):
 * constrained like chat's response_format). */
static enum status translate_text(json_t *v, json_t *o, struct oai_error *why)
{
	json_t *f = json_object_get(v, "format");
	const char *t = json_string_value(json_object_get(f, "type"));
	if (!json_is_object(v) || (f && !t))
		return fe_fail(why, 400, ST_INVALID, "text.format", "'text.format' must be {\"type\": ...}");
	if (t && !strcmp(t, "json_object")) {
		json_object_set_new(o, "response_format", json_pack("{s:s}", "type", "json_object"));
	} else if (t && !strcmp(t, "json_schema")) {
		json_t *js = json_pack("{s:O*,s:O*}", "name", json_object_get(f, "name"), "schema",
				       json_object_get(f, "schema"));
		json_t *strict = json_object_get(f, "strict");
		if (json_is_boolean(strict))
			json_object_set(js, "strict", strict);
		json_object_set_new(o, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
	} else if (t && strcmp(t, "text")) {
		return fe_fail(why, 400, ST_INVALID, "text.format", "unknown text.format type '%.40s'", t);
	}
	return ST_OK;
}

/* What a request carries besides the chat body: input and instructions
 * (translated once every key is read). */
struct resp_parts {
	json_t *input, *instructions;
};

/* One top-level key of the body into the chat body o and the echo ec (the
 * request's fields as the response object repeats them). */
static enum status translate_key(const char *k, json_t *v, json_t *o, json_t *ec, struct resp_parts *pt,
				 struct resp_info *info, struct oai_error *why)
{
	enum status st = ST_OK;
	if (!strcmp(k, "model") || !strcmp(k, "temperature") || !strcmp(k, "top_p")) {
		json_object_set(o, k, v);
		if (k[0] == 't')
			json_object_set(ec, k, v);
		return ST_OK;
	} else if (!strcmp(k, "max_output_tokens")) {
		json_object_set(o, "max_tokens", v);
	} else if (!strcmp(k, "input")) {
		pt->input = v;
		return ST_OK;
	} else if (!strcmp(k, "instructions")) {
		if (!json_is_string(v))
			return fe_fail(why, 400, ST_INVALID, k, "'instructions' must be a string");
		pt->instructions = v;
	} else if (!strcmp(k, "stream")) {
		if (!json_is_boolean(v))
			return fe_fail(why, 400, ST_INVALID, k, "'stream' must be a boolean");
		info->stream = json_is_true(v);
		json_object_set(o, k, v);
		return ST_OK;
	} else if (!strcmp(k, "store")) {
		if (!json_is_boolean(v))
			return fe_fail(why, 400, ST_INVALID, k, "'store' must be a boolean");
		info->store = json_is_true(v);
	} else if (!strcmp(k, "previous_response_id")) {
		if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= sizeof info->previous_id)
			return fe_fail(why, 400, ST_INVALID, k, "'previous_response_id' must be a response id");
		snprintf(info->previous_id, sizeof info->previous_id, "%s", json_string_value(v));
	} else if (!strcmp(k, "metadata")) {
		if (!json_is_object(v) || json_object_size(v) > 16)
			return fe_fail(why, 400, ST_INVALID, k, "'metadata' must be an object of at most 16 pairs");
	} else if (!strcmp(k, "tools")) {
		st = fe_translate_tools(v, o, one_tool, why);
	} else if (!strcmp(k, "tool_choice")) {
		st = translate_tool_choice(v, o, why);
	} else if (!strcmp(k, "parallel_tool_calls")) {
		/* false: the answer keeps its first call (the model may write more; dropped) */
		if (!json_is_boolean(v))
			return fe_fail(why, 400, ST_INVALID, k, "'parallel_tool_calls' must be a boolean");
		info->one_call = json_is_false(v);
	} else if (!strcmp(k, "reasoning")) {
		return translate_reasoning(v, o, ec, why);
	} else if (!strcmp(k, "text")) {
		st = translate_text(v, o, why);
	} else if (!strcmp(k, "background")) {
		if (json_is_true(v))
			return fe_fail(why, 400, ST_UNSUPPORTED, k, "'background' responses are not supported");
		return ST_OK;
	} else if (!strcmp(k, "conversation") || !strcmp(k, "prompt")) {
		return fe_fail(why, 400, ST_UNSUPPORTED, k, "'%s' (server-side conversations / prompts) is not supported", k);
	} else {
		bool ign = false;
		for (const char *const *p = ignored_keys; *p && !ign; p++)
			ign = !strcmp(*p, k);
		if (!ign)
			return fe_fail(why, 400, ST_UNSUPPORTED, k, "unsupported parameter '%.60s'", k);
		return ST_OK;
	}
	if (!st)
		json_object_set(ec, k, v);
	return st;
}

/* The conversation so far: previous_response_id's stored history, or an
 * empty one. */
static enum status load_history(struct resp_store *store, const struct resp_info *info, json_t **hist,
				struct oai_error *why)
{
	if (!info->previous_id[0]) {
		*hist = json_array();
		return ST_OK;
	}
	char *prev = NULL;
	size_t plen = 0;
	enum status g = store ? resp_store_get(store, info->previous_id, NULL, NULL, &prev, &plen) : ST_NOTFOUND;
	if (g == ST_NOMEM)
		return fe_fail(why, 500, ST_NOMEM, "", "out of memory");
	if (g)
		return fe_fail(why, 404, ST_NOTFOUND, "previous_response_id",
			       "Previous response with id '%s' not found (unknown, deleted, evicted from the bounded store, "
			       "or stored by an earlier run of the server)", info->previous_id);
	*hist = json_loadb(prev, plen, 0, NULL);
	free(prev);
	if (!json_is_array(*hist))
		return fe_fail(why, 500, ST_INVALID, "", "stored response %s is damaged", info->previous_id);
	return ST_OK;
}

enum status resp_translate(const char *body, size_t len, struct resp_store *store, char **chat, size_t *chat_len,
			   char **history, char **echo, struct resp_info *info, struct oai_error *why)
{
	memset(why, 0, sizeof *why);
	memset(info, 0, sizeof *info);
	info->store = true;
	*chat = *history = *echo = NULL;
	*chat_len = 0;
	json_t *root = NULL, *o = json_object(), *hist = NULL, *msgs = json_array();
	json_t *ec = json_pack("{s:n,s:n,s:n,s:n,s:s,s:[],s:b,s:{},s:n,s:{s:n,s:n},s:b,s:{s:{s:s}},s:s}",
			       "instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "auto",
			       "tools", "parallel_tool_calls", 1, "metadata", "previous_response_id", "reasoning",
			       "effort", "summary", "store", 1, "text", "format", "type", "text", "truncation",
			       "disabled");
	enum status st = fe_parse_body(body, len, &root, why);
	if (st)
		goto done;
	struct resp_parts pt = {0};
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v)
		if (!json_is_null(v) && (st = translate_key(k, v, o, ec, &pt, info, why)))
			goto done;
	if (!pt.input) {
		st = fe_fail(why, 400, ST_INVALID, "input", "'input' is required");
		goto done;
	}
	if ((st = load_history(store, info, &hist, why)) || (st = translate_input(pt.input, hist, why)))
		goto done;
	if (pt.instructions)
		json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", pt.instructions));
	json_array_extend(msgs, hist);
	if (!json_array_size(msgs)) {
		st = fe_fail(why, 400, ST_INVALID, "input", "'input' is empty");
		goto done;
	}
	json_object_set(o, "messages", msgs);
	*chat = json_dumps(o, JSON_COMPACT);
	*history = json_dumps(hist, JSON_COMPACT);
	*echo = json_dumps(ec, JSON_COMPACT);
	if (!*chat || !*history || !*echo) {
		free(*chat);
		free(*history);
		free(*echo);
		*chat = *history = *echo = NULL;
		st = fe_fail(why, 500, ST_NOMEM, "", "out of memory");
	} else {
		*chat_len = strlen(*chat);
	}
done:
	json_decref(hist);
	json_decref(msgs);
	json_decref(o);
	json_decref(ec);
	json_decref(root);
	return st;
}

/* ---- the answer ---- */

struct resp_fmt {
	struct oai_server *srv;
	struct resp_store *store;
	char id[48];
	long created;
	char *model;
	bool stream, store_it;
	char *echo, *history;
	struct fe_blocks bl; /* the output items: reasoning, message, function_call */
	uint64_t seq;
	const char *incomplete;
	const char *abort_msg;
};

/* A JSON string of bytes that may not be valid UTF-8 (generated text). */
static json_t *jstr(const char *s, size_t n)
{
	json_t *v = json_stringn(s ? s : "", n);
	if (v)
		return v;
	struct strbuf b;
	strbuf_init(&b);
	oai_json_text(&b, s, n);
	v = json_loadb(b.data ? b.data : "\"\"", b.len, JSON_DECODE_ANY, NULL);
	strbuf_free(&b);
	return v ? v : json_string("");
}

static json_t *item_json(const struct fe_block *it, bool done)
{
	const char *t = it->text.data ? it->text.data : "";
	switch (it->type) {
	case FE_BLOCK_REASONING:
		return json_pack("{s:s,s:s,s:o}", "id", it->id, "type", "reasoning", "summary",
				 done ? json_pack("[{s:s,s:o}]", "type", "summary_text", "text", jstr(t, it->text.len))
				      : json_array());
	case FE_BLOCK_TEXT:
		return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", it->id, "type", "message", "role", "assistant", "status",
				 done ? "completed" : "in_progress", "content",
				 done ? json_pack("[{s:s,s:o,s:[],s:[]}]", "type", "output_text", "text", jstr(t, it->text.len),
						  "annotations", "logprobs")
				      : json_array());
	default:
		return json_pack("{s:s,s:s,s:s,s:o,s:o,s:s}", "id", it->id, "type", "function_call", "call_id",
				 it->call_id ? it->call_id : "", "name", jstr(it->name, it->name ? strlen(it->name) : 0),
				 "arguments", done ? jstr(t, it->text.len) : json_string(""), "status",
				 done ? "completed" : "in_progress");
	}
}

static json_t *response_json(struct resp_fmt *f, const char *status, const struct oai_usage *u, const char *error)
{
	json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:s}", "id", f->id, "object", "response", "created_at",
			      (json_int_t)f->created, "status", status, "error", "incomplete_details", "model", f->model);
	json_t *echo = json_loads(f->echo, 0, NULL);
	json_object_update_missing(r, echo);
	json_decref(echo);
	if (error)
		json_object_set_new(r, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", error));
	if (f->incomplete && !strcmp(status, "incomplete"))
		json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", f->incomplete));
	json_t *out = json_array();
	if (u)
		for (size_t i = 0; i < f->bl.n; i++)
			json_array_append_new(out, item_json(&f->bl.v[i], true));
	json_object_set_new(r, "output", out);
	if (u) {
		json_object_set_new(r, "usage",
				    json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)u->prompt_tokens,
					      "input_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens,
					      "output_tokens", (json_int_t)u->completion_tokens, "output_tokens_details",
					      "reasoning_tokens", (json_int_t)0, "total_tokens",
					      (json_int_t)(u->prompt_tokens + u->completion_tokens)));
	} else {
		json_object_set_new(r, "usage", json_null());
	}
	return r;
}

/* One SSE event: obj gets "type" and "sequence_number"; obj is consumed. */
static void emit(struct resp_fmt *f, struct strbuf *out, const char *type, json_t *obj)
{
	json_t *e = json_pack("{s:s,s:I}", "type", type, "sequence_number", (json_int_t)f->seq++);
	json_object_update(e, obj);
	json_decref(obj);
	char *s = json_dumps(e, JSON_COMPACT);
	json_decref(e);
	if (!s) {
		f->bl.oom = true;
		return;
	}
	fe_sse_event(out, type, s, strlen(s));
	free(s);
}

/* fe_blocks on_close: the item's done events. */
static void block_close(void *ctx, struct strbuf *out, size_t oi)
{
	struct resp_fmt *f = ctx;
	struct fe_block *it = &f->bl.v[oi];
	const char *t = it->text.data ? it->text.data : "";
	if (it->type == FE_BLOCK_REASONING) {
		emit(f, out, "response.reasoning_summary_text.done",
		     json_pack("{s:s,s:I,s:i,s:o}", "item_id", it->id, "output_index", (json_int_t)oi, "summary_index", 0,
			       "text", jstr(t, it->text.len)));
		emit(f, out, "response.reasoning_summary_part.done",
		     json_pack("{s:s,s:I,s:i,s:{s:s,s:o}}", "item_id", it->id, "output_index", (json_int_t)oi,
			       "summary_index", 0, "part", "type", "summary_text", "text", jstr(t, it->text.len)));
	} else if (it->type == FE_BLOCK_TEXT) {
		emit(f, out, "response.output_text.done",
		     json_pack("{s:s,s:I,s:i,s:o,s:[]}", "item_id", it->id, "output_index", (json_int_t)oi, "content_index",
			       0, "text", jstr(t, it->text.len), "logprobs"));
		emit(f, out, "response.content_part.done",
		     json_pack("{s:s,s:I,s:i,s:{s:s,s:o,s:[]}}", "item_id", it->id, "output_index", (json_int_t)oi,
			       "content_index", 0, "part", "type", "output_text", "text", jstr(t, it->text.len),
			       "annotations"));
	} else {
		emit(f, out, "response.function_call_arguments.done",
		     json_pack("{s:s,s:I,s:o,s:o}", "item_id", it->id, "output_index", (json_int_t)oi, "name",
			       jstr(it->name, it->name ? strlen(it->name) : 0), "arguments", jstr(t, it->text.len)));
	}
	emit(f, out, "response.output_item.done",
	     json_pack("{s:I,s:o}", "output_index", (json_int_t)oi, "item", item_json(it, true)));
}

/* fe_blocks on_add: the item's id, and its added events when streaming. */
static void block_add(void *ctx, struct strbuf *out, size_t oi)
{
	struct resp_fmt *f = ctx;
	struct fe_block *it = &f->bl.v[oi];
	int type = it->type;
	fe_new_id(f->srv, type == FE_BLOCK_REASONING ? "rs_" : type == FE_BLOCK_TEXT ? "msg_" : "fc_", it->id,
		  sizeof it->id);
	if (!f->stream)
		return;
	emit(f, out, "response.output_item.added",
	     json_pack("{s:I,s:o}", "output_index", (json_int_t)oi, "item", item_json(it, false)));
	if (type == FE_BLOCK_REASONING)
		emit(f, out, "response.reasoning_summary_part.added",
		     json_pack("{s:s,s:I,s:i,s:{s:s,s:s}}", "item_id", it->id, "output_index", (json_int_t)oi,
			       "summary_index", 0, "part", "type", "summary_text", "text", ""));
	else if (type == FE_BLOCK_TEXT)
		emit(f, out, "response.content_part.added",
		     json_pack("{s:s,s:I,s:i,s:{s:s,s:s,s:[]}}", "item_id", it->id, "output_index", (json_int_t)oi,
			       "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void fmt_destroy(void *ctx)
{
	struct resp_fmt *f = ctx;
	if (!f)
		return;
	fe_blocks_free(&f->bl);
	free(f->model);
	free(f->echo);
	free(f->history);
	free(f);
}

static void fmt_start(void *ctx, struct strbuf *out, uint32_t n_prompt)
{
	(void)n_prompt;
	struct resp_fmt *f = ctx;
	if (!f->stream)
		return;
	emit(f, out, "response.created", json_pack("{s:o}", "response", response_json(f, "in_progress", NULL, NULL)));
	emit(f, out, "response.in_progress", json_pack("{s:o}", "response", response_json(f, "in_progress", NULL, NULL)));
}

static void fmt_event(void *ctx, struct strbuf *out, const struct model_oparse_event *ev)
{
	static const char *const delta[] = {
		[FE_BLOCK_REASONING] = "response.reasoning_summary_text.delta",
		[FE_BLOCK_TEXT] = "response.output_text.delta",
		[FE_BLOCK_TOOL] = "response.function_call_arguments.delta",
	};
	struct resp_fmt *f = ctx;
	struct fe_block *it = fe_blocks_event(&f->bl, out, ev);
	if (!it || !f->stream)
		return;
	json_t *o = json_pack("{s:s,s:I,s:o}", "item_id", it->id, "output_index", (json_int_t)(f->bl.n - 1), "delta",
			      jstr(ev->text, ev->len));
	if (it->type == FE_BLOCK_REASONING)
		json_object_set_new(o, "summary_index", json_integer(0));
	else if (it->type == FE_BLOCK_TEXT) {
		json_object_set_new(o, "content_index", json_integer(0));
		json_object_set_new(o, "logprobs", json_array());
	}
	emit(f, out, delta[it->type], o);
}

static void fmt_finish(void *ctx, struct strbuf *out, const struct sched_event *ev)
{
	(void)out;
	struct resp_fmt *f = ctx;
	switch (ev->finish) {
	case SCHED_FINISH_STOP:
		break;
	case SCHED_FINISH_LENGTH:
		f->incomplete = "max_output_tokens";
		break;
	default:
		f->abort_msg = fe_abort_message(ev->finish);
		break;
	}
}

/* Keep the response and the conversation it ends (the history, then the
 * answer as one assistant message) for GET and previous_response_id. */
static void store_response(struct resp_fmt *f, json_t *resp)
{
	json_t *hist = json_loads(f->history, 0, NULL);
	if (!json_is_array(hist)) {
		json_decref(hist);
		return;
	}
	struct strbuf text, reasoning;
	strbuf_init(&text);
	strbuf_init(&reasoning);
	json_t *calls = json_array();
	for (size_t i = 0; i < f->bl.n; i++) {
		struct fe_block *it = &f->bl.v[i];
		const char *t = it->text.data ? it->text.data : "";
		if (it->type == FE_BLOCK_REASONING)
			strbuf_append(&reasoning, t, it->text.len);
		else if (it->type == FE_BLOCK_TEXT)
			strbuf_append(&text, t, it->text.len);
		else
			json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", it->call_id ? it->call_id : "",
							       "type", "function", "function", "name",
							       jstr(it->name, it->name ? strlen(it->name) : 0), "arguments",
							       jstr(t, it->text.len)));
	}
	json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", jstr(text.data, text.len));
	if (reasoning.len)
		json_object_set_new(m, "reasoning_content", jstr(reasoning.data, reasoning.len));
	if (json_array_size(calls))
		json_object_set(m, "tool_calls", calls);
	json_array_append_new(hist, m);
	json_decref(calls);
	strbuf_free(&text);
	strbuf_free(&reasoning);
	char *h = json_dumps(hist, JSON_COMPACT), *r = json_dumps(resp, JSON_COMPACT);
	json_decref(hist);
	if (h && r && resp_store_put(f->store, f->id, r, strlen(r), h, strlen(h)) == ST_INVALID)
		log_msg(LOG_WARN, "server", "%s: not stored: larger than --responses-store-bytes", f->id);
	free(h);
	free(r);
}

static void fmt_final(void *ctx, struct strbuf *out, const struct oai_usage *u, const char *error)
{
	struct resp_fmt *f = ctx;
	error = fe_blocks_error(&f->bl, error, f->abort_msg);
	const char *status = error ? "failed" : f->incomplete ? "incomplete" : "completed";
	if (f->stream)
		fe_blocks_close(&f->bl, out);
	json_t *r = response_json(f, status, u, error);
	if (!error && f->store_it && f->store)
		store_response(f, r);
	if (f->stream) {
		const char *ev = error ? "response.failed" : f->incomplete ? "response.incomplete" : "response.completed";
		emit(f, out, ev, json_pack("{s:o}", "response", r));
		return;
	}
	if (error) {
		json_decref(r);
		api_error_json(out, 500, NULL, NULL, error);
		return;
	}
	char *s = json_dumps(r, JSON_COMPACT);
	json_decref(r);
	if (s)
		strbuf_puts(out, s);
	free(s);
}

static void fmt_ping(void *ctx, struct strbuf *out)
{
	(void)ctx;
	strbuf_puts(out, ": ping\n\n");
}

static const struct oai_job_format resp_format = {
	.start = fmt_start, .event = fmt_event, .finish = fmt_finish, .final = fmt_final, .ping = fmt_ping,
	.destroy = fmt_destroy,
};

/* ---- routes ---- */

static void route_create(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
			 struct http_stream *hs)
{
	struct oai_server *s = ctx;
	if (!fe_check_ready(api, resp))
		return;
	char *chat = NULL, *history = NULL, *echo = NULL;
	size_t chat_len = 0;
	struct resp_info info;
	struct oai_error why;
	if (resp_translate(req->body, req->body_len, s->resp_store, &chat, &chat_len, &history, &echo, &info, &why)) {
		oai_error_reply(resp, &why);
		return;
	}
	struct oai_request r;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	bool ok = fe_chat_prompt(s, api, chat, chat_len, &r, &ids, &n_ids, resp);
	free(chat);
	if (!ok) {
		free(history);
		free(echo);
		return;
	}
	struct resp_fmt *f = calloc(1, sizeof *f);
	if (f) {
		f->srv = s;
		f->store = s->resp_store;
		f->model = strdup(api_model_name(api));
		f->stream = info.stream;
		f->store_it = info.store;
		f->bl = (struct fe_blocks){.stream = info.stream, .one_tool = info.one_call, .ctx = f,
					   .on_add = block_add, .on_close = block_close};
		f->created = (long)time(NULL);
		f->echo = echo;
		f->history = history;
		echo = history = NULL;
		fe_new_id(s, "resp_", f->id, sizeof f->id);
	}
	if (!f || !f->model) {
		fmt_destroy(f);
		api_error(resp, 500, NULL, NULL, "out of memory");
	} else {
		oai__start_job_fmt(s, &r, ids, n_ids, &resp_format, f, resp, hs);
	}
	free(echo);
	free(history);
	free(ids);
	oai_request_free(&r);
}

static void route_stored(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
			 struct http_stream *hs)
{
	(void)api;
	(void)hs;
	struct oai_server *s = ctx;
	const char *id = req->path + strlen("/v1/responses/");
	if (strchr(id, '/')) {
		api_error(resp, 404, NULL, "not_found", "no route %s %.200s", req->method, req->path);
		return;
	}
	if (!strcmp(req->method, "DELETE")) {
		if (!resp_store_delete(s->resp_store, id)) {
			api_error(resp, 404, "response_id", "not_found", "Response with id '%.200s' not found", id);
			return;
		}
		struct strbuf b;
		strbuf_init(&b);
		strbuf_puts(&b, "{\"id\":");
		strbuf_json_string(&b, id, strlen(id));
		strbuf_puts(&b, ",\"object\":\"response\",\"deleted\":true}");
		api_reply_buf(resp, "application/json", &b);
		return;
	}
	char *body = NULL;
	size_t n = 0;
	enum status st = resp_store_get(s->resp_store, id, &body, &n, NULL, NULL);
	if (st == ST_NOTFOUND)
		api_error(resp, 404, "response_id", "not_found",
			  "Response with id '%.200s' not found (unknown, deleted, evicted from the bounded store, or "
			  "stored by an earlier run of the server)", id);
	else if (st)
		api_error(resp, 500, NULL, NULL, "out of memory");
	else
		http_reply(resp, 200, "application/json", body, n);
}

enum status resp_register(struct oai_server *s, struct api *api)
{
	struct err e = {0};
	size_t bytes = s->opt.responses_store_bytes ? s->opt.responses_store_bytes : RESP_STORE_DEFAULT_BYTES;
	if (resp_store_create(&s->resp_store, bytes, &e))
		return ST_NOMEM;
	if (api_route(api, "POST", "/v1/responses", "/v1/responses", route_create, s) ||
	    api_route(api, "GET", "/v1/responses/*", "/v1/responses/{id}", route_stored, s) ||
	    api_route(api, "DELETE", "/v1/responses/*", "/v1/responses/{id}", route_stored, s))
		return ST_INVALID;
	return ST_OK;
}
