/*
 * kernels/quant/quant.c: scalar conversions between f32 and the checkpoint
 * formats (bf16, e4m3fn, e8m0, e2m1), and the reference's activation
 * quantizers. Written for exactness, not speed: every conversion is either
 * a bit manipulation or one multiplication by a power of two followed by a
 * single RNE rounding (rintf in the default rounding mode), so there is no
 * double rounding anywhere.
 */
#include "kernels/quant/quant.h"

#include <math.h>
#include <string.h>

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* ---- bf16 ---- */

float kern_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t kern_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: keep sign, force quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7FFFu + ((u >> 16) & 1u);     /* RNE; overflow carries into inf */
	return (uint16_t)(u >> 16);
}

float kern_load_f32(const void *p, enum kern_dtype dt, int64_t i)
{
	if (dt == KERN_DT_BF16)
		return kern_bf16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

void kern_store_f32(void *p, enum kern_dtype dt, int64_t i, float v)
{
	if (dt == KERN_DT_BF16)
		((uint16_t *)p)[i] = kern_f32_to_bf16(v);
	else
		((float *)p)[i] = v;
}

/* ---- e4m3fn ---- */

float kern_e4m3_to_f32(uint8_t c)
{
	int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
	float v;
	if (e == 0xF && m == 7)
		return s ? -NAN : NAN;
	if (e == 0)
		v = ldexpf((float)m, -9);              /* subnormal: m/8 * 2^-6 */
	else
		v = ldexpf((float)(8 + m), e - 7 - 3); /* 1.m * 2^(e-7) */
	return s ? -v : v;
}

uint8_t kern_f32_to_e4m3(float f)
{
	uint8_t sign = signbit(f) ? 0x80 : 0;
	float a = fabsf(f);
	if (isnan(f))
		return (uint8_t)(sign | KERN_E4M3_NAN);
	if (a >= KERN_E4M3_MAX) /* saturate (inf included) */
		return (uint8_t)(sign | 0x7E);
	if (a < 0x1p-6f) {
		/* Subnormal range: units of 2^-9. q = 8 rounds up to the smallest
		 * normal, whose code (exponent 1, mantissa 0) is also 8. */
		int q = (int)rintf(a * 0x1p9f);
		return (uint8_t)(sign | q);
	}
	int e;
	frexpf(a, &e);                              /* a = f * 2^e, f in [0.5, 1) */
	e -= 1;                                     /* a = 1.x * 2^e, e in [-6, 8] */
	int q = (int)rintf(ldexpf(a, 3 - e));       /* in [8, 16] */
	if (q == 16) {
		q = 8;
		e += 1;
	}
	int code = ((e + 7) << 3) | (q - 8);
	if (code > 0x7E) /* 464 <= rounding result: cannot happen below 448, kept for safety */
		code = 0x7E;
	return (uint8_t)(sign | code);
}

/* ---- e8m0 ---- */

float kern_e8m0_to_f32(uint8_t e)
{
	if (e == KERN_E8M0_NAN)
		return NAN;
	if (e == 0)
		return 0x1p-127f; /* the only subnormal result */
	return bits_f32((uint32_t)e << 23);
}

uint8_t kern_f32_to_e8m0_exact(float f)
{
	uint32_t u = f32_bits(f);
	if (u == 0x00400000u) /* 2^-127 */
		return 0;
	uint32_t exp = (u >> 23) & 0xFF, man = u & 0x7FFFFFu;
	if ((u >> 31) || exp == 0 || exp == 0xFF || man != 0)
		return KERN_E8M0_NAN;
	return (uint8_t)exp;
}

/* ---- e2m1 ---- */

float kern_e2m1_to_f32(uint8_t c)
{
	static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	float v = mag[c & 7];
	return (c & 8) ? -v : v;
}

uint8_t kern_f32_to_e2m1(float f)
{
	uint8_t sign = signbit(f) ? 8 : 0;
	float a = fabsf(f), r;
	if (isnan(f))
		return 0;
	/* RNE on a grid whose spacing doubles at 2 and 4; ties go to the even
	 * mantissa, which is what rintf does within each binade. */
	if (a < 2.0f)
		r = rintf(a * 2.0f) * 0.5f;
	else if (a < 4.0f)
		r = rintf(a);
	else if (a < 6.0f)
		r = rintf(a * 0.5f) * 2.0f;
	else
		r = 6.0f;
	static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	for (uint8_t i = 0; i < 8; i++)
		if (mag[i] == r)
			return (uint8_t)(sign | i);
	return (uint8_t)(sign | 7); /* unreachable: r is on the grid */
}

/* ---- power-of-two scales ---- */

float kern_pow2_ceil(float x)
{
	uint32_t u = f32_bits(x);
	int exp = (int)((u >> 23) & 0xFF);
	if (exp == 0) { /* subnormal input: the reference never produces one (amax >= 1e-4) */
		float p = 0x1p-149f;
		while (p < x)
			p *= 2.0f;
		return p;
	}
	exp += (u & 0x7FFFFFu) != 0;
	return bits_f32((uint32_t)exp << 23);
}

/* ---- activation quantization ---- */

typedef float (*amax_to_scale_fn)(float amax);
typedef uint8_t (*encode_fn)(float v);
typedef float (*decode_fn)(uint8_t c);

static float fp8_scale(float amax)
{
	return kern_pow2_ceil(fmaxf(amax, 1e-4f) / KERN_E4M3_MAX);
}

static float fp4_scale(float amax)
{
	return kern_pow2_ceil(fmaxf(amax, KERN_E2M1_MAX * 0x1p-126f) / KERN_E2M1_MAX);
}

static uint8_t fp8_encode(float v)
{
	return kern_f32_to_e4m3(fminf(fmaxf(v, -KERN_E4M3_MAX), KERN_E4M3_MAX));
}

static void act_quant(const float *x, float *x_out, int64_t n_rows, int64_t n_cols, int64_t ld, int block,
		      uint8_t *q, float *scales, amax_to_scale_fn to_scale, encode_fn enc, decode_fn dec)
{
	int64_t nb = (n_cols + block - 1) / block;
	for (int64_t r = 0; r < n_rows; r++) {
		const float *xr = x + r * ld;
		for (int64_t b = 0; b < nb; b++) {
			int64_t k0 = b * block, k1 = k0 + block < n_cols ? k0 + block : n_cols;
			float amax = 0.0f;
			for (int64_t k = k0; k < k1; k++)
				amax = fmaxf(amax, fabsf(xr[k]));
			float s = to_scale(amax);
			if (scales)
				scales[r * nb + b] = s;
			for (int64_t k = k0; k < k1; k++) {
				uint8_t c = enc(xr[k] / s); /* s is a power of two: exact */
				if (q)
					q[r * n_cols + k] = c;
				if (x_out)
					x_out[r * ld + k] = dec(c) * s;
			}
		}
	}
}

void kern_act_quant_fp8(const float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block,
			uint8_t *q, float *scales)
{
	act_quant(x, NULL, n_rows, n_cols, ld, block, q, scales, fp8_scale, fp8_encode, kern_e4m3_to_f32);
}

void kern_act_quant_fp8_sim(float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block)
{
	act_quant(x, x, n_rows, n_cols, ld, block, NULL, NULL, fp8_scale, fp8_encode, kern_e4m3_to_f32);
}

void kern_act_quant_fp4(const float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block,
			uint8_t *q, float *scales)
{
	act_quant(x, NULL, n_rows, n_cols, ld, block, q, scales, fp4_scale, kern_f32_to_e2m1, kern_e2m1_to_f32);
}

void kern_act_quant_fp4_sim(float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block)
{
	act_quant(x, x, n_rows, n_cols, ld, block, NULL, NULL, fp4_scale, kern_f32_to_e2m1, kern_e2m1_to_f32);
}
