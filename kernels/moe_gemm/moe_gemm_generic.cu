/*
 * kernels/moe_gemm/moe_gemm_generic.cu: the portable CUDA grouped expert
 * GEMM for FP4 experts (variant moe_gemm_cuda_generic), every cc >= 8.0.
 *
 * Varlen over experts without host involvement: the grid has
 * ceil(n_rows/16) + n_experts row-tile slots (an upper bound on
 * Σ_e ceil(rows_e/16)); each block finds its (expert, 16-row tile) by a scan
 * of the device offsets and exits if it has none. It is the FMA tile of
 * fma_tile.cuh (shared with linear_generic.cu): per 128-wide K tile it
 * gathers its rows through row_src (with the optional FP8 act_quant), decodes 64 weight rows of e2m1 with their MXFP4
 * (E8M0 per 32) or NVFP4 (e4m3 per 16 times the expert's global) scales into
 * shared memory, and accumulates with f32 FMA, 4 outputs per thread. FP8
 * experts (128x128 E8M0 or f32 block scales: the Base model and FP8
 * conversions) are decoded the same way.
 * W4A16-style: the floor on every GPU, including sm_90 which has no FP4 MMA.
 *
 * Also here (same generic image): the decode expert GEMV, variant
 * moe_gemm_cuda_gemv (moe_gemv.h): 128 blocks for one 4096 -> 2048 expert
 * instead of the GEMM's 32, activations staged and act-quantized once per
 * block (not once per K tile on the critical path), weight loads issued
 * before the staging; and two bandwidth probes used by the benchmark.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

extern "C" {
#include "dsv4_config.h"
#include "kernels/moe_gemm/moe_gemm.h"
#include "kernels/moe_gemm/moe_gemv.h"
}
#include "kernels/device/host_bufs.cuh"
#include "kernels/linear/fma_tile.cuh"
#include "kernels/moe_gemm/moe_tile.cuh"
#include "kernels/quant/quant_cuda.cuh"

__global__ void __launch_bounds__(FT_NT) moe_gemm_generic_kernel(
	int64_t n_experts, const int32_t *__restrict__ offsets, const int32_t *__restrict__ row_src,
	int64_t in, int64_t out, const void *__restrict__ x, int x_dt, int64_t ldx, void *__restrict__ y, int y_dt,
	int64_t ldy, const struct kern_wmat *__restrict__ w, int act_quant)
{
	__shared__ struct ft_smem s;
	__shared__ int sh_expert, sh_r0, sh_r1;
	const struct ft_lanes l = ft_lanes_of(threadIdx.x);
	if (threadIdx.x == 0) {
		/* Which expert and which 16-row tile of it this block owns. */
		sh_expert = moe_tile_of_slot(blockIdx.y, n_experts, offsets, FT_TM, &sh_r0, &sh_r1);
	}
	__syncthreads();
	const int e = sh_expert;
	if (e < 0)
		return;
	const int r0 = sh_r0, r1 = sh_r1;
	const struct kern_wmat wm = w[e];
	const bool nv = wm.fmt == KERN_WFMT_NVFP4;
	const bool fp8 = wm.fmt == KERN_WFMT_FP8_E8M0_B128 || wm.fmt == KERN_WFMT_FP8_F32_B128;
	const int wide = wm.fmt == KERN_WFMT_BF16 ? KERN_DT_BF16 : wm.fmt == KERN_WFMT_F32 ? KERN_DT_F32 : -1;
	const int64_t nbc = (in + FT_TK - 1) / FT_TK; /* FP8 scale blocks per row */
	const uint8_t *wd = (const uint8_t *)wm.data, *wsc = (const uint8_t *)wm.scale;
	const int64_t n0 = (int64_t)blockIdx.x * FT_TN, o = n0 + l.wr;
	const int r = r0 + l.xr;
	const int64_t src = r < r1 ? (row_src ? row_src[r] : r) : -1;
	float acc[4] = {0.f, 0.f, 0.f, 0.f};

	for (int64_t k0 = 0; k0 < in; k0 += FT_TK) {
		ft_stage_x(&s, &l, x, x_dt, ldx, src, k0, in, act_quant);
		/* FP8 with the tile's one 128x128 block scale (E8M0 decoded directly,
		 * which is exact), unquantized experts, or 16 bytes of e2m1 per
		 * thread: one MXFP4 block, two NVFP4 ones. */
		const int64_t kb = k0 + l.wseg;
		if (fp8) {
			float sc = 0.f;
			if (o < out) {
				const int64_t si = (o / 128) * nbc + k0 / FT_TK;
				sc = wm.fmt == KERN_WFMT_FP8_F32_B128 ? ((const float *)wm.scale)[si] : kq_e8m0_to_f32(wsc[si]);
			}
			ft_stage_w_fp8(&s, &l, wd, sc, o, out, k0, in);
		} else if (wide >= 0) {
			ft_stage_w_wide(&s, &l, wd, wide, o, out, k0, in);
		} else if (o < out && kb < in) {
			const uint8_t *p = wd + o * (in / 2) + kb / 2;
			float s0, s1;
			if (nv) {
				s0 = kq_e4m3_to_f32(wsc[o * (in / 16) + kb / 16]) * wm.global_scale;
				s1 = kq_e4m3_to_f32(wsc[o * (in / 16) + kb / 16 + 1]) * wm.global_scale;
			} else {
				s0 = s1 = kq_e8m0_to_f32(wsc[o * (in / 32) + kb / 32]);
			}
#pragma unroll
			for (int i = 0; i < 16; i++) {
				const uint32_t b = p[i];
				const float sb = i < 8 ? s0 : s1;
				s.w[l.wr][l.wseg + 2 * i] = kq_e2m1_to_f32(b & 0xFu) * sb;
				s.w[l.wr][l.wseg + 2 * i + 1] = kq_e2m1_to_f32(b >> 4) * sb;
			}
		} else {
#pragma unroll
			for (int i = 0; i < 32; i++)
				s.w[l.wr][l.wseg + i] = 0.f;
		}
		__syncthreads();
		ft_fma(&s, &l, acc);
		__syncthreads();
	}
	ft_store(&l, acc, y, y_dt, ldy, r0, r1, n0, out);
}

