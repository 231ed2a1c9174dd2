/*
 * tests/kernels/test_sampling_gpu.c (suite gpu): op "sample"'s CUDA variant
 * (sample_cuda_generic) against kern_sample_ref, row by row, on fresh random
 * logits at vocab 129280 (DeepSeek-V4) and at small vocabularies, over every
 * combination of temperature (greedy included), top_p, top_k, min_p, the
 * penalties (with random prompt / output histories), logit biases (a -inf
 * mask and a repeated id) and logprobs / top_logprobs, with random seeds and
 * counters. Half the batches use bf16-rounded logits, so exact ties are
 * common and the tie rules (lowest id first) are exercised.
 *
 * What must hold (sampling.h lists where the arithmetic may differ):
 *   greedy rows: the same id, always;
 *   sampled rows: the same id on >= 99.9 % of the draws;
 *   logprobs (chosen and top) within 1e-5, top_logprobs ids and counts exact;
 *   bad parameters and ids: ST_INVALID from both; short scratch: ST_NOMEM.
 * The seed is printed (DSV4_TEST_SEED repeats a run). Exits 77 without CUDA
 * or without a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/kernels/gpu_test_util.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

static uint64_t rng;

static kern_sample_batch_fn cuda_run, cuda_run_host;

static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(kern_rand_u64(&rng) % n);
}

/* N(0, sigma) logits (sum of uniforms), bf16-rounded when ties. */
static void fill_logits(float *l, uint32_t V, float sigma, bool ties)
{
	for (uint32_t v = 0; v < V; v++) {
		float s = kern_rand_f32(&rng) + kern_rand_f32(&rng) + kern_rand_f32(&rng);
		l[v] = s * sigma;
		if (ties)
			l[v] = kern_bf16_to_f32(kern_f32_to_bf16(l[v]));
	}
}

struct row_case {
	struct kern_sampling_params p;
	struct kern_logit_bias bias[4];
	int32_t prompt[300], output[200];
	struct kern_sample_history h;
	uint64_t counter;
};

static const float temps[] = {0.0f, 0.7f, 1.0f, 1.6f};
static const float top_ps[] = {1.0f, 0.9f, 0.5f};
static const int32_t top_ks[] = {0, 1, 50};
static const float min_ps[] = {0.0f, 0.05f};
enum { N_T = 4, N_TP = 3, N_TK = 3, N_MP = 2, N_PEN = 4, N_BIAS = 2, N_LP = 3 };
#define N_COMBOS (N_T * N_TP * N_TK * N_MP * N_PEN * N_BIAS * N_LP)

/* Row parameters of combination c (mixed radix over the grid). */
static void make_row(struct row_case *rc, int c, uint32_t V)
{
	memset(rc, 0, sizeof *rc);
	struct kern_sampling_params *p = &rc->p;
	p->temperature = temps[c % N_T];
	c /= N_T;
	p->top_p = top_ps[c % N_TP];
	c /= N_TP;
	p->top_k = top_ks[c % N_TK];
	c /= N_TK;
	p->min_p = min_ps[c % N_MP];
	c /= N_MP;
	int pen = c % N_PEN;
	c /= N_PEN;
	p->repetition_penalty = pen & 1 ? 1.3f : 1.0f;
	p->frequency_penalty = pen & 2 ? 0.5f : 0.0f;
	p->presence_penalty = pen & 2 ? 0.3f : 0.0f;
	if (c % N_BIAS) {
		uint32_t hot = rnd(V);
		rc->bias[0] = (struct kern_logit_bias){(int32_t)hot, 5.0f};
		rc->bias[1] = (struct kern_logit_bias){(int32_t)rnd(V), -INFINITY};
		rc->bias[2] = (struct kern_logit_bias){(int32_t)hot, -2.5f}; /* repeated id: adds in order */
		rc->bias[3] = (struct kern_logit_bias){(int32_t)rnd(V), 1.0f};
		p->logit_bias = rc->bias;
		p->n_logit_bias = 4;
	}
	c /= N_BIAS;
	int lp = c % N_LP;
	p->logprobs = lp > 0;
	p->top_logprobs = lp == 1 ? 5 : (lp == 2 ? KERN_SAMPLE_MAX_TOP_LOGPROBS : 0);
	p->seed = kern_rand_u64(&rng);
	rc->counter = rnd(1000);
	rc->h.n_prompt = 1 + rnd(300);
	rc->h.n_output = rnd(200);
	/* a small hot set, so outputs repeat ids (counts > 1) and overlap the prompt */
	uint32_t hot_n = V < 64 ? V : 64;
	for (size_t i = 0; i < rc->h.n_prompt; i++)
		rc->prompt[i] = (int32_t)(rnd(2) ? rnd(hot_n) : rnd(V));
	for (size_t i = 0; i < rc->h.n_output; i++)
		rc->output[i] = (int32_t)(rnd(2) ? rnd(hot_n) : rnd(V));
	rc->h.prompt_ids = rc->prompt;
	rc->h.output_ids = rc->output;
}

