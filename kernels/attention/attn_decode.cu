/*
 * kernels/attention/attn_decode.cu: the portable decode variant of op
 * sparse_attn (sparse_attn_cuda_decode; contract in attention.h) for steps of
 * few query tokens, plain CUDA of cc >= 8.0 (128-bit loads, cp.async, warp
 * shuffles).
 *
 * MQA: every head of a token reads the same key/value rows, so the decode
 * path reads each row once per 32 heads instead of once per head (the
 * generic variant's block per (token, head)), and splits a token's index
 * list over CTAs when tokens × head blocks cannot fill the SMs:
 *   ad_split_kernel    grid (split, head block of 32, token), 8 warps; the
 *                      CTA stages the split's rows 8 at a time into shared
 *                      memory with 16-byte cp.async, two stages in flight
 *                      (the next stage loads while this one is used); warp w
 *                      owns 4 heads, keeps their q slices and fp32
 *                      accumulators in registers (lane: 4 floats of every 128
 *                      columns), and walks the staged rows two at a time
 *                      (float4 reads, butterfly dot products, online softmax
 *                      per head), so each row leaves DRAM once. Writes the
 *                      split's unnormalised row, max and denominator to the
 *                      executor's scratch (kern_ctx: stream-ordered, one op
 *                      at a time; S·T·H·(head_dim + 2) floats,
 *                      S·T·⌈H/32⌉ ≈ one CTA per SM: about 13 MiB on an
 *                      H200, less on smaller GPUs).
 *   ad_combine_kernel  one block per (token, head): merges the splits with
 *                      the sink (e^{sink - M} in the denominator), then the
 *                      inverse rope (double cos/sin rounded to float, as the
 *                      reference) and the optional bf16 rounding.
 * Differs from the reference's two-pass fp32 only in summation order.
 * Indices outside [0, Σ kv_rows) are skipped (the reference refuses the
 * call). Steps of more than KERN_ATTN_DECODE_MAX_TOKENS tokens, head_dim not
 * a multiple of 128 or above 512, and unaligned buffers go to
 * kern_sparse_attn_cuda_generic.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/attention/attn_decode.h"
#include "kernels/attention/attention_generic.h"
#include "kernels/device/ctx.h"
}
#include "kernels/norm/lowp_cuda.cuh"

#define AD_NW 8                 /* warps per CTA */
#define AD_NT (AD_NW * 32)
#define AD_HW 4                 /* heads per warp */
#define AD_HB (AD_NW * AD_HW)   /* heads per CTA */
#define AD_MAXV 4               /* float4 per lane per row: head_dim <= 512 */
#define AD_MAXS 64              /* splits per token */
#define AD_MIN_ROWS 16          /* index slots per split, at least */
#define AD_RS 8                 /* rows per pipeline stage (AD_RS·head_dim·4 bytes of shared memory each) */

struct ad_srcs {
	const float *kv[KERN_ATTN_MAX_SRC];
	int64_t rows[KERN_ATTN_MAX_SRC];
};

static __device__ __forceinline__ const float *ad_row(const ad_srcs &src, int64_t i, int64_t total, int64_t stride)
{
	if (i < 0 || i >= total)
		return NULL;
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (i < src.rows[s])
			return src.kv[s] + i * stride;
		i -= src.rows[s];
	}
	return NULL;
}

static __device__ __forceinline__ float ad_dot4(float4 a, float4 b, float acc)
{
	acc = fmaf(a.x, b.x, acc);
	acc = fmaf(a.y, b.y, acc);
	acc = fmaf(a.z, b.z, acc);
	return fmaf(a.w, b.w, acc);
}

static __device__ __forceinline__ float4 ad_axpy4(float p, float4 e, float4 a)
{
	return make_float4(fmaf(p, e.x, a.x), fmaf(p, e.y, a.y), fmaf(p, e.z, a.z), fmaf(p, e.w, a.w));
}

static __device__ __forceinline__ void ad_cp16(float *dst_smem, const float *src)
{
	const unsigned sa = (unsigned)__cvta_generic_to_shared(dst_smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(src) : "memory");
}

static __device__ __forceinline__ void ad_cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void ad_cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Stage the rows of index slots [jb, jb + AD_RS) ∩ [.., j1) into buf (rows of
 * d floats) with 16-byte cp.async, all threads of the CTA; ok[r] says which
 * rows hold a valid key. */
