/*
 * tests/scheduler/test_sched_backlog.c: a stream's backlog bound (issue 17).
 * A consumer that stops pulling (an SSE client reading slower than the model
 * writes) used to make its request's events pile up for as long as it
 * generated; now the request is aborted once the untaken events pass the
 * bound (sched_set_stream_backlog_bytes), with at most a bound's worth
 * queued. A consumer that keeps pulling is never cut, even for many times
 * the bound's worth of events.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

int main(void)
{
	uint64_t seed = h_seed();
	struct fake_exec_options fo = h_default_fake();
	fo.n_blocks = 4096;
	fo.max_model_len = 65536;
	struct fake_exec f;
	T_CHECK(!fake_exec_init(&f, &fo));
	struct sched_options so = {.detokenize = fake_detok, .max_queued_requests = 16};
	struct err e = {0};
	struct sched_loop *loop = NULL;
	T_CHECK(sched_loop_create(&loop, &so, &f.ex, &e) == ST_OK);
	if (!loop)
		return test_exit();
	uint64_t rng = seed;
	int32_t prompt[32];
	h_rand_tokens(prompt, 32, fo.vocab, &rng);
	enum sched_refusal why;

	/* 1. nobody pulls: aborted near the bound, not after 60000 tokens */
	size_t bound = (size_t)(32 + rng % 64) << 10; /* 32..95 KB */
	sched_set_stream_backlog_bytes(bound);
	struct sched_request_params p = {.prompt_ids = prompt, .n_prompt = 32, .sampling = h_ssp(0.8f, rng),
					 .has_seed = true, .max_tokens = 60000, .ignore_eos = true,
					 .n = 1 + (uint32_t)(rng >> 33) % 3};
	struct sched_stream *st = NULL;
	T_CHECK(!sched_loop_submit(loop, &p, &st, NULL, &why, &e));
	for (int i = 0; i < 30000 && sched_loop_n_active(loop); i++)
		usleep(1000);
	T_CHECK(sched_loop_n_active(loop) == 0);
	uint32_t n_tok = 0, n_fin = 0, n_abort = 0;
	size_t bytes = 0;
	struct sched_event ev;
	while (st && !sched_stream_done(st) && sched_stream_pull(st, &ev, 1, 1000) == 1) {
		bytes += sizeof ev + ev.text_bytes;
		n_tok += ev.kind == SCHED_EV_TOKEN;
		if (ev.kind == SCHED_EV_FINISH) {
			n_fin++;
			n_abort += ev.finish == SCHED_FINISH_ABORT;
		}
		sched_event_clear(&ev);
	}
	T_CHECKF(n_fin == p.n && n_abort == p.n, "n %u: %u finish events, %u aborted", p.n, n_fin, n_abort);
	/* one step's events may land past the bound before the abort is seen */
	T_CHECKF(bytes > bound && bytes <= bound + 4 * (size_t)p.n * (sizeof ev + SCHED_MAX_TOKEN_BYTES),
		 "queued %zu bytes (%u tokens) for a bound of %zu", bytes, n_tok, bound);
	sched_stream_release(st);

	/* 2. a consumer that pulls gets everything, many bounds' worth */
	sched_set_stream_backlog_bytes((size_t)1 << 20);
	p.max_tokens = 20000;
	p.n = 1;
	T_CHECK(!sched_loop_submit(loop, &p, &st, NULL, &why, &e));
	n_tok = n_fin = n_abort = 0;
	bytes = 0;
	while (st && !sched_stream_done(st)) {
		struct sched_event evs[64];
		uint32_t got = sched_stream_pull(st, evs, 64, -1);
		for (uint32_t i = 0; i < got; i++) {
			bytes += sizeof evs[i] + evs[i].text_bytes;
			n_tok += evs[i].kind == SCHED_EV_TOKEN;
			if (evs[i].kind == SCHED_EV_FINISH)
				n_abort += evs[i].finish == SCHED_FINISH_ABORT;
			sched_event_clear(&evs[i]);
		}
	}
	T_CHECKF(n_tok == 20000 && n_abort == 0, "a pulling consumer: %u tokens, %u aborted", n_tok, n_abort);
	T_CHECKF(bytes > ((size_t)4 << 20), "it took %zu bytes, several bounds' worth", bytes);
	sched_stream_release(st);
	sched_set_stream_backlog_bytes(0);
	sched_loop_destroy(loop);
	T_CHECKF(!f.error[0], "%s", f.error);
	fake_exec_fini(&f);
	return test_exit();
}
