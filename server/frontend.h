/*
 * server/frontend.h: what the API front-ends over the chat engine share
 * (server/anthropic.c: the Anthropic Messages API, server/responses.c: the
 * OpenAI Responses API). Each front-end translates its request body into an
 * OpenAI chat completions body, so that one parser (openai_params.c) checks
 * every field and limit, and the chat encoding, tool parser, reasoning
 * parser and scheduler are the chat endpoint's own; its answers are written
 * by a job format (openai_internal.h). Not a public header.
 */
#ifndef DSV4_SERVER_FRONTEND_H
#define DSV4_SERVER_FRONTEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/openai_internal.h"

/* The server is ready; otherwise answers resp (503) and returns false. */
bool fe_check_ready(struct api *api, struct http_response *resp);

/* Parse the chat body json (a front-end's translation), check its model,
 * render the prompt and tokenize it. On success fills *r (free with
 * oai_request_free), *ids (free) and *n_ids; on failure answers resp with
 * an OpenAI-shaped error and returns false. */
bool fe_chat_prompt(struct oai_server *s, struct api *api, const char *json, size_t len, struct oai_request *r,
		    int32_t **ids, size_t *n_ids, struct http_response *resp);

/* A fresh id: prefix then 24 hex digits. */
void fe_new_id(struct oai_server *s, const char *prefix, char *out, size_t cap);

/* "event: NAME\ndata: JSON\n\n" */
void fe_sse_event(struct strbuf *out, const char *name, const char *json, size_t len);

/* The error status's Anthropic-style type name. */
const char *fe_anthropic_error_type(int status);

#endif
