/*
 * server/openai_params_chat.c: the structured values of a chat request:
 * messages (roles, content parts, assistant tool calls), tools, tool_choice,
 * chat_template_kwargs, reasoning_effort and the response formats of
 * structured outputs. Each checks its insides with the table's getters
 * (openai_params_internal.h), so messages read the same everywhere.
 */
#include "openai_params_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- chat messages ---- */

/* Text of content: a string, null, or an array of {"type":"text","text":...} parts joined with "\n". */
static enum status parse_content(struct oai_arena *a, json_t *v, const char **out, struct oai_error *why)
{
	if (!v || json_is_null(v)) {
		*out = NULL;
		return ST_OK;
	}
	if (json_is_string(v))
		return oai__get_str(a, v, "messages.content", out, NULL, false, why);
	if (!json_is_array(v))
		return oai__fail(why, ST_INVALID, "messages.content", "message content must be a string or an array of parts");
	size_t n = json_array_size(v), total = 0;
	if (n > OAI_MAX_CONTENT_PARTS)
		return oai__fail(why, ST_INVALID, "messages.content", "at most %d content parts", OAI_MAX_CONTENT_PARTS);
	for (size_t i = 0; i < n; i++) {
		json_t *p = json_array_get(v, i);
		const char *type = json_string_value(json_object_get(p, "type"));
		if (!json_is_object(p) || !type)
			return oai__fail(why, ST_INVALID, "messages.content", "each content part must be an object with a type");
		if (strcmp(type, "text") && strcmp(type, "input_text"))
			return oai__fail(why, ST_UNSUPPORTED, "messages.content",
				    "content part type '%.40s' is not supported (this model takes text only)", type);
		json_t *t = json_object_get(p, "text");
		if (!json_is_string(t) || strlen(json_string_value(t)) != json_string_length(t))
			return oai__fail(why, ST_INVALID, "messages.content", "a text part needs a string 'text'");
		total += json_string_length(t) + 1;
	}
	char *s = oai__ar_alloc(a, total + 1), *w = s;
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
		return oai__fail(why, ST_INVALID, "messages.tool_calls", "'tool_calls' must be an array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_TOOL_CALLS)
		return oai__fail(why, ST_INVALID, "messages.tool_calls", "at most %d tool calls per message",
			    OAI_MAX_TOOL_CALLS);
	struct model_chat_tool_call *tc = oai__ar_alloc(a, (n ? n : 1) * sizeof *tc);
	if (!tc)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *c = json_array_get(v, i), *f = json_object_get(c, "function");
		memset(&tc[i], 0, sizeof tc[i]);
		const char *type = json_string_value(json_object_get(c, "type"));
		if (!json_is_object(c) || !json_is_object(f) || (type && strcmp(type, "function")))
			return oai__fail(why, ST_INVALID, "messages.tool_calls",
				    "each tool call must be {\"type\":\"function\",\"function\":{...}}");
		json_t *id = json_object_get(c, "id"), *name = json_object_get(f, "name"),
		       *args = json_object_get(f, "arguments");
		if (id && !json_is_null(id) && oai__get_str(a, id, "messages.tool_calls.id", &tc[i].id, NULL, false, why))
			return ST_INVALID;
		if (oai__get_str(a, name, "messages.tool_calls.function.name", &tc[i].name, NULL, false, why))
			return ST_INVALID;
		if (json_is_string(args)) {
			if (oai__get_str(a, args, "messages.tool_calls.function.arguments", &tc[i].arguments_json, NULL,
				    false, why))
				return ST_INVALID;
		} else if (json_is_object(args)) { /* some clients send the object itself */
			char *s = json_dumps(args, JSON_COMPACT);
			if (!s)
				return NOMEM(why);
			tc[i].arguments_json = oai__ar_strndup(a, s, strlen(s));
			free(s);
			if (!tc[i].arguments_json)
				return NOMEM(why);
		} else if (args && !json_is_null(args)) {
			return oai__fail(why, ST_INVALID, "messages.tool_calls.function.arguments",
				    "tool call arguments must be a JSON string");
		} else {
			tc[i].arguments_json = "{}";
		}
	}
	m->tool_calls = tc;
	m->n_tool_calls = n;
	return ST_OK;
}

