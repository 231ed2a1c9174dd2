/*
 * kernels/hc/hc_generic.cu: portable CUDA mHC ops for every cc >= 8.0
 * (variants hc_*_cuda_generic; contracts in hc.h, entry points in
 * hc_generic.h). This is the fallback DeepSeek's tf32_hc_prenorm_gemm never
 * had: our own code, in the sm_80 image plus PTX, so it runs on Hopper,
 * both Blackwells and GB10 alike.
 *
 *   hc_prenorm_kernel  mix[t, o] = Σ_k x[t,k]·fn[o,k] and sqr_sum[t] = Σ_k x².
 *                      Decode-shaped: K = n·D = 16384 is long and n_out = 24
 *                      is tiny, so a block owns OG outputs × TT tokens (or,
 *                      as the extra last block column, the TT tokens' Σx²),
 *                      256 threads stride K with float4 loads, and the
 *                      partial sums are reduced by warp shuffles plus one
 *                      fixed-order pass over the 8 warps: deterministic, no
 *                      atomics, no workspace. fp32 FMA (not TF32): the
 *                      reference is fp32 and this op is bandwidth-bound.
 *                      Σx² (the sq block) is summed more carefully, since
 *                      it feeds rsqrt(Σx²/K) of every stream: each float4's
 *                      four squares in fp32, added into a per-thread Kahan
 *                      (compensated) fp32 sum, the 256 partials combined in
 *                      fp64. Error <= about 6.5·2^-24 of Σx² (4 roundings in
 *                      the float4 chain, 2 for Kahan, 0.5 for the final
 *                      f32), independent of K; test_hc_gpu checks 2^-21
 *                      against an fp64 sum. (The CPU reference's sequential
 *                      f32 loop is the looser side: about +1e-5 relative at
 *                      K = 16384 on bf16 inputs, biased upward because the
 *                      squares' discarded low bits round up more often.)
 *                      Small batches use OG = 1 (25 blocks for T = 1) so the
 *                      1.5 MB of fn is read by many SMs at once.
 *   hc_split_kernel    one thread per token: ρ, sigmoid, row softmax and the
 *                      col-first Sinkhorn in the reference's operation order
 *                      (explicit _rn arithmetic, no FMA contraction), so it
 *                      differs from the CPU only by expf's last bits.
 *   hc_pre_combine_kernel, hc_post_kernel: one thread per output element,
 *                      the reference's summation order, optional bf16 RNE.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "kernels/hc/hc_generic.h"
}
#include "kernels/device/host_bufs.cuh"

#define HC_NT 256

/* ---- prenorm GEMM + Σx² ---- */

/* s - c += v, compensated (Kahan); explicit _rn so nothing is contracted or reassociated. */
static __device__ __forceinline__ void hc_kahan_add(float &s, float &c, float v)
{
	const float y = __fsub_rn(v, c);
	const float t = __fadd_rn(s, y);
	c = __fsub_rn(__fsub_rn(t, s), y);
	s = t;
}

