/*
 * server/api.h: the OpenAI-shaped HTTP API over server/http.h: routing,
 * authentication, request ids, error bodies, /health, /metrics, /v1/models.
 *
 * Routes that need the engine (chat, completions, tokenize) register
 * themselves with api_route(); this module knows nothing about the model.
 * Error bodies are {"error": {"message", "type", "param", "code"}} with
 * the status codes of design.md ("The server").
 */
#ifndef DSV4_SERVER_API_H
#define DSV4_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "server/http.h"
#include "server/metrics.h"

struct api;

enum api_state { API_LOADING = 0, API_READY = 1, API_DRAINING = 2, API_FAILED = 3 };

struct api_options {
	const char *served_model_name; /* id in /v1/models and "model" checks */
	const char *api_key;           /* NULL or "" = no authentication */
	int max_model_len;             /* reported by /v1/models */
	bool check_host;               /* refuse a Host header that is not a loopback name (421): a keyless
					* loopback server against DNS rebinding (server/serve_guard.h) */
	bool disable_log_requests;     /* no access log line per request (--disable-log-requests) */
};

/* A route handler: req is complete; fill resp (and use stream for SSE). */
typedef void (*api_route_fn)(void *ctx, struct api *api, const struct http_request *req,
			     struct http_response *resp, struct http_stream *stream);

enum status api_create(struct api **out, const struct api_options *opt, struct err *e) DSV4_WUR;
void api_destroy(struct api *api);

/* Register METHOD PATH (exact match; a PATH ending in '*' matches any
 * longer path with that prefix, e.g. "/v1/responses/ *"). Up to 32 routes.
 * Call before serving. */
enum status api_route(struct api *api, const char *method, const char *path, const char *label, api_route_fn fn,
		      void *ctx) DSV4_WUR;

void api_set_state(struct api *api, enum api_state st);
enum api_state api_get_state(const struct api *api);
struct metrics *api_metrics(struct api *api);
const char *api_model_name(const struct api *api);

/* /health answers 503 {"status":"stalled"} while last_beat_s(ctx) (a
 * time_mono_s() value) is older than stall_s: the step loop is stuck (a
 * tensor-parallel rank that stopped answering keeps it in a collective for
 * up to --tp-timeout). Call before serving. */
void api_set_liveness(struct api *api, double (*last_beat_s)(void *ctx), void *ctx, double stall_s);

/* The access log: one INFO line per request (module "access"), unless
 * disable_log_requests. Replies made in the handler are logged by the api
 * itself; a streamed or buffered answer made over time (a generation job)
 * logs its own line when it ends, with what only it knows. model, finish
 * may be NULL ("-"); ttft_s < 0: none. */
struct api_access {
	const char *request_id;  /* X-Request-Id */
	const char *route;       /* the route label */
	const char *model;
	int status;              /* sent, or 499: the client went away */
	uint32_t prompt_tokens, output_tokens;
	const char *finish;      /* "stop", "length", "tool_calls", "abort", "error" */
	double ttft_s, duration_s;
};
bool api_log_requests(const struct api *api);
void api_access_log(const struct api *api, const struct api_access *a);
/* The request id of a reply being made (valid in route handlers, which may
 * copy it for a later api_access_log). */
const char *api_request_id(const struct http_response *resp);

/* Fill http_options' handler/app/on_complete for this api. */
void api_http_bind(struct api *api, struct http_options *opt);

/* The one OpenAI error writer: {"error": {"message", "type", "param",
 * "code"}}. type follows from status as OpenAI sends it
 * (api_error_type); param and code are strings or NULL (JSON null), never
 * a number. Codes in use: docs/api.md, "Errors". */
const char *api_error_type(int status);
struct strbuf;
void api_error_json(struct strbuf *b, int status, const char *param, const char *code, const char *msg);
void api_error(struct http_response *resp, int status, const char *param, const char *code, const char *fmt, ...)
	DSV4_PRINTF(5, 6);
/* A 200 whose body is b's bytes (taken; b is left empty), or a 500 when b
 * could not be built (out of memory). */
void api_reply_buf(struct http_response *resp, const char *content_type, struct strbuf *b);

#endif
