/*
 * tests/kernels/test_moe_gemm_gpu.c (suite gpu): every CUDA moe_gemm variant
 * against the CPU reference: MXFP4, NVFP4 and FP8 experts, random expert loads
 * (empty experts included), gathered and in-place rows, act_quant on/off,
 * NaN-filled outputs so unwritten rows fail, plus selection and self-check
 * on the real device. Exits 77 without a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/test.h"

static int64_t rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

static void one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E, int64_t R,
		     int64_t in, int64_t out, int aq, int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct err e = {0};
	struct kern_wmat *w = calloc((size_t)E, sizeof *w), *wp = calloc((size_t)E, sizeof *wp);
	for (int64_t x = 0; x < E; x++) {
		T_CHECK(kern_wmat_make_random(&w[x], fmt, out, in, rng, &e) == ST_OK);
		T_CHECK(kern_prepare_weight(v, &w[x], &wp[x], &e) == ST_OK);
	}
	int32_t *off = calloc((size_t)E + 1, sizeof *off);
	int64_t left = R;
	for (int64_t x = 0; x < E; x++) {
		int64_t c = x + 1 == E ? left : (kern_rand_u64(rng) % 3 == 0 ? 0 : rnd(rng, 0, left));
		off[x + 1] = off[x] + (int32_t)c;
		left -= c;
	}
	int64_t X = gather ? rnd(rng, 1, 9) : (R ? R : 1);
	int32_t *src = gather ? malloc(sizeof(int32_t) * (size_t)(R + 1)) : NULL;
	for (int64_t r = 0; gather && r < R; r++)
		src[r] = (int32_t)rnd(rng, 0, X - 1);
	void *xb = malloc((size_t)(X * in) * 4);
	float *yr = malloc((size_t)(R * out) * 4 + 4), *yf = malloc((size_t)(R * out) * 4 + 4);
	void *yg = malloc((size_t)(R * out) * 4 + 4);
	for (int64_t i = 0; i < X * in; i++)
		kern_store_f32(xb, xdt, i, kern_rand_f32(rng) * 3.0f);
	for (int64_t i = 0; i < R * out; i++)
		kern_store_f32(yg, ydt, i, NAN);
	struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				       .w = w, .act_quant_block = aq};
	T_CHECK(kern_moe_gemm_ref(&a) == ST_OK);
	a.w = wp;
	a.y = yg;
	a.y_dtype = ydt;
	enum status st = ((kern_moe_gemm_fn)v->run_host)(&a);
	T_CHECKF(st == ST_OK, "%s: %s", v->name, status_str(st));
	for (int64_t i = 0; i < R * out; i++)
		yf[i] = kern_load_f32(yg, ydt, i);
	char why[KERN_REASON_BYTES];
	T_CHECKF(kern_compare_f32(yr, yf, (size_t)(R * out), 1e-6, ydt == KERN_DT_BF16 ? 1e-2 : 1e-4, why,
				  sizeof why),
		 "%s %s E%lld R%lld in%lld out%lld aq%d gather%d: %s", v->name, kern_wfmt_name(fmt), (long long)E,
		 (long long)R, (long long)in, (long long)out, aq, gather, why);
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
	uint64_t rng = (uint64_t)time(NULL) * 0xD1B54A32D192ED03ull;
	fprintf(stderr, "device %s, seed %llu\n", dev.name, (unsigned long long)rng);
	int ran = 0;
	for (int vi = 0; vi < kern_op_moe_gemm.n_variants; vi++) {
		const struct kern_variant *v = &kern_op_moe_gemm.variants[vi];
		if (v->backend != KERN_BACKEND_CUDA || !v->run_host)
			continue;
		for (int i = 0; i < 60; i++) {
			static const enum kern_wfmt fs[] = {KERN_WFMT_MXFP4, KERN_WFMT_NVFP4, KERN_WFMT_FP8_E8M0_B128,
							    KERN_WFMT_FP8_F32_B128, KERN_WFMT_BF16, KERN_WFMT_F32};
			enum kern_wfmt f = fs[i % 6];
			int64_t in = i % 6 >= 2 ? rnd(&rng, 1, 700) : 32 * rnd(&rng, 1, 24);
			int64_t out = rnd(&rng, 1, 300), E = rnd(&rng, 1, 8);
			int64_t R = i == 0 ? 0 : rnd(&rng, 1, 40);
			struct kern_moe_gemm_shape sh = {.in = in, .out = out, .n_experts = E, .max_rows = R};
			struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
			char why[KERN_REASON_BYTES];
			if (!kern_variant_accepts(v, &p, &dev, NULL, why, sizeof why)) {
				fprintf(stderr, "%s refuses: %s\n", v->name, why);
				continue;
			}
			one_case(v, &rng, f, E, R, in, out, (int)(kern_rand_u64(&rng) & 1) * 128,
				 (int)(kern_rand_u64(&rng) & 1), (enum kern_dtype)(kern_rand_u64(&rng) & 1),
				 (enum kern_dtype)(kern_rand_u64(&rng) & 1));
			ran++;
		}
		/* Model-sized: w1 of 8 experts, 4096 -> 2048, 48 routed rows. */
		one_case(v, &rng, KERN_WFMT_MXFP4, 8, 48, 4096, 2048, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
		one_case(v, &rng, KERN_WFMT_NVFP4, 8, 48, 2048, 4096, 128, 0, KERN_DT_BF16, KERN_DT_F32);
	}
	if (!ran)
		return test_skip("no CUDA moe_gemm variant loads on this device");
	struct kern_moe_gemm_shape sh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 384,
					 .act_quant_block = 128};
	struct kern_problem p = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
	struct kern_disabled dis;
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *v = NULL;
	T_CHECKF(kern_select_checked(&kern_op_moe_gemm, &p, &dev, &dis, 3, &v, &e) == ST_OK, "%s", e.msg);
	T_CHECK(v && v->backend == KERN_BACKEND_CUDA && dis.n == 0);
	return test_exit();
}
