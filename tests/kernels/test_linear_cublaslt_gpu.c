/*
 * tests/kernels/test_linear_cublaslt_gpu.c (suite gpu): the cuBLASLt FP8 linear
 * (linear_cublaslt_sm90) against the CPU reference on the real device.
 *
 * What it checks, and why each part can fail:
 *   - a shape sweep over n_tokens (1 = decode, the BLK128 single-column
 *     GEMM; 2, 3 = one padded piece of N = 4; 5, 7, 17, 129 = a direct
 *     multiple-of-4 piece plus a remainder of 1 or a staged 2-3; 16, 100),
 *     in (512, 1024, 1536, 4096: the multiples of 512 the guard admits;
 *     1536 has 12 K blocks) and out (16, 144, 1040, 4096: multiples
 *     of 16, most not of 128, so the last 128-row scale block is partial),
 *     x in f32 and bf16, y in f32 and bf16 with a padded row stride,
 *     weights with E8M0 and f32 scales (prepare: fp8_f32_r128);
 *   - activations whose magnitude changes per token AND per 128-column
 *     block by up to 2^±6, so every activation scale differs: if the B
 *     VEC128 scale layout (kb*N + t, linear_cublaslt.cu) were transposed,
 *     cases with T > 1 and in > 128 fail while T = 1 passes; if the weight's
 *     (kb*out + o) were, T = 1 fails too -- the failure message says so;
 *   - outputs pre-filled with NaN (an unwritten element fails), and the
 *     row padding must stay NaN (nothing written past out); a third of the
 *     cases use ldy = out + 1 (rows not 16-byte aligned), which the variant
 *     serves through its staging buffer, once over 3 staging chunks;
 *   - the guard's refusals (in % 512, out % 16, out > 65536, act_quant 0,
 *     bf16 weights)
 *     with their reasons, and a missing workspace is ST_INVALID;
 *   - selection on the device: on cc 9.0 kern_select picks
 *     linear_cublaslt_sm90 for the DeepSeek-V4-Flash FP8 shapes and its
 *     self-check agrees with the reference; elsewhere it is refused by cc.
 * Tolerance (relative to max |y_ref|): the activation codes and scales are
 * bit-identical to the reference's, so the only difference is accumulation:
 * Hopper FP8 MMAs accumulate a 128-long block with ~14 mantissa bits before
 * cuBLASLt promotes it to f32 and applies the block scales, giving about
 * 2^-13 relative per block; 2e-3 leaves headroom for ceil(in/128) <= 32
 * blocks adding up. bf16 outputs add one bf16 rounding (2^-9): 1e-2.
 * Exits 77 without a GPU or without CUDA.
 */
#include "kernels/linear/linear_cublaslt.h"
#include "tests/kernels/gpu_test_util.h"

/* ldy_pad 16 keeps y rows 16-byte aligned (cuBLASLt writes y directly);
 * ldy_pad 1 does not (the variant stages the output in token chunks). */
static int one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t T, int64_t in,
		    int64_t out, enum kern_dtype xdt, enum kern_dtype ydt, int64_t ldy_pad)
{
	struct kern_wmat w, wp;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, fmt, out, in, rng, &e) == ST_OK);
	T_CHECK(kern_prepare_weight(v, &w, &wp, &e) == ST_OK);
	T_CHECK(wp.fmt == KERN_WFMT_FP8_F32_R128);
	const int64_t ldy = out + ldy_pad;
	void *x = gt_x_rand(rng, T, in, in, xdt, 6, 128);
	float *yr = gt_malloc((size_t)(T * out) * 4);
	void *yg = gt_poisoned(ydt, T, ldy);
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				     .w = &w, .act_quant_block = 128};
	T_CHECK(kern_linear_ref(&a) == ST_OK);
	a.w = &wp;
	a.y = yg;
	a.y_dtype = ydt;
	a.ldy = ldy;
	char label[320];
	snprintf(label, sizeof label, "%s T%lld in%lld out%lld ldy%lld x%s y%s%s", kern_wfmt_name(fmt), (long long)T,
		 (long long)in, (long long)out, (long long)ldy, xdt ? "bf16" : "f32", ydt ? "bf16" : "f32",
		 T > 1 && in > 128 ? " (if only T > 1 cases fail: suspect the B VEC128 activation-scale layout; "
				     "if T = 1 fails too, the weight's; see linear_cublaslt.cu)"
				   : "");
	bool ok = gt_check_rows(v->name, label, ((kern_linear_fn)v->run_host)(&a), yr, yg, ydt, T, out, ldy,
				ydt == KERN_DT_BF16 ? 1e-2 : 2e-3);
	free(x);
	free(yr);
	free(yg);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
	return ok;
}

