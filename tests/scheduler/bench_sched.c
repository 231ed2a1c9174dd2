/*
 * tests/scheduler/bench_sched.c: the scheduler's own CPU time per step
 * (planning, building the exec_step, processing samples, stop handling,
 * events, stats) over the fake executor, whose time is measured separately
 * and subtracted: the executor vtable is wrapped by a timer.
 *
 * Scenarios (block size 256, detokenizer and a never-matching stop string
 * on every request, prefix caching on):
 *   decode256:   256 sequences decoding (256 tokens per step);
 *   waiting4096: 256 sequences (max_num_seqs) decoding 100-400 tokens each,
 *                4,096 requests waiting behind them (topped up before every
 *                step, outside the timing): finished sequences are replaced
 *                by admissions from the queue head, their prefills chunked;
 *   mixed:       256 decoding plus a stream of new requests whose prefills
 *                are chunked into an 8,192-token budget.
 * Prints median / p99 / mean per step in microseconds against the goal
 * (2 % of a 20 ms decode step = 400 us), as thread CPU time. Run from a
 * release build: scripts/bench_sched [STEPS [SCENARIO]]. Not a unit test
 * (suite 'bench').
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_exec.h"
#include "scheduler/scheduler.h"

/* This thread's CPU time: descheduling by other processes on a shared
 * machine does not count. */
static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The fake executor behind a timer. */
struct timed_exec {
	struct exec ex;
	struct exec *inner;
	double ns;
};

static enum status timed_step(void *ctx, const struct exec_step *st, struct exec_sample *out, struct err *e)
{
	struct timed_exec *t = ctx;
	double t0 = now_ns();
	enum status rc = t->inner->ops->step(t->inner->ctx, st, out, e);
	t->ns += now_ns() - t0;
	return rc;
}

static void timed_release(void *ctx, uint64_t seq_id)
{
	struct timed_exec *t = ctx;
	double t0 = now_ns();
	if (t->inner->ops->seq_release)
		t->inner->ops->seq_release(t->inner->ctx, seq_id);
	t->ns += now_ns() - t0;
}

static const struct exec_ops timed_ops = {.step = timed_step, .seq_release = timed_release};

static uint64_t g_tokens;

static void on_event(void *user, struct sched_event *ev)
{
	(void)user;
	g_tokens += ev->kind == SCHED_EV_TOKEN;
	sched_event_clear(ev);
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((g_rng >> 33) % n);
}

static const char *const stop_strs[] = {"zzzz"};

