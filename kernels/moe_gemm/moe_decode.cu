/*
 * kernels/moe_gemm/moe_decode.cu: the fused routed-expert pass of a small
 * step (variant moe_decode_cuda of op moe_decode, moe_decode.h), plain CUDA
 * C for every cc >= 8.0 (built into every image, so sm_120 / sm_121 run the
 * code measured on sm_90).
 *
 * Two launches of one kernel template:
 *   pass 0 (gate/up): h[r, o] = round(w·silu(min(g, L)) · clamp(u, ±L)),
 *     g = round(Σ xq[src(r)]·w1[o]), u = round(Σ xq[src(r)]·w3[o]), where xq is
 *     the FP8 act_quant (block 128) of the token's row and round the optional
 *     bf16 rounding: each warp owns 2 outputs, i.e. 4 weight rows (w1 and w3
 *     of each), so g and u meet in one warp and SwiGLU is its epilogue.
 *   pass 1 (down): y[r, o] = round(Σ hq[r]·w2[o]) with hq the act_quant of h,
 *     4 outputs per warp; then the combine: the block that completes the last
 *     of a token's rows for a 32-column chunk (an atomic counter per token and
 *     chunk, in the context's scratch, zeroed by pass 0) sums that token's
 *     rows of y in slot order into out (the reference's order, so the combine
 *     adds exactly what moe_combine adds). Tokens without local rows get zeros.
 *
 * Work items are (expert, chunk of up to RC rows, column chunk); a block
 * scans the device offsets once into shared memory (prefix sums of every
 * expert's row chunks, so nothing depends on the host knowing the routing)
 * and walks items blockIdx.x, + gridDim.x, ...; the grid is what fits on the
 * device at once. Per item: the first batch of weight loads is issued, the
 * item's activation rows are gathered and act-quantized into shared memory
 * as bf16 (exact: e4m3 x power of two), then each lane streams 16-byte loads
 * of packed e2m1 (a warp reads 512 contiguous bytes of a row per step, two
 * steps of its four rows in flight), decodes them in registers (moe_e2m1.h) and
 * accumulates in f32 against the staged activations; warp-shuffle sums at
 * the end. NVFP4: e2m1 x e4m3 per 16 x f32 global; MXFP4: e2m1 x E8M0 per 32.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "dsv4_config.h"
#include "kernels/device/ctx.h"
#include "kernels/moe_gemm/moe_decode.h"
}
#include "kernels/moe_gemm/moe_e2m1.h"
#include "kernels/norm/lowp_cuda.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define MD_NT 256 /* threads per block: 8 warps */
#define MD_WARPS (MD_NT / 32)
#define MD_NR 4   /* weight rows per warp */
#define MD_ST 2   /* 512-byte steps per load batch */
#define MD_OUT0 (MD_WARPS * MD_NR / 2) /* pass 0: outputs per item (w1 and w3 rows per output) */
#define MD_OUT1 (MD_WARPS * MD_NR)     /* pass 1: outputs per item = the combine's column chunk */
#define MD_FULL 0xFFFFFFFFu

static_assert(MD_OUT1 == 32, "moe_decode.c sizes the counters for 32-column chunks");

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

/* Padded shared-memory index of activation k (bf16 elements): 8 halves of
 * padding per 32 so the lanes' 64-byte reads (lane l at k = 32·l) fall in
 * distinct banks per quarter-warp phase. */
static __host__ __device__ __forceinline__ int64_t md_xi(int64_t k)
{
	return k + (k >> 5) * 8;
}

static __host__ __device__ __forceinline__ size_t md_stage_bytes(int rc, int64_t in)
{
	return ((size_t)rc * (size_t)md_xi(in) * 2 + 15) & ~(size_t)15;
}

/* The FP8 act_quant of one element (bit-identical to kq_fp8_qdq: s is a
 * power of two, so x · (1/s) == x / s; e4m3 RNE on the f32 bits for normals,
 * rintf at 2^-9 steps below 2^-6), clamped to ±448 first. */
static __device__ __forceinline__ float md_qdq(float x, float s, float inv_s)
{
	const float v = fminf(fmaxf(x * inv_s, -448.0f), 448.0f);
	const float a = fabsf(v);
	float q;
	if (a < 0x1p-6f) {
		q = rintf(a * 0x1p9f) * 0x1p-9f;
	} else {
		uint32_t u = __float_as_uint(a);
		u = (u + 0x7FFFFu + ((u >> 20) & 1u)) & 0xFFF00000u;
		q = __uint_as_float(u);
	}
	return copysignf(q, v) * s;
}

/* 16 staged activations from element offset i (16-byte aligned) as f32. */
static __device__ __forceinline__ void md_get16(const __nv_bfloat16 *xs, int64_t i, float *t)
{
#pragma unroll
	for (int c = 0; c < 2; c++) {
		const uint4 q = *(const uint4 *)&xs[i + 8 * c];
		const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			t[8 * c + 2 * k] = __uint_as_float(u[k] << 16);
			t[8 * c + 2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
		}
	}
}

static __device__ __forceinline__ float md_warp_sum(float v)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(MD_FULL, v, off);
	return v;
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

