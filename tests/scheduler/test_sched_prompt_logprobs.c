/*
 * tests/scheduler/test_sched_prompt_logprobs.c: prompt log-probabilities
 * through the scheduler and the real executor (model/exec_cpu.h, fp32) on
 * the tiny bf16 checkpoint, against the forward pass run directly
 * (model_exec_cpu_forward, every row's logits, a double log-softmax here).
 *
 * Prompts of random lengths (fresh ids each run; DSV4_TEST_SEED repeats)
 * run with a small step budget (chunked prefill) and a logits buffer of 8
 * rows (the executor's head chunks), so every path that splits the rows is
 * taken. Checked: one PROMPT_LOGPROBS event per request, before its first
 * token; entries 1..n-1 equal the direct ones to 1e-5 with the same ranks
 * and top-3 ids; a request whose prompt is already in the prefix cache
 * (submitted after a plain request with the same prompt) still gets every
 * entry (n_cached_tokens 0); n = 2 (the parent path) gets them once;
 * score_only finishes LENGTH with no token and no output; a greedy token's
 * logprob equals the log-softmax of the last prompt row; a one-token prompt
 * gets an empty event. DSV4_TEST_DEVICE=cuda (the gpu suite's copy): both
 * executors on the GPU (fh_device), through the CUDA token_logprobs variant.
 */
#include <math.h>
#include <stdlib.h>

#include "model/exec_cpu.h"
#include "scheduler/scheduler.h"
#include "tests/model/fwd_harness.h"
#include "tests/test.h"

#define BT 32
#define NTOP 3
#define MAXP 120
#define TOL 1e-5

struct col {
	int n_plp, n_tok, n_fin, order_bad;
	uint32_t n_prompt;
	float lp[MAXP];
	int32_t rank[MAXP], top[MAXP][NTOP];
	float top_lp[MAXP][NTOP];
	int32_t tok0;
	float tok0_lp;
	int finish;
	uint32_t n_out, n_cached;
};

static void on_ev(void *u, struct sched_event *ev)
{
	struct col *c = u;
	if (ev->kind == SCHED_EV_PROMPT_LOGPROBS) {
		c->n_plp++;
		c->order_bad |= c->n_tok > 0;
		c->n_prompt = ev->n_prompt_tokens;
		for (uint32_t p = 0; p < ev->n_prompt_tokens && p < MAXP; p++) {
			c->lp[p] = ev->prompt_lp->logprob[p];
			c->rank[p] = ev->prompt_lp->rank[p];
			for (uint32_t k = 0; k < NTOP && k < ev->prompt_lp->n_top; k++) {
				c->top[p][k] = ev->prompt_lp->top_ids[(size_t)p * NTOP + k];
				c->top_lp[p][k] = ev->prompt_lp->top_logprobs[(size_t)p * NTOP + k];
			}
		}
	} else if (ev->kind == SCHED_EV_TOKEN) {
		if (!c->n_tok) {
			c->tok0 = ev->token_id;
			c->tok0_lp = ev->sample.logprob;
		}
		c->n_tok++;
	} else if (ev->kind == SCHED_EV_FINISH) {
		c->n_fin++;
		c->finish = ev->finish;
		c->n_out = ev->n_output_tokens;
		c->n_cached = ev->n_cached_tokens;
	}
	sched_event_clear(ev);
}

/* Direct: logits of every prompt row in one forward, then log-softmax,
 * rank and top ids of entry p (row p - 1). */
struct ref {
	float lp[MAXP], last_lp_max;
	int32_t rank[MAXP], top[MAXP][NTOP], argmax_last;
	float top_lp[MAXP][NTOP];
};