struct tally {
	long greedy, greedy_bad, sampled, sampled_bad, lp_bad, top_bad, st_bad;
};

/* n_rows rows of combos [c0, c0 + n_rows) at vocab V: ref vs CUDA. */
static void run_batch(uint32_t V, int c0, uint32_t n_rows, bool ties, bool host, struct tally *t)
{
	const int64_t ld = V + (V & 1); /* an even row stride past odd vocabularies */
	float *logits = malloc((size_t)n_rows * ld * sizeof(float));
	struct row_case *rc = malloc(n_rows * sizeof *rc);
	struct kern_sampling_params *params = malloc(n_rows * sizeof *params);
	struct kern_sample_history *hist = malloc(n_rows * sizeof *hist);
	uint64_t *counter = malloc(n_rows * sizeof *counter);
	struct kern_sample_out *ref = malloc(n_rows * sizeof *ref), *got = malloc(n_rows * sizeof *got);
	void *work = malloc(kern_sample_workspace_bytes(V));
	for (uint32_t r = 0; r < n_rows; r++) {
		fill_logits(logits + (size_t)r * ld, V, 1.0f + 3.0f * (float)(r % 3), ties);
		for (int64_t k = V; k < ld; k++)
			logits[(size_t)r * ld + k] = NAN; /* padding: never read */
		make_row(&rc[r], (c0 + (int)r) % N_COMBOS, V);
		params[r] = rc[r].p;
		params[r].logit_bias = rc[r].p.n_logit_bias ? rc[r].bias : NULL;
		hist[r] = rc[r].h;
		hist[r].prompt_ids = rc[r].prompt;
		hist[r].output_ids = rc[r].output;
		counter[r] = rc[r].counter;
	}
	enum status st_ref[256];
	for (uint32_t r = 0; r < n_rows; r++)
		st_ref[r] = kern_sample_ref(logits + (size_t)r * ld, V, &params[r], &hist[r], counter[r], work, &ref[r]);
	memset(got, 0x7f, n_rows * sizeof *got);
	struct kern_sample_batch_args a = {.logits = logits, .ld = ld, .vocab = V, .n_rows = n_rows, .params = params,
					   .hist = hist, .counter = counter, .out = got};
	enum status st;
	if (host) {
		st = cuda_run_host(&a);
	} else {
		size_t ws = kern_sample_batch_workspace_bytes(V, n_rows, kern_sample_batch_aux_count(params, hist, n_rows));
		float *dl = NULL;
		void *dw = NULL;
		T_CHECK(cudaMalloc((void **)&dl, (size_t)n_rows * ld * sizeof(float)) == cudaSuccess);
		T_CHECK(cudaMalloc(&dw, ws) == cudaSuccess);
		cudaMemcpy(dl, logits, (size_t)n_rows * ld * sizeof(float), cudaMemcpyHostToDevice);
		cudaMemset(dw, 0xff, ws); /* poisoned scratch */
		a.logits = dl;
		a.work = dw;
		a.work_bytes = ws;
		a.stream = gt_stream;
		st = cuda_run(&a);
		cudaFree(dl);
		cudaFree(dw);
	}
	bool all_ok = true;
	for (uint32_t r = 0; r < n_rows; r++)
		all_ok &= st_ref[r] == ST_OK;
	T_CHECKF(st == (all_ok ? ST_OK : ST_INVALID), "V %u batch at %d: status %d", V, c0, (int)st);
	if (st != ST_OK) {
		t->st_bad++;
	} else {
		for (uint32_t r = 0; r < n_rows; r++) {
			const struct kern_sampling_params *p = &params[r];
			bool greedy = p->temperature == 0.0f, same = ref[r].token_id == got[r].token_id;
			if (greedy) {
				t->greedy++;
				t->greedy_bad += !same;
			} else {
				t->sampled++;
				t->sampled_bad += !same;
			}
			if (!same && (greedy || t->sampled_bad <= 5))
				fprintf(stderr, "V %u combo %d (T %g top_p %g top_k %d min_p %g rep %g freq %g bias %u): ref %d got %d\n",
					V, (c0 + (int)r) % N_COMBOS, p->temperature, p->top_p, p->top_k, p->min_p,
					p->repetition_penalty, p->frequency_penalty, p->n_logit_bias, ref[r].token_id,
					got[r].token_id);
			if (same && !(fabsf(ref[r].logprob - got[r].logprob) <= 1e-5f)) {
				if (t->lp_bad++ < 5)
					fprintf(stderr, "V %u row %u: logprob %.9g vs %.9g\n", V, r, ref[r].logprob,
						got[r].logprob);
			}
			bool top_ok = ref[r].n_top == got[r].n_top;
			for (uint32_t i = 0; top_ok && i < ref[r].n_top; i++)
				top_ok = ref[r].top_ids[i] == got[r].top_ids[i] &&
					 fabsf(ref[r].top_logprobs[i] - got[r].top_logprobs[i]) <= 1e-5f;
			if (!top_ok && t->top_bad++ < 5)
				fprintf(stderr, "V %u row %u: top_logprobs differ (n %u vs %u)\n", V, r, ref[r].n_top,
					got[r].n_top);
		}
	}
	free(logits), free(rc), free(params), free(hist), free(counter), free(ref), free(got), free(work);
}

