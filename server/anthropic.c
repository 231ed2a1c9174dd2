/*
 * server/anthropic.c: the Anthropic Messages API (anthropic.h): the request
 * translated into a chat completions body, the answer written as a Message
 * or as Anthropic's SSE events (message_start, content_block_start / _delta
 * / _stop per block, message_delta, message_stop, ping, error), and
 * /v1/messages/count_tokens.
 *
 * Blocks: the reasoning parser's text is a thinking block, content a text
 * block, each DSML tool call a tool_use block whose input streams as
 * input_json_delta fragments (they concatenate to the JSON object the
 * non-streamed answer carries). Usage follows Anthropic: input_tokens are
 * the prompt tokens not read from the prefix cache, cache_read_input_tokens
 * the ones that were.
 */
#include "anthropic.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "model/output_parser.h"
#include "server/frontend.h"
#include "server/openai_format.h"

/* ---- request translation ---- */

static bool is_type(json_t *blk, const char *t)
{
	const char *s = json_string_value(json_object_get(blk, "type"));
	return s && !strcmp(s, t);
}

static enum status refuse_block(const char *type, const char *where, struct oai_error *why)
{
	if (!strcmp(type, "image") || !strcmp(type, "document"))
		return fe_fail(why, 400, ST_UNSUPPORTED, where,
			    "%s: '%s' content blocks are not supported: this model reads text only", where, type);
	return fe_fail(why, 400, ST_UNSUPPORTED, where, "%s: content block type '%.60s' is not supported", where, type);
}

/* Text of a string or an array of text blocks (joined by "\n"), appended to b. */
static enum status text_of(json_t *v, const char *where, struct strbuf *b, struct oai_error *why)
{
	if (json_is_string(v)) {
		strbuf_append(b, json_string_value(v), json_string_length(v));
		return ST_OK;
	}
	if (!json_is_array(v))
		return fe_fail(why, 400, ST_INVALID, where, "%s must be a string or an array of content blocks", where);
	size_t i;
	json_t *blk;
	bool first = true;
	json_array_foreach(v, i, blk) {
		const char *t = json_string_value(json_object_get(blk, "type"));
		if (!json_is_object(blk) || !t)
			return fe_fail(why, 400, ST_INVALID, where, "%s[%zu] must be a content block with a 'type'", where, i);
		if (strcmp(t, "text"))
			return refuse_block(t, where, why);
		json_t *tx = json_object_get(blk, "text");
		if (!json_is_string(tx))
			return fe_fail(why, 400, ST_INVALID, where, "%s[%zu].text must be a string", where, i);
		if (!first)
			strbuf_puts(b, "\n");
		first = false;
		strbuf_append(b, json_string_value(tx), json_string_length(tx));
	}
	return ST_OK;
}

static int add_text_msg(json_t *msgs, const char *role, struct strbuf *b)
{
	json_t *m = json_pack("{s:s,s:s%}", "role", role, "content", b->data ? b->data : "", b->len);
	strbuf_reset(b);
	return json_array_append_new(msgs, m);
}