enum status oai__parse_messages(struct oai_request *r, json_t *v, struct oai_error *why)
{
	if (!json_is_array(v) || json_array_size(v) == 0)
		return oai__fail(why, ST_INVALID, "messages", "'messages' must be a non-empty array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_MESSAGES)
		return oai__fail(why, ST_INVALID, "messages", "at most %d messages, got %zu", OAI_MAX_MESSAGES, n);
	struct model_chat_message *ms = oai__ar_alloc(r->arena, n * sizeof *ms);
	if (!ms)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(v, i);
		struct model_chat_message *o = &ms[i];
		memset(o, 0, sizeof *o);
		if (!json_is_object(m))
			return oai__fail(why, ST_INVALID, "messages", "messages[%zu] must be an object", i);
		const char *role = json_string_value(json_object_get(m, "role"));
		if (!role)
			return oai__fail(why, ST_INVALID, "messages.role", "messages[%zu] needs a string 'role'", i);
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
			return oai__fail(why, ST_INVALID, "messages.role",
				    "messages[%zu]: role '%.40s' is not one of system, developer, user, assistant, tool",
				    i, role);
		if (parse_content(r->arena, json_object_get(m, "content"), &o->content, why))
			return why->status == 500 ? ST_NOMEM : ST_INVALID;
		if (o->role == MODEL_CHAT_ROLE_ASSISTANT) {
			json_t *rc = json_object_get(m, "reasoning_content");
			if (!rc || json_is_null(rc))
				rc = json_object_get(m, "reasoning");
			if (rc && !json_is_null(rc) &&
			    oai__get_str(r->arena, rc, "messages.reasoning_content", &o->reasoning_content, NULL, false, why))
				return ST_INVALID;
			json_t *tc = json_object_get(m, "tool_calls");
			if (tc && parse_tool_calls(r->arena, tc, o, why))
				return ST_INVALID;
			if (!o->content && !o->n_tool_calls && !(i == n - 1 && r->continue_final))
				o->content = "";
		} else if (!o->content) {
			return oai__fail(why, ST_INVALID, "messages.content", "messages[%zu] (%s) needs 'content'", i, role);
		}
		if (o->role == MODEL_CHAT_ROLE_TOOL) {
			json_t *id = json_object_get(m, "tool_call_id");
			if (id && !json_is_null(id) &&
			    oai__get_str(r->arena, id, "messages.tool_call_id", &o->tool_call_id, NULL, false, why))
				return ST_INVALID;
		}
		json_t *name = json_object_get(m, "name");
		if (name && json_is_string(name) &&
		    oai__get_str(r->arena, name, "messages.name", &o->name, NULL, false, why))
			return ST_INVALID;
	}
	r->messages = ms;
	r->n_messages = n;
	return ST_OK;
}

enum status oai__parse_tools(struct oai_request *r, json_t *v, struct oai_error *why)
{
	if (!json_is_array(v))
		return oai__fail(why, ST_INVALID, "tools", "'tools' must be an array");
	size_t n = json_array_size(v);
	if (n > OAI_MAX_TOOLS)
		return oai__fail(why, ST_INVALID, "tools", "at most %d tools, got %zu", OAI_MAX_TOOLS, n);
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(v, i), *f = json_object_get(t, "function");
		const char *type = json_string_value(json_object_get(t, "type"));
		if (!json_is_object(t) || !type || strcmp(type, "function"))
			return oai__fail(why, ST_UNSUPPORTED, "tools", "tools[%zu]: only {\"type\": \"function\"} tools are supported", i);
		if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
			return oai__fail(why, ST_INVALID, "tools", "tools[%zu].function needs a string 'name'", i);
		json_t *p = json_object_get(f, "parameters");
		if (p && !json_is_object(p) && !json_is_null(p))
			return oai__fail(why, ST_INVALID, "tools", "tools[%zu].function.parameters must be an object", i);
	}
	if (n == 0)
		return ST_OK;
	char *s = json_dumps(v, JSON_COMPACT);
	if (!s)
		return NOMEM(why);
	r->tools_json = oai__ar_strndup(r->arena, s, strlen(s));
	free(s);
	if (!r->tools_json)
		return NOMEM(why);
	r->n_tools = n;
	return ST_OK;
}

enum status oai__parse_tool_choice(struct oai_request *r, json_t *v, struct oai_error *why)
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
			return oai__fail(why, ST_INVALID, "tool_choice",
				    "a tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
		r->tool_choice = OAI_TOOL_NAMED;
		r->tool_choice_name = oai__ar_strndup(r->arena, name, strlen(name));
		return r->tool_choice_name ? ST_OK : NOMEM(why);
	}
	return oai__fail(why, ST_INVALID, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object");
}