/* MODE 0: gate/up + SwiGLU; MODE 1: down + combine. RC: rows per item. */
template <int MODE, int RC>
__global__ void __launch_bounds__(MD_NT, RC <= 2 ? 2 : 1) md_kernel(const md_params p)
{
	extern __shared__ __align__(16) unsigned char md_smem[];
	__shared__ int s_flag[RC];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int64_t E = p.n_experts, in = p.in, out = p.out, rb = in / 2;
	const int64_t ld = md_xi(in);
	__nv_bfloat16 *xs = (__nv_bfloat16 *)md_smem;
	int *s_pref = (int *)(md_smem + md_stage_bytes(RC, in)); /* [E + 1] row chunks before expert e */
	int *s_off = s_pref + E + 1;                                 /* [E + 1] the offsets */

	/* Warp 0: the offsets and the prefix sums of every expert's RC-row chunks. */
	if (warp == 0) {
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
	__syncthreads();

	const int per = MODE == 0 ? MD_OUT0 : MD_OUT1;
	const int64_t n_chunks = (out + per - 1) / per;
	const int64_t n_items = (int64_t)s_pref[E] * n_chunks;
	const int64_t nb = in / 128; /* act_quant blocks per row */

	for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
		const int tile = (int)(item / n_chunks);
		const int64_t xc = item % n_chunks;
		/* the expert: the last e with s_pref[e] <= tile (it has rows) */
		int lo = 0, hi = (int)E - 1;
		while (lo < hi) {
			const int mid = (lo + hi + 1) >> 1;
			if (s_pref[mid] <= tile)
				lo = mid;
			else
				hi = mid - 1;
		}
		const int e = lo;
		const int r0 = s_off[e] + (tile - s_pref[e]) * RC;
		const int nr = min(RC, s_off[e + 1] - r0);

		/* This warp's weight rows: pass 0 (w1 o, w3 o, w1 o+1, w3 o+1), pass 1 (w2 o .. o+3). */
		const uint8_t *wrow[MD_NR], *srow[MD_NR];
		float gsc[MD_NR];
		bool ok[MD_NR];
		bool nv = false;
#pragma unroll
		for (int j = 0; j < MD_NR; j++) {
			const int64_t o = MODE == 0 ? xc * MD_OUT0 + warp * (MD_NR / 2) + (j >> 1)
						    : xc * MD_OUT1 + warp * MD_NR + j;
			const struct kern_wmat *wm = (MODE == 0 && (j & 1)) ? &p.wb[e] : &p.wa[e];
			const uint8_t *d = (const uint8_t *)wm->data, *s = (const uint8_t *)wm->scale;
			nv = wm->fmt == KERN_WFMT_NVFP4;
			ok[j] = o < out;
			const int64_t oo = ok[j] ? o : 0;
			wrow[j] = d + oo * rb;
			srow[j] = s + oo * (nv ? in / 16 : in / 32);
			gsc[j] = nv ? wm->global_scale : 1.0f;
		}

		uint4 q[MD_NR][MD_ST];
		uint32_t sc[MD_NR][MD_ST];
/* Issue the loads of the batch of steps starting at byte b0_ of the rows. */
#define MD_LOAD(b0_)                                                                                            \
	_Pragma("unroll") for (int j = 0; j < MD_NR; j++) _Pragma("unroll") for (int st = 0; st < MD_ST; st++) \
	{                                                                                                       \
		const int64_t b_ = (b0_) + st * 512 + lane * 16;                                                \
		q[j][st] = make_uint4(0u, 0u, 0u, 0u);                                                          \
		sc[j][st] = 0u;                                                                                 \
		if (ok[j] && b_ < rb) {                                                                         \
			q[j][st] = __ldg((const uint4 *)(wrow[j] + b_));                                        \
			sc[j][st] = nv ? (uint32_t)__ldg((const unsigned short *)(srow[j] + b_ / 8))            \
				       : (uint32_t)__ldg(srow[j] + b_ / 16);                                   \
		}                                                                                               \
	}
		MD_LOAD(0)

		/* Stage the item's rows, act-quantized: one warp per (row, 128-column block). */
		__syncthreads(); /* the previous item's readers are done with xs and s_flag */
		for (int64_t u = warp; u < nr * nb; u += MD_WARPS) {
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
			const __nv_bfloat162 a = __floats2bfloat162_rn(md_qdq(v[0], s, inv), md_qdq(v[1], s, inv));
			const __nv_bfloat162 b = __floats2bfloat162_rn(md_qdq(v[2], s, inv), md_qdq(v[3], s, inv));
			uint2 w2;
			w2.x = *(const uint32_t *)&a;
			w2.y = *(const uint32_t *)&b;
			*(uint2 *)&xs[r * ld + md_xi(kb)] = w2;
		}
		__syncthreads();

		float acc[MD_NR][RC];
#pragma unroll
		for (int j = 0; j < MD_NR; j++)
#pragma unroll
			for (int r = 0; r < RC; r++)
				acc[j][r] = 0.f;

		for (int64_t b0 = 0;;) {
#pragma unroll
			for (int st = 0; st < MD_ST; st++) {
				const int64_t b = b0 + st * 512 + lane * 16;
				if (b >= rb)
					break;
				const int64_t xo = md_xi(2 * b);
#pragma unroll
				for (int h = 0; h < 2; h++) { /* 16 codes: one NVFP4 block, half an MXFP4 one */
					float t[16];
					if (RC == 1)
						md_get16(xs, xo + 16 * h, t);
#pragma unroll
					for (int j = 0; j < MD_NR; j++) {
						if (!ok[j])
							continue;
						const uint4 w4 = q[j][st];
						float f[16];
						kern_e2m1x8_to_f32(h ? w4.z : w4.x, f);
						kern_e2m1x8_to_f32(h ? w4.w : w4.y, f + 8);
						const float s = nv ? kq_e4m3_to_f32(h ? (sc[j][st] >> 8) & 0xFFu : sc[j][st] & 0xFFu) * gsc[j]
								   : kq_e8m0_to_f32(sc[j][st]);
#pragma unroll
						for (int r = 0; r < RC; r++) {
							if (r >= nr)
								break;
							if (RC > 1)
								md_get16(xs, xo + r * ld + 16 * h, t);
							float part = 0.f;
#pragma unroll
							for (int c = 0; c < 16; c++)
								part = fmaf(t[c], f[c], part);
							acc[j][r] = fmaf(part, s, acc[j][r]);
						}
					}
				}
			}
			b0 += MD_ST * 512;
			if (b0 >= rb)
				break;
			MD_LOAD(b0)
		}

#undef MD_LOAD
		if (MODE == 0) {
			/* SwiGLU epilogue: lane r finishes row r of each of the warp's two outputs. */
#pragma unroll
			for (int jj = 0; jj < MD_NR / 2; jj++) {
				const int64_t o = xc * MD_OUT0 + warp * (MD_NR / 2) + jj;
#pragma unroll
				for (int r = 0; r < RC; r++) {
					if (r >= nr)
						break;
					float g = md_warp_sum(acc[2 * jj][r]), u = md_warp_sum(acc[2 * jj + 1][r]);
					if (lane == r && o < out) {
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
							a = __fmul_rn(p.row_weight[r0 + r], a);
						if (p.bf16r)
							a = kd_bf16_round(a);
						p.h[(int64_t)(r0 + r) * out + o] = a;
					}
				}
			}
		} else {
#pragma unroll
			for (int j = 0; j < MD_NR; j++) {
				const int64_t o = xc * MD_OUT1 + warp * MD_NR + j;
#pragma unroll
				for (int r = 0; r < RC; r++) {
					if (r >= nr)
						break;
					float v = md_warp_sum(acc[j][r]);
					if (lane == r && o < out)
						p.y[(int64_t)(r0 + r) * out + o] = p.bf16r ? kd_bf16_round(v) : v;
				}
			}
			/* Combine: the block completing a token's last row for this column
			 * chunk sums the token's rows in slot order. */
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
				for (int i = tid; i < MD_OUT1; i += MD_NT) {
					const int64_t o = xc * MD_OUT1 + i;
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
	}

	if (MODE == 0) {
		/* the down pass's counters start at zero */
		for (int64_t i = (int64_t)blockIdx.x * MD_NT + tid; i < p.n_cnt; i += (int64_t)gridDim.x * MD_NT)
			p.cnt[i] = 0u;
	} else {
		/* tokens routed to no local expert: out = 0, as moe_combine writes */
		for (int64_t t = blockIdx.x; t < p.n_tokens; t += gridDim.x)
			if (md_n_local(p, t) == 0)
				for (int64_t o = tid; o < out; o += MD_NT)
					p.outp[t * out + o] = 0.f;
	}
}

/* ---- variant moe_decode_cuda_mma: the same passes on bf16 mma.sync ----
 *
 * A warp owns 16 weight rows, the A operand of mma.sync m16n8k16 (bf16 in,
 * f32 accumulation; sm_80 and later): pass 0 rows g and g + 8 are w1 and w3
 * of output g of the warp's 8, so each lane ends holding the gate and up
 * sums of one output for two activation rows (the D fragment) and finishes
 * SwiGLU without a shuffle; pass 1 rows are 16 outputs of w2. The B operand
 * is the item's staged activation rows (n = 8 columns, RC of them real).
 * Lane (g, t) loads 16 bytes of rows g and g + 8 at byte 16·t of each
 * 64-byte step (4 lanes: one 128-code act_quant block), decodes a word of 8
 * codes into 4 bf16 pairs (exact) and multiplies them by the block scale in
 * bf16 (e2m1 x e4m3 or x 2^e is exact in bf16); its k slots of each mma are
 * 4 consecutive codes of its own 32, and it reads the same 4 codes' activations
 * from shared memory (row = its column g), so A and B agree on which k each
 * slot is. The NVFP4 global scale multiplies the sums. */
#define MM_WARPS 4
#define MM_NT (MM_WARPS * 32)
#define MM_S 4                  /* 64-byte steps per load batch */
#define MM_OUT0 (MM_WARPS * 8)  /* pass 0 outputs per item */
#define MM_OUT1 (MM_WARPS * 16) /* pass 1 outputs per item: the combine's chunk */

static_assert(MM_OUT1 % MD_OUT1 == 0, "the counters are sized for 32-column chunks");

/* Row stride of the staged activations in elements: md_xi padding, and
 * ≡ 32 (mod 64) so the 8 lanes of a quarter-warp (2 rows x 4 lanes 80 bytes
 * apart) read 16-byte chunks in distinct banks. */
static __host__ __device__ __forceinline__ int64_t mm_ld(int64_t in)
{
	return (md_xi(in) + 31) / 64 * 64 + 32;
}

static __host__ __device__ __forceinline__ size_t mm_stage_bytes(int rc, int64_t in)
{
	return ((size_t)rc * (size_t)mm_ld(in) * 2 + 15) & ~(size_t)15;
}

static __device__ __forceinline__ void mm_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
					      uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
		     "{%8, %9}, {%0, %1, %2, %3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two bf16 products (exact here: e2m1 x a scale with at most 4 significant bits). */
static __device__ __forceinline__ uint32_t mm_bmul(uint32_t a, uint32_t b)
{
	uint32_t d;
	asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
	return d;
}

/* A block scale as a bf16 pair (s, s): e4m3 (scale bits c) or E8M0 (c = e).
 * e4m3: the code's bits shifted to an f32's exponent/mantissa are the value
 * times 2^-120 (subnormal codes included), so one multiply restores it. */
static __device__ __forceinline__ uint32_t mm_scale2(uint32_t c, bool nv)
{
	if (nv) {
		const float v = __uint_as_float((c & 0x7Fu) << 20) * 0x1p120f;
		const __nv_bfloat162 b = __float2bfloat162_rn(v);
		return *(const uint32_t *)&b;
	}
	return (c & 0xFFu) * 0x00800080u; /* 2^(c - 127) as bf16 bits, both halves (c = 0: 0, not 2^-127) */
}

template <int MODE, int RC>
__global__ void __launch_bounds__(MM_NT) mm_kernel(const md_params p)
{
	extern __shared__ __align__(16) unsigned char md_smem[];
	__shared__ int s_flag[RC];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
	const int64_t E = p.n_experts, in = p.in, out = p.out, rb = in / 2;
	const int64_t ld = mm_ld(in);
	__nv_bfloat16 *xs = (__nv_bfloat16 *)md_smem;
	int *s_pref = (int *)(md_smem + mm_stage_bytes(RC, in)); /* [E + 1] row chunks before expert e */
	int *s_off = s_pref + E + 1;                                 /* [E + 1] the offsets */

	if (warp == 0) {
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
	__syncthreads();

	const int per = MODE == 0 ? MM_OUT0 : MM_OUT1;
	const int64_t n_chunks = (out + per - 1) / per;
	const int64_t n_items = (int64_t)s_pref[E] * n_chunks;
	const int64_t nb = in / 128;

	for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
		const int tile = (int)(item / n_chunks);
		const int64_t xc = item % n_chunks;
		int lo = 0, hi = (int)E - 1;
		while (lo < hi) {
			const int mid = (lo + hi + 1) >> 1;
			if (s_pref[mid] <= tile)
				lo = mid;
			else
				hi = mid - 1;
		}
		const int e = lo;
		const int r0 = s_off[e] + (tile - s_pref[e]) * RC;
		const int nr = min(RC, s_off[e + 1] - r0);

		/* rows g (rr 0) and g + 8 (rr 1) of the warp's 16 */
		int64_t o[2];
		const uint8_t *wrow[2], *srow[2];
		float gsc[2];
		bool ok[2];
		bool nv = false;
#pragma unroll
		for (int rr = 0; rr < 2; rr++) {
			o[rr] = MODE == 0 ? xc * MM_OUT0 + warp * 8 + g : xc * MM_OUT1 + warp * 16 + g + 8 * rr;
			const struct kern_wmat *wm = (MODE == 0 && rr) ? &p.wb[e] : &p.wa[e];
			const uint8_t *d = (const uint8_t *)wm->data, *sp = (const uint8_t *)wm->scale;
			nv = wm->fmt == KERN_WFMT_NVFP4;
			ok[rr] = o[rr] < out;
			const int64_t oo = ok[rr] ? o[rr] : 0;
			wrow[rr] = d + oo * rb;
			srow[rr] = sp + oo * (nv ? in / 16 : in / 32);
			gsc[rr] = nv ? wm->global_scale : 1.0f;
		}

		/* double-buffered: the next batch's loads are in flight while this one is used */
		uint4 q[2][MM_S], qn[2][MM_S];
		uint32_t sc[2][MM_S], scn[2][MM_S];
#define MM_LOAD(Q, SC, b0_)                                                                                    \
	_Pragma("unroll") for (int rr = 0; rr < 2; rr++) _Pragma("unroll") for (int st = 0; st < MM_S; st++)  \
	{                                                                                                      \
		const int64_t b_ = (b0_) + st * 64 + t4 * 16;                                                  \
		Q[rr][st] = make_uint4(0u, 0u, 0u, 0u);                                                        \
		SC[rr][st] = 0u;                                                                               \
		if (ok[rr] && b_ < rb) {                                                                       \
			Q[rr][st] = __ldg((const uint4 *)(wrow[rr] + b_));                                     \
			SC[rr][st] = nv ? (uint32_t)__ldg((const unsigned short *)(srow[rr] + b_ / 8))         \
					: (uint32_t)__ldg(srow[rr] + b_ / 16);                                \
		}                                                                                              \
	}
		MM_LOAD(q, sc, 0)

		__syncthreads(); /* the previous item's readers are done with xs and s_flag */
		for (int64_t u = warp; u < nr * nb; u += MM_WARPS) {
			const int r = (int)(u / nb);
			const int64_t kb = (u % nb) * 128 + lane * 4;
			const int64_t src = MODE == 0 ? (int64_t)p.row_src[r0 + r] : (int64_t)(r0 + r);
			const float4 v4 = __ldg((const float4 *)(p.x + src * in + kb));
			float v[4] = {v4.x, v4.y, v4.z, v4.w};
			float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				amax = fmaxf(amax, __shfl_xor_sync(MD_FULL, amax, off));
			const float sx = kq_fp8_block_scale(amax), inv = 1.0f / sx;
			const __nv_bfloat162 a = __floats2bfloat162_rn(md_qdq(v[0], sx, inv), md_qdq(v[1], sx, inv));
			const __nv_bfloat162 b = __floats2bfloat162_rn(md_qdq(v[2], sx, inv), md_qdq(v[3], sx, inv));
			uint2 w2;
			w2.x = *(const uint32_t *)&a;
			w2.y = *(const uint32_t *)&b;
			*(uint2 *)&xs[r * ld + md_xi(kb)] = w2;
		}
		__syncthreads();

		/* this lane's B column: activation row g (columns past nr repeat the last row, unused) */
		const int64_t xrow = (int64_t)min(g, nr - 1) * ld;
		float d[4] = {0.f, 0.f, 0.f, 0.f};
		for (int64_t b0 = 0;;) {
			const bool more = b0 + MM_S * 64 < rb;
			if (more) {
				MM_LOAD(qn, scn, b0 + MM_S * 64)
			}
#pragma unroll
			for (int st = 0; st < MM_S; st++) {
				if (b0 + st * 64 >= rb) /* rb % 64 == 0: the same for the whole warp */
					break;
				const int64_t b = b0 + st * 64 + t4 * 16;
				const int64_t xo = xrow + md_xi(2 * b);
				uint32_t s2[2][2];
#pragma unroll
				for (int rr = 0; rr < 2; rr++) {
					s2[rr][0] = mm_scale2(nv ? sc[rr][st] & 0xFFu : sc[rr][st], nv);
					s2[rr][1] = nv ? mm_scale2(sc[rr][st] >> 8, nv) : s2[rr][0];
				}
#pragma unroll
				for (int qd = 0; qd < 4; qd++) { /* word qd: codes 8·qd .. 8·qd + 7 of the lane's 32 */
					const uint4 xw = *(const uint4 *)&xs[xo + 8 * qd];
					const uint32_t wg = qd == 0 ? q[0][st].x : qd == 1 ? q[0][st].y : qd == 2 ? q[0][st].z : q[0][st].w;
					const uint32_t wh = qd == 0 ? q[1][st].x : qd == 1 ? q[1][st].y : qd == 2 ? q[1][st].z : q[1][st].w;
					uint32_t pg[4], ph[4];
					kern_e2m1x8_to_bf16x2(wg, pg);
					kern_e2m1x8_to_bf16x2(wh, ph);
#pragma unroll
					for (int i = 0; i < 4; i++) {
						pg[i] = mm_bmul(pg[i], s2[0][qd >> 1]);
						ph[i] = mm_bmul(ph[i], s2[1][qd >> 1]);
					}
					mm_mma(d, pg[0], ph[0], pg[1], ph[1], xw.x, xw.y); /* codes 0..3 of the word */
					mm_mma(d, pg[2], ph[2], pg[3], ph[3], xw.z, xw.w); /* codes 4..7 */
				}
			}
			if (!more)
				break;
			b0 += MM_S * 64;
#pragma unroll
			for (int rr = 0; rr < 2; rr++)
#pragma unroll
				for (int st = 0; st < MM_S; st++) {
					q[rr][st] = qn[rr][st];
					sc[rr][st] = scn[rr][st];
				}
		}
#undef MM_LOAD

		/* d[0], d[1]: row g at columns 2·t4, 2·t4 + 1; d[2], d[3]: row g + 8 */
		if (MODE == 0) {
#pragma unroll
			for (int cc = 0; cc < 2; cc++) {
				const int r = 2 * t4 + cc;
				if (r < nr && ok[0]) {
					float gv = d[cc] * gsc[0], uv = d[2 + cc] * gsc[1];
					if (p.bf16r) {
						gv = kd_bf16_round(gv);
						uv = kd_bf16_round(uv);
					}
					if (p.limit > 0) {
						gv = fminf(gv, p.limit);
						uv = fminf(fmaxf(uv, -p.limit), p.limit);
					}
					float a = __fmul_rn(md_silu(gv), uv);
					if (p.row_weight)
						a = __fmul_rn(p.row_weight[r0 + r], a);
					if (p.bf16r)
						a = kd_bf16_round(a);
					p.h[(int64_t)(r0 + r) * out + o[0]] = a;
				}
			}
		} else {
#pragma unroll
			for (int cc = 0; cc < 2; cc++) {
				const int r = 2 * t4 + cc;
#pragma unroll
				for (int rr = 0; rr < 2; rr++)
					if (r < nr && ok[rr]) {
						const float v = d[2 * rr + cc] * gsc[rr];
						p.y[(int64_t)(r0 + r) * out + o[rr]] = p.bf16r ? kd_bf16_round(v) : v;
					}
			}
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
				for (int i = tid; i < MM_OUT1; i += MM_NT) {
					const int64_t oc = xc * MM_OUT1 + i;
					if (oc >= out)
						continue;
					float sum = 0.f;
					for (int j = 0; j < p.top_k; j++) {
						const int32_t sr = p.slot_row[t * p.top_k + j];
						if (sr >= 0)
							sum += __ldcg(p.y + (int64_t)sr * out + oc);
					}
					p.outp[t * out + oc] = sum;
				}
			}
		}
	}

	if (MODE == 0) {
		for (int64_t i = (int64_t)blockIdx.x * MM_NT + tid; i < p.n_cnt; i += (int64_t)gridDim.x * MM_NT)
			p.cnt[i] = 0u;
	} else {
		for (int64_t t = blockIdx.x; t < p.n_tokens; t += gridDim.x)
			if (md_n_local(p, t) == 0)
				for (int64_t oc = tid; oc < out; oc += MM_NT)
					p.outp[t * out + oc] = 0.f;
	}
}

/* Per-device caches (64 devices): SM count, opt-in shared memory. */
static int md_dev_attr(int dev, cudaDeviceAttr attr, int *cache, int fallback)
{
	if (dev < 0 || dev >= 64)
		return fallback;
	if (!cache[dev]) {
		int v = 0;
		if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0) {
			cudaGetLastError();
			v = fallback;
		}
		cache[dev] = v;
	}
	return cache[dev];
}

