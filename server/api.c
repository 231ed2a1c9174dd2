/*
 * server/api.c: routing, auth, request ids, errors and the engine-free
 * endpoints. Every reply carries X-Request-Id (the client's, if it sent a
 * sane one; ours otherwise) so routers and logs can follow a request.
 */
#include "api.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "server/anthropic.h"
#include "common/timeutil.h"     /* /health stall */
#include "server/serve_guard.h" /* Host check */

#define API_MAX_ROUTES 32

struct route {
	char method[8];
	char path[64];
	const char *label;
	api_route_fn fn;
	void *ctx;
};

struct api {
	char *model;
	char *api_key;
	int max_model_len;
	bool check_host;
	bool log_requests;
	double (*last_beat_s)(void *ctx); /* api_set_liveness */
	void *beat_ctx;
	double stall_s;
	long created;
	atomic_int state;
	atomic_ullong next_id;
	struct metrics *metrics;
	struct route routes[API_MAX_ROUTES];
	int n_routes;
};

const char *api_error_type(int status)
{
	if (status == 429)
		return "requests"; /* OpenAI's type for a request-rate limit */
	return status >= 500 ? "server_error" : "invalid_request_error";
}

void api_error_json(struct strbuf *b, int status, const char *param, const char *code, const char *msg)
{
	const char *type = api_error_type(status);
	strbuf_puts(b, "{\"error\":{\"message\":");
	strbuf_json_string(b, msg, strlen(msg));
	strbuf_puts(b, ",\"type\":");
	strbuf_json_string(b, type, strlen(type));
	strbuf_puts(b, ",\"param\":");
	if (param && param[0])
		strbuf_json_string(b, param, strlen(param));
	else
		strbuf_puts(b, "null");
	strbuf_puts(b, ",\"code\":");
	if (code && code[0])
		strbuf_json_string(b, code, strlen(code));
	else
		strbuf_puts(b, "null");
	strbuf_puts(b, "}}");
}

void api_error(struct http_response *resp, int status, const char *param, const char *code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	struct strbuf b;
	strbuf_init(&b);
	api_error_json(&b, status, param, code, msg);
	size_t n;
	char *body = strbuf_take(&b, &n);
	http_reply(resp, body ? status : 500, "application/json", body, n);
}

void api_reply_buf(struct http_response *resp, const char *content_type, struct strbuf *b)
{
	size_t n;
	char *body = strbuf_take(b, &n);
	if (!body) {
		api_error(resp, 500, NULL, NULL, "out of memory");
		return;
	}
	http_reply(resp, 200, content_type, body, n);
}

enum status api_create(struct api **out, const struct api_options *opt, struct err *e)
{
	*out = NULL;
	struct api *a = calloc(1, sizeof *a);
	if (!a)
		return err_set(e, ST_NOMEM, "api: out of memory");
	a->model = strdup(opt->served_model_name ? opt->served_model_name : "dsv4");
	a->api_key = (opt->api_key && opt->api_key[0]) ? strdup(opt->api_key) : NULL;
	a->max_model_len = opt->max_model_len;
	a->check_host = opt->check_host;
	a->log_requests = !opt->disable_log_requests;
	a->created = (long)time(NULL);
	if (!a->model || (opt->api_key && opt->api_key[0] && !a->api_key)) {
		api_destroy(a);
		return err_set(e, ST_NOMEM, "api: out of memory");
	}
	enum status st = metrics_create(&a->metrics, a->model, e);
	if (st) {
		api_destroy(a);
		return st;
	}
	*out = a;
	return ST_OK;
}

void api_destroy(struct api *a)
{
	if (!a)
		return;
	metrics_destroy(a->metrics);
	free(a->model);
	free(a->api_key);
	free(a);
}

enum status api_route(struct api *a, const char *method, const char *path, const char *label, api_route_fn fn,
		      void *ctx)
{
	if (a->n_routes >= API_MAX_ROUTES || strlen(method) >= sizeof a->routes[0].method ||
	    strlen(path) >= sizeof a->routes[0].path)
		return ST_INVALID;
	struct route *r = &a->routes[a->n_routes++];
	snprintf(r->method, sizeof r->method, "%s", method);
	snprintf(r->path, sizeof r->path, "%s", path);
	r->label = label;
	r->fn = fn;
	r->ctx = ctx;
	return ST_OK;
}

void api_set_state(struct api *a, enum api_state st) { atomic_store(&a->state, (int)st); }
enum api_state api_get_state(const struct api *a) { return (enum api_state)atomic_load(&((struct api *)a)->state); }
struct metrics *api_metrics(struct api *a) { return a->metrics; }
const char *api_model_name(const struct api *a) { return a->model; }

/* Constant time in the length of the expected key. */
static bool key_matches(const char *expected, const char *given)
{
	size_t n = strlen(expected), m = strlen(given);
	unsigned diff = (unsigned)(n ^ m);
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)expected[i] ^ (unsigned char)(i < m ? given[i] : 0);
	return diff == 0;
}

