/*
 * server/engine.h: the serving engine: it owns the tokenizer, the scheduler
 * loop (which owns the executor thread), the OpenAI API and the HTTP server,
 * and knows the order in which they start and stop.
 *
 * Start: tokenizer -> scheduler loop (over the caller's executor) -> api and
 * routes -> HTTP listener. The api starts in API_LOADING; engine_set_ready()
 * flips it to API_READY (/health 200) once the caller is ready to announce
 * it (systemd READY=1). Stop: engine_begin_drain() (new requests 503,
 * /health 503, scheduler refuses), engine_idle() polled up to a timeout,
 * engine_abort_all() if it passes, engine_destroy().
 */
#ifndef DSV4_SERVER_ENGINE_H
#define DSV4_SERVER_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"
#include "model/exec.h"

struct engine;

struct engine_options {
	const char *model_dir;           /* holds tokenizer.json */
	const char *served_model_name;   /* "model" in requests must match it */
	const char *api_key;             /* NULL / "" = no auth */
	const char *host;
	int port;                        /* 0 = any free port */
	int n_http_threads;              /* 0 = default */
	size_t max_body_bytes;           /* 0 = 8 MB (--max-request-body-mb) */
	unsigned max_connections;        /* 0 = http.h's default (--max-connections) */
	unsigned max_connections_per_ip; /* 0 = none (--max-connections-per-ip) */
	unsigned request_deadline_s;     /* 0 = http.h's default (--max-request-seconds) */
	uint32_t max_model_len;          /* 0 = the executor's */
	uint32_t max_num_seqs;           /* 0 = scheduler default */
	uint32_t max_num_batched_tokens; /* 0 = scheduler default */
	uint32_t max_queued_requests;    /* 0 = scheduler default */
	bool priority_scheduling;        /* --scheduling-policy priority (requests' "priority" field) */
	uint32_t max_logprobs;           /* --max-logprobs: the most (prompt / top) logprobs a request asks for; 0 = 20 */
	size_t responses_store_bytes;    /* --responses-store-bytes: the /v1/responses store; 0 = 64 MiB */
	double log_stats_interval_s;     /* --log-stats-interval: seconds between vLLM's stats lines (metrics.h); 0 =
					    $DSV4_LOG_STATS_INTERVAL or 10 (vLLM's default), < 0 = none (--disable-log-stats) */
	struct exec *exec;               /* borrowed; must outlive the engine */
	const struct kern_plan *plan;    /* (optional) the executor's kernel plan, for dsv4_kernel_info */
	/* (optional) called on the step-loop thread after every step and about
	 * once a second while idle (the systemd watchdog's liveness signal). */
	void (*heartbeat)(void *ctx);
	void *heartbeat_ctx;
	/* /health 503 "stalled" when the step loop has not beaten for this long
	 * (seconds; 0 = never): a tensor-parallel rank that stopped answering. */
	double health_stall_s;
	/* ---- cli: vLLM's command line ---- */
	bool use_bound_fd;               /* bound_fd: the socket http_bind() reserved before loading (host and */
	int bound_fd;                    /* port then only name it); the engine owns it from engine_create */
	bool disable_prefix_caching;     /* --no-enable-prefix-caching */
	bool disable_log_requests;       /* --disable-log-requests: no per-request access log line */
};

enum status engine_create(struct engine **out, const struct engine_options *opt, struct err *e) DSV4_WUR;

/* The port the HTTP server listens on. */
int engine_port(const struct engine *en);
/* The context length in effect (tokens). */
uint32_t engine_max_model_len(const struct engine *en);

void engine_set_ready(struct engine *en);
/* Stop admitting: /health and new requests answer 503; running ones go on. */
void engine_begin_drain(struct engine *en);
/* True when no request is waiting, running or being answered. */
bool engine_idle(struct engine *en);
/* End every request in flight now (their clients get the end of the stream). */
void engine_abort_all(struct engine *en);
/* Stop listening and free everything. NULL is a no-op. */
void engine_destroy(struct engine *en);

/* ---- tensor parallel ---- */
/* The tensor-parallel group failed (server/tp_serve.h): /health and new
 * requests answer 503 (state "failed") and the scheduler stops admitting. */
void engine_set_failed(struct engine *en);

#endif
