/*
 * server/http.c: libmicrohttpd daemon, body collection with limits, buffered
 * and streamed responses (suspend/resume), disconnect detection.
 *
 * Ownership: each connection gets a struct http_conn on the first call of
 * the access handler (*con_cls); it is freed only in the request-completed
 * callback, which is also where a stream learns whether it finished or the
 * client went away. Suspended connections are not polled by libmicrohttpd,
 * so a housekeeping thread resumes them twice a second: a closed socket is
 * then noticed even when the producer has nothing to say.
 *
 * Requests with a body run their handler on a bounded worker pool (the
 * connection is suspended meanwhile), so that an 8 MB body to tokenize never
 * holds a connection thread; the housekeeper also enforces the request
 * deadline and the write-progress deadline on every connection (issue 17).
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

struct http_stream {
	pthread_mutex_t mu;
	struct MHD_Connection *conn;
	struct http_server *srv;
	struct http_stream_ops ops;
	void *ctx;
	bool suspended;      /* we suspended the connection and nobody resumed it */
	bool wake_pending;   /* a wake arrived while not suspended */
	bool ended;          /* read returned END */
	bool closed;         /* close callback ran */
	bool peer_gone;      /* the housekeeper saw the client hang up while suspended */
	/* A buffered answer to an HTTP/1.1 request (nothing sent yet) may be
	 * preceded by interim 100 responses: the probe that tells a client that
	 * only half-closed (it still reads) from one that left. */
	bool probe_ok;
	double probe_t, probe_every_s;
	struct http_stream *next, *prev; /* srv->streams, under srv->mu */
};

struct http_conn {
	char *body;
	size_t len, cap;
	bool too_big;
	bool answered;
	double t0;
	int status;
	const char *route; /* static label from the handler, for metrics */
	struct http_stream *stream;
	/* A buffered stream (http_response.stream_buffered): the body so far;
	 * nothing is queued until the read returns END. */
	bool buffered;
	char *out;
	size_t out_len, out_cap;
	const char *content_type;
	char *hdrs;   /* the handler's extra headers, "name\0value\0" n_hdrs times */
	int n_hdrs;
	bool http11;  /* HTTP/1.1 (interim responses allowed) */
	/* The handler on the worker pool: queued or running (the connection is
	 * suspended), then done with its answer in work_resp / work_stream. */
	enum { WORK_NONE, WORK_QUEUED, WORK_DONE } work;
	struct http_conn *work_next;
	struct MHD_Connection *conn;
	const char *method, *url; /* libmicrohttpd's, valid while the connection lives */
	struct http_response *work_resp;
	struct http_stream *work_stream;
};

#define HTTP_DEFAULT_REQUEST_TIMEOUT_S 30u
/* Open connections at most: below a default RLIMIT_NOFILE of 1024 with room
 * for the process's other files; past it new connections are refused at
 * accept instead of starving the ones being served (issue 17). */
#define HTTP_DEFAULT_MAX_CONNECTIONS 1000u
/* Requests or buffered answers larger than this return freed memory to the
 * system when they end (malloc_trim: a few ms, only after large ones). */
#define HTTP_TRIM_AFTER_BYTES ((size_t)1 << 20)
/* A request's headers and body must arrive within this (see http.h). */
#define HTTP_DEFAULT_REQUEST_DEADLINE_S 60u
/* At a connection limit, a connection still sending its request after this
 * long may be closed to admit a new one (slowloris, issue 17); the oldest
 * goes first, so a fresh request in flight is the last to go. */
#define HTTP_EVICT_MIN_AGE_S 0.1
/* libmicrohttpd's own hard limit sits this far above ours, so that our
 * accept policy (which evicts) decides first. */
#define HTTP_CONNECTION_HEADROOM 32u

struct http_server {
	struct MHD_Daemon *d;
	struct http_options opt;
	unsigned request_timeout_s; /* resolved opt.request_timeout_s */
	int port;
	atomic_int in_flight;
	pthread_mutex_t mu;
	struct http_stream *streams; /* live streams, for the housekeeping wake */
	pthread_t housekeeper;
	bool hk_running;
	pthread_cond_t hk_cv;
	bool stopping;
	/* Open connections per client address (--max-connections-per-ip): kept
	 * here because libmicrohttpd 0.9.75's own per-IP limit was enforced in
	 * some runs and not in others. Under ip_mu; linear search (at most
	 * max_connections entries, once per accept). */
	pthread_mutex_t ip_mu;
	struct http_ip_count { struct sockaddr_storage a; unsigned n; } *ips;
	size_t n_ips, cap_ips;
	/* Open connections and when their current request started (under
	 * ip_mu), for the request deadline the housekeeper enforces. */
	struct http_sock *socks;
	unsigned n_socks;           /* open connections (the socks list) */
	unsigned max_socks;         /* at most; past it a slow one is evicted or the new one refused */
	double evict_log_t;         /* last eviction message (one a second at most) */
	double request_deadline_s;
	double write_stall_s;
	/* The worker pool: a FIFO of connections whose handler is to run. */
	pthread_mutex_t work_mu;
	pthread_cond_t work_cv;
	struct http_conn *work_head, *work_tail;
	unsigned n_work;     /* queued + running */
	unsigned max_work;
	bool work_stop;
	pthread_t *workers;
	int n_workers;       /* started */
};