static bool authorized(struct api *a, const struct http_request *req)
{
	if (!a->api_key)
		return true;
	/* Anthropic clients send x-api-key: KEY */
	const char *xk = http_request_header(req, "x-api-key");
	if (xk && key_matches(a->api_key, xk))
		return true;
	const char *h = http_request_header(req, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7))
		return false;
	h += 7;
	while (*h == ' ')
		h++;
	return key_matches(a->api_key, h);
}

bool api_log_requests(const struct api *a) { return a->log_requests; }

const char *api_request_id(const struct http_response *resp) { return resp->header_storage; }

void api_access_log(const struct api *a, const struct api_access *r)
{
	if (!a->log_requests)
		return;
	char ttft[32] = "-";
	if (r->ttft_s >= 0)
		snprintf(ttft, sizeof ttft, "%.3f", r->ttft_s);
	log_msg(LOG_INFO, "access",
		"%s %s model=%s status=%d prompt_tokens=%u output_tokens=%u finish=%s ttft_s=%s duration_s=%.3f",
		r->request_id && r->request_id[0] ? r->request_id : "-", r->route ? r->route : "other",
		r->model ? r->model : "-", r->status, r->prompt_tokens, r->output_tokens, r->finish ? r->finish : "-",
		ttft, r->duration_s);
}

/* The client's X-Request-Id if it is short and printable, else ours. */
static void set_request_id(struct api *a, const struct http_request *req, struct http_response *resp)
{
	const char *rid = http_request_header(req, "X-Request-Id");
	bool ok = rid && rid[0] && strlen(rid) < 128;
	for (const char *p = rid; ok && *p; p++)
		ok = *p > 0x20 && *p < 0x7f;
	if (ok)
		snprintf(resp->header_storage, sizeof resp->header_storage, "%s", rid);
	else
		snprintf(resp->header_storage, sizeof resp->header_storage, "dsv4-%llx-%llu",
			 (unsigned long long)a->created, (unsigned long long)atomic_fetch_add(&a->next_id, 1));
	for (int i = 0; i < 4; i++)
		if (!resp->headers[i].name) {
			resp->headers[i].name = "X-Request-Id";
			resp->headers[i].value = resp->header_storage;
			break;
		}
}

void api_set_liveness(struct api *a, double (*last_beat_s)(void *ctx), void *ctx, double stall_s)
{
	a->last_beat_s = last_beat_s;
	a->beat_ctx = ctx;
	a->stall_s = stall_s;
}

static void route_health(struct api *a, struct http_response *resp)
{
	static const char *names[] = {"loading", "ready", "draining", "failed"};
	enum api_state st = api_get_state(a);
	char body[64];
	if (st == API_READY && a->last_beat_s && a->stall_s > 0 && time_mono_s() - a->last_beat_s(a->beat_ctx) > a->stall_s) {
		http_reply_copy(resp, 503, "application/json", "{\"status\":\"stalled\"}");
		return;
	}
	snprintf(body, sizeof body, "{\"status\":\"%s\"}", names[st]);
	http_reply_copy(resp, st == API_READY ? 200 : 503, "application/json", body);
}

static void route_metrics(struct api *a, struct http_response *resp)
{
	struct strbuf b;
	strbuf_init(&b);
	metrics_render(a->metrics, &b);
	api_reply_buf(resp, "text/plain; version=0.0.4; charset=utf-8", &b);
}

static void model_object(struct api *a, struct strbuf *b)
{
	strbuf_puts(b, "{\"id\":");
	strbuf_json_string(b, a->model, strlen(a->model));
	strbuf_printf(b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"dsv4\",\"root\":", a->created);
	strbuf_json_string(b, a->model, strlen(a->model));
	strbuf_printf(b, ",\"parent\":null,\"max_model_len\":%d}", a->max_model_len);
}

static void route_models(struct api *a, const char *path, struct http_response *resp)
{
	struct strbuf b;
	strbuf_init(&b);
	if (!strcmp(path, "/v1/models")) {
		strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
		model_object(a, &b);
		strbuf_puts(&b, "]}");
	} else {
		const char *id = path + strlen("/v1/models/");
		if (strcmp(id, a->model)) {
			strbuf_free(&b);
			api_error(resp, 404, NULL, "model_not_found",
				  "The model '%.200s' does not exist", id);
			return;
		}
		model_object(a, &b);
	}
	api_reply_buf(resp, "application/json", &b);
}

/* A POST body is JSON: no Content-Type (taken as JSON), application/json or
 * application/...+json, with any parameters. Anything else is a 415, as a
 * form post or text/plain is what a cross-site page can send without a CORS
 * preflight. */
