/*
 * server/http.h: the HTTP layer on libmicrohttpd, without any knowledge of
 * OpenAI, models or the scheduler.
 *
 * One daemon with an internal epoll thread pool. For each request the layer
 * collects the body (refusing bodies over max_body_bytes with 413 before
 * reading them), then calls the application's handler once with a complete
 * struct http_request. The handler answers with either a buffered body
 * (http_reply) or a stream (http_reply_stream): a pull callback that the
 * layer calls from a pool thread; when the callback has nothing yet it
 * returns HTTP_STREAM_WAIT and the connection is suspended until the
 * producer calls http_stream_wake(). A client that disconnects ends the
 * stream: the layer calls the stream's close callback with aborted = true.
 */
#ifndef DSV4_SERVER_HTTP_H
#define DSV4_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

struct http_server;
struct http_stream;

struct http_request {
	const char *method;  /* "GET", "POST", ... */
	const char *path;    /* without the query string */
	const char *body;    /* NUL-terminated; body_len excludes the NUL */
	size_t body_len;
	void *conn;          /* opaque, for http_request_header() */
};

/* Value of header name (case-insensitive), or NULL. Borrowed, valid during the handler. */
const char *http_request_header(const struct http_request *req, const char *name);

/* One response header. */
struct http_header {
	const char *name;
	const char *value;
};

struct http_response {
	int status;
	const char *route;          /* static label for metrics ("/v1/models"), NULL = "other" */
	const char *content_type;   /* "application/json" ... */
	char *body;                 /* malloc'd; the layer takes ownership and frees it */
	size_t body_len;
	struct http_header headers[4]; /* extra headers; name NULL ends the list; copied after the handler */
	char header_storage[256];      /* handlers may point header values into this */
	/* Streaming instead of body, when stream_read is set. */
	struct http_stream_ops {
		/* Write up to max bytes into buf. Returns the number written (> 0),
		 * HTTP_STREAM_WAIT when nothing is ready (the connection is suspended
		 * until http_stream_wake), or HTTP_STREAM_END when finished. */
		ssize_t (*read)(void *ctx, char *buf, size_t max);
		/* Called exactly once when the response is done or the client went
		 * away (aborted = true). ctx may be freed here. */
		void (*close)(void *ctx, bool aborted);
		/* (optional, with buffered) the status to answer with, asked once the
		 * whole body has been read; NULL = the handler's status. */
		int (*status)(void *ctx);
	} stream;
	void *stream_ctx;
	/* With stream.read: read the whole body before answering (a non-streamed
	 * answer made over time), so that the status line can still say whether
	 * it failed (stream.status), instead of a 200 sent up front. */
	bool stream_buffered;
};

#define HTTP_STREAM_WAIT ((ssize_t)0)
#define HTTP_STREAM_END ((ssize_t)-1)

/* The application's handler. It fills *resp; it runs on a pool thread and
 * may block only briefly. For streams, it receives in *stream the handle to
 * give the producer so that it can call http_stream_wake(). */
typedef void (*http_handler_fn)(void *app, const struct http_request *req, struct http_response *resp,
				struct http_stream **stream);

struct http_options {
	const char *host;          /* "127.0.0.1", "0.0.0.0", "::" */
	int port;                  /* 0 = any free port (see http_server_port) */
	int n_threads;             /* pool threads, >= 1 */
	size_t max_body_bytes;     /* larger bodies get 413 */
	unsigned connection_timeout_s; /* idle connection timeout, 0 = none */
	/* Idle limit while a request's headers and body arrive and between
	 * keep-alive requests (a stalled or silent client holds a connection
	 * slot this long, not connection_timeout_s); 0 = 30 s, at most
	 * connection_timeout_s. The response phase uses connection_timeout_s. */
	unsigned request_timeout_s;
	unsigned max_connections;        /* open connections at most; 0 = HTTP_DEFAULT_MAX_CONNECTIONS */
	unsigned max_connections_per_ip; /* per client address; 0 = no limit */
	/* Absolute limit on receiving one request's headers and body (from the
	 * connection's start or the previous request's end): a client that
	 * trickles a byte every few seconds resets the idle timeout forever
	 * (slowloris); past this its connection is shut. 0 = 60 s. */
	unsigned request_deadline_s;
	/* Requests with a body (POST: parsing, chat rendering, tokenization)
	 * run on a bounded pool of worker threads, so that the connection
	 * threads stay free for /health and the streams; a request finding
	 * max_queued_work others waiting or running gets 503. 0 = n_threads
	 * workers / HTTP_DEFAULT_MAX_QUEUED_WORK. GETs are answered inline. */
	int n_workers;
	unsigned max_queued_work;
	/* Write-progress deadline: a response whose bytes the client has not
	 * taken for this long (nothing acknowledged while data waits in the
	 * socket) is cut; a stalled reader aborts its request. 0 = the
	 * process default (http_set_default_write_stall_s, 60 s). */
	unsigned write_stall_s;
	http_handler_fn handler;
	void *app;
	/* Called after every response with route-independent facts, for metrics. Optional. */
	void (*on_complete)(void *app, const char *route, int status, double seconds);
	/* A socket bound earlier by http_bind() (host and port are then only
	 * for messages): the server listens on it and owns it from the call,
	 * closing it on failure too. */
	bool use_bound_fd;
	int bound_fd;
};

/* Resolve host (a name, or a numeric IPv4 / IPv6 address; for a name that
 * has both, IPv4 first, as uvicorn does) and bind a TCP socket to host:port
 * without listening yet: the address is reserved (a busy port fails here,
 * before anything slow), and a client that connects before the server
 * starts is refused rather than left waiting. *port_out: the port bound (port
 * 0 = any free one). Hand the socket to http_server_create (use_bound_fd),
 * or close() it. */
enum status http_bind(const char *host, int port, int *fd_out, int *port_out, struct err *e) DSV4_WUR;
#define HTTP_DEFAULT_MAX_QUEUED_WORK 256u
#define HTTP_DEFAULT_WRITE_STALL_S 60u

/* The write-progress deadline of servers created later with write_stall_s
 * 0 (set once at start-up from `dsv4 serve --max-write-stall-seconds`). */
void http_set_default_write_stall_s(unsigned s);

/* Start listening. On failure (bad host, port in use) returns an error naming
 * the address. */
enum status http_server_create(struct http_server **out, const struct http_options *opt, struct err *e) DSV4_WUR;

/* The port actually bound. */
int http_server_port(const struct http_server *s);

/* Stop accepting new connections; in-flight requests continue. */
void http_server_quiesce(struct http_server *s);

/* Number of requests being handled or streamed right now. */
int http_server_in_flight(const struct http_server *s);

/* Requests with their handler on the worker pool now (waiting or running). */
unsigned http_server_n_work(const struct http_server *s);

/* Stop everything and free. NULL is a no-op. */
void http_server_destroy(struct http_server *s);

/* Producer side of a stream: data is ready, resume the connection. Safe from
 * any thread until the stream's close callback returns; never after. The
 * close callback runs with no lock of this layer held, so a producer that
 * wakes under its own lock, and whose close callback takes that lock and
 * marks the stream closed, can never wake a freed stream. */
void http_stream_wake(struct http_stream *st);

/* Helpers for handlers. */
void http_reply(struct http_response *resp, int status, const char *content_type, char *body_malloced,
		size_t len);
void http_reply_copy(struct http_response *resp, int status, const char *content_type, const char *body);

#endif
