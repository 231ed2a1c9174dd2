/*
 * server/openai_internal.h: what the OpenAI routes (openai_server.c) and the
 * per-request job (openai_job.c) share inside server/. Not a public header.
 */
#ifndef DSV4_SERVER_OPENAI_INTERNAL_H
#define DSV4_SERVER_OPENAI_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strbuf.h"
#include "server/http.h"
#include "server/openai.h"
#include "server/openai_params.h"

#define OAI_SLOTS_PER_CHUNK 256
#define OAI_MAX_CHUNKS 4096
/* A non-streamed answer is built whole in memory: refuse one whose estimate
 * (choices x tokens x bytes per token, logprobs ~72 bytes per entry) passes
 * this, with a 400 naming the product (issue 17: n=128, top_logprobs=20,
 * max_tokens=600 built 117 MB and it grows to tens of GB). Checked when
 * max_tokens is given; streaming is not capped: it is sent as it is made. */
#define OAI_MAX_RESPONSE_BYTES ((uint64_t)64 << 20)

struct oai_job;

/* One wake slot per job in flight; chunks never move, so the scheduler's
 * notify callback can hold a slot pointer for as long as the server lives. */
struct wake_slot {
	struct oai_server *srv;
	struct http_stream *hs; /* NULL when free or closed */
	struct oai_job *job;
	int32_t next_free;
};

struct oai_server {
	struct oai_server_options opt;
	pthread_mutex_t wake_mu;
	struct wake_slot *chunks[OAI_MAX_CHUNKS];
	int n_chunks;
	int32_t free_head; /* slot index, -1 = none */
	uint32_t n_jobs;
	atomic_uint_fast64_t next_id;
	struct resp_store *resp_store; /* /v1/responses answers (server/responses.c) */
	struct gram_vocab *gvocab; /* structured outputs: the tokenizer's byte trie (NULL: unavailable) */
};

/* The error reply for a refused body (api_error with its status, param and code). */
void oai_error_reply(struct http_response *resp, const struct oai_error *why);

/* Submit the request's prompts (n_prompts id arrays; echo texts may be NULL,
 * and are taken over when set), create the job and answer resp with its
 * stream (or with an error reply: refusals map to 400/429/503). */
void oai__start_job(struct oai_server *s, const struct oai_request *r, int32_t **prompt_ids, size_t *n_ids,
		    uint32_t n_prompts, char **echo, size_t *echo_len, struct http_response *resp,
		    struct http_stream *hs);

/* ---- other answer formats (server/anthropic.c, server/responses.c) ----
 * A job with a format sends the chat output parser's events, each choice's
 * finish and the end of the request to the format instead of writing the
 * OpenAI chat shapes; the format appends its own bytes (SSE events or the
 * one JSON body) to out. Calls run under the job's lock, in order: start
 * once (at submission), event / finish as output arrives, ping when a
 * stream has been silent, final once (error = NULL on success), destroy
 * once when the job is freed (also when submission fails). n must be 1. */
struct model_oparse_event;
struct oai_usage;
struct oai_job_format {
	void (*start)(void *ctx, struct strbuf *out, uint32_t n_prompt_tokens);
	void (*event)(void *ctx, struct strbuf *out, const struct model_oparse_event *ev);
	void (*finish)(void *ctx, struct strbuf *out, const struct sched_event *ev);
	void (*final)(void *ctx, struct strbuf *out, const struct oai_usage *u, const char *error);
	void (*ping)(void *ctx, struct strbuf *out);
	void (*destroy)(void *ctx);
};
/* oai__start_job for one chat prompt answered through fmt (it owns fmt_ctx
 * from here on). Refusals are answered with api_error's OpenAI shape; the
 * front-end reshapes them. */
void oai__start_job_fmt(struct oai_server *s, const struct oai_request *r, int32_t *prompt_ids, size_t n_ids,
			const struct oai_job_format *fmt, void *fmt_ctx, struct http_response *resp,
			struct http_stream *hs);
/* Structured outputs (openai_structured.c): the grammar the request asks
 * for in *out (NULL for none; the caller releases it). false: resp holds
 * the error reply (400 for a schema that cannot be compiled). */
struct gram;
bool oai__grammar(const struct oai_server *s, const struct oai_request *r, struct gram **out,
		  struct http_response *resp);

#endif
