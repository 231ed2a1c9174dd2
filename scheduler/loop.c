/*
 * scheduler/loop.c: the step-loop thread and the queues around it.
 *
 * One thread owns the core scheduler and the executor (style.md rule 12).
 * HTTP threads talk to it only through:
 *   - the submission list and abort list (one mutex, held for O(1) work);
 *   - one struct sched_stream per request: an unbounded FIFO of events
 *     (bounded in practice by n * max_tokens) that the step loop appends to
 *     under the stream's own mutex and HTTP threads drain with
 *     sched_stream_pull(). The step loop never waits on a consumer.
 * A stream has two references, the caller's and the loop's; the loop drops
 * its reference after the last FINISH event, the caller with
 * sched_stream_release(), and whoever is last frees it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/gram.h"
#include "common/log.h"
#include "scheduler/scheduler.h"

struct sched_stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct sched_event *evs; /* ring */
	uint32_t head, n, cap;
	uint32_t n_choices, n_finish_pushed, n_finish_pulled;
	int refs;
	bool released;
	void (*notify)(void *user);
	void *notify_user;
	uint64_t request_id;
	struct sched_loop *loop;
	size_t backlog_bytes, backlog_max; /* queued events' bytes; its bound */
	bool backlog_cut;                  /* aborted for it */
};

/* ---- the backlog bound of a stream (issue 17) ---- */

static _Atomic size_t sched__backlog_bytes = SCHED_DEFAULT_STREAM_BACKLOG_BYTES;

void sched_set_stream_backlog_bytes(size_t bytes)
{
	atomic_store(&sched__backlog_bytes, bytes ? bytes : SCHED_DEFAULT_STREAM_BACKLOG_BYTES);
}

/* What one queued event holds in memory. */
static size_t event_bytes(const struct sched_event *ev)
{
	size_t n = sizeof *ev + ev->text_bytes;
	if (ev->prompt_lp)
		n += (size_t)ev->n_prompt_tokens * (8 + (size_t)ev->prompt_lp->n_top * 8);
	return n;
}

struct loop_sub {
	struct loop_sub *next;
	struct sched_request_params p; /* deep copy */
	struct sched_stream *stream;
};

struct loop_abort {
	uint64_t id;
	enum sched_finish_reason reason;
};

struct sched_loop {
	struct sched *s;
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct loop_sub *subs_head, *subs_tail;
	uint32_t n_subs;
	uint32_t n_moving; /* taken off subs by the loop thread, not yet all handed to the core */
	struct loop_abort *aborts;
	uint32_t n_aborts, cap_aborts;
	bool stop, draining;
	atomic_uint_fast64_t next_id;
	uint32_t max_queued;
	void (*heartbeat)(void *ctx);
	void *heartbeat_ctx;
	uint32_t heartbeat_ms;
};

const struct sched *sched_loop_core(const struct sched_loop *l)
{
	return l->s;
}

static void deadline_in(struct timespec *ts, uint32_t ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* ---- streams ---- */

static void stream_unref(struct sched_stream *st)
{
	pthread_mutex_lock(&st->mu);
	int left = --st->refs;
	pthread_mutex_unlock(&st->mu);
	if (left)
		return;
	for (uint32_t i = 0; i < st->n; i++)
		sched_event_clear(&st->evs[(st->head + i) % st->cap]);
	free(st->evs);
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st);
}