static _Atomic unsigned http__default_write_stall_s = HTTP_DEFAULT_WRITE_STALL_S;

void http_set_default_write_stall_s(unsigned s)
{
	atomic_store(&http__default_write_stall_s, s ? s : HTTP_DEFAULT_WRITE_STALL_S);
}

struct http_sock {
	struct http_sock *next, *prev;
	struct MHD_Connection *c;
	double t0;             /* start of the current request phase */
	bool receiving;        /* headers / body still arriving */
	bool cut;              /* shut down by the housekeeper */
	uint64_t acked;        /* bytes the peer acknowledged at the last progress */
	double progress_t;     /* when the answer last made progress */
	double opened_t;       /* when the connection was accepted */
	struct sockaddr_storage addr; /* the client's (family AF_UNSPEC: unknown) */
};

/* The request phase of c is over (true) or begins again (false). */
static void sock_phase(struct http_server *s, struct MHD_Connection *c, bool receiving)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	if (!ci || !ci->socket_context)
		return;
	struct http_sock *k = ci->socket_context;
	pthread_mutex_lock(&s->ip_mu);
	k->receiving = receiving;
	k->t0 = k->progress_t = time_mono_s();
	pthread_mutex_unlock(&s->ip_mu);
}

/* While answering: whether the peer took anything since the last look
 * (bytes acknowledged), or nothing waits in the socket at all. */
static bool sock_writing_progressed(struct http_sock *k, int fd)
{
	int unsent = 0;
	if (ioctl(fd, SIOCOUTQ, &unsent) || unsent <= 0)
		return true; /* nothing waits for the peer (or not TCP) */
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	memset(&ti, 0, sizeof ti);
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked)
		return true;
	if (ti.tcpi_bytes_acked != k->acked) {
		k->acked = ti.tcpi_bytes_acked;
		return true;
	}
	return false;
}

/* Housekeeper: shut the connections whose request is late, or whose client
 * stopped taking the answer (write-progress deadline: a slow SSE reader
 * would otherwise make its request's events pile up for as long as it
 * generates). A shutdown, not a close: libmicrohttpd sees the end on its next
 * read or write and cleans up; a stream learns it as an abort. */
static void socks_enforce(struct http_server *s)
{
	double now = time_mono_s();
	pthread_mutex_lock(&s->ip_mu);
	for (struct http_sock *k = s->socks; k; k = k->next) {
		if (k->cut)
			continue;
		if (!k->receiving) {
			const union MHD_ConnectionInfo *ci =
				MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
			if (!ci || sock_writing_progressed(k, ci->connect_fd)) {
				k->progress_t = now;
			} else if (now - k->progress_t >= s->write_stall_s) {
				(void)shutdown(ci->connect_fd, SHUT_RDWR);
				k->cut = true;
				log_msg(LOG_WARN, "http", "closed a connection whose client took nothing of the answer for "
					"%.0f s (stalled reader; its request is aborted)", s->write_stall_s);
			}
			continue;
		}
		if (now - k->t0 < s->request_deadline_s)
			continue;
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (ci) {
			(void)shutdown(ci->connect_fd, SHUT_RDWR);
			k->cut = true;
			log_msg(LOG_WARN, "http", "closed a connection whose request took over %.0f s to arrive (slow client)",
				s->request_deadline_s);
		}
	}
	pthread_mutex_unlock(&s->ip_mu);
}

/* ---- helpers for handlers ---- */

void http_reply(struct http_response *resp, int status, const char *content_type, char *body, size_t len)
{
	resp->status = status;
	resp->content_type = content_type;
	resp->body = body;
	resp->body_len = len;
}

void http_reply_copy(struct http_response *resp, int status, const char *content_type, const char *body)
{
	size_t n = strlen(body);
	char *b = malloc(n + 1);
	if (b)
		memcpy(b, body, n + 1);
	http_reply(resp, b ? status : 500, content_type, b, b ? n : 0);
}

const char *http_request_header(const struct http_request *req, const char *name)
{
	return MHD_lookup_connection_value((struct MHD_Connection *)req->conn, MHD_HEADER_KIND, name);
}

/* ---- streams ---- */

static void stream_unlink(struct http_server *s, struct http_stream *st)
{
	pthread_mutex_lock(&s->mu);
	if (st->prev)
		st->prev->next = st->next;
	else if (s->streams == st)
		s->streams = st->next;
	if (st->next)
		st->next->prev = st->prev;
	st->next = st->prev = NULL;
	pthread_mutex_unlock(&s->mu);
}