extern "C" enum status kern_moe_gemm_cuda_generic(const struct kern_moe_gemm_args *a)
{
	if (!a->w || !a->w_dev || a->n_experts <= 0)
		return ST_INVALID;
	const enum kern_wfmt f = a->w[0].fmt;
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	const bool fp4 = f == KERN_WFMT_MXFP4 || f == KERN_WFMT_NVFP4;
	if (!fp4 && f != KERN_WFMT_FP8_E8M0_B128 && f != KERN_WFMT_FP8_F32_B128 && f != KERN_WFMT_BF16 &&
	    f != KERN_WFMT_F32)
		return ST_INVALID;
	if (fp4 && in % 32)
		return ST_INVALID;
	dim3 grid;
	int64_t ldx, ldy;
	const enum status st = moe_tile_launch_shape(a, FT_TM, FT_TN, &grid, &ldx, &ldy);
	if (st || !grid.y)
		return st;
	moe_gemm_generic_kernel<<<grid, FT_NT, 0, (cudaStream_t)a->stream>>>(
		a->n_experts, a->expert_offsets, a->row_src, in, out, a->x, (int)a->x_dtype, ldx, a->y,
		(int)a->y_dtype, ldy, a->w_dev, a->act_quant_block != 0);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- decode GEMV (variant moe_gemm_cuda_gemv, moe_gemv.h) ---- */

#define GV_NT 256             /* 8 warps */
#define GV_ROWS_PER_WARP 2
#define GV_TN (8 * GV_ROWS_PER_WARP) /* outputs per block */

/* Padded shared-memory index of activation k, in elements: the lanes of a
 * warp (lane l reads the 32 consecutive k at l·32 with 16-byte loads) hit
 * distinct banks in every quarter-warp phase. f32 staging pads 4 floats per
 * 32 (lane stride 144 bytes), bf16 staging 8 halves per 32 (80 bytes). */
template <bool BF> static __host__ __device__ __forceinline__ int64_t gv_xi(int64_t k)
{
	return k + (k >> 5) * (BF ? 8 : 4);
}

/* Staging store of 4 activations at element offset i (bf16 staging only:
 * one instantiation keeps the fat binary small). */
static __device__ __forceinline__ void gv_put4(__nv_bfloat16 *xs, int64_t i, const float *v)
{
	/* exact: only used when every value is a bf16 (bf16 x, or FP8 act_quant values) */
	const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
	uint2 u;
	u.x = *(const uint32_t *)&a;
	u.y = *(const uint32_t *)&b;
	*(uint2 *)&xs[i] = u;
}

/* 16 staged activations from element offset i (16-byte aligned) as f32. */
static __device__ __forceinline__ void gv_get16(const __nv_bfloat16 *xs, int64_t i, float *t)
{
#pragma unroll
	for (int c = 0; c < 2; c++) {
		const uint4 q = *(const uint4 *)&xs[i + 8 * c];
		const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int h = 0; h < 4; h++) {
			t[8 * c + 2 * h] = __uint_as_float(u[h] << 16);
			t[8 * c + 2 * h + 1] = __uint_as_float(u[h] & 0xFFFF0000u);
		}
	}
}

