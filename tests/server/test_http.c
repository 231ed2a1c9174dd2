/*
 * tests/server/test_http.c: the HTTP layer and the engine-free API routes,
 * over real sockets on loopback: health states, metrics text, models,
 * errors (401, 404, 405, 413), request ids, and a streamed response fed by
 * a producer thread, including a client that disconnects mid-stream.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/api.h"
#include "server/http.h"
#include "tests/test.h"

static int g_port;

/* Send raw, read the whole reply (Connection: close). Returns malloc'd text. */
static char *roundtrip(const char *raw, size_t raw_len, size_t max_read)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		close(fd);
		return NULL;
	}
	size_t off = 0;
	while (off < raw_len) {
		ssize_t w = send(fd, raw + off, raw_len - off, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap + 1);
	for (;;) {
		if (len == cap || len >= max_read)
			break;
		ssize_t r = recv(fd, buf + len, cap - len, 0);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	buf[len] = '\0';
	close(fd);
	return buf;
}

static char *get(const char *path, const char *extra_headers)
{
	char req[1024];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", path,
			 extra_headers ? extra_headers : "");
	return roundtrip(req, (size_t)n, 1 << 20);
}

static int status_of(const char *reply) { return reply && strlen(reply) > 12 ? atoi(reply + 9) : -1; }

/* GET path (with the extra header lines hdrs) answers status, with every
 * string of the NULL-terminated list after it in the reply. */
static void expect_get(const char *path, const char *hdrs, int status, ...)
{
	char *r = get(path, hdrs);
	T_CHECKF(status_of(r) == status, "GET %s: status %d, expected %d", path, status_of(r), status);
	va_list ap;
	va_start(ap, status);
	for (const char *needle = va_arg(ap, const char *); needle; needle = va_arg(ap, const char *))
		T_STR_CONTAINS(r, needle);
	va_end(ap);
	free(r);
}

/* ---- a streamed route: a producer thread writes 5 chunks, waking the stream ---- */

struct chunks {
	pthread_mutex_t mu;
	int produced, consumed;
	bool done;
	struct http_stream *st;
	atomic_int closed, aborted;
	pthread_t th;
	int delay_ms;
};

static struct chunks g_chunks;

static void *producer(void *arg)
{
	struct chunks *c = arg;
	for (int i = 0; i < 5; i++) {
		usleep((useconds_t)c->delay_ms * 1000);
		pthread_mutex_lock(&c->mu);
		c->produced++;
		if (i == 4)
			c->done = true;
		bool closed = atomic_load(&c->closed);
		if (!closed) /* the contract of http_stream_wake: never after close */
			http_stream_wake(c->st);
		pthread_mutex_unlock(&c->mu);
		if (closed)
			break;
	}
	return NULL;
}

