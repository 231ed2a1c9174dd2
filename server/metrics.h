/*
 * server/metrics.h: the Prometheus exposition of /metrics.
 *
 * vLLM's metric set under the dsv4: prefix (serving.md §2.1), every series
 * labelled model_name. The server records HTTP facts and request events
 * here; engine gauges (running, waiting, KV usage) and engine counters
 * (prefix cache, preemptions) are read at scrape time from a callback, so
 * nothing is copied per step. Thread-safe.
 */
#ifndef DSV4_SERVER_METRICS_H
#define DSV4_SERVER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/strbuf.h"

struct metrics;

/* What the engine reports at scrape time. */
struct metrics_engine_stats {
	int n_running, n_waiting;
	double kv_usage;                 /* 0..1 */
	uint64_t prefix_queries_tokens, prefix_hits_tokens;
	uint64_t n_preemptions;
	uint64_t prompt_tokens, generation_tokens;
	/* speculative decoding (docs/speculation.md); rendered when spec_k > 0 */
	uint32_t spec_k;
	uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens, spec_accepted_per_pos[8];
};

typedef void (*metrics_engine_fn)(void *ctx, struct metrics_engine_stats *out);

enum status metrics_create(struct metrics **out, const char *model_name, struct err *e) DSV4_WUR;
void metrics_destroy(struct metrics *m);

void metrics_set_engine(struct metrics *m, metrics_engine_fn fn, void *ctx);

/* One kernel-plan row: dsv4_kernel_info{layer,op,kernel} 1. Strings copied. */
enum status metrics_add_kernel_info(struct metrics *m, const char *layer, const char *op, const char *kernel) DSV4_WUR;

/* HTTP request finished: route is a static label, status the code sent
 * (499 when the client went away). */
void metrics_http(struct metrics *m, const char *route, int status, double seconds);
void metrics_client_disconnect(struct metrics *m);

/* A request finished (reason: "stop", "length", "tool_calls", "abort", "error").
 * Times in seconds, monotonic, measured from arrival; a negative value is not recorded. */
struct metrics_request {
	const char *finished_reason;
	double queue_s, ttft_s, e2e_s, prefill_s, decode_s, inference_s;
	int prompt_tokens, generation_tokens;
};
void metrics_request_done(struct metrics *m, const struct metrics_request *r);
/* Gap between two successive token batches of one request. */
void metrics_inter_token(struct metrics *m, double seconds);

/* Render the whole exposition (text format 0.0.4) into b. */
void metrics_render(struct metrics *m, struct strbuf *b);

/* vLLM's periodic stats line: every interval_s seconds one log line (module
 * "stats") with the prompt and generation throughput over the interval,
 * running / waiting requests, KV cache usage and the interval's prefix-cache
 * hit rate, read from the engine callback; INFO while there is work (and
 * once after), DEBUG when idle. Stop it before the engine callback's state
 * goes (metrics_destroy stops it too). Starting twice changes the interval. */
enum status metrics_log_stats_start(struct metrics *m, double interval_s, struct err *e) DSV4_WUR;
void metrics_log_stats_stop(struct metrics *m); /* NULL, or not started: no-op */
/* The line for two snapshots dt_s seconds apart; true when it shows work. */
bool metrics_stats_line(char *buf, size_t cap, const struct metrics_engine_stats *prev,
			const struct metrics_engine_stats *cur, double dt_s);

#endif
