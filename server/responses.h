/*
 * server/responses.h: the OpenAI Responses API (what the OpenAI Agents SDK
 * and Codex-style clients speak): POST /v1/responses, GET and DELETE
 * /v1/responses/{id}, a front-end over the chat engine (server/frontend.h).
 *
 * resp_translate() turns a Responses body into an OpenAI chat completions
 * body: instructions -> a system message, input items (message,
 * function_call, function_call_output, reasoning) -> messages, function
 * tools, tool_choice, max_output_tokens, reasoning.effort, text.format ->
 * response_format; previous_response_id puts the stored conversation in
 * front. The answer (output items reasoning / message / function_call, or
 * the typed SSE events with sequence_number) is written by a job format;
 * answers with "store" (the default) are kept in the bounded store
 * (responses_store.h) for GET, DELETE and previous_response_id.
 */
#ifndef DSV4_SERVER_RESPONSES_H
#define DSV4_SERVER_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "server/openai_params.h"
#include "server/responses_store.h"

struct oai_server;
struct api;

/* Default bytes of the store (--responses-store-bytes). */
#define RESP_STORE_DEFAULT_BYTES ((size_t)64 << 20)

struct resp_info {
	bool stream;
	bool store;                 /* default true */
	char previous_id[128];      /* "" = none */
	bool one_call;              /* parallel_tool_calls false: at most one function_call item */
};

/* body -> *chat (malloc'd chat completions body), *history (malloc'd JSON
 * array: the stored conversation of previous_response_id, if any, then this
 * input, without the instructions) and *echo (malloc'd JSON object: the
 * request fields a response object repeats). store may be NULL (then a
 * previous_response_id is unknown). On failure fills *why (400, or 404 for
 * an unknown previous_response_id) and leaves nothing to free. Pure but for
 * the store lookup (tests and fuzz targets call it with store NULL). */
enum status resp_translate(const char *body, size_t len, struct resp_store *store, char **chat, size_t *chat_len,
			   char **history, char **echo, struct resp_info *info, struct oai_error *why) DSV4_WUR;

/* Register the routes on the server's api; the store is the server's. */
enum status resp_register(struct oai_server *s, struct api *api) DSV4_WUR;

#endif