/* The core's on_event callback, on the step-loop thread. */
static void stream_push(void *user, struct sched_event *ev)
{
	struct sched_stream *st = user;
	bool last = false, queued = false, cut = false;
	size_t evb = event_bytes(ev);
	pthread_mutex_lock(&st->mu);
	if (ev->kind == SCHED_EV_FINISH)
		last = ++st->n_finish_pushed == st->n_choices;
	if (!st->released) {
		if (st->n == st->cap) {
			uint32_t c = st->cap ? st->cap * 2 : 16;
			struct sched_event *p = malloc((size_t)c * sizeof(*p));
			if (p) {
				for (uint32_t i = 0; i < st->n; i++)
					p[i] = st->evs[(st->head + i) % st->cap];
				free(st->evs);
				st->evs = p;
				st->head = 0;
				st->cap = c;
			}
		}
		if (st->n < st->cap) {
			st->evs[(st->head + st->n) % st->cap] = *ev;
			st->n++;
			queued = true;
			st->backlog_bytes += evb;
			/* the consumer does not keep up (a client reading slower than
			 * the model writes): end the request rather than queue on */
			if (st->backlog_bytes > st->backlog_max && !st->backlog_cut && ev->kind != SCHED_EV_FINISH &&
			    st->n_finish_pushed < st->n_choices)
				cut = st->backlog_cut = true;
		} else if (ev->kind == SCHED_EV_FINISH) {
			st->n_finish_pulled++; /* out of memory: the consumer still learns the end via done() */
		}
	}
	pthread_cond_broadcast(&st->cv);
	void (*fn)(void *) = st->released ? NULL : st->notify;
	void *fu = st->notify_user;
	pthread_mutex_unlock(&st->mu);
	if (!queued)
		sched_event_clear(ev);
	if (cut) {
		log_msg(LOG_WARN, "sched", "request %llu: its client takes the output slower than it is generated "
			"(%zu bytes waiting): aborted", (unsigned long long)st->request_id, st->backlog_max);
		sched_loop_abort(st->loop, st->request_id, SCHED_FINISH_ABORT);
	}
	if (fn)
		fn(fu);
	if (last)
		stream_unref(st);
}

static struct sched_stream *stream_new(struct sched_loop *l, uint64_t id, uint32_t n_choices)
{
	struct sched_stream *st = calloc(1, sizeof(*st));
	if (!st)
		return NULL;
	if (pthread_mutex_init(&st->mu, NULL)) {
		free(st);
		return NULL;
	}
	pthread_cond_init(&st->cv, NULL);
	st->refs = 2;
	st->n_choices = n_choices;
	st->request_id = id;
	st->loop = l;
	st->backlog_max = atomic_load(&sched__backlog_bytes);
	return st;
}

/* Deliver FINISH(reason) for every choice of a request that never reached the core. */
static void stream_fail(struct sched_stream *st, enum sched_finish_reason reason)
{
	for (uint32_t i = 0; i < st->n_choices; i++) {
		struct sched_event ev = {.kind = SCHED_EV_FINISH, .request_id = st->request_id, .choice = i,
					 .token_id = -1, .finish = reason, .stop_token_id = -1, .stop_string_index = -1};
		stream_push(st, &ev);
	}
}

uint32_t sched_stream_pull(struct sched_stream *st, struct sched_event *evs, uint32_t max, int timeout_ms)
{
	pthread_mutex_lock(&st->mu);
	if (timeout_ms != 0) {
		struct timespec dl;
		if (timeout_ms > 0)
			deadline_in(&dl, (uint32_t)timeout_ms);
		while (!st->n && st->n_finish_pushed < st->n_choices) {
			if (timeout_ms < 0)
				pthread_cond_wait(&st->cv, &st->mu);
			else if (pthread_cond_timedwait(&st->cv, &st->mu, &dl))
				break;
		}
	}
	uint32_t k = 0;
	while (k < max && st->n) {
		evs[k] = st->evs[st->head];
		if (evs[k].kind == SCHED_EV_FINISH)
			st->n_finish_pulled++;
		size_t evb = event_bytes(&evs[k]);
		st->backlog_bytes = st->backlog_bytes > evb ? st->backlog_bytes - evb : 0;
		st->head = (st->head + 1) % st->cap;
		st->n--;
		k++;
	}
	pthread_mutex_unlock(&st->mu);
	return k;
}

