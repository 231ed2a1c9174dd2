/*
 * server/openai_job.c: the life of the per-request job that turns scheduler
 * events into OpenAI responses (SSE chunks or one JSON body): submission,
 * wake-ups, the HTTP stream callbacks, freeing. What the job writes is
 * openai_job_events.c's (openai_job.h).
 *
 * A job owns: the parsed request's derived state, one sched_stream per
 * prompt (n choices each), per-choice output state (the DSML output parser
 * for chat, accumulated text for non-streamed answers, logprobs), and the
 * output buffer the HTTP pull callback drains. The job is
 * created in the handler and freed in the stream's close callback, which the
 * HTTP layer calls exactly once (finished or client gone).
 *
 * Wake-ups: each job sits in a slot of a table whose memory never moves;
 * the scheduler's notify callback gets the slot, takes the wake lock, and
 * wakes the slot's HTTP stream if it still has one. close() clears the slot
 * under the same lock before anything is freed, so a wake never reaches a
 * closed stream; a late notify for a reused slot is only a spurious wake.
 */
#include "openai_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "common/timeutil.h"
#include "model/gram.h"
#include "model/output_parser.h"

/* SSE comment sent when a stream has been silent this long (long prefill, queueing). */
#define OAI_PING_INTERVAL_S 15.0

/* ---- wake slots ---- */

static void job_notify(void *user)
{
	struct wake_slot *sl = user;
	struct oai_server *s = sl->srv;
	pthread_mutex_lock(&s->wake_mu);
	if (sl->hs)
		http_stream_wake(sl->hs);
	pthread_mutex_unlock(&s->wake_mu);
}

static struct wake_slot *slot_get(struct oai_server *s, int32_t i)
{
	return &s->chunks[i / OAI_SLOTS_PER_CHUNK][i % OAI_SLOTS_PER_CHUNK];
}

/* Under wake_mu. */
static int32_t slot_alloc(struct oai_server *s)
{
	if (s->free_head < 0) {
		if (s->n_chunks >= OAI_MAX_CHUNKS)
			return -1;
		struct wake_slot *c = calloc(OAI_SLOTS_PER_CHUNK, sizeof *c);
		if (!c)
			return -1;
		int32_t base = s->n_chunks * OAI_SLOTS_PER_CHUNK;
		s->chunks[s->n_chunks++] = c;
		for (int32_t i = OAI_SLOTS_PER_CHUNK - 1; i >= 0; i--) {
			c[i].srv = s;
			c[i].next_free = s->free_head;
			s->free_head = base + i;
		}
	}
	int32_t i = s->free_head;
	s->free_head = slot_get(s, i)->next_free;
	return i;
}

/* ---- HTTP stream callbacks ---- */

/* A non-streamed answer, once whole: 500 when generation failed. */
static int job_status(void *ctx)
{
	struct oai_job *j = ctx;
	pthread_mutex_lock(&j->mu);
	int st = j->error ? 500 : 200;
	pthread_mutex_unlock(&j->mu);
	return st;
}

static ssize_t job_read(void *ctx, char *buf, size_t max)
{
	struct oai_job *j = ctx;
	pthread_mutex_lock(&j->mu);
	if (j->out_off >= j->out.len) {
		strbuf_reset(&j->out);
		j->out_off = 0;
		if (!j->finalized)
			oai__job_pump(j);
	}
	if (j->out_off >= j->out.len && !j->finalized && j->stream &&
	    time_mono_s() - j->last_write_s > OAI_PING_INTERVAL_S) {
		if (j->fmt)
			j->fmt->ping(j->fmt_ctx, &j->out);
		else
			strbuf_puts(&j->out, ": ping\n\n");
	}
	if (strbuf_failed(&j->out)) {
		pthread_mutex_unlock(&j->mu);
		return HTTP_STREAM_END;
	}
	ssize_t r;
	if (j->out_off < j->out.len) {
		size_t n = j->out.len - j->out_off;
		if (n > max)
			n = max;
		memcpy(buf, j->out.data + j->out_off, n);
		j->out_off += n;
		j->last_write_s = time_mono_s();
		r = (ssize_t)n;
	} else {
		r = j->finalized ? HTTP_STREAM_END : HTTP_STREAM_WAIT;
	}
	pthread_mutex_unlock(&j->mu);
	return r;
}

static void choice_fini(struct choice *c)
{
	model_oparse_destroy(c->parser);
	strbuf_free(&c->content);
	strbuf_free(&c->reasoning);
	strbuf_free(&c->lp);
	oai_compl_logprobs_free(&c->clp);
	for (size_t t = 0; t < c->n_tools; t++) {
		free(c->tools[t].name);
		strbuf_free(&c->tools[t].args);
	}
	free(c->tools);
}