/* 8 e2m1 codes (nibble i = element i) to f32 without scale: the magnitudes'
 * bf16 bit patterns {0, .5, 1, 1.5, 2, 3, 4, 6} looked up by PRMT (the
 * technique of moe_gemm_sm90.cu's s9_decode4), sign OR-ed in, widened to f32
 * by a shift. Exact. */
static __device__ __forceinline__ void gv_decode8(uint32_t n, float *f)
{
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const uint32_t m = n >> (16 * h);
		const uint32_t sel = m & 0x7777u;
		const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
		const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);
		const uint32_t a = __byte_perm(lo, hi, 0x5140u) | ((m << 12) & 0x8000u) | ((m << 24) & 0x80000000u);
		const uint32_t b = __byte_perm(lo, hi, 0x7362u) | ((m << 4) & 0x8000u) | ((m << 16) & 0x80000000u);
		f[4 * h + 0] = __uint_as_float(a << 16);
		f[4 * h + 1] = __uint_as_float(a & 0xFFFF0000u);
		f[4 * h + 2] = __uint_as_float(b << 16);
		f[4 * h + 3] = __uint_as_float(b & 0xFFFF0000u);
	}
}

/* RC = the most rows a block holds (accumulators); rc (1, 2, 4 or RC) = the
 * rows per chunk of this launch (the shared memory is sized for rc). One
 * instantiation per staging type keeps the fat binary small. */
