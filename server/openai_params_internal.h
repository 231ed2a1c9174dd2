/*
 * server/openai_params_internal.h: what the two halves of the request
 * parser share (openai_params.c: the parameter table and the endpoints;
 * openai_params_chat.c: chat messages, tools and response formats). Not a
 * public header.
 */
#ifndef DSV4_SERVER_OPENAI_PARAMS_INTERNAL_H
#define DSV4_SERVER_OPENAI_PARAMS_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/openai_params.h"

/* A request's memory: a list of individually malloc'd blocks, freed together. */
struct oai_arena {
	struct arena_blk {
		struct arena_blk *next;
		max_align_t align[];
	} *head;
};
void *oai__ar_alloc(struct oai_arena *a, size_t n);
char *oai__ar_strndup(struct oai_arena *a, const char *s, size_t n);

/* Fill *why (status 400, or 500 for ST_NOMEM; code from st) and return st. */
enum status oai__fail(struct oai_error *why, enum status st, const char *param, const char *fmt, ...)
	DSV4_PRINTF(4, 5);
/* oai__fail with OpenAI's error code given; returns ST_INVALID. */
#define FAILC(why, code_, ...) (oai__fail(why, __VA_ARGS__), (why)->code = (code_), ST_INVALID)
#define NOMEM(why) oai__fail(why, ST_NOMEM, "", "out of memory")

/* Nested values, checked as the table checks top-level ones (same messages). */
enum status oai__get_bool(json_t *v, const char *name, bool *out, struct oai_error *why);
enum status oai__get_num(json_t *v, const char *name, double lo, double hi, double *out, struct oai_error *why);
enum status oai__get_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
			 struct oai_error *why);
/* A string copied into the arena (allow_nul: embedded NULs kept). */
enum status oai__get_str(struct oai_arena *a, json_t *v, const char *name, const char **out, size_t *len,
			 bool allow_nul, struct oai_error *why);

/* openai_params_chat.c */
enum status oai__parse_messages(struct oai_request *r, json_t *v, struct oai_error *why);
enum status oai__parse_tools(struct oai_request *r, json_t *v, struct oai_error *why);
enum status oai__parse_tool_choice(struct oai_request *r, json_t *v, struct oai_error *why);
enum status oai__parse_template_kwargs(struct oai_request *r, json_t *v, bool *thinking_set, struct oai_error *why);
/* response_format, guided_json, guided_choice, structured_outputs (param says which) */
enum status oai__parse_format(struct oai_request *r, const char *param, json_t *v, struct oai_error *why);
enum status oai__reasoning_effort(struct oai_request *r, const char *s, struct oai_error *why);

#endif
