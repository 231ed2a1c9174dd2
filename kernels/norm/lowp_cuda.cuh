/*
 * kernels/norm/lowp_cuda.cuh: device twins of kernels/norm/lowp_sim.h (bf16
 * round-to-nearest-even, e4m3 / e2m1 rounding, ue8m0 power-of-two scales)
 * plus the small block helpers the generic CUDA model ops share (block sum
 * and max, the sequence of a flat-batch row). The roundings are the same
 * integer / exact-float operations as the C versions, so a GPU op that feeds
 * them the same fp32 values gets the same bits.
 */
#ifndef DSV4_KERNELS_NORM_LOWP_CUDA_CUH
#define DSV4_KERNELS_NORM_LOWP_CUDA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ float kd_bf16_round(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return __uint_as_float(((u >> 16) | 0x40u) << 16);
	u += 0x7fffu + ((u >> 16) & 1u);
	return __uint_as_float((u >> 16) << 16);
}

static __device__ __forceinline__ float kd_bf16_to_f32(uint16_t b)
{
	return __uint_as_float((uint32_t)b << 16);
}

static __device__ __forceinline__ float kd_pow2_ceil(float r)
{
	int e;
	float m = frexpf(r, &e);
	if (m == 0.5f)
		e -= 1;
	return ldexpf(1.0f, e);
}

static __device__ __forceinline__ float kd_e4m3_round(float v)
{
	float a = fabsf(v);
	if (a == 0.0f)
		return v;
	int e;
	frexpf(a, &e);
	int ulp_exp = (e - 1) - 3;
	if (ulp_exp < -9)
		ulp_exp = -9;
	float step = ldexpf(1.0f, ulp_exp);
	float q = rintf(__fdiv_rn(a, step)) * step;
	if (q > 448.0f)
		q = 448.0f;
	return v < 0 ? -q : q;
}

static __device__ __forceinline__ float kd_e2m1_round(float v)
{
	const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	float a = fabsf(v);
	int best = 0;
	for (int c = 1; c < 8; c++) {
		float mid = 0.5f * (grid[c - 1] + grid[c]);
		if (a > mid || (a == mid && (c & 1) == 0))
			best = c;
		else
			break;
	}
	return v < 0 ? -grid[best] : grid[best];
}

/* Sequential (one thread) FP8 / FP4 qdq of x[0:n] in blocks, as lowp_sim.h. */
static __device__ void kd_fp8_qdq_block(float *x, int n)
{
	float amax = 1e-4f;
	for (int i = 0; i < n; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	float s = kd_pow2_ceil(__fdiv_rn(amax, 448.0f));
	for (int i = 0; i < n; i++) {
		float v = __fdiv_rn(x[i], s);
		v = v > 448.0f ? 448.0f : (v < -448.0f ? -448.0f : v);
		x[i] = kd_e4m3_round(v) * s;
	}
}

static __device__ void kd_fp4_qdq_block(float *x, int n)
{
	float amax = 6.0f * ldexpf(1.0f, -126);
	for (int i = 0; i < n; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	float s = kd_pow2_ceil(__fdiv_rn(amax, 6.0f));
	for (int i = 0; i < n; i++) {
		float v = __fdiv_rn(x[i], s);
		v = v > 6.0f ? 6.0f : (v < -6.0f ? -6.0f : v);
		x[i] = kd_e2m1_round(v) * s;
	}
}

static __device__ __forceinline__ float kd_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result. red: __shared__ float[32]. Ends with a barrier so red can
 * be reused. */
static __device__ float kd_block_sum(float v, float *red)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = kd_warp_sum(v);
	if (lane == 0)
		red[wid] = v;
	__syncthreads();
	float t = 0.f;
	for (int i = 0; i < nw; i++)
		t += red[i];
	__syncthreads();
	return t;
}

/* The sequence s of flat row i: the largest s with q_off[s] <= i (empty
 * sequences share their q_off with the next one, which then wins). */
static __device__ __forceinline__ int kd_seq_of(const int32_t *q_off, int n_seqs, int64_t i)
{
	int lo = 0, hi = n_seqs - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) >> 1;
		if (q_off[mid] <= i)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

#endif
