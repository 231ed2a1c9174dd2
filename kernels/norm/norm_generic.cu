/*
 * kernels/norm/norm_generic.cu: portable CUDA RMSNorm for every cc >= 8.0
 * (variant rmsnorm_cuda_generic; contract in norm.h). One 256-thread block
 * per row: a strided fp32 sum of squares reduced by warp shuffles and one
 * fixed-order pass over the warps, then the scale; every rounding flag
 * (bf16_in, bf16_stats, bf16_out) is applied where the CPU reference applies
 * it, with explicit _rn arithmetic so nothing is fused. Only the order of the
 * sum of squares differs from the reference. In place (y == x) is safe: a
 * row is fully read before the barrier that precedes its writes.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/norm/norm_generic.h"
}
#include "kernels/device/host_bufs.cuh"
#include "kernels/norm/lowp_cuda.cuh"

#define NORM_NT 256

__global__ void __launch_bounds__(NORM_NT) rmsnorm_kernel(const float *x, float *y, const uint16_t *w_bf16,
							   const float *w_f32, int dim, int64_t xs, int64_t ys,
							   float eps, bool bf16_in, bool bf16_out, bool bf16_stats)
{
	__shared__ float red[32];
	const float *xr = x + (int64_t)blockIdx.x * xs;
	float *yr = y + (int64_t)blockIdx.x * ys;
	float ss = 0.f;
	for (int i = threadIdx.x; i < dim; i += NORM_NT) {
		float v = bf16_in ? kd_bf16_round(xr[i]) : xr[i];
		ss = __fadd_rn(ss, __fmul_rn(v, v));
	}
	ss = kd_block_sum(ss, red);
	float rs;
	if (bf16_stats) {
		float ms = kd_bf16_round(__fadd_rn(kd_bf16_round(__fdiv_rn(ss, (float)dim)), eps));
		rs = kd_bf16_round(__fdiv_rn(1.0f, __fsqrt_rn(ms)));
	} else {
		rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
	}
	for (int i = threadIdx.x; i < dim; i += NORM_NT) {
		float v = bf16_in ? kd_bf16_round(xr[i]) : xr[i];
		float w = w_bf16 ? kd_bf16_to_f32(w_bf16[i]) : (w_f32 ? w_f32[i] : 1.0f);
		float o = __fmul_rn(__fmul_rn(v, rs), w);
		yr[i] = bf16_out ? kd_bf16_round(o) : o;
	}
}

extern "C" enum status kern_rmsnorm_cuda_generic(const struct kern_rmsnorm_args *a)
{
	if (!a || !a->x || !a->y || a->dim <= 0 || a->n_rows < 0 || (a->w_bf16 && a->w_f32))
		return ST_INVALID;
	int64_t xs = a->x_stride ? a->x_stride : a->dim;
	int64_t ys = a->y_stride ? a->y_stride : a->dim;
	if (xs < a->dim || ys < a->dim)
		return ST_INVALID;
	cudaStream_t st = (cudaStream_t)a->stream;
	for (int64_t r0 = 0; r0 < a->n_rows; r0 += 65535LL * 1024) {
		int64_t n = a->n_rows - r0 < 65535LL * 1024 ? a->n_rows - r0 : 65535LL * 1024;
		rmsnorm_kernel<<<(unsigned)n, NORM_NT, 0, st>>>(a->x + r0 * xs, a->y + r0 * ys, a->w_bf16, a->w_f32,
							      a->dim, xs, ys, a->eps, a->bf16_in, a->bf16_out,
							      a->bf16_stats);
	}
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

extern "C" enum status kern_rmsnorm_cuda_generic_host(const struct kern_rmsnorm_args *a)
{
	if (!a || !a->x || !a->y || a->dim <= 0 || a->n_rows < 0 || (a->w_bf16 && a->w_f32))
		return ST_INVALID;
	int64_t xs = a->x_stride ? a->x_stride : a->dim;
	int64_t ys = a->y_stride ? a->y_stride : a->dim;
	if (xs < a->dim || ys < a->dim)
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	size_t xb = (size_t)((a->n_rows - 1) * xs + a->dim) * sizeof(float);
	size_t yb = (size_t)((a->n_rows - 1) * ys + a->dim) * sizeof(float);
	struct kern_hbufs b = {};
	struct kern_rmsnorm_args d = *a;
	if (a->x == a->y) { /* in place: one buffer, copied in and back */
		d.x = (const float *)kern_hb_up(&b, a->x, xb > yb ? xb : yb, true);
		d.y = (float *)d.x;
	} else {
		d.x = (const float *)kern_hb_up(&b, a->x, xb, false);
		d.y = (float *)kern_hb_up(&b, a->y, yb, true); /* keeps the gaps between rows */
	}
	d.w_bf16 = (const uint16_t *)kern_hb_up(&b, a->w_bf16, a->dim * sizeof(uint16_t), false);
	d.w_f32 = (const float *)kern_hb_up(&b, a->w_f32, a->dim * sizeof(float), false);
	d.stream = NULL;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_rmsnorm_cuda_generic(&d) : ST_CUDA);
}