void http_stream_wake(struct http_stream *st)
{
	if (!st)
		return;
	pthread_mutex_lock(&st->mu);
	if (st->suspended) {
		st->suspended = false;
		MHD_resume_connection(st->conn);
	} else {
		st->wake_pending = true;
	}
	pthread_mutex_unlock(&st->mu);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct http_stream *st = cls;
	for (;;) {
		pthread_mutex_lock(&st->mu);
		st->wake_pending = false;
		bool gone = st->peer_gone;
		pthread_mutex_unlock(&st->mu);
		if (gone) /* close the connection; the completion callback reports an abort */
			return MHD_CONTENT_READER_END_WITH_ERROR;
		/* Called without our lock: the producer wakes under its own lock,
		 * and read() takes that lock, so holding ours here would invert. */
		ssize_t n = st->ops.read(st->ctx, buf, max);
		if (n > 0)
			return n;
		pthread_mutex_lock(&st->mu);
		if (n < 0) {
			st->ended = true;
			pthread_mutex_unlock(&st->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (st->wake_pending) { /* data came while we were reading */
			pthread_mutex_unlock(&st->mu);
			continue;
		}
		st->suspended = true;
		MHD_suspend_connection(st->conn);
		pthread_mutex_unlock(&st->mu);
		return 0;
	}
}

static void stream_free_noop(void *cls) { (void)cls; }

/* A suspended connection is not polled, so a client that hangs up while its
 * response has nothing to say (a non-streamed answer still generating) would
 * go unnoticed. Peek at the socket: a reset means the peer is gone. EOF alone
 * does not: a client may half-close after sending its request and still
 * read the answer (issue 17). A streamed answer learns of a closed peer from
 * its next write (tokens, or the 15 s pings); a buffered one, which writes
 * nothing until the end, sends an interim "100 Continue" (every client
 * skips it) on EOF, again after 1, 2, 4 .. 30 s: a closed peer answers with a
 * reset, seen on the next look. Under st->mu, only while suspended
 * (libmicrohttpd is not using the socket then). */
static void stream_check_peer(struct http_stream *st)
{
	pthread_mutex_lock(&st->mu);
	if (st->suspended && !st->peer_gone) {
		const union MHD_ConnectionInfo *ci =
			MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		char c;
		ssize_t r = ci ? recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) : 1;
		int soerr = 0;
		socklen_t el = sizeof soerr;
		if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			st->peer_gone = true; /* ECONNRESET: the peer is gone */
		else if (r < 0 && ci && !getsockopt(ci->connect_fd, SOL_SOCKET, SO_ERROR, &soerr, &el) && soerr)
			st->peer_gone = true;
		else if (r == 0 && st->probe_ok) {
			double now = time_mono_s();
			if (st->probe_every_s == 0 || now - st->probe_t >= st->probe_every_s) {
				static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
				if (send(ci->connect_fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
				    errno != EAGAIN && errno != EWOULDBLOCK)
					st->peer_gone = true;
				st->probe_t = now;
				st->probe_every_s = st->probe_every_s ? st->probe_every_s * 2 : 1.0;
				if (st->probe_every_s > 30)
					st->probe_every_s = 30;
			}
		}
	}
	pthread_mutex_unlock(&st->mu);
}

static void *housekeeper_main(void *arg)
{
	struct http_server *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 500 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->hk_cv, &s->mu, &ts);
		if (s->stopping)
			break;
		for (struct http_stream *st = s->streams; st; st = st->next) {
			stream_check_peer(st);
			http_stream_wake(st); /* lock order: srv->mu then st->mu, same everywhere */
		}
		socks_enforce(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- libmicrohttpd callbacks ---- */

static enum MHD_Result queue_plain(struct MHD_Connection *c, struct http_conn *hc, int status, const char *ct,
				   const char *body)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", ct);
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	hc->status = status;
	hc->route = "other";
	hc->answered = true;
	return ret;
}

static const char *too_large_body =
	"{\"error\":{\"message\":\"request body too large\",\"type\":\"invalid_request_error\","
	"\"param\":null,\"code\":\"request_too_large\"}}";
static const char *bad_framing_body =
	"{\"error\":{\"message\":\"bad request framing: several Content-Length headers, or a Transfer-Encoding "
	"other than chunked\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"bad_request\"}}";

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	(void)value;
	if (!strcasecmp(key, "Content-Length"))
		(*(int *)cls)++;
	return MHD_YES;
}

/* libmicrohttpd takes the first of several Content-Length headers and waits
 * forever for a body in a transfer coding it does not know; both are refused
 * up front (RFC 9112 6.3: a request whose length is ambiguous is a 400). */
static bool framing_ok(struct MHD_Connection *c)
{
	int n_cl = 0;
	MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &n_cl);
	const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
	return n_cl <= 1 && (!te || !strcasecmp(te, "chunked"));
}

/* A buffered stream: read until the producer has nothing more for now
 * (suspend until its wake; libmicrohttpd calls on_access again on resume) or
 * until the end (answer with the whole body and the producer's status). */
static enum MHD_Result buffered_pump(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc)
{
	(void)s;
	struct http_stream *st = hc->stream;
	for (;;) {
		pthread_mutex_lock(&st->mu);
		st->wake_pending = false;
		bool gone = st->peer_gone;
		pthread_mutex_unlock(&st->mu);
		if (gone)
			return MHD_NO; /* close; the completion callback reports the abort */
		if (hc->out_cap - hc->out_len < 16 * 1024) {
			size_t cap = hc->out_cap ? hc->out_cap * 2 : 64 * 1024;
			char *p = realloc(hc->out, cap);
			if (!p)
				return MHD_NO;
			hc->out = p;
			hc->out_cap = cap;
		}
		ssize_t n = st->ops.read(st->ctx, hc->out + hc->out_len, hc->out_cap - hc->out_len);
		if (n > 0) {
			hc->out_len += (size_t)n;
			continue;
		}
		pthread_mutex_lock(&st->mu);
		if (n < 0) {
			st->ended = true;
			pthread_mutex_unlock(&st->mu);
			break;
		}
		if (st->wake_pending) {
			pthread_mutex_unlock(&st->mu);
			continue;
		}
		st->suspended = true;
		MHD_suspend_connection(c);
		pthread_mutex_unlock(&st->mu);
		return MHD_YES;
	}
	int status = st->ops.status ? st->ops.status(st->ctx) : hc->status;
	struct MHD_Response *r =
		hc->out ? MHD_create_response_from_buffer(hc->out_len, hc->out, MHD_RESPMEM_MUST_FREE)
			: MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	hc->out = NULL; /* the response owns it */
	hc->out_len = hc->out_cap = 0;
	if (hc->content_type)
		MHD_add_response_header(r, "Content-Type", hc->content_type);
	const char *h = hc->hdrs;
	for (int i = 0; i < hc->n_hdrs; i++) {
		const char *v = h + strlen(h) + 1;
		MHD_add_response_header(r, h, v);
		h = v + strlen(v) + 1;
	}
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	hc->status = status;
	hc->answered = true;
	return ret;
}