static enum status user_message(json_t *msgs, json_t *content, size_t mi, struct oai_error *why)
{
	char where[48];
	snprintf(where, sizeof where, "messages[%zu].content", mi);
	struct strbuf text;
	strbuf_init(&text);
	enum status st = ST_OK;
	if (json_is_string(content)) {
		strbuf_append(&text, json_string_value(content), json_string_length(content));
		add_text_msg(msgs, "user", &text);
		strbuf_free(&text);
		return ST_OK;
	}
	if (!json_is_array(content)) {
		strbuf_free(&text);
		return fe_fail(why, 400, ST_INVALID, where, "%s must be a string or an array of content blocks", where);
	}
	size_t i;
	json_t *blk;
	bool any_text = false, any_result = false;
	json_array_foreach(content, i, blk) {
		const char *t = json_string_value(json_object_get(blk, "type"));
		if (!json_is_object(blk) || !t) {
			st = fe_fail(why, 400, ST_INVALID, where, "%s[%zu] must be a content block with a 'type'", where, i);
			break;
		}
		if (!strcmp(t, "text")) {
			json_t *tx = json_object_get(blk, "text");
			if (!json_is_string(tx)) {
				st = fe_fail(why, 400, ST_INVALID, where, "%s[%zu].text must be a string", where, i);
				break;
			}
			if (any_text)
				strbuf_puts(&text, "\n");
			strbuf_append(&text, json_string_value(tx), json_string_length(tx));
			any_text = true;
		} else if (!strcmp(t, "tool_result")) {
			json_t *id = json_object_get(blk, "tool_use_id");
			if (!json_is_string(id)) {
				st = fe_fail(why, 400, ST_INVALID, where, "%s[%zu].tool_use_id must be a string", where, i);
				break;
			}
			if (any_text) /* text before a result: keep the order */
				add_text_msg(msgs, "user", &text);
			any_text = false;
			struct strbuf r;
			strbuf_init(&r);
			json_t *is_err = json_object_get(blk, "is_error");
			if (json_is_true(is_err))
				strbuf_puts(&r, "Error: ");
			json_t *c = json_object_get(blk, "content");
			if (c && !json_is_null(c) && (st = text_of(c, where, &r, why))) {
				strbuf_free(&r);
				break;
			}
			json_array_append_new(msgs, json_pack("{s:s,s:s,s:s%}", "role", "tool", "tool_call_id",
							      json_string_value(id), "content", r.data ? r.data : "",
							      r.len));
			strbuf_free(&r);
			any_result = true;
		} else {
			st = refuse_block(t, where, why);
			break;
		}
	}
	if (!st && (any_text || !any_result))
		add_text_msg(msgs, "user", &text);
	strbuf_free(&text);
	return st;
}

static enum status assistant_message(json_t *msgs, json_t *content, size_t mi, struct oai_error *why)
{
	char where[48];
	snprintf(where, sizeof where, "messages[%zu].content", mi);
	if (json_is_string(content)) {
		json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", content));
		return ST_OK;
	}
	if (!json_is_array(content))
		return fe_fail(why, 400, ST_INVALID, where, "%s must be a string or an array of content blocks", where);
	struct strbuf text, thinking;
	strbuf_init(&text);
	strbuf_init(&thinking);
	json_t *calls = json_array();
	enum status st = ST_OK;
	size_t i;
	json_t *blk;
	json_array_foreach(content, i, blk) {
		const char *t = json_string_value(json_object_get(blk, "type"));
		if (!json_is_object(blk) || !t) {
			st = fe_fail(why, 400, ST_INVALID, where, "%s[%zu] must be a content block with a 'type'", where, i);
			break;
		}
		if (!strcmp(t, "text") || !strcmp(t, "thinking")) {
			json_t *tx = json_object_get(blk, t);
			if (!json_is_string(tx)) {
				st = fe_fail(why, 400, ST_INVALID, where, "%s[%zu].%s must be a string", where, i, t);
				break;
			}
			strbuf_append(t[1] == 'e' ? &text : &thinking, json_string_value(tx), json_string_length(tx));
		} else if (!strcmp(t, "redacted_thinking")) {
			continue; /* opaque to us: nothing to render */
		} else if (!strcmp(t, "tool_use")) {
			json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
			json_t *input = json_object_get(blk, "input");
			if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
				st = fe_fail(why, 400, ST_INVALID, where,
					  "%s[%zu]: a tool_use block needs 'id', 'name' and an object 'input'", where, i);
				break;
			}
			char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
			if (!args) {
				st = fe_fail(why, 400, ST_NOMEM, where, "out of memory");
				break;
			}
			json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", id, "type", "function",
							       "function", "name", name, "arguments", args));
			free(args);
		} else {
			st = refuse_block(t, where, why);
			break;
		}
	}
	if (!st) {
		json_t *m = json_pack("{s:s,s:s%}", "role", "assistant", "content", text.data ? text.data : "", text.len);
		if (thinking.len)
			json_object_set_new(m, "reasoning_content", json_stringn(thinking.data, thinking.len));
		if (json_array_size(calls))
			json_object_set(m, "tool_calls", calls);
		json_array_append_new(msgs, m);
	}
	json_decref(calls);
	strbuf_free(&text);
	strbuf_free(&thinking);
	return st;
}

