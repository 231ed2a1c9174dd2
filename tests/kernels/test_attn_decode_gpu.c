/*
 * tests/kernels/test_attn_decode_gpu.c (suite gpu): sparse_attn_cuda_decode
 * (kernels/attention/attn_decode.cu) against kern_sparse_attn_ref at the
 * DeepSeek-V4-Flash attention shapes (64 heads, head_dim 512, rope 64,
 * window 128; CSA: ratio 4, top-k 512; HCA: ratio 128), as the forward pass
 * lays them out: sources [compressed pool | this step's fresh KV | rings],
 * index sets from kern_attn_index_ref over a ragged batch of sequences
 * (random step lengths, start positions around 1k or 32k tokens of
 * context, so ragged per-sequence row counts), CSA top-k lists of random
 * visible entries with -1 holes, index rows sometimes far wider than their
 * sets (as the forward pass sizes them for its largest layer kind).
 * T = 1..64 (every T to 16 and a random spread to 64 for the 32k
 * contexts, a fixed spread for 1k), plus T = 65
 * and 100 (the variant hands those to the generic kernel). Fresh random
 * inputs each run (the seed is printed; DSV4_TEST_SEED repeats it), device
 * outputs poisoned with NaN, every element compared. Tolerance as
 * tests/kernels/test_ops_gpu.c gives sparse_attn: rtol 1e-5 of max|ref|
 * (summation order only), 8e-3 (one bf16 ulp) with bf16 outputs.
 * Selection on the device must pick the decode row. Exits 77 without CUDA
 * or without a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/kernels/gpu_test_util.h"

#if DSV4_HAVE_CUDA
#include "kernels/attention/attn_decode.h"

#define H 64
#define D 512
#define RD 64
#define WIN 128
#define TOPK 512

static uint64_t rng;

/* One step: T tokens in n_seqs ragged sequences at about ctx tokens of
 * context each; ratio 0 (SWA), 4 (CSA) or 128 (HCA). */
