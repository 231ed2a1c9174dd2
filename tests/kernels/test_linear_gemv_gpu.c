/*
 * tests/kernels/test_linear_gemv_gpu.c (suite gpu): the portable FP8 decode
 * GEMV (linear_cuda_gemv, kernels/linear/linear_gemv.cu) against the CPU
 * reference on the real device, at the shapes of DeepSeek-V4-Flash's FP8
 * linears.
 *
 * What it checks, and why each part can fail:
 *   - every FP8 linear of the model (wq_a, wq_b, wkv, wo_a per group with its
 *     strided x and y and no act_quant, wo_b, indexer wq_b, shared expert
 *     w1/w3/w2, the MTP e_proj/h_proj), each for EVERY n_tokens 1..64 (odd
 *     ones included: token chunks of 1, 2, 4 and 8 and their tails), with
 *     fresh random weights (E8M0 and f32 block scales in turn) and
 *     activations whose magnitude changes per token and per 128-column block
 *     by 2^±6 (every activation scale differs), x in f32 and bf16, y in f32
 *     and bf16, sometimes with padded rows; one reference of 64 tokens per
 *     shape serves every T (tokens are independent: act_quant is per token);
 *   - outputs poisoned with NaN before each call: every element of the T
 *     rows must be written and agree with the reference, and nothing past
 *     them (row padding, rows >= T) may be written;
 *   - the guard's refusals with their reasons, and selection on the device:
 *     a decode plan (max_tokens 1, 16, 63) picks linear_cuda_gemv (on cc 9.0
 *     above 16 tokens cuBLASLt keeps it) and its self-check passes.
 * Tolerance (relative to max |y_ref|, the existing linear GPU tests'): 2e-3
 * for f32 y, 1e-2 for bf16 y. The activation codes and scales are
 * bit-identical to the reference's and the products exact, so only the
 * summation order differs (about 1e-6 in practice).
 * Exits 77 without CUDA or without a GPU. Seed printed; DSV4_TEST_SEED=<seed>
 * (or argv[1]) repeats a run. Uses the shared helpers of gpu_test_util.h.
 */
#include "tests/kernels/gpu_test_util.h"

#include "kernels/linear/linear_gemv.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

struct shape {
	const char *name;
	int64_t out, in;
	int aq;            /* act_quant_block */
	int64_t ldx, ldy;  /* 0 = dense */
};

/* One shape: reference for 64 tokens, then the GEMV for T = 1 .. 64 on device
 * buffers (run() on gt_stream). Returns failures. */
