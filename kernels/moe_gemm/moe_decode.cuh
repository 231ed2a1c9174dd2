/*
 * kernels/moe_gemm/moe_decode.cuh: what the two kernels of op moe_decode
 * share (moe_decode_fma.cu: f32 FMA, moe_decode_mma.cu: bf16 mma.sync), and
 * the interface moe_decode.cu's host side drives them through.
 *
 * Both run the same two passes over the same work items (moe_decode_fma.cu's
 * top comment describes them): a block scans the device offsets into shared
 * memory, walks (expert, chunk of up to RC rows, column chunk) items, stages
 * each item's activation rows act-quantized as bf16, and ends pass 0 with the
 * SwiGLU epilogue and pass 1 with the combine. Only the inner product and the
 * weight loads differ, and they stay in the kernels' files; the steps around
 * them are the device functions below, so both kernels do them identically.
 * Header-only, static functions: each .cu gets its own copy (no cross-TU
 * device calls). Each kernel file exports its kernels as a struct
 * md_pass_kind; moe_decode.cu launches them through those pointers, which
 * is host code only (no relocatable device code).
 */
#ifndef DSV4_KERNELS_MOE_DECODE_CUH
#define DSV4_KERNELS_MOE_DECODE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/quant/wmat.h"
}
#include "kernels/norm/lowp_cuda.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define MD_FULL 0xFFFFFFFFu
#define MD_CHUNK 32 /* the combine's counters: one per (token, 32 output columns) (moe_decode.c sizes them) */

struct md_params {
	int64_t n_experts, n_tokens;
	int top_k;
	const int32_t *offsets, *row_src, *slot_row;
	const float *row_weight;
	const float *x;                  /* pass 0: [T, in]; pass 1: h [rows, in] */
	int64_t in, out;                 /* this pass's GEMM */
	const struct kern_wmat *wa, *wb; /* pass 0: w1, w3; pass 1: w2 (wb unused) */
	float *h;                        /* pass 0 writes [rows, out] */
	float *y;                        /* pass 1 writes [rows, out] */
	float *outp;                     /* pass 1 writes [T, out] */
	uint32_t *cnt;                   /* [T, ceil(D / 32)] */
	int64_t n_cnt;
	float limit;
	int bf16r;
};

/* ---- one kernel family, as the host side sees it ---- */

/* The kernel of one (pass, rows per item). */
typedef void (*md_kernel_fn)(const md_params p);

/* What moe_decode.cu needs of a family to size and launch its two passes. */
struct md_pass_kind {
	md_kernel_fn kernel[2][4];                  /* [pass][rc = 1, 2, 4, 8 rows per item] */
	int nt;                                     /* threads per block */
	int out0, out1;                             /* outputs per item: pass 0, pass 1 */
	size_t (*stage_bytes)(int rc, int64_t in); /* shared memory of the staged rows */
};

extern const struct md_pass_kind kern__moe_decode_fma; /* moe_decode_fma.cu */
extern const struct md_pass_kind kern__moe_decode_mma; /* moe_decode_mma.cu */

/* ---- device steps both kernels share ---- */

/* Padded shared-memory index of activation k (bf16 elements): 8 halves of
 * padding per 32 so the lanes' 64-byte reads (lane l at k = 32·l) fall in
 * distinct banks per quarter-warp phase. */
static __host__ __device__ __forceinline__ int64_t md_xi(int64_t k)
{
	return k + (k >> 5) * 8;
}

/* silu as act_generic.cu computes it (the reference's fp32 operations, no contraction). */
static __device__ __forceinline__ float md_silu(float g)
{
	return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
}

static __device__ __forceinline__ int md_n_local(const md_params &p, int64_t t)
{
	int n = 0;
	for (int j = 0; j < p.top_k; j++)
		n += p.slot_row[t * p.top_k + j] >= 0;
	return n;
}

/* Warp 0 (lane: its lane): the offsets into s_off[E + 1] and the prefix sums
 * of every expert's RC-row chunks into s_pref[E + 1]. */
template <int RC>
static __device__ __forceinline__ void md_scan_experts(const md_params &p, int lane, int *s_pref, int *s_off)
{
	const int64_t E = p.n_experts;
	int cum = 0;
	for (int64_t base = 0; base < E; base += 32) {
		const int64_t ex = base + lane;
		int b = 0, c = 0, tiles = 0;
		if (ex < E) {
			b = p.offsets[ex];
			c = p.offsets[ex + 1];
			tiles = c > b ? (c - b + RC - 1) / RC : 0;
			s_off[ex] = b;
			if (ex == E - 1)
				s_off[E] = c;
		}
		int incl = tiles;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int t = __shfl_up_sync(MD_FULL, incl, o);
			if (lane >= o)
				incl += t;
		}
		if (ex < E)
			s_pref[ex + 1] = cum + incl;
		cum += __shfl_sync(MD_FULL, incl, 31);
	}
	if (lane == 0)
		s_pref[0] = 0;
}

/* Work item `item` of a pass with n_chunks column chunks: column chunk xc,
 * and rows r0 .. r0 + nr - 1 (nr <= RC) of expert e, the last e with
 * s_pref[e] <= its row chunk (so it has rows). */
struct md_item {
	int64_t xc;
	int e, r0, nr;
};

