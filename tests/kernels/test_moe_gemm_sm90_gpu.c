/*
 * tests/kernels/test_moe_gemm_sm90_gpu.c (suite gpu): the Hopper FP4 expert GEMM
 * (moe_gemm_sm90_fp4, mma.sync on e2m1 unpacked to bf16) against the CPU
 * reference on the real device.
 *
 * The sweep: MXFP4 and NVFP4 experts; 1 to 9 experts with random loads
 * (empty experts, an expert with exactly 16 rows, one with 17); total rows
 * 0, 1 (decode), 15, 16, 17, 33, 130; in = 32, 64, 96, 288, 2048, 4096 (the
 * kernel's K chunk is 64 and its staged tile 256, so 32, 96 and 288 exercise
 * partial chunks and tiles); out = 1, 7, 64, 65, 200 (partial n8 and
 * 64-output tiles); gathered (row_src) and in-place rows; act_quant 0 and
 * 128; x f32 (which takes the hi/lo two-MMA path when act_quant is off) and
 * bf16; y f32 and bf16. Outputs are NaN-filled so an unwritten row fails.
 * Tolerance (relative to max |y_ref|): every MMA product is exact (e2m1 ×
 * block scale and the act_quant values are exact in bf16), so y differs from
 * the reference only by f32 summation order, plus 2^-17 relative on f32
 * activations without act_quant (the lo half's rounding): 1e-4 for f32 out;
 * bf16 out adds one bf16 rounding: 1e-2.
 * Then: FP8 experts and in % 32 are refused with their reasons, and on cc
 * 9.0 selection picks moe_gemm_sm90_fp4 for the model's expert shapes and its
 * self-check passes. Exits 77 without a GPU, without CUDA, or when the
 * build has no sm_90a image.
 */
#include "tests/kernels/gpu_test_util.h"

static int one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E, int64_t R,
		    int64_t in, int64_t out, int aq, int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	/* Expert loads: random, with empties; sometimes the first expert gets
	 * exactly 16 or 17 rows (the kernel's 16-row tiles). */
	int32_t *off = gt_malloc(sizeof(int32_t) * (size_t)(E + 1));
	gt_expert_offsets(rng, E, R, kern_rand_u64(rng) % 2 ? 16 + (int64_t)(kern_rand_u64(rng) % 2) : -1, off);
	bool ok = gt_moe_gemm_case(v, rng, fmt, E, off, in, out, aq, gather, xdt, ydt, 4);
	free(off);
	return ok;
}

int main(int argc, char **argv)
{
	if (!DSV4_HAVE_SM_90A)
		return test_skip("built without the sm_90a image");
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	const struct kern_variant *v = gt_find(&kern_op_moe_gemm, "moe_gemm_sm90_fp4");
	T_CHECK(v != NULL);
	if (!v)
		return test_exit();
	struct kern_moe_gemm_shape msh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 384,
					  .act_quant_block = 128, .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem mp = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &msh};
	char why[KERN_REASON_BYTES] = "";
	if (env.dev.cc_major * 10 + env.dev.cc_minor != 90) {
		T_CHECK(!kern_variant_accepts(v, &mp, &env.dev, NULL, why, sizeof why));
		gt_contains(why, "outside [9.0, 9.0]");
		fprintf(stderr, "not a cc 9.0 device: only the refusal was checked\n");
		return test_exit();
	}
	T_CHECKF(kern_variant_accepts(v, &mp, &env.dev, NULL, why, sizeof why), "refused on the H200: %s", why);

	/* Guards. */
	gt_fp4_moe_gemm_guards(v, &msh, &env.dev);

	/* Sweep. */
	static const int64_t Rs[] = {0, 1, 15, 16, 17, 33, 130};
	static const int64_t ins[] = {32, 64, 96, 288, 2048, 4096};
	static const int64_t outs[] = {1, 7, 64, 65, 200};
	int ran = 0, failed = 0;
	for (int i = 0; i < 60; i++) {
		enum kern_wfmt f = (i & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4;
		int64_t R = Rs[i % 7], in = ins[gt_rnd(&env.rng, 0, 5)], out = outs[gt_rnd(&env.rng, 0, 4)], E = gt_rnd(&env.rng, 1, 9);
		int aq = (int)((i >> 1) & 1) * 128;
		enum kern_dtype xdt = (enum kern_dtype)((i >> 2) & 1), ydt = (enum kern_dtype)(kern_rand_u64(&env.rng) & 1);
		failed += !one_case(v, &env.rng, f, E, R, in, out, aq, (int)(kern_rand_u64(&env.rng) & 1), xdt, ydt);
		ran++;
	}
	/* Model shapes: w1 4096 -> 2048 and w2 2048 -> 4096 of 6 routed experts, decode (6 rows) and a batch. */
	failed += !one_case(v, &env.rng, KERN_WFMT_NVFP4, 6, 6, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
	failed += !one_case(v, &env.rng, KERN_WFMT_MXFP4, 8, 48, 2048, 4096, 128, 0, KERN_DT_BF16, KERN_DT_F32);
	fprintf(stderr, "%d sweep cases + 2 model shapes, %d failed\n", ran, failed);

	/* Selection on the device: the sm_90a kernel for w1/w3 and w2 (and their TP=2 shards), self-check passing. */
	static const int64_t model[][2] = {{4096, 2048}, {2048, 4096}, {4096, 1024}, {1024, 4096}};
	gt_moe_gemm_picks(&env.dev, model, 4, 1536, v);
	return test_exit();
}
