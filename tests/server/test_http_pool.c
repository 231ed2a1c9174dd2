/*
 * tests/server/test_http_pool.c: the HTTP layer's budgets of issue 17 over
 * real loopback sockets, with one connection thread:
 *   - requests with a body run on the bounded worker pool: while a POST's
 *     handler blocks, GET /health is answered (it waited behind the handler
 *     on the connection thread before); with one worker and room for two,
 *     a third POST gets 503 at once; the blocked ones then finish with 200;
 *     a client that leaves while its request waits for a worker costs
 *     nothing (its answer's close callback runs, aborted);
 *   - the write-progress deadline: a stream whose client reads nothing is
 *     cut (close callback with aborted = true, having produced far less than
 *     it would have), while a client that reads gets the whole stream.
 * No timing is asserted: every wait is bounded by a generous limit that only
 * a broken layer reaches.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "server/http.h"
#include "tests/test.h"

static int g_port;
static struct http_server *g_srv;

/* ---- the application ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_blocked;    /* handlers inside /block */
static bool g_release;   /* let them return */

struct big {
	size_t produced, total;
	atomic_int closed, aborted;
	unsigned seed;
};
static struct big g_big;

static ssize_t big_read(void *ctx, char *buf, size_t max)
{
	struct big *b = ctx;
	if (b->produced >= b->total)
		return HTTP_STREAM_END;
	size_t n = max < b->total - b->produced ? max : b->total - b->produced;
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)('a' + (rand_r(&b->seed) % 26));
	b->produced += n;
	return (ssize_t)n;
}

static void big_close(void *ctx, bool aborted)
{
	struct big *b = ctx;
	atomic_store(&b->aborted, aborted);
	atomic_store(&b->closed, 1);
}

static void handler(void *app, const struct http_request *req, struct http_response *resp,
		    struct http_stream **stream)
{
	(void)app;
	(void)stream;
	if (!strcmp(req->path, "/block")) {
		pthread_mutex_lock(&g_mu);
		g_blocked++;
		pthread_cond_broadcast(&g_cv);
		while (!g_release)
			pthread_cond_wait(&g_cv, &g_mu);
		g_blocked--;
		pthread_mutex_unlock(&g_mu);
		http_reply_copy(resp, 200, "text/plain", "done");
	} else if (!strcmp(req->path, "/big")) {
		resp->status = 200;
		resp->content_type = "application/octet-stream";
		resp->stream.read = big_read;
		resp->stream.close = big_close;
		resp->stream_ctx = &g_big;
	} else {
		http_reply_copy(resp, 200, "text/plain", "ok");
	}
}

/* ---- the client side ---- */

static int connect_port(int rcvbuf)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
	struct timeval tv = {.tv_sec = 20};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		close(fd);
		return -1;
	}
	return fd;
}

static int send_req(int fd, const char *method, const char *path, const char *body)
{
	char req[512];
	int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
			 method, path, strlen(body), body);
	return send(fd, req, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

/* The status of the answer on fd (reads it all; -1 on timeout / close without one). */
static int read_status(int fd, size_t *body_bytes)
{
	char buf[65536];
	size_t len = 0, total = 0;
	char head[32] = {0};
	for (;;) {
		ssize_t r = recv(fd, buf, sizeof buf, 0);
		if (r <= 0)
			break;
		if (len < sizeof head - 1) {
			size_t k = (size_t)r < sizeof head - 1 - len ? (size_t)r : sizeof head - 1 - len;
			memcpy(head + len, buf, k);
			len += k;
		}
		total += (size_t)r;
	}
	if (body_bytes)
		*body_bytes = total;
	return len > 12 && !strncmp(head, "HTTP/1.1 ", 9) ? atoi(head + 9) : -1;
}

static void wait_blocked(int n)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 30;
	pthread_mutex_lock(&g_mu);
	while (g_blocked < n && pthread_cond_timedwait(&g_cv, &g_mu, &dl) == 0) {
	}
	pthread_mutex_unlock(&g_mu);
}