static __device__ __forceinline__ void ad_stage(float *buf, int *ok, const ad_srcs &src, int64_t total,
						int64_t stride, const int32_t *ix, int jb, int j1, int d)
{
	const int per_row = d >> 2; /* float4 per row */
	for (int c = threadIdx.x; c < AD_RS * per_row; c += AD_NT) {
		const int r = c / per_row, c4 = c - r * per_row;
		const float *e = jb + r < j1 ? ad_row(src, ix[jb + r], total, stride) : NULL;
		if (c4 == 0)
			ok[r] = e != NULL;
		if (e)
			ad_cp16(buf + r * d + c4 * 4, e + c4 * 4);
	}
}

/* One online-softmax step of a warp's AD_HW heads over rows e0, e1 (shared
 * memory; NULL: no row). */
static __device__ __forceinline__ void ad_rows2(const float *e0, const float *e1, int lane, int nv, float scale,
						const float4 (&qr)[AD_HW][AD_MAXV], float4 (&acc)[AD_HW][AD_MAXV],
						float (&m)[AD_HW], float (&l)[AD_HW])
{
	float4 ev0[AD_MAXV], ev1[AD_MAXV];
#pragma unroll
	for (int v = 0; v < AD_MAXV; v++) {
		ev0[v] = ev1[v] = make_float4(0.f, 0.f, 0.f, 0.f);
		if (v < nv && e0)
			ev0[v] = *(const float4 *)(e0 + v * 128 + lane * 4);
		if (v < nv && e1)
			ev1[v] = *(const float4 *)(e1 + v * 128 + lane * 4);
	}
	float d0[AD_HW], d1[AD_HW];
#pragma unroll
	for (int k = 0; k < AD_HW; k++) {
		d0[k] = d1[k] = 0.f;
#pragma unroll
		for (int v = 0; v < AD_MAXV; v++) {
			d0[k] = ad_dot4(qr[k][v], ev0[v], d0[k]);
			d1[k] = ad_dot4(qr[k][v], ev1[v], d1[k]);
		}
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
		for (int k = 0; k < AD_HW; k++) {
			d0[k] += __shfl_xor_sync(0xffffffffu, d0[k], o);
			d1[k] += __shfl_xor_sync(0xffffffffu, d1[k], o);
		}
	}
#pragma unroll
	for (int r = 0; r < 2; r++) {
		if (!(r ? e1 : e0))
			continue;
#pragma unroll
		for (int k = 0; k < AD_HW; k++) {
			const float sc = (r ? d1[k] : d0[k]) * scale;
			if (sc > m[k]) {
				const float f = m[k] == -INFINITY ? 0.f : expf(m[k] - sc);
				l[k] *= f;
#pragma unroll
				for (int v = 0; v < AD_MAXV; v++)
					acc[k][v] = make_float4(acc[k][v].x * f, acc[k][v].y * f, acc[k][v].z * f,
								acc[k][v].w * f);
				m[k] = sc;
			}
			const float p = expf(sc - m[k]);
			l[k] += p;
#pragma unroll
			for (int v = 0; v < AD_MAXV; v++)
				acc[k][v] = ad_axpy4(p, r ? ev1[v] : ev0[v], acc[k][v]);
		}
	}
}