static int direct(const struct model_checkpoint *ck, const int32_t *ids, uint32_t n, struct ref *rf)
{
	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = BT, .n_blocks = 16, .max_step_tokens = 128,
					    .max_step_seqs = 8, .precision = MODEL_PREC_FP32, .dev = fh_device()};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	if (model_exec_cpu_create(&x, &xo, &e)) {
		T_CHECKF(0, "exec: %s", e.msg);
		return -1;
	}
	uint32_t V = model_exec_cpu_exec(x)->info.vocab_size;
	float *lg = malloc((size_t)n * V * sizeof(float));
	struct fh_pool pool = {0, 16};
	struct fh_seq s = {.id = 1, .ids = ids, .n_ids = n};
	struct fh_seq *sp = &s;
	enum status st = fh_step(x, &pool, &sp, &n, 1, lg, &e);
	T_CHECKF(st == ST_OK, "direct forward: %s", e.msg);
	for (uint32_t p = 1; st == ST_OK && p <= n; p++) {
		const float *l = lg + (size_t)(p - 1) * V;
		double lse = fh_lse(l, V);
		int32_t top[NTOP];
		for (int k = 0; k < NTOP; k++) {
			int32_t b = -1;
			for (uint32_t v = 0; v < V; v++) {
				bool taken = false;
				for (int j = 0; j < k; j++)
					taken |= top[j] == (int32_t)v;
				if (!taken && (b < 0 || l[v] > l[b]))
					b = (int32_t)v;
			}
			top[k] = b;
		}
		if (p == n) {
			rf->argmax_last = top[0];
			rf->last_lp_max = (float)(l[top[0]] - lse);
			break;
		}
		int32_t t = ids[p], above = 0;
		for (uint32_t v = 0; v < V; v++)
			above += l[v] > l[t];
		rf->lp[p] = (float)(l[t] - lse);
		rf->rank[p] = above + 1;
		memcpy(rf->top[p], top, sizeof top);
		for (int k = 0; k < NTOP; k++)
			rf->top_lp[p][k] = (float)(l[top[k]] - lse);
	}
	free(lg);
	model_exec_cpu_destroy(x);
	return st == ST_OK ? 0 : -1;
}

static void compare(const char *name, const struct col *c, const struct ref *rf, uint32_t n)
{
	T_CHECKF(c->n_plp == 1 && !c->order_bad, "%s: %d prompt-logprob events (order ok %d)", name, c->n_plp,
		 !c->order_bad);
	T_CHECKF(c->n_prompt == n, "%s: event for %u tokens, prompt %u", name, c->n_prompt, n);
	/* On the CPU both paths compute the same floats: ranks and ids match
	 * exactly. On a GPU the batch compositions differ and logits may move
	 * by ~1e-6, so a rank may shift by the tokens within that of the
	 * target, and two top entries closer than TOL may swap. */
	bool gpu = fh_on_gpu();
	double worst = 0;
	for (uint32_t p = 1; p < n && c->n_plp; p++) {
		worst = fmax(worst, fabs((double)c->lp[p] - rf->lp[p]));
		T_CHECKF(c->rank[p] == rf->rank[p] || (gpu && abs(c->rank[p] - rf->rank[p]) <= 8),
			 "%s: entry %u rank %d, direct %d", name, p, c->rank[p], rf->rank[p]);
		for (int k = 0; k < NTOP; k++) {
			worst = fmax(worst, fabs((double)c->top_lp[p][k] - rf->top_lp[p][k]));
			T_CHECKF(c->top[p][k] == rf->top[p][k] || (gpu && fabs((double)c->top_lp[p][k] - rf->top_lp[p][k]) <= TOL),
				 "%s: entry %u top %d: %d, direct %d", name, p, k, c->top[p][k], rf->top[p][k]);
		}
	}
	T_CHECKF(worst <= TOL, "%s: prompt logprobs differ from the direct forward by %.3g", name, worst);
	fprintf(stderr, "%s: %u entries, largest difference %.3g\n", name, n - 1, worst);
}

