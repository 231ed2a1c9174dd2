/*
 * tests/scheduler/test_sched_loop.c: the threaded wrapper. Several client
 * threads submit, pull (blocking and polling), and sometimes drop their
 * stream early (a client disconnect); outputs must equal the fake's
 * reference, every stream must end, and all blocks must come back. Then
 * drain refuses new work with 503, and destroying the loop with requests in
 * flight ends them with SCHED_FINISH_SHUTDOWN.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static struct fake_exec_options g_fo;
static struct sched_loop *g_loop;
static _Atomic int g_bad, g_done, g_dropped, g_beats;

static void beat(void *ctx)
{
	(void)ctx;
	g_beats++;
}

struct client {
	int idx;
	uint64_t rng;
};

static void *client_main(void *arg)
{
	struct client *c = arg;
	for (int k = 0; k < 12; k++) {
		int32_t prompt[80];
		uint32_t n_prompt = 1 + (uint32_t)(c->rng % 70);
		h_rand_tokens(prompt, n_prompt, g_fo.vocab, &c->rng);
		uint32_t n = 1 + (uint32_t)(c->rng >> 40) % 2, max_tokens = 1 + (uint32_t)(c->rng >> 20) % 30;
		struct kern_sampling_params sp = h_sp((c->rng >> 50) % 2 ? 0.9f : 0.0f, c->rng ^ 77);
		struct sched_request_params p = {.prompt_ids = prompt, .n_prompt = n_prompt,
						 .sampling = h_sched_sampling(&sp, NULL),
						 .has_seed = true, .max_tokens = max_tokens, .n = n};
		struct sched_stream *st;
		struct err e = {0};
		enum sched_refusal why;
		uint64_t id;
		if (sched_loop_submit(g_loop, &p, &st, &id, &why, &e)) {
			fprintf(stderr, "client %d: refused: %s\n", c->idx, e.msg);
			g_bad++;
			continue;
		}
		bool drop = (k + c->idx) % 5 == 0;
		int32_t toks[2][64];
		uint32_t nt[2] = {0, 0}, finished = 0;
		enum sched_finish_reason fin[2] = {0, 0};
		while (!sched_stream_done(st)) {
			struct sched_event evs[8];
			uint32_t got = sched_stream_pull(st, evs, 8, c->idx % 2 ? -1 : 0);
			if (!got && c->idx % 2 == 0)
				usleep(200); /* a polling client */
			for (uint32_t i = 0; i < got; i++) {
				struct sched_event *ev = &evs[i];
				if (ev->request_id != id || ev->choice >= n)
					g_bad++;
				else if (ev->kind == SCHED_EV_TOKEN && nt[ev->choice] < 64)
					toks[ev->choice][nt[ev->choice]++] = ev->token_id;
				else if (ev->kind == SCHED_EV_FINISH) {
					fin[ev->choice] = ev->finish;
					finished++;
				}
				sched_event_clear(ev);
			}
			if (drop && nt[0] >= 2)
				break;
		}
		if (drop && finished < n) {
			g_dropped++;
			sched_stream_release(st); /* the loop aborts the request */
			continue;
		}
		sched_stream_release(st);
		for (uint32_t ch = 0; ch < n; ch++) {
			struct kern_sampling_params s2 = sp;
			s2.seed = sched_choice_seed(sp.seed, ch);
			int32_t ref[64], stopped;
			uint32_t mml = g_fo.n_blocks * g_fo.block_tokens;
			uint32_t rn = fake_reference(&g_fo, prompt, n_prompt, &s2, max_tokens, false, NULL, 0, mml, ref, &stopped);
			if (rn != nt[ch] || memcmp(ref, toks[ch], rn * sizeof(int32_t)) ||
			    fin[ch] != (stopped >= 0 ? SCHED_FINISH_STOP : SCHED_FINISH_LENGTH)) {
				fprintf(stderr, "client %d request %d choice %u: %u tokens vs %u\n", c->idx, k, ch, nt[ch], rn);
				g_bad++;
			}
		}
		g_done++;
	}
	return NULL;
}

/* sched_loop_n_active never reads 0 while a request is in flight. A request
 * the loop thread had taken off its queue but not yet handed to the core was
 * counted by neither, so a caller waiting for idle could go on while it had
 * not even started (test_sched_backlog then read its stream early and saw
 * 60000 tokens instead of a backlog cut; engine_idle() has the same view).
 * Each request here is read until the loop reads idle: by then its FINISH
 * must be queued. */