template <bool MMA, int MODE, int RC>
static cudaError_t md_launch(const md_params &p, size_t smem, int64_t items_ub, int sms, int dev, cudaStream_t s)
{
	static int occ[64]; /* per device: resident blocks per SM at occ_smem */
	static size_t occ_smem[64];
	cudaError_t ce;
	const bool cached = dev >= 0 && dev < 64;
	const int nt = MMA ? MM_NT : MD_NT;
	int nb = cached && occ_smem[dev] == smem ? occ[dev] : 0;
	if (!nb) {
		ce = MMA ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, mm_kernel<MODE, RC>, nt, smem)
			 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, md_kernel<MODE, RC>, nt, smem);
		if (ce != cudaSuccess)
			return ce;
		if (nb < 1)
			nb = 1;
		if (cached) {
			occ[dev] = nb;
			occ_smem[dev] = smem;
		}
	}
	int64_t grid = (int64_t)nb * sms;
	if (grid > items_ub)
		grid = items_ub;
	if (grid < 1)
		grid = 1;
	if (MMA)
		mm_kernel<MODE, RC><<<(unsigned)grid, nt, smem, s>>>(p);
	else
		md_kernel<MODE, RC><<<(unsigned)grid, nt, smem, s>>>(p);
	return cudaGetLastError();
}

