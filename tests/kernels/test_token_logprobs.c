/*
 * tests/kernels/test_token_logprobs.c: op "token_logprobs" (prompt
 * log-probabilities). The CPU reference against kern_sample_ref on the same
 * rows (bit-identical top logprobs, and the target's logprob where the
 * target is the greedy pick), against a naive double log-softmax and rank
 * (ties share a rank: logits drawn from a coarse grid so ties happen),
 * padded rows, target -1, n_top 0 and bad arguments. With a CUDA build and
 * a visible GPU the same rows go through token_logprobs_cuda_generic
 * (run_host) and must agree to 1e-6 with identical ids and ranks; the real
 * vocabulary (129280) is swept there too. DSV4_TEST_DEVICE=cuda (the gpu
 * suite's copy) without a GPU exits 77.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/registry/registry.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static void check_rows(kern_token_logprobs_fn fn, const char *who, uint32_t R, uint32_t V, uint32_t LD,
		       uint32_t N, bool grid)
{
	float *lg = xcalloc((size_t)R * LD, sizeof(float));
	for (size_t i = 0; i < (size_t)R * LD; i++)
		lg[i] = grid ? (float)mt_int(-8, 8) * 0.5f : mt_unif(-6, 6);
	int32_t *tg = xcalloc(R, sizeof(int32_t)), *rank = xcalloc(R, sizeof(int32_t));
	int32_t *ti = xcalloc((size_t)R * N + 1, sizeof(int32_t));
	float *lp = xcalloc(R, sizeof(float)), *tl = xcalloc((size_t)R * N + 1, sizeof(float));
	for (uint32_t r = 0; r < R; r++)
		tg[r] = r % 7 == 3 ? -1 : mt_int(0, (int)V - 1);
	struct kern_token_logprobs_args a = {.logits = lg, .ld = LD, .vocab = V, .n_rows = R, .target = tg, .n_top = N,
					     .logprob = lp, .rank = rank, .top_ids = N ? ti : NULL,
					     .top_logprobs = N ? tl : NULL};
	T_CHECKF(fn(&a) == ST_OK, "%s: R %u V %u N %u", who, R, V, N);
	void *work = xcalloc(1, kern_sample_workspace_bytes(V));
	for (uint32_t r = 0; r < R; r++) {
		const float *x = lg + (size_t)r * LD;
		double mx = -INFINITY, s = 0;
		for (uint32_t v = 0; v < V; v++)
			mx = fmax(mx, x[v]);
		for (uint32_t v = 0; v < V; v++)
			s += exp(x[v] - mx);
		double lse = mx + log(s);
		if (tg[r] < 0) {
			T_CHECK(lp[r] == 0.0f && rank[r] == 0);
		} else {
			int32_t above = 0;
			for (uint32_t v = 0; v < V; v++)
				above += x[v] > x[tg[r]];
			T_CLOSE(lp[r], x[tg[r]] - lse, 1e-6, 1e-6);
			T_CHECKF(rank[r] == above + 1, "%s row %u: rank %d, want %d", who, r, rank[r], above + 1);
		}
		/* the sampler's raw logprobs on the same row */
		struct kern_sampling_params p = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .logprobs = true,
						 .top_logprobs = N};
		struct kern_sample_out so;
		T_CHECK(kern_sample_ref(x, V, &p, NULL, 0, work, &so) == ST_OK);
		uint32_t k = N < V ? N : V;
		T_CHECK(so.n_top == k);
		for (uint32_t i = 0; i < k; i++) {
			T_CHECKF(ti[(size_t)r * N + i] == so.top_ids[i], "%s row %u top %u: id %d, sampler %d", who, r, i,
				 ti[(size_t)r * N + i], so.top_ids[i]);
			T_CLOSE(tl[(size_t)r * N + i], so.top_logprobs[i], 1e-6, 1e-6);
		}
		if (tg[r] == so.token_id)
			T_CLOSE(lp[r], so.logprob, 1e-6, 1e-6);
	}
	free(work);
	free(lg);
	free(tg);
	free(rank);
	free(ti);
	free(lp);
	free(tl);
}

int main(void)
{
	mt_seed_from_env("test_token_logprobs");
	check_rows(kern_token_logprobs_ref, "ref", 9, 300, 311, 5, false);
	check_rows(kern_token_logprobs_ref, "ref", 9, 300, 300, 20, true);
	check_rows(kern_token_logprobs_ref, "ref", 4, 37, 40, 0, true);
	check_rows(kern_token_logprobs_ref, "ref", 3, 5, 5, 5, true);
	/* the greedy pick as the target: same logprob as the sampler */
	{
		float x[50];
		mt_fill(x, 50, -3, 3);
		int32_t t = 0;
		for (int v = 1; v < 50; v++)
			if (x[v] > x[t])
				t = v;
		float lp;
		int32_t rk, id;
		float tl;
		struct kern_token_logprobs_args a = {.logits = x, .ld = 50, .vocab = 50, .n_rows = 1, .target = &t,
						     .n_top = 1, .logprob = &lp, .rank = &rk, .top_ids = &id,
						     .top_logprobs = &tl};
		T_CHECK(kern_token_logprobs_ref(&a) == ST_OK && rk == 1 && id == t && lp == tl);
		int32_t bad = 50;
		a.target = &bad;
		T_CHECK(kern_token_logprobs_ref(&a) == ST_INVALID);
		a.target = &t;
		a.n_top = KERN_SAMPLE_MAX_TOP_LOGPROBS + 1;
		T_CHECK(kern_token_logprobs_ref(&a) == ST_INVALID);
		a.n_top = 1;
		a.ld = 49;
		T_CHECK(kern_token_logprobs_ref(&a) == ST_INVALID);
		T_CHECK(kern_token_logprobs_ref(NULL) == ST_INVALID);
	}
	T_CHECK(kern_token_logprobs_workspace_bytes(64, 20) >= 64 * 4 * 3 + 64 * 20 * 8);
	/* registry: listed, the CPU variant first; the CUDA variant where it runs */
	const char *want = getenv("DSV4_TEST_DEVICE");
	if (want && !strcmp(want, "cuda") && kern_device_count() < 1)
		return test_skip("no GPU");
	const struct kern_op *op = kern_registry_find_op("token_logprobs");
	T_CHECK(op == &kern_op_token_logprobs && op->n_variants == 2 && op->variants[0].backend == KERN_BACKEND_CPU);
	if (op && op->n_variants == 2 && op->variants[1].run_host && kern_device_count() > 0) {
		kern_token_logprobs_fn g = (kern_token_logprobs_fn)op->variants[1].run_host;
		check_rows(g, "cuda", 9, 300, 311, 5, false);
		check_rows(g, "cuda", 9, 300, 300, 20, true);
		check_rows(g, "cuda", 4, 37, 40, 0, true);
		check_rows(g, "cuda", 6, 129280, 129280, 20, false);
		check_rows(g, "cuda", 300, 1000, 1000, 1, true);
	}
	return test_exit();
}
