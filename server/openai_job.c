/*
 * server/openai_job.c: the per-request job that turns scheduler events into
 * OpenAI responses (SSE chunks or one JSON body).
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
#include "openai_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "common/timeutil.h"
#include "model/gram.h"
#include "model/output_parser.h"
#include "server/openai_format.h"

/* SSE comment sent when a stream has been silent this long (long prefill, queueing). */
#define OAI_PING_INTERVAL_S 15.0
/* Events moved per pull. */
#define OAI_PULL_BATCH 64

struct tool_acc {
	char id[40];
	char *name;
	struct strbuf args;
};

struct choice {
	struct oai_job *job;
	uint32_t index;
	struct model_oparse *parser;  /* chat only */
	struct strbuf content, reasoning; /* accumulated (non-stream) */
	struct tool_acc *tools;
	size_t n_tools, cap_tools;
	bool cut_tool_call; /* the output ended inside a tool-call block (max_tokens): "length", not "tool_calls" */
	struct strbuf lp;             /* chat: pending logprob entries, comma-joined */
	uint32_t n_lp;
	struct oai_compl_logprobs clp;
	size_t text_bytes;            /* completion text so far (text_offset) */
	uint32_t n_tokens;
	double last_token_s;
	bool finished;
	const char *finish_reason;
};

struct sub {
	struct sched_stream *ss;
	uint64_t rid;
	uint32_t first_choice, n_finished;
	uint32_t n_prompt, n_cached;
	bool counted;
	char *echo;                   /* prompt text to echo, or NULL */
	size_t echo_len;
	int32_t *prompt;              /* prompt logprobs asked: the prompt ids (n_prompt) */
	struct exec_prompt_lp *plp;   /* from the PROMPT_LOGPROBS event (owned) */
	size_t echo_lp_bytes;         /* echo + logprobs: text_offset after the prompt's tokens */
};

struct oai_job {
	struct oai_server *srv;
	pthread_mutex_t mu;
	struct wake_slot *slot;
	int32_t slot_index;
	enum oai_kind kind;
	bool stream, logprobs, include_reasoning;
	uint32_t top_logprobs;
	bool echo_lp;                 /* completions echo + logprobs: the prompt's tokens lead the logprobs */
	bool prompt_logprobs;         /* vLLM's prompt_logprobs in the answer */
	char id[48];
	struct oai_head head;
	struct sub *subs;
	uint32_t n_subs;
	struct choice *choices;
	uint32_t n_choices, n_finished;
	struct strbuf out;
	size_t out_off;
	bool finalized;
	bool error;
	char error_msg[256];
	double last_write_s, t_arrival;
	struct oai_usage usage;
	const struct oai_job_format *fmt; /* another API's shapes (openai_internal.h), or NULL */
	void *fmt_ctx;
	char request_id[128];         /* for the access log line (api_access_log) */
	const char *route;
	double t_first_token;         /* monotonic; 0 = none yet */
};

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

/* ---- output helpers ---- */

static const char *finish_str(enum sched_finish_reason r, bool tools)
{
	switch (r) {
	case SCHED_FINISH_STOP:
		return tools ? "tool_calls" : "stop";
	case SCHED_FINISH_LENGTH:
		return tools ? "tool_calls" : "length";
	case SCHED_FINISH_ERROR:
		return "error";
	default:
		return "abort";
	}
}

/* Take the logprob entries pending on c as {"content":[...]} into buf (NULL if none). */
static const char *take_chat_lp(struct choice *c, struct strbuf *tmp)
{
	if (!c->job->logprobs || !c->n_lp)
		return NULL;
	strbuf_reset(tmp);
	strbuf_puts(tmp, "{\"content\":[");
	strbuf_append(tmp, c->lp.data, c->lp.len);
	strbuf_puts(tmp, "]}");
	strbuf_reset(&c->lp);
	c->n_lp = 0;
	return strbuf_cstr(tmp);
}

static void emit_chat_delta(struct choice *c, struct oai_delta *d)
{
	struct strbuf tmp;
	strbuf_init(&tmp);
	d->logprobs_json = take_chat_lp(c, &tmp);
	oai_sse_chat_chunk(&c->job->out, &c->job->head, c->index, d);
	strbuf_free(&tmp);
}

