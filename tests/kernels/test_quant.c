/*
 * tests/kernels/test_quant.c: the number formats, exhaustively where the
 * format is small (all 256 e4m3 and e8m0 codes, all 16 e2m1 codes, all
 * 65536 bf16 codes), and against brute-force nearest-value search on fresh
 * random inputs where it is not (f32 -> e4m3 / e2m1 / bf16 rounding), plus
 * the reference's activation quantizers.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels/quant/quant.h"
#include "kernels/quant/wmat.h"
#include "tests/test.h"

/* Independent decoders, written from the format definitions in double. */
static double e4m3_ref(int c)
{
	int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
	double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
	return s ? -v : v;
}

static const double e2m1_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* Nearest code by search; ties to the even code (the one whose mantissa LSB is 0). */
static int nearest_code(double a, const double *vals, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++) {
		double d = fabs(vals[i] - a), db = fabs(vals[best] - a);
		if (d < db || (d == db && (i & 1) == 0 && (best & 1)))
			best = i;
	}
	return best;
}

static void test_e4m3(uint64_t *rng)
{
	double vals[127];
	for (int c = 0; c < 127; c++)
		vals[c] = e4m3_ref(c);
	for (int c = 0; c < 256; c++) {
		float f = kern_e4m3_to_f32((uint8_t)c);
		if ((c & 0x7F) == 0x7F) {
			T_CHECKF(isnan(f), "code 0x%02x must be NaN", c);
			T_CHECK(isnan(kern_e4m3_to_f32(kern_f32_to_e4m3(f))));
			continue;
		}
		T_CHECKF((double)f == e4m3_ref(c), "code 0x%02x: %g vs %g", c, f, e4m3_ref(c));
		T_CHECKF(kern_f32_to_e4m3(f) == c, "round trip 0x%02x -> %g -> 0x%02x", c, f, kern_f32_to_e4m3(f));
	}
	T_CHECK(kern_e4m3_to_f32(0x7E) == 448.0f);
	T_CHECK(kern_e4m3_to_f32(0x01) == 0x1p-9f);
	T_CHECK(kern_f32_to_e4m3(1000.0f) == 0x7E);
	T_CHECK(kern_f32_to_e4m3(464.0f) == 0x7E);
	T_CHECK(kern_f32_to_e4m3(-INFINITY) == 0xFE);
	T_CHECK(kern_f32_to_e4m3(INFINITY) == 0x7E);
	T_CHECK((kern_f32_to_e4m3(NAN) & 0x7F) == 0x7F);
	T_CHECK(kern_f32_to_e4m3(-0.0f) == 0x80);
	T_CHECK(kern_f32_to_e4m3(0x1p-11f) == 0x00); /* a quarter of the smallest subnormal */
	/* Every midpoint between neighbours goes to the even code; just above
	 * or below it goes to the nearer one. */
	for (int c = 0; c < 126; c++) {
		float lo = (float)vals[c], hi = (float)vals[c + 1], mid = (float)((vals[c] + vals[c + 1]) / 2);
		int even = (c & 1) ? c + 1 : c;
		T_CHECKF(kern_f32_to_e4m3(mid) == even, "midpoint %g of 0x%02x: got 0x%02x", mid, c,
			 kern_f32_to_e4m3(mid));
		T_CHECK(kern_f32_to_e4m3(nextafterf(mid, hi)) == c + 1);
		T_CHECK(kern_f32_to_e4m3(nextafterf(mid, lo)) == c);
		T_CHECK(kern_f32_to_e4m3(-mid) == (0x80 | even));
	}
	/* Random values over the whole range against the search. */
	int bad = 0;
	for (int i = 0; i < 200000; i++) {
		float a = ldexpf(fabsf(kern_rand_f32(rng)) + 0x1p-24f, -12 + (int)(kern_rand_u64(rng) % 22));
		int want = a >= 448.0f ? 0x7E : nearest_code(a, vals, 127);
		bad += kern_f32_to_e4m3(a) != want;
	}
	T_CHECKF(bad == 0, "%d random e4m3 roundings differ from the search", bad);
}

