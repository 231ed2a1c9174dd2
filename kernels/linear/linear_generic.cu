/*
 * kernels/linear/linear_generic.cu: the portable CUDA FP8 block-scaled
 * linear (variant linear_cuda_generic), for every cc >= 8.0.
 *
 * One kernel, no tensor cores: each block computes a 16-token x 64-output
 * tile with f32 FMA over K tiles of 128 (one scale block). Per K tile it
 *   - loads 16 x 128 activations into shared memory, optionally applying the
 *     reference's FP8 act_quant (amax over the 128-column block by a 16-lane
 *     shuffle reduction, pow2-ceil scale, e4m3 RNE), bit-identical to the CPU;
 *   - decodes 64 x 128 e4m3 weights times their one f32 block scale (64 rows
 *     never straddle a 128-row scale block) into shared memory;
 *   - accumulates 4 outputs per thread, k ascending (the CPU order).
 * The same kernel serves bf16 / f32 weights (lm_head, router gate,
 * dequantized checkpoints) as variant linear_cuda_generic_bf16.
 * It is the floor, not the fast path: the sm_90a/sm_100a/sm_120a variants
 * replace it where they exist. Weights are FP8_F32_B128 (prepare() widens
 * E8M0 at load). Registers stay modest (4 accumulators).
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/linear/linear.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define TM 16   /* tokens per block */
#define TN 64   /* outputs per block */
#define TK 128  /* K per tile = scale block */
#define NT 256  /* threads */

enum { WK_FP8 = 0, WK_BF16 = 1, WK_F32 = 2 }; /* weight kinds the kernel decodes */

__global__ void __launch_bounds__(NT) linear_generic_kernel(
	int64_t T, int64_t in, int64_t out, const void *__restrict__ x, int x_dt, int64_t ldx, void *__restrict__ y,
	int y_dt, int64_t ldy, const void *__restrict__ w, int wkind, const float *__restrict__ wscale, int act_quant)
{
	__shared__ float xs[TM][TK + 1];
	__shared__ float ws[TN][TK + 1];
	const int tid = threadIdx.x;
	const int64_t n0 = (int64_t)blockIdx.x * TN, t0 = (int64_t)blockIdx.y * TM;
	const int64_t nbc = (in + TK - 1) / TK;
	const int col = tid % TN, trow = (tid / TN) * 4; /* compute layout: 1 output x 4 tokens */
	const int xr = tid / 16, xseg = (tid % 16) * 8;  /* x load layout: 16 lanes per row, 8 each */
	const int wr = tid / 4, wseg = (tid % 4) * 32;   /* w load layout: 4 threads per row, 32 each */
	float acc[4] = {0.f, 0.f, 0.f, 0.f};

	for (int64_t k0 = 0; k0 < in; k0 += TK) {
		/* Activations (and their act_quant over this 128-column block). */
		float v[8];
		float amax = 0.f;
		const int64_t t = t0 + xr;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const int64_t k = k0 + xseg + i;
			v[i] = (t < T && k < in) ? kq_load(x, x_dt, t * ldx + k) : 0.f;
			amax = fmaxf(amax, fabsf(v[i]));
		}
		if (act_quant) {
#pragma unroll
			for (int off = 8; off > 0; off >>= 1)
				amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
			const float s = kq_fp8_block_scale(amax);
#pragma unroll
			for (int i = 0; i < 8; i++)
				v[i] = kq_fp8_qdq(v[i], s);
		}
#pragma unroll
		for (int i = 0; i < 8; i++)
			xs[xr][xseg + i] = v[i];

		/* Weights: e4m3 times the tile's block scale, or bf16 / f32 as stored. */
		const int64_t o = n0 + wr;
		if (wkind == WK_FP8) {
			const float s = (o < out) ? wscale[(o / 128) * nbc + k0 / TK] : 0.f;
			const uint8_t *wrow = (const uint8_t *)w + o * in;
#pragma unroll 4
			for (int i = 0; i < 32; i++) {
				const int64_t k = k0 + wseg + i;
				ws[wr][wseg + i] = (o < out && k < in) ? kq_e4m3_to_f32(wrow[k]) * s : 0.f;
			}
		} else {
			const int dt = wkind == WK_BF16;
#pragma unroll 4
			for (int i = 0; i < 32; i++) {
				const int64_t k = k0 + wseg + i;
				ws[wr][wseg + i] = (o < out && k < in) ? kq_load(w, dt, o * in + k) : 0.f;
			}
		}
		__syncthreads();

#pragma unroll 8
		for (int k = 0; k < TK; k++) {
			const float wv = ws[col][k];
#pragma unroll
			for (int i = 0; i < 4; i++)
				acc[i] = fmaf(xs[trow + i][k], wv, acc[i]);
		}
		__syncthreads();
	}
	const int64_t o = n0 + col;
	if (o < out)
		for (int i = 0; i < 4; i++) {
			const int64_t t = t0 + trow + i;
			if (t < T)
				kq_store(y, y_dt, t * ldy + o, acc[i]);
		}
}

