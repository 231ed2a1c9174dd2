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
#include <jansson.h>

#include "common/strbuf.h"
#include "scheduler/scheduler.h"
#include "server/openai_internal.h"

struct model_oparse_event;

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

/* ---- request translation (frontend.c) ---- */

/* A refusal of the request body: why's status (500 for ST_NOMEM, else
 * status), param and message. Returns st. */
enum status fe_fail(struct oai_error *why, int status, enum status st, const char *param, const char *fmt, ...)
	DSV4_PRINTF(5, 6);
/* The body as a JSON object in *root (the caller releases it), or a 400
 * naming what is wrong with it. */
enum status fe_parse_body(const char *body, size_t len, json_t **root, struct oai_error *why);
/* One chat completions tool, {"type":"function","function":{name,
 * description, parameters}}: the description when it is a string, the
 * parameters when an object (else an empty object schema). */
json_t *fe_chat_tool(json_t *name, json_t *description, json_t *parameters);
/* tools: an array whose entries one() checks and turns into chat tools
 * (*out, usually fe_chat_tool's); the chat body o gets them as "tools". */
enum status fe_translate_tools(json_t *tools, json_t *o,
			       enum status (*one)(json_t *tool, size_t i, json_t **out, struct oai_error *why),
			       struct oai_error *why);

/* ---- the answer's blocks (frontend_blocks.c) ----
 * The chat output parser's events grouped, in the order the model writes
 * them, into reasoning, text and tool-call blocks (Anthropic's content
 * blocks, the Responses API's output items). The blocks decide where an
 * event's text goes and when a block starts and ends; the front-end's
 * callbacks shape them. */
enum fe_block_type { FE_BLOCK_REASONING = 0, FE_BLOCK_TEXT, FE_BLOCK_TOOL };

struct fe_block {
	enum fe_block_type type;
	char id[48];           /* the front-end's own id for the block (on_add may set it) */
	struct strbuf text;    /* reasoning / text / tool arguments */
	char *call_id, *name;  /* a tool call's */
	size_t tool_index;     /* the output parser's index of the call */
};

struct fe_blocks {
	struct fe_block *v;
	size_t n, cap;
	bool stream;           /* events as they come; else only the blocks are kept */
	bool open;             /* stream: the last block has been started and not ended */
	bool one_tool;         /* the answer keeps its first tool call only */
	bool omit_reasoning;   /* reasoning blocks are opened, their text neither kept nor sent */
	bool oom;              /* a block or an event could not be made: the answer fails */
	void *ctx;             /* the callbacks' */
	/* Block index was just added (always; the front-end writes its start
	 * events when streaming). */
	void (*on_add)(void *ctx, struct strbuf *out, size_t index);
	/* Stream: block index is complete (its closing events). */
	void (*on_close)(void *ctx, struct strbuf *out, size_t index);
};

/* A new block after the last one, which is closed first (NULL: out of
 * memory, bl->oom set). */
struct fe_block *fe_blocks_add(struct fe_blocks *bl, struct strbuf *out, enum fe_block_type type,
			       const char *call_id, const char *name, size_t tool_index);
/* Stream: end the open block (nothing when none is open). */
void fe_blocks_close(struct fe_blocks *bl, struct strbuf *out);
/* Route an output parser event: reasoning and content go to the last block
 * when it has their type, else to a new one; a tool call start adds a tool
 * block (only the first with one_tool), its arguments go to that block.
 * Returns the block whose text grew by the event's (its delta to send), or
 * NULL when there is no delta. */
struct fe_block *fe_blocks_event(struct fe_blocks *bl, struct strbuf *out, const struct model_oparse_event *ev);
void fe_blocks_free(struct fe_blocks *bl);
/* What the answer fails with: error, else out of memory, else abort_msg
 * (NULL: it did not fail). */
const char *fe_blocks_error(const struct fe_blocks *bl, const char *error, const char *abort_msg);
/* The message of a finish that is not a normal end (NULL for stop and
 * length). */
const char *fe_abort_message(enum sched_finish_reason r);

#endif