static int one_shape(const struct kern_variant *v, const struct shape *sh, int idx, uint64_t *rng)
{
	const int64_t TM = 64, in = sh->in, out = sh->out;
	const int64_t ldx = sh->ldx ? sh->ldx : in;
	const enum kern_wfmt fmt = idx & 1 ? KERN_WFMT_FP8_F32_B128 : KERN_WFMT_FP8_E8M0_B128;
	const enum kern_dtype xdt = (enum kern_dtype)(kern_rand_u64(rng) & 1);
	struct kern_wmat w, wp;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, fmt, out, in, rng, &e) == ST_OK);
	T_CHECKF(kern_prepare_weight(v, &w, &wp, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wp.fmt == KERN_WFMT_FP8_F32_B128);
	/* magnitudes 2^±6 per token and 128-column block; NaN in the stride gaps (never read) */
	void *x = gt_x_rand(rng, TM, in, ldx, xdt, 6, 128);
	const size_t xb = (size_t)(TM * ldx) * kern_dtype_bytes(xdt);
	float *yr = gt_malloc((size_t)(TM * out) * sizeof(float));
	struct kern_linear_args a = {.n_tokens = TM, .x = x, .x_dtype = xdt, .ldx = ldx, .y = yr,
				     .y_dtype = KERN_DT_F32, .w = &w, .act_quant_block = sh->aq};
	T_CHECK(kern_linear_ref(&a) == ST_OK);

	const int64_t ldy_max = (sh->ldy ? sh->ldy : out) + 3;
	void *dx = gt_dup(x, xb), *dy = gt_dalloc((size_t)(TM * ldy_max) * sizeof(float));
	struct kern_wmat dwm = wp;
	dwm.data = gt_dup(wp.data, kern_wmat_data_bytes(&wp));
	dwm.scale = gt_dup(wp.scale, kern_wmat_scale_bytes(&wp));
	dwm.owned = NULL;
	int failed = 0;
	for (int64_t T = 1; T <= TM && !failed; T++) {
		const enum kern_dtype ydt = (enum kern_dtype)((T + idx) & 1);
		const int64_t ldy = (sh->ldy ? sh->ldy : out) + (T % 3 == 0 ? 3 : 0);
		void *yg = gt_poisoned(ydt, TM, ldy);
		const size_t ybytes = (size_t)(TM * ldy) * kern_dtype_bytes(ydt);
		T_CHECK(cudaMemcpy(dy, yg, ybytes, cudaMemcpyHostToDevice) == cudaSuccess);
		struct kern_linear_args g = {.n_tokens = T, .x = dx, .x_dtype = xdt, .ldx = ldx, .y = dy, .y_dtype = ydt,
					     .ldy = ldy, .w = &dwm, .act_quant_block = sh->aq, .stream = gt_stream};
		const enum status st = ((kern_linear_fn)v->run)(&g);
		gt_down(yg, dy, ybytes);
		char label[160];
		snprintf(label, sizeof label, "%s [%lld x %lld] %s aq %d T %lld x %s y %s ldx %lld ldy %lld", sh->name,
			 (long long)out, (long long)in, kern_wfmt_name(fmt), sh->aq, (long long)T, xdt ? "bf16" : "f32",
			 ydt ? "bf16" : "f32", (long long)ldx, (long long)ldy);
		bool ok = gt_check_rows(v->name, label, st, yr, yg, ydt, T, out, ldy, ydt == KERN_DT_BF16 ? 1e-2 : 2e-3);
		int64_t stray = 0; /* rows T .. 63: nothing may be written there */
		for (int64_t i = T * ldy; i < TM * ldy; i++)
			stray += !isnan(kern_load_f32(yg, ydt, i));
		T_CHECKF(stray == 0, "%s: %lld elements written in rows >= T", label, (long long)stray);
		failed += !ok || stray;
		free(yg);
	}
	fprintf(stderr, "%-22s [%6lld x %5lld] %-13s aq %3d x %s: T = 1..64 %s\n", sh->name, (long long)out,
		(long long)in, kern_wfmt_name(fmt), sh->aq, xdt ? "bf16" : "f32 ", failed ? "FAILED" : "ok");
	free(x);
	free(yr);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
	return failed;
}