extern "C" enum status kern_linear_cuda_generic(const struct kern_linear_args *a)
{
	if (!a->w)
		return ST_INVALID;
	int wkind;
	switch (a->w->fmt) {
	case KERN_WFMT_FP8_F32_B128: wkind = WK_FP8; break;
	case KERN_WFMT_BF16: wkind = WK_BF16; break;
	case KERN_WFMT_F32: wkind = WK_F32; break;
	default: return ST_INVALID; /* E8M0 scales must be widened by prepare() first */
	}
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows;
	if (a->n_tokens == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const int64_t gy = (a->n_tokens + TM - 1) / TM;
	if (gy > 65535)
		return ST_INVALID; /* more than 1M tokens per call */
	dim3 grid((unsigned)((out + TN - 1) / TN), (unsigned)gy);
	linear_generic_kernel<<<grid, NT, 0, (cudaStream_t)a->stream>>>(
		a->n_tokens, in, out, a->x, (int)a->x_dtype, ldx, a->y, (int)a->y_dtype, ldy,
		a->w->data, wkind, (const float *)a->w->scale, a->act_quant_block != 0);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

extern "C" enum status kern_linear_run_on_host_buffers(const struct kern_linear_args *a, kern_linear_fn fn,
							size_t workspace_bytes)
{
	enum status st = kern_linear_args_check(a, NULL);
	if (st)
		return st;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if (T == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const size_t xb = (size_t)((T - 1) * ldx + in) * kern_dtype_bytes(a->x_dtype);
	const size_t yb = (size_t)((T - 1) * ldy + out) * kern_dtype_bytes(a->y_dtype);
	const size_t wb = kern_wmat_data_bytes(a->w), sb = kern_wmat_scale_bytes(a->w);
	void *dx = NULL, *dy = NULL, *dw = NULL, *ds = NULL, *dws = NULL;
	cudaError_t ce = cudaMalloc(&dx, xb);
	if (ce == cudaSuccess) ce = cudaMalloc(&dy, yb);
	if (ce == cudaSuccess) ce = cudaMalloc(&dw, wb);
	if (ce == cudaSuccess) ce = cudaMalloc(&ds, sb ? sb : 1);
	if (ce == cudaSuccess && workspace_bytes) ce = cudaMalloc(&dws, workspace_bytes); /* 256-byte aligned */
	if (ce == cudaSuccess) ce = cudaMemcpy(dx, a->x, xb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess) ce = cudaMemcpy(dy, a->y, yb, cudaMemcpyHostToDevice); /* keeps unwritten sentinels */
	if (ce == cudaSuccess) ce = cudaMemcpy(dw, a->w->data, wb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess && sb) ce = cudaMemcpy(ds, a->w->scale, sb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess) {
		struct kern_wmat dwm = *a->w;
		dwm.data = dw;
		dwm.scale = sb ? ds : NULL;
		dwm.owned = NULL;
		struct kern_linear_args da = *a;
		da.x = dx;
		da.y = dy;
		da.w = &dwm;
		da.stream = 0;
		if (workspace_bytes) {
			da.workspace = dws;
			da.workspace_bytes = workspace_bytes;
		}
		st = fn(&da);
		if (st == ST_OK) {
			ce = cudaDeviceSynchronize();
			if (ce == cudaSuccess)
				ce = cudaMemcpy(a->y, dy, yb, cudaMemcpyDeviceToHost);
		}
	}
	cudaFree(dx);
	cudaFree(dy);
	cudaFree(dw);
	cudaFree(ds);
	cudaFree(dws);
	if (st)
		return st;
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_linear_cuda_generic_host(const struct kern_linear_args *a)
{
	if (a->w && a->w->fmt != KERN_WFMT_FP8_F32_B128 && a->w->fmt != KERN_WFMT_BF16 && a->w->fmt != KERN_WFMT_F32)
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_cuda_generic, 0);
}
