/*
 * server/openai_server.c: the chat / completions / tokenize / detokenize
 * routes: parse (openai_params.h), check state and model, render the chat
 * prompt, tokenize, then hand over to the job (openai_job.c) that submits
 * and answers.
 */
#include "openai_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/strbuf.h"
#include "common/log.h"
#include "model/chat.h"
#include "server/anthropic.h"
#include "server/frontend.h"
#include "model/gram.h"
#include "server/openai_format.h"
#include "server/responses.h"

/* ---- request handling ---- */

void oai_error_reply(struct http_response *resp, const struct oai_error *why)
{
	api_error(resp, why->status ? why->status : 400, why->param, why->code, "%s", why->message);
}

static bool check_model(struct api *api, const char *model, struct http_response *resp)
{
	if (!model || !strcmp(model, api_model_name(api)))
		return true;
	api_error(resp, 404, NULL, "model_not_found",
		  "The model '%.200s' does not exist (this server serves '%s')", model, api_model_name(api));
	return false;
}

static enum status tokenize(const struct model_tokenizer *tok, const char *text, size_t len, int32_t **ids,
			    size_t *n, struct err *e)
{
	return model_tokenizer_encode_alloc(tok, text, len, MODEL_TOK_ADDED_ALL, ids, n, e);
}

static void route_chat(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
		       struct http_stream *hs)
{
	struct oai_server *s = ctx;
	if (!fe_check_ready(api, resp))
		return;
	struct oai_request r;
	struct oai_error why;
	if (oai_parse_request(OAI_CHAT, req->body, req->body_len, s->opt.vocab_size, &r, &why)) {
		oai_error_reply(resp, &why);
		return;
	}
	if (!check_model(api, r.model, resp)) {
		oai_request_free(&r);
		return;
	}
	struct model_chat_options co;
	oai_chat_options(&r, &co);
	char *prompt = NULL;
	size_t plen = 0;
	struct err e = {0};
	enum status st = model_chat_encode(r.messages, r.n_messages, &co, &prompt, &plen, &e);
	if (st) {
		api_error(resp, st == ST_NOMEM ? 500 : 400, "messages", st == ST_NOMEM ? NULL : "invalid_value", "%s",
			  e.msg);
		oai_request_free(&r);
		return;
	}
	int32_t *ids = NULL;
	size_t n_ids = 0;
	st = tokenize(s->opt.tok, prompt, plen, &ids, &n_ids, &e);
	free(prompt);
	if (st) {
		api_error(resp, 500, NULL, NULL, "%s", e.msg);
		oai_request_free(&r);
		return;
	}
	oai__start_job(s, &r, &ids, &n_ids, 1, NULL, NULL, resp, hs);
	free(ids);
	oai_request_free(&r);
}

static void route_completions(void *ctx, struct api *api, const struct http_request *req,
			      struct http_response *resp, struct http_stream *hs)
{
	struct oai_server *s = ctx;
	if (!fe_check_ready(api, resp))
		return;
	struct oai_request r;
	struct oai_error why;
	if (oai_parse_request(OAI_COMPLETION, req->body, req->body_len, s->opt.vocab_size, &r, &why)) {
		oai_error_reply(resp, &why);
		return;
	}
	if (!check_model(api, r.model, resp)) {
		oai_request_free(&r);
		return;
	}
	uint32_t np = r.n_prompts;
	int32_t **ids = calloc(np, sizeof *ids);
	size_t *n_ids = calloc(np, sizeof *n_ids);
	char **echo = calloc(np, sizeof *echo);
	size_t *echo_len = calloc(np, sizeof *echo_len);
	bool ok = ids && n_ids && echo && echo_len;
	if (!ok)
		api_error(resp, 500, NULL, NULL, "out of memory");
	for (uint32_t i = 0; ok && i < np; i++) {
		const struct oai_prompt *p = &r.prompts[i];
		struct err e = {0};
		if (p->text) {
			if (tokenize(s->opt.tok, p->text, p->text_len, &ids[i], &n_ids[i], &e)) {
				api_error(resp, 500, NULL, NULL, "%s", e.msg);
				ok = false;
				break;
			}
			if (!n_ids[i]) {
				api_error(resp, 400, "prompt", "invalid_value", "the prompt is empty");
				ok = false;
				break;
			}
			if (r.echo) {
				echo[i] = malloc(p->text_len + 1);
				if (echo[i]) {
					memcpy(echo[i], p->text, p->text_len);
					echo_len[i] = p->text_len;
				}
			}
		} else {
			ids[i] = malloc(p->n_ids * sizeof(int32_t));
			if (!ids[i]) {
				api_error(resp, 500, NULL, NULL, "out of memory");
				ok = false;
				break;
			}
			memcpy(ids[i], p->ids, p->n_ids * sizeof(int32_t));
			n_ids[i] = p->n_ids;
			if (r.echo) {
				size_t len = 0;
				if (model_tokenizer_decode(s->opt.tok, p->ids, p->n_ids, MODEL_TOK_DECODE_SKIP_SPECIAL,
							   &echo[i], &len, &e) == ST_OK)
					echo_len[i] = len;
				else
					echo[i] = NULL;
			}
		}
	}
	if (ok)
		oai__start_job(s, &r, ids, n_ids, np, echo, echo_len, resp, hs);
	for (uint32_t i = 0; i < np && ids; i++)
		free(ids[i]);
	for (uint32_t i = 0; i < np && echo; i++)
		free(echo[i]);
	free(ids);
	free(n_ids);
	free(echo);
	free(echo_len);
	oai_request_free(&r);
}


