/*
 * server/metrics.c: counters and histograms in fixed tables, one mutex.
 * Bucket bounds follow vLLM's so dashboards built for it read ours. Also
 * vLLM's periodic stats line in the log (metrics_log_stats_start): one
 * thread that reads the engine callback every interval.
 */
#include "metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX_HTTP_SERIES 128
#define METRICS_MAX_REASONS 8
#define METRICS_MAX_KERNEL_ROWS 4096

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
				     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
				    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
				    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double tok_bounds[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
				    20000, 50000, 100000, 200000, 500000, 1000000};

#define NB(a) (sizeof(a) / sizeof((a)[0]))

struct hist {
	const char *name, *help;
	const double *bounds;
	int n;
	uint64_t counts[32]; /* per bucket, not cumulative; counts[n] is +Inf */
	double sum;
	uint64_t count;
};

struct http_series {
	const char *route;
	int status;
	uint64_t count;
};

struct kernel_row {
	char *layer, *op, *kernel;
};

enum { H_TTFT, H_ITL, H_E2E, H_QUEUE, H_PREFILL, H_DECODE, H_INFER, H_PROMPT, H_GEN, H_HTTP, H_COUNT };

struct metrics {
	pthread_mutex_t mu;
	char *model;
	metrics_engine_fn engine;
	void *engine_ctx;
	struct hist h[H_COUNT];
	struct http_series http[METRICS_MAX_HTTP_SERIES];
	int n_http;
	uint64_t disconnects;
	struct { const char *reason; uint64_t n; } success[METRICS_MAX_REASONS];
	int n_success;
	struct kernel_row *kernels;
	int n_kernels, cap_kernels;
	/* the stats line (metrics_log_stats_start) */
	pthread_t stats_thread;
	bool stats_running, stats_stop;
	pthread_cond_t stats_cv;  /* with mu: wakes the thread to stop */
	double stats_interval_s;
};

/* Every histogram's name, help text and bucket bounds, by H_ index. */
static const struct hist_def {
	const char *name, *help;
	const double *bounds;
	int n;
} hist_defs[H_COUNT] = {
	[H_TTFT] = {"dsv4:time_to_first_token_seconds", "Time to first token, from arrival.", ttft_bounds,
		    NB(ttft_bounds)},
	[H_ITL] = {"dsv4:inter_token_latency_seconds", "Time between successive token batches.", itl_bounds,
		   NB(itl_bounds)},
	[H_E2E] = {"dsv4:e2e_request_latency_seconds", "End-to-end request latency.", e2e_bounds, NB(e2e_bounds)},
	[H_QUEUE] = {"dsv4:request_queue_time_seconds", "Time waiting before first scheduled.", e2e_bounds,
		     NB(e2e_bounds)},
	[H_PREFILL] = {"dsv4:request_prefill_time_seconds", "First scheduled to first token.", e2e_bounds,
		       NB(e2e_bounds)},
	[H_DECODE] = {"dsv4:request_decode_time_seconds", "First token to last token.", e2e_bounds, NB(e2e_bounds)},
	[H_INFER] = {"dsv4:request_inference_time_seconds", "First scheduled to last token.", e2e_bounds,
		     NB(e2e_bounds)},
	[H_PROMPT] = {"dsv4:request_prompt_tokens", "Prompt tokens per request.", tok_bounds, NB(tok_bounds)},
	[H_GEN] = {"dsv4:request_generation_tokens", "Generated tokens per request.", tok_bounds, NB(tok_bounds)},
	[H_HTTP] = {"dsv4:http_request_duration_seconds", "HTTP request duration.", e2e_bounds, NB(e2e_bounds)},
};

static void hist_add(struct hist *h, double v)
{
	if (v < 0)
		return;
	int i = 0;
	while (i < h->n && v > h->bounds[i])
		i++;
	h->counts[i]++;
	h->sum += v;
	h->count++;
}

enum status metrics_create(struct metrics **out, const char *model_name, struct err *e)
{
	struct metrics *m = calloc(1, sizeof *m);
	if (!m || !(m->model = strdup(model_name))) {
		free(m);
		return err_set(e, ST_NOMEM, "metrics: out of memory");
	}
	pthread_mutex_init(&m->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&m->stats_cv, &ca);
	pthread_condattr_destroy(&ca);
	for (int i = 0; i < H_COUNT; i++) {
		m->h[i].name = hist_defs[i].name;
		m->h[i].help = hist_defs[i].help;
		m->h[i].bounds = hist_defs[i].bounds;
		m->h[i].n = hist_defs[i].n;
	}
	*out = m;
	return ST_OK;
}

