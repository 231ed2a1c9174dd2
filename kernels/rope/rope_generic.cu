/*
 * kernels/rope/rope_generic.cu: portable CUDA interleaved rope for every
 * cc >= 8.0 (variant rope_cuda_generic; contract in rope.h). One thread per
 * (row, pair, head); the angle is the reference's fp32 product t·ω, its
 * cos/sin are taken in double and rounded to float exactly like the CPU
 * reference's (float)cos((double)ang), and the rotation uses _rn arithmetic
 * in the reference's order, so outputs match the CPU to the last bit except
 * where device and libm double cos/sin differ in their last ulp.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/rope/rope_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

__global__ void rope_kernel(float *x, const int32_t *pos, const float *omega, int64_t n_rows, int n_heads,
			    int head_dim, int rope_dim, int64_t rs, int mul, bool inverse, bool bf16_out)
{
	int half = rope_dim / 2;
	int64_t n = n_rows * half * n_heads;
	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
		int h = (int)(k % n_heads);
		int64_t q = k / n_heads;
		int i = (int)(q % half);
		int64_t r = q / half;
		float t = (float)((int64_t)pos[r] * mul);
		float ang = __fmul_rn(t, omega[i]);
		float c = (float)cos((double)ang), s = (float)sin((double)ang);
		if (inverse)
			s = -s;
		float *p = x + r * rs + (int64_t)h * head_dim + (head_dim - rope_dim) + 2 * i;
		float re = p[0], im = p[1];
		float o0 = __fsub_rn(__fmul_rn(re, c), __fmul_rn(im, s));
		float o1 = __fadd_rn(__fmul_rn(re, s), __fmul_rn(im, c));
		p[0] = bf16_out ? kd_bf16_round(o0) : o0;
		p[1] = bf16_out ? kd_bf16_round(o1) : o1;
	}
}

extern "C" enum status kern_rope_cuda_generic(const struct kern_rope_args *a)
{
	if (!a || (a->n_rows > 0 && (!a->x || !a->pos || !a->omega)) || a->n_rows < 0 || a->n_heads < 1 ||
	    a->rope_dim <= 0 || a->rope_dim % 2 || a->rope_dim > a->head_dim)
		return ST_INVALID;
	int64_t rs = a->row_stride ? a->row_stride : (int64_t)a->n_heads * a->head_dim;
	if (rs < (int64_t)a->n_heads * a->head_dim)
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	int64_t n = a->n_rows * (a->rope_dim / 2) * a->n_heads;
	int64_t b = (n + 255) / 256;
	rope_kernel<<<(unsigned)(b > 65536 ? 65536 : b), 256, 0, (cudaStream_t)a->stream>>>(
		a->x, a->pos, a->omega, a->n_rows, a->n_heads, a->head_dim, a->rope_dim, rs, a->pos_mul ? a->pos_mul : 1,
		a->inverse, a->bf16_out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