static void route_tokenize(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
			   struct http_stream *hs)
{
	(void)hs;
	struct oai_server *s = ctx;
	struct oai_tokenize_request r;
	struct oai_error why;
	if (oai_parse_tokenize(req->body, req->body_len, &r, &why)) {
		oai_error_reply(resp, &why);
		return;
	}
	if (!check_model(api, r.model, resp)) {
		oai_tokenize_request_free(&r);
		return;
	}
	char *prompt = NULL;
	size_t plen = 0;
	struct err e = {0};
	const char *text = r.prompt;
	size_t tlen = r.prompt_len;
	if (r.is_chat) {
		struct model_chat_options co;
		oai_chat_options(&r.chat, &co);
		enum status st = model_chat_encode(r.chat.messages, r.chat.n_messages, &co, &prompt, &plen, &e);
		if (st) {
			api_error(resp, 400, "messages", "invalid_value", "%s", e.msg);
			oai_tokenize_request_free(&r);
			return;
		}
		text = prompt;
		tlen = plen;
	}
	int32_t *ids = NULL;
	size_t n = 0;
	enum status st = tokenize(s->opt.tok, text, tlen, &ids, &n, &e);
	free(prompt);
	if (st) {
		api_error(resp, 500, NULL, NULL, "%s", e.msg);
		oai_tokenize_request_free(&r);
		return;
	}
	struct strbuf b;
	strbuf_init(&b);
	strbuf_printf(&b, "{\"count\":%zu,\"max_model_len\":%u,\"tokens\":[", n, s->opt.max_model_len);
	for (size_t i = 0; i < n; i++)
		strbuf_printf(&b, i ? ",%d" : "%d", ids[i]);
	strbuf_puts(&b, "]");
	if (r.return_token_strs) {
		strbuf_puts(&b, ",\"token_strs\":[");
		for (size_t i = 0; i < n; i++) {
			const char *ts = model_tokenizer_token_str(s->opt.tok, ids[i]);
			if (i)
				strbuf_puts(&b, ",");
			strbuf_json_string(&b, ts ? ts : "", ts ? strlen(ts) : 0);
		}
		strbuf_puts(&b, "]");
	}
	strbuf_puts(&b, "}");
	free(ids);
	oai_tokenize_request_free(&r);
	api_reply_buf(resp, "application/json", &b);
}

static void route_detokenize(void *ctx, struct api *api, const struct http_request *req,
			     struct http_response *resp, struct http_stream *hs)
{
	(void)hs;
	struct oai_server *s = ctx;
	struct oai_detokenize_request r;
	struct oai_error why;
	if (oai_parse_detokenize(req->body, req->body_len, s->opt.vocab_size, &r, &why)) {
		oai_error_reply(resp, &why);
		return;
	}
	if (!check_model(api, r.model, resp)) {
		oai_detokenize_request_free(&r);
		return;
	}
	char *text = NULL;
	size_t len = 0;
	struct err e = {0};
	if (model_tokenizer_decode(s->opt.tok, r.tokens, r.n_tokens, 0, &text, &len, &e)) {
		api_error(resp, 400, "tokens", "invalid_value", "%s", e.msg);
		oai_detokenize_request_free(&r);
		return;
	}
	struct strbuf b;
	strbuf_init(&b);
	strbuf_puts(&b, "{\"prompt\":");
	oai_json_text(&b, text, len);
	strbuf_puts(&b, "}");
	free(text);
	oai_detokenize_request_free(&r);
	api_reply_buf(resp, "application/json", &b);
}

