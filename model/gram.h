/*
 * model/gram.h: token-level constrained decoding (structured outputs).
 *
 * A grammar (struct gram) is compiled once per request from a JSON Schema,
 * from "any JSON object" (json_object mode) or from a tool list (a DSML
 * tool-call block whose arguments follow each tool's parameter schema). It
 * is immutable and reference counted, so the n choices of a request share it.
 *
 * A state (struct gram_state) walks the grammar one token at a time. The
 * grammar is a byte-level pushdown automaton; a state is a bounded set of
 * stacks (GRAM_MAX_STACKS), so alternatives that share a prefix (anyOf, enum
 * values) stay alive together. gram_state_fill_mask() writes the allowed
 * token set as a bit mask over the vocabulary: a depth-first walk of the
 * vocabulary's byte trie (struct gram_vocab, built once at load) that stops
 * at the first byte the automaton refuses, so its cost follows what the
 * state allows. Inside a string or free text, where most tokens are allowed,
 * the tokens made only of plain bytes are taken from a precomputed mask and
 * only the rest are walked; masks are also cached per state.
 *
 * The end-of-sequence token is allowed exactly when the text so far is a
 * complete sentence of the grammar. Whitespace between JSON tokens is allowed
 * up to GRAM_MAX_WS bytes in a row; numbers are limited to GRAM_MAX_NUM_BYTES
 * bytes, 15 integer / fraction digits and 2 exponent digits, and nesting to GRAM_MAX_DEPTH frames (a deeper token is refused).
 */
#ifndef DSV4_MODEL_GRAM_H
#define DSV4_MODEL_GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define GRAM_MAX_STACKS 64
#define GRAM_MAX_DEPTH 128
#define GRAM_MAX_WS 8
#define GRAM_MAX_NUM_BYTES 24
#define GRAM_MAX_RUN_DIGITS 15 /* integer and fraction digits (int64 / double exact) */
#define GRAM_MAX_EXP_DIGITS 2
/* compile bounds: a schema past them is refused (ST_INVALID), not run */
#define GRAM_MAX_NODES 200000
#define GRAM_MAX_LIT_BYTES (4u << 20)
#define GRAM_MAX_SCHEMA_DEPTH 64

struct model_tokenizer;

/* ---- the vocabulary (shared, immutable after create, any thread) ---- */

struct gram_vocab;

/* Token i's bytes are piece(ctx, i, &len) (NULL = never allowed). eos_id is
 * the one token allowed at the end of a sentence (-1: none). */
struct gram_vocab_options {
	uint32_t n_tokens;
	const char *(*piece)(void *ctx, int32_t id, size_t *len);
	void *ctx;
	int32_t eos_id;
};
enum status gram_vocab_create(struct gram_vocab **out, const struct gram_vocab_options *opt, struct err *e) DSV4_WUR;
/* From the tokenizer: every non-special token by its bytes, plus the added
 * tokens the DSML markup uses (｜DSML｜); eos from the tokenizer. */
enum status gram_vocab_from_tokenizer(struct gram_vocab **out, const struct model_tokenizer *tok,
				      struct err *e) DSV4_WUR;
void gram_vocab_destroy(struct gram_vocab *v);
uint32_t gram_vocab_n_tokens(const struct gram_vocab *v);
/* uint32_t words of a mask: (n_tokens + 31) / 32; bit i of word i/32 = token i */
uint32_t gram_vocab_mask_words(const struct gram_vocab *v);

/* ---- grammars (immutable, reference counted, any thread) ---- */

struct gram;

/* A JSON Schema (the subset OpenAI strict mode accepts, plus minItems /
 * maxItems and non-required properties). Unsupported keywords are
 * ST_UNSUPPORTED with e naming the keyword; malformed schemas and schemas
 * past the compile bounds are ST_INVALID. */
enum status gram_compile_json_schema(struct gram **out, const char *schema_json, size_t len, struct err *e) DSV4_WUR;
/* Any JSON object (response_format json_object). */
enum status gram_compile_json_object(struct gram **out, struct err *e) DSV4_WUR;
/* One of the given strings exactly (vLLM guided_choice). */
enum status gram_compile_choice(struct gram **out, const char *const *choices, uint32_t n, struct err *e) DSV4_WUR;

enum gram_tool_mode {
	GRAM_TOOLS_REQUIRED = 0, /* a DSML block with 1.. calls, nothing before it */
	GRAM_TOOLS_AUTO = 1,     /* free text; once "<｜DSML｜" appears, the rest of the block is constrained */
};
/* tools_json: the OpenAI "tools" array ([{"type":"function","function":
 * {"name","parameters"}}]). only_name: non-NULL = exactly one call of that
 * function. max_calls: calls per block (>= 1). thinking: the output starts
 * inside reasoning (free text up to "</think>", then the above). The block
 * is what model/output_parser.h parses: parameters whose schema is a plain
 * string are string="true" raw text, the others string="false" JSON valid
 * against their schema; no value or JSON string contains "｜DSML｜" (the
 * parser would take it for markup). */
enum status gram_compile_tool_calls(struct gram **out, const char *tools_json, size_t len, enum gram_tool_mode mode,
				    const char *only_name, uint32_t max_calls, bool thinking, struct err *e) DSV4_WUR;

struct gram *gram_retain(struct gram *g);
void gram_release(struct gram *g); /* NULL is a no-op */
uint32_t gram_n_nodes(const struct gram *g);

/* ---- per-sequence state (one thread at a time) ---- */

struct gram_state;

/* g and v are borrowed (g retained) and must outlive the state. */
enum status gram_state_create(struct gram_state **out, struct gram *g, const struct gram_vocab *v,
			      struct err *e) DSV4_WUR;
void gram_state_destroy(struct gram_state *st);

/* The allowed tokens now: gram_vocab_mask_words(v) words. */
void gram_state_fill_mask(struct gram_state *st, uint32_t *mask);
/* Advance by one token. ST_INVALID (state unchanged) when the token is not
 * allowed. The eos token is allowed only when complete and leaves the state
 * finished. */
enum status gram_state_accept_token(struct gram_state *st, int32_t id) DSV4_WUR;
/* Advance by raw bytes (tests, forced prefixes). ST_INVALID (state
 * unchanged) when refused. */
enum status gram_state_accept_bytes(struct gram_state *st, const char *s, size_t n) DSV4_WUR;
/* Could the grammar end here (eos allowed)? */
bool gram_state_is_complete(const struct gram_state *st);
/* Is nothing but the end allowed (no byte can follow)? */
bool gram_state_is_final(const struct gram_state *st);

#endif