/* A system message inside messages (Claude Code sends its environment block
 * this way): a system turn where it stands. */
static enum status system_message(json_t *msgs, json_t *content, size_t mi, struct oai_error *why)
{
	char where[48];
	snprintf(where, sizeof where, "messages[%zu].content", mi);
	struct strbuf b;
	strbuf_init(&b);
	enum status st = text_of(content, where, &b, why);
	if (!st)
		add_text_msg(msgs, "system", &b);
	strbuf_free(&b);
	return st;
}

/* One of tools: a client tool with an input_schema (server tools refused). */
static enum status one_tool(json_t *t, size_t i, json_t **out, struct oai_error *why)
{
	const char *type = json_string_value(json_object_get(t, "type"));
	json_t *name = json_object_get(t, "name");
	if (!json_is_object(t) || !json_is_string(name))
		return fe_fail(why, 400, ST_INVALID, "tools", "tools[%zu] must be an object with a 'name'", i);
	if (type && strcmp(type, "custom"))
		return fe_fail(why, 400, ST_UNSUPPORTED, "tools",
			       "tools[%zu]: server tool type '%.60s' is not supported (only client tools with an "
			       "input_schema)", i, type);
	json_t *schema = json_object_get(t, "input_schema");
	if (schema && !json_is_object(schema))
		return fe_fail(why, 400, ST_INVALID, "tools", "tools[%zu].input_schema must be an object", i);
	*out = fe_chat_tool(name, json_object_get(t, "description"), schema);
	return ST_OK;
}

/*
 * tool_choice: auto and none map to the chat values; any -> "required" and
 * tool -> {"type":"function","function":{"name"}}, which the chat parser
 * takes to its constrained decoding (the structured-outputs machinery) or
 * refuses with a 400 while it has none.
 * disable_parallel_tool_use: the answer keeps its first tool call only (the
 * model may write more; they are dropped).
 */
static enum status translate_tool_choice(json_t *v, json_t *out, struct anth_info *info, struct oai_error *why)
{
	const char *t = json_string_value(json_object_get(v, "type"));
	if (!json_is_object(v) || !t)
		return fe_fail(why, 400, ST_INVALID, "tool_choice", "'tool_choice' must be an object with a 'type'");
	info->one_tool = json_is_true(json_object_get(v, "disable_parallel_tool_use"));
	if (!strcmp(t, "auto") || !strcmp(t, "none")) {
		json_object_set_new(out, "tool_choice", json_string(t));
	} else if (!strcmp(t, "any")) {
		json_object_set_new(out, "tool_choice", json_string("required"));
	} else if (!strcmp(t, "tool")) {
		json_t *name = json_object_get(v, "name");
		if (!json_is_string(name))
			return fe_fail(why, 400, ST_INVALID, "tool_choice", "tool_choice type 'tool' needs a 'name'");
		json_object_set_new(out, "tool_choice",
				    json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name));
	} else {
		return fe_fail(why, 400, ST_INVALID, "tool_choice", "unknown tool_choice type '%.40s'", t);
	}
	return ST_OK;
}

/* thinking: enabled / adaptive / disabled (budget_tokens is accepted; the
 * model ends its reasoning itself); display "omitted" keeps the thinking
 * block and drops its text. */
static enum status translate_thinking(json_t *v, json_t *o, struct anth_info *info, struct oai_error *why)
{
	const char *t = json_string_value(json_object_get(v, "type"));
	if (!json_is_object(v) || !t || (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "disabled")))
		return fe_fail(why, 400, ST_INVALID, "thinking",
			       "'thinking' must be {\"type\": \"enabled\" | \"adaptive\" | \"disabled\"}");
	bool on = strcmp(t, "disabled") != 0;
	json_object_set_new(o, "thinking", json_pack("{s:s}", "type", on ? "enabled" : "disabled"));
	const char *disp = json_string_value(json_object_get(v, "display"));
	info->omit_thinking = on && disp && !strcmp(disp, "omitted");
	return ST_OK;
}

