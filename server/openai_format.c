/*
 * server/openai_format.c: builds the exact bytes of OpenAI chunks and
 * response fragments (see openai_format.h). No state, no locks: every
 * function appends to the caller's strbuf, whose sticky failure flag the
 * caller checks once.
 */
#include "openai_format.h"

#include <math.h>
#include <string.h>

#include "model/exec.h"
#include "server/api.h"

/* ---- text ---- */

void oai_json_text(struct strbuf *b, const char *s, size_t n)
{
	size_t ok = model_utf8_valid_prefix((const uint8_t *)s, n);
	if (ok == n) {
		strbuf_json_string(b, s, n);
		return;
	}
	struct strbuf t;
	strbuf_init(&t);
	size_t i = 0;
	while (i < n) {
		size_t run = model_utf8_valid_prefix((const uint8_t *)s + i, n - i);
		strbuf_append(&t, s + i, run);
		i += run;
		if (i >= n)
			break;
		size_t bad = 1;
		(void)model_utf8_classify((const uint8_t *)s + i, n - i, &bad);
		if (bad < 1)
			bad = 1;
		strbuf_puts(&t, "\xEF\xBF\xBD");
		i += bad;
	}
	if (strbuf_failed(&t))
		b->failed = true;
	strbuf_json_string(b, t.data ? t.data : "", t.len);
	strbuf_free(&t);
}

void oai_json_logprob(struct strbuf *b, float lp)
{
	if (!isfinite(lp))
		strbuf_puts(b, "-9999.0");
	else
		strbuf_printf(b, "%.9g", (double)lp);
}

/* ---- chunks ---- */

static void head_open(struct strbuf *b, const struct oai_head *h)
{
	strbuf_puts(b, "data: {\"id\":");
	strbuf_json_string(b, h->id, strlen(h->id));
	strbuf_printf(b, ",\"object\":\"%s\",\"created\":%ld,\"model\":",
		      h->chat ? "chat.completion.chunk" : "text_completion", h->created);
	strbuf_json_string(b, h->model, strlen(h->model));
	strbuf_puts(b, ",\"system_fingerprint\":null,\"choices\":[");
}

static void head_close(struct strbuf *b, const struct oai_head *h)
{
	strbuf_puts(b, h->usage_null ? "],\"usage\":null}\n\n" : "]}\n\n");
}

static void finish_json(struct strbuf *b, const char *finish_reason)
{
	if (finish_reason) {
		strbuf_puts(b, "\"");
		strbuf_puts(b, finish_reason);
		strbuf_puts(b, "\"");
	} else {
		strbuf_puts(b, "null");
	}
}

void oai_sse_chat_chunk(struct strbuf *b, const struct oai_head *h, uint32_t index, const struct oai_delta *d)
{
	head_open(b, h);
	strbuf_printf(b, "{\"index\":%u,\"delta\":", index);
	switch (d->kind) {
	case OAI_DELTA_ROLE:
		strbuf_puts(b, "{\"role\":\"assistant\",\"content\":\"\"}");
		break;
	case OAI_DELTA_CONTENT:
		strbuf_puts(b, "{\"content\":");
		oai_json_text(b, d->text, d->len);
		strbuf_puts(b, "}");
		break;
	case OAI_DELTA_REASONING:
		strbuf_puts(b, "{\"reasoning_content\":");
		oai_json_text(b, d->text, d->len);
		strbuf_puts(b, ",\"reasoning\":");
		oai_json_text(b, d->text, d->len);
		strbuf_puts(b, "}");
		break;
	case OAI_DELTA_TOOL_START:
		strbuf_printf(b, "{\"tool_calls\":[{\"index\":%u,\"id\":", d->tool_index);
		strbuf_json_string(b, d->tool_id, strlen(d->tool_id));
		strbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
		oai_json_text(b, d->tool_name, strlen(d->tool_name));
		strbuf_puts(b, ",\"arguments\":\"\"}}]}");
		break;
	case OAI_DELTA_TOOL_ARGS:
		strbuf_printf(b, "{\"tool_calls\":[{\"index\":%u,\"function\":{\"arguments\":", d->tool_index);
		oai_json_text(b, d->text, d->len);
		strbuf_puts(b, "}}]}");
		break;
	case OAI_DELTA_EMPTY:
		strbuf_puts(b, "{}");
		break;
	}
	strbuf_puts(b, ",\"logprobs\":");
	strbuf_puts(b, d->logprobs_json ? d->logprobs_json : "null");
	strbuf_puts(b, ",\"finish_reason\":");
	finish_json(b, d->finish_reason);
	strbuf_puts(b, "}");
	head_close(b, h);
}

void oai_sse_completion_chunk(struct strbuf *b, const struct oai_head *h, uint32_t index, const char *text,
			      size_t len, const char *logprobs_json, const char *finish_reason)
{
	head_open(b, h);
	strbuf_printf(b, "{\"index\":%u,\"text\":", index);
	oai_json_text(b, text ? text : "", text ? len : 0);
	strbuf_puts(b, ",\"logprobs\":");
	strbuf_puts(b, logprobs_json ? logprobs_json : "null");
	strbuf_puts(b, ",\"finish_reason\":");
	finish_json(b, finish_reason);
	strbuf_puts(b, "}");
	head_close(b, h);
}