bool sched_stream_done(struct sched_stream *st)
{
	pthread_mutex_lock(&st->mu);
	bool d = st->n_finish_pulled >= st->n_choices;
	pthread_mutex_unlock(&st->mu);
	return d;
}

void sched_stream_set_notify(struct sched_stream *st, void (*fn)(void *user), void *user)
{
	pthread_mutex_lock(&st->mu);
	st->notify = fn;
	st->notify_user = user;
	pthread_mutex_unlock(&st->mu);
}

void sched_stream_release(struct sched_stream *st)
{
	if (!st)
		return;
	pthread_mutex_lock(&st->mu);
	st->released = true;
	bool ended = st->n_finish_pushed >= st->n_choices;
	pthread_mutex_unlock(&st->mu);
	if (!ended)
		sched_loop_abort(st->loop, st->request_id, SCHED_FINISH_ABORT);
	stream_unref(st);
}

/* ---- submissions ---- */

static void sub_free(struct loop_sub *sb)
{
	if (!sb)
		return;
	free((void *)sb->p.prompt_ids);
	free((void *)sb->p.sampling.logit_bias);
	free((void *)sb->p.stop_token_ids);
	for (uint32_t i = 0; sb->p.stop_strings && i < sb->p.n_stop_strings; i++)
		free((void *)sb->p.stop_strings[i]);
	free((void *)sb->p.stop_strings);
	gram_release(sb->p.grammar);
	free(sb);
}

static void *dup_bytes(const void *src, size_t n, bool *ok)
{
	if (!n)
		return NULL;
	void *p = malloc(n);
	if (!p)
		*ok = false;
	else
		memcpy(p, src, n);
	return p;
}

static struct loop_sub *sub_copy(const struct sched_request_params *p)
{
	struct loop_sub *sb = calloc(1, sizeof(*sb));
	if (!sb)
		return NULL;
	bool ok = true;
	sb->p = *p;
	sb->p.prompt_ids = dup_bytes(p->prompt_ids, (size_t)p->n_prompt * sizeof(int32_t), &ok);
	sb->p.sampling.logit_bias =
		dup_bytes(p->sampling.logit_bias, (size_t)p->sampling.n_logit_bias * sizeof(struct sched_logit_bias), &ok);
	sb->p.stop_token_ids = dup_bytes(p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t), &ok);
	sb->p.stop_strings = NULL;
	if (p->n_stop_strings) {
		char **ss = calloc(p->n_stop_strings, sizeof(char *));
		sb->p.stop_strings = (const char *const *)ss;
		ok = ok && ss;
		for (uint32_t i = 0; ss && i < p->n_stop_strings; i++)
			ok = ok && (ss[i] = strdup(p->stop_strings[i]));
	}
	gram_retain(sb->p.grammar); /* the queued copy holds its own reference (sub_free drops it) */
	if (!ok) {
		sub_free(sb);
		return NULL;
	}
	return sb;
}

