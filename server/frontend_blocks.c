/*
 * server/frontend_blocks.c: the answer's blocks for the agent front-ends
 * (frontend.h): the chat output parser's events grouped into reasoning,
 * text and tool-call blocks in the order the model writes them. Anthropic's
 * content blocks and the Responses API's output items are the same
 * grouping with other shapes, so where an event's text goes and when a
 * block starts and ends is decided here once; the front-end's callbacks
 * write the events.
 */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

#include "model/output_parser.h"

void fe_blocks_close(struct fe_blocks *bl, struct strbuf *out)
{
	if (!bl->stream || !bl->open)
		return;
	bl->open = false;
	bl->on_close(bl->ctx, out, bl->n - 1);
}

struct fe_block *fe_blocks_add(struct fe_blocks *bl, struct strbuf *out, enum fe_block_type type,
			       const char *call_id, const char *name, size_t tool_index)
{
	fe_blocks_close(bl, out);
	if (bl->n == bl->cap) {
		size_t cap = bl->cap ? 2 * bl->cap : 4;
		struct fe_block *v = realloc(bl->v, cap * sizeof *v);
		if (!v) {
			bl->oom = true;
			return NULL;
		}
		bl->v = v;
		bl->cap = cap;
	}
	struct fe_block *b = &bl->v[bl->n++];
	memset(b, 0, sizeof *b);
	b->type = type;
	strbuf_init(&b->text);
	b->call_id = call_id ? strdup(call_id) : NULL;
	b->name = name ? strdup(name) : NULL;
	b->tool_index = tool_index;
	if (bl->stream)
		bl->open = true;
	bl->on_add(bl->ctx, out, bl->n - 1);
	return b;
}

struct fe_block *fe_blocks_event(struct fe_blocks *bl, struct strbuf *out, const struct model_oparse_event *ev)
{
	struct fe_block *last = bl->n ? &bl->v[bl->n - 1] : NULL;
	struct fe_block *b = NULL;
	switch (ev->kind) {
	case MODEL_OPARSE_REASONING:
		if (!ev->len)
			return NULL;
		b = last && last->type == FE_BLOCK_REASONING ? last
							      : fe_blocks_add(bl, out, FE_BLOCK_REASONING, NULL, NULL, 0);
		if (bl->omit_reasoning)
			return NULL;
		break;
	case MODEL_OPARSE_CONTENT:
		if (!ev->len)
			return NULL;
		b = last && last->type == FE_BLOCK_TEXT ? last : fe_blocks_add(bl, out, FE_BLOCK_TEXT, NULL, NULL, 0);
		break;
	case MODEL_OPARSE_TOOL_CALL_START:
		if (bl->one_tool && ev->tool_index > 0)
			return NULL; /* dropped: its arguments find no block either */
		fe_blocks_add(bl, out, FE_BLOCK_TOOL, ev->tool_id, ev->tool_name ? ev->tool_name : "", ev->tool_index);
		return NULL;
	case MODEL_OPARSE_TOOL_CALL_ARGS:
		if (!ev->len || !last || last->type != FE_BLOCK_TOOL || last->tool_index != ev->tool_index)
			return NULL;
		b = last;
		break;
	default:
		return NULL;
	}
	if (!b)
		return NULL;
	strbuf_append(&b->text, ev->text, ev->len);
	return b;
}

void fe_blocks_free(struct fe_blocks *bl)
{
	for (size_t i = 0; i < bl->n; i++) {
		strbuf_free(&bl->v[i].text);
		free(bl->v[i].call_id);
		free(bl->v[i].name);
	}
	free(bl->v);
	bl->v = NULL;
	bl->n = bl->cap = 0;
}

const char *fe_blocks_error(const struct fe_blocks *bl, const char *error, const char *abort_msg)
{
	if (!error && bl->oom)
		error = "out of memory";
	if (!error && abort_msg)
		error = abort_msg;
	return error;
}

const char *fe_abort_message(enum sched_finish_reason r)
{
	switch (r) {
	case SCHED_FINISH_STOP:
	case SCHED_FINISH_LENGTH:
		return NULL;
	case SCHED_FINISH_SHUTDOWN:
		return "the server is shutting down";
	case SCHED_FINISH_TIMEOUT:
		return "the request timed out";
	default:
		return "the request was aborted";
	}
}