void oai_sse_completion_prompt_lp_chunk(struct strbuf *b, const struct oai_head *h, uint32_t index,
					const char *prompt_logprobs_json)
{
	head_open(b, h);
	strbuf_printf(b, "{\"index\":%u,\"text\":\"\",\"logprobs\":null,\"finish_reason\":null,\"prompt_logprobs\":",
		      index);
	strbuf_puts(b, prompt_logprobs_json ? prompt_logprobs_json : "null");
	strbuf_puts(b, "}");
	head_close(b, h);
}

void oai_usage_json(struct strbuf *b, const struct oai_usage *u)
{
	strbuf_printf(b,
		      "{\"prompt_tokens\":%llu,\"completion_tokens\":%llu,\"total_tokens\":%llu,"
		      "\"prompt_tokens_details\":{\"cached_tokens\":%llu}}",
		      (unsigned long long)u->prompt_tokens, (unsigned long long)u->completion_tokens,
		      (unsigned long long)(u->prompt_tokens + u->completion_tokens),
		      (unsigned long long)u->cached_tokens);
}

void oai_sse_usage_chunk(struct strbuf *b, const struct oai_head *h, const struct oai_usage *u)
{
	head_open(b, h);
	strbuf_puts(b, "],\"usage\":");
	oai_usage_json(b, u);
	strbuf_puts(b, "}\n\n");
}

void oai_sse_error(struct strbuf *b, int status, const char *code, const char *message)
{
	strbuf_puts(b, "data: ");
	api_error_json(b, status, NULL, code, message);
	strbuf_puts(b, "\n\n");
}

void oai_sse_done(struct strbuf *b) { strbuf_puts(b, "data: [DONE]\n\n"); }

/* ---- logprobs ---- */

static void token_fields(struct strbuf *b, const struct model_tokenizer *tok, int32_t id, float lp)
{
	size_t n = 0;
	const char *piece = tok ? model_tokenizer_piece(tok, id, &n) : NULL;
	if (!piece)
		n = 0;
	strbuf_puts(b, "\"token\":");
	oai_json_text(b, piece ? piece : "", n);
	strbuf_puts(b, ",\"logprob\":");
	oai_json_logprob(b, lp);
	strbuf_puts(b, ",\"bytes\":[");
	for (size_t i = 0; i < n; i++)
		strbuf_printf(b, i ? ",%u" : "%u", (unsigned)(unsigned char)piece[i]);
	strbuf_puts(b, "]");
}

void oai_chat_logprob_entry(struct strbuf *b, const struct model_tokenizer *tok, int32_t token_id,
			    const struct kern_sample_out *s, uint32_t n_top)
{
	strbuf_puts(b, "{");
	token_fields(b, tok, token_id, s->logprob);
	strbuf_puts(b, ",\"top_logprobs\":[");
	uint32_t k = n_top < s->n_top ? n_top : s->n_top;
	for (uint32_t i = 0; i < k; i++) {
		strbuf_puts(b, i ? ",{" : "{");
		token_fields(b, tok, s->top_ids[i], s->top_logprobs[i]);
		strbuf_puts(b, "}");
	}
	strbuf_puts(b, "]}");
}

void oai_compl_logprobs_init(struct oai_compl_logprobs *c)
{
	memset(c, 0, sizeof *c);
	strbuf_init(&c->tokens);
	strbuf_init(&c->token_logprobs);
	strbuf_init(&c->top_logprobs);
	strbuf_init(&c->text_offset);
}

void oai_compl_logprobs_free(struct oai_compl_logprobs *c)
{
	strbuf_free(&c->tokens);
	strbuf_free(&c->token_logprobs);
	strbuf_free(&c->top_logprobs);
	strbuf_free(&c->text_offset);
}

void oai_compl_logprobs_add(struct oai_compl_logprobs *c, const struct model_tokenizer *tok, int32_t token_id,
			    const struct kern_sample_out *s, uint32_t n_top, size_t text_offset)
{
	const char *sep = c->n ? "," : "";
	size_t n = 0;
	const char *piece = tok ? model_tokenizer_piece(tok, token_id, &n) : NULL;
	strbuf_puts(&c->tokens, sep);
	oai_json_text(&c->tokens, piece ? piece : "", piece ? n : 0);
	strbuf_puts(&c->token_logprobs, sep);
	oai_json_logprob(&c->token_logprobs, s->logprob);
	strbuf_puts(&c->top_logprobs, sep);
	strbuf_puts(&c->top_logprobs, "{");
	uint32_t k = n_top < s->n_top ? n_top : s->n_top;
	uint32_t written = 0;
	for (uint32_t i = 0; i < k; i++) {
		size_t m = 0;
		const char *p = tok ? model_tokenizer_piece(tok, s->top_ids[i], &m) : NULL;
		/* Two ids can share a text after lossy UTF-8; a JSON object keeps the first. */
		struct strbuf key;
		strbuf_init(&key);
		oai_json_text(&key, p ? p : "", p ? m : 0);
		const char *ks = strbuf_cstr(&key);
		bool dup = false;
		if (ks && c->top_logprobs.data) {
			/* Cheap check inside this token's object only. */
			const char *obj = strrchr(c->top_logprobs.data, '{');
			dup = obj && strstr(obj, ks) != NULL;
		}
		if (!dup) {
			strbuf_puts(&c->top_logprobs, written ? "," : "");
			strbuf_puts(&c->top_logprobs, ks ? ks : "\"\"");
			strbuf_puts(&c->top_logprobs, ":");
			oai_json_logprob(&c->top_logprobs, s->top_logprobs[i]);
			written++;
		}
		strbuf_free(&key);
	}
	strbuf_puts(&c->top_logprobs, "}");
	strbuf_printf(&c->text_offset, "%s%zu", sep, text_offset);
	c->n++;
}