/* GET /tokenizer_info (vLLM): special tokens, model_max_length and the
 * chat template of tokenizer_config.json when it has one (DeepSeek-V4's
 * has none: its chat format is model/chat.c; null then). lm-evaluation-
 * harness's remote tokenizer reads it and tokenizes through /tokenize. */
static void route_tokenizer_info(void *ctx, struct api *api, const struct http_request *req,
				 struct http_response *resp, struct http_stream *hs)
{
	(void)api;
	(void)req;
	(void)hs;
	struct oai_server *s = ctx;
	const struct model_tokenizer *tok = s->opt.tok;
	struct strbuf b;
	strbuf_init(&b);
	strbuf_puts(&b, "{\"tokenizer_class\":\"dsv4\"");
	static const char *names[] = {"bos_token", "eos_token", "pad_token"};
	int32_t ids[] = {model_tokenizer_bos_id(tok), model_tokenizer_eos_id(tok), model_tokenizer_eos_id(tok)};
	for (int i = 0; i < 3; i++) {
		const char *t = ids[i] >= 0 ? model_tokenizer_token_str(tok, ids[i]) : NULL;
		strbuf_printf(&b, ",\"%s\":", names[i]);
		if (t)
			strbuf_json_string(&b, t, strlen(t));
		else
			strbuf_puts(&b, "null");
		strbuf_printf(&b, ",\"%s_id\":%d", names[i], ids[i]);
	}
	strbuf_printf(&b, ",\"model_max_length\":%u,\"vocab_size\":%d,\"add_bos_token\":false,\"chat_template\":",
		      s->opt.max_model_len, s->opt.vocab_size);
	json_t *cfg = NULL;
	if (s->opt.model_dir) {
		char path[4096];
		snprintf(path, sizeof path, "%s/tokenizer_config.json", s->opt.model_dir);
		cfg = json_load_file(path, 0, NULL);
	}
	json_t *tpl = cfg ? json_object_get(cfg, "chat_template") : NULL;
	if (json_is_string(tpl))
		strbuf_json_string(&b, json_string_value(tpl), json_string_length(tpl));
	else
		strbuf_puts(&b, "null");
	json_decref(cfg);
	strbuf_puts(&b, "}");
	api_reply_buf(resp, "application/json", &b);
}

/* ---- lifecycle ---- */

enum status oai_server_create(struct oai_server **out, const struct oai_server_options *opt, struct err *e)
{
	*out = NULL;
	struct oai_server *s = calloc(1, sizeof *s);
	if (!s)
		return err_set(e, ST_NOMEM, "server: out of memory");
	s->opt = *opt;
	s->free_head = -1;
	pthread_mutex_init(&s->wake_mu, NULL);
	atomic_store(&s->next_id, ((uint64_t)time(NULL) << 20) ^ (uint64_t)(uintptr_t)s);
	/* structured outputs: the vocabulary's byte trie, built once (without it requests run unconstrained) */
	struct err ge = {0};
	if (opt->tok && gram_vocab_from_tokenizer(&s->gvocab, opt->tok, &ge))
		log_msg(LOG_WARN, "openai", "structured outputs unavailable: %s", ge.msg);
	struct api *a = opt->api;
	if (api_route(a, "POST", "/v1/chat/completions", "/v1/chat/completions", route_chat, s) ||
	    api_route(a, "POST", "/v1/completions", "/v1/completions", route_completions, s) ||
	    api_route(a, "POST", "/tokenize", "/tokenize", route_tokenize, s) ||
	    api_route(a, "POST", "/detokenize", "/detokenize", route_detokenize, s) ||
	    api_route(a, "GET", "/tokenizer_info", "/tokenizer_info", route_tokenizer_info, s) ||
	    anth_register(s, a) || resp_register(s, a)) {
		oai_server_destroy(s);
		return err_set(e, ST_INVALID, "server: cannot register the OpenAI routes");
	}
	*out = s;
	return ST_OK;
}
uint32_t oai_server_n_jobs(struct oai_server *s)
{
	pthread_mutex_lock(&s->wake_mu);
	uint32_t n = s->n_jobs;
	pthread_mutex_unlock(&s->wake_mu);
	return n;
}

void oai_server_destroy(struct oai_server *s)
{
	if (!s)
		return;
	for (int c = 0; c < s->n_chunks; c++)
		free(s->chunks[c]);
	resp_store_destroy(s->resp_store);
	gram_vocab_destroy(s->gvocab);
	pthread_mutex_destroy(&s->wake_mu);
	free(s);
}