static struct tool_acc *tool_at(struct choice *c, size_t idx)
{
	if (idx >= c->n_tools)
		return NULL;
	return &c->tools[idx];
}

/* Output parser callback: one reasoning / content / tool event. */
static void on_parse(void *user, const struct model_oparse_event *ev)
{
	struct choice *c = user;
	struct oai_job *j = c->job;
	struct oai_delta d = {0};
	if (j->fmt) {
		if (ev->kind != MODEL_OPARSE_REASONING || j->include_reasoning)
			j->fmt->event(j->fmt_ctx, &j->out, ev);
		return;
	}
	switch (ev->kind) {
	case MODEL_OPARSE_REASONING:
		if (!j->include_reasoning || !ev->len)
			return;
		if (!j->stream) {
			strbuf_append(&c->reasoning, ev->text, ev->len);
			return;
		}
		d.kind = OAI_DELTA_REASONING;
		d.text = ev->text;
		d.len = ev->len;
		break;
	case MODEL_OPARSE_CONTENT:
		if (!ev->len)
			return;
		if (!j->stream) {
			strbuf_append(&c->content, ev->text, ev->len);
			return;
		}
		d.kind = OAI_DELTA_CONTENT;
		d.text = ev->text;
		d.len = ev->len;
		break;
	case MODEL_OPARSE_TOOL_CALL_START:
		if (c->n_tools == c->cap_tools) {
			size_t cap = c->cap_tools ? c->cap_tools * 2 : 4;
			struct tool_acc *t = realloc(c->tools, cap * sizeof *t);
			if (!t) {
				j->error = true;
				return;
			}
			c->tools = t;
			c->cap_tools = cap;
		}
		struct tool_acc *t = &c->tools[c->n_tools++];
		memset(t, 0, sizeof *t);
		snprintf(t->id, sizeof t->id, "%s", ev->tool_id);
		t->name = strdup(ev->tool_name ? ev->tool_name : "");
		strbuf_init(&t->args);
		if (!j->stream)
			return;
		d.kind = OAI_DELTA_TOOL_START;
		d.tool_index = (uint32_t)ev->tool_index;
		d.tool_id = ev->tool_id;
		d.tool_name = ev->tool_name ? ev->tool_name : "";
		break;
	case MODEL_OPARSE_TOOL_CALL_ARGS: {
		struct tool_acc *ta = tool_at(c, ev->tool_index);
		if (!ta || !ev->len)
			return;
		if (!j->stream) {
			strbuf_append(&ta->args, ev->text, ev->len);
			return;
		}
		d.kind = OAI_DELTA_TOOL_ARGS;
		d.tool_index = (uint32_t)ev->tool_index;
		d.text = ev->text;
		d.len = ev->len;
		break;
	}
	case MODEL_OPARSE_FINISH:
		c->cut_tool_call = ev->finish->open_tool_call;
		return;
	}
	emit_chat_delta(c, &d);
}

/* The text of a token event: whole UTF-8 characters already (the
 * scheduler's streaming detokenizer, model/detok.h, holds a split one back
 * and flushes it with the last token). */
static void feed_text(struct choice *c, const char *text, size_t n, const char *lp_json)
{
	struct oai_job *j = c->job;
	if (j->kind == OAI_COMPLETION && j->stream && (n || lp_json)) {
		c->text_bytes += n;
		oai_sse_completion_chunk(&j->out, &j->head, c->index, text ? text : "", n, lp_json, NULL);
	} else if (n) {
		if (j->kind == OAI_CHAT) {
			if (model_oparse_feed(c->parser, text, n))
				j->error = true;
		} else {
			c->text_bytes += n;
			strbuf_append(&c->content, text, n);
		}
	}
}