template <int OG, int TT, int U>
__global__ void __launch_bounds__(HC_NT) hc_prenorm_kernel(const float *__restrict__ x, const float *__restrict__ fn,
							     float *__restrict__ mix, float *__restrict__ sqr,
							     int64_t T, int k, int n_out, int vec)
{
	__shared__ float red[HC_NT / 32][OG * TT];
	__shared__ double red_sq[HC_NT / 32][TT];
	const int n_og = (n_out + OG - 1) / OG;
	const bool sq = (int)blockIdx.x == n_og;
	const int o0 = blockIdx.x * OG;
	const int64_t t0 = (int64_t)blockIdx.y * TT;
	float acc[OG][TT];
	float comp[TT]; /* sq block: Kahan compensation of acc[0][t] (sum = acc - comp) */
#pragma unroll
	for (int o = 0; o < OG; o++)
#pragma unroll
		for (int t = 0; t < TT; t++)
			acc[o][t] = 0.f;
#pragma unroll
	for (int t = 0; t < TT; t++)
		comp[t] = 0.f;
	if (vec) {
		/* U strides of 1024 columns per iteration, all loads issued before the
		 * FMAs: U times the bytes in flight, which is what a decode-sized grid
		 * (25 blocks for T = 1) needs to approach the bandwidth. */
		const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
		for (int kb = threadIdx.x * 4; kb < k; kb += HC_NT * 4 * U) {
			float4 xv[U][TT], wv[U][OG];
#pragma unroll
			for (int u = 0; u < U; u++) {
				const int kk = kb + u * HC_NT * 4;
#pragma unroll
				for (int t = 0; t < TT; t++)
					xv[u][t] = kk < k && t0 + t < T ? *(const float4 *)(x + (t0 + t) * k + kk) : z;
#pragma unroll
				for (int o = 0; o < OG; o++)
					wv[u][o] = kk < k && !sq && o0 + o < n_out ? *(const float4 *)(fn + (int64_t)(o0 + o) * k + kk)
										   : z;
			}
#pragma unroll
			for (int u = 0; u < U; u++) {
				if (sq) {
#pragma unroll
					for (int t = 0; t < TT; t++)
						hc_kahan_add(acc[0][t], comp[t],
							     xv[u][t].x * xv[u][t].x + xv[u][t].y * xv[u][t].y +
								     xv[u][t].z * xv[u][t].z + xv[u][t].w * xv[u][t].w);
				} else {
#pragma unroll
					for (int o = 0; o < OG; o++)
#pragma unroll
						for (int t = 0; t < TT; t++)
							acc[o][t] += xv[u][t].x * wv[u][o].x + xv[u][t].y * wv[u][o].y +
								     xv[u][t].z * wv[u][o].z + xv[u][t].w * wv[u][o].w;
				}
			}
		}
	} else {
		for (int kk = threadIdx.x; kk < k; kk += HC_NT) {
			float xv[TT];
#pragma unroll
			for (int t = 0; t < TT; t++)
				xv[t] = t0 + t < T ? x[(t0 + t) * k + kk] : 0.f;
			if (sq) {
#pragma unroll
				for (int t = 0; t < TT; t++)
					hc_kahan_add(acc[0][t], comp[t], xv[t] * xv[t]);
			} else {
#pragma unroll
				for (int o = 0; o < OG; o++) {
					if (o0 + o >= n_out)
						break;
					const float wv = fn[(int64_t)(o0 + o) * k + kk];
#pragma unroll
					for (int t = 0; t < TT; t++)
						acc[o][t] += xv[t] * wv;
				}
			}
		}
	}
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (sq) {
		/* Σx²: the compensated per-thread partials combined in fp64 (uniform branch). */
#pragma unroll
		for (int t = 0; t < TT; t++) {
			double v = (double)acc[0][t] - (double)comp[t];
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
			if (lane == 0)
				red_sq[warp][t] = v;
		}
		__syncthreads();
		if ((int)threadIdx.x < TT && t0 + threadIdx.x < T) {
			double s = 0.0;
#pragma unroll
			for (int wi = 0; wi < HC_NT / 32; wi++)
				s += red_sq[wi][threadIdx.x];
			sqr[t0 + threadIdx.x] = (float)s;
		}
		return;
	}
#pragma unroll
	for (int o = 0; o < OG; o++)
#pragma unroll
		for (int t = 0; t < TT; t++) {
			float v = acc[o][t];
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
			if (lane == 0)
				red[warp][o * TT + t] = v;
		}
	__syncthreads();
	if ((int)threadIdx.x < OG * TT) {
		const int o = threadIdx.x / TT, t = threadIdx.x % TT;
		float s = 0.f;
#pragma unroll
		for (int wi = 0; wi < HC_NT / 32; wi++)
			s += red[wi][threadIdx.x];
		if (t0 + t < T && o0 + o < n_out)
			mix[(t0 + t) * n_out + o0 + o] = s;
	}
}

