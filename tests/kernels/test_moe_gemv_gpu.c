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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/moe_gemm/moe_gemv.h"
#include "tests/test.h"

static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

static int64_t rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

/* E experts with counts[] rows each. */
static int one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E, const int64_t *counts,
		    int64_t in, int64_t out, int aq, int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct err e = {0};
	struct kern_wmat *w = calloc((size_t)E, sizeof *w), *wp = calloc((size_t)E, sizeof *wp);
	for (int64_t x = 0; x < E; x++) {
		T_CHECK(kern_wmat_make_random(&w[x], fmt, out, in, rng, &e) == ST_OK);
		T_CHECK(kern_prepare_weight(v, &w[x], &wp[x], &e) == ST_OK);
	}
	int32_t *off = calloc((size_t)E + 1, sizeof *off);
	for (int64_t x = 0; x < E; x++)
		off[x + 1] = off[x] + (int32_t)counts[x];
	const int64_t R = off[E];
	int64_t X = gather ? rnd(rng, 1, 9) : (R ? R : 1);
	int32_t *src = gather ? malloc(sizeof(int32_t) * (size_t)(R + 1)) : NULL;
	for (int64_t r = 0; gather && r < R; r++)
		src[r] = (int32_t)rnd(rng, 0, X - 1);
	void *xb = malloc((size_t)(X * in) * 4);
	float *yr = malloc((size_t)(R * out) * 4 + 4), *yf = malloc((size_t)(R * out) * 4 + 4);
	void *yg = malloc((size_t)(R * out) * 4 + 4);
	for (int64_t i = 0; i < X * in; i++)
		kern_store_f32(xb, xdt, i, kern_rand_f32(rng) * ldexpf(1.0f, (int)rnd(rng, -4, 4)));
	for (int64_t i = 0; i < R * out; i++)
		kern_store_f32(yg, ydt, i, NAN);
	struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				       .w = w, .act_quant_block = aq};
	char ename[112];
	snprintf(ename, sizeof ename, "%s E%lld R%lld in%lld out%lld aq%d gather%d x%s y%s", kern_wfmt_name(fmt),
		 (long long)E, (long long)R, (long long)in, (long long)out, aq, gather, xdt ? "bf16" : "f32",
		 ydt ? "bf16" : "f32");
	enum status rst = kern_moe_gemm_args_check(&a, &e);
	T_CHECKF(rst == ST_OK, "test built arguments outside the contract (%s): %s", ename, e.msg);
	if (rst == ST_OK)
		rst = kern_moe_gemm_ref(&a);
	T_CHECKF(rst == ST_OK, "reference failed (%s): %s", ename, status_str(rst));
	a.w = wp;
	a.y = yg;
	a.y_dtype = ydt;
	enum status st = ((kern_moe_gemm_fn)v->run_host)(&a);
	T_CHECKF(st == ST_OK, "%s (%s): %s", v->name, ename, status_str(st));
	for (int64_t i = 0; i < R * out; i++)
		yf[i] = kern_load_f32(yg, ydt, i);
	char why[KERN_REASON_BYTES] = "";
	bool ok = st == ST_OK &&
		  kern_compare_f32(yr, yf, (size_t)(R * out), 1e-6, ydt == KERN_DT_BF16 ? 1e-2 : 1e-4, why, sizeof why);
	T_CHECKF(st != ST_OK || ok, "%s %s: %s", v->name, ename, why);
	free(xb);
	free(yr);
	free(yf);
	free(yg);
	free(src);
	free(off);
	for (int64_t x = 0; x < E; x++) {
		kern_wmat_release(&wp[x]);
		kern_wmat_release(&w[x]);
	}
	free(w);
	free(wp);
	return ok;
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
	const struct kern_variant *v = NULL;
	for (int i = 0; i < kern_op_moe_gemm.n_variants; i++)
		if (!strcmp(kern_op_moe_gemm.variants[i].name, "moe_gemm_cuda_gemv"))
			v = &kern_op_moe_gemm.variants[i];
	T_CHECK(v != NULL && v->run_host != NULL);
	if (!v || !v->run_host)
		return test_exit();
	uint64_t rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)clock();
	fprintf(stderr, "device %s (cc %d.%d), seed %llu\n", dev.name, dev.cc_major, dev.cc_minor,
		(unsigned long long)rng);

	/* Guards. */
	struct kern_moe_gemm_shape msh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 64,
					  .act_quant_block = 128, .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem mp = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &msh};
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_variant_accepts(v, &mp, &dev, NULL, why, sizeof why), "refused: %s", why);
	struct kern_problem fp8 = mp;
	fp8.wfmt = KERN_WFMT_FP8_E8M0_B128;
	T_CHECK(!kern_variant_accepts(v, &fp8, &dev, NULL, why, sizeof why));
	contains(why, "weight format fp8");
	struct kern_moe_gemm_shape odd = msh;
	odd.in = 4096 + 16;
	struct kern_problem op_odd = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &odd};
	T_CHECK(!kern_variant_accepts(v, &op_odd, &dev, NULL, why, sizeof why));
	contains(why, "multiple of 32");
	struct kern_moe_gemm_shape big = msh;
	big.max_rows = KERN_MOE_GEMV_MAX_ROWS + 1;
	struct kern_problem op_big = {.wfmt = KERN_WFMT_MXFP4, .tp_size = 1, .shape = &big};
	T_CHECK(!kern_variant_accepts(v, &op_big, &dev, NULL, why, sizeof why));
	contains(why, "max_rows 65");
	struct kern_moe_gemm_shape f32x = msh;
	f32x.x_dtype = KERN_DT_F32;
	f32x.act_quant_block = 0;
	struct kern_problem op_f32 = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &f32x};
	T_CHECK(!kern_variant_accepts(v, &op_f32, &dev, NULL, why, sizeof why));
	contains(why, "without act_quant");
	f32x.act_quant_block = 128;
	T_CHECKF(kern_variant_accepts(v, &op_f32, &dev, NULL, why, sizeof why), "refused: %s", why);
	struct kern_moe_gemm_shape wide = msh;
	wide.in = 32 * ((int64_t)dev.smem_optin_bytes / 32); /* one staged bf16 row is twice that */
	struct kern_problem op_wide = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &wide};
	T_CHECK(!kern_variant_accepts(v, &op_wide, &dev, NULL, why, sizeof why));
	contains(why, "shared memory");

	/* Sweep: decode loads (0..8 rows per expert). */
	static const int64_t ins[] = {32, 64, 96, 288, 1056, 2048, 4096};
	static const int64_t outs[] = {1, 7, 16, 17, 200, 2048};
	int ran = 0, failed = 0;
	for (int i = 0; i < 48; i++) {
		enum kern_wfmt f = (i & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4;
		int64_t E = rnd(&rng, 1, 9), counts[9];
		for (int64_t x = 0; x < E; x++)
			counts[x] = kern_rand_u64(&rng) % 4 == 0 ? 0 : rnd(&rng, 1, 8);
		if (i % 8 == 0) /* the batch-1 case: one expert, one row */
			E = 1, counts[0] = 1;
		if (i % 8 == 4) /* chunking: one expert above 8 rows */
			counts[0] = rnd(&rng, 9, 20);
		int64_t in = ins[rnd(&rng, 0, 6)], out = outs[rnd(&rng, 0, 5)];
		if (in * out > 4096 * 256 && E > 3)
			E = 3;
		int aq = (int)((i >> 1) & 1) * 128;
		enum kern_dtype xdt = (enum kern_dtype)((i >> 2) & 1), ydt = (enum kern_dtype)(kern_rand_u64(&rng) & 1);
		if (xdt != KERN_DT_BF16 && !aq) /* f32 x needs act_quant (the guard refuses it otherwise) */
			aq = 128;
		failed += !one_case(v, &rng, f, E, counts, in, out, aq, (int)(kern_rand_u64(&rng) & 1), xdt, ydt);
		ran++;
	}
	/* Model shapes: w1 4096 -> 2048 and w2 2048 -> 4096, 6 routed experts x 1 row (batch 1) and x 8 rows. */
	static const int64_t six1[6] = {1, 1, 1, 1, 1, 1}, six8[6] = {8, 8, 8, 8, 8, 8};
	failed += !one_case(v, &rng, KERN_WFMT_NVFP4, 6, six1, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
	failed += !one_case(v, &rng, KERN_WFMT_MXFP4, 6, six1, 2048, 4096, 128, 0, KERN_DT_BF16, KERN_DT_F32);
	failed += !one_case(v, &rng, KERN_WFMT_NVFP4, 6, six8, 2048, 4096, 128, 0, KERN_DT_F32, KERN_DT_F32);
	failed += !one_case(v, &rng, KERN_WFMT_MXFP4, 6, six8, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_F32);
	/* Above KERN_MOE_GEMV_MAX_ROWS: run() still computes every row (8-row chunks). */
	static const int64_t many[3] = {40, 0, 60};
	failed += !one_case(v, &rng, KERN_WFMT_NVFP4, 3, many, 1024, 200, 128, 1, KERN_DT_BF16, KERN_DT_F32);
	fprintf(stderr, "%d sweep cases + 5 model/fallback shapes, %d failed\n", ran, failed);

	/* Selection on the device: a decode plan (max_rows 64) gets the GEMV, self-check passing. */
	static const int64_t model[][2] = {{4096, 2048}, {2048, 4096}};
	for (int i = 0; i < 2; i++)
		for (int f = 0; f < 2; f++) {
			struct kern_moe_gemm_shape sh = {.in = model[i][0], .out = model[i][1], .n_experts = 256,
							 .max_rows = 64, .act_quant_block = 128,
							 .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
			struct kern_problem p = {.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
			struct kern_disabled dis;
			T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
			const struct kern_variant *got = NULL;
			T_CHECKF(kern_select_checked(&kern_op_moe_gemm, &p, &dev, &dis, 3, &got, &e) == ST_OK, "%s", e.msg);
			T_CHECKF(got == v && dis.n == 0, "[%lld -> %lld] %s: chose %s (%d dropped by self-check)",
				 (long long)model[i][0], (long long)model[i][1], kern_wfmt_name(p.wfmt),
				 got ? got->name : "nothing", dis.n);
		}
	return test_exit();
}