static void record_metrics(struct oai_job *j, struct sub *sb, const struct sched_event *ev, const char *reason)
{
	if (sb->counted)
		return;
	sb->counted = true;
	const struct sched_timing *t = &ev->timing;
	struct metrics_request r = {.finished_reason = reason, .queue_s = -1, .ttft_s = -1, .e2e_s = -1,
				    .prefill_s = -1, .decode_s = -1, .inference_s = -1,
				    .prompt_tokens = (int)sb->n_prompt, .generation_tokens = 0};
	for (uint32_t i = 0; i < j->n_choices; i++)
		if (i >= sb->first_choice && i < sb->first_choice + (j->n_choices / j->n_subs))
			r.generation_tokens += (int)j->choices[i].n_tokens;
	if (t->arrival_s > 0) {
		if (t->first_scheduled_s > 0)
			r.queue_s = t->first_scheduled_s - t->arrival_s;
		if (t->first_token_s > 0)
			r.ttft_s = t->first_token_s - t->arrival_s;
		if (t->finish_s > 0)
			r.e2e_s = t->finish_s - t->arrival_s;
		if (t->first_token_s > 0 && t->first_scheduled_s > 0)
			r.prefill_s = t->first_token_s - t->first_scheduled_s;
		if (t->finish_s > 0 && t->first_token_s > 0)
			r.decode_s = t->finish_s - t->first_token_s;
		if (t->finish_s > 0 && t->first_scheduled_s > 0)
			r.inference_s = t->finish_s - t->first_scheduled_s;
	}
	metrics_request_done(api_metrics(j->srv->opt.api), &r);
}

/* The prompt's log-probabilities (once per sub, before its tokens): the
 * entries lead every choice's echo logprobs; the rest is rendered at the end. */
static void handle_prompt_lp(struct oai_job *j, struct sub *sb, struct sched_event *ev)
{
	if (sb->plp || !sb->prompt || !ev->prompt_lp) {
		sched_event_clear(ev);
		return;
	}
	sb->plp = ev->prompt_lp;
	ev->prompt_lp = NULL;
	sched_event_clear(ev);
	uint32_t per = j->n_choices / j->n_subs;
	if (j->stream && j->prompt_logprobs && j->kind == OAI_COMPLETION) {
		struct strbuf pj;
		strbuf_init(&pj);
		oai_prompt_logprobs_json(&pj, j->srv->opt.tok, sb->prompt, sb->n_prompt, sb->plp);
		for (uint32_t i = sb->first_choice; i < sb->first_choice + per; i++)
			oai_sse_completion_prompt_lp_chunk(&j->out, &j->head, j->choices[i].index, strbuf_cstr(&pj));
		strbuf_free(&pj);
	}
	if (!j->echo_lp)
		return;
	for (uint32_t i = sb->first_choice; i < sb->first_choice + per; i++) {
		struct choice *c = &j->choices[i];
		sb->echo_lp_bytes = oai_compl_logprobs_add_prompt(&c->clp, j->srv->opt.tok, sb->prompt, sb->n_prompt,
								  sb->plp, j->top_logprobs);
		if (j->stream) {
			struct strbuf lpj;
			strbuf_init(&lpj);
			oai_compl_logprobs_render(&c->clp, &lpj, true);
			oai_sse_completion_chunk(&j->out, &j->head, c->index, "", 0, strbuf_cstr(&lpj), NULL);
			strbuf_free(&lpj);
		}
	}
}

