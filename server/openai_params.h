/*
 * server/openai_params.h: OpenAI / vLLM request bodies -> typed parameters.
 *
 * Validation happens here, at the edge (style.md rule 5): every field is
 * checked for type and range, every limit is applied, and every field we do
 * not implement is refused with a message naming it. Fields that OpenAI SDKs
 * and agent tools send routinely and that have no effect on a single local
 * model (user, metadata, store, service_tier, ...) are accepted and ignored;
 * docs/api.md lists both sets.
 *
 * Ownership: everything a parsed request points to lives in its arena and is
 * freed by oai_request_free(). No jansson object outlives the parse call
 * (rule 7); the scheduler and model layers receive plain C data only.
 */
#ifndef DSV4_SERVER_OPENAI_PARAMS_H
#define DSV4_SERVER_OPENAI_PARAMS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "scheduler/scheduler.h"
#include "model/chat.h"

/* ---- Limits (parse time; docs/api.md carries the same table) ---- */
#define OAI_MAX_MESSAGES 4096          /* messages in one chat request */
#define OAI_MAX_CONTENT_PARTS 1024     /* parts of one message */
#define OAI_MAX_TOOLS 256              /* OpenAI allows 128 */
#define OAI_MAX_TOOL_CALLS 128         /* tool calls of one input assistant message */
#define OAI_MAX_PROMPTS 64             /* prompts of one /v1/completions request */
#define OAI_MAX_PROMPT_IDS (1u << 20)  /* token ids given directly, per prompt */
#define OAI_MAX_TOKENS_PARAM (1u << 24) /* max_tokens beyond any context */
/* JSON values in one body, counted before parsing: one 2^20-id prompt fits;
 * an 8 MB body of nested empty arrays (2.7 M values, ~380 MB parsed) does
 * not (issue 17). */
#define OAI_MAX_JSON_VALUES (3u << 19)

enum oai_kind { OAI_CHAT = 0, OAI_COMPLETION = 1 };

/* Who calls tools: auto (the model decides) or none (tools not rendered). */
enum oai_tool_choice { OAI_TOOL_AUTO = 0, OAI_TOOL_NONE = 1, OAI_TOOL_REQUIRED = 2, OAI_TOOL_NAMED = 3 };

/* Structured outputs (model/gram.h; compiled by oai__start_job):
 * response_format json_object / json_schema, vLLM's guided_json /
 * guided_choice and structured_outputs {json | choice}. */
enum oai_format { OAI_FORMAT_TEXT = 0, OAI_FORMAT_JSON_OBJECT, OAI_FORMAT_JSON_SCHEMA, OAI_FORMAT_CHOICE };

/* One prompt of /v1/completions: text or token ids (exactly one set). */
struct oai_prompt {
	const char *text;      /* NULL when ids are given */
	size_t text_len;
	const int32_t *ids;    /* NULL when text is given */
	uint32_t n_ids;
};

struct oai_request {
	enum oai_kind kind;
	const char *model;          /* NULL when absent */
	bool stream;
	bool include_usage;         /* stream_options.include_usage */
	uint32_t n;                 /* choices per prompt, 1..SCHED_MAX_N */
	uint32_t max_tokens;        /* 0 = not given (up to the context) */
	struct sched_sampling sampling; /* logit_bias points into the arena */
	bool has_seed;
	const char *const *stop;    /* stop strings */
	uint32_t n_stop;
	const int32_t *stop_token_ids;
	uint32_t n_stop_token_ids;
	bool ignore_eos;
	uint32_t min_tokens;        /* eos and stop ids masked for the first min_tokens tokens */
	bool include_stop_str_in_output;
	int32_t priority;
	uint64_t cache_salt;        /* hash of the cache_salt string, 0 = none */
	/* Logprobs: chat "logprobs": true + "top_logprobs": k; completions "logprobs": k. */
	bool logprobs;
	uint32_t top_logprobs;
	bool skip_special_tokens;   /* default true */
	/* Prompt log-probabilities: vLLM's "prompt_logprobs": k (k top entries
	 * beside the prompt token), and "max_tokens": 0 (score the prompt only;
	 * needs echo or prompt_logprobs). Completions' echo + logprobs asks for
	 * them too (oai__start_job). */
	bool prompt_logprobs;
	uint32_t prompt_top_logprobs;
	bool score_only;
	enum oai_format format;
	const char *format_schema;        /* JSON_SCHEMA: the schema, re-serialized */
	const char *const *format_choices; /* CHOICE */
	uint32_t n_format_choices;
	const char *response_format_json; /* response_format as given (rendered into the chat prompt), or NULL */

