/*
 * kernels/moe_gemm/moe_gemm_mma.cu: the portable tensor-core grouped FP4
 * expert GEMM (moe_gemm_mma.h) on the shared kernel of mma_gemm.cuh.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/device/ctx.h"
#include "kernels/moe_gemm/moe_gemm_mma.h"
#include "kernels/moe_gemm/moe_gemv.h"
}
#include "kernels/linear/mma_gemm.cuh"

extern "C" size_t kern_moe_gemm_mma_scratch_bytes(int64_t x_rows, int64_t in, bool bf16)
{
	return mg_scratch_bytes(x_rows, in, bf16 ? MG_MMA_BF16 : MG_MMA_FP8);
}

template <int MODE>
static enum status moe_mma_run(const struct kern_moe_gemm_args *a)
{
	if (!a->w || !a->w_dev || !a->x || !a->y || !a->expert_offsets || a->n_experts <= 0)
		return ST_INVALID;
	const enum kern_wfmt f = a->w[0].fmt;
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	if ((f != KERN_WFMT_MXFP4 && f != KERN_WFMT_NVFP4) || in % MG_BK || out <= 0 || a->act_quant_block != 128)
		return ST_INVALID;
	if (a->n_rows < 0 || (a->row_src && a->n_x_rows <= 0))
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	if (ldx < in || ldy < out)
		return ST_INVALID;
	const int64_t slots = (a->n_rows + MG_BM - 1) / MG_BM + a->n_experts;
	if (slots > 65535)
		return ST_INVALID;
	const int64_t x_rows = a->row_src ? a->n_x_rows : a->n_rows;
	const size_t need = mg_scratch_bytes(x_rows, in, MODE);
	void *scratch = kern_ctx_scratch(kern_ctx_or_default(a->ctx), need, a->stream);
	if (!scratch)
		return ST_NOMEM;
	mg_params P = {};
	P.n_experts = a->n_experts;
	P.offsets = a->expert_offsets;
	P.n_rows = a->n_rows;
	P.row_src = a->row_src;
	P.in = in;
	P.out = out;
	P.w_dev = a->w_dev;
	P.y = a->y;
	P.y_dt = (int)a->y_dtype;
	P.ldy = ldy;
	cudaStream_t s = (cudaStream_t)a->stream;
	cudaError_t ce = f == KERN_WFMT_MXFP4
				 ? mg_launch<MG_W_MXFP4, MODE>(P, x_rows, a->x, (int)a->x_dtype, ldx, scratch, slots, s)
				 : mg_launch<MG_W_NVFP4, MODE>(P, x_rows, a->x, (int)a->x_dtype, ldx, scratch, slots, s);
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_moe_gemm_mma_fp8_only(const struct kern_moe_gemm_args *a)
{
	return moe_mma_run<MG_MMA_FP8>(a);
}

extern "C" enum status kern_moe_gemm_mma_bf16_only(const struct kern_moe_gemm_args *a)
{
	return moe_mma_run<MG_MMA_BF16>(a);
}

extern "C" enum status kern_moe_gemm_mma_fp8(const struct kern_moe_gemm_args *a)
{
	if (a->n_rows <= KERN_MOE_GEMV_MAX_ROWS)
		return kern_moe_gemv_cuda(a);
	return moe_mma_run<MG_MMA_FP8>(a);
}

extern "C" enum status kern_moe_gemm_mma_bf16(const struct kern_moe_gemm_args *a)
{
	if (a->n_rows <= KERN_MOE_GEMV_MAX_ROWS)
		return kern_moe_gemv_cuda(a);
	return moe_mma_run<MG_MMA_BF16>(a);
}

extern "C" enum status kern_moe_gemm_mma_fp8_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_mma_fp8);
}

extern "C" enum status kern_moe_gemm_mma_bf16_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_mma_bf16);
}

extern "C" enum status kern_moe_gemm_mma_fp8_only_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_mma_fp8_only);
}

extern "C" enum status kern_moe_gemm_mma_bf16_only_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_mma_bf16_only);
}

extern "C" bool kern_moe_gemm_mma_fp8_compiled_on(int device)
{
	int prev = -1;
	if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
		cudaGetLastError();
		return false;
	}
	const bool ok = mg_fp8_compiled<MG_W_MXFP4>() && mg_fp8_compiled<MG_W_NVFP4>();
	if (prev != device)
		(void)cudaSetDevice(prev);
	return ok;
}
