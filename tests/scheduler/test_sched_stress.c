/*
 * tests/scheduler/test_sched_stress.c: many random requests (shared
 * prefixes, n up to 3, random sampling parameters and lengths) on a small
 * cache that forces preemption and eviction, with random aborts. After every
 * step the block accounting invariants must hold; at the end every choice
 * must have finished exactly once, every choice that finished normally must
 * equal the fake executor's reference output, and no block may stay used.
 * Every step must stay within the token budget and max_num_seqs, and among
 * requests of equal priority none may be first scheduled before an earlier
 * arrival (FCFS; the queue head blocks the rest). Besides the four fixed
 * configurations, more runs draw the pool size, block size, step budget and
 * max_num_seqs at random (DSV4_STRESS_RUNS, default 12).
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

/* Among requests of equal priority, submission order = first-scheduled order. */
static int check_fcfs(struct h_req **reqs, const int32_t *prio, uint32_t n)
{
	int bad = 0;
	double *fs = calloc(n, sizeof(*fs));
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t c = 0; c < reqs[i]->n; c++)
			if (reqs[i]->ch[c].finished && reqs[i]->ch[c].fin.timing.first_scheduled_s > 0)
				fs[i] = reqs[i]->ch[c].fin.timing.first_scheduled_s;
	for (uint32_t j = 0; j < n; j++) {
		if (fs[j] == 0)
			continue; /* aborted while waiting */
		for (uint32_t i = 0; i < j; i++)
			if (prio[i] == prio[j] && fs[i] > fs[j] && bad++ < 5)
				fprintf(stderr, "FCFS: request %llu (priority %d) first scheduled after the later request %llu\n",
					(unsigned long long)reqs[i]->id, prio[i], (unsigned long long)reqs[j]->id);
	}
	free(fs);
	return bad;
}

struct run_cfg {
	uint32_t n_blocks, block_tokens, budget, max_seqs;
};

static uint64_t g_preemptions, g_requests;

static void run(int caching, uint32_t n_requests, bool block_mode, const struct run_cfg *cfg)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.block_mode = block_mode;
	fo.n_blocks = cfg ? cfg->n_blocks : 40;
	if (cfg)
		fo.block_tokens = cfg->block_tokens;
	fo.max_step_tokens = 96;
	fo.max_step_seqs = 12;
	fo.eos_bias = -1.0f;
	struct sched_options so = {.disable_prefix_caching = !caching, .max_queued_requests = 64,
				   .policy = caching ? SCHED_POLICY_FCFS : SCHED_POLICY_PRIORITY,
				   .max_num_batched_tokens = cfg ? cfg->budget : 0, .max_num_seqs = cfg ? cfg->max_seqs : 0};
	T_CHECK(!h_open(&h, &fo, &so));
	const struct sched_options *ro = sched_resolved_options(h.s);
	uint32_t budget = ro->max_num_batched_tokens, max_seqs = ro->max_num_seqs, n_over = 0;
	T_CHECK(!cfg || budget == cfg->budget);
	int32_t prefixes[4][96];
	for (int i = 0; i < 4; i++)
		h_rand_tokens(prefixes[i], 96, fo.vocab, &g_rng);
	struct h_req **reqs = calloc(n_requests, sizeof(*reqs));
	int32_t *prio = calloc(n_requests, sizeof(*prio));
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
			prio[n_sub] = p.priority;
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
		uint32_t nt = 0;
		uint64_t fake_steps = h.f.n_steps;
		T_CHECKF(sched_step(h.s, &nt, &e) == ST_OK, "%s", e.msg);
		if (h.f.n_steps != fake_steps &&
		    (nt > budget || h.f.last.n_tokens != nt || h.f.last.n_seqs > max_seqs) && n_over++ < 5)
			T_CHECKF(0, "step %u: %u tokens (executor saw %u) in %u sequences; budget %u tokens, %u sequences",
				 steps, nt, h.f.last.n_tokens, h.f.last.n_seqs, budget, max_seqs);
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
	T_CHECKF(check_fcfs(reqs, prio, n_sub) == 0, "FCFS order violated (%s policy)", caching ? "fcfs" : "priority");
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && st.n_requests_running == 0 && st.n_requests_waiting == 0);
	fprintf(stderr, "%s mode, caching %d, %u blocks of %u, budget %u, max_num_seqs %u: %u requests (%u refused), "
		"%u aborted, %u steps, %llu preemptions, prefix hits %llu / %llu tokens\n", block_mode ? "block" : "slot",
		caching, fo.n_blocks, fo.block_tokens, budget, max_seqs, n_sub, n_refused, n_aborted, steps,
		(unsigned long long)st.n_preemptions, (unsigned long long)st.prefix_cache_hits_tokens,
		(unsigned long long)st.prefix_cache_queries_tokens);
	g_preemptions += st.n_preemptions;
	g_requests += n_sub;
	if (!cfg) {
		T_CHECK(st.n_preemptions > 0);
		if (caching)
			T_CHECK(st.prefix_cache_hits_tokens > 0);
	}
	for (uint32_t i = 0; i < n_sub; i++)
		h_req_free(reqs[i]);
	free(reqs);
	free(prio);
	h_close(&h);
}

int main(void)
{
	g_rng = h_seed();
	run(1, 250, false, NULL);
	run(0, 150, false, NULL);
	run(1, 150, true, NULL);
	run(0, 100, true, NULL);
	const char *env = getenv("DSV4_STRESS_RUNS");
	uint32_t n_runs = env ? (uint32_t)strtoul(env, NULL, 0) : 12;
	uint64_t pre0 = g_preemptions;
	for (uint32_t k = 0; k < n_runs; k++) {
		/* blocks of 16 or 32 (the layer mix needs multiples of 8 and >= the
		 * window); pools of 16-48 blocks (a request needs at most 15 of 16 or 8 of 32) */
		struct run_cfg cfg = {.block_tokens = rnd(2) ? 16 : 32, .budget = 8 + rnd(89), .max_seqs = 3 + rnd(10)}; /* n <= 3 */
		cfg.n_blocks = cfg.block_tokens == 16 ? 16 + rnd(33) : 8 + rnd(17);
		run((int)rnd(2), 100 + rnd(200), rnd(2), &cfg);
	}
	if (n_runs >= 4)
		T_CHECKF(g_preemptions > pre0, "no preemption in %u random configurations", n_runs);
	fprintf(stderr, "%llu requests in all, %llu preemptions\n", (unsigned long long)g_requests,
		(unsigned long long)g_preemptions);
	return test_exit();
}
