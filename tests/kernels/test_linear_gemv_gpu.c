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
 * Exits 77 without CUDA or without a GPU. Seed printed (time-based).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_gemv.h"
#include "tests/test.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

static const struct kern_variant *find(const char *name)
{
	for (int i = 0; i < kern_op_linear.n_variants; i++)
		if (!strcmp(kern_op_linear.variants[i].name, name))
			return &kern_op_linear.variants[i];
	return NULL;
}

static void *dev_alloc(size_t n)
{
	void *d = NULL;
	return cudaMalloc(&d, n ? n : 1) == cudaSuccess ? d : NULL;
}

struct shape {
	const char *name;
	int64_t out, in;
	int aq;            /* act_quant_block */
	int64_t ldx, ldy;  /* 0 = dense */
};

/* One shape: reference for 64 tokens, then the GEMV for T = 1 .. 64. Returns failures. */
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
	const size_t xb = (size_t)((TM - 1) * ldx + in) * kern_dtype_bytes(xdt);
	void *x = malloc(xb);
	float *yr = malloc((size_t)(TM * out) * sizeof(float));
	float *yf = malloc((size_t)(TM * out) * sizeof(float));
	const int64_t ldy_max = (sh->ldy ? sh->ldy : out) + 3;
	const size_t yb = (size_t)(TM * ldy_max) * sizeof(float);
	void *yg = malloc(yb);
	for (size_t i = 0; i < xb / kern_dtype_bytes(xdt); i++)
		kern_store_f32(x, xdt, (int64_t)i, NAN); /* the stride gaps: never read */
	for (int64_t t = 0; t < TM; t++)
		for (int64_t b = 0; b < in / 128; b++) {
			const float mag = ldexpf(1.0f, (int)(kern_rand_u64(rng) % 13) - 6);
			for (int64_t k = b * 128; k < b * 128 + 128; k++)
				kern_store_f32(x, xdt, t * ldx + k, kern_rand_f32(rng) * mag);
		}
	struct kern_linear_args a = {.n_tokens = TM, .x = x, .x_dtype = xdt, .ldx = ldx, .y = yr,
				     .y_dtype = KERN_DT_F32, .w = &w, .act_quant_block = sh->aq};
	T_CHECK(kern_linear_ref(&a) == ST_OK);

	void *dx = dev_alloc(xb), *dy = dev_alloc(yb);
	void *dw = dev_alloc(kern_wmat_data_bytes(&wp)), *ds = dev_alloc(kern_wmat_scale_bytes(&wp));
	int failed = 0;
	if (!dx || !dy || !dw || !ds || cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice) ||
	    cudaMemcpy(dw, wp.data, kern_wmat_data_bytes(&wp), cudaMemcpyHostToDevice) ||
	    cudaMemcpy(ds, wp.scale, kern_wmat_scale_bytes(&wp), cudaMemcpyHostToDevice)) {
		T_CHECKF(0, "%s: device buffers", sh->name);
		failed++;
	}
	struct kern_wmat dwm = wp;
	dwm.data = dw;
	dwm.scale = ds;
	dwm.owned = NULL;
	for (int64_t T = 1; T <= TM && !failed; T++) {
		const enum kern_dtype ydt = (enum kern_dtype)((T + idx) & 1);
		const int64_t ldy = (sh->ldy ? sh->ldy : out) + (T % 3 == 0 ? 3 : 0);
		for (int64_t i = 0; i < TM * ldy; i++)
			kern_store_f32(yg, ydt, i, NAN);
		const size_t ybytes = (size_t)(TM * ldy) * kern_dtype_bytes(ydt);
		struct kern_linear_args g = {.n_tokens = T, .x = dx, .x_dtype = xdt, .ldx = ldx, .y = dy, .y_dtype = ydt,
					     .ldy = ldy, .w = &dwm, .act_quant_block = sh->aq};
		enum status st = ST_CUDA;
		if (cudaMemcpy(dy, yg, ybytes, cudaMemcpyHostToDevice) == cudaSuccess)
			st = ((kern_linear_fn)v->run)(&g);
		if (st == ST_OK && (cudaDeviceSynchronize() != cudaSuccess ||
				    cudaMemcpy(yg, dy, ybytes, cudaMemcpyDeviceToHost) != cudaSuccess))
			st = ST_CUDA;
		T_CHECKF(st == ST_OK, "%s T%lld: run: %s", sh->name, (long long)T, status_str(st));
		if (st) {
			failed++;
			break;
		}
		int stray = 0;
		for (int64_t t = 0; t < TM; t++)
			for (int64_t o = 0; o < ldy; o++) {
				const float val = kern_load_f32(yg, ydt, t * ldy + o);
				if (t < T && o < out)
					yf[t * out + o] = val;
				else
					stray += !isnan(val);
			}
		char why[KERN_REASON_BYTES];
		const bool ok = kern_compare_f32(yr, yf, (size_t)(T * out), 1e-6, ydt == KERN_DT_BF16 ? 1e-2 : 2e-3, why,
						 sizeof why);
		T_CHECKF(ok, "%s [%lld x %lld] %s aq %d T %lld x %s y %s ldx %lld ldy %lld: %s", sh->name, (long long)out,
			 (long long)in, kern_wfmt_name(fmt), sh->aq, (long long)T, xdt ? "bf16" : "f32",
			 ydt ? "bf16" : "f32", (long long)ldx, (long long)ldy, why);
		T_CHECKF(stray == 0, "%s T %lld: %d elements written outside the T x out output", sh->name, (long long)T,
			 stray);
		failed += !ok || stray;
	}
	fprintf(stderr, "%-22s [%6lld x %5lld] %-13s aq %3d x %s: T = 1..64 %s\n", sh->name, (long long)out,
		(long long)in, kern_wfmt_name(fmt), sh->aq, xdt ? "bf16" : "f32 ", failed ? "FAILED" : "ok");
	cudaFree(dx);
	cudaFree(dy);
	cudaFree(dw);
	cudaFree(ds);
	free(x);
	free(yr);
	free(yf);
	free(yg);
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
	contains(why, want);
}

int main(void)
{
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	struct kern_device dev;
	struct err e = {0};
	if (kern_device_detect(0, &dev, &e) != ST_OK)
		return test_skip(e.msg);
	const struct kern_variant *v = find("linear_cuda_gemv");
	T_CHECK(v != NULL && v->run != NULL);
	if (!v || !v->run)
		return test_exit();
	uint64_t rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)clock();
	fprintf(stderr, "device %s (cc %d.%d, %d SMs), seed %llu\n", dev.name, dev.cc_major, dev.cc_minor, dev.sm_count,
		(unsigned long long)rng);
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
		struct kern_disabled dis;
		T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
		const struct kern_variant *got = NULL;
		enum status st = kern_select_checked(&kern_op_linear, &p, &dev, &dis, 0, &got, &e);
		T_CHECKF(st == ST_OK, "select max_tokens %lld: %s", (long long)plan_T[i], e.msg);
		const bool want_gemv = !(sm90 && plan_T[i] > 16);
		if (st == ST_OK && want_gemv)
			T_CHECKF(got == v, "decode plan of %lld tokens chose %s, expected linear_cuda_gemv",
				 (long long)plan_T[i], got ? got->name : "nothing");
		T_CHECKF(!kern_disabled_has(&dis, "linear_cuda_gemv"), "linear_cuda_gemv failed its self-check");
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
	return test_exit();
}

#else

int main(void)
{
	return test_skip("built without CUDA");
}

#endif