static int submit(struct sched *s, uint32_t n_prompt, uint32_t max_tokens, const int32_t *prefix, uint32_t n_prefix)
{
	int32_t *p = malloc(n_prompt * sizeof(int32_t));
	for (uint32_t i = 0; i < n_prompt; i++)
		p[i] = i < n_prefix ? prefix[i] : 2 + (int32_t)rnd(250);
	struct sched_request_params rp = {.prompt_ids = p, .n_prompt = n_prompt, .sampling = sched_sampling_defaults(),
					  .has_seed = true, .max_tokens = max_tokens, .ignore_eos = true,
					  .stop_strings = stop_strs, .n_stop_strings = 1, .on_event = on_event};
	rp.sampling.seed = rnd(1u << 30);
	rp.sampling.temperature = 0.0f; /* greedy: keeps the fake executor's time down */
	enum sched_refusal why;
	struct err e = {0};
	enum status st = sched_submit(s, &rp, NULL, &why, &e);
	free(p);
	if (st)
		fprintf(stderr, "submit: %s\n", e.msg);
	return st ? -1 : 0;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

enum scenario { DECODE256, WAITING4096, MIXED };
static const char *const scenario_name[] = {"decode256", "waiting4096", "mixed"};

static int bench(enum scenario sc, uint32_t n_steps)
{
	const uint32_t B = 256, n_run = 256, prompt = 200, warm = 1;
	/* running sequences end at prompt + decode steps, in ceil(.. / B) blocks */
	uint32_t run_blocks = (prompt + n_steps + 64 + B - 1) / B;
	struct fake_exec_options fo = {.n_blocks = n_run * run_blocks + 8, .block_tokens = B, .vocab = 256,
				       .max_step_tokens = 8192, .max_step_seqs = 512, .max_model_len = 65536,
				       .eos_token_id = 1, .eos_bias = -3.0f, .model_seed = 7, .block_mode = false,
				       .n_state_slots = 512};
	if (sc == MIXED)
		fo.n_blocks += 4096; /* room for the arrivals */
	if (sc == WAITING4096)
		fo.n_blocks = n_run * ((prompt + 400 + B - 1) / B) + 64;
	struct fake_exec f;
	if (fake_exec_init(&f, &fo)) {
		fprintf(stderr, "fake_exec_init failed\n");
		return -1;
	}
	struct timed_exec tx = {.ex = f.ex, .inner = &f.ex};
	tx.ex.ops = &timed_ops;
	tx.ex.ctx = &tx;
	struct sched_options so = {.max_num_seqs = sc == MIXED ? 512 : 256, .max_num_batched_tokens = 8192,
				   .max_queued_requests = 8192, .detokenize = fake_detok};
	struct sched *s = NULL;
	struct err e = {0};
	if (sched_create(&s, &so, &tx.ex, &e)) {
		fprintf(stderr, "sched_create: %s\n", e.msg);
		fake_exec_fini(&f);
		return -1;
	}
	int32_t prefix[512];
	for (int i = 0; i < 512; i++)
		prefix[i] = 2 + (int32_t)rnd(250);
	for (uint32_t i = 0; i < n_run; i++)
		if (submit(s, prompt, sc == WAITING4096 ? 100 + rnd(300) : n_steps + 64, prefix, i % 2 ? 128 : 0))
			return -1;
	/* warm up until every sequence decodes */
	struct sched_stats st;
	for (int k = 0; k < 64; k++) {
		if (sched_step(s, NULL, &e)) {
			fprintf(stderr, "step: %s\n", e.msg);
			return -1;
		}
		sched_stats_get(s, &st);
		if (st.n_seqs_running == n_run && st.last_step_tokens == n_run && k > (int)warm)
			break;
	}
	double *t = malloc(n_steps * sizeof(double));
	uint64_t tok = 0, tok0 = g_tokens;
	double exec_total = 0;
	for (uint32_t k = 0; k < n_steps; k++) {
		if (sc == WAITING4096) { /* keep 4,096 waiting */
			sched_stats_get(s, &st);
			for (uint32_t i = st.n_requests_waiting; i < 4096; i++)
				if (submit(s, prompt, 100 + rnd(300), prefix, rnd(2) ? 128 : 0))
					return -1;
		}
		if (sc == MIXED && k % 4 == 0) /* a new 1,000-2,000-token request every 4th step, 32 output tokens */
			(void)submit(s, 1000 + rnd(1000), 32, prefix, rnd(2) ? 512 : 0);
		tx.ns = 0;
		double t0 = now_ns();
		uint32_t nt = 0;
		if (sched_step(s, &nt, &e)) {
			fprintf(stderr, "step: %s\n", e.msg);
			return -1;
		}
		double dt = now_ns() - t0;
		t[k] = (dt - tx.ns) / 1e3;
		exec_total += tx.ns / 1e3;
		tok += nt;
	}
	sched_stats_get(s, &st);
	qsort(t, n_steps, sizeof(double), cmp_d);
	double sum = 0;
	for (uint32_t k = 0; k < n_steps; k++)
		sum += t[k];
	printf("| %-11s | %5u | %8.1f | %7u | %7u | %6.1f | %6.1f | %6.1f | %6.1f | %9.1f |\n", scenario_name[sc],
	       n_steps, (double)tok / n_steps, st.n_seqs_running, st.n_requests_waiting, t[n_steps / 2],
	       t[(size_t)(n_steps * 0.99)], sum / n_steps, t[n_steps - 1], exec_total / n_steps);
	fflush(stdout);
	if (f.error[0])
		fprintf(stderr, "fake executor: %s\n", f.error);
	(void)tok0;
	free(t);
	sched_destroy(s);
	fake_exec_fini(&f);
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t n_steps = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 0) : 2000;
	if (!n_steps)
		n_steps = 2000;
	const char *only = argc > 2 ? argv[2] : NULL; /* one scenario by name */
	printf("scheduler CPU time per step, microseconds, fake executor time excluded (goal: < 400 us = 2 %% of 20 ms)\n\n");
	printf("| scenario    | steps | tok/step | running | waiting | median | p99    | mean   | max    | exec/step |\n");
	printf("|-------------|-------|----------|---------|---------|--------|--------|--------|--------|-----------|\n");
	int rc = 0;
	for (int sc = DECODE256; sc <= MIXED; sc++)
		if (!only || !strcmp(only, scenario_name[sc]))
			rc |= bench((enum scenario)sc, n_steps);
	return rc ? 1 : 0;
}