int main(void)
{
	struct model_checkpoint *ck = NULL;
	int exit_code = fh_open_for_main("bf16", &ck);
	if (exit_code)
		return exit_code;
	enum { NR = 3 };
	static int32_t prompts[NR][MAXP];
	uint32_t plen[NR];
	static struct ref rf[NR];
	uint64_t rng = test_seed();
	for (int r = 0; r < NR; r++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		plen[r] = 70 + (uint32_t)((rng >> 33) % 40); /* over two blocks: the cache and the parent path */
		for (uint32_t i = 0; i < plen[r]; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			prompts[r][i] = 100 + (int32_t)((rng >> 33) % 100000);
		}
		if (direct(ck, prompts[r], plen[r], &rf[r]))
			goto done;
	}

	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = BT, .n_blocks = 40, .max_step_tokens = 64,
					    .max_step_seqs = 8, .precision = MODEL_PREC_FP32, .dev = fh_device()};
	struct model_exec_cpu *x = NULL;
	struct sched *s = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &xo, &e) == ST_OK, "exec: %s", e.msg);
	struct sched_options so = {.max_num_seqs = 8, .max_num_batched_tokens = 48};
	T_CHECKF(x && sched_create(&s, &so, model_exec_cpu_exec(x), &e) == ST_OK, "sched: %s", e.msg);
	if (!s)
		goto out;
	/* 0 warm: request 0's prompt without prompt logprobs fills the cache;
	 * 1: the same prompt with them; 2: prompt 1, n = 2; 3: prompt 2, score
	 * only; 4: a one-token prompt; all but 0 at once */
	static struct col c[6];
	struct sched_request_params base = {.sampling = sched_sampling_defaults(), .has_seed = true, .max_tokens = 2,
					    .ignore_eos = true, .on_event = on_ev};
	base.sampling.temperature = 0.0f;
	base.sampling.logprobs = true;
	struct sched_request_params p[6];
	for (int i = 0; i < 6; i++)
		p[i] = base, p[i].user = &c[i];
	p[0].prompt_ids = prompts[0], p[0].n_prompt = plen[0];
	p[1] = p[0], p[1].user = &c[1], p[1].prompt_logprobs = true, p[1].prompt_top_logprobs = NTOP;
	p[2].prompt_ids = prompts[1], p[2].n_prompt = plen[1], p[2].n = 2, p[2].prompt_logprobs = true;
	p[2].prompt_top_logprobs = NTOP;
	p[3].prompt_ids = prompts[2], p[3].n_prompt = plen[2], p[3].prompt_logprobs = true;
	p[3].prompt_top_logprobs = NTOP, p[3].score_only = true;
	p[4].prompt_ids = prompts[2], p[4].n_prompt = 1, p[4].prompt_logprobs = true;
	for (int i = 0; i < 5; i++) {
		enum sched_refusal why;
		T_CHECKF(sched_submit(s, &p[i], NULL, &why, &e) == ST_OK, "submit %d: %s", i, e.msg);
		while (sched_has_work(s) && i == 0)
			T_CHECKF(sched_step(s, NULL, &e) == ST_OK, "step: %s", e.msg);
	}
	for (int steps = 0; sched_has_work(s) && steps < 1000; steps++) {
		if (sched_step(s, NULL, &e) != ST_OK || sched_check_invariants(s, &e) != ST_OK) {
			T_CHECKF(0, "step %d: %s", steps, e.msg);
			goto out;
		}
	}
	T_CHECK(c[0].n_plp == 0 && c[0].n_tok == 2);
	compare("after a cache fill", &c[1], &rf[0], plen[0]);
	T_CHECKF(c[1].n_cached == 0, "prompt logprobs: %u prompt tokens were served from the cache", c[1].n_cached);
	T_CHECKF((c[1].tok0 == rf[0].argmax_last || fh_on_gpu()) && fabs((double)c[1].tok0_lp - rf[0].last_lp_max) <= TOL,
		 "greedy token %d (%g), direct argmax %d (%g)", c[1].tok0, (double)c[1].tok0_lp, rf[0].argmax_last,
		 (double)rf[0].last_lp_max);
	compare("n = 2", &c[2], &rf[1], plen[1]);
	T_CHECKF(c[2].n_fin == 2 && c[2].n_tok == 4, "n = 2: %d finishes, %d tokens", c[2].n_fin, c[2].n_tok);
	compare("score only", &c[3], &rf[2], plen[2]);
	T_CHECKF(c[3].n_tok == 0 && c[3].n_fin == 1 && c[3].finish == SCHED_FINISH_LENGTH && c[3].n_out == 0,
		 "score only: %d tokens, finish %d, %u output", c[3].n_tok, c[3].finish, c[3].n_out);
	T_CHECKF(c[4].n_plp == 1 && c[4].n_prompt == 1 && c[4].n_tok == 2, "one-token prompt: %d events, %d tokens",
		 c[4].n_plp, c[4].n_tok);
	/* a bad top count is refused */
	p[5].prompt_ids = prompts[0], p[5].n_prompt = 4, p[5].prompt_logprobs = true, p[5].prompt_top_logprobs = 21;
	enum sched_refusal why;
	T_CHECK(sched_submit(s, &p[5], NULL, &why, &e) != ST_OK && why == SCHED_REFUSE_INVALID);
	struct sched_stats st;
	sched_stats_get(s, &st);
	T_CHECKF(st.n_blocks_used == 0, "%u blocks still used", st.n_blocks_used);
out:
	sched_destroy(s);
	model_exec_cpu_destroy(x);
done:
	model_checkpoint_destroy(ck);
	return test_exit();
}
