/*
 * kernels/moe_gemm/moe_gemm_sm90.cu: the grouped FP4 expert GEMM on Hopper
 * tensor cores (variant moe_gemm_sm90_fp4), compiled for sm_90a only.
 *
 * Hopper has no FP4 MMA (kernels.md §3.1), so this is W4A16 in the Marlin
 * spirit: e2m1 codes are unpacked in registers straight into bf16 MMA
 * fragments (a PRMT table lookup, s9_decode4) and multiplied with bf16
 * activations by mma.sync m16n8k16 (f32 accumulation). Numerics are exact up to the f32 accumulation order:
 *   - e2m1 × block scale is exact in bf16 (≤ 5 significant bits: MXFP4's
 *     E8M0 is a power of two; NVFP4's e4m3 has 4), and NVFP4's per-expert
 *     f32 global scale multiplies the accumulator once at the end;
 *   - activations after the FP8 act_quant (e4m3 × power of two) and bf16
 *     activations are exact in bf16; f32 activations without act_quant are
 *     split x = hi + lo into two bf16 halves and take two MMAs (residual
 *     below 2^-16 relative).
 *
 * Tiling: one block of 4 warps per (expert, 16-row tile, 64 outputs). The
 * block scans the device offsets for its expert (as the generic kernel),
 * stages 16 rows × 256 K of activations in shared memory as bf16 (gathered
 * through row_src, act_quant per 128 columns by a 4-lane shuffle), and each
 * warp owns 16 outputs (two n8 tiles). Per 64-wide K chunk a lane loads 8
 * bytes (16 codes) of one weight row with one 64-bit load; the K order inside
 * the chunk is permuted so that those 16 codes are exactly the lane's B
 * fragments for the chunk's four k16 steps (the A fragments read the same
 * permutation from shared memory; a dot product does not care about K order).
 * No shared memory for weights, no ldmatrix, no cp.async: simple first, tuned
 * later (the benchmark says how far from the roofline it is).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "kernels/moe_gemm/moe_gemm_sm90.h"
}
#include "kernels/moe_gemm/moe_tile.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define S9_TM 16  /* rows per block */
#define S9_TN 64  /* outputs per block: 4 warps × 2 n8 tiles */
#define S9_TK 256 /* K per staged activation tile */
#define S9_NT 128
#define S9_XLD (S9_TK + 8) /* bf16 row stride of the staged tile (breaks bank alignment) */

/* Four e2m1 codes (the low 16 bits of n: element 0 in bits 0-3, ...) to two
 * bf16x2 words {e0, e1} and {e2, e3}, times the block scale s2 = (s, s).
 * The magnitude is a table lookup done by PRMT: the 8 magnitudes' bf16 bit
 * patterns {0, .5, 1, 1.5, 2, 3, 4, 6} = 0x0000 0x3F00 0x3F80 0x3FC0 0x4000
 * 0x4040 0x4080 0x40C0 split into a high-byte table and a low-byte table,
 * each 8 bytes in two registers; one PRMT per table looks up 4 codes (3-bit
 * selectors: the sign bit is masked off, bit 3 of a PRMT selector would
 * sign-replicate), two more interleave low and high bytes, and the code's
 * sign bit is OR-ed into bit 15 of each half. About 2 instructions per
 * element, exact, no subnormal intermediates. The bf16 multiply by the
 * scale is exact too (≤ 5 significant bits, see the file comment). */
static __device__ __forceinline__ void s9_decode4(uint32_t n, __nv_bfloat162 s2, uint32_t *w01, uint32_t *w23)
{
	const uint32_t sel = n & 0x7777u;
	const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
	const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);
	uint32_t a = __byte_perm(lo, hi, 0x5140u) | ((n << 12) & 0x8000u) | ((n << 24) & 0x80000000u);
	uint32_t b = __byte_perm(lo, hi, 0x7362u) | ((n << 4) & 0x8000u) | ((n << 16) & 0x80000000u);
	__nv_bfloat162 va = __hmul2(*(__nv_bfloat162 *)&a, s2), vb = __hmul2(*(__nv_bfloat162 *)&b, s2);
	*w01 = *(uint32_t *)&va;
	*w23 = *(uint32_t *)&vb;
}

