/*
 * kernels/linear/linear_mma.cu: the portable tensor-core FP8 linear
 * (linear_mma.h). A linear is the grouped GEMM of mma_gemm.cuh with one
 * expert owning every row.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/device/ctx.h"
#include "kernels/linear/linear_mma.h"
}
#include "kernels/linear/mma_gemm.cuh"

extern "C" size_t kern_linear_mma_scratch_bytes(int64_t n_tokens, int64_t in, bool bf16)
{
	return mg_scratch_bytes(n_tokens, in, bf16 ? MG_MMA_BF16 : MG_MMA_FP8);
}

template <int MODE>
static enum status linear_mma_run(const struct kern_linear_args *a)
{
	if (!a->w || !a->x || !a->y || a->w->fmt != KERN_WFMT_FP8_F32_B128 || !a->w->data || !a->w->scale)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if (a->act_quant_block != 128 || in % MG_BK || out <= 0 || T < 0 || (uintptr_t)a->w->data % 16 ||
	    (uintptr_t)a->w->scale % 4)
		return ST_INVALID;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	if (ldx < in || ldy < out)
		return ST_INVALID;
	if (T == 0)
		return ST_OK;
	const int64_t tiles = (T + MG_BM - 1) / MG_BM;
	if (tiles > 65535)
		return ST_INVALID;
	cudaStream_t s = (cudaStream_t)a->stream;
	const size_t need = mg_scratch_bytes(T, in, MODE);
	void *scratch = a->workspace && a->workspace_bytes >= need ? a->workspace : NULL;
	if (!scratch)
		scratch = kern_ctx_scratch(kern_ctx_or_default(a->ctx), need, a->stream);
	if (!scratch)
		return ST_NOMEM;
	mg_params P = {};
	P.n_experts = 1;
	P.n_rows = T;
	P.in = in;
	P.out = out;
	P.w0 = *a->w;
	P.y = a->y;
	P.y_dt = (int)a->y_dtype;
	P.ldy = ldy;
	cudaError_t ce = mg_launch<MG_W_FP8, MODE>(P, T, a->x, (int)a->x_dtype, ldx, scratch, tiles, s);
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_linear_mma_fp8(const struct kern_linear_args *a)
{
	return linear_mma_run<MG_MMA_FP8>(a);
}

extern "C" enum status kern_linear_mma_bf16(const struct kern_linear_args *a)
{
	return linear_mma_run<MG_MMA_BF16>(a);
}

extern "C" enum status kern_linear_mma_fp8_host(const struct kern_linear_args *a)
{
	return kern_linear_run_on_host_buffers(a, kern_linear_mma_fp8, 0);
}

extern "C" enum status kern_linear_mma_bf16_host(const struct kern_linear_args *a)
{
	return kern_linear_run_on_host_buffers(a, kern_linear_mma_bf16, 0);
}

extern "C" bool kern_linear_mma_fp8_compiled(void)
{
	return mg_fp8_compiled<MG_W_FP8>();
}