template <int RC, bool BF>
__global__ void __launch_bounds__(GV_NT) moe_gemv_kernel(int rc, int64_t n_experts, const int32_t *__restrict__ offsets,
							  const int32_t *__restrict__ row_src, int64_t in, int64_t out,
							  const void *__restrict__ x, int x_dt, int64_t ldx,
							  void *__restrict__ y, int y_dt, int64_t ldy,
							  const struct kern_wmat *__restrict__ w, int act_quant)
{
	typedef typename std::conditional<BF, __nv_bfloat16, float>::type xt;
	extern __shared__ __align__(16) unsigned char gv_smem[];
	xt *gv_xs = (xt *)gv_smem; /* [RC][gv_xi<BF>(in)] */
	__shared__ int sh_expert, sh_r0, sh_r1;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	/* Which expert and which RC-row chunk of it this block owns: warp 0 scans
	 * the offsets 32 experts at a time (coalesced loads, shuffle prefix sum
	 * of the chunk counts), so 256 held experts cost 8 steps, not 256
	 * dependent loads. */
	if (warp == 0) {
		const int64_t slot = blockIdx.y;
		int64_t cum = 0;
		if (lane == 0)
			sh_expert = -1;
		__syncwarp();
		for (int64_t base = 0; base < n_experts; base += 32) {
			const int64_t ex = base + lane;
			int32_t b = 0, c = 0;
			int tiles = 0;
			if (ex < n_experts) {
				b = offsets[ex];
				c = offsets[ex + 1];
				tiles = (c - b + rc - 1) / rc;
			}
			int incl = tiles;
#pragma unroll
			for (int off = 1; off < 32; off <<= 1) {
				const int t = __shfl_up_sync(0xFFFFFFFFu, incl, off);
				if (lane >= off)
					incl += t;
			}
			const int64_t lo = cum + (incl - tiles), hi = cum + incl;
			const unsigned hit = __ballot_sync(0xFFFFFFFFu, ex < n_experts && slot >= lo && slot < hi);
			if (hit) {
				if (lane == __ffs(hit) - 1) {
					sh_expert = (int)ex;
					sh_r0 = b + (int)(slot - lo) * rc;
					sh_r1 = min(sh_r0 + rc, c);
				}
				break;
			}
			cum += __shfl_sync(0xFFFFFFFFu, incl, 31);
		}
	}
	__syncthreads();
	const int e = sh_expert;
	if (e < 0)
		return;
	const int r0 = sh_r0, nr = sh_r1 - sh_r0;
	const int64_t ld = gv_xi<BF>(in);

	const struct kern_wmat wm = w[e];
	const bool nv = wm.fmt == KERN_WFMT_NVFP4;
	const float gs = nv ? wm.global_scale : 1.0f;
	const uint8_t *wd = (const uint8_t *)wm.data, *wsc = (const uint8_t *)wm.scale;
	const int64_t rb = in / 2; /* bytes per weight row */
	const int64_t o0 = (int64_t)blockIdx.x * GV_TN + warp * GV_ROWS_PER_WARP;
	float acc[GV_ROWS_PER_WARP][RC];
#pragma unroll
	for (int j = 0; j < GV_ROWS_PER_WARP; j++)
#pragma unroll
		for (int r = 0; r < RC; r++)
			acc[j][r] = 0.f;

	/* Per step a lane owns 16 bytes (32 codes) at byte lane·16 + 512·it of each
	 * of its rows; 4 steps of loads are in flight before any is used (the
	 * first batch is issued before the activations are staged). */
	uint4 q[GV_ROWS_PER_WARP][4];
	uint32_t sc[GV_ROWS_PER_WARP][4];
#define GV_LOAD(b0_)                                                                                                  \
	_Pragma("unroll") for (int j = 0; j < GV_ROWS_PER_WARP; j++) _Pragma("unroll") for (int it = 0; it < 4; it++) \
	{                                                                                                             \
		const int64_t o_ = o0 + j, b_ = (b0_) + it * 512 + lane * 16;                                        \
		q[j][it] = make_uint4(0u, 0u, 0u, 0u);                                                               \
		sc[j][it] = 0u;                                                                                       \
		if (o_ < out && b_ < rb) {                                                                            \
			q[j][it] = __ldg((const uint4 *)(wd + o_ * rb + b_));                                         \
			sc[j][it] = nv ? (uint32_t)__ldg((const unsigned short *)(wsc + o_ * (in / 16) + b_ / 8))     \
				       : (uint32_t)__ldg(wsc + o_ * (in / 32) + b_ / 16);                            \
		}                                                                                                     \
	}
	GV_LOAD(0)

	/* Stage the block's rows: one warp per (row, 128-column block), 4 per lane. */
	const int64_t nb = (in + 127) / 128;
	for (int64_t p = warp; p < nr * nb; p += GV_NT / 32) {
		const int r = (int)(p / nb);
		const int64_t kb = (p % nb) * 128 + lane * 4;
		const int64_t src = row_src ? row_src[r0 + r] : r0 + r;
		float v[4], amax = 0.f;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			v[i] = kb + i < in ? kq_load(x, x_dt, src * ldx + kb + i) : 0.f;
			amax = fmaxf(amax, fabsf(v[i]));
		}
		if (act_quant) {
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
			const float s = kq_fp8_block_scale(amax), inv = 1.0f / s;
#pragma unroll
			for (int i = 0; i < 4; i++)
				v[i] = kq_fp8_qdq_pow2(v[i], s, inv);
		}
		if (kb < in) /* in % 32 == 0: all 4 in range */
			gv_put4(gv_xs, r * ld + gv_xi<BF>(kb), v);
	}
	__syncthreads();

	for (int64_t b0 = 0;;) {
#pragma unroll
		for (int it = 0; it < 4; it++) {
			const int64_t k = 2 * (b0 + it * 512 + lane * 16);
			if (k >= in)
				break;
			const int64_t xo = gv_xi<BF>(k);
#pragma unroll
			for (int j = 0; j < GV_ROWS_PER_WARP; j++) {
				if (o0 + j >= out)
					continue;
				const uint32_t wq[4] = {q[j][it].x, q[j][it].y, q[j][it].z, q[j][it].w};
				float s0, s1;
				if (nv) {
					s0 = kq_e4m3_to_f32(sc[j][it] & 0xFFu) * gs;
					s1 = kq_e4m3_to_f32(sc[j][it] >> 8) * gs;
				} else {
					s0 = s1 = kq_e8m0_to_f32(sc[j][it]);
				}
#pragma unroll
				for (int h = 0; h < 2; h++) { /* 16 codes: one NVFP4 block, half an MXFP4 one */
					float f[16];
					gv_decode8(wq[2 * h], f);
					gv_decode8(wq[2 * h + 1], f + 8);
					const float s = h ? s1 : s0;
#pragma unroll
					for (int r = 0; r < RC; r++) {
						if (r >= nr)
							break;
						float t[16];
						gv_get16(gv_xs, xo + r * ld + 16 * h, t);
						float part = 0.f;
#pragma unroll
						for (int c = 0; c < 16; c++)
							part = fmaf(t[c], f[c], part);
						acc[j][r] = fmaf(part, s, acc[j][r]);
					}
				}
			}
		}
		b0 += 4 * 512;
		if (b0 >= rb)
			break;
		GV_LOAD(b0)
	}