template <bool MMA, int MODE, int RC> static cudaError_t md_raise(int bytes)
{
	return MMA ? cudaFuncSetAttribute(mm_kernel<MODE, RC>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
		   : cudaFuncSetAttribute(md_kernel<MODE, RC>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

/* Once per device, before any launch: every instantiation may take the
 * device's opt-in shared memory (so no attribute is set later, when a stream
 * may be capturing a graph). */
static cudaError_t md_init(int dev, int optin)
{
	static int done[64];
	if (dev >= 0 && dev < 64 && done[dev])
		return cudaSuccess;
	const int bytes = optin - 256; /* the kernels' static shared words are below 256 bytes */
	cudaError_t (*const raise[16])(int) = {
		md_raise<false, 0, 1>, md_raise<false, 0, 2>, md_raise<false, 0, 4>, md_raise<false, 0, 8>,
		md_raise<false, 1, 1>, md_raise<false, 1, 2>, md_raise<false, 1, 4>, md_raise<false, 1, 8>,
		md_raise<true, 0, 1>,  md_raise<true, 0, 2>,  md_raise<true, 0, 4>,  md_raise<true, 0, 8>,
		md_raise<true, 1, 1>,  md_raise<true, 1, 2>,  md_raise<true, 1, 4>,  md_raise<true, 1, 8>};
	for (int i = 0; i < 16; i++) {
		const cudaError_t ce = raise[i](bytes);
		if (ce != cudaSuccess)
			return ce;
	}
	if (dev >= 0 && dev < 64)
		done[dev] = 1;
	return cudaSuccess;
}

template <bool MMA, int MODE>
static cudaError_t md_launch_rc(int rc, const md_params &p, size_t smem, int64_t items_ub, int sms, int dev,
				cudaStream_t s)
{
	switch (rc) {
	case 1: return md_launch<MMA, MODE, 1>(p, smem, items_ub, sms, dev, s);
	case 2: return md_launch<MMA, MODE, 2>(p, smem, items_ub, sms, dev, s);
	case 4: return md_launch<MMA, MODE, 4>(p, smem, items_ub, sms, dev, s);
	default: return md_launch<MMA, MODE, 8>(p, smem, items_ub, sms, dev, s);
	}
}

static bool md_fp4(enum kern_wfmt f)
{
	return f == KERN_WFMT_MXFP4 || f == KERN_WFMT_NVFP4;
}

static bool md_al(const void *p, uintptr_t a)
{
	return (uintptr_t)p % a == 0;
}

static enum status md_run(const struct kern_moe_decode_args *a, bool mma)
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->w1 || !a->w3 || !a->w2 ||
	    !a->w1_dev || !a->w3_dev || !a->w2_dev || !a->expert_offsets)
		return ST_INVALID;
	const int64_t T = a->n_tokens, K = a->top_k, E = a->n_experts;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->h || !a->y || !a->out || !a->row_src || !a->slot_row)
		return ST_INVALID;
	const enum kern_wfmt f = a->w1[0].fmt;
	const int64_t D = a->w1[0].cols, I = a->w1[0].rows;
	if (!md_fp4(f) || a->w3[0].fmt != f || a->w2[0].fmt != f || a->w3[0].rows != I || a->w3[0].cols != D ||
	    a->w2[0].rows != D || a->w2[0].cols != I)
		return ST_INVALID;
	if (a->act_quant_block != 128 || D % 128 || I % 128 || E > 1024 || K > 64)
		return ST_UNSUPPORTED;
	if (!md_al(a->x, 16) || !md_al(a->h, 16) || !md_al(a->y, 16) || !md_al(a->out, 16))
		return ST_UNSUPPORTED;
	for (int64_t e = 0; e < E; e++) {
		const struct kern_wmat *m[3] = {&a->w1[e], &a->w3[e], &a->w2[e]};
		for (int i = 0; i < 3; i++)
			if (!md_al(m[i]->data, 16) || !md_al(m[i]->scale, 2))
				return ST_UNSUPPORTED;
	}
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	static int smem_cache[64];
	const int sms = kern_device_sm_count();
	const int optin = md_dev_attr(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin, smem_cache, 48 << 10);
	const size_t tail = (size_t)(E + 1) * 2 * sizeof(int);
	int rc = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
	size_t (*const stage)(int, int64_t) = mma ? mm_stage_bytes : md_stage_bytes;
	while (rc > 1 && stage(rc, D) + tail + 1024 > (size_t)optin)
		rc /= 2;
	if (stage(rc, D) + tail + 1024 > (size_t)optin)
		return ST_UNSUPPORTED;
	if (md_init(dev, optin) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}

	const size_t cnt_bytes = kern_moe_decode_scratch_bytes(T, D);
	uint32_t *cnt = (uint32_t *)kern_ctx_scratch(kern_ctx_or_default(a->ctx), cnt_bytes, a->stream);
	if (!cnt)
		return ST_NOMEM;

	const int64_t P = T * K;
	int64_t tiles_ub = (P + rc - 1) / rc + E;
	if (tiles_ub > P)
		tiles_ub = P;
	md_params p = {};
	p.n_experts = E;
	p.n_tokens = T;
	p.top_k = (int)K;
	p.offsets = a->expert_offsets;
	p.row_src = a->row_src;
	p.slot_row = a->slot_row;
	p.row_weight = a->row_weight;
	p.h = a->h;
	p.y = a->y;
	p.outp = a->out;
	p.cnt = cnt;
	p.n_cnt = (int64_t)(cnt_bytes / sizeof(uint32_t));
	p.limit = a->swiglu_limit;
	p.bf16r = a->bf16_round ? 1 : 0;
	cudaStream_t s = (cudaStream_t)a->stream;

	md_params p0 = p;
	p0.x = a->x;
	p0.in = D;
	p0.out = I;
	p0.wa = a->w1_dev;
	p0.wb = a->w3_dev;
	const int64_t per0 = mma ? MM_OUT0 : MD_OUT0, per1 = mma ? MM_OUT1 : MD_OUT1;
	cudaError_t ce = mma ? md_launch_rc<true, 0>(rc, p0, stage(rc, D) + tail, tiles_ub * ((I + per0 - 1) / per0), sms,
						     dev, s)
			     : md_launch_rc<false, 0>(rc, p0, stage(rc, D) + tail, tiles_ub * ((I + per0 - 1) / per0), sms,
						      dev, s);
	if (ce == cudaSuccess) {
		md_params p1 = p;
		p1.x = a->h;
		p1.in = I;
		p1.out = D;
		p1.wa = a->w2_dev;
		p1.wb = a->w2_dev;
		int64_t items = tiles_ub * ((D + per1 - 1) / per1);
		if (items < T) /* the zero rows of tokens without local experts */
			items = T;
		ce = mma ? md_launch_rc<true, 1>(rc, p1, stage(rc, I) + tail, items, sms, dev, s)
			 : md_launch_rc<false, 1>(rc, p1, stage(rc, I) + tail, items, sms, dev, s);
	}
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_moe_decode_cuda(const struct kern_moe_decode_args *a)
{
	return md_run(a, false);
}

extern "C" enum status kern_moe_decode_cuda_mma(const struct kern_moe_decode_args *a)
{
	return md_run(a, true);
}

/* ---- host-buffer wrapper (tests, self-checks) ---- */

struct md_bufs {
	void *p[16];
	int n;
	cudaError_t ce;
};

static void *md_dev_copy(struct md_bufs *b, const void *src, size_t bytes)
{
	void *d = NULL;
	if (b->ce != cudaSuccess || b->n >= 16)
		return NULL;
	b->ce = cudaMalloc(&d, bytes ? bytes : 16);
	if (b->ce != cudaSuccess)
		return NULL;
	b->p[b->n++] = d;
	if (src && bytes)
		b->ce = cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
	return d;
}

/* Copies of the E experts of one projection (data and scales 256-byte aligned)
 * and the device array of their views; experts sharing one host matrix share
 * one device copy. */
static struct kern_wmat *md_experts(struct md_bufs *b, const struct kern_wmat *w, int64_t E, struct kern_wmat *hw)
{
	const size_t wb = kern_wmat_data_bytes(&w[0]), sb = kern_wmat_scale_bytes(&w[0]);
	const size_t wb_al = (wb + 255) & ~(size_t)255, stride = wb_al + ((sb + 255) & ~(size_t)255);
	int64_t n_distinct = 0;
	for (int64_t e = 0; e < E; e++) {
		bool seen = false;
		for (int64_t k = 0; k < e && !seen; k++)
			seen = w[k].data == w[e].data && w[k].scale == w[e].scale;
		n_distinct += !seen;
	}
	uint8_t *dw = (uint8_t *)md_dev_copy(b, NULL, (size_t)n_distinct * stride);
	int64_t next = 0;
	for (int64_t e = 0; e < E && b->ce == cudaSuccess; e++) {
		hw[e] = w[e];
		hw[e].owned = NULL;
		int64_t k = 0;
		while (k < e && !(w[k].data == w[e].data && w[k].scale == w[e].scale))
			k++;
		if (k < e) {
			hw[e].data = hw[k].data;
			hw[e].scale = hw[k].scale;
			continue;
		}
		hw[e].data = dw + next * stride;
		hw[e].scale = dw + next * stride + wb_al;
		next++;
		b->ce = cudaMemcpy((void *)hw[e].data, w[e].data, wb, cudaMemcpyHostToDevice);
		if (b->ce == cudaSuccess)
			b->ce = cudaMemcpy((void *)hw[e].scale, w[e].scale, sb, cudaMemcpyHostToDevice);
	}
	return (struct kern_wmat *)md_dev_copy(b, hw, (size_t)E * sizeof *hw);
}

static enum status md_run_host(const struct kern_moe_decode_args *a, kern_moe_decode_fn fn)
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->w1 || !a->w3 || !a->w2 ||
	    !a->expert_offsets)
		return ST_INVALID;
	const int64_t T = a->n_tokens, K = a->top_k, E = a->n_experts, P = T * K;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->h || !a->y || !a->out || !a->row_src || !a->slot_row)
		return ST_INVALID;
	const int64_t D = a->w1[0].cols, I = a->w1[0].rows;
	struct kern_wmat *hw = (struct kern_wmat *)calloc((size_t)(3 * E), sizeof *hw);
	if (!hw)
		return ST_NOMEM;
	struct md_bufs b = {{0}, 0, cudaSuccess};
	struct kern_moe_decode_args da = *a;
	da.x = (const float *)md_dev_copy(&b, a->x, (size_t)(T * D) * sizeof(float));
	da.h = (float *)md_dev_copy(&b, a->h, (size_t)(P * I) * sizeof(float)); /* poison stays visible */
	da.y = (float *)md_dev_copy(&b, a->y, (size_t)(P * D) * sizeof(float));
	da.out = (float *)md_dev_copy(&b, a->out, (size_t)(T * D) * sizeof(float));
	da.expert_offsets = (const int32_t *)md_dev_copy(&b, a->expert_offsets, (size_t)(E + 1) * sizeof(int32_t));
	da.row_src = (const int32_t *)md_dev_copy(&b, a->row_src, (size_t)P * sizeof(int32_t));
	da.slot_row = (const int32_t *)md_dev_copy(&b, a->slot_row, (size_t)P * sizeof(int32_t));
	da.row_weight = a->row_weight ? (const float *)md_dev_copy(&b, a->row_weight, (size_t)P * sizeof(float)) : NULL;
	da.w1_dev = md_experts(&b, a->w1, E, hw);
	da.w3_dev = md_experts(&b, a->w3, E, hw + E);
	da.w2_dev = md_experts(&b, a->w2, E, hw + 2 * E);
	da.w1 = hw;
	da.w3 = hw + E;
	da.w2 = hw + 2 * E;
	da.stream = NULL;
	da.ctx = NULL;
	enum status st = ST_OK;
	if (b.ce == cudaSuccess) {
		st = fn(&da);
		if (st == ST_OK) {
			b.ce = cudaDeviceSynchronize();
			if (b.ce == cudaSuccess)
				b.ce = cudaMemcpy(a->h, da.h, (size_t)(P * I) * sizeof(float), cudaMemcpyDeviceToHost);
			if (b.ce == cudaSuccess)
				b.ce = cudaMemcpy(a->y, da.y, (size_t)(P * D) * sizeof(float), cudaMemcpyDeviceToHost);
			if (b.ce == cudaSuccess)
				b.ce = cudaMemcpy(a->out, da.out, (size_t)(T * D) * sizeof(float), cudaMemcpyDeviceToHost);
		}
	}
	const cudaError_t ce = b.ce;
	for (int i = 0; i < b.n; i++)
		cudaFree(b.p[i]);
	free(hw);
	if (st)
		return st;
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_moe_decode_cuda_host(const struct kern_moe_decode_args *a)
{
	return md_run_host(a, kern_moe_decode_cuda);
}

extern "C" enum status kern_moe_decode_cuda_mma_host(const struct kern_moe_decode_args *a)
{
	return md_run_host(a, kern_moe_decode_cuda_mma);
}
