/*
 * server/http_stream.c: streamed answers in the HTTP layer
 * (http_internal.h). A handler's stream is pulled by libmicrohttpd through
 * the reader here; when the producer has nothing yet the connection is
 * suspended until http_stream_wake(). Suspended connections are not polled
 * by libmicrohttpd, so the housekeeping thread resumes them twice a second
 * and peeks at their socket: a client that went away is then noticed even
 * when the producer has nothing to say.
 */
#include "http_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/timeutil.h"

struct http_stream *http__stream_new(struct http_server *s, struct MHD_Connection *c)
{
	struct http_stream *st = calloc(1, sizeof *st);
	if (!st)
		return NULL;
	pthread_mutex_init(&st->mu, NULL);
	st->conn = c;
	st->srv = s;
	return st;
}

void http__stream_free(struct http_stream *st)
{
	pthread_mutex_destroy(&st->mu);
	free(st);
}

void http__stream_link(struct http_server *s, struct http_stream *st)
{
	pthread_mutex_lock(&s->mu);
	st->next = s->streams;
	if (s->streams)
		s->streams->prev = st;
	s->streams = st;
	pthread_mutex_unlock(&s->mu);
}

void http__stream_unlink(struct http_server *s, struct http_stream *st)
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

struct MHD_Response *http__stream_response(struct http_stream *st)
{
	return MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, st, stream_free_noop);
}

void *http__housekeeper_main(void *arg)
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
		http__socks_enforce(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}
