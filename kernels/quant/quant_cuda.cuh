/*
 * kernels/quant/quant_cuda.cuh: device versions of the scalar format
 * conversions in quant.h, written to give bit-identical results to the C
 * versions (same algorithm: bit manipulation or one power-of-two multiply
 * plus a single rintf), so GPU kernels and the CPU reference quantize
 * activations identically. Header-only, static __device__ functions: each
 * .cu that includes it gets its own copy (no cross-TU device calls).
 */
#ifndef DSV4_KERNELS_QUANT_CUDA_CUH
#define DSV4_KERNELS_QUANT_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

static __device__ __forceinline__ float kq_e4m3_to_f32(uint32_t c)
{
	uint32_t s = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
	if (e == 0xF && m == 7)
		return __uint_as_float(s | 0x7FC00000u);
	if (e == 0)
		return __uint_as_float(s | __float_as_uint((float)m * 0x1p-9f));
	return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}

/* RNE, saturating to ±448, NaN -> 0x7F/0xFF (as kern_f32_to_e4m3). */
static __device__ __forceinline__ uint32_t kq_f32_to_e4m3(float f)
{
	uint32_t sign = (__float_as_uint(f) >> 24) & 0x80u;
	float a = fabsf(f);
	if (isnan(f))
		return sign | 0x7Fu;
	if (a >= 448.0f)
		return sign | 0x7Eu;
	if (a < 0x1p-6f)
		return sign | (uint32_t)(int)rintf(a * 0x1p9f);
	int e = (int)((__float_as_uint(a) >> 23) & 0xFF) - 127; /* a is normal here */
	int q = (int)rintf(ldexpf(a, 3 - e));
	if (q == 16) {
		q = 8;
		e += 1;
	}
	uint32_t code = (uint32_t)(((e + 7) << 3) | (q - 8));
	return sign | (code > 0x7Eu ? 0x7Eu : code);
}

static __device__ __forceinline__ float kq_e8m0_to_f32(uint32_t e)
{
	if (e == 0xFFu)
		return __uint_as_float(0x7FC00000u);
	if (e == 0)
		return 0x1p-127f;
	return __uint_as_float(e << 23);
}

/* e2m1 code (low 4 bits) -> f32: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}. */
static __device__ __forceinline__ float kq_e2m1_to_f32(uint32_t c)
{
	uint32_t e = (c >> 1) & 3u, m = c & 1u, s = (c & 8u) << 28;
	uint32_t mag = e == 0 ? (m ? 0x3F000000u : 0u) : (((e + 126u) << 23) | (m << 22));
	return __uint_as_float(s | mag);
}

/* Smallest power of two >= x for normal x > 0 (the reference's fast_round_scale). */
static __device__ __forceinline__ float kq_pow2_ceil(float x)
{
	uint32_t u = __float_as_uint(x);
	uint32_t exp = ((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) != 0);
	return __uint_as_float(exp << 23);
}

/* The FP8 act_quant simulation of one element given its block's scale. */
static __device__ __forceinline__ float kq_fp8_qdq(float x, float s)
{
	float v = fminf(fmaxf(x / s, -448.0f), 448.0f);
	return kq_e4m3_to_f32(kq_f32_to_e4m3(v)) * s;
}

static __device__ __forceinline__ float kq_fp8_block_scale(float amax)
{
	return kq_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
}

/* kq_fp8_qdq, bit-identical but cheap, for a power-of-two block scale s and
 * inv_s = 1 / s (so x / s == x · inv_s exactly): e4m3 RNE is done on the f32
 * bits (3 mantissa bits kept) for normals, by rintf at 2^-9 steps for e4m3
 * subnormals (|v| < 2^-6). Clamped to ±448 first, as the reference. */
static __device__ __forceinline__ float kq_fp8_qdq_pow2(float x, float s, float inv_s)
{
	const float v = fminf(fmaxf(x * inv_s, -448.0f), 448.0f);
	const float a = fabsf(v);
	float q;
	if (a < 0x1p-6f) {
		q = rintf(a * 0x1p9f) * 0x1p-9f;
	} else {
		uint32_t u = __float_as_uint(a);
		u = (u + 0x7FFFFu + ((u >> 20) & 1u)) & 0xFFF00000u;
		q = __uint_as_float(u);
	}
	return copysignf(q, v) * s;
}

/* Load element i of an f32 (dt 0) or bf16 (dt 1) tensor / store with RNE. */
static __device__ __forceinline__ float kq_load(const void *p, int dt, int64_t i)
{
	if (dt)
		return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
	return ((const float *)p)[i];
}

static __device__ __forceinline__ void kq_store(void *p, int dt, int64_t i, float v)
{
	if (dt)
		((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
	else
		((float *)p)[i] = v;
}

#endif
