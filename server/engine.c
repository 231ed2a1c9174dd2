/*
 * server/engine.c: wires tokenizer, scheduler loop, OpenAI routes and the
 * HTTP server together, in start and stop order (engine.h), and the
 * deterministic test executor that `dsv4 serve --executor test` runs.
 *
 * Stop order matters for the wake contract (openai.h): the HTTP server goes
 * first (every stream's close runs and releases its scheduler streams), then
 * the scheduler loop (no more notify callbacks), then the routes' state.
 */
#include "engine.h"
#include "server/serve_guard.h" /* hardening: defaults */

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
	};
	en->user_heartbeat = opt->heartbeat;
	en->user_heartbeat_ctx = opt->heartbeat_ctx;
	atomic_store(&en->last_beat_s, time_mono_s());
	if ((st = sched_loop_create(&en->loop, &so, opt->exec, e))) {
		engine_destroy(en);
		return st;
	}
	const struct sched_options *ro = sched_resolved_options(sched_loop_core(en->loop));
	en->max_model_len = ro->max_model_len;
	struct api_options ao = {.served_model_name = opt->served_model_name, .api_key = opt->api_key,
				 .check_host = !(opt->api_key && opt->api_key[0]) &&
					       serve_guard_is_loopback(opt->host ? opt->host : "127.0.0.1"),
				 .max_model_len = (int)en->max_model_len};
	if ((st = api_create(&en->api, &ao, e))) {
		engine_destroy(en);
		return st;
	}
	metrics_set_engine(api_metrics(en->api), engine_stats, en);
	if (opt->log_stats_interval_s > 0 &&
	    (st = metrics_log_stats_start(api_metrics(en->api), opt->log_stats_interval_s, e))) {
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
				  .request_deadline_s = opt->request_deadline_s};
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

/* ---- the test executor ---- */

