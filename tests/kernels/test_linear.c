/*
 * tests/kernels/test_linear.c: the CPU reference linear (kern_linear_ref)
 * against a naive dequantize-then-matmul in double, on fresh random data and
 * random shapes (most not multiples of 128), every weight format, f32/bf16
 * activations, strides, and with the reference's act_quant on and off.
 */
#include <time.h>

#include "kernels/kernels.h"
#include "tests/kernels/gemm_naive.h"
#include "tests/test.h"

/* Arrays as plain pointers (T_STR_CONTAINS tests for NULL). */
static const char *str_(const char *s) { return s; }

static int64_t rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

static void one_case(uint64_t *rng, enum kern_wfmt fmt, int64_t T, int64_t in, int64_t out, int aq,
		     enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct kern_wmat w;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, fmt, out, in, rng, &e) == ST_OK);
	int64_t ldx = in + rnd(rng, 0, 5), ldy = out + rnd(rng, 0, 3);
	void *x = malloc((size_t)(T * ldx) * 4 + 4);
	void *y = malloc((size_t)(T * ldy) * 4 + 4);
	float *xf = malloc((size_t)(T * in) * 4 + 4);
	for (int64_t i = 0; i < T * ldx; i++)
		kern_store_f32(x, xdt, i, kern_rand_f32(rng) * 4.0f);
	for (int64_t i = 0; i < T * ldy; i++)
		kern_store_f32(y, ydt, i, 1024.0f);
	for (int64_t t = 0; t < T; t++)
		for (int64_t k = 0; k < in; k++)
			xf[t * in + k] = kern_load_f32(x, xdt, t * ldx + k);
	if (aq)
		kern_act_quant_fp8_sim(xf, T, in, in, 128);
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = xdt, .ldx = ldx, .y = y, .y_dtype = ydt,
				     .ldy = ldy, .w = &w, .act_quant_block = aq};
	T_CHECK(kern_linear_ref(&a) == ST_OK);
	double *wd = naive_dequant(&w);
	int bad = 0;
	for (int64_t t = 0; t < T; t++) {
		for (int64_t o = 0; o < out; o++) {
			double acc = 0, mag = 0;
			for (int64_t k = 0; k < in; k++) {
				acc += xf[t * in + k] * wd[o * in + k];
				mag += fabs(xf[t * in + k] * wd[o * in + k]);
			}
			double got = kern_load_f32(y, ydt, t * ldy + o);
			double tol = 1e-5 * mag + 1e-30 + (ydt == KERN_DT_BF16 ? fabs(acc) * 0x1p-8 : 0);
			if (!(fabs(got - acc) <= tol)) {
				if (bad++ < 3)
					fprintf(stderr, "%s T%lld in%lld out%lld aq%d: y[%lld,%lld] %.9g vs %.9g\n",
						kern_wfmt_name(fmt), (long long)T, (long long)in, (long long)out, aq,
						(long long)t, (long long)o, got, acc);
			}
		}
		for (int64_t o = out; o < ldy; o++)
			bad += kern_load_f32(y, ydt, t * ldy + o) != 1024.0f; /* padding untouched */
	}
	T_CHECKF(bad == 0, "%s: %d outputs wrong", kern_wfmt_name(fmt), bad);
	free(wd);
	free(x);
	free(y);
	free(xf);
	kern_wmat_release(&w);
}

static void test_errors(uint64_t *rng)
{
	struct kern_wmat w;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, 10, 20, rng, &e) == ST_OK);
	float x[40], y[20];
	struct kern_linear_args a = {.n_tokens = 2, .x = x, .y = y, .w = &w, .act_quant_block = 64};
	T_CHECK(kern_linear_args_check(&a, &e) == ST_INVALID);
	T_STR_CONTAINS(str_(e.msg), "act_quant_block");
	a.act_quant_block = 0;
	a.ldx = 5;
	T_CHECK(kern_linear_ref(&a) == ST_INVALID);
	a.ldx = 0;
	a.w = NULL;
	T_CHECK(kern_linear_ref(&a) == ST_INVALID);
	/* An empty batch is a valid no-op, even without buffers. */
	struct kern_linear_args z = {.n_tokens = 0, .w = &w};
	T_CHECK(kern_linear_ref(&z) == ST_OK);
	kern_wmat_release(&w);
}

/* Shards and fused rows decode to exactly the corresponding parts. */
static void check_rows_equal(const struct kern_wmat *part, int64_t pr, const struct kern_wmat *whole, int64_t wr,
			     int64_t c0, int *bad)
{
	float *a = malloc(sizeof(float) * (size_t)part->cols), *b = malloc(sizeof(float) * (size_t)whole->cols);
	kern_wmat_decode_row(part, pr, a);
	kern_wmat_decode_row(whole, wr, b);
	*bad += memcmp(a, b + c0, sizeof(float) * (size_t)part->cols) != 0;
	free(a);
	free(b);
}

