/*
 * tests/kernels/test_linear_gpu.c (suite gpu): every CUDA linear variant
 * against the CPU reference on fresh random inputs over a shape sweep (edge
 * sizes, tails that are not multiples of 128, an empty batch), with outputs
 * pre-filled with NaN so that an unwritten element fails, and the registry's
 * selection plus self-check on the real device. Exits 77 without a GPU.
 */
#include "tests/kernels/gpu_test_util.h"

static void one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t T, int64_t in,
		     int64_t out, int aq, enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct kern_wmat w, wp;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, fmt, out, in, rng, &e) == ST_OK);
	T_CHECK(kern_prepare_weight(v, &w, &wp, &e) == ST_OK);
	const int64_t ldy = out + 1;
	void *x = gt_x_rand(rng, T, in, in, xdt, 0, 128);
	float *yr = gt_malloc((size_t)(T * out) * 4);
	void *yg = gt_poisoned(ydt, T, ldy);
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				     .w = &w, .act_quant_block = aq};
	T_CHECK(kern_linear_ref(&a) == ST_OK);
	a.w = &wp;
	a.y = yg;
	a.y_dtype = ydt;
	a.ldy = ldy;
	char label[96];
	snprintf(label, sizeof label, "%s T%lld in%lld out%lld aq%d", kern_wfmt_name(fmt), (long long)T, (long long)in,
		 (long long)out, aq);
	gt_check_rows(v->name, label, ((kern_linear_fn)v->run_host)(&a), yr, yg, ydt, T, out, ldy,
		      ydt == KERN_DT_BF16 ? 1e-2 : 1e-4);
	free(x);
	free(yr);
	free(yg);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
}

int main(int argc, char **argv)
{
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	int ran = 0;
	for (const struct kern_variant *v = gt_next_cuda_host(&kern_op_linear, NULL); v;
	     v = gt_next_cuda_host(&kern_op_linear, v)) {
		const int vi = (int)(v - kern_op_linear.variants);
		static const int64_t Ts[] = {0, 1, 5, 16, 17, 40};
		static const int64_t ins[] = {1, 100, 128, 129, 300, 1000};
		static const int64_t outs[] = {1, 63, 64, 65, 130, 1000};
		for (int i = 0; i < 36; i++) {
			static const enum kern_wfmt fs[] = {KERN_WFMT_FP8_E8M0_B128, KERN_WFMT_FP8_F32_B128,
							    KERN_WFMT_BF16, KERN_WFMT_F32};
			enum kern_wfmt f = fs[(i + vi) % 4];
			int64_t in = ins[i % 6], out = outs[(i / 6) % 6], T = Ts[gt_rnd(&env.rng, 0, 5)];
			struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = T, .act_quant_block = 128};
			struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
			char why[KERN_REASON_BYTES];
			if (!kern_variant_accepts(v, &p, &env.dev, NULL, why, sizeof why)) {
				fprintf(stderr, "%s refuses [%lld, %lld]: %s\n", v->name, (long long)out, (long long)in, why);
				continue;
			}
			one_case(v, &env.rng, f, T, in, out, (int)(kern_rand_u64(&env.rng) & 1) * 128,
				 (enum kern_dtype)(kern_rand_u64(&env.rng) & 1), (enum kern_dtype)(kern_rand_u64(&env.rng) & 1));
			ran++;
		}
		/* One model-sized layer: 1024 -> 4096 (wq_b-like), in a format this variant takes. */
		struct kern_linear_shape big = {.in = 1024, .out = 4096, .max_tokens = 7};
		static const enum kern_wfmt bf[] = {KERN_WFMT_FP8_E8M0_B128, KERN_WFMT_BF16};
		for (int j = 0; j < 2; j++) {
			struct kern_problem bp = {.wfmt = bf[j], .tp_size = 1, .shape = &big};
			if (kern_variant_accepts(v, &bp, &env.dev, NULL, NULL, 0))
				one_case(v, &env.rng, bf[j], 7, 1024, 4096, j ? 0 : 128, KERN_DT_BF16, KERN_DT_BF16);
		}
	}
	if (!ran)
		return test_skip("no CUDA linear variant loads on this device");
	/* Selection on the real device picks a CUDA variant and its self-check passes. */
	struct kern_linear_shape sh = {.in = 4096, .out = 1000, .max_tokens = 64, .act_quant_block = 128};
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
	int dropped = 0;
	const struct kern_variant *v = gt_select_checked(&kern_op_linear, &p, &env.dev, 0, &dropped);
	T_CHECK(v && v->backend == KERN_BACKEND_CUDA && dropped == 0);
	return test_exit();
}