#undef GV_LOAD
#pragma unroll
	for (int j = 0; j < GV_ROWS_PER_WARP; j++)
#pragma unroll
		for (int r = 0; r < RC; r++) {
			if (r >= nr)
				break;
			float v = acc[j][r];
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
			const int64_t o = o0 + j;
			if (lane == r && o < out)
				kq_store(y, y_dt, (int64_t)(r0 + r) * ldy + o, v);
		}
}

/* Largest opt-in dynamic shared memory per block of the current device (cached). */
static int gv_smem_optin(void)
{
	static int cache[64];
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
		return 48 << 10;
	if (!cache[dev]) {
		int v = 0;
		if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || v <= 0)
			v = 48 << 10;
		cache[dev] = v;
	}
	return cache[dev];
}

template <int RC, bool BF>
static enum status gv_launch(const struct kern_moe_gemm_args *a, int rc, int64_t in, int64_t out, int64_t ldx,
			     int64_t ldy, size_t smem)
{
	static int attr_done[64]; /* per device: the kernel's shared-memory limit raised */
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess)
		return ST_CUDA;
	if (smem > (48u << 10) && (dev >= 64 || attr_done[dev] < (int)smem)) {
		if (cudaFuncSetAttribute(moe_gemv_kernel<RC, BF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
		    cudaSuccess) {
			cudaGetLastError();
			return ST_CUDA;
		}
		if (dev < 64)
			attr_done[dev] = (int)smem;
	}
	const int64_t slots = (a->n_rows + rc - 1) / rc + a->n_experts;
	if (slots > 65535)
		return ST_INVALID;
	dim3 grid((unsigned)((out + GV_TN - 1) / GV_TN), (unsigned)slots);
	moe_gemv_kernel<RC, BF><<<grid, GV_NT, smem, (cudaStream_t)a->stream>>>(
		rc, a->n_experts, a->expert_offsets, a->row_src, in, out, a->x, (int)a->x_dtype, ldx, a->y, (int)a->y_dtype,
		ldy, a->w_dev, a->act_quant_block != 0);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ST_UNSUPPORTED when the GEMV cannot take a: weights below the 16-byte
 * (data) / 2-byte (scale) alignment the loader gives, f32 x without
 * act_quant, or an `in` too wide for the device's shared memory (the guard
 * refuses the last two at load time). */