static void handle_event(struct oai_job *j, struct sub *sb, struct sched_event *ev)
{
	if (ev->kind == SCHED_EV_PROMPT_LOGPROBS) {
		handle_prompt_lp(j, sb, ev);
		return;
	}
	uint32_t ci = sb->first_choice + ev->choice;
	if (ci >= j->n_choices) {
		sched_event_clear(ev);
		return;
	}
	struct choice *c = &j->choices[ci];
	if (c->finished) {
		sched_event_clear(ev);
		return;
	}
	if (ev->kind == SCHED_EV_TOKEN) {
		if (c->last_token_s > 0 && ev->time_s > c->last_token_s)
			metrics_inter_token(api_metrics(j->srv->opt.api), ev->time_s - c->last_token_s);
		c->last_token_s = ev->time_s;
		c->n_tokens++;
		if (j->t_first_token == 0)
			j->t_first_token = time_mono_s();
		if (j->logprobs) {
			if (j->kind == OAI_CHAT) {
				if (c->n_lp)
					strbuf_puts(&c->lp, ",");
				oai_chat_logprob_entry(&c->lp, j->srv->opt.tok, ev->token_id, &ev->sample, j->top_logprobs);
				c->n_lp++;
			} else {
				oai_compl_logprobs_add(&c->clp, j->srv->opt.tok, ev->token_id, &ev->sample,
						       j->top_logprobs, sb->echo_lp_bytes + c->text_bytes);
			}
		}
		if (j->kind == OAI_COMPLETION && j->stream && j->logprobs) {
			/* One chunk per token so that the logprobs line up with its text. */
			struct strbuf lpj;
			strbuf_init(&lpj);
			oai_compl_logprobs_render(&c->clp, &lpj, true);
			feed_text(c, ev->text, ev->text_bytes, strbuf_cstr(&lpj));
			strbuf_free(&lpj);
		} else {
			feed_text(c, ev->text, ev->text_bytes, NULL);
		}
		sched_event_clear(ev);
		return;
	}
	/* FINISH */
	if (sb->n_finished == 0) {
		sb->n_prompt = ev->n_prompt_tokens;
		sb->n_cached = ev->n_cached_tokens;
		j->usage.prompt_tokens += ev->n_prompt_tokens;
		j->usage.cached_tokens += ev->n_cached_tokens;
	}
	sb->n_finished++;
	j->usage.completion_tokens += ev->n_output_tokens;
	bool tools = false;
	if (j->kind == OAI_CHAT) {
		if (model_oparse_finish(c->parser))
			j->error = true;
		tools = c->n_tools > 0;
	}
	c->finished = true;
	c->finish_reason = finish_str(ev->finish, tools && !(ev->finish == SCHED_FINISH_LENGTH && c->cut_tool_call));
	if (ev->finish == SCHED_FINISH_ERROR) {
		j->error = true;
		snprintf(j->error_msg, sizeof j->error_msg, "the engine failed while generating this request");
	}
	j->n_finished++;
	if (j->fmt) {
		j->fmt->finish(j->fmt_ctx, &j->out, ev);
	} else if (j->stream) {
		if (j->kind == OAI_CHAT) {
			struct oai_delta d = {.kind = OAI_DELTA_EMPTY, .finish_reason = c->finish_reason};
			emit_chat_delta(c, &d);
		} else {
			oai_sse_completion_chunk(&j->out, &j->head, c->index, "", 0, NULL, c->finish_reason);
		}
	}
	if (sb->n_finished == j->n_choices / j->n_subs)
		record_metrics(j, sb, ev, sched_finish_reason_str(ev->finish));
	sched_event_clear(ev);
}

