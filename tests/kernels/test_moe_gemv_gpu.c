/*
 * tests/kernels/test_moe_gemv_gpu.c (suite gpu): the decode expert GEMV
 * (moe_gemm_cuda_gemv, moe_gemv.h) against the CPU reference on the real
 * device.
 *
 * The sweep: MXFP4 and NVFP4 experts; 1 to 9 experts with random loads of 0
 * to 8 rows each (empties included), plus cases where one expert has 9 to 20
 * rows (the kernel's 8-row chunks) and totals above KERN_MOE_GEMV_MAX_ROWS
 * (run() takes them in chunks too: only the guard keeps plans at 64, and run()
 * never hands work to another kernel); in = 32, 64, 96, 288, 1056, 2048,
 * 4096 (partial 512-byte steps and 128-column act_quant blocks); out = 1, 7,
 * 16, 17, 200, 2048 (partial 16-output blocks); gathered (row_src) and
 * in-place rows; act_quant 0 (bf16 x) and 128 (f32 or bf16 x); y f32 or bf16. Outputs are
 * NaN-filled so an unwritten row fails; fresh random inputs every run (the
 * seed is printed). Tolerance as the other expert GEMM tests: f32 sums in
 * another order (1e-4 of max |y| for f32 out, 1e-2 with a bf16 rounding).
 * Then the guards (FP8 refused, in % 32, max_rows above 64, f32 x without
 * act_quant, an `in` beyond the device's shared memory) and selection
 * on the device: max_rows 64 picks the GEMV with its self-check passing.
 * Exits 77 without CUDA or a device.
 */
#include "kernels/moe_gemm/moe_gemv.h"
#include "tests/kernels/gpu_test_util.h"

/* E experts with counts[] rows each. */
static int one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E, const int64_t *counts,
		    int64_t in, int64_t out, int aq, int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	int32_t *off = gt_malloc(sizeof(int32_t) * (size_t)(E + 1));
	off[0] = 0;
	for (int64_t x = 0; x < E; x++)
		off[x + 1] = off[x] + (int32_t)counts[x];
	bool ok = gt_moe_gemm_case(v, rng, fmt, E, off, in, out, aq, gather, xdt, ydt, 4);
	free(off);
	return ok;
}

int main(int argc, char **argv)
{
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	const struct kern_variant *v = gt_find(&kern_op_moe_gemm, "moe_gemm_cuda_gemv");
	T_CHECK(v != NULL && v->run_host != NULL);
	if (!v || !v->run_host)
		return test_exit();

	/* Guards. */
	struct kern_moe_gemm_shape msh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 64,
					  .act_quant_block = 128, .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem mp = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &msh};
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_variant_accepts(v, &mp, &env.dev, NULL, why, sizeof why), "refused: %s", why);
	gt_fp4_moe_gemm_guards(v, &msh, &env.dev);
	struct kern_moe_gemm_shape big = msh;
	big.max_rows = KERN_MOE_GEMV_MAX_ROWS + 1;
	struct kern_problem op_big = {.wfmt = KERN_WFMT_MXFP4, .tp_size = 1, .shape = &big};
	T_CHECK(!kern_variant_accepts(v, &op_big, &env.dev, NULL, why, sizeof why));
	gt_contains(why, "max_rows 65");
	struct kern_moe_gemm_shape f32x = msh;
	f32x.x_dtype = KERN_DT_F32;
	f32x.act_quant_block = 0;
	struct kern_problem op_f32 = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &f32x};
	T_CHECK(!kern_variant_accepts(v, &op_f32, &env.dev, NULL, why, sizeof why));
	gt_contains(why, "without act_quant");
	f32x.act_quant_block = 128;
	T_CHECKF(kern_variant_accepts(v, &op_f32, &env.dev, NULL, why, sizeof why), "refused: %s", why);
	struct kern_moe_gemm_shape wide = msh;
	wide.in = 32 * ((int64_t)env.dev.smem_optin_bytes / 32); /* one staged bf16 row is twice that */
	struct kern_problem op_wide = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &wide};
	T_CHECK(!kern_variant_accepts(v, &op_wide, &env.dev, NULL, why, sizeof why));
	gt_contains(why, "shared memory");

	/* Sweep: decode loads (0..8 rows per expert). */
	static const int64_t ins[] = {32, 64, 96, 288, 1056, 2048, 4096};
	static const int64_t outs[] = {1, 7, 16, 17, 200, 2048};
	int ran = 0, failed = 0;
	for (int i = 0; i < 48; i++) {
		enum kern_wfmt f = (i & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4;
		int64_t E = gt_rnd(&env.rng, 1, 9), counts[9];
		for (int64_t x = 0; x < E; x++)
			counts[x] = kern_rand_u64(&env.rng) % 4 == 0 ? 0 : gt_rnd(&env.rng, 1, 8);
		if (i % 8 == 0) /* the batch-1 case: one expert, one row */
			E = 1, counts[0] = 1;
		if (i % 8 == 4) /* chunking: one expert above 8 rows */
			counts[0] = gt_rnd(&env.rng, 9, 20);
		int64_t in = ins[gt_rnd(&env.rng, 0, 6)], out = outs[gt_rnd(&env.rng, 0, 5)];
		if (in * out > 4096 * 256 && E > 3)
			E = 3;
		int aq = (int)((i >> 1) & 1) * 128;
		enum kern_dtype xdt = (enum kern_dtype)((i >> 2) & 1), ydt = (enum kern_dtype)(kern_rand_u64(&env.rng) & 1);
		if (xdt != KERN_DT_BF16 && !aq) /* f32 x needs act_quant (the guard refuses it otherwise) */
			aq = 128;
		failed += !one_case(v, &env.rng, f, E, counts, in, out, aq, (int)(kern_rand_u64(&env.rng) & 1), xdt,
				    ydt);
		ran++;
	}
	/* Model shapes: w1 4096 -> 2048 and w2 2048 -> 4096, 6 routed experts x 1 row (batch 1) and x 8 rows. */
	static const int64_t six1[6] = {1, 1, 1, 1, 1, 1}, six8[6] = {8, 8, 8, 8, 8, 8};
	failed += !one_case(v, &env.rng, KERN_WFMT_NVFP4, 6, six1, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
	failed += !one_case(v, &env.rng, KERN_WFMT_MXFP4, 6, six1, 2048, 4096, 128, 0, KERN_DT_BF16, KERN_DT_F32);
	failed += !one_case(v, &env.rng, KERN_WFMT_NVFP4, 6, six8, 2048, 4096, 128, 0, KERN_DT_F32, KERN_DT_F32);
	failed += !one_case(v, &env.rng, KERN_WFMT_MXFP4, 6, six8, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_F32);
	/* Above KERN_MOE_GEMV_MAX_ROWS: run() still computes every row (8-row chunks). */
	static const int64_t many[3] = {40, 0, 60};
	failed += !one_case(v, &env.rng, KERN_WFMT_NVFP4, 3, many, 1024, 200, 128, 1, KERN_DT_BF16, KERN_DT_F32);
	fprintf(stderr, "%d sweep cases + 5 model/fallback shapes, %d failed\n", ran, failed);

	/* Selection on the device: a decode plan (max_rows 64) gets the GEMV, self-check passing. */
	static const int64_t model[][2] = {{4096, 2048}, {2048, 4096}};
	gt_moe_gemm_picks(&env.dev, model, 2, 64, v);
	return test_exit();
}
