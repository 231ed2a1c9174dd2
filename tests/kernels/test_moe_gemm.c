/*
 * tests/kernels/test_moe_gemm.c: the CPU reference expert GEMM
 * (kern_moe_gemm_ref) against a naive per-row dequantize-then-matmul in
 * double: MXFP4, NVFP4 and FP8 experts, random expert counts with empty
 * experts, rows gathered through row_src or taken in place, act_quant on and
 * off, n_rows as an upper bound on the rows, and argument validation.
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

static void one_case(uint64_t *rng, enum kern_wfmt fmt, int64_t E, int64_t R, int64_t in, int64_t out, int aq,
		     int gather, enum kern_dtype xdt, enum kern_dtype ydt)
{
	struct err e = {0};
	struct kern_wmat *w = calloc((size_t)E, sizeof *w);
	double **wd = calloc((size_t)E, sizeof *wd);
	for (int64_t x = 0; x < E; x++) {
		T_CHECK(kern_wmat_make_random(&w[x], fmt, out, in, rng, &e) == ST_OK);
		wd[x] = naive_dequant(&w[x]);
	}
	/* Random sorted expert assignment: counts drawn per expert, some zero. */
	int32_t *off = calloc((size_t)E + 1, sizeof *off);
	int64_t left = R;
	for (int64_t x = 0; x < E; x++) {
		int64_t c = x + 1 == E ? left : (kern_rand_u64(rng) % 3 == 0 ? 0 : rnd(rng, 0, left));
		off[x + 1] = off[x] + (int32_t)c;
		left -= c;
	}
	int64_t X = gather ? rnd(rng, 1, 6) : R;
	int32_t *src = gather ? malloc(sizeof(int32_t) * (size_t)(R + 1)) : NULL;
	for (int64_t r = 0; gather && r < R; r++)
		src[r] = (int32_t)rnd(rng, 0, X - 1);
	int64_t ldx = in + rnd(rng, 0, 4);
	void *xb = malloc((size_t)(X * ldx) * 4 + 4), *y = malloc((size_t)(R * out) * 4 + 4);
	for (int64_t i = 0; i < X * ldx; i++)
		kern_store_f32(xb, xdt, i, kern_rand_f32(rng) * 3.0f);
	for (int64_t i = 0; i < R * out; i++)
		kern_store_f32(y, ydt, i, NAN);
	float *xf = malloc((size_t)(X * in) * 4 + 4);
	for (int64_t t = 0; t < X; t++)
		for (int64_t k = 0; k < in; k++)
			xf[t * in + k] = kern_load_f32(xb, xdt, t * ldx + k);
	if (aq)
		kern_act_quant_fp8_sim(xf, X, in, in, 128);
	struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = xdt, .ldx = ldx, .y = y, .y_dtype = ydt,
				       .w = w, .act_quant_block = aq};
	T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_OK);
	T_CHECK(kern_moe_gemm_ref(&a) == ST_OK);
	int bad = 0;
	for (int64_t x = 0; x < E; x++)
		for (int64_t r = off[x]; r < off[x + 1]; r++) {
			const float *xr = xf + (gather ? src[r] : r) * in;
			for (int64_t o = 0; o < out; o++) {
				double acc = 0, mag = 0;
				for (int64_t k = 0; k < in; k++) {
					acc += xr[k] * wd[x][o * in + k];
					mag += fabs(xr[k] * wd[x][o * in + k]);
				}
				double got = kern_load_f32(y, ydt, r * out + o);
				double tol = 1e-5 * mag + 1e-30 + (ydt == KERN_DT_BF16 ? fabs(acc) * 0x1p-8 : 0);
				if (!(fabs(got - acc) <= tol) && bad++ < 3)
					fprintf(stderr, "%s E%lld R%lld in%lld out%lld: y[%lld,%lld] %.9g vs %.9g\n",
						kern_wfmt_name(fmt), (long long)E, (long long)R, (long long)in,
						(long long)out, (long long)r, (long long)o, got, acc);
			}
		}
	T_CHECKF(bad == 0, "%s: %d outputs wrong", kern_wfmt_name(fmt), bad);

	/* Validation: broken offsets and out-of-range gathers are refused. */
	if (E > 1 && R > 0) {
		int32_t saved = off[1];
		off[1] = off[E] + 1;
		T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_INVALID);
		off[1] = saved;
		if (gather) {
			src[0] = (int32_t)X;
			T_CHECK(kern_moe_gemm_ref(&a) == ST_INVALID);
		}
	}
	free(xb);
	free(y);
	free(xf);
	free(src);
	free(off);
	for (int64_t x = 0; x < E; x++) {
		free(wd[x]);
		kern_wmat_release(&w[x]);
	}
	free(w);
	free(wd);
}