void oai_compl_logprobs_render(struct oai_compl_logprobs *c, struct strbuf *out, bool reset)
{
	strbuf_puts(out, "{\"tokens\":[");
	strbuf_append(out, c->tokens.data ? c->tokens.data : "", c->tokens.len);
	strbuf_puts(out, "],\"token_logprobs\":[");
	strbuf_append(out, c->token_logprobs.data ? c->token_logprobs.data : "", c->token_logprobs.len);
	strbuf_puts(out, "],\"top_logprobs\":[");
	strbuf_append(out, c->top_logprobs.data ? c->top_logprobs.data : "", c->top_logprobs.len);
	strbuf_puts(out, "],\"text_offset\":[");
	strbuf_append(out, c->text_offset.data ? c->text_offset.data : "", c->text_offset.len);
	strbuf_puts(out, "]}");
	if (reset) {
		strbuf_reset(&c->tokens);
		strbuf_reset(&c->token_logprobs);
		strbuf_reset(&c->top_logprobs);
		strbuf_reset(&c->text_offset);
		c->n = 0;
	}
}

/* ---- prompt logprobs (echo, vLLM's prompt_logprobs) ---- */

size_t oai_compl_logprobs_add_prompt(struct oai_compl_logprobs *c, const struct model_tokenizer *tok,
				     const int32_t *prompt, uint32_t n, const struct exec_prompt_lp *lp, uint32_t n_top)
{
	size_t off = 0;
	if (n_top > lp->n_top)
		n_top = lp->n_top;
	for (uint32_t p = 0; p < n; p++) {
		size_t len = 0;
		const char *piece = tok ? model_tokenizer_piece(tok, prompt[p], &len) : NULL;
		if (!piece)
			len = 0;
		if (p == 0) {
			const char *sep = c->n ? "," : "";
			strbuf_puts(&c->tokens, sep);
			oai_json_text(&c->tokens, piece ? piece : "", len);
			strbuf_puts(&c->token_logprobs, sep);
			strbuf_puts(&c->token_logprobs, "null");
			strbuf_puts(&c->top_logprobs, sep);
			strbuf_puts(&c->top_logprobs, "null");
			strbuf_printf(&c->text_offset, "%s%zu", sep, off);
			c->n++;
		} else {
			struct kern_sample_out s = {.token_id = prompt[p], .logprob = lp->logprob[p], .n_top = n_top};
			for (uint32_t k = 0; k < n_top; k++) {
				s.top_ids[k] = lp->top_ids[(size_t)p * lp->n_top + k];
				s.top_logprobs[k] = lp->top_logprobs[(size_t)p * lp->n_top + k];
			}
			oai_compl_logprobs_add(c, tok, prompt[p], &s, n_top, off);
		}
		off += len;
	}
	return off;
}

static void plp_entry(struct strbuf *b, const struct model_tokenizer *tok, int32_t id, float lp, int32_t rank)
{
	size_t len = 0;
	const char *piece = tok ? model_tokenizer_piece(tok, id, &len) : NULL;
	strbuf_printf(b, "\"%d\":{\"logprob\":", id);
	oai_json_logprob(b, lp);
	strbuf_printf(b, ",\"rank\":%d,\"decoded_token\":", rank);
	oai_json_text(b, piece ? piece : "", piece ? len : 0);
	strbuf_puts(b, "}");
}

void oai_prompt_logprobs_json(struct strbuf *b, const struct model_tokenizer *tok, const int32_t *prompt, uint32_t n,
			      const struct exec_prompt_lp *lp)
{
	strbuf_puts(b, "[");
	for (uint32_t p = 0; p < n; p++) {
		if (p == 0) {
			strbuf_puts(b, "null");
			continue;
		}
		strbuf_puts(b, ",{");
		plp_entry(b, tok, prompt[p], lp->logprob[p], lp->rank[p]);
		for (uint32_t k = 0; k < lp->n_top; k++) {
			int32_t id = lp->top_ids[(size_t)p * lp->n_top + k];
			if (id < 0 || id == prompt[p])
				continue;
			strbuf_puts(b, ",");
			plp_entry(b, tok, id, lp->top_logprobs[(size_t)p * lp->n_top + k], (int32_t)k + 1);
		}
		strbuf_puts(b, "}");
	}
	strbuf_puts(b, "]");
}
