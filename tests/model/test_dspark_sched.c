/*
 * tests/model/test_dspark_sched.c: DSpark speculation through the scheduler
 * on the CPU executor and the tiny 0731 FP8 checkpoint (reference
 * precision, blocks of 32 tokens, ring 32; model/dspark.h).
 *
 * Eight greedy requests (prompts of 40-70 tokens, four sharing a 64-token
 * prefix), 24 tokens each; the reference is the plain executor, all eight
 * at once. With DSpark speculation the tokens and output counts must be
 * identical:
 *   own:     the drafter's own drafts, K = 5, all eight at once;
 *   truth:   a hook replaces the drafts by the reference continuation with
 *            random corruptions (accepted runs cross block boundaries and
 *            windows), K = 3, all eight at once;
 *   prefix:  K = 5 with the drafter's drafts, caching on, one request after
 *            another: the sharing requests hit the cache (the drafter takes
 *            its rings from the hit block);
 *   preempt: K = 4, truth drafts, a pool of 5 blocks: preemptions.
 * Block invariants hold after every step; at the end no block is used.
 */
#include "model/exec_cpu.h"
#include "model/spec.h"
#include "scheduler/scheduler.h"
#include "tests/model/fwd_harness.h"
#include "tests/scheduler/sched_harness.h"
#include "tests/test.h"

#define NR 8
#define MT 24
#define BT 32

struct col {
	int32_t t[MT + 8];
	uint32_t n, n_out;
	int finished;
};

static void on_ev(void *u, struct sched_event *ev)
{
	struct col *c = u;
	if (ev->kind == SCHED_EV_TOKEN && c->n < MT + 8)
		c->t[c->n++] = ev->token_id;
	else if (ev->kind == SCHED_EV_FINISH) {
		c->finished++;
		c->n_out = ev->n_output_tokens;
	}
	sched_event_clear(ev);
}

static int32_t prompts[NR][80];
static uint32_t n_prompt[NR];
static struct col ref[NR];
static uint64_t g_seed;

static void truth_hook(void *ctx, const struct exec_seq *sq, uint32_t n_new, int32_t *d, uint32_t n)
{
	(void)ctx;
	for (int r = 0; r < NR; r++) {
		if (sq->n_prompt != n_prompt[r] || memcmp(sq->prompt_ids, prompts[r], n_prompt[r] * sizeof(int32_t)))
			continue;
		uint32_t at = sq->n_output + n_new;
		for (uint32_t i = 0; i < n && at + i < MT; i++) {
			d[i] = ref[r].t[at + i];
			if (kern_sample_uniform(g_seed, ((uint64_t)r << 32) + (at + i) * 8 + n) < 0.25)
				d[i] = (d[i] + 1) % 1000;
		}
		return;
	}
}

struct run_cfg {
	const char *name;
	uint32_t K;
	bool truth, caching, sequential;
	uint32_t n_blocks;
};

static int run(const struct model_checkpoint *ck, const struct run_cfg *cfg, struct col *out, struct sched_stats *st)
{
	memset(out, 0, NR * sizeof *out);
	struct model_exec_cpu *x = NULL;
	struct model_spec_exec *sx = NULL;
	struct sched *s = NULL;
	struct err e = {0};
	int rc = -1;
	uint32_t steps = 0;
	struct exec *ex = sch_spec_stack(ck, BT, cfg->n_blocks, NR, (struct spec_config){MODEL_DRAFT_DSPARK, cfg->K},
					 cfg->truth ? truth_hook : NULL, cfg->name, &x, &sx);
	if (!ex)
		goto out;
	struct sched_options so = {.max_num_seqs = NR, .max_num_batched_tokens = 128,
				   .disable_prefix_caching = !cfg->caching};
	T_CHECKF(sched_create(&s, &so, ex, &e) == ST_OK, "%s: sched: %s", cfg->name, e.msg);
	if (!s)
		goto out;
	for (int r = 0; r < NR; r++) {
		struct sched_request_params p = {.prompt_ids = prompts[r], .n_prompt = n_prompt[r],
						 .sampling = sched_sampling_defaults(), .max_tokens = MT,
						 .ignore_eos = true, .on_event = on_ev, .user = &out[r]};
		p.sampling.temperature = 0.0f;
		enum sched_refusal why;
		if (sched_submit(s, &p, NULL, &why, &e)) {
			T_CHECKF(0, "%s: submit %d: %s", cfg->name, r, e.msg);
			goto out;
		}
		bool drain = cfg->sequential || r == NR - 1;
		while (drain && sched_has_work(s))
			if (!sch_step_checked(s, cfg->name, &steps))
				goto out;
	}
	sched_stats_get(s, st);
	fprintf(stderr, "%s: %u steps; drafts %llu, draft tokens %llu, accepted %llu, prefix hits %llu tokens, "
			"preemptions %llu\n", cfg->name, steps, (unsigned long long)st->spec_num_drafts,
		(unsigned long long)st->spec_num_draft_tokens, (unsigned long long)st->spec_num_accepted_tokens,
		(unsigned long long)st->prefix_cache_hits_tokens, (unsigned long long)st->n_preemptions);
	T_CHECKF(st->n_blocks_used == 0, "%s: %u blocks still used", cfg->name, st->n_blocks_used);
	rc = 0;
out:
	sched_destroy(s);
	model_spec_exec_destroy(sx);
	model_exec_cpu_destroy(x);
	return rc;
}