static void test_mixed_experts(uint64_t *rng)
{
	struct kern_wmat w[2];
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w[0], KERN_WFMT_MXFP4, 8, 64, rng, &e) == ST_OK);
	T_CHECK(kern_wmat_make_random(&w[1], KERN_WFMT_NVFP4, 8, 64, rng, &e) == ST_OK);
	int32_t off[3] = {0, 1, 2};
	float x[128], y[16];
	struct kern_moe_gemm_args a = {.n_rows = 2, .n_experts = 2, .expert_offsets = off, .n_x_rows = 2,
				       .x = x, .y = y, .w = w};
	T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_INVALID);
	T_STR_CONTAINS(str_(e.msg), "expert 1");
	/* An MXFP4 matrix whose in is not a multiple of 32 is refused. */
	struct kern_wmat bad = w[0];
	bad.cols = 48;
	T_CHECK(kern_wmat_validate(&bad, "w", &e) == ST_INVALID);
	kern_wmat_release(&w[0]);
	kern_wmat_release(&w[1]);
}

/* n_rows as an upper bound: rows at and past offsets[E] are neither read
 * (row_src there is out of range, x has only the used rows: ASan catches a
 * read) nor written (a sentinel stays), and rows below match the exact-count
 * run bit for bit. */
static void test_upper_bound(uint64_t *rng, int gather)
{
	struct err e = {0};
	enum { E = 3, USED = 5, ROWS = 9, IN = 64, OUT = 7 };
	struct kern_wmat w[E];
	for (int x = 0; x < E; x++)
		T_CHECK(kern_wmat_make_random(&w[x], KERN_WFMT_MXFP4, OUT, IN, rng, &e) == ST_OK);
	int32_t off[E + 1] = {0, 2, 2, USED};
	int32_t src[ROWS] = {0, 2, 1, 0, 2, 1000, -1, 1000, 1000};
	int64_t X = gather ? 3 : USED;
	float *x = malloc(sizeof(float) * (size_t)(X * IN));
	for (int64_t i = 0; i < X * IN; i++)
		x[i] = kern_rand_f32(rng);
	float y[ROWS * OUT], y_exact[USED * OUT];
	for (int i = 0; i < ROWS * OUT; i++)
		y[i] = i < USED * OUT ? NAN : 12345.0f;
	struct kern_moe_gemm_args a = {.n_rows = ROWS, .n_experts = E, .expert_offsets = off,
				       .row_src = gather ? src : NULL, .n_x_rows = X, .x = x, .y = y, .w = w,
				       .act_quant_block = 128};
	T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_OK);
	T_CHECK(kern_moe_gemm_ref(&a) == ST_OK);
	struct kern_moe_gemm_args b = a;
	b.n_rows = USED;
	b.y = y_exact;
	T_CHECK(kern_moe_gemm_ref(&b) == ST_OK);
	T_CHECK(memcmp(y, y_exact, sizeof y_exact) == 0);
	int touched = 0;
	for (int i = USED * OUT; i < ROWS * OUT; i++)
		touched += y[i] != 12345.0f;
	T_CHECKF(touched == 0, "gather %d: %d values past offsets[E] written", gather, touched);
	/* offsets ending past n_rows, and no x rows at all, are refused */
	a.n_rows = USED - 1;
	T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_INVALID);
	a.n_rows = ROWS;
	a.n_x_rows = 0;
	T_CHECK(kern_moe_gemm_args_check(&a, &e) == ST_INVALID);
	free(x);
	for (int i = 0; i < E; i++)
		kern_wmat_release(&w[i]);
}

int main(void)
{
	uint64_t rng = test_seed() * 0xD1B54A32D192ED03ull;
	static const enum kern_wfmt fmts[] = {KERN_WFMT_MXFP4, KERN_WFMT_NVFP4, KERN_WFMT_FP8_E8M0_B128};
	one_case(&rng, KERN_WFMT_MXFP4, 1, 1, 32, 1, 0, 0, KERN_DT_F32, KERN_DT_F32);
	one_case(&rng, KERN_WFMT_NVFP4, 4, 0, 64, 5, 128, 1, KERN_DT_F32, KERN_DT_F32);
	one_case(&rng, KERN_WFMT_MXFP4, 3, 7, 4096 / 8, 33, 128, 1, KERN_DT_BF16, KERN_DT_BF16);
	for (int i = 0; i < 30; i++) {
		enum kern_wfmt f = fmts[kern_rand_u64(&rng) % 3];
		int64_t in = f == KERN_WFMT_FP8_E8M0_B128 ? rnd(&rng, 1, 400) : 32 * rnd(&rng, 1, 12);
		one_case(&rng, f, rnd(&rng, 1, 6), rnd(&rng, 0, 12), in, rnd(&rng, 1, 150),
			 (int)(kern_rand_u64(&rng) & 1) * 128, (int)(kern_rand_u64(&rng) & 1),
			 (enum kern_dtype)(kern_rand_u64(&rng) & 1), (enum kern_dtype)(kern_rand_u64(&rng) & 1));
	}
	test_mixed_experts(&rng);
	test_upper_bound(&rng, 0);
	test_upper_bound(&rng, 1);
	return test_exit();
}
