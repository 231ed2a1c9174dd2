/*
 * kernels/moe_gemm/moe_decode_fma.cu: the kernels of variant moe_decode_cuda
 * of op moe_decode (moe_decode.h; host side in moe_decode.cu, the steps both
 * variants share in moe_decode.cuh), plain CUDA C for every cc >= 8.0 (built
 * into every image, so sm_120 / sm_121 run the code measured on sm_90).
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

extern "C" {
#include "kernels/quant/wmat.h"
}
#include "kernels/moe_gemm/moe_decode.cuh"
#include "kernels/moe_gemm/moe_e2m1.h"
#include "kernels/quant/quant_cuda.cuh"

#define MD_NT 256 /* threads per block: 8 warps */
#define MD_WARPS (MD_NT / 32)
#define MD_NR 4   /* weight rows per warp */
#define MD_ST 2   /* 512-byte steps per load batch */
#define MD_OUT0 (MD_WARPS * MD_NR / 2) /* pass 0: outputs per item (w1 and w3 rows per output) */
#define MD_OUT1 (MD_WARPS * MD_NR)     /* pass 1: outputs per item = the combine's column chunk */

static_assert(MD_OUT1 == MD_CHUNK, "moe_decode.c sizes the counters for 32-column chunks");

static __host__ __device__ __forceinline__ size_t md_stage_bytes(int rc, int64_t in)
{
	return ((size_t)rc * (size_t)md_xi(in) * 2 + 15) & ~(size_t)15;
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

	if (warp == 0)
		md_scan_experts<RC>(p, lane, s_pref, s_off);
	__syncthreads();

	const int per = MODE == 0 ? MD_OUT0 : MD_OUT1;
	const int64_t n_chunks = (out + per - 1) / per;
	const int64_t n_items = (int64_t)s_pref[E] * n_chunks;

	for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
		const md_item it = md_item_at<RC>(s_pref, s_off, E, n_chunks, item);
		const int64_t xc = it.xc;
		const int e = it.e, r0 = it.r0, nr = it.nr;

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
		md_stage_rows<MODE, MD_WARPS>(p, xs, ld, r0, nr, warp, lane);
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
					const float g = md_warp_sum(acc[2 * jj][r]), u = md_warp_sum(acc[2 * jj + 1][r]);
					if (lane == r && o < out)
						md_swiglu_store(p, r0 + r, o, g, u);
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
						md_store_y(p, r0 + r, o, v);
				}
			}
			/* Combine: the block completing a token's last row for this column
			 * chunk sums the token's rows in slot order. */
			md_combine<MD_OUT1, MD_NT>(p, s_flag, tid, r0, nr, n_chunks, xc);
		}
	}

	md_finish<MODE, MD_NT>(p, tid);
}

/* ---- the family as moe_decode.cu drives it ---- */

const struct md_pass_kind kern__moe_decode_fma = {
	{{md_kernel<0, 1>, md_kernel<0, 2>, md_kernel<0, 4>, md_kernel<0, 8>},
	 {md_kernel<1, 1>, md_kernel<1, 2>, md_kernel<1, 4>, md_kernel<1, 8>}},
	MD_NT,
	MD_OUT0,
	MD_OUT1,
	md_stage_bytes,
};
