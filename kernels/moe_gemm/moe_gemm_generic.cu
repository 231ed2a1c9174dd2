/*
 * kernels/moe_gemm/moe_gemm_generic.cu: the portable CUDA grouped expert
 * GEMM for FP4 experts (variant moe_gemm_cuda_generic), every cc >= 8.0.
 *
 * Varlen over experts without host involvement: the grid has
 * ceil(n_rows/16) + n_experts row-tile slots (an upper bound on
 * Σ_e ceil(rows_e/16)); each block finds its (expert, 16-row tile) by a scan
 * of the device offsets and exits if it has none. Per 128-wide K tile it
 * gathers its rows through row_src (with the optional FP8 act_quant, as in
 * linear_generic.cu), decodes 64 weight rows of e2m1 with their MXFP4
 * (E8M0 per 32) or NVFP4 (e4m3 per 16 times the expert's global) scales into
 * shared memory, and accumulates with f32 FMA, 4 outputs per thread. FP8
 * experts (128x128 E8M0 or f32 block scales: the Base model and FP8
 * conversions) are decoded the same way.
 * W4A16-style: the floor on every GPU, including sm_90 which has no FP4 MMA.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/moe_gemm/moe_gemm.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define TM 16
#define TN 64
#define TK 128
#define NT 256

__global__ void __launch_bounds__(NT) moe_gemm_generic_kernel(
	int64_t n_experts, const int32_t *__restrict__ offsets, const int32_t *__restrict__ row_src,
	int64_t in, int64_t out, const void *__restrict__ x, int x_dt, int64_t ldx, void *__restrict__ y, int y_dt,
	int64_t ldy, const struct kern_wmat *__restrict__ w, int act_quant)
{
	__shared__ float xs[TM][TK + 1];
	__shared__ float ws[TN][TK + 1];
	__shared__ int sh_expert, sh_r0, sh_r1;
	const int tid = threadIdx.x;
	if (tid == 0) {
		/* Which expert and which 16-row tile of it this block owns. */
		int64_t slot = blockIdx.y, cum = 0;
		sh_expert = -1;
		for (int64_t e = 0; e < n_experts; e++) {
			const int32_t b = offsets[e], c = offsets[e + 1];
			const int64_t tiles = (c - b + TM - 1) / TM;
			if (slot < cum + tiles) {
				sh_expert = (int)e;
				sh_r0 = b + (int)(slot - cum) * TM;
				sh_r1 = min(sh_r0 + TM, c);
				break;
			}
			cum += tiles;
		}
	}
	__syncthreads();
	const int e = sh_expert;
	if (e < 0)
		return;
	const int r0 = sh_r0, r1 = sh_r1;
	const struct kern_wmat wm = w[e];
	const bool nv = wm.fmt == KERN_WFMT_NVFP4;
	const bool fp8 = wm.fmt == KERN_WFMT_FP8_E8M0_B128 || wm.fmt == KERN_WFMT_FP8_F32_B128;
	const int64_t nbc = (in + TK - 1) / TK; /* FP8 scale blocks per row */
	const uint8_t *wd = (const uint8_t *)wm.data, *wsc = (const uint8_t *)wm.scale;
	const int64_t n0 = (int64_t)blockIdx.x * TN;
	const int col = tid % TN, trow = (tid / TN) * 4;
	const int xr = tid / 16, xseg = (tid % 16) * 8;
	const int wr = tid / 4, wseg = (tid % 4) * 32;
	const int r = r0 + xr;
	const int64_t src = r < r1 ? (row_src ? row_src[r] : r) : -1;
	float acc[4] = {0.f, 0.f, 0.f, 0.f};

	for (int64_t k0 = 0; k0 < in; k0 += TK) {
		float v[8];
		float amax = 0.f;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const int64_t k = k0 + xseg + i;
			v[i] = (src >= 0 && k < in) ? kq_load(x, x_dt, src * ldx + k) : 0.f;
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

		/* 32 elements per thread: FP8 with the tile's one 128x128 block scale
		 * (64 rows never straddle a 128-row block; E8M0 decoded directly,
		 * which is exact), or 16 bytes of e2m1: one MXFP4 block, two NVFP4 ones. */
		const int64_t o = n0 + wr, kb = k0 + wseg;
		if (fp8) {
			float s = 0.f;
			if (o < out) {
				const int64_t si = (o / 128) * nbc + k0 / TK;
				s = wm.fmt == KERN_WFMT_FP8_F32_B128 ? ((const float *)wm.scale)[si] : kq_e8m0_to_f32(wsc[si]);
			}
#pragma unroll 4
			for (int i = 0; i < 32; i++) {
				const int64_t k = kb + i;
				ws[wr][wseg + i] = (o < out && k < in) ? kq_e4m3_to_f32(wd[o * in + k]) * s : 0.f;
			}
		} else if (o < out && kb < in) {
			const uint8_t *p = wd + o * (in / 2) + kb / 2;
			float s0, s1;
			if (nv) {
				s0 = kq_e4m3_to_f32(wsc[o * (in / 16) + kb / 16]) * wm.global_scale;
				s1 = kq_e4m3_to_f32(wsc[o * (in / 16) + kb / 16 + 1]) * wm.global_scale;
			} else {
				s0 = s1 = kq_e8m0_to_f32(wsc[o * (in / 32) + kb / 32]);
			}
#pragma unroll
			for (int i = 0; i < 16; i++) {
				const uint32_t b = p[i];
				const float s = i < 8 ? s0 : s1;
				ws[wr][wseg + 2 * i] = kq_e2m1_to_f32(b & 0xFu) * s;
				ws[wr][wseg + 2 * i + 1] = kq_e2m1_to_f32(b >> 4) * s;
			}
		} else {
#pragma unroll
			for (int i = 0; i < 32; i++)
				ws[wr][wseg + i] = 0.f;
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
			const int rr = r0 + trow + i;
			if (rr < r1)
				kq_store(y, y_dt, (int64_t)rr * ldy + o, acc[i]);
		}
}

