/*
 * server/openai_job_events.c: what an OpenAI job says (openai_job.h).
 * Scheduler events become SSE chunks as they come (stream) or accumulate
 * per choice into one JSON body (not stream); chat text goes through the
 * DSML output parser, whose events become content, reasoning and tool-call
 * deltas, or go to another API's format (openai_internal.h) when the job
 * has one. Each prompt's metrics are recorded once, at its last finish.
 */
#include "openai_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "common/timeutil.h"
#include "model/output_parser.h"

/* Events moved per pull. */
#define OAI_PULL_BATCH 64

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

void oai__job_on_parse(void *user, const struct model_oparse_event *ev)
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

void oai__job_record_metrics(struct oai_job *j, struct sub *sb, const struct sched_event *ev, const char *reason)
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
		oai__job_record_metrics(j, sb, ev, sched_finish_reason_str(ev->finish));
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

void oai__job_pump(struct oai_job *j)
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
