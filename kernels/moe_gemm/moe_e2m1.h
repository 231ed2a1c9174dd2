/*
 * kernels/moe_gemm/moe_e2m1.h: decoding 8 packed e2m1 codes to f32 in
 * registers, the inner step of the fused decode (moe_decode_fma.cu and
 * moe_decode_mma.cu). Written once for CUDA and C so the CPU test checks the
 * very bit manipulation the kernel runs, exhaustively
 * (tests/kernels/test_moe_decode.c): under nvcc PRMT is __byte_perm, in C an
 * emulation of it.
 *
 * Per 4 codes (one 16-bit half m, code i in nibble i): the bf16 bit patterns
 * of the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} come from two PRMT table
 * lookups (high byte 00/3F/40, low byte 00/80/C0/40), interleaved into two
 * bf16 pairs by two more PRMTs; the sign bits (3, 7, 11, 15 of m) reach bits
 * 15 and 31 of the pairs through one multiply each (s · (2^12 + 2^24) and
 * s · (2^4 + 2^16): the two shifted copies collide only on bits the mask drops,
 * and the carry they make stops below bit 31), so the integer pipe does one
 * mask and one OR per pair; the f32 values are the pairs' halves shifted
 * (a multiply by 2^16) or masked. Exact.
 */
#ifndef DSV4_KERNELS_MOE_E2M1_H
#define DSV4_KERNELS_MOE_E2M1_H

#include <stdint.h>

#ifdef __CUDACC__
#define KE2_FN static __device__ __forceinline__
#define KE2_PRMT(a, b, s) __byte_perm((a), (b), (s))
#define KE2_U2F(u) __uint_as_float(u)
#define KE2_UNROLL _Pragma("unroll")
#else
#include <string.h>
#define KE2_FN static inline
/* PRMT's default mode with selector msbs clear (the only use here). */
static inline uint32_t ke2__prmt(uint32_t a, uint32_t b, uint32_t s)
{
	const uint64_t v = (uint64_t)a | (uint64_t)b << 32;
	uint32_t r = 0;
	for (int i = 0; i < 4; i++)
		r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
	return r;
}
static inline float ke2__u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}
#define KE2_PRMT(a, b, s) ke2__prmt((a), (b), (s))
#define KE2_U2F(u) ke2__u2f(u)
#define KE2_UNROLL
#endif

/* p[i] = the bf16 pair (low half, high half) = (element 2i, element 2i + 1)
 * of the e2m1 codes in the nibbles of n (element i in nibble i), unscaled. */
KE2_FN void kern_e2m1x8_to_bf16x2(uint32_t n, uint32_t *p)
{
	KE2_UNROLL
	for (int h = 0; h < 2; h++) {
		const uint32_t m = n >> (16 * h);
		const uint32_t sel = m & 0x7777u, s = m & 0x8888u;
		const uint32_t hi = KE2_PRMT(0x3F3F3F00u, 0x40404040u, sel);
		const uint32_t lo = KE2_PRMT(0xC0800000u, 0xC0804000u, sel);
		p[2 * h] = KE2_PRMT(lo, hi, 0x5140u) | ((s * 0x01001000u) & 0x80008000u);
		p[2 * h + 1] = KE2_PRMT(lo, hi, 0x7362u) | ((s * 0x00010010u) & 0x80008000u);
	}
}

/* f[i] = e2m1 code in nibble i of n (element i), unscaled. */
KE2_FN void kern_e2m1x8_to_f32(uint32_t n, float *f)
{
	uint32_t p[4];
	kern_e2m1x8_to_bf16x2(n, p);
	KE2_UNROLL
	for (int i = 0; i < 4; i++) {
		f[2 * i] = KE2_U2F(p[i] * 0x10000u);
		f[2 * i + 1] = KE2_U2F(p[i] & 0xFFFF0000u);
	}
}

#endif