__global__ void __launch_bounds__(AD_NT) ad_split_kernel(const float *__restrict__ q, ad_srcs src, int64_t stride,
							 const int32_t *__restrict__ idx,
							 const int32_t *__restrict__ idx_len, int idx_stride,
							 float scale, int H, int d, int64_t T,
							 float *__restrict__ ws_acc, float2 *__restrict__ ws_ml)
{
	extern __shared__ __align__(16) float rows_sh[]; /* [2][AD_RS][d] */
	__shared__ int ok_sh[2][AD_RS];
	const int s = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int64_t t = blockIdx.z;
	const int h0 = blockIdx.y * AD_HB + wid * AD_HW;
	const bool active = h0 < H; /* a warp without heads still stages rows and meets the barriers */
	const int nv = d >> 7;
	float4 qr[AD_HW][AD_MAXV], acc[AD_HW][AD_MAXV];
	float m[AD_HW], l[AD_HW];
#pragma unroll
	for (int k = 0; k < AD_HW; k++) {
		m[k] = -INFINITY;
		l[k] = 0.f;
#pragma unroll
		for (int v = 0; v < AD_MAXV; v++) {
			acc[k][v] = make_float4(0.f, 0.f, 0.f, 0.f);
			qr[k][v] = acc[k][v];
			if (v < nv && h0 + k < H)
				qr[k][v] = *(const float4 *)(q + ((t * H + h0 + k) * d + v * 128 + lane * 4));
		}
	}
	const int64_t total = src.rows[0] + src.rows[1] + src.rows[2];
	const int32_t *ix = idx + t * idx_stride;
	int len = idx_len ? idx_len[t] : idx_stride;
	len = len < 0 ? 0 : (len > idx_stride ? idx_stride : len);
	/* this token's splits: its own list length (idx_stride is the batch's
	 * bound, often far above a sliding or CSA layer's sets), at least
	 * AD_MIN_ROWS slots each; splits past them stay empty */
	int n_split = (len + AD_MIN_ROWS - 1) / AD_MIN_ROWS;
	n_split = n_split < 1 ? 1 : (n_split > (int)gridDim.x ? (int)gridDim.x : n_split);
	const int chunk = (len + n_split - 1) / n_split;
	const int j0 = s < n_split ? s * chunk : len;
	const int j1 = j0 + chunk < len ? j0 + chunk : len;
	const int n_stages = j1 > j0 ? (j1 - j0 + AD_RS - 1) / AD_RS : 0;
	/* two-stage pipeline: stage g + 1's rows are in flight while stage g is used */
	if (n_stages > 0)
		ad_stage(rows_sh, ok_sh[0], src, total, stride, ix, j0, j1, d);
	ad_cp_commit();
	for (int g = 0; g < n_stages; g++) {
		const int b = g & 1;
		if (g + 1 < n_stages) {
			ad_stage(rows_sh + (size_t)(b ^ 1) * AD_RS * d, ok_sh[b ^ 1], src, total, stride, ix,
				 j0 + (g + 1) * AD_RS, j1, d);
			ad_cp_commit();
			ad_cp_wait<1>();
		} else {
			ad_cp_wait<0>();
		}
		__syncthreads(); /* stage g's rows and flags visible to every warp */
		const float *buf = rows_sh + (size_t)b * AD_RS * d;
		if (active)
			for (int r = 0; r < AD_RS; r += 2)
				ad_rows2(ok_sh[b][r] ? buf + r * d : NULL, ok_sh[b][r + 1] ? buf + (r + 1) * d : NULL, lane,
					 nv, scale, qr, acc, m, l);
		__syncthreads(); /* buffer b free before stage g + 2 is staged into it */
	}
	if (!active)
		return;
#pragma unroll
	for (int k = 0; k < AD_HW; k++) {
		const int h = h0 + k;
		if (h >= H)
			break;
		const int64_t row = ((int64_t)s * T + t) * H + h;
#pragma unroll
		for (int v = 0; v < AD_MAXV; v++)
			if (v < nv && m[k] != -INFINITY) /* the combine reads no row of an empty split */
				*(float4 *)(ws_acc + row * d + v * 128 + lane * 4) = acc[k][v];
		if (lane == 0)
			ws_ml[row] = make_float2(m[k], l[k]);
	}
}

__global__ void ad_combine_kernel(const float *__restrict__ ws_acc, const float2 *__restrict__ ws_ml, int S,
				  int64_t T, int H, int d, const float *__restrict__ sink,
				  const int32_t *__restrict__ pos, const float *__restrict__ omega, int rope_dim,
				  bool bf16_out, float *__restrict__ out)
{
	extern __shared__ float os[]; /* [d] */
	__shared__ float fs[AD_MAXS];
	__shared__ float inv_sh;
	const int64_t th = blockIdx.x; /* t * H + h */
	const int h = (int)(th % H);
	const int64_t t = th / H;
	const int64_t TH = T * H;
	float M = sink ? sink[h] : -INFINITY;
	for (int s = 0; s < S; s++)
		M = fmaxf(M, ws_ml[s * TH + th].x);
	if (threadIdx.x < S) {
		const float ms = ws_ml[threadIdx.x * TH + th].x;
		fs[threadIdx.x] = ms == -INFINITY ? 0.f : expf(ms - M);
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		float den = sink && M != -INFINITY ? expf(sink[h] - M) : 0.f;
		for (int s = 0; s < S; s++)
			den += ws_ml[s * TH + th].y * fs[s];
		inv_sh = den > 0 ? 1.0f / den : 0.0f;
	}
	__syncthreads();
	const float inv = inv_sh;
	for (int c = threadIdx.x; c < d; c += blockDim.x) {
		float v = 0.f;
		for (int s = 0; s < S; s++)
			if (fs[s] != 0.f)
				v = fmaf(ws_acc[(s * TH + th) * d + c], fs[s], v);
		os[c] = v * inv;
	}
	__syncthreads();
	if (omega) {
		const float tp = (float)pos[t];
		for (int i = threadIdx.x; i < rope_dim / 2; i += blockDim.x) {
			const float ang = __fmul_rn(tp, omega[i]);
			const float cs = (float)cos((double)ang), sn = -(float)sin((double)ang);
			float *p = os + d - rope_dim + 2 * i;
			const float re = p[0], im = p[1];
			p[0] = __fsub_rn(__fmul_rn(re, cs), __fmul_rn(im, sn));
			p[1] = __fadd_rn(__fmul_rn(re, sn), __fmul_rn(im, cs));
		}
		__syncthreads();
	}
	float *o = out + th * d;
	for (int c = threadIdx.x; c < d; c += blockDim.x)
		o[c] = bf16_out ? kd_bf16_round(os[c]) : os[c];
}

