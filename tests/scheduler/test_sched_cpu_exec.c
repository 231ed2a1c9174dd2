/*
 * tests/scheduler/test_sched_cpu_exec.c: the scheduler over the real CPU
 * executor (model/exec_cpu.h, block mode, fp32) on the tiny bf16 checkpoint:
 * the scheduler issue's end-to-end acceptance checks.
 *
 * Eight short prompts (58-91 tokens, several sharing a 64-token prefix =
 * two full 32-token blocks), 8 output tokens each, mostly greedy, two
 * seeded-sampled, all with logprobs and top-5 logprobs. The reference is
 * every request run ALONE with prefix caching off. Then:
 *   prefix:     caching on, one after another: the requests sharing the
 *               prefix must hit 64 cached tokens and return the same tokens
 *               and the same logprob / top-5 logprobs (the last-position
 *               logits, through the sampler's log-softmax) as the cold run;
 *   concurrent: all eight at once, caching on, a 64-token step budget
 *               (chunked prefills mixed with decodes): same tokens, logprobs;
 *   preempt:    all eight at once on a pool of 9 blocks (caching off): at
 *               least one preemption, same tokens and logprobs; again with
 *               caching on and a 48-token budget (readmissions hit the cache).
 * After every step the block invariants must hold; at the end no block
 * is used.
 */
#include <math.h>

#include "model/exec_cpu.h"
#include "scheduler/scheduler.h"
#include "tests/model/fwd_harness.h"
#include "tests/scheduler/sched_harness.h"
#include "tests/test.h"

#define NR 8
#define MT 8
#define NTOP 5
#define BT 32
#define SHARED 64
#define TOL 1e-3

struct tok {
	int32_t id;
	float logprob;
	uint32_t n_top;
	int32_t top_ids[NTOP];
	float top_lp[NTOP];
};

struct col {
	struct tok t[MT];
	uint32_t n;
	int finished, finish;
	uint32_t n_cached;
	uint32_t n_preempt;
};

static void on_ev(void *u, struct sched_event *ev)
{
	struct col *c = u;
	if (ev->kind == SCHED_EV_TOKEN && c->n < MT) {
		struct tok *t = &c->t[c->n++];
		t->id = ev->token_id;
		t->logprob = ev->sample.logprob;
		t->n_top = ev->sample.n_top < NTOP ? ev->sample.n_top : NTOP;
		memcpy(t->top_ids, ev->sample.top_ids, t->n_top * sizeof(int32_t));
		memcpy(t->top_lp, ev->sample.top_logprobs, t->n_top * sizeof(float));
	} else if (ev->kind == SCHED_EV_FINISH) {
		c->finished++;
		c->finish = ev->finish;
		c->n_cached = ev->n_cached_tokens;
		c->n_preempt = ev->timing.n_preemptions;
	}
	sched_event_clear(ev);
}

static int32_t prompts[NR][96];
static uint32_t plen[NR];
static const bool shares[NR] = {false, true, true, false, true, false, false, true};

struct run_cfg {
	const char *name;
	uint32_t n_blocks, budget;
	bool caching, concurrent;
	uint32_t only_mask; /* requests to run (bit r); 0 = all */
};

struct run_out {
	struct col c[NR];
	uint64_t n_preemptions, hits_tokens;
	uint32_t steps;
};

static int run(const struct model_checkpoint *ck, const struct run_cfg *cfg, struct run_out *out)
{
	memset(out, 0, sizeof(*out));
	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = BT, .n_blocks = cfg->n_blocks,
					    .max_step_tokens = 128, .max_step_seqs = NR,
					    .precision = MODEL_PREC_FP32};
	struct model_exec_cpu *x = NULL;
	struct sched *s = NULL;
	struct err e = {0};
	int rc = -1;
	T_CHECKF(model_exec_cpu_create(&x, &xo, &e) == ST_OK, "%s: exec: %s", cfg->name, e.msg);
	if (!x)
		return -1;
	struct sched_options so = {.max_num_seqs = NR, .max_num_batched_tokens = cfg->budget,
				   .disable_prefix_caching = !cfg->caching};
	T_CHECKF(sched_create(&s, &so, model_exec_cpu_exec(x), &e) == ST_OK, "%s: sched: %s", cfg->name, e.msg);
	if (!s)
		goto out;
	for (int r = 0; r < NR; r++) {
		if (cfg->only_mask && !(cfg->only_mask & (1u << r)))
			continue;
		struct sched_request_params p = {.prompt_ids = prompts[r], .n_prompt = plen[r],
						 .sampling = sched_sampling_defaults(), .has_seed = true,
						 .max_tokens = MT, .ignore_eos = true, .on_event = on_ev,
						 .user = &out->c[r]};
		p.sampling.temperature = (r == 3 || r == 6) ? 0.8f : 0.0f;
		p.sampling.seed = 1000 + (uint64_t)r;
		p.sampling.logprobs = true;
		p.sampling.top_logprobs = NTOP;
		enum sched_refusal why;
		if (sched_submit(s, &p, NULL, &why, &e)) {
			T_CHECKF(0, "%s: submit %d: %s", cfg->name, r, e.msg);
			goto out;
		}
		while (sched_has_work(s) && (!cfg->concurrent || r == NR - 1))
			if (!sch_step_checked(s, cfg->name, &out->steps))
				goto out;
	}
	while (sched_has_work(s)) { /* concurrent with only_mask excluding the last request */
		if (sched_step(s, NULL, &e) != ST_OK || sched_check_invariants(s, &e) != ST_OK) {
			T_CHECKF(0, "%s: step %u: %s", cfg->name, out->steps, e.msg);
			goto out;
		}
		out->steps++;
	}
	struct sched_stats st;
	sched_stats_get(s, &st);
	out->n_preemptions = st.n_preemptions;
	out->hits_tokens = st.prefix_cache_hits_tokens;
	T_CHECKF(st.n_blocks_used == 0, "%s: %u blocks still used", cfg->name, st.n_blocks_used);
	rc = 0;
