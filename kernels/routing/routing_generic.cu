/*
 * kernels/routing/routing_generic.cu: portable CUDA MoE routing for every
 * cc >= 8.0 (variant route_cuda_generic; contract in routing.h). The
 * grouping of (token, slot) pairs by expert is op moe_dispatch's.
 *
 *   route_kernel      one 256-thread block per token: σ_e = sqrt(softplus(ℓ_e))
 *                     (+ bias) for all experts into shared memory, then top_k
 *                     rounds of a block arg-max in the reference's order
 *                     (score desc, expert id asc), then the weights from the
 *                     unbiased σ summed in slot order by one thread. Hash
 *                     routing reads tid2eid. A token id outside [0, vocab) or
 *                     a table entry outside [0, E) cannot be reported from the
 *                     device: that token gets expert ids -1 (which moe_dispatch
 *                     skips) and weights 0; the CPU reference returns
 *                     ST_INVALID for such input.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/routing/routing_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

#define ROUTE_NT 256

static __device__ __forceinline__ float sigma_of(float x)
{
	return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

/* (s, e) better than (bs, be) in the order score desc, id asc; be < 0 = none. */
static __device__ __forceinline__ bool better(float s, int e, float bs, int be)
{
	return e >= 0 && (be < 0 || s > bs || (s == bs && e < be));
}

__global__ void __launch_bounds__(ROUTE_NT) route_kernel(const float *logits, const float *bias,
							  const int32_t *tid2eid, const int32_t *token_ids,
							  int64_t vocab, int E, int K, float route_scale,
							  int32_t *expert_ids, float *weights)
{
	extern __shared__ float sh[]; /* [E] biased scores, then [E] used flags as floats */
	__shared__ float rs[ROUTE_NT / 32];
	__shared__ int re[ROUTE_NT / 32];
	__shared__ int ids[KERN_ROUTE_MAX_TOPK];
	const int64_t t = blockIdx.x;
	const float *l = logits + t * E;
	int32_t *oid = expert_ids + t * K;
	float *ow = weights + t * K;
	float *score = sh, *used = sh + E;
	if (tid2eid) {
		if (threadIdx.x == 0) {
			int64_t tok = token_ids[t];
			bool ok = tok >= 0 && tok < vocab;
			for (int j = 0; j < K && ok; j++) {
				int32_t e = tid2eid[tok * K + j];
				ok = e >= 0 && e < E;
				ids[j] = e;
			}
			for (int j = 0; j < K; j++)
				if (!ok)
					ids[j] = -1;
		}
		__syncthreads();
	} else {
		for (int e = threadIdx.x; e < E; e += ROUTE_NT) {
			score[e] = __fadd_rn(sigma_of(l[e]), bias ? bias[e] : 0.0f);
			used[e] = 0.f;
		}
		__syncthreads();
		const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
		for (int j = 0; j < K; j++) {
			float bs = 0.f;
			int be = -1;
			for (int e = threadIdx.x; e < E; e += ROUTE_NT)
				if (used[e] == 0.f && better(score[e], e, bs, be)) {
					bs = score[e];
					be = e;
				}
			for (int o = 16; o > 0; o >>= 1) {
				float s2 = __shfl_xor_sync(0xffffffffu, bs, o);
				int e2 = __shfl_xor_sync(0xffffffffu, be, o);
				if (better(s2, e2, bs, be)) {
					bs = s2;
					be = e2;
				}
			}
			if (lane == 0) {
				rs[wid] = bs;
				re[wid] = be;
			}
			__syncthreads();
			if (threadIdx.x == 0) {
				float b = 0.f;
				int bi = -1;
				for (int w = 0; w < ROUTE_NT / 32; w++)
					if (better(rs[w], re[w], b, bi)) {
						b = rs[w];
						bi = re[w];
					}
				ids[j] = bi;
				if (bi >= 0)
					used[bi] = 1.f;
			}
			__syncthreads();
		}
	}
	if (threadIdx.x == 0) {
		float w[KERN_ROUTE_MAX_TOPK];
		float sum = 0.f;
		bool ok = true;
		for (int j = 0; j < K; j++) {
			ok = ok && ids[j] >= 0;
			w[j] = ids[j] >= 0 ? sigma_of(l[ids[j]]) : 0.f;
			sum = __fadd_rn(sum, w[j]);
		}
		for (int j = 0; j < K; j++) {
			oid[j] = ok ? ids[j] : -1;
			ow[j] = ok ? __fmul_rn(__fdiv_rn(w[j], sum), route_scale) : 0.f;
		}
	}
}

extern "C" enum status kern_route_cuda_generic(const struct kern_route_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_experts <= 0 || a->top_k <= 0 || a->top_k > a->n_experts ||
	    a->top_k > KERN_ROUTE_MAX_TOPK)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->logits || !a->expert_ids || !a->weights || (a->tid2eid && (!a->token_ids || a->vocab <= 0)))
		return ST_INVALID;
	size_t smem = (size_t)2 * a->n_experts * sizeof(float);
	if (smem > 48 * 1024)
		return ST_UNSUPPORTED;
	route_kernel<<<(unsigned)a->n_tokens, ROUTE_NT, smem, (cudaStream_t)a->stream>>>(
		a->logits, a->bias, a->tid2eid, a->token_ids, a->vocab, a->n_experts, a->top_k, a->route_scale,
		a->expert_ids, a->weights);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
