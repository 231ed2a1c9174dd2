/*
 * tests/kernels/gemm_naive.h: an independent dequantizer and a naive
 * double-precision GEMM, written from the format definitions (not from
 * kernels/quant), used as the oracle of the linear and moe_gemm reference
 * tests.
 */
#ifndef DSV4_TESTS_GEMM_NAIVE_H
#define DSV4_TESTS_GEMM_NAIVE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant/wmat.h"

static double naive_e4m3(uint8_t c)
{
	int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
	if (e == 15 && m == 7)
		return NAN;
	double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
	return s ? -v : v;
}

static double naive_e2m1(uint8_t c)
{
	static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
	return (c & 8 ? -1 : 1) * mag[c & 7];
}

static double naive_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* The whole matrix, dequantized into doubles [rows, cols] (tests only). */
static double *naive_dequant(const struct kern_wmat *m)
{
	int64_t R = m->rows, C = m->cols;
	double *w = malloc(sizeof(double) * (size_t)(R * C));
	const uint8_t *d8 = m->data, *s8 = m->scale;
	for (int64_t r = 0; r < R; r++)
		for (int64_t c = 0; c < C; c++) {
			double v = 0;
			switch (m->fmt) {
			case KERN_WFMT_F32: v = ((const float *)m->data)[r * C + c]; break;
			case KERN_WFMT_BF16: v = naive_bf16(((const uint16_t *)m->data)[r * C + c]); break;
			case KERN_WFMT_FP8_E8M0_B128:
				v = naive_e4m3(d8[r * C + c]) * pow(2, s8[(r / 128) * ((C + 127) / 128) + c / 128] - 127);
				break;
			case KERN_WFMT_FP8_F32_B128:
				v = naive_e4m3(d8[r * C + c]) *
				    ((const float *)m->scale)[(r / 128) * ((C + 127) / 128) + c / 128];
				break;
			case KERN_WFMT_MXFP4: {
				uint8_t b = d8[r * (C / 2) + c / 2];
				v = naive_e2m1(c & 1 ? b >> 4 : b & 15) * pow(2, s8[r * (C / 32) + c / 32] - 127);
				break;
			}
			case KERN_WFMT_NVFP4: {
				uint8_t b = d8[r * (C / 2) + c / 2];
				v = naive_e2m1(c & 1 ? b >> 4 : b & 15) *
				    (double)(float)(naive_e4m3(s8[r * (C / 16) + c / 16]) * m->global_scale);
				break;
			}
			default: break;
			}
			w[r * C + c] = v;
		}
	return w;
}

#endif
