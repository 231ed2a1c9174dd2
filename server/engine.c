/*
 * server/engine.c: wires tokenizer, scheduler loop, OpenAI routes and the
 * HTTP server together, in start and stop order (engine.h).
 *
 * Stop order matters for the wake contract (openai.h): the HTTP server goes
 * first (every stream's close runs and releases its scheduler streams), then
 * the scheduler loop (no more notify callbacks), then the routes' state.
 */
#include "engine.h"
#include "server/serve_guard.h" /* SERVE_GUARD_DEFAULT_BODY_MB */

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "model/detok.h"
#include "model/tokenizer.h"
#include "scheduler/scheduler.h"
#include "server/api.h"
#include "server/http.h"
#include "server/openai.h"

/* Request bodies above this get 413: 64 MiB holds ~16M tokens of text. */
#define ENGINE_MAX_BODY_BYTES ((size_t)SERVE_GUARD_DEFAULT_BODY_MB << 20)
#define ENGINE_DEFAULT_HTTP_THREADS 8
#define ENGINE_CONNECTION_TIMEOUT_S 600

struct engine {
	struct model_tokenizer *tok;
	struct sched_loop *loop;
	struct api *api;
	struct oai_server *oai;
	struct http_server *http;
	uint32_t max_model_len;
	void (*user_heartbeat)(void *ctx); /* engine_options.heartbeat */
	void *user_heartbeat_ctx;
	_Atomic double last_beat_s;        /* for /health's stall check */
	uint32_t spec_k;                   /* speculative decoding: the executor's drafts per step */
};

static void engine__heartbeat(void *ctx)
{
	struct engine *en = ctx;
	atomic_store(&en->last_beat_s, time_mono_s());
	if (en->user_heartbeat)
		en->user_heartbeat(en->user_heartbeat_ctx);
}

static double engine__last_beat(void *ctx)
{
	struct engine *en = ctx;
	return atomic_load(&en->last_beat_s);
}

static void engine_stats(void *ctx, struct metrics_engine_stats *out)
{
	struct engine *en = ctx;
	struct sched_stats st;
	sched_loop_stats(en->loop, &st);
	out->n_running = (int)st.n_requests_running;
	out->n_waiting = (int)st.n_requests_waiting;
	out->kv_usage = st.kv_usage;
	out->prefix_queries_tokens = st.prefix_cache_queries_tokens;
	out->prefix_hits_tokens = st.prefix_cache_hits_tokens;
	out->n_preemptions = st.n_preemptions;
	out->prompt_tokens = st.prompt_tokens;
	out->generation_tokens = st.generation_tokens;
	out->spec_k = en->spec_k; /* speculative decoding */
	out->spec_drafts = st.spec_num_drafts;
	out->spec_draft_tokens = st.spec_num_draft_tokens;
	out->spec_accepted_tokens = st.spec_num_accepted_tokens;
	for (int i = 0; i < 8 && i < EXEC_SPEC_MAX_DRAFT; i++)
		out->spec_accepted_per_pos[i] = st.spec_accepted_per_pos[i];
}

