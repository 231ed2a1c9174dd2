/*
 * tests/scheduler/manual_cpu_exec.c: a MANUAL check, not registered with
 * meson: the scheduler over the real CPU executor (model/exec_cpu.h, block
 * mode) on a tiny checkpoint. Five requests (some sharing a prefix; greedy
 * and seeded sampling) run once one after another with caching off and a
 * large budget; then under other configurations (prefix caching, tiny step
 * budgets, a cache small enough to preempt, n = 2). Every configuration must
 * give the same tokens. Takes about a minute under ASan.
 *
 *   gcc -std=c17 -D_GNU_SOURCE -O2 -I. -I<build> tests/scheduler/manual_cpu_exec.c \
 *       <build>/scheduler/libdsv4_sched.a <build>/model/libdsv4_model.a \
 *       <build>/kernels/libdsv4_kernels.a <build>/comm/libdsv4_comm.a \
 *       <build>/common/libdsv4_common.a -ljansson -lpcre2-8 -lm -pthread
 *   ./a.out /path/to/tiny-bf16
 *
 * Result on 2026-12-02 (tiny-bf16, fp32 precision): all configurations
 * identical, including one with 2 preemptions and one with 256 prefix-hit tokens.
 *
 * The registered, faster subset (short prompts, logprobs compared too) is
 * tests/scheduler/test_sched_cpu_exec.c (meson test sched_cpu_exec); this
 * file additionally covers n = 2 and a 7-token step budget.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/checkpoint.h"
#include "model/exec_cpu.h"
#include "scheduler/scheduler.h"

#define NR 5
#define MT 60
struct col { int32_t t[4][64]; uint32_t n[4]; int fin[4]; };
static void on_ev(void *u, struct sched_event *ev) {
	struct col *c = u;
	if (ev->kind == SCHED_EV_TOKEN) c->t[ev->choice][c->n[ev->choice]++] = ev->token_id;
	else c->fin[ev->choice] = ev->finish;
	sched_event_clear(ev);
}
static int32_t prompts[NR][200]; static uint32_t plen[NR];

static int run(const struct model_checkpoint *ck, uint32_t B, uint32_t nblocks, uint32_t budget, int caching,
	       int concurrent, uint32_t nchoice, struct col *out, uint64_t *preempt, uint64_t *hits) {
	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = B, .n_blocks = nblocks, .max_step_tokens = 512,
					    .max_step_seqs = 16, .precision = MODEL_PREC_FP32};
	struct model_exec_cpu *x; struct err e = {0};
	if (model_exec_cpu_create(&x, &xo, &e)) { fprintf(stderr, "exec: %s\n", e.msg); return -1; }
	struct sched_options so = {.max_num_batched_tokens = budget, .disable_prefix_caching = !caching};
	struct sched *s;
	if (sched_create(&s, &so, model_exec_cpu_exec(x), &e)) { fprintf(stderr, "sched: %s\n", e.msg); return -1; }
	memset(out, 0, NR * sizeof(*out));
	for (int r = 0; r < NR; r++) {
		struct sched_request_params p = {.prompt_ids = prompts[r], .n_prompt = plen[r],
			.sampling = sched_sampling_defaults(), .has_seed = true, .max_tokens = MT, .ignore_eos = true,
			.n = nchoice, .on_event = on_ev, .user = &out[r]};
		p.sampling.temperature = r % 2 ? 0.8f : 0.0f; p.sampling.seed = 1000 + r;
		enum sched_refusal why;
		if (sched_submit(s, &p, NULL, &why, &e)) { fprintf(stderr, "submit: %s\n", e.msg); return -1; }
		if (!concurrent)
			while (sched_has_work(s)) if (sched_step(s, NULL, &e)) { fprintf(stderr, "step: %s\n", e.msg); return -1; }
	}
	while (sched_has_work(s)) {
		if (sched_step(s, NULL, &e)) { fprintf(stderr, "step: %s\n", e.msg); return -1; }
		if (sched_check_invariants(s, &e)) { fprintf(stderr, "inv: %s\n", e.msg); return -1; }
	}
	struct sched_stats st; sched_stats_get(s, &st);
	*preempt = st.n_preemptions; *hits = st.prefix_cache_hits_tokens;
	sched_destroy(s); model_exec_cpu_destroy(x);
	return 0;
}

int main(int argc, char **argv) {
	struct model_checkpoint_options co = {.dir = argc > 1 ? argv[1] : "/tmp/ck-tiny/tiny-bf16"};
	struct model_checkpoint *ck; struct err e = {0};
	if (model_checkpoint_create(&ck, &co, &e)) { fprintf(stderr, "ckpt: %s\n", e.msg); return 1; }
	uint64_t rng = 12345;
	for (int r = 0; r < NR; r++) {
		plen[r] = 40 + 30 * r;
		for (uint32_t i = 0; i < plen[r]; i++) { rng = rng * 6364136223846793005ull + 1; prompts[r][i] = 10 + (int32_t)((rng >> 33) % 5000); }
		if (r >= 2) memcpy(prompts[r], prompts[0], 40 * sizeof(int32_t)); /* shared prefix */
	}
	static struct col base[NR], got[NR];
	uint64_t pre, hits;
	if (run(ck, 32, 64, 512, 0, 0, 1, base, &pre, &hits)) return 1;
	struct { uint32_t B, nb, budget; int caching, conc; uint32_t n; } cfg[] = {
		{32, 64, 512, 1, 0, 1}, {32, 64, 24, 1, 1, 1}, {32, 64, 7, 0, 1, 1}, {32, 8, 64, 1, 1, 1},
		{32, 8, 64, 0, 1, 1}, {32, 64, 100, 1, 1, 2}, {64, 40, 50, 1, 1, 1}};
	int bad = 0;
	for (unsigned c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		if (run(ck, cfg[c].B, cfg[c].nb, cfg[c].budget, cfg[c].caching, cfg[c].conc, cfg[c].n, got, &pre, &hits)) return 1;
		int diff = 0;
		for (int r = 0; r < NR; r++)
			if (got[r].n[0] != base[r].n[0] || memcmp(got[r].t[0], base[r].t[0], base[r].n[0] * 4)) {
				uint32_t i = 0; while (i < base[r].n[0] && got[r].t[0][i] == base[r].t[0][i]) i++;
				fprintf(stderr, "  cfg %u req %d: differs at token %u (%s)\n", c, r, i, r % 2 ? "sampled" : "greedy");
				diff++;
			}
		printf("cfg %u (B %u, blocks %u, budget %u, caching %d, concurrent %d, n %u): %d of %d requests differ; "
		       "preemptions %llu, prefix hits %llu\n", c, cfg[c].B, cfg[c].nb, cfg[c].budget, cfg[c].caching, cfg[c].conc,
		       cfg[c].n, diff, NR, (unsigned long long)pre, (unsigned long long)hits);
		bad += diff;
	}
	model_checkpoint_destroy(ck);
	return bad != 0;
}