static void test_bf16(uint64_t *rng)
{
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kern_bf16_to_f32((uint16_t)h);
		if (isnan(f)) {
			bad += !isnan(kern_bf16_to_f32(kern_f32_to_bf16(f)));
			continue;
		}
		bad += kern_f32_to_bf16(f) != h;
	}
	T_CHECKF(bad == 0, "%d bf16 round trips failed", bad);
	/* RNE: against the two neighbours, on random f32 bit patterns. */
	bad = 0;
	for (int i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)kern_rand_u64(rng);
		float f;
		memcpy(&f, &u, 4);
		if (!isfinite(f))
			continue;
		uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
		/* Neighbours in double; the code above the largest finite one is
		 * inf, which IEEE rounding treats as 2^128 for the tie decision. */
		double vl = kern_bf16_to_f32(lo), vh = (hi & 0x7FFF) == 0x7F80 ? copysign(0x1p128, f)
										    : kern_bf16_to_f32(hi);
		double dl = fabs(vl - f), dh = fabs(vh - f);
		uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
		uint16_t got = kern_f32_to_bf16(f);
		if (got != want && bad++ < 3)
			fprintf(stderr, "bf16(%a) = 0x%04x, want 0x%04x\n", (double)f, got, want);
	}
	T_CHECKF(bad == 0, "%d random bf16 roundings wrong", bad);
	T_CHECK(kern_f32_to_bf16(1.0f) == 0x3F80);
	T_CHECK(kern_f32_to_bf16(0x1.01p0f) == 0x3F80);  /* tie, even stays */
	T_CHECK(kern_f32_to_bf16(0x1.03p0f) == 0x3F82);  /* tie, odd goes up */
	T_CHECK(isnan(kern_bf16_to_f32(kern_f32_to_bf16(NAN))));
}

static void test_e8m0(void)
{
	for (int e = 0; e < 256; e++) {
		float f = kern_e8m0_to_f32((uint8_t)e);
		if (e == 255) {
			T_CHECK(isnan(f));
			continue;
		}
		T_CHECKF(f == ldexpf(1.0f, e - 127), "e8m0 %d: %g", e, f);
		T_CHECKF(kern_f32_to_e8m0_exact(f) == e, "e8m0 inverse %d", e);
	}
	T_CHECK(kern_f32_to_e8m0_exact(3.0f) == 0xFF);
	T_CHECK(kern_f32_to_e8m0_exact(-1.0f) == 0xFF);
	T_CHECK(kern_f32_to_e8m0_exact(0.0f) == 0xFF);
}

static void test_e2m1(uint64_t *rng)
{
	for (int c = 0; c < 16; c++) {
		double want = (c & 8 ? -1 : 1) * e2m1_mag[c & 7];
		T_CHECKF(kern_e2m1_to_f32((uint8_t)c) == want, "e2m1 %d", c);
		if (c != 8) /* -0 encodes back as 8 too; both checked below */
			T_CHECKF(kern_f32_to_e2m1((float)want) == c, "e2m1 round trip %d", c);
	}
	T_CHECK(kern_f32_to_e2m1(-0.0f) == 8);
	T_CHECK(kern_f32_to_e2m1(100.0f) == 7);
	T_CHECK(kern_f32_to_e2m1(-7.0f) == 15);
	T_CHECK(kern_f32_to_e2m1(5.0f) == 6);   /* tie 4|6 -> 4 (even) */
	T_CHECK(kern_f32_to_e2m1(2.5f) == 4);   /* tie 2|3 -> 2 */
	T_CHECK(kern_f32_to_e2m1(0.25f) == 0);  /* tie 0|0.5 -> 0 */
	T_CHECK(kern_f32_to_e2m1(0.75f) == 2);  /* tie 0.5|1 -> 1 */
	int bad = 0;
	for (int i = 0; i < 100000; i++) {
		float a = fabsf(kern_rand_f32(rng)) * 7.0f;
		int want = a >= 6.0f ? 7 : nearest_code(a, e2m1_mag, 8);
		bad += kern_f32_to_e2m1(a) != want;
	}
	T_CHECKF(bad == 0, "%d random e2m1 roundings differ from the search", bad);
	/* Packing: low nibble is the even element. */
	uint8_t row[2] = {0x71, 0xA3};
	T_CHECK(kern_e2m1_code_at(row, 0) == 1 && kern_e2m1_code_at(row, 1) == 7);
	T_CHECK(kern_e2m1_code_at(row, 2) == 3 && kern_e2m1_code_at(row, 3) == 0xA);
}