static void expect_refusal(const struct kern_variant *v, const struct kern_device *dev, enum kern_wfmt f,
			   int64_t in, int64_t out, int aq, const char *want)
{
	struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = 16, .act_quant_block = aq};
	struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(!kern_variant_accepts(v, &p, dev, NULL, why, sizeof why), "accepted [%lld, %lld] aq %d",
		 (long long)out, (long long)in, aq);
	gt_contains(why, want);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	const struct kern_variant *v = gt_find(&kern_op_linear, "linear_cublaslt_sm90");
	T_CHECK(v != NULL);
	if (!v)
		return test_exit();
	uint64_t rng = gt_seed(argc, argv, &dev);

	struct kern_linear_shape dsh = {.in = 4096, .out = 1024, .max_tokens = 1024, .act_quant_block = 128,
					.x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem dp = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &dsh};
	if (dev.cc_major * 10 + dev.cc_minor != 90) {
		char why[KERN_REASON_BYTES] = "";
		T_CHECK(!kern_variant_accepts(v, &dp, &dev, NULL, why, sizeof why));
		gt_contains(why, "outside [9.0, 9.0]");
		fprintf(stderr, "not a cc 9.0 device: only the refusal was checked\n");
		return test_exit();
	}
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_variant_accepts(v, &dp, &dev, NULL, why, sizeof why), "refused on the H200: %s", why);

	/* Guards. */
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 640, 1024, 128, "not a multiple of 512");
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 1024, 65536 + 16, 128, "dimension too large");
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 1024, 100, 128, "not a multiple of 16");
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 1024, 1024, 0, "act_quant_block 0");
	expect_refusal(v, &dev, KERN_WFMT_BF16, 1024, 1024, 128, "weight format bf16");
#if DSV4_HAVE_CUDA
	struct kern_wmat dummy = {.fmt = KERN_WFMT_FP8_F32_R128, .rows = 1024, .cols = 1024};
	struct kern_linear_args nows = {.n_tokens = 1, .w = &dummy, .act_quant_block = 128};
	T_CHECK(kern_linear_cublaslt(&nows) == ST_INVALID); /* no workspace: refused before any launch */
#endif

	/* Sweep. */
	static const int64_t Ts[] = {1, 2, 3, 5, 7, 16, 17, 100, 129};
	static const int64_t ins[] = {512, 1024, 1536, 4096};
	static const int64_t outs[] = {16, 144, 1040, 4096};
	int ran = 0, failed = 0;
	for (int i = 0; i < 54; i++) {
		int64_t T = Ts[i % 9], in = ins[(i / 9) % 4], out = outs[gt_rnd(&rng, 0, 3)];
		enum kern_wfmt f = (i & 1) ? KERN_WFMT_FP8_F32_B128 : KERN_WFMT_FP8_E8M0_B128;
		enum kern_dtype xdt = (enum kern_dtype)(kern_rand_u64(&rng) & 1), ydt = (enum kern_dtype)((i >> 1) & 1);
		struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = T, .act_quant_block = 128,
					       .x_dtype = xdt, .y_dtype = ydt};
		struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
		if (!kern_variant_accepts(v, &p, &dev, NULL, why, sizeof why)) {
			T_CHECKF(0, "refused T%lld [%lld, %lld]: %s", (long long)T, (long long)out, (long long)in, why);
			continue;
		}
		failed += !one_case(v, &rng, f, T, in, out, xdt, ydt, i % 3 == 0 ? 1 : 16);
		ran++;
	}
	/* DeepSeek-V4-Flash shapes: wq_a 4096 -> 1024 and wo_b 8192 -> 4096 (T = 1 decode and a prefill chunk). */
	failed += !one_case(v, &rng, KERN_WFMT_FP8_E8M0_B128, 1, 4096, 1024, KERN_DT_BF16, KERN_DT_BF16, 0);
	failed += !one_case(v, &rng, KERN_WFMT_FP8_E8M0_B128, 64, 8192, 4096, KERN_DT_BF16, KERN_DT_F32, 0);
	/* Unaligned y rows with more tokens than one 4 MiB staging chunk holds (256 rows of 4096 f32): 3 chunks. */
	failed += !one_case(v, &rng, KERN_WFMT_FP8_F32_B128, 700, 512, 4096, KERN_DT_F32, KERN_DT_F32, 1);
	fprintf(stderr, "%d sweep cases + 3 fixed cases, %d failed\n", ran, failed);

	/* Selection on the device picks cuBLASLt for every FP8 linear shape of the model, and its self-check passes. */
	static const int64_t model[][2] = {{4096, 1024}, {1024, 32768}, {8192, 4096}, {1024, 16384}, {4096, 4096}};
	for (int i = 0; i < 5; i++) {
		struct kern_linear_shape sh = {.in = model[i][0], .out = model[i][1], .max_tokens = 1024,
					       .act_quant_block = 128, .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
		struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
		int dropped = 0;
		const struct kern_variant *got = gt_select_checked(&kern_op_linear, &p, &dev, i, &dropped);
		T_CHECKF(got == v && dropped == 0, "[%lld -> %lld]: chose %s (%d dropped by self-check)",
			 (long long)model[i][0], (long long)model[i][1], got ? got->name : "nothing", dropped);
	}
#if DSV4_HAVE_CUDA
	kern_linear_cublaslt_release();
#endif
	return test_exit();
}
