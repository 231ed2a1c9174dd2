/*
 * server/http_work.c: the worker pool of the HTTP layer (http_internal.h).
 * Requests with a body run their handler here while their connection is
 * suspended, so that an 8 MB body to tokenize never holds a connection
 * thread; the queue is bounded (max_queued_work), and past it the answer is
 * a 503 at once. The worker resumes the connection, which then queues the
 * handler's answer on its own thread.
 */
#include "http_internal.h"

#include <stdlib.h>

#include "common/log.h"

static const char *busy_body =
	"{\"error\":{\"message\":\"server busy: too many requests are being parsed; retry shortly\","
	"\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";

enum MHD_Result http__work_submit(struct http_server *s, struct MHD_Connection *c, struct http_conn *hc,
				  const char *method, const char *url)
{
	pthread_mutex_lock(&s->work_mu);
	bool full = s->n_work >= s->max_work || s->work_stop;
	if (!full)
		s->n_work++;
	pthread_mutex_unlock(&s->work_mu);
	if (full) {
		log_msg(LOG_WARN, "http", "%s %s: 503, %u requests already wait for a worker", method, url, s->max_work);
		return http__queue_plain(c, hc, 503, "application/json", busy_body);
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
		struct http_stream *st = resp ? http__stream_new(s, hc->conn) : NULL;
		if (resp && st) {
			resp->status = 500;
			http__call_handler(s, hc->conn, hc, hc->method, hc->url, resp, &st);
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

void http__workers_stop(struct http_server *s)
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

void http__workers_start(struct http_server *s, int n)
{
	s->workers = calloc((size_t)n, sizeof *s->workers);
	for (int i = 0; s->workers && i < n; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s))
			break;
		s->n_workers++;
	}
	if (s->n_workers == 0) { /* handlers then run inline on the connection threads */
		free(s->workers);
		s->workers = NULL;
		log_msg(LOG_WARN, "http", "could not start request workers: handlers run on the connection threads");
	}
}
