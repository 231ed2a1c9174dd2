/*
 * server/http_internal.h: what the HTTP layer's files share inside server/
 * (not a public header: handlers see only http.h).
 *
 * The layer is four files, one job each:
 *   http.c        the daemon: create/destroy, the access handler (body
 *                 collection with limits, framing checks), queuing a
 *                 handler's answer, the completion callback, binding.
 *   http_stream.c streamed answers: suspend/resume, the pull reader, the
 *                 peer check of suspended connections, the housekeeper.
 *   http_work.c   the worker pool that runs handlers of requests with a body.
 *   http_conns.c  connection admission and deadlines: per-address counts,
 *                 the connection limit with slow-client eviction, the
 *                 request deadline and the write-progress deadline.
 *
 * Lock order, everywhere: srv->mu, then a stream's st->mu, then srv->ip_mu;
 * srv->work_mu is never held with another. A stream's producer callbacks
 * (read, close) run without st->mu held (http.h says why).
 */
#ifndef DSV4_SERVER_HTTP_INTERNAL_H
#define DSV4_SERVER_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "server/http.h"

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

/* ---- http.c ---- */

/* Answer c at once with a static body (copied), marking hc answered. */
enum MHD_Result http__queue_plain(struct MHD_Connection *c, struct http_conn *hc, int status, const char *ct,
				  const char *body);
/* The application's handler over hc's collected request. */
void http__call_handler(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc, const char *method,
			const char *url, struct http_response *resp, struct http_stream **st);

/* ---- http_stream.c ---- */

/* A stream for connection c (NULL: out of memory); http__stream_free
 * releases one that was never linked or has been unlinked. */
struct http_stream *http__stream_new(struct http_server *s, struct MHD_Connection *c);
void http__stream_free(struct http_stream *st);
/* Link st into / out of s->streams (the housekeeper's list); takes s->mu. */
void http__stream_link(struct http_server *s, struct http_stream *st);
void http__stream_unlink(struct http_server *s, struct http_stream *st);
/* A libmicrohttpd response that pulls st's producer (chunked, unknown size). */
struct MHD_Response *http__stream_response(struct http_stream *st);
/* The housekeeping thread: twice a second, checks the peer of every
 * suspended stream and wakes it, then enforces the connection deadlines. */
void *http__housekeeper_main(void *arg);

/* ---- http_work.c ---- */

/* Start up to n workers (none started: handlers run on the connection
 * threads, and a warning says so). */
void http__workers_start(struct http_server *s, int n);
/* Hand hc's handler to the pool and suspend c until it is done; a 503 when
 * max_queued_work requests already wait or run. */
enum MHD_Result http__work_submit(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc,
				  const char *method, const char *url);
/* Run what is queued, then stop the workers. */
void http__workers_stop(struct http_server *s);

/* ---- http_conns.c ---- */

/* libmicrohttpd's accept policy callback (MHD_AcceptPolicyCallback). */
enum MHD_Result http__on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* libmicrohttpd's connection start/close callback: tracks open
 * connections, their address and their request phase. */
void http__on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			 enum MHD_ConnectionNotificationCode toe);
/* The request phase of c begins again (receiving) or is over. */
void http__sock_phase(struct http_server *s, struct MHD_Connection *c, bool receiving);
/* Shut the connections past the request or write-progress deadline. */
void http__socks_enforce(struct http_server *s);

#endif