/* output_config: effort is accepted with no effect; format, a JSON schema,
 * becomes response_format (HOOK(structured): constrained by the chat
 * parser's response_format). */
static enum status translate_output_config(json_t *v, json_t *o, struct oai_error *why)
{
	if (!json_is_object(v))
		return fe_fail(why, 400, ST_INVALID, "output_config", "'output_config' must be an object");
	json_t *f = json_object_get(v, "format");
	if (!f || json_is_null(f))
		return ST_OK;
	json_t *schema = json_object_get(f, "schema");
	if (!is_type(f, "json_schema") || !json_is_object(schema))
		return fe_fail(why, 400, ST_INVALID, "output_config.format",
			       "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
	json_object_set_new(o, "response_format",
			    json_pack("{s:s,s:{s:s,s:O,s:b}}", "type", "json_schema", "json_schema", "name", "output",
				      "schema", schema, "strict", 1));
	return ST_OK;
}

/* One top-level key of the body into the chat body o. messages and system
 * are translated apart; metadata, cache_control, context_management,
 * service_tier, container and other (beta) fields change nothing here and
 * are accepted. */
static enum status translate_key(const char *k, json_t *v, bool count_tokens, json_t *o, struct anth_info *info,
				 struct oai_error *why)
{
	if (!strcmp(k, "model") || !strcmp(k, "temperature") || !strcmp(k, "top_p") || !strcmp(k, "top_k")) {
		json_object_set(o, k, v);
	} else if (!strcmp(k, "max_tokens")) {
		if (count_tokens)
			return ST_OK;
		if (!json_is_integer(v) || json_integer_value(v) < 1)
			return fe_fail(why, 400, ST_INVALID, k, "'max_tokens' must be an integer >= 1");
		json_object_set(o, k, v);
	} else if (!strcmp(k, "stream")) {
		if (!json_is_boolean(v))
			return fe_fail(why, 400, ST_INVALID, k, "'stream' must be a boolean");
		info->stream = json_is_true(v) && !count_tokens;
		if (!count_tokens)
			json_object_set(o, k, v);
	} else if (!strcmp(k, "stop_sequences")) {
		json_object_set(o, "stop", v);
	} else if (!strcmp(k, "tools")) {
		return fe_translate_tools(v, o, one_tool, why);
	} else if (!strcmp(k, "tool_choice")) {
		return translate_tool_choice(v, o, info, why);
	} else if (!strcmp(k, "thinking")) {
		return translate_thinking(v, o, info, why);
	} else if (!strcmp(k, "output_config")) {
		return translate_output_config(v, o, why);
	} else if (!strcmp(k, "mcp_servers")) {
		if (!json_is_array(v) || json_array_size(v))
			return fe_fail(why, 400, ST_UNSUPPORTED, k, "'mcp_servers' (server-side MCP) is not supported");
	}
	return ST_OK;
}

/* Each turn of messages (a non-empty array), in order, into msgs. */
static enum status translate_messages(json_t *messages, json_t *msgs, struct oai_error *why)
{
	if (json_array_size(messages) > OAI_MAX_MESSAGES)
		return fe_fail(why, 400, ST_INVALID, "messages", "too many messages (at most %d)", OAI_MAX_MESSAGES);
	size_t i;
	json_t *m;
	json_array_foreach(messages, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		json_t *content = json_object_get(m, "content");
		enum status st;
		if (!json_is_object(m) || !role || !content)
			return fe_fail(why, 400, ST_INVALID, "messages", "messages[%zu] needs a 'role' and 'content'", i);
		if (!strcmp(role, "user"))
			st = user_message(msgs, content, i, why);
		else if (!strcmp(role, "assistant"))
			st = assistant_message(msgs, content, i, why);
		else if (!strcmp(role, "system"))
			st = system_message(msgs, content, i, why);
		else
			st = fe_fail(why, 400, ST_INVALID, "messages",
				     "messages[%zu].role must be \"user\", \"assistant\" or \"system\"", i);
		if (st)
			return st;
	}
	return ST_OK;
}

enum status anth_translate(const char *body, size_t len, bool count_tokens, char **out, size_t *out_len,
			   struct anth_info *info, struct oai_error *why)
{
	memset(why, 0, sizeof *why);
	memset(info, 0, sizeof *info);
	*out = NULL;
	*out_len = 0;
	json_t *root = NULL, *o = json_object(), *msgs = json_array();
	enum status st = fe_parse_body(body, len, &root, why);
	if (st)
		goto done;
	json_t *system = json_object_get(root, "system");
	if (system && !json_is_null(system)) {
		struct strbuf b;
		strbuf_init(&b);
		if (!(st = text_of(system, "system", &b, why)))
			json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "system", "content",
							      b.data ? b.data : "", b.len));
		strbuf_free(&b);
		if (st)
			goto done;
	}
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v)
		if (!json_is_null(v) && (st = translate_key(k, v, count_tokens, o, info, why)))
			goto done;
	json_t *messages = json_object_get(root, "messages");
	if (!json_is_array(messages) || !json_array_size(messages)) {
		st = fe_fail(why, 400, ST_INVALID, "messages", "'messages' must be a non-empty array");
		goto done;
	}
	if (!count_tokens && !json_object_get(o, "max_tokens")) {
		st = fe_fail(why, 400, ST_INVALID, "max_tokens", "'max_tokens' is required");
		goto done;
	}
	if ((st = translate_messages(messages, msgs, why)))
		goto done;
	/* A final assistant message is a prefill: the answer continues it. */
	json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
	if (!strcmp(json_string_value(json_object_get(last, "role")), "assistant") &&
	    !json_object_get(last, "tool_calls"))
		json_object_set_new(o, "continue_final_message", json_true()),
			json_object_set_new(o, "add_generation_prompt", json_false());
	json_object_set(o, "messages", msgs);
	*out = json_dumps(o, JSON_COMPACT);
	if (!*out)
		st = fe_fail(why, 400, ST_NOMEM, "", "out of memory");
	else
		*out_len = strlen(*out);