static void check_n_active(uint64_t seed)
{
	struct fake_exec_options fo = h_default_fake();
	struct fake_exec f;
	T_CHECK(!fake_exec_init(&f, &fo));
	struct sched_options so = {.detokenize = fake_detok};
	struct err e = {0};
	struct sched_loop *l = NULL;
	T_CHECK(sched_loop_create(&l, &so, &f.ex, &e) == ST_OK);
	int32_t prompt[8];
	uint64_t rng = seed;
	h_rand_tokens(prompt, 8, fo.vocab, &rng);
	int n_bad = 0;
	long n_reads = 0;
	for (int k = 0; l && k < 3000 && n_bad < 3; k++) {
		struct sched_request_params p = {.prompt_ids = prompt, .n_prompt = 8, .sampling = h_ssp(0, 1),
						 .has_seed = true, .max_tokens = 1 + (uint32_t)k % 3, .ignore_eos = true};
		struct sched_stream *st = NULL;
		enum sched_refusal why;
		T_CHECK(!sched_loop_submit(l, &p, &st, NULL, &why, &e));
		if (!st)
			break;
		uint32_t n_fin = 0;
		for (;;) {
			n_reads++;
			bool idle = sched_loop_n_active(l) == 0;
			struct sched_event ev;
			while (sched_stream_pull(st, &ev, 1, 0) == 1) {
				n_fin += ev.kind == SCHED_EV_FINISH;
				sched_event_clear(&ev);
			}
			if (idle) {
				if (n_fin != 1 && n_bad++ < 3)
					fprintf(stderr, "request %d: the loop read idle before it finished\n", k);
				break;
			}
		}
		sched_stream_release(st);
	}
	fprintf(stderr, "n_active: 3000 requests, %ld reads, %d read idle too early\n", n_reads, n_bad);
	T_CHECKF(n_bad == 0, "sched_loop_n_active read 0 with a request in flight %d times", n_bad);
	sched_loop_destroy(l);
	T_CHECKF(!f.error[0], "%s", f.error);
	fake_exec_fini(&f);
}

int main(void)
{
	uint64_t seed = h_seed();
	check_n_active(seed);
	g_fo = h_default_fake();
	g_fo.n_blocks = 4096;
	g_fo.max_model_len = 65536;
	struct fake_exec f;
	T_CHECK(!fake_exec_init(&f, &g_fo));
	struct sched_options so = {.detokenize = fake_detok, .max_queued_requests = 256, .heartbeat = beat,
				   .heartbeat_ms = 5};
	struct err e = {0};
	T_CHECK(sched_loop_create(&g_loop, &so, &f.ex, &e) == ST_OK);
	enum { NT = 4 };
	pthread_t th[NT];
	struct client cl[NT];
	for (int i = 0; i < NT; i++) {
		cl[i] = (struct client){.idx = i, .rng = seed * 31 + (uint64_t)i};
		pthread_create(&th[i], NULL, client_main, &cl[i]);
	}
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	T_CHECKF(g_bad == 0, "%d bad", (int)g_bad);
	T_CHECK(g_done + g_dropped == NT * 12 && g_dropped > 0);
	/* aborts are asynchronous: wait for the loop to go idle */
	for (int i = 0; i < 2000 && sched_loop_n_active(g_loop); i++)
		usleep(1000);
	struct sched_stats st;
	sched_loop_stats(g_loop, &st);
	T_CHECK(st.n_blocks_used == 0 && st.n_requests_running == 0 && st.n_requests_waiting == 0);
	fprintf(stderr, "%d requests done, %d dropped by their client, %llu aborted\n", (int)g_done, (int)g_dropped,
		(unsigned long long)st.n_finished[SCHED_FINISH_ABORT]);
	T_CHECK(st.n_finished[SCHED_FINISH_ABORT] >= 1);
	T_CHECKF(!f.error[0], "%s", f.error);
	T_CHECK(g_beats > 0);
	const struct sched_options *ro = sched_resolved_options(sched_loop_core(g_loop));
	T_CHECK(ro->max_model_len == 65536 && ro->max_num_batched_tokens == g_fo.max_step_tokens);
	T_CHECK(sched_block_tokens(sched_loop_core(g_loop)) == g_fo.block_tokens);

	/* shutdown with requests in flight: 60000 tokens at >= 1 ms per step
	 * cannot finish before destroy below */
	atomic_store(&f.step_sleep_us, 1000);
	int32_t prompt[40];
	uint64_t rng = seed;
	h_rand_tokens(prompt, 40, g_fo.vocab, &rng);
	struct sched_request_params p = {.prompt_ids = prompt, .n_prompt = 40, .sampling = h_ssp(0, 1),
					 .has_seed = true, .max_tokens = 60000, .ignore_eos = true};
	struct sched_stream *s1, *s2;
	enum sched_refusal why;
	T_CHECK(!sched_loop_submit(g_loop, &p, &s1, NULL, &why, &e));
	T_CHECK(!sched_loop_submit(g_loop, &p, &s2, NULL, &why, &e));
	struct sched_event ev;
	T_CHECK(sched_stream_pull(s1, &ev, 1, -1) == 1); /* it is running */
	sched_event_clear(&ev);
	sched_loop_drain(g_loop);
	struct sched_stream *s3;
	T_CHECK(sched_loop_submit(g_loop, &p, &s3, NULL, &why, &e) == ST_BUSY && why == SCHED_REFUSE_DRAINING);
	T_CHECK(!s3);
	sched_loop_destroy(g_loop);
	enum sched_finish_reason last = SCHED_FINISH_NONE;
	while (!sched_stream_done(s1)) {
		T_CHECK(sched_stream_pull(s1, &ev, 1, 0) == 1);
		if (ev.kind == SCHED_EV_FINISH)
			last = ev.finish;
		sched_event_clear(&ev);
	}
	T_CHECK(last == SCHED_FINISH_SHUTDOWN);
	sched_stream_release(s1);
	sched_stream_release(s2); /* never pulled: released with its events */
	fake_exec_fini(&f);
	return test_exit();
}
