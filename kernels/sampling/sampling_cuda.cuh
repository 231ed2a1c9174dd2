/*
 * kernels/sampling/sampling_cuda.cuh: the block-level pieces the sample and
 * token_logprobs CUDA variants share: the (value desc, id asc) order of
 * greedy argmax and top-n, the reduction functors, and a block reduction
 * whose result every thread gets. One copy, so that both ops order ties and
 * sum the same way (their results must match the CPU references bit for bit).
 */
#ifndef DSV4_KERNELS_SAMPLING_CUDA_CUH
#define DSV4_KERNELS_SAMPLING_CUDA_CUH

#include <cub/cub.cuh>
#include <stdint.h>

namespace {

struct Best {
	float v;
	int32_t id; /* -1: none */
};

/* (value desc, id asc): the order of greedy argmax and top_logprobs. */
struct BestOp {
	__device__ __forceinline__ Best operator()(const Best &a, const Best &b) const
	{
		if (b.id < 0)
			return a;
		if (a.id < 0)
			return b;
		return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
	}
};

struct FMaxOp {
	__device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct DSumOp {
	__device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};

/* Block-wide reduction whose result every thread gets; it ends with a
 * barrier, so the shared storage is free for the next one. */
template <typename T, typename BR, typename Op>
__device__ __forceinline__ T blk_reduce(typename BR::TempStorage &ts, T v, Op op)
{
	__shared__ T r;
	T t = BR(ts).Reduce(v, op);
	if (threadIdx.x == 0)
		r = t;
	__syncthreads();
	t = r;
	__syncthreads();
	return t;
}

} // namespace

#endif
