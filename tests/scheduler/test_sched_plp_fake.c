/*
 * tests/scheduler/test_sched_plp_fake.c: prompt log-probabilities through the
 * scheduler over the fake executor (fake_exec.h), under prefix caching,
 * chunked prefill, n > 1 forks and preemption, in slot mode and block mode.
 *
 * Each round submits random requests (fresh each run; DSV4_TEST_SEED
 * repeats one): prompts drawn from a few shared prefixes (so the cache
 * hits), about half asking for prompt log-probabilities (some score only),
 * n of 1..3, on a pool small enough to preempt. Checked per request: exactly
 * one PROMPT_LOGPROBS event when asked (none otherwise), for choice 0,
 * before any token of the request; every entry 1..n_prompt-1 equals what
 * the fake writes for that prompt position without a scheduler
 * (fake_prompt_entry: a skipped, misplaced or cache-served position shows);
 * the generated tokens equal fake_reference (asking changes nothing);
 * score-only choices finish with LENGTH and no token; the block invariants
 * hold after every step and the pool is empty at the end; requests without
 * prompt log-probabilities did hit the cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_exec.h"
#include "scheduler/scheduler.h"
#include "tests/test.h"

#define NREQ 40
#define MAXP 160
#define MAXOUT 12
#define NTOP 2

struct col {
	int32_t prompt[MAXP];
	uint32_t n_prompt, n, max_tokens;
	bool plp, score_only;
	struct kern_sampling_params sp;
	int n_plp_ev, bad_order, bad_choice;
	uint32_t ev_n_prompt;
	float lp[MAXP];
	int32_t rank[MAXP], top0[MAXP];
	int32_t toks[3][MAXOUT];
	uint32_t n_tok[3];
	int n_fin[3], fin_reason[3];
};

static void on_ev(void *u, struct sched_event *ev)
{
	struct col *c = u;
	uint32_t ch = ev->choice < 3 ? ev->choice : 0;
	if (ev->kind == SCHED_EV_PROMPT_LOGPROBS) {
		c->n_plp_ev++;
		c->bad_choice |= ev->choice != 0;
		for (int i = 0; i < 3; i++)
			c->bad_order |= c->n_tok[i] > 0 || c->n_fin[i] > 0;
		c->ev_n_prompt = ev->n_prompt_tokens;
		for (uint32_t p = 0; p < ev->n_prompt_tokens && p < MAXP && ev->prompt_lp; p++) {
			c->lp[p] = ev->prompt_lp->logprob[p];
			c->rank[p] = ev->prompt_lp->rank[p];
			c->top0[p] = ev->prompt_lp->n_top ? ev->prompt_lp->top_ids[(size_t)p * ev->prompt_lp->n_top] : -1;
		}
	} else if (ev->kind == SCHED_EV_TOKEN) {
		if (c->n_tok[ch] < MAXOUT)
			c->toks[ch][c->n_tok[ch]] = ev->token_id;
		c->n_tok[ch]++;
	} else {
		c->n_fin[ch]++;
		c->fin_reason[ch] = ev->finish;
	}
	sched_event_clear(ev);
}

static uint64_t rng;
static uint32_t rnd(uint32_t n)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((rng >> 33) % n);
}

static void round_run(bool block_mode, uint32_t n_blocks)
{
	struct fake_exec_options fo = {.n_blocks = n_blocks, .block_tokens = 16, .vocab = 256, .max_step_tokens = 64,
				       .max_step_seqs = 16, .max_model_len = 512, .eos_token_id = 1,
				       .eos_bias = -3.0f, .model_seed = rng, .block_mode = block_mode};
	struct fake_exec f;
	T_CHECK(fake_exec_init(&f, &fo) == 0);
	struct sched_options so = {.max_num_seqs = 8, .max_num_batched_tokens = 40};
	struct sched *s = NULL;
	struct err e = {0};
	T_CHECKF(sched_create(&s, &so, &f.ex, &e) == ST_OK, "sched: %s", e.msg);
	if (!s) {
		fake_exec_fini(&f);
		return;
	}
	static int32_t prefixes[3][MAXP];
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < MAXP; i++)
			prefixes[k][i] = 2 + (int32_t)rnd(254);
	static struct col c[NREQ];
	memset(c, 0, sizeof c);
	uint32_t submitted = 0, steps = 0;
	while (submitted < NREQ || sched_has_work(s)) {
		/* a few arrivals per step */
		for (uint32_t a = rnd(3); a > 0 && submitted < NREQ; a--) {
			struct col *q = &c[submitted];
			uint32_t pre = rnd(3), shared = 16 * rnd(6);
			q->n_prompt = 2 + rnd(MAXP - 2);
			if (shared > q->n_prompt)
				shared = q->n_prompt;
			for (uint32_t i = 0; i < q->n_prompt; i++)
				q->prompt[i] = i < shared ? prefixes[pre][i] : 2 + (int32_t)rnd(254);
			q->n = 1 + rnd(3);
			q->plp = rnd(2);
			q->score_only = q->plp && rnd(4) == 0;
			q->max_tokens = 1 + rnd(MAXOUT);
			q->sp = (struct kern_sampling_params){.temperature = rnd(2) ? 0.0f : 0.9f, .top_p = 1.0f,
							      .repetition_penalty = 1.0f, .seed = rng};
			struct sched_request_params p = {.prompt_ids = q->prompt, .n_prompt = q->n_prompt, .sampling = {.temperature = q->sp.temperature, .top_p = 1.0f,
											.repetition_penalty = 1.0f, .seed = rng},
							 .has_seed = true, .max_tokens = q->max_tokens, .n = q->n,
							 .ignore_eos = true, .prompt_logprobs = q->plp,
							 .prompt_top_logprobs = NTOP, .score_only = q->score_only,
							 .on_event = on_ev, .user = q};
			enum sched_refusal why;
			T_CHECKF(sched_submit(s, &p, NULL, &why, &e) == ST_OK, "submit %u: %s", submitted, e.msg);
			submitted++;
		}
		if (sched_step(s, NULL, &e) != ST_OK) {
			T_CHECKF(0, "step %u: %s (%s)", steps, e.msg, f.error);
			break;
		}
		if (sched_check_invariants(s, &e) != ST_OK) {
			T_CHECKF(0, "invariants after step %u: %s", steps, e.msg);
			break;
		}
		if (++steps > 20000) {
			T_CHECK(!"no progress");
			break;
		}
	}
	T_CHECKF(!f.error[0], "fake executor: %s", f.error);
	struct sched_stats st;
	sched_stats_get(s, &st);
	T_CHECKF(st.n_blocks_used == 0, "%u blocks still used", st.n_blocks_used);
	uint32_t n_checked = 0, n_plp = 0;
	for (uint32_t r = 0; r < NREQ; r++) {
		struct col *q = &c[r];
		T_CHECKF(q->n_plp_ev == (q->plp ? 1 : 0) && !q->bad_order && !q->bad_choice,
			 "request %u (prompt logprobs %d): %d events, order ok %d", r, q->plp, q->n_plp_ev, !q->bad_order);
		if (q->plp && q->n_plp_ev == 1) {
			n_plp++;
			T_CHECK(q->ev_n_prompt == q->n_prompt);
			for (uint32_t p = 1; p < q->n_prompt; p++) {
				float lp;
				int32_t rk, t0;
				fake_prompt_entry(&fo, q->prompt, p, &lp, &rk, &t0);
				n_checked++;
				if (lp != q->lp[p] || rk != q->rank[p] || t0 != q->top0[p]) {
					T_CHECKF(0, "request %u entry %u of %u: %g rank %d top %d, want %g rank %d top %d", r, p,
						 q->n_prompt, (double)q->lp[p], q->rank[p], q->top0[p], (double)lp, rk, t0);
					break;
				}
			}
		}
		for (uint32_t i = 0; i < q->n; i++) {
			T_CHECKF(q->n_fin[i] == 1, "request %u choice %u: %d finishes", r, i, q->n_fin[i]);
			if (q->score_only) {
				T_CHECKF(q->n_tok[i] == 0 && q->fin_reason[i] == SCHED_FINISH_LENGTH,
					 "request %u choice %u: score only gave %u tokens", r, i, q->n_tok[i]);
				continue;
			}
			int32_t want[MAXOUT], stop;
			struct kern_sampling_params sp = q->sp;
			sp.seed = sched_choice_seed(q->sp.seed, i);
			uint32_t nw = fake_reference(&fo, q->prompt, q->n_prompt, &sp, q->max_tokens, true, NULL, 0,
						     fo.max_model_len, want, &stop);
			T_CHECKF(q->n_tok[i] == nw && !memcmp(q->toks[i], want, nw * sizeof(int32_t)),
				 "request %u choice %u: %u tokens, reference %u (or different ids)", r, i, q->n_tok[i], nw);
		}
	}
	fprintf(stderr, "%s mode, %u blocks: %u steps, %llu preemptions, %llu cached tokens hit, %u requests with "
			"prompt logprobs (%u entries checked)\n", block_mode ? "block" : "slot", n_blocks, steps,
		(unsigned long long)st.n_preemptions, (unsigned long long)st.prefix_cache_hits_tokens, n_plp, n_checked);
	T_CHECK(n_plp > 0 && n_checked > 0);
	sched_destroy(s);
	fake_exec_fini(&f);
}

int main(void)
{
	const char *env = getenv("DSV4_TEST_SEED");
	rng = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu (DSV4_TEST_SEED to repeat)\n", (unsigned long long)rng);
	round_run(false, 80);
	round_run(true, 80);
	round_run(false, 24); /* preemption */
	round_run(true, 28);
	return test_exit();
}
