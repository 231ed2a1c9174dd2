/*
 * kernels/linear/linear_generic.cu: the portable CUDA FP8 block-scaled
 * linear (variant linear_cuda_generic), for every cc >= 8.0.
 *
 * One kernel, no tensor cores: each block computes a 16-token x 64-output
 * tile with f32 FMA over K tiles of 128 (one scale block), the tile of
 * fma_tile.cuh (shared with moe_gemm_generic.cu): activations staged with
 * the reference's FP8 act_quant (bit-identical to the CPU), e4m3 weights
 * times their one f32 block scale, 4 outputs per thread, k ascending.
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
#include "kernels/device/host_bufs.cuh"
#include "kernels/linear/fma_tile.cuh"

enum { WK_FP8 = 0, WK_BF16 = 1, WK_F32 = 2 }; /* weight kinds the kernel decodes */

__global__ void __launch_bounds__(FT_NT) linear_generic_kernel(
	int64_t T, int64_t in, int64_t out, const void *__restrict__ x, int x_dt, int64_t ldx, void *__restrict__ y,
	int y_dt, int64_t ldy, const void *__restrict__ w, int wkind, const float *__restrict__ wscale, int act_quant)
{
	__shared__ struct ft_smem s;
	const struct ft_lanes l = ft_lanes_of(threadIdx.x);
	const int64_t n0 = (int64_t)blockIdx.x * FT_TN, t0 = (int64_t)blockIdx.y * FT_TM;
	const int64_t nbc = (in + FT_TK - 1) / FT_TK;
	const int64_t xrow = t0 + l.xr < T ? t0 + l.xr : -1, o = n0 + l.wr;
	float acc[4] = {0.f, 0.f, 0.f, 0.f};

	for (int64_t k0 = 0; k0 < in; k0 += FT_TK) {
		ft_stage_x(&s, &l, x, x_dt, ldx, xrow, k0, in, act_quant);
		if (wkind == WK_FP8)
			ft_stage_w_fp8(&s, &l, (const uint8_t *)w, o < out ? wscale[(o / 128) * nbc + k0 / FT_TK] : 0.f, o,
				       out, k0, in);
		else
			ft_stage_w_wide(&s, &l, w, wkind == WK_BF16 ? KERN_DT_BF16 : KERN_DT_F32, o, out, k0, in);
		__syncthreads();
		ft_fma(&s, &l, acc);
		__syncthreads();
	}
	ft_store(&l, acc, y, y_dt, ldy, t0, T, n0, out);
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
	const int64_t gy = (a->n_tokens + FT_TM - 1) / FT_TM;
	if (gy > 65535)
		return ST_INVALID; /* more than 1M tokens per call */
	dim3 grid((unsigned)((out + FT_TN - 1) / FT_TN), (unsigned)gy);
	linear_generic_kernel<<<grid, FT_NT, 0, (cudaStream_t)a->stream>>>(
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
	struct kern_hbufs b = {};
	struct kern_wmat dwm = *a->w;
	dwm.owned = NULL;
	dwm.data = kern_hb_up(&b, a->w->data, kern_wmat_data_bytes(a->w), false);
	dwm.scale = kern_hb_up(&b, a->w->scale, kern_wmat_scale_bytes(a->w), false);
	struct kern_linear_args da = *a;
	da.x = kern_hb_up(&b, a->x, xb, false);
	da.y = kern_hb_up(&b, a->y, yb, true); /* keeps unwritten sentinels */
	da.w = &dwm;
	da.stream = 0;
	if (workspace_bytes) {
		da.workspace = kern_hb_alloc(&b, workspace_bytes); /* 256-byte aligned */
		da.workspace_bytes = workspace_bytes;
	}
	return kern_hb_finish(&b, b.ce == cudaSuccess ? fn(&da) : ST_CUDA);
}

extern "C" enum status kern_linear_cuda_generic_host(const struct kern_linear_args *a)
{
	if (a->w && a->w->fmt != KERN_WFMT_FP8_F32_B128 && a->w->fmt != KERN_WFMT_BF16 && a->w->fmt != KERN_WFMT_F32)
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_cuda_generic, 0);
}