extern "C" enum status kern_hc_prenorm_cuda_generic(const struct kern_hc_prenorm_args *a)
{
	if (!a || a->n_tokens < 0 || a->k <= 0 || a->n_out <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->x || !a->fn || !a->mix || !a->sqr_sum)
		return ST_INVALID;
	const int vec = a->k % 4 == 0 && ((uintptr_t)a->x | (uintptr_t)a->fn) % 16 == 0;
	cudaStream_t s = (cudaStream_t)a->stream;
	if (a->n_tokens <= 16) {
		const int64_t gy = (a->n_tokens + 3) / 4;
		dim3 grid((unsigned)(a->n_out + 1), (unsigned)gy);
		hc_prenorm_kernel<1, 4, 4><<<grid, HC_NT, 0, s>>>(a->x, a->fn, a->mix, a->sqr_sum, a->n_tokens, a->k,
							      a->n_out, vec);
	} else {
		const int64_t gy = (a->n_tokens + 7) / 8;
		if (gy > 65535)
			return ST_INVALID;
		dim3 grid((unsigned)((a->n_out + 3) / 4 + 1), (unsigned)gy);
		hc_prenorm_kernel<4, 8, 1><<<grid, HC_NT, 0, s>>>(a->x, a->fn, a->mix, a->sqr_sum, a->n_tokens, a->k,
							      a->n_out, vec);
	}
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- split: sigmoid / softmax / Sinkhorn ---- */

static __device__ __forceinline__ float hc_sigmoid(float v)
{
	return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
}

__global__ void hc_split_kernel(const float *__restrict__ mix, const float *__restrict__ sqr, int64_t T, int n, int k,
				float norm_eps, const float *__restrict__ scale, const float *__restrict__ base,
				int iters, float hc_eps, int head, float *__restrict__ pre, float *__restrict__ post,
				float *__restrict__ comb)
{
	const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= T)
		return;
	const int n_out = head ? n : (2 + n) * n;
	const float *m = mix + t * n_out;
	const float rho = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(sqr[t], (float)k), norm_eps)));
	for (int j = 0; j < n; j++)
		pre[t * n + j] = __fadd_rn(hc_sigmoid(__fadd_rn(__fmul_rn(scale[0], __fmul_rn(rho, m[j])), base[j])), hc_eps);
	if (head)
		return;
	for (int j = 0; j < n; j++)
		post[t * n + j] =
			__fmul_rn(2.0f, hc_sigmoid(__fadd_rn(__fmul_rn(scale[1], __fmul_rn(rho, m[n + j])), base[n + j])));
	float P[KERN_HC_MAX_STREAMS][KERN_HC_MAX_STREAMS];
	for (int j = 0; j < n; j++) {
		float mx = -INFINITY;
		for (int c = 0; c < n; c++) {
			P[j][c] = __fadd_rn(__fmul_rn(scale[2], __fmul_rn(rho, m[2 * n + n * j + c])), base[2 * n + n * j + c]);
			mx = fmaxf(mx, P[j][c]);
		}
		float sum = 0.f;
		for (int c = 0; c < n; c++) {
			P[j][c] = expf(__fsub_rn(P[j][c], mx));
			sum = __fadd_rn(sum, P[j][c]);
		}
		for (int c = 0; c < n; c++)
			P[j][c] = __fadd_rn(__fdiv_rn(P[j][c], sum), hc_eps);
	}
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
			for (int j = 0; j < n; j++) {
				float s = 0.f;
				for (int c = 0; c < n; c++)
					s = __fadd_rn(s, P[j][c]);
				for (int c = 0; c < n; c++)
					P[j][c] = __fdiv_rn(P[j][c], __fadd_rn(s, hc_eps));
			}
		}
		for (int c = 0; c < n; c++) {
			float s = 0.f;
			for (int j = 0; j < n; j++)
				s = __fadd_rn(s, P[j][c]);
			for (int j = 0; j < n; j++)
				P[j][c] = __fdiv_rn(P[j][c], __fadd_rn(s, hc_eps));
		}
	}
	for (int j = 0; j < n; j++)
		for (int c = 0; c < n; c++)
			comb[(t * n + j) * n + c] = P[j][c];
}

extern "C" enum status kern_hc_split_cuda_generic(const struct kern_hc_split_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->n_streams > KERN_HC_MAX_STREAMS || a->k <= 0 ||
	    a->sinkhorn_iters < 1)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->mix || !a->sqr_sum || !a->scale || !a->base || !a->pre || (!a->head && (!a->post || !a->comb)))
		return ST_INVALID;
	const int64_t nb = (a->n_tokens + 127) / 128;
	if (nb > INT32_MAX)
		return ST_INVALID;
	hc_split_kernel<<<(unsigned)nb, 128, 0, (cudaStream_t)a->stream>>>(
		a->mix, a->sqr_sum, a->n_tokens, a->n_streams, a->k, a->norm_eps, a->scale, a->base, a->sinkhorn_iters,
		a->hc_eps, a->head, a->pre, a->post, a->comb);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- stream combinations ---- */

static __device__ __forceinline__ float hc_round(float v, int bf16)
{
	return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

__global__ void hc_pre_combine_kernel(const float *__restrict__ x, const float *__restrict__ pre, float *__restrict__ u,
				      int64_t T, int n, int D, int bf16)
{
	const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= T * D)
		return;
	const int64_t t = idx / D, i = idx % D;
	float acc = 0.f;
	for (int j = 0; j < n; j++)
		acc = __fadd_rn(acc, __fmul_rn(pre[t * n + j], x[(t * n + j) * D + i]));
	u[idx] = hc_round(acc, bf16);
}

__global__ void hc_post_kernel(const float *__restrict__ f, const float *__restrict__ x, const float *__restrict__ post,
			       const float *__restrict__ comb, float *__restrict__ x_out, int64_t T, int n, int D,
			       int bf16)
{
	const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= T * n * D)
		return;
	const int64_t i = idx % D, tk = idx / D, t = tk / n;
	const int c = (int)(tk % n);
	const float *C = comb + t * n * n;
	float acc = __fmul_rn(post[t * n + c], f[t * D + i]);
	for (int j = 0; j < n; j++)
		acc = __fadd_rn(acc, __fmul_rn(C[j * n + c], x[(t * n + j) * D + i]));
	x_out[idx] = hc_round(acc, bf16);
}