enum status engine_create(struct engine **out, const struct engine_options *opt, struct err *e)
{
	*out = NULL;
	struct engine *en = calloc(1, sizeof *en);
	if (!en)
		return err_set(e, ST_NOMEM, "engine: out of memory");
	enum status st = model_tokenizer_load(&en->tok, opt->model_dir, e);
	if (st) {
		engine_destroy(en);
		return st;
	}
	struct sched_options so = {
		.max_num_seqs = opt->max_num_seqs,
		.max_num_batched_tokens = opt->max_num_batched_tokens,
		.max_queued_requests = opt->max_queued_requests,
		.max_model_len = opt->max_model_len,
		.policy = opt->priority_scheduling ? SCHED_POLICY_PRIORITY : SCHED_POLICY_FCFS,
		.detokenize = model_detok_piece,
		.detok_ctx = en->tok,
		.heartbeat = engine__heartbeat,
		.heartbeat_ctx = en,
		.disable_prefix_caching = opt->disable_prefix_caching,
	};
	en->user_heartbeat = opt->heartbeat;
	en->user_heartbeat_ctx = opt->heartbeat_ctx;
	atomic_store(&en->last_beat_s, time_mono_s());
	en->spec_k = opt->exec->info.max_draft_tokens;
	if ((st = sched_loop_create(&en->loop, &so, opt->exec, e))) {
		engine_destroy(en);
		return st;
	}
	const struct sched_options *ro = sched_resolved_options(sched_loop_core(en->loop));
	en->max_model_len = ro->max_model_len;
	struct api_options ao = {.served_model_name = opt->served_model_name, .api_key = opt->api_key,
				 .check_host = !(opt->api_key && opt->api_key[0]) &&
					       serve_guard_is_loopback(opt->host ? opt->host : "127.0.0.1"),
				 .max_model_len = (int)en->max_model_len,
				 .disable_log_requests = opt->disable_log_requests};
	if ((st = api_create(&en->api, &ao, e))) {
		engine_destroy(en);
		return st;
	}
	metrics_set_engine(api_metrics(en->api), engine_stats, en);
	double stats_s = opt->log_stats_interval_s;
	if (stats_s == 0) /* as vLLM's VLLM_LOG_STATS_INTERVAL */
		stats_s = getenv("DSV4_LOG_STATS_INTERVAL") ? strtod(getenv("DSV4_LOG_STATS_INTERVAL"), NULL) : 10.0;
	if (stats_s > 0 && (st = metrics_log_stats_start(api_metrics(en->api), stats_s, e))) {
		engine_destroy(en);
		return st;
	}
	for (int i = 0; opt->plan && i < opt->plan->n; i++) {
		const struct kern_plan_entry *pe = &opt->plan->entries[i];
		char layer[16];
		if (pe->layer < 0)
			snprintf(layer, sizeof layer, "global");
		else
			snprintf(layer, sizeof layer, "%d", pe->layer);
		if ((st = metrics_add_kernel_info(api_metrics(en->api), layer, pe->op, pe->variant))) {
			engine_destroy(en);
			return err_set(e, st, "engine: out of memory for the kernel plan");
		}
	}
	struct oai_server_options oo = {.tok = en->tok, .loop = en->loop, .api = en->api,
					.max_model_len = en->max_model_len,
					.vocab_size = model_tokenizer_vocab_size(en->tok),
					.max_logprobs = opt->max_logprobs, .model_dir = opt->model_dir,
					.responses_store_bytes = opt->responses_store_bytes};
	if (opt->exec->info.vocab_size && (int32_t)opt->exec->info.vocab_size < oo.vocab_size)
		oo.vocab_size = (int32_t)opt->exec->info.vocab_size;
	if ((st = oai_server_create(&en->oai, &oo, e))) {
		engine_destroy(en);
		return st;
	}
	struct http_options ho = {.host = opt->host ? opt->host : "127.0.0.1", .port = opt->port,
				  .n_threads = opt->n_http_threads > 0 ? opt->n_http_threads : ENGINE_DEFAULT_HTTP_THREADS,
				  .max_body_bytes = opt->max_body_bytes ? opt->max_body_bytes : ENGINE_MAX_BODY_BYTES,
				  .connection_timeout_s = ENGINE_CONNECTION_TIMEOUT_S,
				  .max_connections = opt->max_connections,
				  .max_connections_per_ip = opt->max_connections_per_ip,
				  .request_deadline_s = opt->request_deadline_s,
				  .use_bound_fd = opt->use_bound_fd, .bound_fd = opt->bound_fd};
	api_set_liveness(en->api, engine__last_beat, en, opt->health_stall_s);
	api_http_bind(en->api, &ho);
	if ((st = http_server_create(&en->http, &ho, e))) {
		engine_destroy(en);
		return st;
	}
	*out = en;
	return ST_OK;
}

int engine_port(const struct engine *en) { return http_server_port(en->http); }
uint32_t engine_max_model_len(const struct engine *en) { return en->max_model_len; }
void engine_set_ready(struct engine *en) { api_set_state(en->api, API_READY); }

void engine_begin_drain(struct engine *en)
{
	api_set_state(en->api, API_DRAINING);
	sched_loop_drain(en->loop);
}

bool engine_idle(struct engine *en)
{
	return sched_loop_n_active(en->loop) == 0 && oai_server_n_jobs(en->oai) == 0;
}

void engine_abort_all(struct engine *en) { oai_server_abort_all(en->oai); }

/* ---- tensor parallel ---- */
void engine_set_failed(struct engine *en)
{
	api_set_state(en->api, API_FAILED);
	sched_loop_drain(en->loop);
}

void engine_destroy(struct engine *en)
{
	if (!en)
		return;
	if (en->http)
		http_server_quiesce(en->http);
	http_server_destroy(en->http);
	metrics_log_stats_stop(en->api ? api_metrics(en->api) : NULL); /* it reads the loop */
	sched_loop_destroy(en->loop);
	oai_server_destroy(en->oai);
	api_destroy(en->api);
	model_tokenizer_destroy(en->tok);
	free(en);
}