static struct http_stream *stream_new(struct http_server *s, struct MHD_Connection *c)
{
	struct http_stream *st = calloc(1, sizeof *st);
	if (!st)
		return NULL;
	pthread_mutex_init(&st->mu, NULL);
	st->conn = c;
	st->srv = s;
	return st;
}

/* The application's handler over the collected request. */
static void call_handler(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc, const char *method,
			 const char *url, struct http_response *resp, struct http_stream **st)
{
	char empty = '\0';
	if (hc->body)
		hc->body[hc->len] = '\0';
	struct http_request req = {
		.method = method, .path = url, .body = hc->body ? hc->body : &empty, .body_len = hc->len, .conn = c};
	s->opt.handler(s->opt.app, &req, resp, st);
}

/* Queue the handler's answer: a buffer, a stream, or a buffered stream. */
static enum MHD_Result respond(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc,
			       struct http_response *resp, struct http_stream *st)
{
	struct MHD_Response *r;
	if (resp->stream.read && resp->stream_buffered) {
		st->ops = resp->stream;
		st->ctx = resp->stream_ctx;
		hc->stream = st;
		hc->buffered = true;
		st->probe_ok = hc->http11;
		hc->status = resp->status;
		hc->route = resp->route;
		hc->content_type = resp->content_type; /* static strings (http.h) */
		size_t hn = 0;
		for (size_t i = 0; i < sizeof resp->headers / sizeof resp->headers[0] && resp->headers[i].name; i++)
			hn += strlen(resp->headers[i].name) + strlen(resp->headers[i].value) + 2;
		if (hn && (hc->hdrs = malloc(hn))) {
			char *p = hc->hdrs;
			for (size_t i = 0; i < sizeof resp->headers / sizeof resp->headers[0] && resp->headers[i].name; i++) {
				p = stpcpy(p, resp->headers[i].name) + 1;
				p = stpcpy(p, resp->headers[i].value) + 1;
				hc->n_hdrs++;
			}
		}
		pthread_mutex_lock(&s->mu);
		st->next = s->streams;
		if (s->streams)
			s->streams->prev = st;
		s->streams = st;
		pthread_mutex_unlock(&s->mu);
		return buffered_pump(s, c, hc);
	}
	if (resp->stream.read) {
		st->ops = resp->stream;
		st->ctx = resp->stream_ctx;
		hc->stream = st;
		pthread_mutex_lock(&s->mu);
		st->next = s->streams;
		if (s->streams)
			s->streams->prev = st;
		s->streams = st;
		pthread_mutex_unlock(&s->mu);
		r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, st, stream_free_noop);
	} else {
		pthread_mutex_destroy(&st->mu);
		free(st);
		const char *body = resp->body ? resp->body : "";
		r = MHD_create_response_from_buffer(resp->body_len, (void *)body, MHD_RESPMEM_MUST_COPY);
		free(resp->body);
	}
	if (!r)
		return MHD_NO;
	if (resp->content_type)
		MHD_add_response_header(r, "Content-Type", resp->content_type);
	for (size_t i = 0; i < sizeof resp->headers / sizeof resp->headers[0] && resp->headers[i].name; i++)
		MHD_add_response_header(r, resp->headers[i].name, resp->headers[i].value);
	if (resp->stream.read) {
		MHD_add_response_header(r, "Cache-Control", "no-cache");
		MHD_add_response_header(r, "X-Accel-Buffering", "no");
	}
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)resp->status, r);
	MHD_destroy_response(r);
	hc->status = resp->status;
	hc->route = resp->route;
	hc->answered = true;
	return ret;
}

/* ---- the worker pool ---- */

static const char *busy_body =
	"{\"error\":{\"message\":\"server busy: too many requests are being parsed; retry shortly\","
	"\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";

/* Hand the handler to the pool and suspend the connection until it is done;
 * 503 when max_queued_work requests are already waiting or running. */
