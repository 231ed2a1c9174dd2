/*
 * server/anthropic.h: the Anthropic Messages API (what Claude Code speaks):
 * POST /v1/messages and POST /v1/messages/count_tokens, a front-end over
 * the chat engine (server/frontend.h).
 *
 * anth_translate() turns a Messages body into an OpenAI chat completions
 * body (system -> a system message, content blocks -> messages, tool_use ->
 * tool_calls, tool_result -> tool messages, tools' input_schema ->
 * parameters, tool_choice, thinking, stop_sequences); the answer is written
 * in Anthropic's shapes by a job format. Errors on /v1/messages paths are
 * Anthropic-shaped ({"type":"error","error":{"type","message"}}):
 * anth_error_reshape() rewrites any error reply (api.c calls it for those
 * paths, so authentication and routing errors get the shape too).
 */
#ifndef DSV4_SERVER_ANTHROPIC_H
#define DSV4_SERVER_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "server/http.h"
#include "server/openai_params.h"

struct oai_server;
struct api;

/* What the translation keeps beside the chat body. */
struct anth_info {
	bool stream;
	bool omit_thinking; /* thinking.display "omitted": thinking blocks without their text */
	bool one_tool;      /* tool_choice.disable_parallel_tool_use: at most one tool_use block */
};

/* body -> a malloc'd OpenAI chat completions JSON body in *out (length
 * *out_len). count_tokens: the /count_tokens form (no max_tokens needed,
 * no stream). On failure fills *why (status 400) and returns ST_INVALID /
 * ST_UNSUPPORTED / ST_NOMEM; *out is NULL then. Pure: no server needed
 * (tests and fuzz targets call it). */
enum status anth_translate(const char *body, size_t len, bool count_tokens, char **out, size_t *out_len,
			   struct anth_info *info, struct oai_error *why) DSV4_WUR;

/* Register the routes on the server's api. */
enum status anth_register(struct oai_server *s, struct api *api) DSV4_WUR;

/* Rewrite an error reply's OpenAI-shaped body ({"error":{"message",...}})
 * into Anthropic's shape, the status kept. Replies that are not errors or
 * are streams are left alone. */
void anth_error_reshape(struct http_response *resp);

#endif
