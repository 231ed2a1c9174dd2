/*
 * tests/kernels/test_moe_gemm_gpu.c (suite gpu): every CUDA moe_gemm variant
 * against the CPU reference: MXFP4, NVFP4 and FP8 experts, random expert loads
 * (empty experts included), gathered and in-place rows, act_quant on/off,
 * NaN-filled outputs so unwritten rows fail, plus selection and self-check
 * on the real device. Exits 77 without a GPU.
 */
#include "tests/kernels/gpu_test_util.h"

/* R rows over E experts with random loads (gt_expert_offsets) through v. */
static void one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E, int64_t R,
		     int64_t in, int64_t out, int aq, int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	int32_t *off = gt_malloc(sizeof(int32_t) * (size_t)(E + 1));
	gt_expert_offsets(rng, E, R, -1, off);
	gt_moe_gemm_case(v, rng, fmt, E, off, in, out, aq, gather, xdt, ydt, 0);
	free(off);
}

int main(int argc, char **argv)
{
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	int ran = 0;
	for (const struct kern_variant *v = gt_next_cuda_host(&kern_op_moe_gemm, NULL); v;
	     v = gt_next_cuda_host(&kern_op_moe_gemm, v)) {
		for (int i = 0; i < 60; i++) {
			static const enum kern_wfmt fs[] = {KERN_WFMT_MXFP4, KERN_WFMT_NVFP4, KERN_WFMT_FP8_E8M0_B128,
							    KERN_WFMT_FP8_F32_B128, KERN_WFMT_BF16, KERN_WFMT_F32};
			enum kern_wfmt f = fs[i % 6];
			int64_t in = i % 6 >= 2 ? gt_rnd(&env.rng, 1, 700) : 32 * gt_rnd(&env.rng, 1, 24);
			int64_t out = gt_rnd(&env.rng, 1, 300), E = gt_rnd(&env.rng, 1, 8);
			int64_t R = i == 0 ? 0 : gt_rnd(&env.rng, 1, 40);
			struct kern_moe_gemm_shape sh = {.in = in, .out = out, .n_experts = E, .max_rows = R};
			struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
			char why[KERN_REASON_BYTES];
			if (!kern_variant_accepts(v, &p, &env.dev, NULL, why, sizeof why)) {
				fprintf(stderr, "%s refuses: %s\n", v->name, why);
				continue;
			}
			one_case(v, &env.rng, f, E, R, in, out, (int)(kern_rand_u64(&env.rng) & 1) * 128,
				 (int)(kern_rand_u64(&env.rng) & 1), (enum kern_dtype)(kern_rand_u64(&env.rng) & 1),
				 (enum kern_dtype)(kern_rand_u64(&env.rng) & 1));
			ran++;
		}
		/* Model-sized: w1 of 8 experts, 4096 -> 2048, 48 routed rows. */
		one_case(v, &env.rng, KERN_WFMT_MXFP4, 8, 48, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
		one_case(v, &env.rng, KERN_WFMT_NVFP4, 8, 48, 2048, 4096, 128, 0, KERN_DT_BF16, KERN_DT_F32);
	}
	if (!ran)
		return test_skip("no CUDA moe_gemm variant loads on this device");
	struct kern_moe_gemm_shape sh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 384,
					 .act_quant_block = 128};
	struct kern_problem p = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
	int dropped = 0;
	const struct kern_variant *v = gt_select_checked(&kern_op_moe_gemm, &p, &env.dev, 3, &dropped);
	T_CHECK(v && v->backend == KERN_BACKEND_CUDA && dropped == 0);
	return test_exit();
}