/* Bad parameters and ids: both refuse. A short scratch: ST_NOMEM. */
static void t_invalid(void)
{
	const uint32_t V = 100;
	float logits[100];
	fill_logits(logits, V, 2.0f, false);
	int32_t bad_id = 100;
	struct kern_logit_bias bias = {100, 1.0f};
	struct kern_sample_history h = {.prompt_ids = &bad_id, .n_prompt = 1};
	struct kern_sampling_params base = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
	struct kern_sampling_params cases[6];
	for (int i = 0; i < 6; i++)
		cases[i] = base;
	cases[0].top_p = 0.0f;
	cases[1].temperature = -1.0f;
	cases[2].min_p = 1.5f;
	cases[3].logit_bias = &bias, cases[3].n_logit_bias = 1;
	cases[4].repetition_penalty = 1.2f; /* with the out-of-range history id */
	cases[5].top_logprobs = KERN_SAMPLE_MAX_TOP_LOGPROBS + 1;
	void *hw = malloc(kern_sample_workspace_bytes(V));
	for (int i = 0; i < 6; i++) {
		struct kern_sample_out o;
		uint64_t ctr = 0;
		T_CHECKF(kern_sample_ref(logits, V, &cases[i], &h, 0, hw, &o) == ST_INVALID, "case %d: ref accepts", i);
		struct kern_sample_batch_args a = {.logits = logits, .ld = V, .vocab = V, .n_rows = 1, .params = &cases[i],
						   .hist = &h, .counter = &ctr, .out = &o};
		T_CHECKF(cuda_run_host(&a) == ST_INVALID, "case %d: CUDA accepts", i);
	}
	free(hw);
	/* scratch one byte short */
	float *dl = NULL;
	void *dw = NULL;
	size_t ws = kern_sample_batch_workspace_bytes(V, 1, 0);
	cudaMalloc((void **)&dl, sizeof logits);
	cudaMalloc(&dw, ws);
	cudaMemcpy(dl, logits, sizeof logits, cudaMemcpyHostToDevice);
	struct kern_sample_out o;
	uint64_t ctr = 3;
	struct kern_sample_batch_args a = {.logits = dl, .ld = V, .vocab = V, .n_rows = 1, .params = &base,
					   .counter = &ctr, .out = &o, .work = dw, .work_bytes = ws - 1, .stream = gt_stream};
	T_CHECK(cuda_run(&a) == ST_NOMEM);
	a.work_bytes = ws;
	T_CHECK(cuda_run(&a) == ST_OK && o.token_id >= 0 && o.token_id < (int32_t)V);
	cudaFree(dl);
	cudaFree(dw);
}