static ssize_t chunks_read(void *ctx, char *buf, size_t max)
{
	struct chunks *c = ctx;
	pthread_mutex_lock(&c->mu);
	ssize_t n = HTTP_STREAM_WAIT;
	if (c->consumed < c->produced) {
		n = snprintf(buf, max, "data: chunk %d\n\n", c->consumed);
		c->consumed++;
	} else if (c->done) {
		n = HTTP_STREAM_END;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

static void chunks_close(void *ctx, bool aborted)
{
	struct chunks *c = ctx;
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->aborted, aborted);
	atomic_store(&c->closed, 1);
	pthread_mutex_unlock(&c->mu);
}

static void route_stream(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
			 struct http_stream *stream)
{
	(void)api;
	(void)req;
	struct chunks *c = ctx;
	c->st = stream;
	resp->status = 200;
	resp->content_type = "text/event-stream";
	resp->stream.read = chunks_read;
	resp->stream.close = chunks_close;
	resp->stream_ctx = c;
	pthread_create(&c->th, NULL, producer, c);
}

static void route_echo(void *ctx, struct api *api, const struct http_request *req, struct http_response *resp,
		       struct http_stream *stream)
{
	(void)ctx;
	(void)api;
	(void)stream;
	char *b = malloc(req->body_len + 1);
	memcpy(b, req->body, req->body_len + 1);
	http_reply(resp, 200, "application/octet-stream", b, req->body_len);
}

static void reset_chunks(int delay_ms)
{
	memset(&g_chunks, 0, sizeof g_chunks);
	pthread_mutex_init(&g_chunks.mu, NULL);
	g_chunks.delay_ms = delay_ms;
}

/* The head of an authorised POST to path with Connection: close, then the
 * extra header lines in extra (each ending in \r\n) and the blank line. */
static int post_head(char *buf, size_t cap, const char *path, const char *extra)
{
	return snprintf(buf, cap,
			"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer sekret\r\n%s\r\n",
			path, extra);
}

/* A bad host and a busy port are errors, not crashes. */
static void test_bind_errors(const struct http_options *ho)
{
	struct err e;
	struct http_server *bad = NULL;
	struct http_options hb = *ho;
	hb.host = "not-an-ip";
	T_CHECK(http_server_create(&bad, &hb, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "not-an-ip");
	hb.host = "127.0.0.1";
	hb.port = g_port;
	T_CHECK(http_server_create(&bad, &hb, &e) == ST_IO);
}

/* /health while loading (503), then ready (200). */
static void test_health_ready(struct api *api)
{
	expect_get("/health", NULL, 503, "loading", NULL);
	api_set_state(api, API_READY);
	expect_get("/health", NULL, 200, NULL);
}

/* The API key (401), the models routes, request ids, 404 and 405. */
static void test_models_and_errors(void)
{
	expect_get("/v1/models", NULL, 401,
		   "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"", NULL);
	expect_get("/v1/models", "Authorization: Bearer wrong\r\n", 401, NULL);
	expect_get("/v1/models", "Authorization: Bearer sekret\r\nX-Request-Id: abc-123\r\n", 200, "\"id\":\"tiny-dsv4\"",
		   "\"max_model_len\":4096", "X-Request-Id: abc-123", NULL);
	expect_get("/v1/models/tiny-dsv4", "Authorization: Bearer sekret\r\n", 200, NULL);
	expect_get("/v1/models/other", "Authorization: Bearer sekret\r\n", 404, "model_not_found", NULL);
	expect_get("/nope", NULL, 404, "\"error\":{\"message\":", "X-Request-Id: dsv4-", NULL);
	expect_get("/v1/echo", "Authorization: Bearer sekret\r\n", 405, NULL);
}

/* Bodies: echoed exactly; over the limit -> 413 (declared or streamed). */
static void test_bodies(void)
{
	const char *body = "{\"hello\": \"w\\u00f6rld\"}";
	char req[2048], cl[64];
	snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", strlen(body));
	int n = post_head(req, sizeof req, "/v1/echo", cl);
	n += snprintf(req + n, sizeof req - (size_t)n, "%s", body);
	char *r = roundtrip(req, (size_t)n, 1 << 20);
	T_CHECK(status_of(r) == 200);
	T_CHECK(r && strstr(r, "\r\n\r\n") && !strcmp(strstr(r, "\r\n\r\n") + 4, body));
	free(r);
	n = post_head(req, sizeof req, "/v1/echo", "Content-Length: 99999999\r\n");
	n += snprintf(req + n, sizeof req - (size_t)n, "xx");
	r = roundtrip(req, (size_t)n, 1 << 20);
	T_CHECK(status_of(r) == 413);
	free(r);
	size_t big = (1 << 16) + 100;
	char *bigreq = malloc(big + 512);
	n = post_head(bigreq, 512, "/v1/echo", "Transfer-Encoding: chunked\r\n");
	n += snprintf(bigreq + n, 512 - (size_t)n, "%zx\r\n", big);
	memset(bigreq + n, 'a', big);
	memcpy(bigreq + n + big, "\r\n0\r\n\r\n", 7);
	r = roundtrip(bigreq, (size_t)n + big + 7, 1 << 20);
	T_CHECK(status_of(r) == 413);
	free(r);
	free(bigreq);
}

/* A raw NUL inside a body is refused before any handler parses a prefix of it. */
static void test_nul_body(void)
{
	static const char nulbody[] = "{\"a\": [1\0]}";
	char req[2048], hdr[128];
	snprintf(hdr, sizeof hdr, "Content-Type: application/json\r\nContent-Length: %zu\r\n", sizeof nulbody - 1);
	int n = post_head(req, sizeof req, "/v1/echo", hdr);
	memcpy(req + n, nulbody, sizeof nulbody - 1);
	char *r = roundtrip(req, (size_t)n + sizeof nulbody - 1, 1 << 20);
	T_CHECK(status_of(r) == 400);
	T_STR_CONTAINS(r, "NUL byte at offset 8");
	free(r);
}

/* A stream fed by another thread arrives whole and in order; then a client
 * that leaves mid-stream: close(aborted = true) runs, even though the
 * producer is slow (the housekeeper notices). */
static void test_stream(void)
{
	char req[2048];
	int n = post_head(req, sizeof req, "/v1/stream", "Content-Length: 0\r\n");
	char *r = roundtrip(req, (size_t)n, 1 << 20);
	T_CHECK(status_of(r) == 200);
	T_STR_CONTAINS(r, "text/event-stream");
	const char *p = r;
	for (int i = 0; i < 5; i++) {
		char want[32];
		snprintf(want, sizeof want, "data: chunk %d", i);
		p = p ? strstr(p, want) : NULL;
		T_CHECKF(p != NULL, "missing %s", want);
	}
	free(r);
	pthread_join(g_chunks.th, NULL);
	for (int i = 0; i < 3000 && !atomic_load(&g_chunks.closed); i++) /* up to 30 s: a loaded ASan machine */
		usleep(10000);
	T_CHECK(atomic_load(&g_chunks.closed) && !atomic_load(&g_chunks.aborted));

	reset_chunks(400);
	r = roundtrip(req, (size_t)n, 10); /* read a few bytes and hang up */
	free(r);
	for (int i = 0; i < 3000 && !atomic_load(&g_chunks.closed); i++) /* up to 30 s: a loaded ASan machine */
		usleep(10000);
	T_CHECK(atomic_load(&g_chunks.closed));
	T_CHECK(atomic_load(&g_chunks.aborted));
	pthread_join(g_chunks.th, NULL);
}

/* The counters the requests above left, in the Prometheus text. */
static void test_metrics(void)
{
	expect_get("/metrics", NULL, 200, "# TYPE dsv4:num_requests_running gauge",
		   "dsv4:http_requests_total{model_name=\"tiny-dsv4\",route=\"/health\",status=\"200\"} 1",
		   "dsv4:http_requests_total{model_name=\"tiny-dsv4\",route=\"/health\",status=\"503\"} 1",
		   "dsv4:time_to_first_token_seconds_bucket{model_name=\"tiny-dsv4\",le=\"+Inf\"} 0",
		   "dsv4_kernel_info{layer=\"layers.0\",op=\"fp8_linear\",kernel=\"cpu_ref\"} 1",
		   "dsv4:http_requests_client_disconnected_total{model_name=\"tiny-dsv4\"} 1", NULL);
}

int main(void)
{
	struct err e;
	struct api *api = NULL;
	struct api_options ao = {.served_model_name = "tiny-dsv4", .api_key = "sekret", .max_model_len = 4096};
	T_CHECK(api_create(&api, &ao, &e) == ST_OK);
	reset_chunks(20);
	T_CHECK(api_route(api, "POST", "/v1/stream", "/v1/stream", route_stream, &g_chunks) == ST_OK);
	T_CHECK(api_route(api, "POST", "/v1/echo", "/v1/echo", route_echo, NULL) == ST_OK);
	T_CHECK(metrics_add_kernel_info(api_metrics(api), "layers.0", "fp8_linear", "cpu_ref") == ST_OK);
	struct http_options ho = {.host = "127.0.0.1", .port = 0, .n_threads = 4, .max_body_bytes = 1 << 16};
	api_http_bind(api, &ho);
	struct http_server *srv = NULL;
	T_CHECK(http_server_create(&srv, &ho, &e) == ST_OK);
	if (!srv)
		return test_exit();
	g_port = http_server_port(srv);
	T_CHECK(g_port > 0);

	test_bind_errors(&ho);
	test_health_ready(api);
	test_models_and_errors();
	test_bodies();
	test_nul_body();
	test_stream();
	test_metrics();

	api_set_state(api, API_DRAINING);
	expect_get("/health", NULL, 503, "draining", NULL);

	http_server_destroy(srv);
	api_destroy(api);
	return test_exit();
}
