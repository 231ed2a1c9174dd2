/*
 * tests/kernels/test_linear_gpu.c (suite gpu): every CUDA linear variant
 * against the CPU reference on fresh random inputs over a shape sweep (edge
 * sizes, tails that are not multiples of 128, an empty batch), with outputs
 * pre-filled with NaN so that an unwritten element fails, and the registry's
 * selection plus self-check on the real device. Exits 77 without a GPU.
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

static void one_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t T, int64_t in,
		     int64_t out, int aq, enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct kern_wmat w, wp;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, fmt, out, in, rng, &e) == ST_OK);
	T_CHECK(kern_prepare_weight(v, &w, &wp, &e) == ST_OK);
	int64_t ldy = out + 1;
	void *x = malloc((size_t)(T * in) * 4 + 4);
	float *yr = malloc((size_t)(T * out) * 4 + 4);
	void *yg = malloc((size_t)(T * ldy) * 4 + 4);
	float *yf = malloc((size_t)(T * out) * 4 + 4);
	for (int64_t i = 0; i < T * in; i++)
		kern_store_f32(x, xdt, i, kern_rand_f32(rng) * 8.0f);
	for (int64_t i = 0; i < T * ldy; i++)
		kern_store_f32(yg, ydt, i, NAN);
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				     .w = &w, .act_quant_block = aq};
	T_CHECK(kern_linear_ref(&a) == ST_OK);
	a.w = &wp;
	a.y = yg;
	a.y_dtype = ydt;
	a.ldy = ldy;
	enum status st = ((kern_linear_fn)v->run_host)(&a);
	T_CHECKF(st == ST_OK, "%s: %s", v->name, status_str(st));
	int pad_written = 0;
	for (int64_t t = 0; t < T; t++) {
		for (int64_t o = 0; o < out; o++)
			yf[t * out + o] = kern_load_f32(yg, ydt, t * ldy + o);
		pad_written += !isnan(kern_load_f32(yg, ydt, t * ldy + out));
	}
	char why[KERN_REASON_BYTES];
	T_CHECKF(kern_compare_f32(yr, yf, (size_t)(T * out), 1e-6, ydt == KERN_DT_BF16 ? 1e-2 : 1e-4, why,
				  sizeof why),
		 "%s %s T%lld in%lld out%lld aq%d: %s", v->name, kern_wfmt_name(fmt), (long long)T, (long long)in,
		 (long long)out, aq, why);
	T_CHECKF(pad_written == 0, "%s wrote past out into the row padding", v->name);
	free(x);
	free(yr);
	free(yg);
	free(yf);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
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
	uint64_t rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
	fprintf(stderr, "device %s, seed %llu\n", dev.name, (unsigned long long)rng);
	int ran = 0;
	for (int vi = 0; vi < kern_op_linear.n_variants; vi++) {
		const struct kern_variant *v = &kern_op_linear.variants[vi];
		if (v->backend != KERN_BACKEND_CUDA || !v->run_host)
			continue;
		static const int64_t Ts[] = {0, 1, 5, 16, 17, 40};
		static const int64_t ins[] = {1, 100, 128, 129, 300, 1000};
		static const int64_t outs[] = {1, 63, 64, 65, 130, 1000};
		for (int i = 0; i < 36; i++) {
			static const enum kern_wfmt fs[] = {KERN_WFMT_FP8_E8M0_B128, KERN_WFMT_FP8_F32_B128,
							    KERN_WFMT_BF16, KERN_WFMT_F32};
			enum kern_wfmt f = fs[(i + vi) % 4];
			int64_t in = ins[i % 6], out = outs[(i / 6) % 6], T = Ts[rnd(&rng, 0, 5)];
			struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = T, .act_quant_block = 128};
			struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
			char why[KERN_REASON_BYTES];
			if (!kern_variant_accepts(v, &p, &dev, NULL, why, sizeof why)) {
				fprintf(stderr, "%s refuses [%lld, %lld]: %s\n", v->name, (long long)out, (long long)in, why);
				continue;
			}
			one_case(v, &rng, f, T, in, out, (int)(kern_rand_u64(&rng) & 1) * 128,
				 (enum kern_dtype)(kern_rand_u64(&rng) & 1), (enum kern_dtype)(kern_rand_u64(&rng) & 1));
			ran++;
		}
		/* One model-sized layer: 1024 -> 4096 (wq_b-like), in a format this variant takes. */
		struct kern_linear_shape big = {.in = 1024, .out = 4096, .max_tokens = 7};
		static const enum kern_wfmt bf[] = {KERN_WFMT_FP8_E8M0_B128, KERN_WFMT_BF16};
		for (int j = 0; j < 2; j++) {
			struct kern_problem bp = {.wfmt = bf[j], .tp_size = 1, .shape = &big};
			if (kern_variant_accepts(v, &bp, &dev, NULL, NULL, 0))
				one_case(v, &rng, bf[j], 7, 1024, 4096, j ? 0 : 128, KERN_DT_BF16, KERN_DT_BF16);
		}
	}
	if (!ran)
		return test_skip("no CUDA linear variant loads on this device");
	/* Selection on the real device picks a CUDA variant and its self-check passes. */
	struct kern_linear_shape sh = {.in = 4096, .out = 1000, .max_tokens = 64, .act_quant_block = 128};
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
	struct kern_disabled dis;
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *v = NULL;
	T_CHECKF(kern_select_checked(&kern_op_linear, &p, &dev, &dis, 0, &v, &e) == ST_OK, "%s", e.msg);
	T_CHECK(v && v->backend == KERN_BACKEND_CUDA && dis.n == 0);
	return test_exit();
}