enum status sched_loop_submit(struct sched_loop *l, const struct sched_request_params *p,
			      struct sched_stream **stream_out, uint64_t *id_out, enum sched_refusal *why,
			      struct err *e)
{
	*stream_out = NULL;
	enum sched_refusal rf = sched_check(l->s, p, e);
	if (rf != SCHED_ACCEPTED) {
		*why = rf;
		return e ? e->st : ST_INVALID;
	}
	uint64_t id = p->request_id ? p->request_id : atomic_fetch_add(&l->next_id, 1);
	struct loop_sub *sb = sub_copy(p);
	struct sched_stream *st = sb ? stream_new(l, id, p->n ? p->n : 1) : NULL;
	if (!st) {
		sub_free(sb);
		*why = SCHED_REFUSE_NOMEM;
		return err_set(e, ST_NOMEM, "out of memory queueing the request");
	}
	sb->p.request_id = id;
	sb->p.on_event = stream_push;
	sb->p.user = st;
	sb->stream = st;
	struct sched_stats stats;
	sched_stats_get(l->s, &stats);
	pthread_mutex_lock(&l->mu);
	rf = SCHED_ACCEPTED;
	if (l->draining || l->stop) {
		rf = SCHED_REFUSE_DRAINING;
		err_set(e, ST_BUSY, "the server is shutting down");
	} else if (l->n_subs + stats.n_requests_waiting >= l->max_queued) {
		rf = SCHED_REFUSE_QUEUE_FULL;
		err_set(e, ST_BUSY, "the queue is full (%u requests waiting)", l->n_subs + stats.n_requests_waiting);
	} else {
		if (l->subs_tail)
			l->subs_tail->next = sb;
		else
			l->subs_head = sb;
		l->subs_tail = sb;
		l->n_subs++;
		pthread_cond_signal(&l->cv);
	}
	pthread_mutex_unlock(&l->mu);
	*why = rf;
	if (rf != SCHED_ACCEPTED) {
		sub_free(sb);
		st->refs = 1;
		stream_unref(st);
		return e ? e->st : ST_BUSY;
	}
	*stream_out = st;
	if (id_out)
		*id_out = id;
	return ST_OK;
}

void sched_loop_abort(struct sched_loop *l, uint64_t request_id, enum sched_finish_reason reason)
{
	pthread_mutex_lock(&l->mu);
	if (l->n_aborts == l->cap_aborts) {
		uint32_t c = l->cap_aborts ? l->cap_aborts * 2 : 16;
		struct loop_abort *a = realloc(l->aborts, (size_t)c * sizeof(*a));
		if (a) {
			l->aborts = a;
			l->cap_aborts = c;
		}
	}
	if (l->n_aborts < l->cap_aborts)
		l->aborts[l->n_aborts++] = (struct loop_abort){request_id, reason};
	else
		log_msg(LOG_ERROR, "sched", "request %llu: out of memory queueing an abort", (unsigned long long)request_id);
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

/* ---- the thread ---- */

static void *loop_main(void *arg)
{
	struct sched_loop *l = arg;
	struct loop_abort *ab = NULL;
	uint32_t cap_ab = 0;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		while (!l->stop && !l->subs_head && !l->n_aborts && !sched_has_work(l->s)) {
			if (!l->heartbeat) {
				pthread_cond_wait(&l->cv, &l->mu);
				continue;
			}
			struct timespec dl;
			deadline_in(&dl, l->heartbeat_ms);
			if (pthread_cond_timedwait(&l->cv, &l->mu, &dl)) {
				pthread_mutex_unlock(&l->mu);
				l->heartbeat(l->heartbeat_ctx); /* idle: still alive */
				pthread_mutex_lock(&l->mu);
			}
		}
		struct loop_sub *subs = l->subs_head;
		l->subs_head = l->subs_tail = NULL;
		l->n_moving = l->n_subs; /* still active for sched_loop_n_active until sched_submit has them */
		l->n_subs = 0;
		uint32_t n_ab = l->n_aborts;
		if (n_ab > cap_ab) {
			struct loop_abort *p = realloc(ab, (size_t)n_ab * sizeof(*p));
			if (p) {
				ab = p;
				cap_ab = n_ab;
			} else {
				n_ab = cap_ab;
			}
		}
		if (n_ab)
			memcpy(ab, l->aborts, (size_t)n_ab * sizeof(*ab));
		if (l->n_aborts > n_ab)
			memmove(l->aborts, l->aborts + n_ab, (size_t)(l->n_aborts - n_ab) * sizeof(*ab));
		l->n_aborts -= n_ab;
		bool stop = l->stop;
		pthread_mutex_unlock(&l->mu);

		while (subs) {
			struct loop_sub *sb = subs;
			subs = sb->next;
			struct err e = {0};
			enum sched_refusal why;
			if (stop || sched_submit(l->s, &sb->p, NULL, &why, &e))
				stream_fail(sb->stream, stop ? SCHED_FINISH_SHUTDOWN : SCHED_FINISH_ERROR);
			sub_free(sb);
			pthread_mutex_lock(&l->mu);
			l->n_moving--;
			pthread_mutex_unlock(&l->mu);
		}
		for (uint32_t i = 0; i < n_ab; i++)
			(void)sched_abort(l->s, ab[i].id, ab[i].reason); /* unknown: already finished */
		if (stop) {
			sched_abort_all(l->s, SCHED_FINISH_SHUTDOWN);
			break;
		}
		struct err e = {0};
		(void)sched_step(l->s, NULL, &e); /* failures are logged and end the step's requests */
		if (l->heartbeat)
			l->heartbeat(l->heartbeat_ctx);
	}
	free(ab);
	return NULL;
}

