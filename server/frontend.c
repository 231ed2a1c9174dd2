/*
 * server/frontend.c: the steps every front-end over the chat engine shares
 * (frontend.h): readiness, the translated chat body parsed, its model
 * checked, rendered and tokenized; ids; SSE events with names; the request
 * translation's refusals, body and tools.
 */
#include "frontend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/chat.h"

bool fe_check_ready(struct api *api, struct http_response *resp)
{
	enum api_state st = api_get_state(api);
	if (st == API_READY)
		return true;
	api_error(resp, 503, NULL, st == API_DRAINING ? "draining" : "unavailable",
		  "the server is %s", st == API_DRAINING ? "shutting down" : st == API_LOADING ? "loading" : "unhealthy");
	return false;
}

bool fe_chat_prompt(struct oai_server *s, struct api *api, const char *json, size_t len, struct oai_request *r,
		    int32_t **ids, size_t *n_ids, struct http_response *resp)
{
	struct oai_error why;
	*ids = NULL;
	*n_ids = 0;
	if (oai_parse_request(OAI_CHAT, json, len, s->opt.vocab_size, r, &why)) {
		oai_error_reply(resp, &why);
		return false;
	}
	if (r->model && strcmp(r->model, api_model_name(api))) {
		api_error(resp, 404, NULL, "model_not_found",
			  "The model '%.200s' does not exist (this server serves '%s')", r->model, api_model_name(api));
		oai_request_free(r);
		return false;
	}
	struct model_chat_options co;
	oai_chat_options(r, &co);
	char *prompt = NULL;
	size_t plen = 0;
	struct err e = {0};
	enum status st = model_chat_encode(r->messages, r->n_messages, &co, &prompt, &plen, &e);
	if (!st)
		st = model_tokenizer_encode_alloc(s->opt.tok, prompt, plen, MODEL_TOK_ADDED_ALL, ids, n_ids, &e);
	free(prompt);
	if (st) {
		api_error(resp, st == ST_INVALID || st == ST_UNSUPPORTED ? 400 : 500, "messages",
			  st == ST_INVALID || st == ST_UNSUPPORTED ? "invalid_value" : NULL, "%s", e.msg);
		oai_request_free(r);
		free(*ids);
		*ids = NULL;
		return false;
	}
	return true;
}

void fe_new_id(struct oai_server *s, const char *prefix, char *out, size_t cap)
{
	uint64_t n = atomic_fetch_add(&s->next_id, 1);
	uint64_t h = (n + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
	h ^= h >> 31;
	snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)(h ^ (uint64_t)time(NULL)),
		 (unsigned long long)(n & 0xffffffffu));
}

void fe_sse_event(struct strbuf *out, const char *name, const char *json, size_t len)
{
	strbuf_printf(out, "event: %s\ndata: ", name);
	strbuf_append(out, json, len);
	strbuf_puts(out, "\n\n");
}

const char *fe_anthropic_error_type(int status)
{
	switch (status) {
	case 401:
		return "authentication_error";
	case 403:
		return "permission_error";
	case 404:
		return "not_found_error";
	case 413:
		return "request_too_large";
	case 429:
		return "rate_limit_error";
	case 503:
	case 529:
		return "overloaded_error";
	default:
		return status >= 500 ? "api_error" : "invalid_request_error";
	}
}

enum status fe_fail(struct oai_error *why, int status, enum status st, const char *param, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	oai_error_vset(why, status, st, param, fmt, ap);
	va_end(ap);
	return st;
}

enum status fe_parse_body(const char *body, size_t len, json_t **root, struct oai_error *why)
{
	json_error_t je;
	*root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!*root)
		return fe_fail(why, 400, ST_INVALID, "", "request body is not valid JSON: %s (line %d, column %d)", je.text,
			       je.line, je.column);
	if (!json_is_object(*root))
		return fe_fail(why, 400, ST_INVALID, "", "request body must be a JSON object");
	return ST_OK;
}

json_t *fe_chat_tool(json_t *name, json_t *description, json_t *parameters)
{
	json_t *fn = json_pack("{s:O}", "name", name);
	if (json_is_string(description))
		json_object_set(fn, "description", description);
	json_object_set_new(fn, "parameters",
			    json_is_object(parameters) ? json_incref(parameters) : json_pack("{s:s}", "type", "object"));
	return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}

enum status fe_translate_tools(json_t *tools, json_t *o,
			       enum status (*one)(json_t *tool, size_t i, json_t **out, struct oai_error *why),
			       struct oai_error *why)
{
	if (!json_is_array(tools))
		return fe_fail(why, 400, ST_INVALID, "tools", "'tools' must be an array");
	json_t *arr = json_array();
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t) {
		json_t *tool = NULL;
		enum status st = one(t, i, &tool, why);
		if (st) {
			json_decref(arr);
			return st;
		}
		json_array_append_new(arr, tool);
	}
	json_object_set_new(o, "tools", arr);
	return ST_OK;
}