static __device__ __forceinline__ void s9_mma(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
					      uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
		     "{%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One lane's weights of the 256-K tile at k0: for chunk c and n-tile j, the
 * 16 codes of row n_warp + 8j + g at K = k0 + 64c + 16·tig (one 8-byte
 * load) and the raw byte of their block scale; zeros outside the matrix. */
static __device__ __forceinline__ void s9_load_w(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ wsc,
						 bool nv, int64_t in, int64_t out, int64_t n_warp, int g, int tig,
						 int64_t k0, uint2 (&wq)[4][2], uint32_t (&sb)[4][2])
{
#pragma unroll
	for (int c = 0; c < 4; c++)
#pragma unroll
		for (int j = 0; j < 2; j++) {
			const int64_t o = n_warp + j * 8 + g, kk = k0 + c * 64 + tig * 16;
			wq[c][j] = make_uint2(0u, 0u);
			sb[c][j] = 0u; /* a zero scale code (e4m3 +0; e8m0 2^-127) times zero codes is 0 */
			if (o < out && kk < in) {
				wq[c][j] = *(const uint2 *)(wd + o * (in / 2) + kk / 2);
				sb[c][j] = nv ? wsc[o * (in / 16) + kk / 16] : wsc[o * (in / 32) + kk / 32];
			}
		}
}

template <bool SPLIT>
__global__ void __launch_bounds__(S9_NT) moe_gemm_sm90_kernel(
	int64_t n_experts, const int32_t *__restrict__ offsets, const int32_t *__restrict__ row_src, int64_t in,
	int64_t out, const void *__restrict__ x, int x_dt, int64_t ldx, void *__restrict__ y, int y_dt, int64_t ldy,
	const struct kern_wmat *__restrict__ w, int act_quant, int xvec)
{
	__shared__ __align__(16) __nv_bfloat16 xs[S9_TM][S9_XLD];
	__shared__ __align__(16) __nv_bfloat16 xl[SPLIT ? S9_TM : 1][SPLIT ? S9_XLD : 8];
	__shared__ int sh_expert, sh_r0, sh_r1;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	if (tid == 0) {
		sh_expert = moe_tile_of_slot(blockIdx.y, n_experts, offsets, S9_TM, &sh_r0, &sh_r1);
	}
	__syncthreads();
	const int e = sh_expert;
	if (e < 0)
		return;
	const int r0 = sh_r0, r1 = sh_r1;
	const struct kern_wmat wm = w[e];
	const bool nv = wm.fmt == KERN_WFMT_NVFP4;
	const uint8_t *wd = (const uint8_t *)wm.data, *wsc = (const uint8_t *)wm.scale;
	const int g = lane >> 2, tig = lane & 3;
	const int64_t n_warp = (int64_t)blockIdx.x * S9_TN + warp * 16;
	/* Activation staging layout: 8 threads per row, 32 consecutive columns each. */
	const int xr = tid >> 3, xseg = (tid & 7) * 32;
	const int xrow = r0 + xr;
	const int64_t src = xrow < r1 ? (row_src ? row_src[xrow] : xrow) : -1;
	float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};

	/* Weights are loaded one 256-K tile ahead (raw codes and scale bytes in
	 * registers), so two tiles of loads are in flight while a tile is
	 * staged and multiplied: 4 chunks × 2 n-tiles × 16 codes per lane. */
	uint2 wq[4][2], wn[4][2] = {};
	uint32_t sb[4][2], sn[4][2] = {};
	s9_load_w(wd, wsc, nv, in, out, n_warp, g, tig, 0, wq, sb);
	for (int64_t k0 = 0; k0 < in; k0 += S9_TK) {
		if (k0 + S9_TK < in)
			s9_load_w(wd, wsc, nv, in, out, n_warp, g, tig, k0 + S9_TK, wn, sn);

		__syncthreads(); /* the previous tile's readers are done */
		{
			float v[32];
			float amax = 0.f;
			if (xvec && src >= 0 && k0 + xseg < in) {
				/* bf16 rows, 16-byte aligned: four 16-byte loads (in % 32 keeps all 32 in range). */
				const uint4 *p = (const uint4 *)((const uint16_t *)x + src * ldx + k0 + xseg);
#pragma unroll
				for (int q = 0; q < 4; q++) {
					const uint4 u = p[q];
					const uint32_t wd4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
					for (int h = 0; h < 4; h++) {
						v[8 * q + 2 * h] = __uint_as_float(wd4[h] << 16);
						v[8 * q + 2 * h + 1] = __uint_as_float(wd4[h] & 0xFFFF0000u);
					}
				}
			} else {
#pragma unroll
				for (int i = 0; i < 32; i++) {
					const int64_t k = k0 + xseg + i;
					v[i] = (src >= 0 && k < in) ? kq_load(x, x_dt, src * ldx + k) : 0.f;
				}
			}
#pragma unroll
			for (int i = 0; i < 32; i++)
				amax = fmaxf(amax, fabsf(v[i]));
			if (act_quant) {
				/* 4 lanes (tid & 3 group within the row's 8) cover one 128-column block. */
				amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
				amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
				const float s = kq_fp8_block_scale(amax);
#pragma unroll
				for (int i = 0; i < 32; i++)
					v[i] = kq_fp8_qdq(v[i], s);
			}
#pragma unroll
			for (int i = 0; i < 32; i += 2) {
				const __nv_bfloat162 h = __floats2bfloat162_rn(v[i], v[i + 1]);
				*(__nv_bfloat162 *)&xs[xr][xseg + i] = h;
				if (SPLIT)
					*(__nv_bfloat162 *)&xl[xr][xseg + i] = __floats2bfloat162_rn(
						v[i] - __bfloat162float(h.x), v[i + 1] - __bfloat162float(h.y));
			}
		}
		__syncthreads();

#pragma unroll
		for (int c = 0; c < 4; c++) {
			if (k0 + c * 64 >= in)
				break;
			/* The lane's 16 activations of rows g and g+8 for this chunk. */
			const int base = c * 64 + tig * 16;
			uint32_t ah[2][8], al[2][8];
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const uint4 *p = (const uint4 *)&xs[g + 8 * h][base];
				const uint4 q0 = p[0], q1 = p[1];
				ah[h][0] = q0.x, ah[h][1] = q0.y, ah[h][2] = q0.z, ah[h][3] = q0.w;
				ah[h][4] = q1.x, ah[h][5] = q1.y, ah[h][6] = q1.z, ah[h][7] = q1.w;
				if (SPLIT) {
					const uint4 *pl = (const uint4 *)&xl[g + 8 * h][base];
					const uint4 l0 = pl[0], l1 = pl[1];
					al[h][0] = l0.x, al[h][1] = l0.y, al[h][2] = l0.z, al[h][3] = l0.w;
					al[h][4] = l1.x, al[h][5] = l1.y, al[h][6] = l1.z, al[h][7] = l1.w;
				}
			}
#pragma unroll
			for (int j = 0; j < 2; j++) {
				const uint32_t lo = wq[c][j].x, hi = wq[c][j].y;
				const __nv_bfloat162 s2 =
					__float2bfloat162_rn(nv ? kq_e4m3_to_f32(sb[c][j]) : kq_e8m0_to_f32(sb[c][j]));
				uint32_t b[8]; /* b[i] = codes 2i, 2i+1 (byte i) as bf16x2 */
				s9_decode4(lo, s2, &b[0], &b[1]);
				s9_decode4(lo >> 16, s2, &b[2], &b[3]);
				s9_decode4(hi, s2, &b[4], &b[5]);
				s9_decode4(hi >> 16, s2, &b[6], &b[7]);
				/* Step s: fragment k 0..7 <- codes 4s, 4s+1; k 8..15 <- 4s+2, 4s+3. */
#pragma unroll
				for (int st = 0; st < 4; st++) {
					s9_mma(acc[j], ah[0][2 * st], ah[1][2 * st], ah[0][2 * st + 1], ah[1][2 * st + 1],
					       b[2 * st], b[2 * st + 1]);
					if (SPLIT)
						s9_mma(acc[j], al[0][2 * st], al[1][2 * st], al[0][2 * st + 1],
						       al[1][2 * st + 1], b[2 * st], b[2 * st + 1]);
				}
			}
		}
#pragma unroll
		for (int c = 0; c < 4; c++)
#pragma unroll
			for (int j = 0; j < 2; j++) {
				wq[c][j] = wn[c][j];
				sb[c][j] = sn[c][j];
			}
	}

	const float gs = nv ? wm.global_scale : 1.0f;
