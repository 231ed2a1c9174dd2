/*
 * tests/kernels/test_rope.c: the frequency table (plain θ and YaRN, dsv4.md
 * §3.4) against an independent double computation with the V4 constants,
 * and kern_rope_ref against complex multiplication in double: interleaved
 * pairs on the last dims only, inverse ∘ forward = identity, pos_mul.
 */
#include <complex.h>

#include "common/check.h"

#include "kernels/rope/rope.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static const struct kern_rope_yarn v4_yarn = {.factor = 16, .original_max_pos = 65536, .beta_fast = 32, .beta_slow = 1};

/* The reference's formulation: smooth = 1 - ramp, freqs/s·(1-smooth) + freqs·smooth. */
static double oracle_freq(int i, int rdim, double theta, int yarn)
{
	double f = 1.0 / pow(theta, (2.0 * i) / rdim);
	if (!yarn)
		return f;
	double lo = floor(rdim * log(65536 / (32 * 2 * M_PI)) / (2 * log(theta)));
	double hi = ceil(rdim * log(65536 / (1 * 2 * M_PI)) / (2 * log(theta)));
	lo = fmax(lo, 0);
	hi = fmin(hi, rdim - 1);
	if (lo == hi)
		hi += 0.001;
	double lin = fmin(fmax((i - lo) / (hi - lo), 0), 1);
	double smooth = 1 - lin;
	return f / 16 * (1 - smooth) + f * smooth;
}

static void test_freqs(void)
{
	float om[64];
	int lo, hi;
	kern_rope_yarn_range(64, 160000, &v4_yarn, &lo, &hi);
	T_CHECK(lo == 15 && hi == 25); /* the numbers dsv4.md §3.4 derives */
	int rdims[] = {64, 16, 32, 2};
	for (unsigned k = 0; k < ARRAY_LEN(rdims); k++) {
		int rd = rdims[k];
		for (int y = 0; y < 2; y++) {
			double th = y ? 160000 : 10000;
			fill_nan(om, 64);
			T_CHECK(kern_rope_freqs_build(om, rd, th, y ? &v4_yarn : NULL) == ST_OK);
			int bad = 0;
			for (int i = 0; i < rd / 2; i++)
				bad += !(fabs(om[i] - oracle_freq(i, rd, th, y)) <= 2e-7 * oracle_freq(i, rd, th, y));
			T_CHECKF(bad == 0 && count_nan(om, (size_t)rd / 2) == 0, "rope_dim %d yarn %d", rd, y);
			T_CHECK(isnan(om[rd / 2]));
		}
	}
	/* V4: pairs 0..15 unchanged, 25.. divided by 16, in between blended. */
	float plain[32];
	T_CHECK(kern_rope_freqs_build(plain, 64, 160000, NULL) == ST_OK);
	T_CHECK(kern_rope_freqs_build(om, 64, 160000, &v4_yarn) == ST_OK);
	for (int i = 0; i <= 15; i++)
		T_CLOSE(om[i], plain[i], 0, 1e-7);
	for (int i = 25; i < 32; i++)
		T_CLOSE(om[i], plain[i] / 16, 0, 1e-6);
	for (int i = 16; i < 25; i++)
		T_CHECK(om[i] < plain[i] && om[i] > plain[i] / 16);
	T_CHECK(kern_rope_freqs_build(om, 63, 1e4, NULL) == ST_INVALID);
	T_CHECK(kern_rope_freqs_build(om, 64, 1.0, NULL) == ST_INVALID);
}