void metrics_destroy(struct metrics *m)
{
	if (!m)
		return;
	metrics_log_stats_stop(m);
	pthread_cond_destroy(&m->stats_cv);
	for (int i = 0; i < m->n_kernels; i++) {
		free(m->kernels[i].layer);
		free(m->kernels[i].op);
		free(m->kernels[i].kernel);
	}
	free(m->kernels);
	pthread_mutex_destroy(&m->mu);
	free(m->model);
	free(m);
}

void metrics_set_engine(struct metrics *m, metrics_engine_fn fn, void *ctx)
{
	pthread_mutex_lock(&m->mu);
	m->engine = fn;
	m->engine_ctx = ctx;
	pthread_mutex_unlock(&m->mu);
}

enum status metrics_add_kernel_info(struct metrics *m, const char *layer, const char *op, const char *kernel)
{
	pthread_mutex_lock(&m->mu);
	enum status st = ST_OK;
	if (m->n_kernels >= METRICS_MAX_KERNEL_ROWS) {
		st = ST_INVALID;
		goto out;
	}
	if (m->n_kernels == m->cap_kernels) {
		int cap = m->cap_kernels ? m->cap_kernels * 2 : 64;
		struct kernel_row *k = realloc(m->kernels, (size_t)cap * sizeof *k);
		if (!k) {
			st = ST_NOMEM;
			goto out;
		}
		m->kernels = k;
		m->cap_kernels = cap;
	}
	struct kernel_row *r = &m->kernels[m->n_kernels];
	r->layer = strdup(layer);
	r->op = strdup(op);
	r->kernel = strdup(kernel);
	if (!r->layer || !r->op || !r->kernel) {
		free(r->layer);
		free(r->op);
		free(r->kernel);
		st = ST_NOMEM;
		goto out;
	}
	m->n_kernels++;
out:
	pthread_mutex_unlock(&m->mu);
	return st;
}

void metrics_http(struct metrics *m, const char *route, int status, double seconds)
{
	pthread_mutex_lock(&m->mu);
	hist_add(&m->h[H_HTTP], seconds);
	int i;
	for (i = 0; i < m->n_http; i++)
		if (m->http[i].status == status && !strcmp(m->http[i].route, route))
			break;
	if (i == m->n_http && m->n_http < METRICS_MAX_HTTP_SERIES) {
		m->http[i].route = route;
		m->http[i].status = status;
		m->n_http++;
	}
	if (i < m->n_http)
		m->http[i].count++;
	pthread_mutex_unlock(&m->mu);
}

void metrics_client_disconnect(struct metrics *m)
{
	pthread_mutex_lock(&m->mu);
	m->disconnects++;
	pthread_mutex_unlock(&m->mu);
}

void metrics_request_done(struct metrics *m, const struct metrics_request *r)
{
	pthread_mutex_lock(&m->mu);
	hist_add(&m->h[H_QUEUE], r->queue_s);
	hist_add(&m->h[H_TTFT], r->ttft_s);
	hist_add(&m->h[H_E2E], r->e2e_s);
	hist_add(&m->h[H_PREFILL], r->prefill_s);
	hist_add(&m->h[H_DECODE], r->decode_s);
	hist_add(&m->h[H_INFER], r->inference_s);
	hist_add(&m->h[H_PROMPT], r->prompt_tokens);
	hist_add(&m->h[H_GEN], r->generation_tokens);
	const char *reason = r->finished_reason ? r->finished_reason : "error";
	int i;
	for (i = 0; i < m->n_success; i++)
		if (!strcmp(m->success[i].reason, reason))
			break;
	if (i == m->n_success && m->n_success < METRICS_MAX_REASONS)
		m->success[m->n_success++].reason = reason;
	if (i < m->n_success)
		m->success[i].n++;
	pthread_mutex_unlock(&m->mu);
}

void metrics_inter_token(struct metrics *m, double seconds)
{
	pthread_mutex_lock(&m->mu);
	hist_add(&m->h[H_ITL], seconds);
	pthread_mutex_unlock(&m->mu);
}

/* Label values escape backslash, quote and newline (exposition format). */
static void label_value(struct strbuf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			strbuf_printf(b, "\\%c", *s);
		else if (*s == '\n')
			strbuf_puts(b, "\\n");
		else
			strbuf_append(b, s, 1);
	}
}

static void head(struct strbuf *b, const char *name, const char *type, const char *help)
{
	strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct metrics *m, struct strbuf *b, const char *name, const char *extra, double v)
{
	strbuf_printf(b, "%s{model_name=\"", name);
	label_value(b, m->model);
	strbuf_printf(b, "\"%s} %.17g\n", extra ? extra : "", v);
}