static enum MHD_Result work_submit(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc,
				   const char *method, const char *url)
{
	pthread_mutex_lock(&s->work_mu);
	bool full = s->n_work >= s->max_work || s->work_stop;
	if (!full)
		s->n_work++;
	pthread_mutex_unlock(&s->work_mu);
	if (full) {
		log_msg(LOG_WARN, "http", "%s %s: 503, %u requests already wait for a worker", method, url, s->max_work);
		return queue_plain(c, hc, 503, "application/json", busy_body);
	}
	hc->work = WORK_QUEUED;
	hc->conn = c;
	hc->method = method;
	hc->url = url;
	hc->work_next = NULL;
	/* suspended before a worker can resume it */
	MHD_suspend_connection(c);
	pthread_mutex_lock(&s->work_mu);
	if (s->work_tail)
		s->work_tail->work_next = hc;
	else
		s->work_head = hc;
	s->work_tail = hc;
	pthread_cond_signal(&s->work_cv);
	pthread_mutex_unlock(&s->work_mu);
	return MHD_YES;
}

static void *worker_main(void *arg)
{
	struct http_server *s = arg;
	pthread_mutex_lock(&s->work_mu);
	for (;;) {
		while (!s->work_head && !s->work_stop)
			pthread_cond_wait(&s->work_cv, &s->work_mu);
		struct http_conn *hc = s->work_head;
		if (!hc)
			break; /* stopping, and nothing left to run */
		s->work_head = hc->work_next;
		if (!s->work_head)
			s->work_tail = NULL;
		pthread_mutex_unlock(&s->work_mu);
		struct http_response *resp = calloc(1, sizeof *resp);
		struct http_stream *st = resp ? stream_new(s, hc->conn) : NULL;
		if (resp && st) {
			resp->status = 500;
			call_handler(s, hc->conn, hc, hc->method, hc->url, resp, &st);
		}
		hc->work_resp = resp;
		hc->work_stream = st;
		hc->work = WORK_DONE;
		struct MHD_Connection *c = hc->conn;
		/* hc may be freed as soon as the connection runs again */
		MHD_resume_connection(c);
		pthread_mutex_lock(&s->work_mu);
		s->n_work--;
	}
	pthread_mutex_unlock(&s->work_mu);
	return NULL;
}

/* Run what is queued, then stop the workers. */
static void workers_stop(struct http_server *s)
{
	pthread_mutex_lock(&s->work_mu);
	s->work_stop = true;
	pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->work_mu);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	free(s->workers);
	s->workers = NULL;
	s->n_workers = 0;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				 const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
	struct http_server *s = cls;
	struct http_conn *hc = *con_cls;
	if (!hc) {
		hc = calloc(1, sizeof *hc);
		if (!hc)
			return MHD_NO;
		hc->t0 = time_mono_s();
		hc->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
		hc->status = 500;
		*con_cls = hc;
		atomic_fetch_add(&s->in_flight, 1);
		if (!framing_ok(c)) {
			hc->too_big = true; /* ignore whatever body follows */
			return queue_plain(c, hc, 400, "application/json", bad_framing_body);
		}
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl) {
			char *end = NULL;
			errno = 0;
			unsigned long long v = strtoull(cl, &end, 10);
			if (errno || end == cl || v > s->opt.max_body_bytes) {
				/* Answer at once: the client may never send the rest. */
				hc->too_big = true;
				return queue_plain(c, hc, 413, "application/json", too_large_body);
			}
		}
		return MHD_YES;
	}
	if (hc->answered) { /* e.g. the rest of an oversized upload */
		*upload_size = 0;
		return MHD_YES;
	}
	if (hc->buffered) /* resumed: read what is ready */
		return buffered_pump(s, c, hc);
	if (*upload_size) {
		size_t n = *upload_size;
		*upload_size = 0;
		if (hc->too_big || hc->len + n > s->opt.max_body_bytes) {
			hc->too_big = true;
			return MHD_YES;
		}
		if (hc->len + n + 1 > hc->cap) {
			size_t cap = hc->cap ? hc->cap : 4096;
			while (cap < hc->len + n + 1)
				cap *= 2;
			char *b = realloc(hc->body, cap);
			if (!b)
				return MHD_NO;
			hc->body = b;
			hc->cap = cap;
		}
		memcpy(hc->body + hc->len, upload_data, n);
		hc->len += n;
		return MHD_YES;
	}
	if (hc->too_big)
		return queue_plain(c, hc, 413, "application/json", too_large_body);

	sock_phase(s, c, false); /* the request is in: no more deadline */
	/* The request is in: the response may take long (generation, suspended streams). */
	if (s->request_timeout_s != s->opt.connection_timeout_s)
		MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->opt.connection_timeout_s);
	if (hc->work == WORK_DONE) { /* resumed by the worker that ran the handler */
		struct http_response *resp = hc->work_resp;
		struct http_stream *st = hc->work_stream;
		hc->work_resp = NULL;
		hc->work_stream = NULL;
		hc->work = WORK_NONE;
		if (!resp || !st) {
			free(resp);
			if (st) {
				pthread_mutex_destroy(&st->mu);
				free(st);
			}
			return MHD_NO;
		}
		enum MHD_Result ret = respond(s, c, hc, resp, st);
		free(resp);
		return ret;
	}
	if (hc->work == WORK_QUEUED)
		return MHD_YES;
	if (s->n_workers > 0 && strcmp(method, "GET") && strcmp(method, "HEAD"))
		return work_submit(s, c, hc, method, url);
	struct http_response resp;
	memset(&resp, 0, sizeof resp);
	resp.status = 500;
	struct http_stream *st = stream_new(s, c);
	if (!st)
		return MHD_NO;
	call_handler(s, c, hc, method, url, &resp, &st);
	return respond(s, c, hc, &resp, st);
}