static enum status gv_run(const struct kern_moe_gemm_args *a)
{
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	for (int64_t e = 0; e < a->n_experts; e++)
		if ((uintptr_t)a->w[e].data % 16 || (uintptr_t)a->w[e].scale % 2)
			return ST_UNSUPPORTED;
	const int64_t R = a->n_rows;
	const int rc = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : 8;
	/* bf16 staging is exact for bf16 x and for FP8 act_quant values (e4m3 x 2^k),
	 * and takes half the shared memory of f32; f32 x without act_quant (not a
	 * model path) is refused, by the guard first. */
	if (a->x_dtype != KERN_DT_BF16 && a->act_quant_block == 0)
		return ST_UNSUPPORTED;
	const int64_t optin = gv_smem_optin() - 1024; /* room for the static shared words (kern_moe_gemv_min_smem) */
	const int64_t ld = gv_xi<true>(in);
	int use = rc;
	while (use > 1 && (int64_t)use * ld * 2 > optin)
		use /= 2;
	const size_t smem = (size_t)(use * ld * 2);
	if ((int64_t)smem > optin)
		return ST_UNSUPPORTED;
	return gv_launch<8, true>(a, use, in, out, ldx, ldy, smem);
}

static enum status gv_check(const struct kern_moe_gemm_args *a)
{
	if (!a->w || !a->w_dev || a->n_experts <= 0)
		return ST_INVALID;
	const enum kern_wfmt f = a->w[0].fmt;
	if ((f != KERN_WFMT_MXFP4 && f != KERN_WFMT_NVFP4) || a->w[0].cols % 32)
		return ST_INVALID;
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return ST_INVALID;
	return ST_OK;
}

/* The GEMV alone: which kernel runs is kern_select's choice (moe_gemv_supports
 * refuses what the GEMV cannot take), so nothing here re-dispatches. */