enum status oai__parse_template_kwargs(struct oai_request *r, json_t *v, bool *thinking_set,
					 struct oai_error *why)
{
	if (!json_is_object(v))
		return oai__fail(why, ST_INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
	const char *k;
	json_t *x;
	json_object_foreach(v, k, x) {
		if (!strcmp(k, "thinking") || !strcmp(k, "enable_thinking")) {
			if (oai__get_bool(x, "chat_template_kwargs.thinking", &r->thinking, why))
				return ST_INVALID;
			*thinking_set = true;
		} else {
			return oai__fail(why, ST_UNSUPPORTED, "chat_template_kwargs",
				    "chat_template_kwargs.%.40s is not supported (known: thinking, enable_thinking)", k);
		}
	}
	return ST_OK;
}

/* Structured outputs: response_format, guided_json, guided_choice, structured_outputs. */
enum status oai__parse_format(struct oai_request *r, const char *param, json_t *v, struct oai_error *why)
{
	json_t *schema = NULL, *choice = NULL;
	if (!strcmp(param, "response_format")) {
		const char *t = json_string_value(json_object_get(v, "type"));
		if (!json_is_object(v) || !t)
			return oai__fail(why, ST_INVALID, param, "'response_format' must be {\"type\": ...}");
		if (!strcmp(t, "text"))
			return ST_OK;
		if (!strcmp(t, "json_object")) {
			r->format = OAI_FORMAT_JSON_OBJECT;
		} else if (!strcmp(t, "json_schema")) {
			schema = json_object_get(json_object_get(v, "json_schema"), "schema");
			if (!json_is_object(schema) && !json_is_boolean(schema))
				return oai__fail(why, ST_INVALID, param, "response_format json_schema needs json_schema.schema");
		} else {
			return oai__fail(why, ST_UNSUPPORTED, param,
				    "response_format type '%.40s' is not supported; \"text\", \"json_object\" or \"json_schema\"", t);
		}
		char *d = json_dumps(v, JSON_COMPACT);
		r->response_format_json = d ? oai__ar_strndup(r->arena, d, strlen(d)) : NULL;
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
			return oai__fail(why, ST_UNSUPPORTED, param, "structured_outputs supports one of 'json' and 'choice'");
	}
	if (json_is_string(schema)) { /* vLLM accepts the schema as a string too */
		json_t *p = json_loads(json_string_value(schema), 0, NULL);
		char *d = p ? json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		json_decref(p);
		r->format_schema = d ? oai__ar_strndup(r->arena, d, strlen(d)) : NULL;
		free(d);
		if (!r->format_schema)
			return oai__fail(why, ST_INVALID, param, "the schema string is not JSON");
		r->format = OAI_FORMAT_JSON_SCHEMA;
	} else if (schema) {
		char *d = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
		r->format_schema = d ? oai__ar_strndup(r->arena, d, strlen(d)) : NULL;
		free(d);
		if (!r->format_schema)
			return NOMEM(why);
		r->format = OAI_FORMAT_JSON_SCHEMA;
	}
	if (choice) {
		size_t n = json_is_array(choice) ? json_array_size(choice) : 0;
		if (!n || n > 4096)
			return oai__fail(why, ST_INVALID, param, "the choice list must be an array of 1..4096 strings");
		const char **c = oai__ar_alloc(r->arena, n * sizeof *c);
		if (!c)
			return NOMEM(why);
		for (size_t i = 0; i < n; i++) {
			json_t *x = json_array_get(choice, i);
			if (!json_is_string(x))
				return oai__fail(why, ST_INVALID, param, "the choice list must be an array of 1..4096 strings");
			if (!(c[i] = oai__ar_strndup(r->arena, json_string_value(x), json_string_length(x))))
				return NOMEM(why);
		}
		r->format_choices = c;
		r->n_format_choices = (uint32_t)n;
		r->format = OAI_FORMAT_CHOICE;
	}
	return ST_OK;
}


enum status oai__reasoning_effort(struct oai_request *r, const char *s, struct oai_error *why)
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
		return oai__fail(why, ST_INVALID, "reasoning_effort",
			    "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max");
	}
	return ST_OK;
}