done:
	json_decref(msgs);
	json_decref(o);
	json_decref(root);
	return st;
}

/* ---- the answer ---- */

struct anth_fmt {
	char id[48];
	char *model;
	bool stream;
	struct fe_blocks bl; /* thinking, text and tool_use blocks */
	char **stop;         /* the stop sequences, for stop_sequence */
	uint32_t n_stop;
	const char *stop_reason;
	const char *stop_seq;
	const char *abort_msg;
	uint32_t n_prompt;
};

static void fmt_destroy(void *ctx)
{
	struct anth_fmt *f = ctx;
	if (!f)
		return;
	fe_blocks_free(&f->bl);
	for (uint32_t i = 0; i < f->n_stop; i++)
		free(f->stop[i]);
	free(f->stop);
	free(f->model);
	free(f);
}

static void emit(struct strbuf *out, const char *name, struct strbuf *json)
{
	fe_sse_event(out, name, json->data ? json->data : "{}", json->len);
	strbuf_reset(json);
}

/* fe_blocks on_close: a thinking block's signature, then content_block_stop. */
static void block_close(void *ctx, struct strbuf *out, size_t idx)
{
	struct anth_fmt *f = ctx;
	struct strbuf j;
	strbuf_init(&j);
	if (f->bl.v[idx].type == FE_BLOCK_REASONING) {
		strbuf_printf(&j, "{\"type\":\"content_block_delta\",\"index\":%zu,\"delta\":{\"type\":\"signature_delta\","
				  "\"signature\":\"dsv4\"}}", idx);
		emit(out, "content_block_delta", &j);
	}
	strbuf_printf(&j, "{\"type\":\"content_block_stop\",\"index\":%zu}", idx);
	emit(out, "content_block_stop", &j);
	strbuf_free(&j);
}