enum status sched_loop_create(struct sched_loop **out, const struct sched_options *opt, struct exec *ex,
			      struct err *e)
{
	*out = NULL;
	struct sched_loop *l = calloc(1, sizeof(*l));
	if (!l)
		return err_set(e, ST_NOMEM, "sched: out of memory");
	/* The loop enforces max_queued_requests itself, synchronously in submit;
	 * the core must not refuse what the loop already accepted. */
	struct sched_options core_opt = opt ? *opt : (struct sched_options){0};
	core_opt.max_queued_requests = UINT32_MAX;
	enum status st = sched_create(&l->s, &core_opt, ex, e);
	if (st) {
		free(l);
		return st;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	atomic_init(&l->next_id, 1);
	l->max_queued = opt && opt->max_queued_requests ? opt->max_queued_requests : SCHED_DEFAULT_MAX_QUEUED_REQUESTS;
	l->heartbeat = opt ? opt->heartbeat : NULL;
	l->heartbeat_ctx = opt ? opt->heartbeat_ctx : NULL;
	l->heartbeat_ms = opt && opt->heartbeat_ms ? opt->heartbeat_ms : 1000;
	if (pthread_create(&l->th, NULL, loop_main, l)) {
		sched_loop_destroy(l);
		return err_set(e, ST_NOMEM, "sched: cannot start the step-loop thread");
	}
	l->started = true;
	*out = l;
	return ST_OK;
}

void sched_loop_destroy(struct sched_loop *l)
{
	if (!l)
		return;
	if (l->started) {
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_signal(&l->cv);
		pthread_mutex_unlock(&l->mu);
		pthread_join(l->th, NULL);
	}
	/* Submissions that raced with the stop never reached the core. */
	while (l->subs_head) {
		struct loop_sub *sb = l->subs_head;
		l->subs_head = sb->next;
		stream_fail(sb->stream, SCHED_FINISH_SHUTDOWN);
		sub_free(sb);
	}
	sched_destroy(l->s);
	free(l->aborts);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}

void sched_loop_drain(struct sched_loop *l)
{
	pthread_mutex_lock(&l->mu);
	l->draining = true;
	pthread_mutex_unlock(&l->mu);
}

uint32_t sched_loop_n_active(struct sched_loop *l)
{
	/* The loop's queue first, the core's published counts after: a request
	 * moving from one to the other is counted by the first read or, once
	 * sched_submit has published it, by the second (maybe by both; never by
	 * neither, which read the core first and took a request in transit for
	 * an idle loop: test_sched_backlog saw 0 right after a submit). */
	pthread_mutex_lock(&l->mu);
	uint32_t n = l->n_subs + l->n_moving;
	pthread_mutex_unlock(&l->mu);
	struct sched_stats st;
	sched_stats_get(l->s, &st);
	return n + st.n_requests_running + st.n_requests_waiting;
}

void sched_loop_stats(struct sched_loop *l, struct sched_stats *out)
{
	sched_stats_get(l->s, out);
}