static void test_pool(void)
{
	int a = connect_port(0), b = connect_port(0);
	T_CHECK(a >= 0 && b >= 0);
	T_CHECK(send_req(a, "POST", "/block", "{\"x\":1}") == 0);
	wait_blocked(1);
	pthread_mutex_lock(&g_mu);
	T_CHECKF(g_blocked == 1, "the first POST's handler runs (%d)", g_blocked);
	pthread_mutex_unlock(&g_mu);
	T_CHECK(send_req(b, "POST", "/block", "{\"x\":2}") == 0);

	/* the one connection thread is free while the worker blocks */
	int h = connect_port(0);
	T_CHECK(send_req(h, "GET", "/health", "") == 0);
	T_CHECKF(read_status(h, NULL) == 200, "GET /health while a POST handler blocks");
	close(h);

	/* one worker busy, one request waiting: max_queued_work 2 is reached */
	for (int i = 0; i < 3000 && http_server_n_work(g_srv) < 2; i++)
		usleep(10000);
	T_CHECKF(http_server_n_work(g_srv) == 2, "two POSTs on the pool (%u)", http_server_n_work(g_srv));
	int c = connect_port(0);
	T_CHECK(send_req(c, "POST", "/block", "{\"x\":3}") == 0);
	int st = read_status(c, NULL);
	close(c);
	T_CHECKF(st == 503, "a POST beyond max_queued_work: %d (want 503)", st);

	/* the queued request's client leaves (nothing may leak: ASan), the
	 * running one gets its answer, and the pool serves again */
	close(b);
	pthread_mutex_lock(&g_mu);
	g_release = true;
	pthread_cond_broadcast(&g_cv);
	pthread_mutex_unlock(&g_mu);
	T_CHECKF(read_status(a, NULL) == 200, "the blocked POST finishes");
	close(a);
	for (int i = 0; i < 3000 && http_server_n_work(g_srv) > 0; i++)
		usleep(10000);
	c = connect_port(0);
	T_CHECK(send_req(c, "POST", "/block", "{\"x\":4}") == 0);
	T_CHECKF(read_status(c, NULL) == 200, "the pool serves after the queue drained");
	close(c);
}

static void test_write_stall(void)
{
	/* a client that takes nothing: cut by the write-progress deadline */
	memset(&g_big, 0, sizeof g_big);
	g_big.total = (size_t)1 << 30;
	g_big.seed = (unsigned)time(NULL);
	int fd = connect_port(4096);
	T_CHECK(fd >= 0 && send_req(fd, "POST", "/big", "{}") == 0);
	for (int i = 0; i < 600 && !atomic_load(&g_big.closed); i++)
		usleep(50000);
	T_CHECKF(atomic_load(&g_big.closed) && atomic_load(&g_big.aborted),
		 "a stalled reader's stream is cut and aborted (closed %d, produced %zu of %zu)",
		 atomic_load(&g_big.closed), g_big.produced, g_big.total);
	T_CHECKF(g_big.produced < g_big.total / 8, "the stalled stream stopped early: %zu bytes", g_big.produced);
	close(fd);

	/* a client that reads gets it all */
	memset(&g_big, 0, sizeof g_big);
	g_big.total = (size_t)(8 << 20) + (size_t)(rand() % 65536);
	fd = connect_port(0);
	T_CHECK(fd >= 0 && send_req(fd, "POST", "/big", "{}") == 0);
	size_t got = 0;
	int status = read_status(fd, &got);
	close(fd);
	T_CHECKF(status == 200 && got > g_big.total, "a reading client gets the whole stream (%d, %zu of %zu)", status,
		 got, g_big.total);
	for (int i = 0; i < 200 && !atomic_load(&g_big.closed); i++)
		usleep(10000);
	T_CHECKF(atomic_load(&g_big.closed) && !atomic_load(&g_big.aborted), "the whole stream ends normally");
}

int main(void)
{
	srand((unsigned)time(NULL));
	struct http_options opt = {.host = "127.0.0.1", .port = 0, .n_threads = 1, .max_body_bytes = 1 << 20,
				   .connection_timeout_s = 60, .n_workers = 1, .max_queued_work = 2,
				   .write_stall_s = 1, .handler = handler};
	struct http_server *s = NULL;
	struct err e = {0};
	T_CHECKF(http_server_create(&s, &opt, &e) == ST_OK, "%s", e.msg);
	if (!s)
		return test_exit();
	g_port = http_server_port(s);
	g_srv = s;
	test_pool();
	test_write_stall();
	http_server_destroy(s);
	return test_exit();
}