static void render_full(struct oai_job *j)
{
	struct strbuf *b = &j->out;
	strbuf_puts(b, "{\"id\":");
	strbuf_json_string(b, j->id, strlen(j->id));
	strbuf_printf(b, ",\"object\":\"%s\",\"created\":%ld,\"model\":",
		      j->kind == OAI_CHAT ? "chat.completion" : "text_completion", j->head.created);
	strbuf_json_string(b, j->head.model, strlen(j->head.model));
	strbuf_puts(b, ",\"system_fingerprint\":null,\"choices\":[");
	for (uint32_t i = 0; i < j->n_choices; i++) {
		struct choice *c = &j->choices[i];
		strbuf_printf(b, "%s{\"index\":%u,", i ? "," : "", c->index);
		if (j->kind == OAI_CHAT) {
			strbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
			if (c->n_tools && !c->content.len)
				strbuf_puts(b, "null");
			else
				oai_json_text(b, c->content.data ? c->content.data : "", c->content.len);
			strbuf_puts(b, ",\"reasoning_content\":");
			if (c->reasoning.len) {
				oai_json_text(b, c->reasoning.data, c->reasoning.len);
				strbuf_puts(b, ",\"reasoning\":");
				oai_json_text(b, c->reasoning.data, c->reasoning.len);
			} else {
				strbuf_puts(b, "null,\"reasoning\":null");
			}
			if (c->n_tools) {
				strbuf_puts(b, ",\"tool_calls\":[");
				for (size_t t = 0; t < c->n_tools; t++) {
					struct tool_acc *ta = &c->tools[t];
					strbuf_puts(b, t ? ",{\"id\":" : "{\"id\":");
					strbuf_json_string(b, ta->id, strlen(ta->id));
					strbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
					oai_json_text(b, ta->name ? ta->name : "", ta->name ? strlen(ta->name) : 0);
					strbuf_puts(b, ",\"arguments\":");
					oai_json_text(b, ta->args.len ? ta->args.data : "{}", ta->args.len ? ta->args.len : 2);
					strbuf_puts(b, "}}");
				}
				strbuf_puts(b, "]");
			} else {
				strbuf_puts(b, ",\"tool_calls\":[]");
			}
			strbuf_puts(b, "},\"logprobs\":");
			if (j->logprobs) {
				strbuf_puts(b, "{\"content\":[");
				strbuf_append(b, c->lp.data ? c->lp.data : "", c->lp.len);
				strbuf_puts(b, "]}");
			} else {
				strbuf_puts(b, "null");
			}
		} else {
			strbuf_puts(b, "\"text\":");
			struct sub *sb = &j->subs[i / (j->n_choices / j->n_subs)];
			if (sb->echo) {
				struct strbuf t;
				strbuf_init(&t);
				strbuf_append(&t, sb->echo, sb->echo_len);
				strbuf_append(&t, c->content.data ? c->content.data : "", c->content.len);
				oai_json_text(b, t.data ? t.data : "", t.len);
				strbuf_free(&t);
			} else {
				oai_json_text(b, c->content.data ? c->content.data : "", c->content.len);
			}
			strbuf_puts(b, ",\"logprobs\":");
			if (j->logprobs)
				oai_compl_logprobs_render(&c->clp, b, false);
			else
				strbuf_puts(b, "null");
			if (j->prompt_logprobs) {
				strbuf_puts(b, ",\"prompt_logprobs\":");
				if (sb->plp)
					oai_prompt_logprobs_json(b, j->srv->opt.tok, sb->prompt, sb->n_prompt, sb->plp);
				else
					strbuf_puts(b, "null");
			}
		}
		strbuf_puts(b, ",\"finish_reason\":");
		strbuf_printf(b, "\"%s\"}", c->finish_reason ? c->finish_reason : "stop");
	}
	strbuf_puts(b, "]");
	if (j->kind == OAI_CHAT && j->prompt_logprobs) {
		/* vLLM puts a chat answer's prompt_logprobs beside choices */
		strbuf_puts(b, ",\"prompt_logprobs\":");
		if (j->n_subs && j->subs[0].plp)
			oai_prompt_logprobs_json(b, j->srv->opt.tok, j->subs[0].prompt, j->subs[0].n_prompt, j->subs[0].plp);
		else
			strbuf_puts(b, "null");
	}
	strbuf_puts(b, ",\"usage\":");
	oai_usage_json(b, &j->usage);
	strbuf_puts(b, "}");
}

static void finalize(struct oai_job *j)
{
	j->finalized = true;
	if (j->fmt) {
		j->fmt->final(j->fmt_ctx, &j->out, &j->usage,
			      j->error ? (j->error_msg[0] ? j->error_msg : "internal error") : NULL);
	} else if (j->stream) {
		if (j->error)
			oai_sse_error(&j->out, 500, NULL, j->error_msg[0] ? j->error_msg : "internal error");
		if (j->head.usage_null)
			oai_sse_usage_chunk(&j->out, &j->head, &j->usage);
		oai_sse_done(&j->out);
	} else if (j->error) {
		api_error_json(&j->out, 500, NULL, NULL, j->error_msg[0] ? j->error_msg : "internal error");
	} else {
		render_full(j);
	}
}

/* Move every available event into the output buffer. Under j->mu. */
static void pump(struct oai_job *j)
{
	struct sched_event evs[OAI_PULL_BATCH];
	for (uint32_t s = 0; s < j->n_subs; s++) {
		struct sub *sb = &j->subs[s];
		if (!sb->ss)
			continue;
		for (;;) {
			uint32_t n = sched_stream_pull(sb->ss, evs, OAI_PULL_BATCH, 0);
			for (uint32_t i = 0; i < n; i++)
				handle_event(j, sb, &evs[i]);
			if (n < OAI_PULL_BATCH)
				break;
		}
	}
	if (!j->finalized && j->n_finished == j->n_choices)
		finalize(j);
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
			pump(j);
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
				record_metrics(j, sb, &ev, "abort");
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
	uint32_t lim = s->opt.max_logprobs ? s->opt.max_logprobs : KERN_SAMPLE_MAX_TOP_LOGPROBS;
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
			struct model_oparse_options po = {.emit = on_parse, .user = c,
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