static void t_case(int64_t T, int64_t ctx, int ratio, bool bout)
{
	kern_sparse_attn_fn run = (kern_sparse_attn_fn)gt_find(&kern_op_sparse_attn, "sparse_attn_cuda_decode")->run;
	const bool csa = ratio == 4;
	int n_seqs = (int)gt_rnd(&rng, 1, T < 8 ? T : 8);
	int32_t q_off[9], start[8];
	q_off[0] = 0;
	for (int s = 0; s < n_seqs; s++) {
		int64_t left = T - q_off[s], need = n_seqs - s - 1;
		q_off[s + 1] = (int32_t)(s == n_seqs - 1 ? T : q_off[s] + gt_rnd(&rng, 1, left - need));
		start[s] = (int32_t)(ctx + gt_rnd(&rng, -ctx / 8, ctx / 8));
	}
	/* compressed pool shared by the sequences (read-only here), then fresh
	 * KV [T], then the rings [n_seqs·WIN] */
	int64_t max_vis = ratio ? (ctx + ctx / 8 + T + 1) / ratio : 0;
	int64_t cmp_rows = ratio ? max_vis + gt_rnd(&rng, 0, 64) : 0;
	int64_t ring_rows = (int64_t)n_seqs * WIN;
	int64_t cmp_row0[8], ring_row0[8];
	for (int s = 0; s < n_seqs; s++) {
		int64_t vis = ratio ? (start[s] + (q_off[s + 1] - q_off[s])) / ratio : 0;
		cmp_row0[s] = ratio ? gt_rnd(&rng, 0, cmp_rows - vis) : 0;
		ring_row0[s] = cmp_rows + T + (int64_t)s * WIN;
	}
	/* the forward pass sizes idx_stride for its largest layer kind: sometimes far above the sets */
	int idx_stride = WIN + (csa ? TOPK : (int)max_vis) + (int)gt_rnd(&rng, 0, 5) +
			 (gt_rnd(&rng, 0, 2) == 0 ? (int)gt_rnd(&rng, 100, 8200) : 0);
	int32_t *topk = NULL;
	if (csa) {
		topk = gt_ifill((size_t)(T * TOPK), -1);
		uint8_t *used = calloc((size_t)max_vis + 1, 1);
		for (int s = 0; s < n_seqs; s++)
			for (int32_t i = q_off[s]; i < q_off[s + 1]; i++) {
				int64_t vis = (start[s] + (i - q_off[s]) + 1) / ratio;
				int n = (int)(vis < TOPK ? vis : TOPK);
				memset(used, 0, (size_t)max_vis + 1);
				for (int j = 0; j < n; j++) {
					int64_t w;
					do
						w = gt_rnd(&rng, 0, vis - 1);
					while (used[w]);
					used[w] = 1;
					topk[(int64_t)i * TOPK + j] = gt_rnd(&rng, 0, 15) == 0 ? -1 : (int32_t)w;
				}
			}
		free(used);
	}
	int32_t *idx = gt_ifill((size_t)(T * idx_stride), 0), *len = gt_ifill((size_t)T, 0);
	struct kern_attn_index_args xa = {.n_tokens = T, .n_seqs = n_seqs, .q_off = q_off, .start_pos = start,
					  .window = WIN, .cur_row0 = cmp_rows, .ring_row0 = ring_row0, .ratio = ratio,
					  .cmp_row0 = ratio ? cmp_row0 : NULL, .topk = topk, .topk_stride = TOPK,
					  .idx = idx, .idx_len = len, .idx_stride = idx_stride};
	T_CHECK(kern_attn_index_ref(&xa) == ST_OK);

	size_t nq = (size_t)(T * H * D);
	float *q = gt_frand(&rng, nq, 3.0f); /* logits of order 1: softmax neither flat nor one-hot */
	float *cmp = ratio ? gt_frand(&rng, (size_t)(cmp_rows * D), 1.0f) : NULL;
	float *fresh = gt_frand(&rng, (size_t)(T * D), 1.0f), *ring = gt_frand(&rng, (size_t)(ring_rows * D), 1.0f);
	float *snk = gt_frand(&rng, H, 2.0f), *om = malloc(RD / 2 * 4);
	T_CHECK(kern_rope_freqs_build(om, RD, 10000, NULL) == ST_OK);
	int32_t *pos = malloc((size_t)T * 4);
	for (int s = 0; s < n_seqs; s++)
		for (int32_t i = q_off[s]; i < q_off[s + 1]; i++)
			pos[i] = start[s] + (i - q_off[s]);
	float *o_r = gt_fnan(nq), *o_g = gt_fnan(nq);
	struct kern_sparse_attn_args a = {.q = q, .out = o_r, .kv_stride = D, .idx = idx, .idx_len = len,
					  .idx_stride = idx_stride, .sink = snk, .softmax_scale = 1.0f / sqrtf((float)D),
					  .pos = pos, .omega = om, .rope_dim = RD, .n_tokens = T, .n_heads = H,
					  .head_dim = D, .bf16_out = bout};
	int ns = 0;
	if (ratio) {
		a.kv[ns] = cmp;
		a.kv_rows[ns++] = cmp_rows;
	}
	a.kv[ns] = fresh;
	a.kv_rows[ns++] = T;
	a.kv[ns] = ring;
	a.kv_rows[ns++] = ring_rows;
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);

	struct kern_sparse_attn_args g = a;
	g.q = gt_dup(q, nq * 4);
	g.out = gt_dup(o_g, nq * 4);
	for (int s = 0; s < ns; s++)
		g.kv[s] = gt_dup(a.kv[s], (size_t)(a.kv_rows[s] * D) * 4);
	g.idx = gt_dup(idx, (size_t)(T * idx_stride) * 4);
	g.idx_len = gt_dup(len, (size_t)T * 4);
	g.sink = gt_dup(snk, H * 4);
	g.pos = gt_dup(pos, (size_t)T * 4);
	g.omega = gt_dup(om, RD / 2 * 4);
	g.stream = gt_stream;
	T_CHECK(run(&g) == ST_OK);
	gt_down(o_g, g.out, nq * 4);
	char what[128];
	snprintf(what, sizeof what, "attn_decode T%lld ctx%lld ratio%d seqs%d stride%d bf%d", (long long)T,
		 (long long)ctx, ratio, n_seqs, idx_stride, bout);
	gt_cmp(what, o_r, o_g, nq, 1e-6, bout ? 8e-3 : 1e-5);
	free(topk), free(idx), free(len), free(q), free(cmp), free(fresh), free(ring), free(snk), free(om), free(pos);
	free(o_r), free(o_g);
	gt_dfree_all();
}
#endif

int main(int argc, char **argv)
{
#if DSV4_HAVE_CUDA
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	rng = gt_seed(argc, argv, &dev);
	gt_stream_create();
	const struct kern_variant *v = gt_find(&kern_op_sparse_attn, "sparse_attn_cuda_decode"), *pick = NULL;
	T_CHECK(v && v->run);
	if (!v || !v->run)
		return test_exit();
	struct err e = {0};
	struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
	T_CHECKF(kern_select(&kern_op_sparse_attn, &p, &dev, NULL, -1, &pick, &e) == ST_OK && pick == v,
		 "sparse_attn: picked %s (%s)", pick ? pick->name : "none", e.msg);

	/* every T to 16, then a spread to 64 (the CPU reference is the cost) */
	for (int64_t T = 1; T <= 64; T = T < 16 ? T + 1 : T + (int64_t)gt_rnd(&rng, 1, 8)) {
		t_case(T, 32768, 4, T % 5 == 0);
		t_case(T, 32768, 128, T % 7 == 0);
	}
	t_case(64, 32768, 4, false);
	t_case(64, 32768, 128, true);
	const int64_t ts[] = {1, 2, 3, 8, 17, 32, 64};
	for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
		t_case(ts[k], 1024, 4, false);
		t_case(ts[k], 1024, 128, k % 2 == 1);
		t_case(ts[k], 1024, 0, false);
	}
	t_case(1, 40, 4, false); /* few visible compressed entries, empty top-k */
	t_case(3, 5, 128, false); /* no visible HCA entry yet */
	t_case(65, 1024, 4, false); /* beyond the decode path: the generic kernel */
	t_case(100, 2048, 128, true);
	return test_exit();
#else
	(void)argc, (void)argv;
	return test_skip("built without CUDA");
#endif
}