static void test_pow2(void)
{
	T_CHECK(kern_pow2_ceil(1.0f) == 1.0f);
	T_CHECK(kern_pow2_ceil(1.5f) == 2.0f);
	T_CHECK(kern_pow2_ceil(0x1.000002p-3f) == 0x1p-2f);
	T_CHECK(kern_pow2_ceil(0x1p-140f) == 0x1p-140f);
	T_CHECK(kern_pow2_ceil(0x1.8p-140f) == 0x1p-139f);
}

static void check_act_quant(uint64_t *rng, int fp4, int block, int64_t rows, int64_t cols)
{
	int64_t ld = cols + 3, nb = (cols + block - 1) / block;
	float *x = malloc(sizeof(float) * (size_t)(rows * ld));
	float *xs = malloc(sizeof(float) * (size_t)(rows * ld));
	uint8_t *q = malloc((size_t)(rows * cols));
	float *s = malloc(sizeof(float) * (size_t)(rows * nb));
	for (int64_t i = 0; i < rows * ld; i++)
		x[i] = kern_rand_f32(rng) * ldexpf(1.0f, (int)(kern_rand_u64(rng) % 12) - 6);
	for (int64_t k = 0; k < cols && rows > 1; k++)
		x[ld + k] = 0.0f; /* an all-zero row: amax clamps to the floor */
	memcpy(xs, x, sizeof(float) * (size_t)(rows * ld));
	if (fp4) {
		kern_act_quant_fp4(x, rows, cols, ld, block, q, s);
		kern_act_quant_fp4_sim(xs, rows, cols, ld, block);
	} else {
		kern_act_quant_fp8(x, rows, cols, ld, block, q, s);
		kern_act_quant_fp8_sim(xs, rows, cols, ld, block);
	}
	double qmax = fp4 ? 6.0 : 448.0, floor_amax = fp4 ? 6.0 * pow(2, -126) : 1e-4;
	int bad = 0;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t b = 0; b < nb; b++) {
			int64_t k0 = b * block, k1 = k0 + block < cols ? k0 + block : cols;
			double amax = 0;
			for (int64_t k = k0; k < k1; k++)
				amax = fmax(amax, fabs(x[r * ld + k]));
			amax = fmax(amax, floor_amax);
			/* Smallest power of two with amax / s <= qmax, computed in double. */
			double want = pow(2, ceil(log2((double)(float)(amax / qmax))));
			if (!fp4)
				want = pow(2, ceil(log2((double)((float)amax / 448.0f))));
			else
				want = pow(2, ceil(log2((double)((float)amax / 6.0f))));
			float sc = s[r * nb + b];
			bad += sc != (float)want;
			for (int64_t k = k0; k < k1; k++) {
				uint8_t c = q[r * cols + k];
				float v = fp4 ? kern_e2m1_to_f32(c) : kern_e4m3_to_f32(c);
				float want_c = fp4 ? kern_e2m1_to_f32(kern_f32_to_e2m1(x[r * ld + k] / sc))
						   : kern_e4m3_to_f32(kern_f32_to_e4m3(x[r * ld + k] / sc));
				bad += v != want_c || fabsf(v) > qmax || xs[r * ld + k] != v * sc;
			}
		}
		for (int64_t k = cols; k < ld; k++) /* padding untouched */
			bad += xs[r * ld + k] != x[r * ld + k];
	}
	T_CHECKF(bad == 0, "act_quant %s block %d [%lld x %lld]: %d mismatches", fp4 ? "fp4" : "fp8", block,
		 (long long)rows, (long long)cols, bad);
	free(x);
	free(xs);
	free(q);
	free(s);
}

int main(void)
{
	uint64_t rng = test_seed() * 0x9E3779B97F4A7C15ull;
	test_e4m3(&rng);
	test_bf16(&rng);
	test_e8m0();
	test_e2m1(&rng);
	test_pow2();
	check_act_quant(&rng, 0, 128, 5, 512);
	check_act_quant(&rng, 0, 128, 3, 300);
	check_act_quant(&rng, 0, 64, 4, 448);
	check_act_quant(&rng, 0, 64, 2, 100);
	check_act_quant(&rng, 1, 32, 4, 128);
	check_act_quant(&rng, 1, 32, 3, 70);
	return test_exit();
}