extern "C" enum status kern_moe_gemv_cuda(const struct kern_moe_gemm_args *a)
{
	enum status st = gv_check(a);
	if (st)
		return st;
	if (a->n_rows == 0)
		return ST_OK;
	return gv_run(a);
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

extern "C" enum status kern_moe_gemm_run_on_host_buffers(const struct kern_moe_gemm_args *a, kern_moe_gemm_fn fn)
{
	enum status st = kern_moe_gemm_args_check(a, NULL);
	if (st)
		return st;
	const int64_t E = a->n_experts, R = a->n_rows, in = a->w[0].cols, out = a->w[0].rows;
	if (R == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const size_t xb = (size_t)((a->n_x_rows - 1) * ldx + in) * kern_dtype_bytes(a->x_dtype);
	const size_t yb = (size_t)((R - 1) * ldy + out) * kern_dtype_bytes(a->y_dtype);
	const size_t wb = kern_wmat_data_bytes(&a->w[0]), sb = kern_wmat_scale_bytes(&a->w[0]);
	struct kern_wmat *hw = (struct kern_wmat *)calloc((size_t)E, sizeof *hw);
	if (!hw)
		return ST_NOMEM;
	struct kern_hbufs b = {};
	struct kern_moe_gemm_args da = *a;
	da.x = kern_hb_up(&b, a->x, xb, false);
	da.y = kern_hb_up(&b, a->y, yb, true); /* keeps unwritten sentinels visible */
	da.expert_offsets = (const int32_t *)kern_hb_up(&b, a->expert_offsets, (size_t)(E + 1) * sizeof(int32_t), false);
	da.row_src = (const int32_t *)kern_hb_up(&b, a->row_src, (size_t)R * sizeof(int32_t), false);
	/* Per expert: data, then scales, each 256-byte aligned (the sm_90a kernel's
	 * 16-byte vector loads want it; the others need 16). */
	const size_t wb_al = (wb + 255) & ~(size_t)255, stride = wb_al + ((sb + 255) & ~(size_t)255);
	uint8_t *dw = (uint8_t *)kern_hb_alloc(&b, (size_t)E * stride);
	for (int64_t e = 0; e < E && dw; e++) {
		hw[e] = a->w[e];
		hw[e].owned = NULL;
		hw[e].data = dw + e * stride;
		hw[e].scale = dw + e * stride + wb_al;
		kern_hb_copy_in(&b, (void *)hw[e].data, a->w[e].data, wb);
		kern_hb_copy_in(&b, (void *)hw[e].scale, a->w[e].scale, sb);
	}
	da.w = hw;
	da.w_dev = (const struct kern_wmat *)kern_hb_up(&b, hw, (size_t)E * sizeof *hw, false);
	da.stream = 0;
	st = kern_hb_finish(&b, b.ce == cudaSuccess ? fn(&da) : ST_CUDA);
	free(hw);
	return st;
}

extern "C" enum status kern_moe_gemm_cuda_generic_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemm_cuda_generic);
}

extern "C" enum status kern_moe_gemv_cuda_host(const struct kern_moe_gemm_args *a)
{
	return kern_moe_gemm_run_on_host_buffers(a, kern_moe_gemv_cuda);
}

/* ---- bandwidth probes for tests/bench/bench_kernels.c (moe_gemv.h) ---- */

__global__ void gv_copy_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src, size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __ldg(src + i);
}

__global__ void gv_read_kernel(const uint4 *__restrict__ src, size_t n, uint32_t *__restrict__ sink)
{
	uint32_t acc = 0;
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i + 3 * stride < n; i += 4 * stride) {
		const uint4 a = __ldg(src + i), b = __ldg(src + i + stride), c = __ldg(src + i + 2 * stride),
			    d = __ldg(src + i + 3 * stride);
		acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
	}
	for (; i < n; i += stride) {
		const uint4 a = __ldg(src + i);
		acc ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	if (acc == 0x9E3779B9u) /* practically never: keeps the loads alive */
		sink[blockIdx.x] = acc;
}

static int gv_probe_blocks(void)
{
	int dev = 0, sms = 132;
	cudaGetDevice(&dev);
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
	return sms * 8;
}

extern "C" enum status kern_moe_gemv_bench_copy(void *dst, const void *src, size_t bytes, void *stream)
{
	if ((uintptr_t)dst % 16 || (uintptr_t)src % 16 || bytes % 16)
		return ST_INVALID;
	gv_copy_kernel<<<gv_probe_blocks(), 256, 0, (cudaStream_t)stream>>>((uint4 *)dst, (const uint4 *)src, bytes / 16);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

extern "C" enum status kern_moe_gemv_bench_read(const void *src, size_t bytes, void *sink, void *stream)
{
	if ((uintptr_t)src % 16 || bytes % 16)
		return ST_INVALID;
	gv_read_kernel<<<gv_probe_blocks(), 256, 0, (cudaStream_t)stream>>>((const uint4 *)src, bytes / 16,
									    (uint32_t *)sink);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}