static enum status hc_launch_1d(int64_t total, unsigned *blocks)
{
	const int64_t nb = (total + HC_NT - 1) / HC_NT;
	if (nb > INT32_MAX)
		return ST_INVALID;
	*blocks = (unsigned)nb;
	return ST_OK;
}

extern "C" enum status kern_hc_pre_combine_cuda_generic(const struct kern_hc_pre_combine_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->x || !a->pre || !a->u)
		return ST_INVALID;
	unsigned nb;
	if (hc_launch_1d(a->n_tokens * a->dim, &nb))
		return ST_INVALID;
	hc_pre_combine_kernel<<<nb, HC_NT, 0, (cudaStream_t)a->stream>>>(a->x, a->pre, a->u, a->n_tokens, a->n_streams,
									  a->dim, a->bf16_out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

extern "C" enum status kern_hc_post_cuda_generic(const struct kern_hc_post_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->f || !a->x || !a->post || !a->comb || !a->x_out || a->x_out == a->x)
		return ST_INVALID;
	unsigned nb;
	if (hc_launch_1d(a->n_tokens * a->n_streams * a->dim, &nb))
		return ST_INVALID;
	hc_post_kernel<<<nb, HC_NT, 0, (cudaStream_t)a->stream>>>(a->f, a->x, a->post, a->comb, a->x_out, a->n_tokens,
								   a->n_streams, a->dim, a->bf16_out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- host-buffer wrappers (self-checks, tests) ---- */

/* A device copy of n_floats floats of host h (kernels/device/host_bufs.cuh). */
static float *hc_up(struct kern_hbufs *b, const float *h, size_t n_floats, bool is_out)
{
	return (float *)kern_hb_up(b, h, n_floats * sizeof(float), is_out);
}

extern "C" enum status kern_hc_prenorm_cuda_generic_host(const struct kern_hc_prenorm_args *a)
{
	if (!a || a->n_tokens < 0 || a->k <= 0 || a->n_out <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->x || !a->fn || !a->mix || !a->sqr_sum)
		return ST_INVALID;
	struct kern_hbufs b = {};
	struct kern_hc_prenorm_args d = *a;
	d.x = hc_up(&b, a->x, (size_t)a->n_tokens * a->k, false);
	d.fn = hc_up(&b, a->fn, (size_t)a->n_out * a->k, false);
	d.mix = hc_up(&b, a->mix, (size_t)a->n_tokens * a->n_out, true);
	d.sqr_sum = hc_up(&b, a->sqr_sum, (size_t)a->n_tokens, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_hc_prenorm_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_hc_split_cuda_generic_host(const struct kern_hc_split_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->n_streams > KERN_HC_MAX_STREAMS)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	const size_t T = (size_t)a->n_tokens, n = (size_t)a->n_streams;
	const size_t n_out = a->head ? n : (2 + n) * n;
	struct kern_hbufs b = {};
	struct kern_hc_split_args d = *a;
	d.mix = hc_up(&b, a->mix, T * n_out, false);
	d.sqr_sum = hc_up(&b, a->sqr_sum, T, false);
	d.scale = hc_up(&b, a->scale, a->head ? 1 : 3, false);
	d.base = hc_up(&b, a->base, n_out, false);
	d.pre = hc_up(&b, a->pre, T * n, true);
	d.post = a->head ? NULL : hc_up(&b, a->post, T * n, true);
	d.comb = a->head ? NULL : hc_up(&b, a->comb, T * n * n, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_hc_split_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_hc_pre_combine_cuda_generic_host(const struct kern_hc_pre_combine_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	const size_t T = (size_t)a->n_tokens, n = (size_t)a->n_streams, D = (size_t)a->dim;
	struct kern_hbufs b = {};
	struct kern_hc_pre_combine_args d = *a;
	d.x = hc_up(&b, a->x, T * n * D, false);
	d.pre = hc_up(&b, a->pre, T * n, false);
	d.u = hc_up(&b, a->u, T * D, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_hc_pre_combine_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_hc_post_cuda_generic_host(const struct kern_hc_post_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (a->x_out == a->x)
		return ST_INVALID;
	const size_t T = (size_t)a->n_tokens, n = (size_t)a->n_streams, D = (size_t)a->dim;
	struct kern_hbufs b = {};
	struct kern_hc_post_args d = *a;
	d.f = hc_up(&b, a->f, T * D, false);
	d.x = hc_up(&b, a->x, T * n * D, false);
	d.post = hc_up(&b, a->post, T * n, false);
	d.comb = hc_up(&b, a->comb, T * n * n, false);
	d.x_out = hc_up(&b, a->x_out, T * n * D, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_hc_post_cuda_generic(&d) : ST_CUDA);
}