static void test_shards(uint64_t *rng)
{
	static const enum kern_wfmt fmts[] = {KERN_WFMT_BF16, KERN_WFMT_FP8_E8M0_B128, KERN_WFMT_FP8_F32_B128,
					      KERN_WFMT_MXFP4, KERN_WFMT_NVFP4};
	struct err e = {0};
	for (int i = 0; i < 5; i++) {
		struct kern_wmat m, s, v, b, c;
		T_CHECK(kern_wmat_make_random(&m, fmts[i], 300, 416, rng, &e) == ST_OK);
		/* Column shard (row-parallel TP) to the ragged end: a copy. */
		T_CHECK(kern_wmat_slice(&m, 128, 300, 128, 416, &s, &e) == ST_OK);
		T_CHECK(s.owned && s.rows == 172 && s.cols == 288);
		int bad = 0;
		for (int64_t r = 0; r < s.rows; r += 7)
			check_rows_equal(&s, r, &m, 128 + r, 128, &bad);
		/* Row shard (column-parallel TP): a view. */
		T_CHECK(kern_wmat_slice(&m, 256, 300, 0, 416, &v, &e) == ST_OK);
		T_CHECK(!v.owned && v.rows == 44);
		for (int64_t r = 0; r < v.rows; r += 5)
			check_rows_equal(&v, r, &m, 256 + r, 0, &bad);
		/* Fused rows: m[0:256] then another matrix. */
		struct kern_wmat top;
		T_CHECK(kern_wmat_slice(&m, 0, 256, 0, 416, &top, &e) == ST_OK);
		T_CHECK(kern_wmat_make_random(&b, fmts[i], 100, 416, rng, &e) == ST_OK);
		if (fmts[i] == KERN_WFMT_NVFP4)
			b.global_scale = top.global_scale;
		T_CHECK(kern_wmat_concat_rows(&top, &b, &c, &e) == ST_OK);
		T_CHECK(c.rows == 356);
		for (int64_t r = 0; r < 256; r += 9)
			check_rows_equal(&c, r, &m, r, 0, &bad);
		for (int64_t r = 0; r < 100; r += 3)
			check_rows_equal(&c, 256 + r, &b, r, 0, &bad);
		T_CHECKF(bad == 0, "%s: %d shard rows differ", kern_wfmt_name(fmts[i]), bad);
		/* Misaligned shards are refused. */
		if (fmts[i] != KERN_WFMT_BF16) {
			T_CHECK(kern_wmat_slice(&m, 0, 300, 8, 416, &v, &e) == ST_INVALID);
			T_CHECK(kern_wmat_slice(&m, 1, 300, 0, 416, &v, &e) ==
				(kern_wfmt_block_rows(fmts[i]) > 1 ? ST_INVALID : ST_OK));
		}
		kern_wmat_release(&c);
		kern_wmat_release(&b);
		kern_wmat_release(&s);
		kern_wmat_release(&m);
	}
}

int main(void)
{
	uint64_t rng = test_seed() * 0x2545F4914F6CDD1Dull;
	static const enum kern_wfmt fmts[] = {KERN_WFMT_F32, KERN_WFMT_BF16, KERN_WFMT_FP8_E8M0_B128,
					      KERN_WFMT_FP8_F32_B128, KERN_WFMT_MXFP4, KERN_WFMT_NVFP4};
	/* Fixed edge shapes, then random ones. */
	one_case(&rng, KERN_WFMT_FP8_E8M0_B128, 1, 1, 1, 0, KERN_DT_F32, KERN_DT_F32);
	one_case(&rng, KERN_WFMT_FP8_E8M0_B128, 3, 128, 128, 128, KERN_DT_BF16, KERN_DT_F32);
	one_case(&rng, KERN_WFMT_FP8_E8M0_B128, 2, 129, 257, 128, KERN_DT_F32, KERN_DT_BF16);
	one_case(&rng, KERN_WFMT_FP8_F32_B128, 0, 300, 10, 128, KERN_DT_F32, KERN_DT_F32);
	for (int i = 0; i < 40; i++) {
		enum kern_wfmt f = fmts[kern_rand_u64(&rng) % 6];
		int64_t in = rnd(&rng, 1, 700);
		if (f == KERN_WFMT_MXFP4 || f == KERN_WFMT_NVFP4)
			in = 32 * rnd(&rng, 1, 20);
		one_case(&rng, f, rnd(&rng, 0, 9), in, rnd(&rng, 1, 300), (int)(kern_rand_u64(&rng) & 1) * 128,
			 (enum kern_dtype)(kern_rand_u64(&rng) & 1), (enum kern_dtype)(kern_rand_u64(&rng) & 1));
	}
	test_errors(&rng);
	test_shards(&rng);
	return test_exit();
}
