/*
 * kernels/act/act_generic.cu: portable CUDA clamped SwiGLU and silu for every
 * cc >= 8.0 (variant swiglu_cuda_generic; contract in act.h). One thread per
 * element over a grid-stride loop; the reference's fp32 operations in its
 * order with explicit _rn arithmetic (no FMA contraction), so results differ
 * from the CPU only by expf's last bits. Elementwise, so in place is safe.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/act/act_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

static __device__ __forceinline__ float silu_d(float g)
{
	return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
}

__global__ void swiglu_kernel(const float *gate, const float *up, float *out, const float *row_weight,
			      int64_t n_rows, int dim, int64_t gs, int64_t us, int64_t os, float lim, bool bf16_out)
{
	int64_t n = n_rows * dim;
	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = k / dim;
		int i = (int)(k - r * dim);
		float g = gate[r * gs + i], u = up[r * us + i];
		if (lim > 0) {
			g = fminf(g, lim);
			u = fminf(fmaxf(u, -lim), lim);
		}
		float o = __fmul_rn(silu_d(g), u);
		if (row_weight)
			o = __fmul_rn(row_weight[r], o);
		out[r * os + i] = bf16_out ? kd_bf16_round(o) : o;
	}
}

__global__ void silu_kernel(float *x, int64_t n)
{
	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
		x[k] = silu_d(x[k]);
}

static unsigned grid_for(int64_t n)
{
	int64_t b = (n + 255) / 256;
	return (unsigned)(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

extern "C" enum status kern_swiglu_cuda_generic(const struct kern_swiglu_args *a)
{
	if (!a || a->dim <= 0 || a->n_rows < 0 || (a->n_rows > 0 && (!a->gate || !a->up || !a->out)))
		return ST_INVALID;
	int64_t gs = a->gate_stride ? a->gate_stride : a->dim;
	int64_t us = a->up_stride ? a->up_stride : a->dim;
	int64_t os = a->out_stride ? a->out_stride : a->dim;
	if (gs < a->dim || us < a->dim || os < a->dim)
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	swiglu_kernel<<<grid_for(a->n_rows * a->dim), 256, 0, (cudaStream_t)a->stream>>>(
		a->gate, a->up, a->out, a->row_weight, a->n_rows, a->dim, gs, us, os, a->limit, a->bf16_out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

extern "C" enum status kern_silu_cuda_generic(float *x, int64_t n, void *stream)
{
	if (n < 0 || (n > 0 && !x))
		return ST_INVALID;
	if (n == 0)
		return ST_OK;
	silu_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(x, n);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