	/* Chat. */
	struct model_chat_message *messages;
	size_t n_messages;
	const char *tools_json;     /* the "tools" array re-serialized, or NULL */
	size_t n_tools;
	enum oai_tool_choice tool_choice;
	const char *tool_choice_name; /* OAI_TOOL_NAMED */
	bool thinking;              /* prompt ends in <think>; output starts in reasoning */
	enum model_chat_effort effort;
	bool include_reasoning;     /* false: drop reasoning_content from the answer */
	bool continue_final;        /* continue_final_message */

	/* Completions. */
	struct oai_prompt *prompts;
	uint32_t n_prompts;
	bool echo;

	struct oai_arena *arena;    /* owns all of the above */
};

/* What went wrong: the HTTP status (400; 500 for out of memory), the
 * OpenAI param name ("" for the body as a whole), OpenAI's error code (a
 * static string: "invalid_value", "invalid_type", "unknown_parameter",
 * "unsupported_value", "missing_required_parameter", "invalid_json"; NULL
 * for none) and one line. oai_error_reply() (openai_internal.h) sends it. */
struct oai_error {
	int status;
	const char *code;
	char param[64];
	char message[512];
};

/* Fill why's status (500 for ST_NOMEM, else status), param ("" for NULL)
 * and message; code is left as it is. Returns st. */
enum status oai_error_vset(struct oai_error *why, int status, enum status st, const char *param, const char *fmt,
			   va_list ap);

/* Parse a chat completions body (kind = OAI_CHAT) or a completions body
 * (OAI_COMPLETION). vocab_size bounds token ids in logit_bias, prompts and
 * stop_token_ids. On failure returns ST_INVALID / ST_UNSUPPORTED / ST_NOMEM,
 * fills *why, and leaves nothing to free. On success the caller frees *out
 * with oai_request_free(). */
enum status oai_parse_request(enum oai_kind kind, const char *body, size_t len, int32_t vocab_size,
			      struct oai_request *out, struct oai_error *why) DSV4_WUR;
void oai_request_free(struct oai_request *r);

/* POST /tokenize: {"model"?, "prompt": str, "add_special_tokens"?: bool,
 * "return_token_strs"?: bool} or the chat form {"messages": [...],
 * "add_generation_prompt"?, "tools"?, "chat_template_kwargs"?}. */
struct oai_tokenize_request {
	const char *model;
	const char *prompt;          /* NULL for the chat form */
	size_t prompt_len;
	struct oai_request chat;     /* the chat form's messages and options (kind OAI_CHAT) */
	bool is_chat;
	bool add_special_tokens;
	bool return_token_strs;
	struct oai_arena *arena;
};
enum status oai_parse_tokenize(const char *body, size_t len, struct oai_tokenize_request *out,
			       struct oai_error *why) DSV4_WUR;
void oai_tokenize_request_free(struct oai_tokenize_request *r);

/* POST /detokenize: {"model"?, "tokens": [int]}. */
struct oai_detokenize_request {
	const char *model;
	int32_t *tokens;  /* malloc'd */
	uint32_t n_tokens;
	char *model_buf;  /* malloc'd copy behind model */
};
enum status oai_parse_detokenize(const char *body, size_t len, int32_t vocab_size,
				 struct oai_detokenize_request *out, struct oai_error *why) DSV4_WUR;
void oai_detokenize_request_free(struct oai_detokenize_request *r);

/* The chat options a parsed request implies (for model_chat_encode). */
void oai_chat_options(const struct oai_request *r, struct model_chat_options *opt);

#endif