extern "C" enum status kern_moe_gemm_cuda_generic(const struct kern_moe_gemm_args *a)
{
	if (!a->w || !a->w_dev || a->n_experts <= 0)
		return ST_INVALID;
	const enum kern_wfmt f = a->w[0].fmt;
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	const bool fp4 = f == KERN_WFMT_MXFP4 || f == KERN_WFMT_NVFP4;
	if (!fp4 && f != KERN_WFMT_FP8_E8M0_B128 && f != KERN_WFMT_FP8_F32_B128)
		return ST_INVALID;
	if (fp4 && in % 32)
		return ST_INVALID;
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const int64_t slots = (a->n_rows + TM - 1) / TM + a->n_experts;
	if (slots > 65535)
		return ST_INVALID;
	dim3 grid((unsigned)((out + TN - 1) / TN), (unsigned)slots);
	moe_gemm_generic_kernel<<<grid, NT, 0, (cudaStream_t)a->stream>>>(
		a->n_experts, a->expert_offsets, a->row_src, in, out, a->x, (int)a->x_dtype, ldx, a->y,
		(int)a->y_dtype, ldy, a->w_dev, a->act_quant_block != 0);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

struct dev_bufs {
	void *p[8];
	int n;
	cudaError_t ce;
};

static void *dev_copy(struct dev_bufs *b, const void *src, size_t bytes)
{
	void *d = NULL;
	if (b->ce != cudaSuccess || b->n >= 8)
		return NULL;
	b->ce = cudaMalloc(&d, bytes ? bytes : 1);
	if (b->ce != cudaSuccess)
		return NULL;
	b->p[b->n++] = d;
	if (src && bytes)
		b->ce = cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
	return d;
}

extern "C" enum status kern_moe_gemm_cuda_generic_host(const struct kern_moe_gemm_args *a)
{
	enum status st = kern_moe_gemm_args_check(a, NULL);
	if (st)
		return st;
	const int64_t E = a->n_experts, R = a->n_rows, in = a->w[0].cols, out = a->w[0].rows;
	if (R == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const size_t xb = (size_t)((a->n_x_rows - 1) * ldx + in) * kern_dtype_bytes(a->x_dtype);
	const size_t yb = (size_t)((R - 1) * ldy + out) * kern_dtype_bytes(a->y_dtype);
	const size_t wb = kern_wmat_data_bytes(&a->w[0]), sb = kern_wmat_scale_bytes(&a->w[0]);
	struct dev_bufs b = {{0}, 0, cudaSuccess};
	void *dx = dev_copy(&b, a->x, xb);
	void *dy = dev_copy(&b, a->y, yb); /* keeps unwritten sentinels visible */
	void *doff = dev_copy(&b, a->expert_offsets, (size_t)(E + 1) * sizeof(int32_t));
	void *dsrc = a->row_src ? dev_copy(&b, a->row_src, (size_t)R * sizeof(int32_t)) : NULL;
	/* Per expert: data, then scales at a 16-byte aligned offset (f32 scales). */
	const size_t wb_al = (wb + 15) & ~(size_t)15, stride = wb_al + ((sb + 15) & ~(size_t)15);
	uint8_t *dw = (uint8_t *)dev_copy(&b, NULL, (size_t)E * stride);
	struct kern_wmat *hw = (struct kern_wmat *)calloc((size_t)E, sizeof *hw);
	if (!hw) {
		for (int i = 0; i < b.n; i++)
			cudaFree(b.p[i]);
		return ST_NOMEM;
	}
	for (int64_t e = 0; e < E && b.ce == cudaSuccess; e++) {
		hw[e] = a->w[e];
		hw[e].owned = NULL;
		hw[e].data = dw + e * stride;
		hw[e].scale = dw + e * stride + wb_al;
		b.ce = cudaMemcpy((void *)hw[e].data, a->w[e].data, wb, cudaMemcpyHostToDevice);
		if (b.ce == cudaSuccess)
			b.ce = cudaMemcpy((void *)hw[e].scale, a->w[e].scale, sb, cudaMemcpyHostToDevice);
	}
	void *dwm = dev_copy(&b, hw, (size_t)E * sizeof *hw);
	if (b.ce == cudaSuccess) {
		struct kern_moe_gemm_args da = *a;
		da.x = dx;
		da.y = dy;
		da.expert_offsets = (const int32_t *)doff;
		da.row_src = (const int32_t *)dsrc;
		da.w = hw;
		da.w_dev = (const struct kern_wmat *)dwm;
		da.stream = 0;
		st = kern_moe_gemm_cuda_generic(&da);
		if (st == ST_OK) {
			b.ce = cudaDeviceSynchronize();
			if (b.ce == cudaSuccess)
				b.ce = cudaMemcpy(a->y, dy, yb, cudaMemcpyDeviceToHost);
		}
	}
	cudaError_t ce = b.ce;
	for (int i = 0; i < b.n; i++)
		cudaFree(b.p[i]);
	free(hw);
	if (st)
		return st;
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}