static bool json_content_type(const char *ct)
{
	if (!ct)
		return true;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	size_t n = strcspn(ct, ";");
	while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
		n--;
	if (n == 16 && !strncasecmp(ct, "application/json", 16))
		return true;
	return n > 17 && !strncasecmp(ct, "application/", 12) && !strncasecmp(ct + n - 5, "+json", 5) &&
	       !memchr(ct + 12, '/', n - 12);
}

static void handler(void *app, const struct http_request *req, struct http_response *resp,
		    struct http_stream **stream)
{
	struct api *a = app;
	const char *p = req->path;
	bool get = !strcmp(req->method, "GET");
	double t0 = time_mono_s();
	set_request_id(a, req, resp); /* first: a route may copy it for its access log line */
	bool v1 = !strncmp(p, "/v1/", 4);
	/* ---- the tokenizer routes cost CPU too; DNS rebinding ---- */
	bool keyed = v1 || !strcmp(p, "/tokenize") || !strcmp(p, "/detokenize");
	if (a->check_host && strcmp(p, "/health") && strcmp(p, "/metrics") &&
	    !serve_guard_host_header_ok(http_request_header(req, "Host"))) {
		resp->route = "bad_host";
		api_error(resp, 421, NULL, "misdirected_request",
			  "Host header names another server: this server without an API key answers only to "
			  "loopback names (localhost, 127.0.0.1, [::1])");
	} else if (keyed && !authorized(a, req)) {
		resp->route = "unauthorized";
		api_error(resp, 401, NULL, "invalid_api_key",
			  "Missing or invalid API key (expected 'Authorization: Bearer <key>')");
	} else if (!strcmp(p, "/health")) {
		resp->route = "/health";
		if (get)
			route_health(a, resp);
		else
			api_error(resp, 405, NULL, "method_not_allowed", "use GET %s", p);
	} else if (!strcmp(p, "/metrics")) {
		resp->route = "/metrics";
		if (get)
			route_metrics(a, resp);
		else
			api_error(resp, 405, NULL, "method_not_allowed", "use GET %s", p);
	} else if (!strcmp(p, "/v1/models") || !strncmp(p, "/v1/models/", 11)) {
		resp->route = "/v1/models";
		if (get)
			route_models(a, p, resp);
		else
			api_error(resp, 405, NULL, "method_not_allowed", "use GET %s", p);
	} else {
		const struct route *hit = NULL;
		bool path_known = false;
		for (int i = 0; i < a->n_routes; i++) {
			const char *rp = a->routes[i].path;
			size_t rl = strlen(rp);
			if (rl && rp[rl - 1] == '*' ? strncmp(rp, p, rl - 1) || !p[rl - 1] : strcmp(rp, p))
				continue;
			path_known = true;
			if (!strcmp(a->routes[i].method, req->method))
				hit = &a->routes[i];
		}
		if (hit && !strcmp(req->method, "POST") && !json_content_type(http_request_header(req, "Content-Type"))) {
			resp->route = hit->label;
			api_error(resp, 415, NULL, "unsupported_media_type",
				  "Content-Type must be application/json");
		} else if (hit && memchr(req->body, '\0', req->body_len)) {
			/* JSON text never holds a raw NUL; jansson would stop at it and
			 * parse a prefix ({"tokens": [68\0]} read as [68]). */
			resp->route = hit->label;
			api_error(resp, 400, NULL, "invalid_json",
				  "request body contains a NUL byte at offset %zu",
				  (size_t)((const char *)memchr(req->body, '\0', req->body_len) - req->body));
		} else if (hit) {
			resp->route = hit->label;
			hit->fn(hit->ctx, a, req, resp, *stream);
		} else if (path_known) {
			resp->route = "other";
			api_error(resp, 405, NULL, "method_not_allowed",
				  "method %s not allowed on %s", req->method, p);
		} else {
			resp->route = "other";
			api_error(resp, 404, NULL, "not_found", "no route %s %.200s", req->method,
				  p);
		}
	}
	if (!strncmp(p, "/v1/messages", 12) && (!p[12] || p[12] == '/'))
		anth_error_reshape(resp); /* Anthropic-shaped errors for the Messages API */
	/* /health and /metrics are polled: not logged, as vLLM's */
	if (!resp->stream.read && strcmp(p, "/health") && strcmp(p, "/metrics"))
		api_access_log(a, &(struct api_access){.request_id = resp->header_storage, .route = resp->route,
						       .status = resp->status, .ttft_s = -1,
						       .duration_s = time_mono_s() - t0});
}

static void on_complete(void *app, const char *route, int status, double seconds)
{
	struct api *a = app;
	metrics_http(a->metrics, route, status, seconds);
	if (status == 499)
		metrics_client_disconnect(a->metrics);
}

void api_http_bind(struct api *a, struct http_options *opt)
{
	opt->handler = handler;
	opt->app = a;
	opt->on_complete = on_complete;
}
