/*
 * tests/kernels/test_linear_gpu2.c (suite gpu): the cuBLASLt FP8 linear
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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_cublaslt.h"
#include "tests/test.h"

/* T_STR_CONTAINS on a char array trips -Waddress; take a pointer. */
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

static int64_t rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

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
	void *x = malloc((size_t)(T * in) * 4 + 4);
	float *yr = malloc((size_t)(T * out) * 4 + 4);
	void *yg = malloc((size_t)(T * ldy) * 4 + 4);
	float *yf = malloc((size_t)(T * out) * 4 + 4);
	for (int64_t t = 0; t < T; t++)
		for (int64_t b = 0; b < in / 128; b++) {
			const float mag = ldexpf(1.0f, (int)rnd(rng, -6, 6));
			for (int64_t k = b * 128; k < b * 128 + 128; k++)
				kern_store_f32(x, xdt, t * in + k, kern_rand_f32(rng) * mag);
		}
	for (int64_t i = 0; i < T * ldy; i++)
		kern_store_f32(yg, ydt, i, NAN);
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				     .w = &w, .act_quant_block = 128};
	T_CHECK(kern_linear_ref(&a) == ST_OK);
	a.w = &wp;
	a.y = yg;
	a.y_dtype = ydt;
	a.ldy = ldy;
	enum status st = ((kern_linear_fn)v->run_host)(&a);
	T_CHECKF(st == ST_OK, "%s T%lld in%lld out%lld: %s", v->name, (long long)T, (long long)in, (long long)out,
		 status_str(st));
	int pad_written = 0;
	for (int64_t t = 0; t < T; t++) {
		for (int64_t o = 0; o < out; o++)
			yf[t * out + o] = kern_load_f32(yg, ydt, t * ldy + o);
		for (int64_t o = out; o < ldy; o++)
			pad_written += !isnan(kern_load_f32(yg, ydt, t * ldy + o));
	}
	char why[KERN_REASON_BYTES];
	bool ok = st == ST_OK && kern_compare_f32(yr, yf, (size_t)(T * out), 1e-6, ydt == KERN_DT_BF16 ? 1e-2 : 2e-3,
						  why, sizeof why);
	T_CHECKF(st != ST_OK || ok, "%s %s T%lld in%lld out%lld ldy%lld x%s y%s: %s%s", v->name, kern_wfmt_name(fmt),
		 (long long)T, (long long)in, (long long)out, (long long)ldy, xdt ? "bf16" : "f32", ydt ? "bf16" : "f32",
		 why,
		 T > 1 && in > 128 ? " (if only T > 1 cases fail: suspect the B VEC128 activation-scale layout; "
				     "if T = 1 fails too, the weight's; see linear_cublaslt.cu)"
				   : "");
	T_CHECKF(pad_written == 0, "%s wrote %d elements past out into the row padding", v->name, pad_written);
	free(x);
	free(yr);
	free(yg);
	free(yf);
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
	contains(why, want);
}

int main(void)
{
	if (!DSV4_HAVE_CUDA)
		return test_skip("built without CUDA");
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	struct kern_device dev;
	struct err e = {0};
	if (kern_device_detect(0, &dev, &e) != ST_OK)
		return test_skip(e.msg);
	const struct kern_variant *v = find("linear_cublaslt_sm90");
	T_CHECK(v != NULL);
	if (!v)
		return test_exit();
	uint64_t rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)clock();
	fprintf(stderr, "device %s (cc %d.%d), seed %llu\n", dev.name, dev.cc_major, dev.cc_minor,
		(unsigned long long)rng);

	struct kern_linear_shape dsh = {.in = 4096, .out = 1024, .max_tokens = 1024, .act_quant_block = 128,
					.x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem dp = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &dsh};
	if (dev.cc_major * 10 + dev.cc_minor != 90) {
		char why[KERN_REASON_BYTES] = "";
		T_CHECK(!kern_variant_accepts(v, &dp, &dev, NULL, why, sizeof why));
		contains(why, "outside [9.0, 9.0]");
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
		int64_t T = Ts[i % 9], in = ins[(i / 9) % 4], out = outs[rnd(&rng, 0, 3)];
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
		struct kern_disabled dis;
		T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
		const struct kern_variant *got = NULL;
		T_CHECKF(kern_select_checked(&kern_op_linear, &p, &dev, &dis, i, &got, &e) == ST_OK, "%s", e.msg);
		T_CHECKF(got == v && dis.n == 0, "[%lld -> %lld]: chose %s (%d dropped by self-check)",
			 (long long)model[i][0], (long long)model[i][1], got ? got->name : "nothing", dis.n);
	}
#if DSV4_HAVE_CUDA
	kern_linear_cublaslt_release();
#endif
	return test_exit();
}
