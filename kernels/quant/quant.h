/*
 * kernels/quant/quant.h: the number formats of DeepSeek-V4 checkpoints and of
 * the reference's activation quantization, as exact scalar conversions.
 *
 * Everything here is plain C with no tables to initialise, so it is usable
 * from any thread and from the CPU reference ops. The rounding is the one the
 * hardware and the reference use: round to nearest, ties to even (RNE).
 *
 *   bf16   1-8-7, the activation and embedding dtype.
 *   e4m3fn 1-4-3, bias 7, no infinities, NaN = S.1111.111, max 448 (FP8 weights).
 *   e8m0   unsigned 8-bit exponent, value 2^(e-127), 0xFF = NaN (ue8m0 scales).
 *   e2m1   1-2-1, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, no NaN (FP4 elements);
 *          packed two per byte, the LOW nibble holding the EVEN element.
 *
 * Activation simulations (dsv4.md §2.2): per row and per block of `block`
 * columns, a power-of-two scale rounded UP (ue8m0 style) and elements
 * rounded onto the FP8 or FP4 grid. The *_sim functions quantize and
 * dequantize in place, which is exact relative to the quantized form because
 * the scales are powers of two.
 */
#ifndef DSV4_KERNELS_QUANT_H
#define DSV4_KERNELS_QUANT_H

#include <stdint.h>

#define KERN_E4M3_MAX 448.0f
#define KERN_E2M1_MAX 6.0f
#define KERN_E4M3_NAN 0x7Fu   /* canonical positive NaN code (0xFF is the negative one) */
#define KERN_E8M0_NAN 0xFFu

/* ---- bf16 ---- */

/* bf16 bits -> f32 (exact). */
float kern_bf16_to_f32(uint16_t h);
/* f32 -> bf16 bits, RNE; NaN stays NaN (quiet, sign kept), overflow -> inf. */
uint16_t kern_f32_to_bf16(float f);

/* ---- e4m3fn ---- */

/* e4m3fn code -> f32 (exact); codes 0x7F and 0xFF are NaN. */
float kern_e4m3_to_f32(uint8_t c);
/* f32 -> e4m3fn, RNE, saturating: |x| > 448 (including inf) gives ±448;
 * NaN gives 0x7F or 0xFF by sign. -0 is kept (0x80). */
uint8_t kern_f32_to_e4m3(float f);

/* ---- e8m0 ---- */

/* e8m0 code -> f32: 2^(e-127), exact (e = 0 is 2^-127, a subnormal); 0xFF is NaN. */
float kern_e8m0_to_f32(uint8_t e);
/* f32 power of two in [2^-127, 2^127] -> e8m0 code; returns 0xFF for anything
 * else (not a power of two, zero, negative, NaN). Inverse of kern_e8m0_to_f32. */
uint8_t kern_f32_to_e8m0_exact(float f);

/* ---- e2m1 ---- */

/* e2m1 code (low 4 bits of c) -> f32 (exact). */
float kern_e2m1_to_f32(uint8_t c);
/* f32 -> e2m1 code, RNE onto the grid, saturating to ±6; NaN -> +0 (e2m1 has
 * no NaN; the activation quantizer never produces one from finite input). */
uint8_t kern_f32_to_e2m1(float f);
/* Element k of a packed e2m1 row (byte k/2, low nibble when k is even). */
static inline uint8_t kern_e2m1_code_at(const uint8_t *row, int64_t k)
{
	uint8_t b = row[k >> 1];
	return (k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0xF);
}

/* ---- activation dtypes ---- */

/* Element type of an activation tensor (x, y of the GEMM ops). */
enum kern_dtype {
	KERN_DT_F32 = 0,
	KERN_DT_BF16 = 1,
};

/* Bytes of one element. */
static inline int kern_dtype_bytes(enum kern_dtype dt)
{
	return dt == KERN_DT_BF16 ? 2 : 4;
}

/* Element i of p as f32 / store v into element i (RNE for bf16). */
float kern_load_f32(const void *p, enum kern_dtype dt, int64_t i);
void kern_store_f32(void *p, enum kern_dtype dt, int64_t i, float v);

/* ---- power-of-two scales ---- */

/* Smallest power of two >= x, for finite x > 0 (the reference's
 * fast_round_scale: exponent + (mantissa != 0)). */
float kern_pow2_ceil(float x);

/* ---- activation quantization (the reference's act_quant / fp4_act_quant) ---- */

/* FP8: x [n_rows, n_cols] f32 (row stride ld elements), blocks of `block`
 * columns per row (the last block of a row may be short). For each block:
 * amax = max(max|x|, 1e-4); s = pow2_ceil(amax / 448); q = e4m3(clamp(x/s, ±448)).
 * Writes codes q [n_rows, n_cols] (dense) and scales [n_rows, ceil(n_cols/block)]
 * (f32, powers of two). Either output may be NULL. */
void kern_act_quant_fp8(const float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block,
			uint8_t *q, float *scales);
/* The same, dequantized back in place: x <- e4m3(q) * s. */
void kern_act_quant_fp8_sim(float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block);

/* FP4: blocks of `block` (32 in the reference): s = pow2_ceil(max(amax, 6*2^-126) / 6);
 * q = e2m1(x/s). Codes are written one per byte (not packed), scales as above. */
void kern_act_quant_fp4(const float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block,
			uint8_t *q, float *scales);
void kern_act_quant_fp4_sim(float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block);

#endif