/* ---- per-address connection counts ---- */

static bool ip_same(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (a->sa_family != b->ss_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
			       sizeof(struct in6_addr));
	return false;
}

/* The count of addr's connections (NULL: not seen). Under ip_mu. */
static struct http_ip_count *ip_find(struct http_server *s, const struct sockaddr *addr)
{
	for (size_t i = 0; i < s->n_ips; i++)
		if (ip_same(addr, &s->ips[i].a))
			return &s->ips[i];
	return NULL;
}

/* At a connection limit, make room by shutting the oldest connection still
 * sending its request (a slowloris holds its slots that way; a request being
 * answered is never touched), of addr when given, at least
 * HTTP_EVICT_MIN_AGE_S old. False when there is none. Under ip_mu. */
static bool evict_slow(struct http_server *s, const struct sockaddr *addr, double now)
{
	struct http_sock *best = NULL;
	for (struct http_sock *k = s->socks; k; k = k->next) {
		if (!k->receiving || k->cut || now - k->opened_t < HTTP_EVICT_MIN_AGE_S)
			continue;
		if (addr && !ip_same(addr, &k->addr))
			continue;
		if (!best || k->t0 < best->t0)
			best = k;
	}
	if (!best)
		return false;
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(best->c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return false;
	(void)shutdown(ci->connect_fd, SHUT_RDWR);
	best->cut = true;
	if (now - s->evict_log_t >= 1.0) {
		s->evict_log_t = now;
		log_msg(LOG_WARN, "http", "at the %s connection limit: closed a connection whose request had not "
			"arrived after %.0f s (slow client) to admit a new one", addr ? "per-address" : "total",
			now - best->t0);
	}
	return true;
}

/* Accept policy: an address that already has its share, or a server at its
 * connection limit, admits the new connection only by evicting a slow one
 * (so /health stays answerable under a slowloris from any address). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	(void)addrlen;
	struct http_server *s = cls;
	if (!addr)
		return MHD_YES;
	double now = time_mono_s();
	pthread_mutex_lock(&s->ip_mu);
	bool ok = true;
	if (s->opt.max_connections_per_ip) {
		struct http_ip_count *ic = ip_find(s, addr);
		if (ic && ic->n >= s->opt.max_connections_per_ip)
			ok = evict_slow(s, addr, now);
	}
	if (ok && s->n_socks >= s->max_socks)
		ok = evict_slow(s, NULL, now);
	pthread_mutex_unlock(&s->ip_mu);
	return ok ? MHD_YES : MHD_NO;
}

static void ip_track(struct http_server *s, struct MHD_Connection *c, int delta)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!s->opt.max_connections_per_ip || !ci || !ci->client_addr)
		return;
	const struct sockaddr *addr = ci->client_addr;
	pthread_mutex_lock(&s->ip_mu);
	struct http_ip_count *ic = ip_find(s, addr);
	if (!ic && delta > 0) {
		if (s->n_ips == s->cap_ips) {
			size_t cap = s->cap_ips ? 2 * s->cap_ips : 64;
			struct http_ip_count *p = realloc(s->ips, cap * sizeof *p);
			if (p) {
				s->ips = p;
				s->cap_ips = cap;
			}
		}
		if (s->n_ips < s->cap_ips) {
			ic = &s->ips[s->n_ips++];
			memset(ic, 0, sizeof *ic);
			memcpy(&ic->a, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
								     : sizeof(struct sockaddr_in));
		}
	}
	if (ic) {
		if (delta > 0)
			ic->n++;
		else if (ic->n > 0 && --ic->n == 0)
			*ic = s->ips[--s->n_ips]; /* drop the entry: the table holds open addresses only */
	}
	pthread_mutex_unlock(&s->ip_mu);
}

