/*
 * tests/scheduler/test_sched_stress.c: many random requests (shared
 * prefixes, n up to 3, random sampling parameters and lengths) on a small
 * cache that forces preemption and eviction, with random aborts. After every
 * step the block accounting invariants must hold; at the end every choice
 * must have finished exactly once, every choice that finished normally must
 * equal the fake executor's reference output, and no block may stay used.
 */
#include <time.h>

#include "harness.h"

static uint64_t g_rng;

static uint32_t rnd(uint32_t n)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((g_rng >> 33) % n);
}

static int check_choices(struct harness *h, struct h_req *r)
{
	int bad = 0;
	int32_t *ref = malloc(H_MAX_OUT * sizeof(int32_t));
	uint32_t mml = h->fo.n_blocks * h->fo.block_tokens;
	if (h->fo.max_model_len < mml)
		mml = h->fo.max_model_len;
	for (uint32_t c = 0; c < r->n; c++) {
		const struct h_choice *ch = &r->ch[c];
		if (!ch->finished) {
			fprintf(stderr, "request %llu choice %u never finished\n", (unsigned long long)r->id, c);
			bad++;
			continue;
		}
		if (ch->fin.finish != SCHED_FINISH_STOP && ch->fin.finish != SCHED_FINISH_LENGTH)
			continue; /* aborted: any prefix is fine */
		struct kern_sampling_params sp = r->sp;
		sp.seed = sched_choice_seed(r->sp.seed, c);
		int32_t stopped;
		uint32_t n = fake_reference_min(&h->fo, r->prompt, r->n_prompt, &sp, r->max_tokens, r->min_tokens,
						r->ignore_eos, NULL, 0, mml, ref, &stopped);
		if (ch->n != n || memcmp(ch->toks, ref, n * sizeof(int32_t)) || ch->fin.n_output_tokens != n) {
			uint32_t i = 0;
			while (i < n && i < ch->n && ch->toks[i] == ref[i])
				i++;
			fprintf(stderr, "request %llu choice %u: %u tokens vs reference %u, first diff at %u (preempted %u)\n",
				(unsigned long long)r->id, c, ch->n, n, i, ch->fin.timing.n_preemptions);
			bad++;
		}
	}
	free(ref);
	return bad;
}

static void run(int caching, uint32_t n_requests, bool block_mode)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.block_mode = block_mode;
	fo.n_blocks = 40;
	fo.max_step_tokens = 96;
	fo.max_step_seqs = 12;
	fo.eos_bias = -1.0f;
	struct sched_options so = {.disable_prefix_caching = !caching, .max_queued_requests = 64,
				   .policy = caching ? SCHED_POLICY_FCFS : SCHED_POLICY_PRIORITY};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prefixes[4][96];
	for (int i = 0; i < 4; i++)
		h_rand_tokens(prefixes[i], 96, fo.vocab, &g_rng);
	struct h_req **reqs = calloc(n_requests, sizeof(*reqs));
	uint32_t n_sub = 0, steps = 0, n_aborted = 0, n_refused = 0;
	while ((n_sub < n_requests || sched_has_work(h.s)) && steps < 100000) {
		/* submit 0-2 requests per step */
		for (uint32_t k = rnd(3); k > 0 && n_sub < n_requests; k--) {
			int32_t prompt[200];
			uint32_t pre = rnd(3) ? rnd(97) : 0, suf = 1 + rnd(60);
			memcpy(prompt, prefixes[rnd(4)], pre * sizeof(int32_t));
			h_rand_tokens(prompt + pre, suf, fo.vocab, &g_rng);
			struct kern_sampling_params sp = h_sp(rnd(3) ? 0.8f : 0.0f, g_rng);
			if (rnd(2))
				sp.top_k = 1 + (int32_t)rnd(40);
			if (rnd(2))
				sp.top_p = 0.5f + 0.5f * (float)rnd(100) / 100.0f;
			if (!rnd(4))
				sp.frequency_penalty = 0.3f;
			struct h_req *r = h_req_new(prompt, pre + suf, 1 + (rnd(4) == 0) * (1 + rnd(2)), 1 + rnd(70), sp);
			r->ignore_eos = !rnd(5);
			if (!rnd(4))
				r->min_tokens = rnd(r->max_tokens + 1);
			struct sched_request_params p = h_params(r);
			if (!caching)
				p.priority = (int32_t)rnd(3);
			struct err e = {0};
			enum sched_refusal why;
			if (sched_submit(h.s, &p, &r->id, &why, &e)) {
				T_CHECKF(why == SCHED_REFUSE_QUEUE_FULL || why == SCHED_REFUSE_TOO_LONG, "%s", e.msg);
				h_req_free(r);
				n_refused++;
				continue;
			}
			reqs[n_sub++] = r;
		}
		/* abort a random earlier request now and then (it may have finished: NOTFOUND) */
		if (n_sub && !rnd(8)) {
			struct h_req *r = reqs[rnd(n_sub)];
			enum sched_finish_reason why = rnd(2) ? SCHED_FINISH_ABORT : SCHED_FINISH_TIMEOUT;
			if (sched_abort(h.s, r->id, why) == ST_OK)
				n_aborted++;
			struct err e = {0};
			T_CHECKF(sched_check_invariants(h.s, &e) == ST_OK, "after abort: %s", e.msg);
		}
		struct err e = {0};
		T_CHECKF(sched_step(h.s, NULL, &e) == ST_OK, "%s", e.msg);
		e = (struct err){0};
		enum status st = sched_check_invariants(h.s, &e);
		T_CHECKF(st == ST_OK, "step %u: %s", steps, e.msg);
		if (st || h.f.error[0])
			break;
		steps++;
	}
	T_CHECKF(!h.f.error[0], "%s", h.f.error);
	T_CHECK(!sched_has_work(h.s));
	int bad = 0;
	for (uint32_t i = 0; i < n_sub; i++) {
		bad += check_choices(&h, reqs[i]);
		T_CHECK(!reqs[i]->bad_order);
	}
	T_CHECKF(bad == 0, "%d choices differ from the reference", bad);
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && st.n_requests_running == 0 && st.n_requests_waiting == 0);
	fprintf(stderr, "%s mode, caching %d: %u requests (%u refused), %u aborted, %u steps, %llu preemptions, "
		"prefix hits %llu / %llu tokens\n", block_mode ? "block" : "slot", caching, n_sub, n_refused, n_aborted, steps,
		(unsigned long long)st.n_preemptions, (unsigned long long)st.prefix_cache_hits_tokens,
		(unsigned long long)st.prefix_cache_queries_tokens);
	T_CHECK(st.n_preemptions > 0);
	if (caching)
		T_CHECK(st.prefix_cache_hits_tokens > 0);
	for (uint32_t i = 0; i < n_sub; i++)
		h_req_free(reqs[i]);
	free(reqs);
	h_close(&h);
}

int main(void)
{
	g_rng = h_seed();
	run(1, 250, false);
	run(0, 150, false);
	run(1, 150, true);
	run(0, 100, true);
	return test_exit();
}
