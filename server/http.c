/*
 * server/http.c: the libmicrohttpd daemon: body collection with limits,
 * buffered and streamed answers, the request-completed callback, binding.
 * Streams, the worker pool and connection admission live beside it
 * (http_internal.h lists the four files and their lock order).
 *
 * Ownership: each connection gets a struct http_conn on the first call of
 * the access handler (*con_cls); it is freed only in the request-completed
 * callback, which is also where a stream learns whether it finished or the
 * client went away.
 *
 * Requests with a body run their handler on a bounded worker pool (the
 * connection is suspended meanwhile), so that an 8 MB body to tokenize never
 * holds a connection thread; the housekeeper also enforces the request
 * deadline and the write-progress deadline on every connection (issue 17).
 */
#include "http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

static _Atomic unsigned http__default_write_stall_s = HTTP_DEFAULT_WRITE_STALL_S;

void http_set_default_write_stall_s(unsigned s)
{
	atomic_store(&http__default_write_stall_s, s ? s : HTTP_DEFAULT_WRITE_STALL_S);
}

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

/* ---- libmicrohttpd callbacks ---- */

enum MHD_Result http__queue_plain(struct MHD_Connection *c, struct http_conn *hc, int status, const char *ct,
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

void http__call_handler(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc, const char *method,
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
		http__stream_link(s, st);
		return buffered_pump(s, c, hc);
	}
	if (resp->stream.read) {
		st->ops = resp->stream;
		st->ctx = resp->stream_ctx;
		hc->stream = st;
		http__stream_link(s, st);
		r = http__stream_response(st);
	} else {
		http__stream_free(st);
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
			return http__queue_plain(c, hc, 400, "application/json", bad_framing_body);
		}
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl) {
			char *end = NULL;
			errno = 0;
			unsigned long long v = strtoull(cl, &end, 10);
			if (errno || end == cl || v > s->opt.max_body_bytes) {
				/* Answer at once: the client may never send the rest. */
				hc->too_big = true;
				return http__queue_plain(c, hc, 413, "application/json", too_large_body);
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
		return http__queue_plain(c, hc, 413, "application/json", too_large_body);

	http__sock_phase(s, c, false); /* the request is in: no more deadline */
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
			if (st)
				http__stream_free(st);
			return MHD_NO;
		}
		enum MHD_Result ret = respond(s, c, hc, resp, st);
		free(resp);
		return ret;
	}
	if (hc->work == WORK_QUEUED)
		return MHD_YES;
	if (s->n_workers > 0 && strcmp(method, "GET") && strcmp(method, "HEAD"))
		return http__work_submit(s, c, hc, method, url);
	struct http_response resp;
	memset(&resp, 0, sizeof resp);
	resp.status = 500;
	struct http_stream *st = http__stream_new(s, c);
	if (!st)
		return MHD_NO;
	http__call_handler(s, c, hc, method, url, &resp, &st);
	return respond(s, c, hc, &resp, st);
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
		http__sock_phase(s, c, true); /* keep-alive: the next request's deadline starts now */
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
		if (hc->work_stream)
			http__stream_free(hc->work_stream);
	}
	struct http_stream *st = hc->stream;
	if (st) {
		http__stream_unlink(s, st);
		pthread_mutex_lock(&st->mu);
		bool aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !st->ended;
		bool run_close = !st->closed && st->ops.close;
		st->closed = true;
		pthread_mutex_unlock(&st->mu);
		/* Without our lock held, so that the producer can serialize its
		 * wakes against close with its own lock (http.h). */
		if (run_close)
			st->ops.close(st->ctx, aborted);
		http__stream_free(st);
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
	http__workers_start(s, n_workers);
	struct MHD_OptionItem addr_opt[2] = {
		bound >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, bound, NULL}
			   : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr},
		{MHD_OPTION_END, 0, NULL}};
	s->d = MHD_start_daemon(flags, (uint16_t)opt->port, http__on_accept, s, on_access, s,
				MHD_OPTION_ARRAY, addr_opt,
				MHD_OPTION_THREAD_POOL_SIZE, (unsigned)opt->n_threads,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				MHD_OPTION_NOTIFY_CONNECTION, http__on_connection, s,
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
		http__workers_stop(s);
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
	if (pthread_create(&s->housekeeper, NULL, http__housekeeper_main, s) == 0)
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
	http__workers_stop(s); /* the queued handlers run and resume their connections */
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