/* fe_blocks on_add: content_block_start, when streaming. */
static void block_add(void *ctx, struct strbuf *out, size_t idx)
{
	struct anth_fmt *f = ctx;
	if (!f->stream)
		return;
	const struct fe_block *b = &f->bl.v[idx];
	struct strbuf j;
	strbuf_init(&j);
	strbuf_printf(&j, "{\"type\":\"content_block_start\",\"index\":%zu,\"content_block\":", idx);
	if (b->type == FE_BLOCK_REASONING) {
		strbuf_puts(&j, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}");
	} else if (b->type == FE_BLOCK_TEXT) {
		strbuf_puts(&j, "{\"type\":\"text\",\"text\":\"\"}}");
	} else {
		strbuf_puts(&j, "{\"type\":\"tool_use\",\"id\":");
		oai_json_text(&j, b->call_id ? b->call_id : "", b->call_id ? strlen(b->call_id) : 0);
		strbuf_puts(&j, ",\"name\":");
		oai_json_text(&j, b->name ? b->name : "", b->name ? strlen(b->name) : 0);
		strbuf_puts(&j, ",\"input\":{}}}");
	}
	emit(out, "content_block_start", &j);
	strbuf_free(&j);
}

static void fmt_start(void *ctx, struct strbuf *out, uint32_t n_prompt)
{
	struct anth_fmt *f = ctx;
	f->n_prompt = n_prompt;
	if (!f->stream)
		return;
	struct strbuf j;
	strbuf_init(&j);
	strbuf_puts(&j, "{\"type\":\"message_start\",\"message\":{\"id\":");
	strbuf_json_string(&j, f->id, strlen(f->id));
	strbuf_puts(&j, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
	strbuf_json_string(&j, f->model, strlen(f->model));
	strbuf_printf(&j, ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%u,"
			  "\"output_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0}}}",
		      n_prompt);
	emit(out, "message_start", &j);
	strbuf_puts(&j, "{\"type\":\"ping\"}");
	emit(out, "ping", &j);
	strbuf_free(&j);
}

static void fmt_event(void *ctx, struct strbuf *out, const struct model_oparse_event *ev)
{
	/* per block type: the delta's type and its text field */
	static const char *const delta[][2] = {
		[FE_BLOCK_REASONING] = {"thinking_delta", "thinking"},
		[FE_BLOCK_TEXT] = {"text_delta", "text"},
		[FE_BLOCK_TOOL] = {"input_json_delta", "partial_json"},
	};
	struct anth_fmt *f = ctx;
	struct fe_block *b = fe_blocks_event(&f->bl, out, ev);
	if (!b || !f->stream)
		return;
	struct strbuf j;
	strbuf_init(&j);
	strbuf_printf(&j, "{\"type\":\"content_block_delta\",\"index\":%zu,\"delta\":{\"type\":\"%s\",\"%s\":",
		      f->bl.n - 1, delta[b->type][0], delta[b->type][1]);
	oai_json_text(&j, ev->text, ev->len);
	strbuf_puts(&j, "}}");
	emit(out, "content_block_delta", &j);
	strbuf_free(&j);
}

static void fmt_finish(void *ctx, struct strbuf *out, const struct sched_event *ev)
{
	(void)out;
	struct anth_fmt *f = ctx;
	bool tools = false;
	for (size_t i = 0; i < f->bl.n; i++)
		tools |= f->bl.v[i].type == FE_BLOCK_TOOL;
	switch (ev->finish) {
	case SCHED_FINISH_STOP:
		if (tools) {
			f->stop_reason = "tool_use";
		} else if (ev->stop_string_index >= 0 && (uint32_t)ev->stop_string_index < f->n_stop) {
			f->stop_reason = "stop_sequence";
			f->stop_seq = f->stop[ev->stop_string_index];
		} else {
			f->stop_reason = "end_turn";
		}
		break;
	case SCHED_FINISH_LENGTH:
		f->stop_reason = "max_tokens";
		break;
	default:
		f->abort_msg = fe_abort_message(ev->finish);
		break;
	}
}

static void usage_json(struct strbuf *j, const struct oai_usage *u)
{
	uint64_t cached = u->cached_tokens <= u->prompt_tokens ? u->cached_tokens : u->prompt_tokens;
	strbuf_printf(j, "{\"input_tokens\":%llu,\"output_tokens\":%llu,\"cache_creation_input_tokens\":0,"
			 "\"cache_read_input_tokens\":%llu}",
		      (unsigned long long)(u->prompt_tokens - cached), (unsigned long long)u->completion_tokens,
		      (unsigned long long)cached);
}

static void error_json(struct strbuf *j, const char *type, const char *msg)
{
	strbuf_printf(j, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", type);
	strbuf_json_string(j, msg, strlen(msg));
	strbuf_puts(j, "}}");
}

static void fmt_final(void *ctx, struct strbuf *out, const struct oai_usage *u, const char *error)
{
	struct anth_fmt *f = ctx;
	error = fe_blocks_error(&f->bl, error, f->abort_msg);
	struct strbuf j;
	strbuf_init(&j);
	if (f->stream) {
		fe_blocks_close(&f->bl, out);
		if (error) {
			error_json(&j, f->abort_msg && !strcmp(error, f->abort_msg) ? "overloaded_error" : "api_error", error);
			emit(out, "error", &j);
		} else {
			strbuf_printf(&j, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":",
				      f->stop_reason ? f->stop_reason : "end_turn");
			if (f->stop_seq)
				oai_json_text(&j, f->stop_seq, strlen(f->stop_seq));
			else
				strbuf_puts(&j, "null");
			strbuf_puts(&j, "},\"usage\":");
			usage_json(&j, u);
			strbuf_puts(&j, "}");
			emit(out, "message_delta", &j);
			strbuf_puts(&j, "{\"type\":\"message_stop\"}");
			emit(out, "message_stop", &j);
		}
		strbuf_free(&j);
		return;
	}
	strbuf_free(&j);
	if (error) {
		error_json(out, "api_error", error);
		return;
	}
	strbuf_puts(out, "{\"id\":");
	strbuf_json_string(out, f->id, strlen(f->id));
	strbuf_puts(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
	strbuf_json_string(out, f->model, strlen(f->model));
	strbuf_puts(out, ",\"content\":[");
	for (size_t i = 0; i < f->bl.n; i++) {
		struct fe_block *b = &f->bl.v[i];
		const char *t = b->text.data ? b->text.data : "";
		if (i)
			strbuf_puts(out, ",");
		if (b->type == FE_BLOCK_REASONING) {
			strbuf_puts(out, "{\"type\":\"thinking\",\"thinking\":");
			oai_json_text(out, t, b->text.len);
			strbuf_puts(out, ",\"signature\":\"dsv4\"}");
		} else if (b->type == FE_BLOCK_TEXT) {
			strbuf_puts(out, "{\"type\":\"text\",\"text\":");
			oai_json_text(out, t, b->text.len);
			strbuf_puts(out, "}");
		} else {
			strbuf_puts(out, "{\"type\":\"tool_use\",\"id\":");
			oai_json_text(out, b->call_id ? b->call_id : "", b->call_id ? strlen(b->call_id) : 0);
			strbuf_puts(out, ",\"name\":");
			oai_json_text(out, b->name ? b->name : "", b->name ? strlen(b->name) : 0);
			strbuf_puts(out, ",\"input\":");
			/* the parser closes every call's arguments as a JSON object */
			json_t *in = json_loadb(t, b->text.len, 0, NULL);
			if (json_is_object(in))
				strbuf_append(out, t, b->text.len);
			else
				strbuf_puts(out, "{}");
			json_decref(in);
			strbuf_puts(out, "}");
		}
	}
	strbuf_printf(out, "],\"stop_reason\":\"%s\",\"stop_sequence\":", f->stop_reason ? f->stop_reason : "end_turn");
	if (f->stop_seq)
		oai_json_text(out, f->stop_seq, strlen(f->stop_seq));
	else
		strbuf_puts(out, "null");
	strbuf_puts(out, ",\"usage\":");
	usage_json(out, u);
	strbuf_puts(out, "}");
}

static void fmt_ping(void *ctx, struct strbuf *out)
{
	(void)ctx;
	fe_sse_event(out, "ping", "{\"type\":\"ping\"}", 15);
}

static const struct oai_job_format anth_format = {
	.start = fmt_start, .event = fmt_event, .finish = fmt_finish, .final = fmt_final, .ping = fmt_ping,
	.destroy = fmt_destroy,
};

/* ---- routes ---- */

/* The request translated, parsed and tokenized: false when resp holds
 * the refusal. */
static bool messages_prompt(struct oai_server *s, struct api *api, const struct http_request *req, bool count_tokens,
			    struct anth_info *info, struct oai_request *r, int32_t **ids, size_t *n_ids,
			    struct http_response *resp)
{
	char *chat = NULL;
	size_t chat_len = 0;
	struct oai_error why;
	if (anth_translate(req->body, req->body_len, count_tokens, &chat, &chat_len, info, &why)) {
		oai_error_reply(resp, &why);
		return false;
	}
	bool ok = fe_chat_prompt(s, api, chat, chat_len, r, ids, n_ids, resp);
	free(chat);
	return ok;
}

static void route_messages(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
			   struct http_stream *hs)
{
	struct oai_server *s = ctx;
	if (!fe_check_ready(api, resp))
		return;
	struct anth_info info;
	struct oai_request r;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	if (!messages_prompt(s, api, req, false, &info, &r, &ids, &n_ids, resp))
		return;
	struct anth_fmt *f = calloc(1, sizeof *f);
	if (f) {
		f->model = strdup(api_model_name(api));
		f->stream = info.stream;
		f->bl = (struct fe_blocks){.stream = info.stream, .one_tool = info.one_tool,
					   .omit_reasoning = info.omit_thinking, .ctx = f, .on_add = block_add,
					   .on_close = block_close};
		f->stop = calloc(r.n_stop ? r.n_stop : 1, sizeof *f->stop);
		for (uint32_t i = 0; f->stop && i < r.n_stop; i++)
			f->stop[f->n_stop++] = strdup(r.stop[i]);
		fe_new_id(s, "msg_", f->id, sizeof f->id);
	}
	if (!f || !f->model || !f->stop) {
		fmt_destroy(f);
		api_error(resp, 500, NULL, NULL, "out of memory");
	} else {
		oai__start_job_fmt(s, &r, ids, n_ids, &anth_format, f, resp, hs);
	}
	free(ids);
	oai_request_free(&r);
}

static void route_count_tokens(void *ctx, struct api *api, const struct http_request *req,
			       struct http_response *resp, struct http_stream *hs)
{
	(void)hs;
	struct oai_server *s = ctx;
	struct anth_info info;
	struct oai_request r;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	if (!messages_prompt(s, api, req, true, &info, &r, &ids, &n_ids, resp))
		return;
	free(ids);
	oai_request_free(&r);
	char body[64];
	snprintf(body, sizeof body, "{\"input_tokens\":%zu}", n_ids);
	http_reply_copy(resp, 200, "application/json", body);
}

enum status anth_register(struct oai_server *s, struct api *api)
{
	if (api_route(api, "POST", "/v1/messages", "/v1/messages", route_messages, s) ||
	    api_route(api, "POST", "/v1/messages/count_tokens", "/v1/messages/count_tokens", route_count_tokens, s))
		return ST_INVALID;
	return ST_OK;
}

void anth_error_reshape(struct http_response *resp)
{
	if (resp->status < 400 || resp->stream.read || !resp->body)
		return;
	json_t *root = json_loadb(resp->body, resp->body_len, 0, NULL);
	json_t *err = json_object_get(root, "error");
	const char *msg = json_string_value(json_object_get(err, "message"));
	if (!msg || json_object_get(root, "type")) {
		json_decref(root);
		return;
	}
	struct strbuf b;
	strbuf_init(&b);
	error_json(&b, fe_anthropic_error_type(resp->status), msg);
	json_decref(root);
	size_t n;
	char *body = strbuf_take(&b, &n);
	if (!body)
		return;
	free(resp->body);
	resp->body = body;
	resp->body_len = n;
}
