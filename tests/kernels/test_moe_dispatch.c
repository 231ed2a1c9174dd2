/*
 * tests/kernels/test_moe_dispatch.c: moe_dispatch invariants (offsets,
 * stable order, inverse maps, expert-parallel ranges) on fresh random
 * routings, and dispatch -> moe_gemm -> combine end to end against a
 * per-(token, slot) linear on each chosen expert.
 */
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"
#include "tests/test.h"

static int64_t rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

static void one_case(uint64_t *rng, int64_t T, int k, int E_global, int base, int E)
{
	int64_t S = T * k;
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)(S + 1));
	for (int64_t s = 0; s < S; s++) /* a few "no expert" slots (-1) */
		ids[s] = kern_rand_u64(rng) % 17 == 0 ? -1 : (int32_t)rnd(rng, 0, E_global - 1);
	int32_t *off = malloc(sizeof(int32_t) * (size_t)(E + 1)), *src = malloc(sizeof(int32_t) * (size_t)(S + 1));
	int32_t *rslot = malloc(sizeof(int32_t) * (size_t)(S + 1)), *srow = malloc(sizeof(int32_t) * (size_t)(S + 1));
	int64_t n_rows = -1;
	struct kern_moe_dispatch_args d = {.n_tokens = T, .top_k = k, .topk_ids = ids, .expert_base = base,
					   .n_experts = E, .expert_offsets = off, .row_src = src, .row_slot = rslot,
					   .slot_row = srow, .n_rows = &n_rows};
	T_CHECK(kern_moe_dispatch_ref(&d) == ST_OK);
	int64_t local = 0;
	for (int64_t s = 0; s < S; s++)
		local += ids[s] >= base && ids[s] < base + E;
	T_CHECK(n_rows == local && off[0] == 0 && off[E] == local);
	int bad = 0;
	for (int x = 0; x < E; x++) {
		bad += off[x + 1] < off[x];
		for (int32_t r = off[x]; r < off[x + 1]; r++) {
			bad += ids[rslot[r]] != base + x;
			bad += src[r] != rslot[r] / k;
			bad += srow[rslot[r]] != r;
			bad += r > off[x] && rslot[r] <= rslot[r - 1]; /* stable */
		}
	}
	for (int64_t s = 0; s < S; s++)
		bad += (ids[s] >= base && ids[s] < base + E) ? srow[s] < 0 : srow[s] != -1;
	T_CHECKF(bad == 0, "dispatch T%lld k%d E%d/%d: %d violations", (long long)T, k, E, E_global, bad);

	/* End to end with MXFP4 experts: rows -> GEMM -> weighted combine. */
	int64_t in = 64, out = 24;
	struct kern_wmat *w = calloc((size_t)E, sizeof *w);
	struct err e = {0};
	for (int x = 0; x < E; x++)
		T_CHECK(kern_wmat_make_random(&w[x], KERN_WFMT_MXFP4, out, in, rng, &e) == ST_OK);
	float *xb = malloc(sizeof(float) * (size_t)(T * in + 1)), *y = malloc(sizeof(float) * (size_t)(S * out + 1));
	float *o = malloc(sizeof(float) * (size_t)(T * out + 1)), *sw = malloc(sizeof(float) * (size_t)(S + 1));
	float *yt = malloc(sizeof(float) * (size_t)out);
	for (int64_t i = 0; i < T * in; i++)
		xb[i] = kern_rand_f32(rng);
	for (int64_t s = 0; s < S; s++)
		sw[s] = kern_rand_f32(rng);
	for (int64_t i = 0; i < T * out; i++)
		o[i] = 0.5f;
	struct kern_moe_gemm_args g = {.n_rows = n_rows, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = T, .x = xb, .y = y, .w = w};
	T_CHECK(kern_moe_gemm_ref(&g) == ST_OK);
	struct kern_moe_combine_args c = {.n_tokens = T, .top_k = k, .dim = out, .slot_row = srow,
					  .slot_weight = sw, .y = y, .out = o, .accumulate = true};
	T_CHECK(kern_moe_combine_ref(&c) == ST_OK);
	bad = 0;
	for (int64_t t = 0; t < T; t++) {
		double want[64] = {0};
		for (int j = 0; j < k; j++) {
			int32_t id = ids[t * k + j];
			if (id < base || id >= base + E)
				continue;
			struct kern_linear_args la = {.n_tokens = 1, .x = xb + t * in, .y = yt, .w = &w[id - base]};
			T_CHECK(kern_linear_ref(&la) == ST_OK);
			for (int64_t q = 0; q < out; q++)
				want[q] += (double)sw[t * k + j] * yt[q];
		}
		for (int64_t q = 0; q < out; q++)
			bad += fabs(o[t * out + q] - (want[q] + 0.5)) > 1e-4 * (1 + fabs(want[q]));
	}
	T_CHECKF(bad == 0, "combine T%lld: %d outputs wrong", (long long)T, bad);
	for (int x = 0; x < E; x++)
		kern_wmat_release(&w[x]);
	free(w);
	free(xb);
	free(y);
	free(o);
	free(sw);
	free(yt);
	free(ids);
	free(off);
	free(src);
	free(rslot);
	free(srow);
}

int main(void)
{
	uint64_t rng = test_seed() * 0x94D049BB133111EBull;
	one_case(&rng, 0, 6, 16, 0, 16);
	one_case(&rng, 1, 6, 16, 0, 16);
	for (int i = 0; i < 20; i++) {
		int Eg = (int)rnd(&rng, 1, 32), base = (int)rnd(&rng, 0, Eg - 1);
		one_case(&rng, rnd(&rng, 0, 40), (int)rnd(&rng, 1, 8), Eg, base, (int)rnd(&rng, 1, Eg - base));
	}
	/* Bad input is refused. */
	int32_t ids[2] = {0, -1}, off[3], src[2], srow[2];
	int64_t n;
	struct kern_moe_dispatch_args d = {.n_tokens = 1, .top_k = 2, .topk_ids = ids, .n_experts = 2,
					   .expert_offsets = off, .row_src = src, .slot_row = srow, .n_rows = &n};
	T_CHECK(kern_moe_dispatch_ref(&d) == ST_OK && n == 1 && srow[1] == -1);
	d.top_k = 0;
	T_CHECK(kern_moe_dispatch_ref(&d) == ST_INVALID);
	d.top_k = 2;
	d.slot_row = NULL;
	T_CHECK(kern_moe_dispatch_ref(&d) == ST_INVALID);
	return test_exit();
}