template <int RC>
static __device__ __forceinline__ md_item md_item_at(const int *s_pref, const int *s_off, int64_t E, int64_t n_chunks,
						     int64_t item)
{
	const int tile = (int)(item / n_chunks);
	md_item it;
	it.xc = item % n_chunks;
	int lo = 0, hi = (int)E - 1;
	while (lo < hi) {
		const int mid = (lo + hi + 1) >> 1;
		if (s_pref[mid] <= tile)
			lo = mid;
		else
			hi = mid - 1;
	}
	it.e = lo;
	it.r0 = s_off[it.e] + (tile - s_pref[it.e]) * RC;
	it.nr = min(RC, s_off[it.e + 1] - it.r0);
	return it;
}

/* Stage rows r0 .. r0 + nr - 1 of the item into xs (row stride ld), FP8
 * act-quantized and stored as bf16 (exact): one warp per (row, 128-column
 * block), WARPS warps; pass 0 reads the rows' tokens of x, pass 1 the rows. */
template <int MODE, int WARPS>
static __device__ __forceinline__ void md_stage_rows(const md_params &p, __nv_bfloat16 *xs, int64_t ld, int r0, int nr,
						     int warp, int lane)
{
	const int64_t in = p.in, nb = in / 128; /* act_quant blocks per row */
	for (int64_t u = warp; u < nr * nb; u += WARPS) {
		const int r = (int)(u / nb);
		const int64_t kb = (u % nb) * 128 + lane * 4;
		const int64_t src = MODE == 0 ? (int64_t)p.row_src[r0 + r] : (int64_t)(r0 + r);
		const float4 v4 = __ldg((const float4 *)(p.x + src * in + kb));
		float v[4] = {v4.x, v4.y, v4.z, v4.w};
		float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			amax = fmaxf(amax, __shfl_xor_sync(MD_FULL, amax, off));
		const float s = kq_fp8_block_scale(amax), inv = 1.0f / s;
		const __nv_bfloat162 a =
			__floats2bfloat162_rn(kq_fp8_qdq_pow2(v[0], s, inv), kq_fp8_qdq_pow2(v[1], s, inv));
		const __nv_bfloat162 b =
			__floats2bfloat162_rn(kq_fp8_qdq_pow2(v[2], s, inv), kq_fp8_qdq_pow2(v[3], s, inv));
		uint2 w2;
		w2.x = *(const uint32_t *)&a;
		w2.y = *(const uint32_t *)&b;
		*(uint2 *)&xs[r * ld + md_xi(kb)] = w2;
	}
}

/* Pass 0's epilogue for row `row`, output o, from its gate and up sums g, u:
 * [bf16 rounding], the clamps, silu(g)·u, the routing weight, [rounding]. */
static __device__ __forceinline__ void md_swiglu_store(const md_params &p, int row, int64_t o, float g, float u)
{
	if (p.bf16r) {
		g = kd_bf16_round(g);
		u = kd_bf16_round(u);
	}
	if (p.limit > 0) {
		g = fminf(g, p.limit);
		u = fminf(fmaxf(u, -p.limit), p.limit);
	}
	float a = __fmul_rn(md_silu(g), u);
	if (p.row_weight)
		a = __fmul_rn(p.row_weight[row], a);
	if (p.bf16r)
		a = kd_bf16_round(a);
	p.h[(int64_t)row * p.out + o] = a;
}

/* Pass 1's store of y[row, o] = v [bf16 rounded]. */
static __device__ __forceinline__ void md_store_y(const md_params &p, int row, int64_t o, float v)
{
	p.y[(int64_t)row * p.out + o] = p.bf16r ? kd_bf16_round(v) : v;
}

/* Pass 1's combine after an item's y is stored (every thread of the block,
 * NT of them, calls it): the block completing a token's last row for column
 * chunk xc (CHUNK columns, n_chunks per token) sums the token's rows in slot
 * order into outp. s_flag[RC] is the block's shared scratch. */
template <int CHUNK, int NT>
static __device__ __forceinline__ void md_combine(const md_params &p, int *s_flag, int tid, int r0, int nr,
						  int64_t n_chunks, int64_t xc)
{
	const int64_t out = p.out;
	__threadfence();
	__syncthreads();
	if (tid < nr) {
		const int64_t t = p.row_src[r0 + tid];
		const int need = md_n_local(p, t);
		const uint32_t old = atomicAdd(&p.cnt[t * n_chunks + xc], 1u);
		__threadfence();
		s_flag[tid] = old + 1 == (uint32_t)need ? (int)t : -1;
	}
	__syncthreads();
	__threadfence();
	for (int r = 0; r < nr; r++) {
		const int64_t t = s_flag[r];
		if (t < 0)
			continue;
		for (int i = tid; i < CHUNK; i += NT) {
			const int64_t o = xc * CHUNK + i;
			if (o >= out)
				continue;
			float sum = 0.f;
			for (int j = 0; j < p.top_k; j++) {
				const int32_t sr = p.slot_row[t * p.top_k + j];
				if (sr >= 0)
					sum += __ldcg(p.y + (int64_t)sr * out + o);
			}
			p.outp[t * out + o] = sum;
		}
	}
}

/* After the items (NT threads per block): pass 0 zeroes the down pass's
 * counters; pass 1 writes zeros for tokens routed to no local expert, as
 * moe_combine does. */
template <int MODE, int NT>
static __device__ __forceinline__ void md_finish(const md_params &p, int tid)
{
	if (MODE == 0) {
		for (int64_t i = (int64_t)blockIdx.x * NT + tid; i < p.n_cnt; i += (int64_t)gridDim.x * NT)
			p.cnt[i] = 0u;
	} else {
		for (int64_t t = blockIdx.x; t < p.n_tokens; t += gridDim.x)
			if (md_n_local(p, t) == 0)
				for (int64_t o = tid; o < p.out; o += NT)
					p.outp[t * p.out + o] = 0.f;
	}
}

#endif