/* All logits equal: greedy and top_k = 1 pick id 0, top_logprobs list ids 0.. */
static void t_flat(void)
{
	const uint32_t V = 4099;
	float *logits = calloc(V, sizeof(float));
	struct kern_sampling_params p[2] = {
		{.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .top_logprobs = 20},
		{.temperature = 0.8f, .top_p = 1.0f, .top_k = 1, .repetition_penalty = 1.0f, .seed = 9},
	};
	uint64_t ctr[2] = {0, 5};
	float *two = malloc(2 * V * sizeof(float));
	memcpy(two, logits, V * sizeof(float));
	memcpy(two + V, logits, V * sizeof(float));
	struct kern_sample_out o[2];
	struct kern_sample_batch_args a = {.logits = two, .ld = V, .vocab = V, .n_rows = 2, .params = p,
					   .counter = ctr, .out = o};
	T_CHECK(cuda_run_host(&a) == ST_OK);
	T_CHECK(o[0].token_id == 0 && o[1].token_id == 0 && o[0].n_top == 20);
	for (uint32_t i = 0; i < o[0].n_top; i++)
		T_CHECK(o[0].top_ids[i] == (int32_t)i && fabsf(o[0].top_logprobs[i] + logf((float)V)) < 1e-5f);
	free(logits);
	free(two);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	struct err e = {0};
	rng = gt_seed(argc, argv, &dev);
	gt_stream_create();

	const struct kern_variant *v = gt_find(&kern_op_sample, "sample_cuda_generic"), *pick = NULL;
	T_CHECK(v && v->run && v->run_host);
	if (!v || !v->run || !v->run_host)
		return test_exit();
	struct kern_problem prob = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
	T_CHECKF(kern_select(&kern_op_sample, &prob, &dev, NULL, -1, &pick, &e) == ST_OK && pick == v, "picked %s",
		 pick ? pick->name : e.msg);
	cuda_run = (kern_sample_batch_fn)v->run;
	cuda_run_host = (kern_sample_batch_fn)v->run_host;

	t_invalid();
	t_flat();

	struct tally t = {0};
	static const uint32_t vocabs[] = {129280, 1000, 37, 5};
	for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
		uint32_t V = vocabs[vi], batch = V > 10000 ? 48 : 200;
		/* every combination at every vocabulary, once with continuous logits and once with bf16 ties */
		for (int ties = 0; ties < 2; ties++)
			for (int c0 = 0; c0 < N_COMBOS; c0 += (int)batch) {
				uint32_t n = N_COMBOS - c0 < (int)batch ? (uint32_t)(N_COMBOS - c0) : batch;
				run_batch(V, c0 + ties * 7, n, ties, c0 == 0 && ties == 0, &t);
			}
	}
	fprintf(stderr, "greedy %ld rows, %ld differ; sampled %ld rows, %ld differ (%.4f %%); logprob off %ld, top off %ld\n",
		t.greedy, t.greedy_bad, t.sampled, t.sampled_bad, 100.0 * (double)t.sampled_bad / (double)(t.sampled ? t.sampled : 1),
		t.lp_bad, t.top_bad);
	T_CHECK(t.st_bad == 0);
	T_CHECK(t.greedy > 0 && t.greedy_bad == 0);
	T_CHECK(t.sampled > 0 && (double)t.sampled_bad <= 0.001 * (double)t.sampled);
	T_CHECK(t.lp_bad == 0 && t.top_bad == 0);
	cudaStreamDestroy(gt_stream);
	return test_exit();
}
#else
int main(void)
{
	return test_skip("built without CUDA");
}
#endif