static bool ad_aligned(const void *p)
{
	return ((uintptr_t)p & 15u) == 0;
}

extern "C" enum status kern_sparse_attn_cuda_decode(const struct kern_sparse_attn_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->idx_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->q || !a->out || (a->idx_stride > 0 && !a->idx))
		return ST_INVALID;
	if (a->omega && (!a->pos || a->rope_dim <= 0 || a->rope_dim % 2 || a->rope_dim > a->head_dim))
		return ST_INVALID;
	const int64_t stride = a->kv_stride ? a->kv_stride : a->head_dim;
	if (stride < a->head_dim)
		return ST_INVALID;
	ad_srcs src;
	bool fits = a->n_tokens <= KERN_ATTN_DECODE_MAX_TOKENS && a->head_dim % 128 == 0 && a->head_dim <= 512 &&
		    stride % 4 == 0 && ad_aligned(a->q) && ad_aligned(a->out);
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (a->kv_rows[s] < 0 || (a->kv_rows[s] > 0 && !a->kv[s]))
			return ST_INVALID;
		src.kv[s] = a->kv[s];
		src.rows[s] = a->kv_rows[s];
		if (a->kv_rows[s] > 0 && !ad_aligned(a->kv[s]))
			fits = false;
	}
	if (!fits)
		return kern_sparse_attn_cuda_generic(a);
	cudaStream_t st = (cudaStream_t)a->stream;
	const int64_t T = a->n_tokens;
	const int H = a->n_heads, d = a->head_dim;
	const int n_hb = (H + AD_HB - 1) / AD_HB;
	const int n_sm = kern_device_sm_count();
	/* splits: about one CTA per SM (the split kernel's registers allow one
	 * 8-warp CTA per SM), at least AD_MIN_ROWS index slots each */
	const int64_t base = T * n_hb;
	int64_t S = ((int64_t)n_sm + base / 2) / base;
	const int64_t s_rows = ((int64_t)a->idx_stride + AD_MIN_ROWS - 1) / AD_MIN_ROWS;
	S = S < s_rows ? S : s_rows;
	S = S < 1 ? 1 : (S > AD_MAXS ? AD_MAXS : S);
	const size_t acc_bytes = (size_t)(S * T * H) * (size_t)d * sizeof(float);
	const size_t ml_bytes = (size_t)(S * T * H) * sizeof(float2);
	/* the executor's scratch (kernels/device/ctx.h): it grows only outside
	 * a graph capture, and the first step of a batch size runs eagerly
	 * (kernels/device/graph.h), so a captured step finds it large enough;
	 * when it cannot have it, the generic kernel needs none */
	void *ws = kern_ctx_scratch(kern_ctx_or_default(a->ctx), acc_bytes + ml_bytes, a->stream);
	if (!ws)
		return kern_sparse_attn_cuda_generic(a);
	float *ws_acc = (float *)ws;
	float2 *ws_ml = (float2 *)((char *)ws + acc_bytes);
	dim3 grid((unsigned)S, (unsigned)n_hb, (unsigned)T);
	ad_split_kernel<<<grid, AD_NT, (size_t)2 * AD_RS * d * sizeof(float), st>>>(
		a->q, src, stride, a->idx, a->idx_len, a->idx_stride, a->softmax_scale, H, d, T, ws_acc, ws_ml);
	ad_combine_kernel<<<(unsigned)(T * H), 128, (size_t)d * sizeof(float), st>>>(
		ws_acc, ws_ml, (int)S, T, H, d, a->sink, a->pos, a->omega, a->rope_dim, a->bf16_out, a->out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}