struct test_exec {
	struct exec ex;
	float *logits;
	void *work;
	int32_t *script;
	uint32_t n_script;
	uint32_t delay_ms;
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* The test executor's logits after token tok at position pos: sparse, a
 * handful of likely tokens over a flat floor. */
static void test_logits(struct test_exec *t, int32_t tok, int32_t pos)
{
	uint32_t V = t->ex.info.vocab_size;
	uint64_t h = mix64(((uint64_t)(uint32_t)tok << 32) ^ (uint64_t)pos);
	for (uint32_t v = 0; v < V; v++)
		t->logits[v] = -4.0f;
	for (uint32_t r = 0; r < 8; r++) {
		h = mix64(h);
		uint32_t id = (uint32_t)(h % V);
		t->logits[id] = 4.0f + (float)(r == 0) * 2.0f + (float)((h >> 40) & 255) / 256.0f;
	}
	if (t->ex.info.eos_token_id >= 0 && (uint32_t)t->ex.info.eos_token_id < V)
		t->logits[t->ex.info.eos_token_id] = -8.0f; /* rarely stops by itself */
}

/* Prompt log-probabilities (model/exec.h) from the same logits, row by row. */
static enum status test_prompt_lp(struct test_exec *t, const struct exec_step *st, uint32_t i, struct err *e)
{
	const struct exec_seq *s = &st->seqs[i];
	struct exec_prompt_lp *lp = s->prompt_lp;
	if (!lp || !lp->logprob || !s->prompt_ids)
		return ST_OK;
	for (uint32_t r = st->query_start[i]; r < st->query_start[i + 1]; r++) {
		uint32_t p = (uint32_t)st->positions[r];
		if (p + 1 >= s->n_prompt)
			continue;
		test_logits(t, st->token_ids[r], st->positions[r]);
		struct kern_token_logprobs_args a = {
			.logits = t->logits, .ld = t->ex.info.vocab_size, .vocab = t->ex.info.vocab_size, .n_rows = 1,
			.target = &s->prompt_ids[p + 1], .n_top = lp->n_top, .logprob = &lp->logprob[p + 1],
			.rank = &lp->rank[p + 1], .top_ids = lp->n_top ? lp->top_ids + (size_t)(p + 1) * lp->n_top : NULL,
			.top_logprobs = lp->n_top ? lp->top_logprobs + (size_t)(p + 1) * lp->n_top : NULL};
		enum status rc = kern_token_logprobs_ref(&a);
		if (rc)
			return err_set(e, rc, "test executor: prompt logprobs failed");
	}
	return ST_OK;
}

static enum status test_step(void *ctx, const struct exec_step *st, struct exec_sample *out, struct err *e)
{
	struct test_exec *t = ctx;
	uint32_t V = t->ex.info.vocab_size, k = 0;
	if (t->delay_ms) {
		struct timespec ts = {.tv_sec = t->delay_ms / 1000, .tv_nsec = (long)(t->delay_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	for (uint32_t i = 0; i < st->n_seqs; i++) {
		const struct exec_seq *s = &st->seqs[i];
		enum status rc = test_prompt_lp(t, st, i, e);
		if (rc)
			return rc;
		if (!s->sample)
			continue;
		if (s->n_output < t->n_script) {
			memset(&out[k], 0, sizeof out[k]);
			out[k].seq_index = i;
			out[k].out.token_id = t->script[s->n_output];
			k++;
			continue;
		}
		uint32_t last = st->query_start[i + 1] - 1;
		test_logits(t, st->token_ids[last], st->positions[last]);
		struct kern_sample_history hist = {.prompt_ids = s->prompt_ids, .n_prompt = s->n_prompt,
						   .output_ids = s->output_ids, .n_output = s->n_output};
		out[k].seq_index = i;
		rc = kern_sample_ref(t->logits, V, s->sampling, &hist, s->n_output, t->work, &out[k].out);
		if (rc)
			return err_set(e, rc, "test executor: sampling failed (bad parameters)");
		k++;
	}
	return ST_OK;
}

static const struct exec_ops test_ops = {.step = test_step};

enum status engine_test_exec_create(struct exec **out, uint32_t vocab_size, int32_t eos_token_id,
				    uint32_t max_model_len, struct err *e)
{
	*out = NULL;
	struct test_exec *t = calloc(1, sizeof *t);
	if (!t)
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	t->logits = malloc((size_t)vocab_size * sizeof(float));
	t->work = aligned_alloc(8, (kern_sample_workspace_bytes(vocab_size) + 7) & ~(size_t)7);
	if (!t->logits || !t->work) {
		free(t->logits);
		free(t->work);
		free(t);
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	}
	struct exec_layer_mix mix = {
		.sliding_window = 32,
		.swa = {.n_layers = 2, .ring_entry_bytes = 128},
		.csa = {.n_layers = 2, .compress_ratio = 4, .overlap = true, .kv_entry_bytes = 128,
			.indexer_entry_bytes = 64, .ring_entry_bytes = 128, .compressor_token_bytes = 512},
		.hca = {.n_layers = 2, .compress_ratio = 8, .kv_entry_bytes = 128, .ring_entry_bytes = 128,
			.compressor_token_bytes = 256},
	};
	t->ex.ops = &test_ops;
	t->ex.ctx = t;
	t->ex.info = (struct exec_info){
		.mix = mix,
		.block_tokens = 64,
		.n_blocks = 8192,
		.n_state_slots = 256,
		.vocab_size = vocab_size,
		.eos_token_id = eos_token_id,
		.max_step_tokens = 8192,
		.max_step_seqs = 256,
		.max_model_len = max_model_len ? max_model_len : 65536,
	};
	*out = &t->ex;
	return ST_OK;
}

enum status engine_test_exec_script(struct exec *ex, const int32_t *ids, uint32_t n, struct err *e)
{
	struct test_exec *t = ex->ctx;
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= t->ex.info.vocab_size)
			return err_set(e, ST_INVALID, "test executor script: id %d outside the vocabulary", ids[i]);
	int32_t *c = malloc((n ? n : 1) * sizeof *c);
	if (!c)
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	memcpy(c, ids, n * sizeof *c);
	free(t->script);
	t->script = c;
	t->n_script = n;
	return ST_OK;
}

void engine_test_exec_set_step_delay(struct exec *ex, uint32_t delay_ms)
{
	((struct test_exec *)ex->ctx)->delay_ms = delay_ms;
}

void engine_test_exec_destroy(struct exec *ex)
{
	if (!ex)
		return;
	struct test_exec *t = ex->ctx;
	free(t->script);
	free(t->logits);
	free(t->work);
	free(t);
}