static void job_free(struct oai_job *j)
{
	if (!j)
		return;
	for (uint32_t s = 0; s < j->n_subs; s++) {
		sched_stream_release(j->subs[s].ss); /* aborts an unfinished request */
		free(j->subs[s].echo);
		free(j->subs[s].prompt);
		free(j->subs[s].plp);
	}
	free(j->subs);
	for (uint32_t i = 0; i < j->n_choices; i++)
		choice_fini(&j->choices[i]);
	free(j->choices);
	strbuf_free(&j->out);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

/* The request's access log line (api_access_log), when its answer ends. */
static void access_log(struct oai_job *j, bool aborted)
{
	struct api *api = j->srv->opt.api;
	if (!api_log_requests(api))
		return;
	struct api_access a = {.request_id = j->request_id, .route = j->route, .model = j->head.model,
			       .ttft_s = j->t_first_token > 0 ? j->t_first_token - j->t_arrival : -1,
			       .duration_s = time_mono_s() - j->t_arrival};
	for (uint32_t i = 0; i < j->n_subs; i++)
		a.prompt_tokens += j->subs[i].n_prompt;
	for (uint32_t i = 0; i < j->n_choices; i++)
		a.output_tokens += j->choices[i].n_tokens;
	a.status = aborted ? 499 : j->error && !j->stream ? 500 : 200;
	a.finish = aborted ? "abort" : j->error ? "error" : j->n_choices ? j->choices[0].finish_reason : NULL;
	api_access_log(api, &a);
}

static void job_close(void *ctx, bool aborted)
{
	struct oai_job *j = ctx;
	struct oai_server *s = j->srv;
	pthread_mutex_lock(&s->wake_mu);
	if (j->slot) {
		j->slot->hs = NULL;
		j->slot->job = NULL;
		j->slot->next_free = s->free_head;
		s->free_head = j->slot_index;
		s->n_jobs--;
	}
	pthread_mutex_unlock(&s->wake_mu);
	if (aborted) {
		for (uint32_t i = 0; i < j->n_subs; i++) {
			struct sub *sb = &j->subs[i];
			if (!sb->counted) {
				struct sched_event ev = {0};
				oai__job_record_metrics(j, sb, &ev, "abort");
			}
		}
		log_msg(LOG_INFO, "server", "%s: client went away; request aborted", j->id);
	}
	access_log(j, aborted);
	const struct oai_job_format *fmt = j->fmt;
	void *fmt_ctx = j->fmt_ctx;
	job_free(j);
	if (fmt)
		fmt->destroy(fmt_ctx);
}

/* ---- submission ---- */

/* The OpenAI name of a parameter the scheduler refused. */
static const char *param_name(enum sched_req_param p, enum oai_kind kind)
{
	switch (p) {
	case SCHED_PARAM_PROMPT: return kind == OAI_CHAT ? "messages" : "prompt";
	case SCHED_PARAM_N: return "n";
	case SCHED_PARAM_TEMPERATURE: return "temperature";
	case SCHED_PARAM_TOP_P: return "top_p";
	case SCHED_PARAM_MIN_P: return "min_p";
	case SCHED_PARAM_TOP_K: return "top_k";
	case SCHED_PARAM_PENALTY: return "presence_penalty";
	case SCHED_PARAM_REPETITION_PENALTY: return "repetition_penalty";
	case SCHED_PARAM_TOP_LOGPROBS: return kind == OAI_CHAT ? "top_logprobs" : "logprobs";
	case SCHED_PARAM_LOGIT_BIAS: return "logit_bias";
	case SCHED_PARAM_STOP_TOKEN_IDS: return "stop_token_ids";
	case SCHED_PARAM_STOP: return "stop";
	case SCHED_PARAM_MIN_TOKENS: return "min_tokens";
	case SCHED_PARAM_MAX_TOKENS: return "max_tokens";
	case SCHED_PARAM_PROMPT_LOGPROBS: return "prompt_logprobs";
	case SCHED_PARAM_GRAMMAR: return "response_format";
	case SCHED_PARAM_PRIORITY: return "priority";
	case SCHED_PARAM_NONE: break;
	}
	return NULL;
}

/* A scheduler refusal as an HTTP answer: the statuses are this layer's
 * (400 / 429 with Retry-After / 503); the parameter comes from
 * sched_check_param as data. */
static void refusal_reply(struct oai_server *s, const struct sched_request_params *p, enum oai_kind kind,
			  struct http_response *resp, enum sched_refusal why, const struct err *e)
{
	enum sched_req_param prm = SCHED_PARAM_NONE;
	if (why == SCHED_REFUSE_INVALID || why == SCHED_REFUSE_TOO_LONG) {
		struct err e2 = {0};
		(void)sched_check_param(sched_loop_core(s->opt.loop), p, &prm, &e2);
	}
	switch (why) {
	case SCHED_REFUSE_TOO_LONG:
		/* OpenAI names the input for any context overflow, whichever part is long */
		api_error(resp, 400, param_name(SCHED_PARAM_PROMPT, kind), "context_length_exceeded", "%s", e->msg);
		break;
	case SCHED_REFUSE_QUEUE_FULL:
		api_error(resp, 429, NULL, "rate_limit_exceeded", "%s", e->msg[0] ? e->msg : "queue full");
		for (int i = 0; i < 4; i++)
			if (!resp->headers[i].name) {
				resp->headers[i].name = "Retry-After";
				resp->headers[i].value = "1";
				break;
			}
		break;
	case SCHED_REFUSE_DRAINING:
		api_error(resp, 503, NULL, "draining", "the server is shutting down");
		break;
	case SCHED_REFUSE_INVALID:
		api_error(resp, 400, param_name(prm, kind), e->st == ST_UNSUPPORTED ? "unsupported_value" : "invalid_value",
			  "%s", e->msg);
		break;
	default:
		api_error(resp, 503, NULL, NULL, "%s", e->msg[0] ? e->msg : "cannot accept the request");
	}
}

static void fill_sched_params(const struct oai_request *r, struct sched_request_params *p)
{
	memset(p, 0, sizeof *p);
	p->sampling = r->sampling;
	p->has_seed = r->has_seed;
	p->max_tokens = r->max_tokens;
	p->ignore_eos = r->ignore_eos;
	p->min_tokens = r->min_tokens;
	p->include_stop_str_in_output = r->include_stop_str_in_output;
	p->keep_special_tokens = !r->skip_special_tokens;
	p->stop_token_ids = r->stop_token_ids;
	p->n_stop_token_ids = r->n_stop_token_ids;
	p->stop_strings = r->stop;
	p->n_stop_strings = r->n_stop;
	p->n = r->n;
	p->priority = r->priority;
	p->cache_salt = r->cache_salt;
	p->arrival_s = time_mono_s();
	/* prompt log-probabilities: vLLM's prompt_logprobs, or echo with logprobs */
	bool echo_lp = r->kind == OAI_COMPLETION && r->echo && r->logprobs;
	p->prompt_logprobs = r->prompt_logprobs || echo_lp;
	p->prompt_top_logprobs = r->prompt_logprobs ? r->prompt_top_logprobs : 0;
	if (echo_lp && r->top_logprobs > p->prompt_top_logprobs)
		p->prompt_top_logprobs = r->top_logprobs;
	p->score_only = r->score_only;
}

/* The server's own limits on an answer: --max-logprobs, and the size of a
 * buffered answer. false: resp holds the 400. */
static bool check_limits(struct oai_server *s, const struct oai_request *r, const size_t *n_ids, uint32_t n_prompts,
			 struct http_response *resp)
{
	uint32_t lim = s->opt.max_logprobs ? s->opt.max_logprobs : SCHED_MAX_TOP_LOGPROBS;
	if ((r->logprobs && r->top_logprobs > lim) || (r->prompt_logprobs && r->prompt_top_logprobs > lim)) {
		bool prompt = r->prompt_logprobs && r->prompt_top_logprobs > lim;
		const char *param = prompt ? "prompt_logprobs" : r->kind == OAI_CHAT ? "top_logprobs" : "logprobs";
		api_error(resp, 400, param, "invalid_value",
			  "'%s' asks for %u logprobs; this server's maximum is %u (--max-logprobs)", param,
			  prompt ? r->prompt_top_logprobs : r->top_logprobs, lim);
		return false;
	}
	if (!r->stream && r->max_tokens) { /* ---- hardening: the size of a buffered answer ---- */
		uint64_t per_tok = r->logprobs ? 72u * (1u + r->top_logprobs) : 8u, ctx = s->opt.max_model_len, est = 0;
		uint64_t toks = 0;
		for (uint32_t i = 0; i < n_prompts; i++) {
			uint64_t room = ctx > n_ids[i] ? ctx - n_ids[i] : 0;
			uint64_t t = r->max_tokens < room ? r->max_tokens : room;
			toks = t > toks ? t : toks;
			est += (uint64_t)r->n * t * per_tok;
		}
		if (est > OAI_MAX_RESPONSE_BYTES) {
			api_error(resp, 400, "max_tokens", "invalid_value",
				  "this non-streamed answer could reach %llu MB: %u prompt(s) x n %u x max_tokens %llu x "
				  "%llu bytes per token (logprobs %u) > the limit of %llu MB; lower n, max_tokens or "
				  "top_logprobs, or stream it",
				  (unsigned long long)(est >> 20), n_prompts, r->n, (unsigned long long)toks,
				  (unsigned long long)per_tok, r->logprobs ? 1 + r->top_logprobs : 0,
				  (unsigned long long)(OAI_MAX_RESPONSE_BYTES >> 20));
			return false;
		}
	}
	return true;
}

/* Submit, create the job and answer with the stream. prompts: n_prompts id arrays. */
static void start_job(struct oai_server *s, const struct oai_request *r, int32_t **prompt_ids, size_t *n_ids,
		      uint32_t n_prompts, char **echo, size_t *echo_len, const struct oai_job_format *fmt,
		      void *fmt_ctx, struct http_response *resp, struct http_stream *hs)
{
	if (!check_limits(s, r, n_ids, n_prompts, resp))
		return;
	struct gram *grammar = NULL; /* structured outputs; the scheduler retains it per request */
	if (!oai__grammar(s, r, &grammar, resp))
		return;
	struct oai_job *j = calloc(1, sizeof *j);
	if (!j) {
		gram_release(grammar);
		api_error(resp, 500, NULL, NULL, "out of memory");
		return;
	}
	j->fmt = fmt;
	j->fmt_ctx = fmt_ctx;
	pthread_mutex_init(&j->mu, NULL);
	strbuf_init(&j->out);
	j->srv = s;
	j->kind = r->kind;
	j->stream = r->stream;
	j->logprobs = r->logprobs;
	j->top_logprobs = r->top_logprobs;
	j->echo_lp = r->kind == OAI_COMPLETION && r->echo && r->logprobs;
	j->prompt_logprobs = r->prompt_logprobs;
	j->include_reasoning = r->include_reasoning;
	j->t_arrival = time_mono_s();
	j->last_write_s = j->t_arrival;
	snprintf(j->request_id, sizeof j->request_id, "%s", api_request_id(resp));
	j->route = resp->route;
	snprintf(j->id, sizeof j->id, "%s-%016llx%08llx", r->kind == OAI_CHAT ? "chatcmpl" : "cmpl",
		 (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull,
		 (unsigned long long)atomic_fetch_add(&s->next_id, 1));
	j->head = (struct oai_head){.id = j->id, .created = (long)time(NULL), .model = api_model_name(s->opt.api),
				    .chat = r->kind == OAI_CHAT, .usage_null = r->stream && r->include_usage};
	j->n_subs = n_prompts;
	j->n_choices = n_prompts * r->n;
	j->subs = calloc(n_prompts, sizeof *j->subs);
	j->choices = calloc(j->n_choices, sizeof *j->choices);
	if (!j->subs || !j->choices) {
		j->n_subs = 0;
		j->n_choices = 0;
		job_free(j);
		gram_release(grammar);
		api_error(resp, 500, NULL, NULL, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < j->n_choices; i++) {
		struct choice *c = &j->choices[i];
		c->job = j;
		c->index = i;
		strbuf_init(&c->content);
		strbuf_init(&c->reasoning);
		strbuf_init(&c->lp);
		oai_compl_logprobs_init(&c->clp);
		if (r->kind == OAI_CHAT) {
			struct model_oparse_options po = {.emit = oai__job_on_parse, .user = c,
							  .in_reasoning = r->thinking && !r->continue_final,
							  .call_id_seed = atomic_fetch_add(&s->next_id, 1) * 7919u + i};
			struct err e = {0};
			if (model_oparse_create(&c->parser, &po, &e)) {
				job_free(j);
				gram_release(grammar);
				api_error(resp, 500, NULL, NULL, "%s", e.msg);
				return;
			}
		}
	}
	struct sched_request_params p;
	fill_sched_params(r, &p);
	p.grammar = grammar;
	p.gram_vocab = s->gvocab;
	for (uint32_t i = 0; i < n_prompts; i++) {
		struct sub *sb = &j->subs[i];
		sb->first_choice = i * r->n;
		p.prompt_ids = prompt_ids[i];
		p.n_prompt = (uint32_t)n_ids[i];
		struct err e = {0};
		enum sched_refusal why = SCHED_ACCEPTED;
		if (sched_loop_submit(s->opt.loop, &p, &sb->ss, &sb->rid, &why, &e)) {
			sb->ss = NULL;
			gram_release(grammar);
			job_free(j);
			refusal_reply(s, &p, r->kind, resp, why == SCHED_ACCEPTED ? SCHED_REFUSE_NOMEM : why, &e);
			return;
		}
		if (p.prompt_logprobs) {
			sb->prompt = malloc((n_ids[i] ? n_ids[i] : 1) * sizeof(int32_t));
			if (sb->prompt)
				memcpy(sb->prompt, prompt_ids[i], n_ids[i] * sizeof(int32_t));
		}
		if (echo && echo[i]) {
			sb->echo = echo[i];
			sb->echo_len = echo_len[i];
			echo[i] = NULL;
		}
		sb->n_prompt = (uint32_t)n_ids[i]; /* metrics of a request aborted before its FINISH event */
	}
	gram_release(grammar);
	/* Chunks the client gets at once: the role (chat) or the echoed prompt (completions). */
	if (j->fmt) {
		j->fmt->start(j->fmt_ctx, &j->out, (uint32_t)n_ids[0]);
	} else if (j->stream) {
		for (uint32_t i = 0; i < j->n_choices; i++) {
			if (r->kind == OAI_CHAT) {
				struct oai_delta d = {.kind = OAI_DELTA_ROLE};
				oai_sse_chat_chunk(&j->out, &j->head, i, &d);
			} else {
				struct sub *sb = &j->subs[i / r->n];
				if (sb->echo)
					oai_sse_completion_chunk(&j->out, &j->head, i, sb->echo, sb->echo_len, NULL, NULL);
			}
		}
	}
	pthread_mutex_lock(&s->wake_mu);
	int32_t si = slot_alloc(s);
	if (si >= 0) {
		j->slot_index = si;
		j->slot = slot_get(s, si);
		j->slot->hs = hs;
		j->slot->job = j;
		s->n_jobs++;
	}
	pthread_mutex_unlock(&s->wake_mu);
	if (si < 0) {
		job_free(j);
		api_error(resp, 503, NULL, NULL, "too many requests in flight");
		return;
	}
	for (uint32_t i = 0; i < n_prompts; i++)
		sched_stream_set_notify(j->subs[i].ss, job_notify, j->slot);
	resp->status = 200;
	resp->content_type = j->stream ? "text/event-stream" : "application/json";
	resp->stream.read = job_read;
	resp->stream.close = job_close;
	resp->stream.status = job_status;  /* hardening: a failed non-streamed answer is a 500 */
	resp->stream_buffered = !j->stream;
	resp->stream_ctx = j;
}

void oai__start_job(struct oai_server *s, const struct oai_request *r, int32_t **prompt_ids, size_t *n_ids,
		    uint32_t n_prompts, char **echo, size_t *echo_len, struct http_response *resp,
		    struct http_stream *hs)
{
	start_job(s, r, prompt_ids, n_ids, n_prompts, echo, echo_len, NULL, NULL, resp, hs);
}

void oai__start_job_fmt(struct oai_server *s, const struct oai_request *r, int32_t *prompt_ids, size_t n_ids,
			const struct oai_job_format *fmt, void *fmt_ctx, struct http_response *resp,
			struct http_stream *hs)
{
	resp->stream_ctx = NULL;
	if (r->n != 1 || r->kind != OAI_CHAT)
		api_error(resp, 400, "n", "unsupported_value", "this endpoint answers one choice");
	else
		start_job(s, r, &prompt_ids, &n_ids, 1, NULL, NULL, fmt, fmt_ctx, resp, hs);
	if (!resp->stream_ctx) /* refused: no job owns the format */
		fmt->destroy(fmt_ctx);
}

void oai_server_abort_all(struct oai_server *s)
{
	pthread_mutex_lock(&s->wake_mu);
	for (int c = 0; c < s->n_chunks; c++)
		for (int i = 0; i < OAI_SLOTS_PER_CHUNK; i++) {
			struct oai_job *j = s->chunks[c][i].job;
			if (!j)
				continue;
			for (uint32_t k = 0; k < j->n_subs; k++)
				sched_loop_abort(s->opt.loop, j->subs[k].rid, SCHED_FINISH_SHUTDOWN);
		}
	pthread_mutex_unlock(&s->wake_mu);
}