#pragma unroll
	for (int j = 0; j < 2; j++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int rr = r0 + g + (i >= 2 ? 8 : 0);
			const int64_t o = n_warp + j * 8 + tig * 2 + (i & 1);
			if (rr < r1 && o < out)
				kq_store(y, y_dt, (int64_t)rr * ldy + o, acc[j][i] * gs);
		}
}

extern "C" enum status kern_moe_gemm_sm90_fp4(const struct kern_moe_gemm_args *a)
{
	if (!a->w || !a->w_dev || a->n_experts <= 0)
		return ST_INVALID;
	const enum kern_wfmt f = a->w[0].fmt;
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	if ((f != KERN_WFMT_MXFP4 && f != KERN_WFMT_NVFP4) || in % 32)
		return ST_INVALID;
	dim3 grid;
	int64_t ldx, ldy;
	const enum status st = moe_tile_launch_shape(a, S9_TM, S9_TN, &grid, &ldx, &ldy);
	if (st || !grid.y)
		return st;
	cudaStream_t s = (cudaStream_t)a->stream;
	const int aq = a->act_quant_block != 0;
	const int xvec = a->x_dtype == KERN_DT_BF16 && (uintptr_t)a->x % 16 == 0 && ldx % 8 == 0;
	if (a->x_dtype == KERN_DT_F32 && !aq)
		moe_gemm_sm90_kernel<true><<<grid, S9_NT, 0, s>>>(a->n_experts, a->expert_offsets, a->row_src, in, out,
								  a->x, (int)a->x_dtype, ldx, a->y, (int)a->y_dtype,
								  ldy, a->w_dev, aq, xvec);
	else
		moe_gemm_sm90_kernel<false><<<grid, S9_NT, 0, s>>>(a->n_experts, a->expert_offsets, a->row_src, in,
								   out, a->x, (int)a->x_dtype, ldx, a->y,
								   (int)a->y_dtype, ldy, a->w_dev, aq, xvec);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

extern "C" enum status kern_moe_gemm_sm90_fp4_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_sm90_fp4);
}