out:
	sched_destroy(s);
	model_exec_cpu_destroy(x);
	return rc;
}

/* Compare request r of got with the reference; returns the largest logprob difference. */
static double compare(const char *name, int r, const struct col *ref, const struct col *got)
{
	T_CHECKF(got->finished == 1 && got->finish == SCHED_FINISH_LENGTH, "%s req %d: finished %d (%s)", name, r,
		 got->finished, sched_finish_reason_str((enum sched_finish_reason)got->finish));
	T_CHECKF(got->n == ref->n && got->n == MT, "%s req %d: %u tokens, reference %u", name, r, got->n, ref->n);
	double worst = 0;
	for (uint32_t i = 0; i < got->n && i < ref->n; i++) {
		const struct tok *a = &ref->t[i], *b = &got->t[i];
		T_CHECKF(a->id == b->id, "%s req %d token %u: %d, reference %d", name, r, i, b->id, a->id);
		if (a->id != b->id)
			break; /* the rest conditions on a different history */
		worst = fmax(worst, fabs((double)a->logprob - b->logprob));
		T_CHECKF(a->n_top == NTOP && b->n_top == NTOP, "%s req %d token %u: %u / %u top logprobs", name, r, i,
			 b->n_top, a->n_top);
		for (uint32_t k = 0; k < a->n_top && k < b->n_top; k++) {
			T_CHECKF(a->top_ids[k] == b->top_ids[k], "%s req %d token %u: top %u is %d, reference %d", name,
				 r, i, k, b->top_ids[k], a->top_ids[k]);
			worst = fmax(worst, fabs((double)a->top_lp[k] - b->top_lp[k]));
		}
	}
	T_CHECKF(worst <= TOL, "%s req %d: logprobs differ by %.3g (tolerance %.g)", name, r, worst, TOL);
	return worst;
}

int main(void)
{
	struct model_checkpoint *ck = NULL;
	int exit_code = fh_open_for_main("bf16", &ck);
	if (exit_code)
		return exit_code;
	uint64_t rng = test_seed();
	static const uint32_t lens[NR] = {91, 86, 88, 58, 90, 60, 62, 87}; /* decodes cross a block boundary */
	for (int r = 0; r < NR; r++) {
		plen[r] = lens[r];
		for (uint32_t i = 0; i < plen[r]; i++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			prompts[r][i] = 100 + (int32_t)((rng >> 33) % 100000);
		}
		if (shares[r])
			memcpy(prompts[r], prompts[0], SHARED * sizeof(int32_t));
	}
	static struct run_out base, got;
	struct run_cfg alone = {"alone", 64, 128, false, false, 0};
	if (run(ck, &alone, &base))
		goto done;
	fprintf(stderr, "alone: %u steps\n", base.steps);
	for (int r = 0; r < NR; r++)
		T_CHECKF(base.c[r].finished == 1 && base.c[r].n == MT, "alone req %d: %u tokens", r, base.c[r].n);

	const struct run_cfg cfgs[] = {
		{"prefix", 64, 128, true, false, 0x97}, /* 0, 1, 2, 4, 7: 0 cold, the rest hit 2 blocks */
		{"concurrent", 64, 64, true, true, 0},
		{"preempt", 9, 128, false, true, 0},
		{"preempt+cache", 9, 48, true, true, 0},
	};
	for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
		const struct run_cfg *cf = &cfgs[c];
		if (run(ck, cf, &got))
			break;
		double worst = 0;
		uint32_t n_hit = 0, n_preempted = 0;
		for (int r = 0; r < NR; r++) {
			if (cf->only_mask && !(cf->only_mask & (1u << r)))
				continue;
			worst = fmax(worst, compare(cf->name, r, &base.c[r], &got.c[r]));
			n_preempted += got.c[r].n_preempt > 0;
			if (!strcmp(cf->name, "prefix") && r > 0) {
				T_CHECKF(got.c[r].n_cached == SHARED, "prefix req %d: %u cached prompt tokens, want %d", r,
					 got.c[r].n_cached, SHARED);
				n_hit += got.c[r].n_cached == SHARED;
			}
		}
		fprintf(stderr, "%s: %u steps, %llu preemptions (%u requests), %llu prefix-hit tokens, max logprob diff %.3g\n",
			cf->name, got.steps, (unsigned long long)got.n_preemptions, n_preempted,
			(unsigned long long)got.hits_tokens, worst);
		if (!strcmp(cf->name, "prefix"))
			T_CHECKF(n_hit == 4, "prefix: %u of 4 requests hit the shared blocks", n_hit);
		if (!strncmp(cf->name, "preempt", 7))
			T_CHECKF(got.n_preemptions > 0 && n_preempted > 0, "%s: no preemption on a %u-block pool", cf->name,
				 cf->n_blocks);
	}
done:
	model_checkpoint_destroy(ck);
	return test_exit();
}
