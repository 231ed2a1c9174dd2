/*
 * model/chat.h: the DeepSeek-V4 chat encoding (messages -> prompt text).
 *
 * DeepSeek-V4 has no Jinja template; its release ships a Python encoder
 * (encoding/encoding_dsv4.py). model_chat_encode() renders the same prompt
 * strings byte for byte for the subset of inputs an OpenAI-compatible server
 * receives: system / user / assistant / tool messages, plus DeepSeek's own
 * developer and latest_reminder roles; thinking and non-thinking mode;
 * reasoning effort; OpenAI tools rendered into the system prompt; assistant
 * tool calls in DSML; earlier turns' reasoning dropped as the encoder does.
 *
 * The result is UTF-8 text that still contains the special tokens as text
 * (<｜begin▁of▁sentence｜>, <｜User｜>, <think>, ｜DSML｜ ...); the tokenizer
 * must parse special tokens when it turns it into ids.
 *
 * Everything the caller passes is plain C data, borrowed for the duration of
 * the call only; no jansson object crosses this interface, so the function is
 * safe to call from any thread (it keeps no state).
 */
#ifndef DSV4_MODEL_CHAT_H
#define DSV4_MODEL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

/* The special tokens as text, for callers that need to recognise them. */
#define MODEL_CHAT_BOS "<｜begin▁of▁sentence｜>"
#define MODEL_CHAT_EOS "<｜end▁of▁sentence｜>"
#define MODEL_CHAT_USER "<｜User｜>"
#define MODEL_CHAT_ASSISTANT "<｜Assistant｜>"
#define MODEL_CHAT_LATEST_REMINDER "<｜latest_reminder｜>"
#define MODEL_CHAT_THINK_START "<think>"
#define MODEL_CHAT_THINK_END "</think>"
#define MODEL_CHAT_DSML "｜DSML｜"

enum model_chat_role {
	MODEL_CHAT_ROLE_SYSTEM = 0,
	MODEL_CHAT_ROLE_USER,
	MODEL_CHAT_ROLE_ASSISTANT,
	MODEL_CHAT_ROLE_TOOL,
	/* DeepSeek's internal search-agent role: rendered like a user turn and
	 * dropped from history before the last user turn (in thinking mode with
	 * dropping on). It is NOT OpenAI's "developer" (= system); the server
	 * decides how to map OpenAI's role name. Content must be non-empty. */
	MODEL_CHAT_ROLE_DEVELOPER,
	/* <｜latest_reminder｜>content (date, locale ...). */
	MODEL_CHAT_ROLE_LATEST_REMINDER,
};

/* One tool call of an assistant message (OpenAI tool_calls[i]). */
struct model_chat_tool_call {
	const char *id;             /* may be NULL; used to order tool results */
	const char *name;           /* function.name; NULL renders as "" */
	/* function.arguments: JSON text of an object, as OpenAI sends it. Text
	 * that is not JSON is rendered as one string parameter "arguments" (as
	 * the official encoder does); JSON that is not an object is ST_INVALID. */
	const char *arguments_json;
};

/* One message. Strings are UTF-8, NUL-terminated, borrowed; NULL means absent
 * and renders like "". */
struct model_chat_message {
	enum model_chat_role role;
	const char *content;
	const char *reasoning_content;                 /* assistant only */
	const struct model_chat_tool_call *tool_calls; /* assistant only */
	size_t n_tool_calls;
	const char *tool_call_id; /* tool only: which call this result answers */
	const char *name;         /* tool only: not rendered by the encoder */
};

enum model_chat_effort {
	MODEL_CHAT_EFFORT_NONE = 0, /* the encoder's None: no effort prompt */
	MODEL_CHAT_EFFORT_HIGH,     /* renders exactly like NONE (as upstream) */
	MODEL_CHAT_EFFORT_MAX,      /* thinking only: the "Reasoning Effort" preamble */
};

struct model_chat_options {
	bool thinking; /* true: "thinking" mode (prompt ends <think>); false: "chat" */
	enum model_chat_effort effort;
	/* The encoder's drop_thinking, inverted so that zero-initialised options
	 * mean the official default: false drops reasoning (and developer turns)
	 * from before the last user turn; true keeps all of it. Tools force
	 * keeping, as upstream does. */
	bool keep_thinking;
	/* OpenAI "tools" array as JSON text, or NULL / "[]" for none. Each item
	 * must be an object with a "function" object; the function object is
	 * rendered (json.dumps style) into the system prompt. When tools are
	 * given and messages[0] is not a system message, an empty system
	 * message is put in front (what SGLang's server does). */
	const char *tools_json;
	/* Optional response_format JSON (any JSON value), appended to the same
	 * system message as "## Response Format" (the encoder's feature). */
	const char *response_format_json;
	bool no_bos; /* true: do not start with <｜begin▁of▁sentence｜> */
	/* The last message is an assistant turn to be continued: render it
	 * without the closing <｜end▁of▁sentence｜> (the encoder's wo_eos). */
	bool continue_final;
};

/*
 * Render messages[0..n_messages) into *out_prompt (malloc'd, NUL-terminated
 * UTF-8, the caller frees it) and its byte length into *out_len (may be
 * NULL). opt may be NULL (all defaults). Errors: ST_INVALID for bad JSON in
 * tools / arguments / response_format, an empty developer message, text with
 * a NUL from a JSON \u0000 that would have to be rendered raw;
 * ST_UNSUPPORTED for JSON the encoder accepts but this one cannot render the
 * same; ST_NOMEM. (Integers beyond 64 bits and reals beyond double are
 * rendered as Python does: the digits, Infinity.)
 * On error *out_prompt is NULL.
 */
enum status model_chat_encode(const struct model_chat_message *messages, size_t n_messages,
			      const struct model_chat_options *opt, char **out_prompt,
			      size_t *out_len, struct err *e) DSV4_WUR;

/*
 * Serialize the JSON text json (any value) the way Python's
 * json.dumps(value, ensure_ascii=False) does: ", " and ": " separators, keys
 * in input order, floats in Python repr form, non-ASCII kept raw. Appends to
 * a malloc'd string in *out (caller frees). Used by the encoder and the
 * output parser's tests; exposed so the server can reuse it.
 */
enum status model_chat_json_pydumps(const char *json, size_t json_len, char **out,
				    size_t *out_len, struct err *e) DSV4_WUR;

#endif
