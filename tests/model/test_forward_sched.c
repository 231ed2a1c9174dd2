/*
 * tests/model/test_forward_sched.c: the scheduler (scheduler/scheduler.h)
 * driving the CPU executor on the tiny bf16 checkpoint at fp32 precision:
 * the golden prompts submitted together (chunked prefill under a 48-token
 * step budget, decodes mixed with prefill chunks, 32-token blocks), greedy,
 * must continue exactly as transformers' full recomputation (`greedy`, its
 * first 16 tokens; prompts up to 256 tokens); then the same
 * prompts again, now partly served from the prefix cache (complete blocks
 * with their state regions), must give the same tokens.
 */
#include <jansson.h>

#include "scheduler/scheduler.h"
#include "tests/model/fwd_harness.h"
#include "tests/test.h"

#define MAX_OUT 16 /* compared: the first MAX_OUT tokens of the golden continuation */

struct result {
	int32_t ids[MAX_OUT];
	uint32_t n;
	bool finished;
	uint32_t n_cached;
};

static void on_event(void *user, struct sched_event *ev)
{
	struct result *r = user;
	if (ev->kind == SCHED_EV_TOKEN && r->n < MAX_OUT)
		r->ids[r->n++] = ev->token_id;
	if (ev->kind == SCHED_EV_FINISH) {
		r->finished = true;
		r->n_cached = ev->n_cached_tokens;
	}
	sched_event_clear(ev);
}

/* The reference continuation: `greedy` in golden format 2, `greedy_nocache`
 * in format 1 (tests/model/data/golden/README.md). */
static json_t *greedy_of(json_t *p)
{
	json_t *g = json_object_get(p, "greedy_nocache");
	return g ? g : json_object_get(p, "greedy");
}

/* Prompts longer than this stay with test_forward_golden (keeps this one cheap). */
#define MAX_PROMPT_TOKENS 256

int main(void)
{
	if (!fh_tiny_dir())
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	const char *src = getenv("DSV4_SOURCE_ROOT");
	char path[1200];
	snprintf(path, sizeof path, "%s/tests/model/data/golden/golden_bf16.json", src ? src : ".");
	json_error_t je;
	json_t *g = json_load_file(path, 0, &je);
	T_CHECKF(g != NULL, "%s: %s", path, je.text);
	struct model_checkpoint *ck = fh_open("bf16");
	T_CHECK(ck != NULL);
	if (!g || !ck) {
		json_decref(g);
		model_checkpoint_destroy(ck);
		return test_exit();
	}
	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = 32, .n_blocks = 48, .max_step_tokens = 64,
					    .max_step_seqs = 8, .precision = MODEL_PREC_FP32,
					    .dev = fh_device()};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &xo, &e) == ST_OK, "%s", e.msg);
	struct sched *s = NULL;
	struct sched_options so = {.max_num_seqs = 8, .max_num_batched_tokens = 48};
	if (x)
		T_CHECKF(sched_create(&s, &so, model_exec_cpu_exec(x), &e) == ST_OK, "%s", e.msg);
	json_t *ps = json_object_get(g, "prompts");
	size_t np = json_array_size(ps);
	for (int round = 0; s && round < 2; round++) {
		struct result res[8] = {0};
		int32_t *prompts[8] = {0};
		for (size_t i = 0; i < np && i < 8; i++) {
			json_t *p = json_array_get(ps, i);
			json_t *ids = json_object_get(p, "ids");
			size_t n = json_array_size(ids);
			if (n > MAX_PROMPT_TOKENS)
				continue;
			prompts[i] = malloc(n * sizeof(int32_t));
			for (size_t k = 0; k < n; k++)
				prompts[i][k] = (int32_t)json_integer_value(json_array_get(ids, k));
			struct sched_request_params rp = {.prompt_ids = prompts[i], .n_prompt = (uint32_t)n,
							  .sampling = sched_sampling_defaults(), .has_seed = true,
							  .max_tokens = (uint32_t)(json_array_size(greedy_of(p)) < MAX_OUT
										  ? json_array_size(greedy_of(p)) : MAX_OUT),
							  .ignore_eos = true, .on_event = on_event, .user = &res[i]};
			rp.sampling.temperature = 0;
			enum sched_refusal why;
			T_CHECKF(sched_submit(s, &rp, NULL, &why, &e) == ST_OK, "submit: %s", e.msg);
		}
		int steps = 0;
		while (sched_has_work(s) && steps < 2000) {
			uint32_t nt = 0;
			enum status st = sched_step(s, &nt, &e);
			T_CHECKF(st == ST_OK, "step %d: %s", steps, e.msg);
			if (st)
				break;
			steps++;
		}
		T_CHECKF(sched_check_invariants(s, &e) == ST_OK, "%s", e.msg);
		for (size_t i = 0; i < np && i < 8; i++) {
			json_t *p = json_array_get(ps, i);
			if (json_array_size(json_object_get(p, "ids")) > MAX_PROMPT_TOKENS)
				continue;
			json_t *gold = greedy_of(p);
			T_CHECK(json_array_size(gold) > 0);
			size_t n_gold = json_array_size(gold) < MAX_OUT ? json_array_size(gold) : MAX_OUT;
			bool same = res[i].finished && res[i].n == n_gold;
			for (uint32_t k = 0; same && k < res[i].n; k++)
				same = res[i].ids[k] == json_integer_value(json_array_get(gold, k));
			fprintf(stderr, "round %d %s: %u tokens, %u prompt tokens from the prefix cache, %s golden greedy\n",
				round, json_string_value(json_object_get(p, "name")), res[i].n, res[i].n_cached,
				same ? "==" : "!=");
			T_CHECKF(same, "round %d prompt %zu", round, i);
			free(prompts[i]);
		}
		fprintf(stderr, "round %d: %d steps\n", round, steps);
	}
	sched_destroy(s);
	model_exec_cpu_destroy(x);
	model_checkpoint_destroy(ck);
	json_decref(g);
	return test_exit();
}
