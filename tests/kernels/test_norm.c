/*
 * tests/kernels/test_norm.c: kern_rmsnorm_ref against a double-precision
 * computation written here, for weighted (bf16 and f32), unweighted per-head,
 * strided, in-place and bf16-rounded uses (dsv4.md §2.3, §3.3); and the
 * private low-precision helpers of kernels/norm/lowp_sim.h against
 * kernels/quant (written independently): bit-identical results.
 */
#include "kernels/norm/lowp_sim.h"
#include "kernels/norm/norm.h"
#include "kernels/quant/quant.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static void oracle(const float *x, int64_t xs, const float *w, int64_t rows, int dim, double eps, double *out)
{
	for (int64_t r = 0; r < rows; r++) {
		double ss = 0;
		for (int i = 0; i < dim; i++)
			ss += (double)x[r * xs + i] * x[r * xs + i];
		double inv = 1.0 / sqrt(ss / dim + eps);
		for (int i = 0; i < dim; i++)
			out[r * dim + i] = x[r * xs + i] * inv * (w ? w[i] : 1.0);
	}
}

static void run_case(int64_t rows, int dim, int wkind, int64_t xs_extra, bool inplace)
{
	int64_t xs = dim + xs_extra;
	float *x = xcalloc((size_t)(rows * xs + 1), sizeof *x);
	float *y = xcalloc((size_t)(rows * dim + 1), sizeof *y);
	float *wf = xcalloc((size_t)dim, sizeof *wf);
	uint16_t *wb = xcalloc((size_t)dim, sizeof *wb);
	double *ref = xcalloc((size_t)(rows * dim + 1), sizeof *ref);
	float scale = mt_unif(0.01f, 30.0f);
	mt_fill(x, (size_t)(rows * xs), -scale, scale);
	for (int i = 0; i < dim; i++) {
		wb[i] = kern__f32_to_bf16(mt_unif(-2, 2));
		wf[i] = wkind == 1 ? kern__bf16_to_f32(wb[i]) : mt_unif(-2, 2);
	}
	oracle(x, xs, wkind ? wf : NULL, rows, dim, 1e-6, ref);
	struct kern_rmsnorm_args a = {
		.x = x, .y = inplace ? x : y, .w_bf16 = wkind == 1 ? wb : NULL,
		.w_f32 = wkind == 2 ? wf : NULL, .n_rows = rows, .dim = dim,
		.x_stride = xs, .y_stride = inplace ? xs : 0, .eps = 1e-6f,
	};
	if (!inplace)
		fill_nan(y, (size_t)(rows * dim));
	T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
	float *out = inplace ? x : y;
	int64_t os = inplace ? xs : dim;
	double worst = 0;
	size_t nn = 0;
	for (int64_t r = 0; r < rows; r++) {
		nn += count_nan(out + r * os, (size_t)dim);
		double e = max_rel_err(out + r * os, ref + r * dim, (size_t)dim, 1e-6, 1e-5);
		worst = e > worst ? e : worst;
	}
	T_CHECKF(nn == 0 && worst <= 1, "rows %lld dim %d wkind %d: worst %.3g nan %zu", (long long)rows, dim,
		 wkind, worst, nn);
	free(x);
	free(y);
	free(wf);
	free(wb);
	free(ref);
}

/* lowp_sim.h and kernels/quant must agree bit for bit, or the model ops and
 * the GEMMs would simulate the reference's roundings differently. */
static void test_lowp_vs_quant(void)
{
	enum { N = 64 * 40 };
	float *x = xcalloc(N, 4), *a = xcalloc(N, 4), *b = xcalloc(N, 4);
	for (int blk = 0; blk < N / 64; blk++) {
		float mag = ldexpf(1.0f, mt_int(-30, 30));
		for (int i = 0; i < 64; i++) {
			float v = mt_unif(-mag, mag);
			x[blk * 64 + i] = (i % 9 == 0) ? kern__bf16_round(v) : v;
		}
	}
	x[5] = 0;
	x[6] = -0.0f;
	for (int i = 0; i < 64; i++) /* one all-zero block */
		x[64 + i] = 0;
	int bad = 0;
	for (int i = 0; i < N; i++)
		bad += kern__f32_to_bf16(x[i]) != kern_f32_to_bf16(x[i]);
	T_CHECKF(bad == 0, "bf16: %d differ", bad);
	int blocks[] = {64, 128, 32};
	for (int k = 0; k < 3; k++) {
		memcpy(a, x, N * 4);
		memcpy(b, x, N * 4);
		kern__fp8_qdq(a, N, blocks[k]);
		kern_act_quant_fp8_sim(b, 1, N, N, blocks[k]);
		bad = 0;
		for (int i = 0; i < N; i++)
			bad += memcmp(&a[i], &b[i], 4) != 0 && !(a[i] == 0 && b[i] == 0);
		T_CHECKF(bad == 0, "fp8 block %d: %d differ", blocks[k], bad);
	}
	memcpy(a, x, N * 4);
	memcpy(b, x, N * 4);
	kern__fp4_qdq(a, N, 32);
	kern_act_quant_fp4_sim(b, 1, N, N, 32);
	bad = 0;
	for (int i = 0; i < N; i++)
		bad += memcmp(&a[i], &b[i], 4) != 0 && !(a[i] == 0 && b[i] == 0);
	T_CHECKF(bad == 0, "fp4 block 32: %d differ", bad);
	free(x);
	free(a);
	free(b);
}