static void test_rotate(int64_t rows, int heads, int hd, int rd, int extra, int mul, int yarn)
{
	int64_t rs = (int64_t)heads * hd + extra;
	size_t n = (size_t)(rows * rs);
	float *x = xcalloc(n + 1, sizeof *x), *x0 = xcalloc(n + 1, sizeof *x0);
	int32_t *pos = xcalloc((size_t)rows + 1, sizeof *pos);
	float om[64];
	T_CHECK(kern_rope_freqs_build(om, rd, yarn ? 160000 : 10000, yarn ? &v4_yarn : NULL) == ST_OK);
	mt_fill(x, n, -4, 4);
	for (int64_t r = 0; r < rows; r++)
		pos[r] = mt_int(0, r % 3 == 0 ? 1048575 : 5000);
	memcpy(x0, x, n * sizeof *x);
	struct kern_rope_args a = {.x = x, .pos = pos, .omega = om, .n_rows = rows, .n_heads = heads,
				   .head_dim = hd, .rope_dim = rd, .row_stride = extra ? rs : 0, .pos_mul = mul};
	T_CHECK(kern_rope_ref(&a) == ST_OK);
	int bad = 0, touched = 0;
	for (int64_t r = 0; r < rows; r++) {
		for (int h = 0; h < heads; h++) {
			int64_t b = r * rs + (int64_t)h * hd;
			for (int i = 0; i < hd - rd; i++)
				bad += x[b + i] != x0[b + i]; /* nope dims untouched */
			for (int i = 0; i < rd / 2; i++) {
				float ang = (float)((double)pos[r] * (mul ? mul : 1)) * om[i];
				double complex z = (x0[b + hd - rd + 2 * i] + I * x0[b + hd - rd + 2 * i + 1]) *
						   cexp(I * (double)ang);
				bad += fabs(x[b + hd - rd + 2 * i] - creal(z)) > 1e-5 * (1 + cabs(z));
				bad += fabs(x[b + hd - rd + 2 * i + 1] - cimag(z)) > 1e-5 * (1 + cabs(z));
			}
		}
		for (int i = heads * hd; i < rs; i++)
			bad += x[r * rs + i] != x0[r * rs + i]; /* padding untouched */
	}
	for (size_t i = 0; i < n; i++)
		touched += x[i] != x0[i];
	T_CHECKF(bad == 0, "rows %lld heads %d hd %d rd %d: %d bad", (long long)rows, heads, hd, rd, bad);
	T_CHECK(rows < 4 || touched > 0);
	/* inverse ∘ forward = identity */
	a.inverse = true;
	T_CHECK(kern_rope_ref(&a) == ST_OK);
	double worst = 0;
	for (size_t i = 0; i < n; i++)
		worst = fmax(worst, fabs(x[i] - x0[i]));
	T_CHECKF(worst < 5e-6, "inverse: %g", worst);
	free(x);
	free(x0);
	free(pos);
}

int main(void)
{
	mt_seed_from_env("test_rope");
	test_freqs();
	test_rotate(9, 8, 512, 64, 0, 1, 1); /* q: [T, H, 512], rope 64 */
	test_rotate(13, 1, 512, 64, 0, 1, 0); /* kv: SWA θ */
	test_rotate(5, 4, 128, 64, 0, 4, 1);  /* indexer q, compressed-entry positions w·4 */
	test_rotate(6, 8, 64, 16, 24, 1, 1);  /* tiny model dims, strided rows */
	test_rotate(0, 8, 64, 16, 0, 1, 1);   /* empty batch */
	{
		float x[4] = {1, 0, 0, 1};
		int32_t p = 0;
		float om[2];
		T_CHECK(kern_rope_freqs_build(om, 4, 10000, NULL) == ST_OK);
		struct kern_rope_args a = {.x = x, .pos = &p, .omega = om, .n_rows = 1, .n_heads = 1,
					   .head_dim = 2, .rope_dim = 4};
		T_CHECK(kern_rope_ref(&a) == ST_INVALID);
		/* position 0 is the identity */
		a.head_dim = 4;
		T_CHECK(kern_rope_ref(&a) == ST_OK && x[0] == 1 && x[1] == 0 && x[2] == 0 && x[3] == 1);
	}
	return test_exit();
}