static void render_hist(struct metrics *m, struct strbuf *b, const struct hist *h)
{
	head(b, h->name, "histogram", h->help);
	uint64_t cum = 0;
	for (int i = 0; i <= h->n; i++) {
		cum += h->counts[i];
		strbuf_printf(b, "%s_bucket{model_name=\"", h->name);
		label_value(b, m->model);
		if (i < h->n)
			strbuf_printf(b, "\",le=\"%g\"} %llu\n", h->bounds[i], (unsigned long long)cum);
		else
			strbuf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	char nm[128];
	snprintf(nm, sizeof nm, "%s_sum", h->name);
	sample(m, b, nm, NULL, h->sum);
	snprintf(nm, sizeof nm, "%s_count", h->name);
	sample(m, b, nm, NULL, (double)h->count);
}

/* A metric with one unlabelled sample: its HELP/TYPE head and value. */
static void one_sample(struct metrics *m, struct strbuf *b, const char *name, const char *type, const char *help,
		       double v)
{
	head(b, name, type, help);
	sample(m, b, name, NULL, v);
}

void metrics_render(struct metrics *m, struct strbuf *b)
{
	struct metrics_engine_stats es;
	memset(&es, 0, sizeof es);
	pthread_mutex_lock(&m->mu);
	metrics_engine_fn fn = m->engine;
	void *ctx = m->engine_ctx;
	pthread_mutex_unlock(&m->mu);
	if (fn)
		fn(ctx, &es); /* outside our lock: the engine takes its own */

	pthread_mutex_lock(&m->mu);
	one_sample(m, b, "dsv4:num_requests_running", "gauge", "Requests in model execution batches.", es.n_running);
	one_sample(m, b, "dsv4:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", es.n_waiting);
	one_sample(m, b, "dsv4:kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use, 0..1.", es.kv_usage);
	one_sample(m, b, "dsv4:prefix_cache_queries_total", "counter", "Prefix-cache lookups, in tokens.",
		   (double)es.prefix_queries_tokens);
	one_sample(m, b, "dsv4:prefix_cache_hits_total", "counter", "Prefix-cache hits, in tokens.",
		   (double)es.prefix_hits_tokens);
	one_sample(m, b, "dsv4:num_preemptions_total", "counter", "Cumulative preemptions.", (double)es.n_preemptions);
	one_sample(m, b, "dsv4:prompt_tokens_total", "counter", "Prefill tokens processed.", (double)es.prompt_tokens);
	one_sample(m, b, "dsv4:generation_tokens_total", "counter", "Generated tokens.", (double)es.generation_tokens);
	if (es.spec_k) { /* speculative decoding: vLLM's spec_decode counters */
		one_sample(m, b, "dsv4:spec_decode_num_drafts_total", "counter", "Verify steps with at least one draft.",
			   (double)es.spec_drafts);
		one_sample(m, b, "dsv4:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
			   (double)es.spec_draft_tokens);
		one_sample(m, b, "dsv4:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
			   (double)es.spec_accepted_tokens);
		head(b, "dsv4:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted drafts by position.");
		for (uint32_t i = 0; i < es.spec_k && i < 8; i++) {
			char extra[32];
			snprintf(extra, sizeof extra, ",position=\"%u\"", i);
			sample(m, b, "dsv4:spec_decode_num_accepted_tokens_per_pos_total", extra,
			       (double)es.spec_accepted_per_pos[i]);
		}
	}

	head(b, "dsv4:request_success_total", "counter", "Finished requests by finish reason.");
	for (int i = 0; i < m->n_success; i++) {
		char extra[64];
		snprintf(extra, sizeof extra, ",finished_reason=\"%s\"", m->success[i].reason);
		sample(m, b, "dsv4:request_success_total", extra, (double)m->success[i].n);
	}
	for (int i = 0; i < H_COUNT; i++)
		render_hist(m, b, &m->h[i]);

	head(b, "dsv4:http_requests_total", "counter", "HTTP requests by route and status.");
	for (int i = 0; i < m->n_http; i++) {
		char extra[160];
		snprintf(extra, sizeof extra, ",route=\"%s\",status=\"%d\"", m->http[i].route, m->http[i].status);
		sample(m, b, "dsv4:http_requests_total", extra, (double)m->http[i].count);
	}
	head(b, "dsv4:http_requests_client_disconnected_total", "counter",
	     "Clients that went away before the response ended.");
	sample(m, b, "dsv4:http_requests_client_disconnected_total", NULL, (double)m->disconnects);

	head(b, "dsv4_kernel_info", "gauge", "The kernel chosen at load for each layer and op.");
	for (int i = 0; i < m->n_kernels; i++) {
		strbuf_puts(b, "dsv4_kernel_info{layer=\"");
		label_value(b, m->kernels[i].layer);
		strbuf_puts(b, "\",op=\"");
		label_value(b, m->kernels[i].op);
		strbuf_puts(b, "\",kernel=\"");
		label_value(b, m->kernels[i].kernel);
		strbuf_puts(b, "\"} 1\n");
	}
	pthread_mutex_unlock(&m->mu);
}

/* ---- the periodic stats line ---- */

bool metrics_stats_line(char *buf, size_t cap, const struct metrics_engine_stats *prev,
			const struct metrics_engine_stats *cur, double dt_s)
{
	double dp = (double)(cur->prompt_tokens - prev->prompt_tokens);
	double dg = (double)(cur->generation_tokens - prev->generation_tokens);
	uint64_t dq = cur->prefix_queries_tokens - prev->prefix_queries_tokens;
	uint64_t dh = cur->prefix_hits_tokens - prev->prefix_hits_tokens;
	if (dt_s <= 0)
		dt_s = 1e-9;
	snprintf(buf, cap,
		 "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
		 "Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
		 dp / dt_s, dg / dt_s, cur->n_running, cur->n_waiting, 100.0 * cur->kv_usage,
		 dq ? 100.0 * (double)dh / (double)dq : 0.0);
	if (cur->spec_k) { /* speculative decoding: the interval's acceptance (vLLM's SpecDecoding line) */
		uint64_t nd = cur->spec_drafts - prev->spec_drafts, nt = cur->spec_draft_tokens - prev->spec_draft_tokens;
		uint64_t na = cur->spec_accepted_tokens - prev->spec_accepted_tokens;
		size_t at = strlen(buf);
		if (at < cap)
			snprintf(buf + at, cap - at, ", Draft acceptance rate: %.1f%%, Mean acceptance length: %.2f",
				 nt ? 100.0 * (double)na / (double)nt : 0.0, nd ? 1.0 + (double)na / (double)nd : 0.0);
	}
	return dp > 0 || dg > 0 || cur->n_running > 0 || cur->n_waiting > 0;
}

static void *stats_main(void *arg)
{
	struct metrics *m = arg;
	struct metrics_engine_stats prev = {0}, cur;
	bool was_busy = false;
	pthread_mutex_lock(&m->mu);
	if (m->engine)
		m->engine(m->engine_ctx, &prev);
	double t_prev = time_mono_s();
	while (!m->stats_stop) {
		struct timespec now, until;
		clock_gettime(CLOCK_MONOTONIC, &now);
		double t = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec + m->stats_interval_s;
		until.tv_sec = (time_t)t;
		until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
		int rc = 0;
		while (!m->stats_stop && rc != ETIMEDOUT)
			rc = pthread_cond_timedwait(&m->stats_cv, &m->mu, &until);
		if (m->stats_stop || !m->engine)
			continue;
		memset(&cur, 0, sizeof cur);
		m->engine(m->engine_ctx, &cur);
		double t_now = time_mono_s();
		char line[320];
		bool busy = metrics_stats_line(line, sizeof line, &prev, &cur, t_now - t_prev);
		/* vLLM's rule: INFO while there is something to say, DEBUG when idle
		 * (one INFO line after the work ends shows the drop to zero) */
		log_msg(busy || was_busy ? LOG_INFO : LOG_DEBUG, "stats", "%s", line);
		was_busy = busy;
		prev = cur;
		t_prev = t_now;
	}
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

enum status metrics_log_stats_start(struct metrics *m, double interval_s, struct err *e)
{
	if (!(interval_s > 0) || interval_s > 86400)
		return err_set(e, ST_INVALID, "log stats interval %g s: expected (0, 86400]", interval_s);
	pthread_mutex_lock(&m->mu);
	bool running = m->stats_running;
	m->stats_interval_s = interval_s;
	m->stats_stop = false;
	pthread_mutex_unlock(&m->mu);
	if (running)
		return ST_OK;
	if (pthread_create(&m->stats_thread, NULL, stats_main, m))
		return err_set(e, ST_NOMEM, "metrics: cannot start the stats thread");
	pthread_mutex_lock(&m->mu);
	m->stats_running = true;
	pthread_mutex_unlock(&m->mu);
	return ST_OK;
}

void metrics_log_stats_stop(struct metrics *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	bool running = m->stats_running;
	m->stats_stop = true;
	m->stats_running = false;
	pthread_cond_broadcast(&m->stats_cv);
	pthread_mutex_unlock(&m->mu);
	if (running)
		pthread_join(m->stats_thread, NULL);
}
