/*
 * server/openai.h: the engine routes of the OpenAI API:
 * POST /v1/chat/completions, POST /v1/completions, POST /tokenize,
 * POST /detokenize, GET /tokenizer_info (vLLM's: what a client needs to
 * tokenize through the server), registered on a struct api.
 *
 * A generation request is parsed (openai_params.h), rendered (model/chat.h),
 * tokenized, submitted to the scheduler loop, and answered through an HTTP
 * stream whose pull callback drains the request's sched_stream(s): SSE
 * chunks when "stream": true, one JSON body at the end otherwise. Both kinds
 * notice a client that goes away (the HTTP layer calls close with
 * aborted = true) and release their scheduler streams, which aborts the
 * request and frees its blocks on the loop's next turn.
 *
 * Threads: handlers and pull callbacks run on libmicrohttpd pool threads;
 * the scheduler's notify callback runs on the step-loop thread and only
 * wakes the connection (under the server's wake lock, which close also
 * takes, so no wake can reach a closed stream; http.h).
 */
#ifndef DSV4_SERVER_OPENAI_H
#define DSV4_SERVER_OPENAI_H

#include <stdint.h>

#include "common/status.h"
#include "model/tokenizer.h"
#include "scheduler/scheduler.h"
#include "server/api.h"

struct oai_server;

struct oai_server_options {
	const struct model_tokenizer *tok; /* borrowed, outlives the server */
	struct sched_loop *loop;           /* borrowed; destroy it after the HTTP server, before this */
	struct api *api;                   /* routes are registered on it */
	uint32_t max_model_len;            /* tokens, for /tokenize */
	int32_t vocab_size;                /* token ids must be below it */
	const char *model_dir;             /* (optional) its tokenizer_config.json's chat_template, for
					      GET /tokenizer_info */
	uint32_t max_logprobs;             /* --max-logprobs: larger logprobs / top_logprobs / prompt_logprobs
					      are a 400 naming the limit; 0 = 20 (the default) */
	size_t responses_store_bytes;      /* --responses-store-bytes: the /v1/responses store; 0 = 64 MiB */
};

enum status oai_server_create(struct oai_server **out, const struct oai_server_options *opt, struct err *e) DSV4_WUR;

/* Abort every request in flight (reason SCHED_FINISH_SHUTDOWN); their streams
 * then end normally. Used when the drain timeout passes. */
void oai_server_abort_all(struct oai_server *s);

/* Requests being answered right now. */
uint32_t oai_server_n_jobs(struct oai_server *s);

/* NULL is a no-op. Call after the HTTP server and the scheduler loop are gone. */
void oai_server_destroy(struct oai_server *s);

#endif