/* A new connection gets the short request-phase timeout until its request is in. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	ip_track(s, c, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct http_sock *k = calloc(1, sizeof *k);
		if (k) {
			k->c = c;
			k->t0 = k->opened_t = k->progress_t = time_mono_s();
			k->receiving = true;
			const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
			if (ai && ai->client_addr)
				memcpy(&k->addr, ai->client_addr, ai->client_addr->sa_family == AF_INET6
									  ? sizeof(struct sockaddr_in6)
									  : sizeof(struct sockaddr_in));
			pthread_mutex_lock(&s->ip_mu);
			k->next = s->socks;
			if (s->socks)
				s->socks->prev = k;
			s->socks = k;
			s->n_socks++;
			pthread_mutex_unlock(&s->ip_mu);
		}
		*socket_context = k;
	} else if (*socket_context) {
		struct http_sock *k = *socket_context;
		pthread_mutex_lock(&s->ip_mu);
		if (k->prev)
			k->prev->next = k->next;
		else
			s->socks = k->next;
		if (k->next)
			k->next->prev = k->prev;
		s->n_socks--;
		pthread_mutex_unlock(&s->ip_mu);
		free(k);
		*socket_context = NULL;
	}
	if (toe == MHD_CONNECTION_NOTIFY_STARTED && s->request_timeout_s != s->opt.connection_timeout_s)
		MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->request_timeout_s);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct http_conn *hc = *con_cls;
	/* A kept-alive connection waits for its next request under the short timeout
	 * (only after a normal end: the connection is live and in libmicrohttpd's lists). */
	if (c && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && s->request_timeout_s != s->opt.connection_timeout_s)
		MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->request_timeout_s);
	if (c && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
		sock_phase(s, c, true); /* keep-alive: the next request's deadline starts now */
	if (!hc)
		return;
	*con_cls = NULL;
	if (hc->work_resp || hc->work_stream) {
		/* a worker's answer the connection never took (the client left) */
		struct http_response *resp = hc->work_resp;
		if (resp && resp->stream.read && resp->stream.close)
			resp->stream.close(resp->stream_ctx, true);
		if (resp)
			free(resp->body);
		free(resp);
		if (hc->work_stream) {
			pthread_mutex_destroy(&hc->work_stream->mu);
			free(hc->work_stream);
		}
	}
	struct http_stream *st = hc->stream;
	if (st) {
		stream_unlink(s, st);
		pthread_mutex_lock(&st->mu);
		bool aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !st->ended;
		bool run_close = !st->closed && st->ops.close;
		st->closed = true;
		pthread_mutex_unlock(&st->mu);
		/* Without our lock held, so that the producer can serialize its
		 * wakes against close with its own lock (http.h). */
		if (run_close)
			st->ops.close(st->ctx, aborted);
		pthread_mutex_destroy(&st->mu);
		free(st);
		if (aborted && hc->status == 200)
			hc->status = 499; /* nginx's "client closed request", for metrics */
	}
	if (s->opt.on_complete && hc->answered)
		s->opt.on_complete(s->opt.app, hc->route ? hc->route : "other", hc->status, time_mono_s() - hc->t0);
	/* A large request leaves its parse tree's memory in this thread's
	 * malloc arena (an 8 MB body of nested arrays kept ~700 MB resident
	 * after four requests): give it back to the system (issue 17). */
	bool large = hc->cap > HTTP_TRIM_AFTER_BYTES || hc->out_cap > HTTP_TRIM_AFTER_BYTES;
	free(hc->body);
	free(hc->out);
	free(hc->hdrs);
	free(hc);
	if (large)
		malloc_trim(0);
	atomic_fetch_sub(&s->in_flight, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char line[512];
	vsnprintf(line, sizeof line, fmt, ap);
	size_t n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	log_msg(LOG_DEBUG, "http", "%s", line);
}

enum status http_bind(const char *host, int port, int *fd_out, int *port_out, struct err *e)
{
	*fd_out = -1;
	if (port < 0 || port > 65535)
		return err_set(e, ST_INVALID, "--port %d: expected 0..65535", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_ADDRCONFIG};
	struct addrinfo *ai = NULL;
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", port);
	int gai = getaddrinfo(host, portstr, &hints, &ai);
	if (gai == EAI_NONAME || gai == EAI_ADDRFAMILY) { /* "::1" on a host without IPv6 routes */
		hints.ai_flags = AI_PASSIVE;
		gai = getaddrinfo(host, portstr, &hints, &ai);
	}
	if (gai || !ai)
		return err_set(e, ST_INVALID, "--host '%s': cannot resolve it (%s)", host, gai_strerror(gai));
	int err_no = 0;
	for (int pass = 0; pass < 2 && *fd_out < 0; pass++) /* IPv4 first, then the rest */
		for (struct addrinfo *p = ai; p && *fd_out < 0; p = p->ai_next) {
			if ((p->ai_family == AF_INET) != (pass == 0))
				continue;
			int fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
			if (fd < 0) {
				err_no = errno;
				continue;
			}
			int one = 1;
			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (p->ai_family == AF_INET6) /* as libmicrohttpd's own IPv6 socket */
				setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
			if (bind(fd, p->ai_addr, p->ai_addrlen)) {
				err_no = errno;
				close(fd);
				continue;
			}
			*fd_out = fd;
		}
	freeaddrinfo(ai);
	if (*fd_out < 0)
		return err_set(e, ST_IO, "cannot listen on %s:%d: %s", host, port, strerror(err_no ? err_no : EINVAL));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	*port_out = port;
	if (!getsockname(*fd_out, (struct sockaddr *)&ss, &sl))
		*port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
							   : ((struct sockaddr_in *)&ss)->sin_port);
	return ST_OK;
}

/* Room for n open files: the soft RLIMIT_NOFILE raised toward the hard one
 * (a default soft limit of 1024 is below 1000 connections and the rest). */
static void raise_fd_limit(rlim_t n)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= n)
		return;
	rlim_t want = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < n ? rl.rlim_max : n;
	if (want > rl.rlim_cur) {
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			log_msg(LOG_WARN, "http", "could not raise the open-file limit to %llu: %s", (unsigned long long)want,
				strerror(errno));
	}
}