int main(void)
{
	mt_seed_from_env("test_norm");
	test_lowp_vs_quant();
	/* weighted bf16 (attn_norm), f32 weight, unweighted per-head q norm */
	run_case(7, 64, 1, 0, false);
	run_case(5, 4096, 1, 0, false);
	run_case(3, 1000, 2, 0, false);
	run_case(8 * 3, 512, 0, 0, false);
	run_case(4, 33, 0, 7, false);   /* odd dim, strided input */
	run_case(6, 128, 1, 64, true);  /* in place, strided */
	run_case(0, 64, 1, 0, false);   /* empty batch */
	run_case(1, 1, 2, 0, false);

	/* bf16_in / bf16_out: outputs are bf16 values equal to the rounded fp32 result. */
	{
		enum { R = 3, D = 96 };
		float x[R * D], y[R * D], xb[R * D], yref[R * D];
		uint16_t w[D];
		mt_fill(x, R * D, -3, 3);
		for (int i = 0; i < D; i++)
			w[i] = kern__f32_to_bf16(mt_unif(0.5f, 1.5f));
		for (int i = 0; i < R * D; i++)
			xb[i] = kern__bf16_round(x[i]);
		struct kern_rmsnorm_args a = {.x = xb, .y = yref, .w_bf16 = w, .n_rows = R, .dim = D, .eps = 1e-6f};
		T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
		a.x = x;
		a.y = y;
		a.bf16_in = true;
		a.bf16_out = true;
		T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
		int bad = 0;
		for (int i = 0; i < R * D; i++)
			bad += y[i] != kern__bf16_round(yref[i]) || y[i] != kern__bf16_round(y[i]);
		T_CHECK(bad == 0);
	}
	/* bf16_stats: the scale factor is a bf16 value; the result stays within
	 * bf16 rounding of the fp32 path and is bf16 itself. */
	{
		enum { R = 16, D = 512 };
		float *x = xcalloc(R * D, 4), *y0 = xcalloc(R * D, 4), *y1 = xcalloc(R * D, 4);
		for (int i = 0; i < R * D; i++)
			x[i] = kern__bf16_round(mt_unif(-3, 3) * (1 + i / D));
		struct kern_rmsnorm_args a = {.x = x, .y = y0, .n_rows = R, .dim = D, .eps = 1e-6f, .bf16_out = true};
		T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
		a.y = y1;
		a.bf16_stats = true;
		T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
		int bad = 0, differ = 0;
		for (int r = 0; r < R; r++) {
			float ss = 0; /* fp32 in order, as the kernel: this checks the bf16 steps, not the sum */
			for (int i = 0; i < D; i++)
				ss += x[r * D + i] * x[r * D + i];
			float ms = kern__bf16_round(kern__bf16_round(ss / D) + 1e-6f);
			float rs = kern__bf16_round(1.0f / sqrtf(ms));
			for (int i = 0; i < D; i++) {
				float v = y1[r * D + i];
				bad += v != kern__bf16_round(v);
				bad += fabsf(v - y0[r * D + i]) > 0x1p-6f * fabsf(y0[r * D + i]) + 1e-30f;
				/* exactly x·rs rounded, with rs the bf16 scale */
				bad += v != kern__bf16_round(x[r * D + i] * rs);
				differ += v != y0[r * D + i];
			}
		}
		T_CHECKF(bad == 0, "bf16_stats: %d bad", bad);
		T_CHECK(differ > 0); /* the flag changes something */
		free(x);
		free(y0);
		free(y1);
	}
	/* invalid arguments */
	{
		float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1};
		uint16_t wb[4] = {0};
		struct kern_rmsnorm_args a = {.x = x, .y = x, .n_rows = 1, .dim = 0};
		T_CHECK(kern_rmsnorm_ref(&a) == ST_INVALID);
		a.dim = 4;
		a.w_f32 = w;
		a.w_bf16 = wb;
		T_CHECK(kern_rmsnorm_ref(&a) == ST_INVALID);
		a.w_bf16 = NULL;
		a.x_stride = 2;
		T_CHECK(kern_rmsnorm_ref(&a) == ST_INVALID);
		T_CHECK(kern_rmsnorm_ref(NULL) == ST_INVALID);
	}
	/* bf16 helper sanity: round to nearest even on the 16-bit boundary. */
	T_CHECK(kern__bf16_round(1.0f + 0x1p-8f) == 1.0f);
	T_CHECK(kern__bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
	T_CHECK(kern__bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
	return test_exit();
}
