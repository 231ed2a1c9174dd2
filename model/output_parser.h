/*
 * model/output_parser.h: streaming parser for DeepSeek-V4 generated text.
 *
 * Splits an assistant turn, as text deltas arrive from the detokenizer, into
 * reasoning (reasoning_content), content, and tool calls. Tool calls arrive
 * in DeepSeek's DSML markup:
 *
 *   \n\n<｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
 *   <｜DSML｜parameter name="K2" string="false">JSON value</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * and leave as OpenAI tool calls whose arguments are JSON text
 * {"K": "raw text", "K2": value} (the spelling DeepSeek's decoder uses).
 * string="true" values become JSON strings (escaped as they stream);
 * string="false" values are buffered, validated as JSON and inserted as-is,
 * or turned into a JSON string when they are not valid JSON. The arguments
 * of every call that started are always valid JSON when the call ends, even
 * when the markup is malformed or truncated.
 *
 * Deltas may split anywhere (inside ｜DSML｜, </think>, a UTF-8 character):
 * the concatenation of what is emitted depends only on the concatenated
 * input, never on how it was split (only how events are chunked does).
 * Malformed markup becomes content; every internal buffer is bounded (a tag
 * that never closes is given back as content once it exceeds max_tag_bytes).
 *
 * One parser per generated sequence; not thread-safe; the callback runs on
 * the caller's thread inside feed()/finish().
 */
#ifndef DSV4_MODEL_OUTPUT_PARSER_H
#define DSV4_MODEL_OUTPUT_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Default bound on one DSML tag's attribute text (invoke / parameter head)
 * and on whitespace between tags: names are short; 4 KiB is generous. */
#define MODEL_OPARSE_MAX_TAG_BYTES 4096
/* Default bound on a string="false" value held for JSON validation; larger
 * values stream on as a JSON string instead. */
#define MODEL_OPARSE_MAX_VALUE_BYTES (256 * 1024)

enum model_oparse_event_kind {
	MODEL_OPARSE_REASONING = 0, /* text: next piece of reasoning_content */
	MODEL_OPARSE_CONTENT,       /* text: next piece of content */
	MODEL_OPARSE_TOOL_CALL_START, /* tool_index, tool_id, tool_name */
	MODEL_OPARSE_TOOL_CALL_ARGS,  /* tool_index, text: next piece of arguments */
	MODEL_OPARSE_FINISH,          /* finish: once, last */
};

struct model_oparse_finish {
	size_t n_tool_calls;  /* calls started (each has complete JSON arguments) */
	size_t n_malformed;   /* places where markup broke and became content */
	bool saw_eos;         /* <｜end▁of▁sentence｜> appeared as text; later text ignored */
	bool open_reasoning;  /* ended inside reasoning (no </think>) */
	bool open_tool_call;  /* ended inside a tool-call block (arguments closed for it) */
};

struct model_oparse_event {
	enum model_oparse_event_kind kind;
	const char *text; /* REASONING / CONTENT / ARGS: not NUL-terminated */
	size_t len;
	size_t tool_index;     /* START / ARGS: 0, 1, ... in order of appearance */
	const char *tool_id;   /* START: "call_" + 16 hex digits, NUL-terminated */
	const char *tool_name; /* START: as written in the markup, NUL-terminated */
	const struct model_oparse_finish *finish; /* FINISH */
};

/* Everything in an event is borrowed and valid only during the call. */
typedef void (*model_oparse_emit_fn)(void *user, const struct model_oparse_event *ev);

struct model_oparse_options {
	model_oparse_emit_fn emit; /* required */
	void *user;
	/* The prompt ended with <think> (thinking mode): output starts inside
	 * reasoning and </think> ends it. false: output starts as content. */
	bool in_reasoning;
	size_t max_tag_bytes;   /* 0: MODEL_OPARSE_MAX_TAG_BYTES */
	size_t max_value_bytes; /* 0: MODEL_OPARSE_MAX_VALUE_BYTES */
	uint64_t call_id_seed;  /* tool ids derive from it and the call index */
};

struct model_oparse;

enum status model_oparse_create(struct model_oparse **out, const struct model_oparse_options *opt,
				struct err *e) DSV4_WUR;

/* Feed the next delta (any bytes, any length). Events for it are emitted
 * before this returns; bytes that may still be the start of a tag are held.
 * ST_NOMEM is sticky; ST_INVALID after finish(). */
enum status model_oparse_feed(struct model_oparse *p, const char *text, size_t len) DSV4_WUR;

/* End of generation: flush held text, close an open tool call, emit FINISH.
 * Call once. */
enum status model_oparse_finish(struct model_oparse *p) DSV4_WUR;

void model_oparse_destroy(struct model_oparse *p);

#endif