enum status http_server_create(struct http_server **out, const struct http_options *opt, struct err *e)
{
	*out = NULL;
	int bound = opt->use_bound_fd ? opt->bound_fd : -1;
	if (!opt->handler || opt->n_threads < 1 || opt->port < 0 || opt->port > 65535) {
		if (bound >= 0)
			close(bound);
		return err_set(e, ST_INVALID, "http: bad options (handler, threads >= 1, port 0..65535)");
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
	struct addrinfo *ai = NULL;
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", opt->port);
	struct sockaddr_storage bss;
	socklen_t bsl = sizeof bss;
	if (bound >= 0) { /* http_bind's socket: start listening now */
		if (getsockname(bound, (struct sockaddr *)&bss, &bsl) || listen(bound, SOMAXCONN)) {
			int en = errno;
			close(bound);
			return err_set(e, ST_IO, "cannot listen on %s:%d: %s", opt->host, opt->port, strerror(en));
		}
	} else {
		int gai = getaddrinfo(opt->host, portstr, &hints, &ai);
		if (gai || !ai)
			return err_set(e, ST_INVALID, "--host '%s': not a numeric IPv4 or IPv6 address (%s)", opt->host,
				       gai_strerror(gai));
	}
	struct http_server *s = calloc(1, sizeof *s);
	if (!s) {
		if (bound >= 0)
			close(bound);
		freeaddrinfo(ai);
		return err_set(e, ST_NOMEM, "http: out of memory");
	}
	s->opt = *opt;
	s->request_timeout_s = opt->request_timeout_s ? opt->request_timeout_s : HTTP_DEFAULT_REQUEST_TIMEOUT_S;
	if (opt->connection_timeout_s && s->request_timeout_s > opt->connection_timeout_s)
		s->request_timeout_s = opt->connection_timeout_s;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->hk_cv, NULL);
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
	if ((ai ? ai->ai_family : bss.ss_family) == AF_INET6)
		flags |= MHD_USE_IPv6;
	pthread_mutex_init(&s->ip_mu, NULL);
	s->request_deadline_s = opt->request_deadline_s ? opt->request_deadline_s : HTTP_DEFAULT_REQUEST_DEADLINE_S;
	s->write_stall_s = opt->write_stall_s ? opt->write_stall_s : atomic_load(&http__default_write_stall_s);
	s->max_socks = opt->max_connections ? opt->max_connections : HTTP_DEFAULT_MAX_CONNECTIONS;
	raise_fd_limit(s->max_socks + HTTP_CONNECTION_HEADROOM + 128);
	pthread_mutex_init(&s->work_mu, NULL);
	pthread_cond_init(&s->work_cv, NULL);
	s->max_work = opt->max_queued_work ? opt->max_queued_work : HTTP_DEFAULT_MAX_QUEUED_WORK;
	int n_workers = opt->n_workers > 0 ? opt->n_workers : opt->n_threads;
	s->workers = calloc((size_t)n_workers, sizeof *s->workers);
	for (int i = 0; s->workers && i < n_workers; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s))
			break;
		s->n_workers++;
	}
	if (s->n_workers == 0) { /* handlers then run inline on the connection threads */
		free(s->workers);
		s->workers = NULL;
		log_msg(LOG_WARN, "http", "could not start request workers: handlers run on the connection threads");
	}
	struct MHD_OptionItem addr_opt[2] = {
		bound >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, bound, NULL}
			   : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr},
		{MHD_OPTION_END, 0, NULL}};
	s->d = MHD_start_daemon(flags, (uint16_t)opt->port, on_accept, s, on_access, s,
				MHD_OPTION_ARRAY, addr_opt,
				MHD_OPTION_THREAD_POOL_SIZE, (unsigned)opt->n_threads,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				MHD_OPTION_CONNECTION_TIMEOUT, opt->connection_timeout_s,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
				MHD_OPTION_CONNECTION_LIMIT, s->max_socks + HTTP_CONNECTION_HEADROOM,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
				MHD_OPTION_END);
	if (ai)
		freeaddrinfo(ai);
	if (!s->d) {
		if (bound >= 0)
			close(bound);
		workers_stop(s);
		pthread_mutex_destroy(&s->work_mu);
		pthread_cond_destroy(&s->work_cv);
		pthread_mutex_destroy(&s->mu);
		pthread_mutex_destroy(&s->ip_mu);
		pthread_cond_destroy(&s->hk_cv);
		free(s);
		return err_set(e, ST_IO, "cannot listen on %s:%d (address in use, or not permitted)", opt->host,
			       opt->port);
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : opt->port;
	if (pthread_create(&s->housekeeper, NULL, housekeeper_main, s) == 0)
		s->hk_running = true;
	*out = s;
	return ST_OK;
}

int http_server_port(const struct http_server *s) { return s->port; }

int http_server_in_flight(const struct http_server *s) { return atomic_load(&((struct http_server *)s)->in_flight); }

unsigned http_server_n_work(const struct http_server *s)
{
	struct http_server *m = (struct http_server *)s;
	pthread_mutex_lock(&m->work_mu);
	unsigned n = m->n_work;
	pthread_mutex_unlock(&m->work_mu);
	return n;
}

void http_server_quiesce(struct http_server *s)
{
	if (s && s->d) {
		MHD_socket fd = MHD_quiesce_daemon(s->d);
		if (fd != MHD_INVALID_SOCKET)
			close(fd);
	}
}

void http_server_destroy(struct http_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_cond_broadcast(&s->hk_cv);
	pthread_mutex_unlock(&s->mu);
	if (s->hk_running)
		pthread_join(s->housekeeper, NULL);
	workers_stop(s); /* the queued handlers run and resume their connections */
	if (s->d)
		MHD_stop_daemon(s->d);
	pthread_mutex_destroy(&s->work_mu);
	pthread_cond_destroy(&s->work_cv);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->ip_mu);
	free(s->ips);
	pthread_cond_destroy(&s->hk_cv);
	free(s);
}
