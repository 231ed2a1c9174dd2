/*
 * server/openai_structured.c: structured outputs for the OpenAI routes: the
 * grammar a request's response_format / guided_* / structured_outputs /
 * tool_choice asks for (model/gram.h), compiled on the HTTP thread before
 * the request is submitted. A schema that cannot be compiled is a 400 naming
 * what is unsupported; with tool_choice "auto" a tool list that cannot be
 * compiled leaves the request unconstrained instead (as before).
 */
#include <string.h>

#include "common/log.h"
#include "model/gram.h"
#include "server/api.h"
#include "server/openai_internal.h"

/* Calls one DSML block may hold when parallel calls are allowed. */
#define OAI_GRAM_MAX_CALLS 8

bool oai__grammar(const struct oai_server *s, const struct oai_request *r, struct gram **out,
		  struct http_response *resp)
{
	*out = NULL;
	if (!s->gvocab)
		return true;
	struct err e = {0};
	enum status st = ST_OK;
	const char *param = "response_format";
	bool tools = r->kind == OAI_CHAT && r->tools_json && r->tool_choice != OAI_TOOL_NONE;
	if (r->format == OAI_FORMAT_JSON_OBJECT) {
		st = gram_compile_json_object(out, &e);
	} else if (r->format == OAI_FORMAT_JSON_SCHEMA) {
		st = gram_compile_json_schema(out, r->format_schema, strlen(r->format_schema), &e);
	} else if (r->format == OAI_FORMAT_CHOICE) {
		st = gram_compile_choice(out, r->format_choices, r->n_format_choices, &e);
	} else if (tools) {
		param = "tool_choice";
		bool forced = r->tool_choice == OAI_TOOL_REQUIRED || r->tool_choice == OAI_TOOL_NAMED;
		st = gram_compile_tool_calls(out, r->tools_json, strlen(r->tools_json),
					     forced ? GRAM_TOOLS_REQUIRED : GRAM_TOOLS_AUTO,
					     r->tool_choice == OAI_TOOL_NAMED ? r->tool_choice_name : NULL,
					     OAI_GRAM_MAX_CALLS, forced && r->thinking && !r->continue_final, &e);
		if (st && !forced) {
			log_msg(LOG_INFO, "openai", "tool-call block left unconstrained: %s", e.msg);
			return true;
		}
		if (st)
			param = r->tool_choice == OAI_TOOL_NAMED && strstr(e.msg, "not in tools") ? "tool_choice" : "tools";
	}
	if (st == ST_NOMEM) {
		api_error(resp, 500, NULL, NULL, "out of memory compiling the grammar");
		return false;
	}
	if (st) {
		api_error(resp, 400, param, "invalid_value", "%s", e.msg);
		return false;
	}
	return true;
}