static void same(const char *name, const struct col *a)
{
	int bad = 0;
	for (int r = 0; r < NR; r++) {
		bool ok = a[r].finished == 1 && a[r].n == ref[r].n && a[r].n_out == ref[r].n_out &&
			  !memcmp(a[r].t, ref[r].t, a[r].n * sizeof(int32_t));
		if (!ok && bad++ < 3)
			fprintf(stderr, "%s: request %d: %u tokens vs reference %u\n", name, r, a[r].n, ref[r].n);
	}
	T_CHECKF(bad == 0, "%s: %d requests differ from the plain run", name, bad);
}

int main(void)
{
	struct model_checkpoint *ck = fh_open_0731("fp8");
	if (!ck) {
		fprintf(stderr, "no tiny 0731 checkpoint\n");
		return 1;
	}
	srand((unsigned)test_seed());
	g_seed = (uint64_t)rand();
	int32_t shared[64];
	for (int i = 0; i < 64; i++)
		shared[i] = 3 + rand() % 100000;
	for (int r = 0; r < NR; r++) {
		bool sh = r % 2 == 1;
		n_prompt[r] = sh ? 66 + (uint32_t)r : 40 + (uint32_t)r * 4;
		for (uint32_t i = 0; i < n_prompt[r]; i++)
			prompts[r][i] = sh && i < 64 ? shared[i] : 3 + rand() % 100000;
	}
	struct sched_stats st;
	struct run_cfg rc = {.name = "plain", .n_blocks = 40};
	if (run(ck, &rc, ref, &st))
		goto done;
	for (int r = 0; r < NR; r++)
		T_CHECK(ref[r].n == MT);
	static struct col got[NR];
	const struct run_cfg runs[] = {
		{.name = "own K=5", .K = 5, .n_blocks = 40},
		{.name = "truth K=3", .K = 3, .truth = true, .n_blocks = 40, .caching = true},
		{.name = "prefix K=5", .K = 5, .n_blocks = 40, .caching = true, .sequential = true},
		{.name = "preempt K=4", .K = 4, .truth = true, .n_blocks = 5},
	};
	for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
		if (run(ck, &runs[i], got, &st))
			break;
		same(runs[i].name, got);
		T_CHECK(st.spec_num_drafts > 0 && st.spec_num_accepted_tokens <= st.spec_num_draft_tokens);
		/* truth_hook corrupts each draft token with probability 1/4, independently:
		 * the accepted tokens are at least Binomial(drafts, 3/4) (the first tokens) */
		uint32_t lo = test_binom_lower((uint32_t)st.spec_num_drafts, 0.75, 1e-7);
		if (runs[i].truth)
			T_CHECKF(st.spec_num_accepted_tokens >= lo, "%s: %llu accepted of %llu drafts, under %u", runs[i].name,
				 (unsigned long long)st.spec_num_accepted_tokens, (unsigned long long)st.spec_num_drafts, lo);
		if (runs[i].sequential)
			T_CHECKF(st.prefix_cache_hits_tokens >= 3 * 64, "%s: prefix hits %llu tokens", runs[i].name,
				 (unsigned long long)st.prefix_cache_hits_tokens);
		if (runs[i].n_blocks == 5)
			T_CHECKF(st.n_preemptions > 0, "%s: no preemption", runs[i].name);
	}
done:
	model_checkpoint_destroy(ck);
	return test_exit();
}
