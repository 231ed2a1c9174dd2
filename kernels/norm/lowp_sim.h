/*
 * kernels/norm/lowp_sim.h: the low-precision roundings the model ops need
 * (bf16 round-to-nearest-even, e4m3 and e2m1 quant->dequant with ue8m0
 * power-of-two block scales), as small static inline helpers.
 *
 * They simulate, on fp32 values, what the reference does to tensors it stores
 * in bf16 or passes through act_quant / fp4_act_quant (dsv4.md §2.2). They live
 * here, private to the model-op references, so these do not depend on
 * kernels/quant/ (written in parallel); both must agree bit for bit, which the
 * tests of either side can check.
 */
#ifndef DSV4_KERNELS_NORM_LOWP_SIM_H
#define DSV4_KERNELS_NORM_LOWP_SIM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* bf16 bits -> float (exact). */
static inline float kern__bf16_to_f32(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t kern__f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* Round a float to the nearest bf16 value, returned as float. */
static inline float kern__bf16_round(float f)
{
	return kern__bf16_to_f32(kern__f32_to_bf16(f));
}

/* 2^ceil(log2(r)) for r > 0, computed exactly (no log2f rounding). */
static inline float kern__pow2_ceil(float r)
{
	int e;
	float m = frexpf(r, &e); /* r = m * 2^e, m in [0.5, 1) */
	if (m == 0.5f)
		e -= 1;
	return ldexpf(1.0f, e);
}

/* Nearest e4m3fn value (bias 7, max 448, subnormal step 2^-9), ties to even.
 * The input must already be clamped to [-448, 448]. */
static inline float kern__e4m3_round(float v)
{
	float a = fabsf(v);
	if (a == 0.0f)
		return v;
	int e;
	frexpf(a, &e); /* a in [2^(e-1), 2^e) */
	int ulp_exp = (e - 1) - 3; /* 3 mantissa bits */
	if (ulp_exp < -9)
		ulp_exp = -9; /* subnormal range */
	float step = ldexpf(1.0f, ulp_exp);
	float q = rintf(a / step) * step; /* rintf: ties to even under the default mode */
	if (q > 448.0f)
		q = 448.0f;
	return v < 0 ? -q : q;
}

/* In-place FP8 e4m3 quant->dequant of x[0:n] in blocks of `block` values with
 * ue8m0 scales: amax = max(|x|, 1e-4), s = 2^ceil(log2(amax/448)),
 * x = e4m3(clamp(x/s, ±448))·s (dsv4.md §2.2 item 1 and 2). */
static inline void kern__fp8_qdq(float *x, int n, int block)
{
	for (int b0 = 0; b0 < n; b0 += block) {
		int b1 = b0 + block < n ? b0 + block : n;
		float amax = 1e-4f;
		for (int i = b0; i < b1; i++)
			amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		float s = kern__pow2_ceil(amax / 448.0f);
		for (int i = b0; i < b1; i++) {
			float v = x[i] / s;
			v = v > 448.0f ? 448.0f : (v < -448.0f ? -448.0f : v);
			x[i] = kern__e4m3_round(v) * s;
		}
	}
}

/* Nearest e2m1 value (grid 0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to the even code.
 * The input must already be clamped to [-6, 6]. */
static inline float kern__e2m1_round(float v)
{
	static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	float a = fabsf(v);
	int best = 0;
	for (int c = 1; c < 8; c++) {
		float mid = 0.5f * (grid[c - 1] + grid[c]);
		if (a > mid || (a == mid && (c & 1) == 0))
			best = c;
		else
			break;
	}
	return v < 0 ? -grid[best] : grid[best];
}

/* In-place FP4 e2m1 quant->dequant of x[0:n] in blocks of `block` values with
 * ue8m0 scales: s = 2^ceil(log2(max(amax, 6·2^-126)/6)) (dsv4.md §2.2 item 3). */
static inline void kern__fp4_qdq(float *x, int n, int block)
{
	for (int b0 = 0; b0 < n; b0 += block) {
		int b1 = b0 + block < n ? b0 + block : n;
		float amax = 6.0f * ldexpf(1.0f, -126);
		for (int i = b0; i < b1; i++)
			amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		float s = kern__pow2_ceil(amax / 6.0f);
		for (int i = b0; i < b1; i++) {
			float v = x[i] / s;
			v = v > 6.0f ? 6.0f : (v < -6.0f ? -6.0f : v);
			x[i] = kern__e2m1_round(v) * s;
		}
	}
}

#endif
