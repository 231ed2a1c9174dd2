/*
 * kernels/sampling/logprobs_generic.cu: the portable CUDA variant of op
 * "token_logprobs" (logprobs.h), cc >= 8.0. One CTA per row over the device
 * logits: the max, a double tree sum of exp(l - max) (the log-sum-exp), the
 * count of logits above the target's (its rank), and the top n by repeated
 * block argmax in (logit desc, id asc) order, skipping the ids already
 * taken. The targets go up in one copy and only the per-row results come
 * back; the call waits for the stream.
 */
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/sampling/logprobs_generic.h"
}

#include "kernels/device/host_bufs.cuh"
#include "kernels/sampling/sampling_cuda.cuh"

#define LNT 256

namespace {

struct ISumOp {
	__device__ __forceinline__ int operator()(int a, int b) const { return a + b; }
};

typedef cub::BlockReduce<float, LNT> BRf;
typedef cub::BlockReduce<double, LNT> BRd;
typedef cub::BlockReduce<Best, LNT> BRb;
typedef cub::BlockReduce<int, LNT> BRi;

union Smem {
	BRf::TempStorage f;
	BRd::TempStorage d;
	BRb::TempStorage b;
	BRi::TempStorage i;
};


__global__ void __launch_bounds__(LNT)
	token_logprobs_kernel(const float *logits, int64_t ld, uint32_t V, const int32_t *target, uint32_t n_top,
			      float *lp_out, int32_t *rank_out, int32_t *top_ids, float *top_lp)
{
	__shared__ Smem sm;
	__shared__ int32_t taken[KERN_SAMPLE_MAX_TOP_LOGPROBS];
	const uint32_t r = blockIdx.x, tid = threadIdx.x;
	const float *x = logits + (size_t)r * ld;
	float mx = -INFINITY;
	for (uint32_t v = tid; v < V; v += LNT)
		mx = fmaxf(mx, x[v]);
	mx = blk_reduce<float, BRf>(sm.f, mx, FMaxOp());
	double s = 0.0;
	for (uint32_t v = tid; v < V; v += LNT)
		s += exp((double)x[v] - (double)mx);
	s = blk_reduce<double, BRd>(sm.d, s, DSumOp());
	const double lse = (double)mx + log(s);
	const int32_t t = target[r];
	if (t >= 0) {
		const float tv = x[t];
		int above = 0;
		for (uint32_t v = tid; v < V; v += LNT)
			above += x[v] > tv;
		above = blk_reduce<int, BRi>(sm.i, above, ISumOp());
		if (tid == 0) {
			lp_out[r] = (float)((double)tv - lse);
			rank_out[r] = above + 1;
		}
	} else if (tid == 0) {
		lp_out[r] = 0.0f;
		rank_out[r] = 0;
	}
	for (uint32_t k = 0; k < n_top; k++) {
		Best b = {-INFINITY, -1};
		for (uint32_t v = tid; v < V; v += LNT) {
			bool skip = false;
			for (uint32_t j = 0; j < k; j++)
				skip |= taken[j] == (int32_t)v;
			if (skip)
				continue;
			Best c = {x[v], (int32_t)v};
			b = BestOp()(b, c);
		}
		b = blk_reduce<Best, BRb>(sm.b, b, BestOp());
		if (tid == 0) {
			taken[k] = b.id;
			top_ids[(size_t)r * n_top + k] = b.id;
			top_lp[(size_t)r * n_top + k] = b.id >= 0 ? (float)((double)b.v - lse) : -INFINITY;
		}
		__syncthreads();
	}
}

} // namespace

extern "C" enum status kern_token_logprobs_cuda_generic(const struct kern_token_logprobs_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab || a->n_top > KERN_SAMPLE_MAX_TOP_LOGPROBS)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits || !a->target || !a->logprob || !a->rank || (a->n_top && (!a->top_ids || !a->top_logprobs)) ||
	    !a->work || ((uintptr_t)a->work & 255) ||
	    a->work_bytes < kern_token_logprobs_workspace_bytes(a->n_rows, a->n_top))
		return ST_INVALID;
	const uint32_t R = a->n_rows, N = a->n_top;
	for (uint32_t r = 0; r < R; r++)
		if (a->target[r] < -1 || a->target[r] >= (int32_t)a->vocab)
			return ST_INVALID;
	const size_t rb = ((size_t)R * 4 + 255) & ~(size_t)255, tb = ((size_t)R * N * 4 + 255) & ~(size_t)255;
	uint8_t *wk = (uint8_t *)a->work;
	int32_t *d_target = (int32_t *)wk;
	float *d_lp = (float *)(wk + rb);
	int32_t *d_rank = (int32_t *)(wk + 2 * rb);
	int32_t *d_top = (int32_t *)(wk + 3 * rb);
	float *d_toplp = (float *)(wk + 3 * rb + tb);
	cudaStream_t s = (cudaStream_t)a->stream;
	if (cudaMemcpyAsync(d_target, a->target, (size_t)R * 4, cudaMemcpyHostToDevice, s) != cudaSuccess)
		return ST_CUDA;
	token_logprobs_kernel<<<R, LNT, 0, s>>>(a->logits, a->ld, a->vocab, d_target, N, d_lp, d_rank, d_top, d_toplp);
	if (cudaGetLastError() != cudaSuccess)
		return ST_CUDA;
	if (cudaMemcpyAsync(a->logprob, d_lp, (size_t)R * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
	    cudaMemcpyAsync(a->rank, d_rank, (size_t)R * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
	    (N && cudaMemcpyAsync(a->top_ids, d_top, (size_t)R * N * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess) ||
	    (N && cudaMemcpyAsync(a->top_logprobs, d_toplp, (size_t)R * N * 4, cudaMemcpyDeviceToHost, s) !=
			  cudaSuccess) ||
	    cudaStreamSynchronize(s) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_token_logprobs_cuda_generic_host(const struct kern_token_logprobs_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits)
		return ST_INVALID;
	const size_t nl = (size_t)(a->n_rows - 1) * (size_t)a->ld + a->vocab;
	const size_t ws = kern_token_logprobs_workspace_bytes(a->n_rows, a->n_top);
	struct kern_hbufs b = {};
	struct kern_token_logprobs_args d = *a;
	d.logits = (const float *)kern_hb_up(&b, a->logits, nl * sizeof(float), false);
	d.work = kern_hb_alloc(&b, ws);
	d.work_bytes = ws;
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_token_logprobs_cuda_generic(&d) : ST_CUDA);
}