static void expect_refusal(const struct kern_variant *v, const struct kern_device *dev, enum kern_wfmt f,
			   int64_t in, int64_t out, int64_t max_tokens, const char *want)
{
	struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = max_tokens, .act_quant_block = 128,
				       .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(!kern_variant_accepts(v, &p, dev, NULL, why, sizeof why), "accepted [%lld, %lld] max_tokens %lld",
		 (long long)out, (long long)in, (long long)max_tokens);
	gt_contains(why, want);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	const struct kern_variant *v = gt_find(&kern_op_linear, "linear_cuda_gemv");
	T_CHECK(v != NULL && v->run != NULL);
	if (!v || !v->run)
		return test_exit();
	uint64_t rng = gt_seed(argc, argv, &dev);
	gt_stream_create();
	const bool sm90 = dev.cc_major == 9 && dev.cc_minor == 0;

	/* Guards. */
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 4096, 1024, 64, "above the GEMV's 63");
	expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 4096 + 64, 1024, 1, "not a multiple of 128");
	expect_refusal(v, &dev, KERN_WFMT_BF16, 4096, 1024, 1, "weight format bf16");
	expect_refusal(v, &dev, KERN_WFMT_NVFP4, 4096, 1024, 1, "weight format nvfp4");
	if (sm90)
		expect_refusal(v, &dev, KERN_WFMT_FP8_E8M0_B128, 4096, 1024, 17, "cuBLASLt is faster");
	struct kern_wmat unprepared = {.fmt = KERN_WFMT_FP8_E8M0_B128, .rows = 128, .cols = 128, .data = &rng,
				       .scale = &rng};
	struct kern_linear_args bad = {.n_tokens = 1, .w = &unprepared, .act_quant_block = 128};
	T_CHECK(kern_linear_gemv_cuda(&bad) == ST_INVALID); /* E8M0 must be widened by prepare() */
	struct kern_wmat zero = {.fmt = KERN_WFMT_FP8_F32_B128, .rows = 128, .cols = 128, .data = &rng, .scale = &rng};
	struct kern_linear_args none = {.n_tokens = 0, .w = &zero, .act_quant_block = 128};
	T_CHECK(kern_linear_gemv_cuda(&none) == ST_OK); /* n_tokens 0: no launch */

	/* Selection of decode plans on this device, with the self-check. */
	static const int64_t plan_T[] = {1, 16, 63};
	for (int i = 0; i < 3; i++) {
		struct kern_linear_shape sh = {.in = 4096, .out = 1024, .max_tokens = plan_T[i], .act_quant_block = 128,
					       .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
		struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
		int dropped = 0;
		const struct kern_variant *got = gt_select_checked(&kern_op_linear, &p, &dev, 0, &dropped);
		const bool want_gemv = !(sm90 && plan_T[i] > 16);
		if (want_gemv)
			T_CHECKF(got && !strcmp(got->name, v->name),
				 "decode plan of %lld tokens chose %s, expected linear_cuda_gemv", (long long)plan_T[i],
				 got ? got->name : "nothing");
		T_CHECKF(dropped == 0, "max_tokens %lld: %d variant(s) failed their self-check", (long long)plan_T[i],
			 dropped);
	}

	/* DeepSeek-V4-Flash's FP8 linears (hidden 4096, q_lora 1024, 64 heads x 512, o_groups 8 x
	 * o_lora 1024, indexer 64 x 128, shared expert 2048, MTP projections 4096). */
	static const struct shape shapes[] = {
		{"attn.wq_a", 1024, 4096, 128, 0, 0},
		{"attn.wq_b", 32768, 1024, 128, 0, 0},
		{"attn.wkv", 512, 4096, 128, 0, 0},
		{"attn.wo_a (1 group)", 1024, 4096, 0, 32768, 8192},
		{"attn.wo_b", 4096, 8192, 128, 0, 0},
		{"attn.indexer.wq_b", 8192, 1024, 128, 0, 0},
		{"shared_experts.w1/w3", 2048, 4096, 128, 0, 0},
		{"shared_experts.w2", 4096, 2048, 128, 0, 0},
		{"mtp e_proj/h_proj", 4096, 4096, 128, 0, 0},
	};
	int failed = 0;
	for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
		failed += one_shape(v, &shapes[s], s, &rng);
	/* Small and ragged: out not a multiple of 4 or 128, in one scale block, act_quant 0 and 128. */
	static const struct shape small[] = {
		{"small 131x128", 131, 128, 128, 0, 0},
		{"small 3x640", 3, 640, 0, 0, 0},
		{"small 257x1152", 257, 1152, 128, 1200, 260},
	};
	for (int s = 0; s < 3; s++)
		failed += one_shape(v, &small[s], s, &rng);
	fprintf(stderr, "%d shape(s) failed\n", failed);
	gt_dfree_all();
	return test_exit();
}

#else

int main(void)
{
	return test_skip("built without CUDA");
}

#endif
