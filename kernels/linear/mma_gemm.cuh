/*
 * kernels/linear/mma_gemm.cuh: the portable tensor-core block-scaled GEMM
 * shared by linear_mma.cu (op linear) and moe_gemm_mma.cu (op moe_gemm).
 * Header-only; each .cu instantiates the templates it launches.
 *
 * y[r, o] = Σ_kb sx[src(r), kb] · Σ_{k in kb} q[src(r), k] · w[o, k]
 * where q, sx are the reference's FP8 act_quant of x (e4m3 codes, one
 * power-of-two f32 scale per row and 128 columns) and w is the decoded weight:
 *   MG_W_FP8    e4m3 [out, in] with f32 128x128 block scales (prepare widens E8M0);
 *   MG_W_MXFP4  e2m1 with one E8M0 scale per 32 K;
 *   MG_W_NVFP4  e2m1 with one e4m3 scale per 16 K and an f32 global scale.
 *
 * Two passes on the caller's stream:
 *   1. mg_quant_kernel: x -> codes (one byte per element, e4m3) or their bf16
 *      values (exact), plus the f32 scales, into scratch. Each 128-column
 *      block of a row is stored in "fragment order" (mg_amap) so that the GEMM
 *      loads its A fragments with plain ldmatrix whatever the weight format:
 *      a dot product does not care about the order of K, only A and B must
 *      agree, and B's order is fixed by how its bytes sit in memory.
 *   2. mg_gemm_kernel: one block of 8 warps per (row tile of 64, 128 outputs);
 *      per 128-K block, a STAGES-deep cp.async pipeline of the A tile (codes,
 *      row-gathered through row_src), its 64 scales, the weight tile and its
 *      scales; warps own 32 x 32 of the tile. MMA modes:
 *        MG_MMA_FP8   mma.sync m16n8k32 e4m3 x e4m3 -> f32 (cc >= 8.9; FP4 codes
 *                     become e4m3 bytes in registers by a PRMT table lookup);
 *        MG_MMA_BF16  mma.sync m16n8k16 bf16 (cc >= 8.0; e4m3 and e2m1 x scale
 *                     are exact in bf16).
 *      Scales, in f32 as DeepGEMM does: a K block (FP8 weights) or one k32
 *      step (MXFP4 in FP8 mode; NVFP4 takes two MMAs per k32 step, one per
 *      16-K group, the other half of B zeroed) is accumulated by the MMA
 *      from zero, multiplied by its weight scale and added; the activation
 *      scale multiplies each K block's sum. In BF16 mode FP4 block scales are
 *      folded into the bf16 weights (exact). NVFP4's global scale multiplies
 *      the result once.
 * Every product is exact (e4m3 x e4m3 and e4m3 x e2m1 in the tensor core's
 * f32 accumulation; scales are powers of two or short mantissas), so results
 * differ from the CPU reference only in f32 summation order.
 *
 * Shape limits (the variants' guards): in % 128 == 0 (no K tail: every
 * weight row and scale row is 16-byte aligned and whole K blocks are read),
 * any out (rows past it are zero-filled and not stored), any row count.
 */
#ifndef DSV4_KERNELS_MMA_GEMM_CUH
#define DSV4_KERNELS_MMA_GEMM_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/quant/wmat.h"
}
#include "kernels/moe_gemm/moe_tile.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define MG_BM 64  /* rows per block */
#define MG_BN 128 /* outputs per block */
#define MG_BK 128 /* K per pipeline stage = one activation scale block */
#define MG_NT 256 /* 8 warps: 2 (rows) x 4 (outputs), 32 x 32 each */

enum { MG_W_FP8 = 0, MG_W_MXFP4 = 1, MG_W_NVFP4 = 2 };
enum { MG_MMA_FP8 = 0, MG_MMA_BF16 = 1 };

/* Stored position p (0..127) of a 128-K block of A -> the K offset it holds.
 * FP8 mode (k32 steps s = p / 32, fragment index f = p % 32: a0/b0 hold f =
 * 4·tig + j, a2/b1 hold 16 + 4·tig + j):
 *   FP8 weights: ldmatrix of two 16-byte K chunks gives B in natural order.
 *   FP4 weights: one 16-byte chunk is a k32 step; lane tig's 4 bytes are K
 *   8·tig .. 8·tig + 7, so b0 holds 8·tig + j and b1 8·tig + 4 + j.
 * BF16 mode (k16 steps s = p / 16, f = p % 16: b0 holds f = 2·tig + j, b1 8 +
 * 2·tig + j):
 *   FP8 weights: lane tig's 4 bytes of chunk s are K 4·tig .. 4·tig + 3 (b0: the
 *   first two, b1: the last two).
 *   FP4 weights: chunk c = s / 2 holds K 32c .. 32c + 31; lane tig has 8·tig ..
 *   8·tig + 7, the half h = s % 2 of which feeds this step. */
static __host__ __device__ __forceinline__ int mg_amap(int wf, int mode, int p)
{
	if (mode == MG_MMA_FP8) {
		if (wf == MG_W_FP8)
			return p;
		const int s = p >> 5, f = p & 31, hi = f >> 4, q = f & 15;
		return 32 * s + 8 * (q >> 2) + 4 * hi + (q & 3);
	}
	const int s = p >> 4, f = p & 15, hi = f >> 3, q = f & 7;
	if (wf == MG_W_FP8)
		return 16 * s + 4 * (q >> 1) + 2 * hi + (q & 1);
	return 32 * (s >> 1) + 8 * (q >> 1) + 4 * (s & 1) + 2 * hi + (q & 1);
}

/* ---- pass 1: activation quantization into fragment order ---- */

/* One warp per (row, 128-column block); 4 warps per block. x is f32 (x_dt 0)
 * or bf16 (1) with row stride ldx (vec: 16-byte aligned x and ldx % 4 == 0,
 * so each lane loads its 4 elements at once); xq has row stride `in` elements (bytes in
 * FP8 mode, bf16 in BF16 mode); xs is [rows, in / 128]. */
template <int WF, int MODE>
__global__ void __launch_bounds__(128) mg_quant_kernel(int64_t rows, int64_t in, const void *__restrict__ x, int x_dt,
						       int64_t ldx, int vec, void *__restrict__ xq, float *__restrict__ xs)
{
	__shared__ float v[4][MG_BK];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int64_t nkb = in / MG_BK, item = (int64_t)blockIdx.x * 4 + warp;
	if (item >= rows * nkb)
		return; /* the whole warp: only __syncwarp below */
	const int64_t r = item / nkb, kb = item % nkb;
	const int64_t base = r * ldx + kb * MG_BK + lane * 4;
	float a[4];
	if (!vec) {
#pragma unroll
		for (int j = 0; j < 4; j++)
			a[j] = kq_load(x, x_dt, base + j);
	} else if (x_dt) {
		const uint2 u = *(const uint2 *)((const uint16_t *)x + base); /* vec: x 16-byte aligned, ldx % 4 == 0 */
		a[0] = __uint_as_float(u.x << 16);
		a[1] = __uint_as_float(u.x & 0xFFFF0000u);
		a[2] = __uint_as_float(u.y << 16);
		a[3] = __uint_as_float(u.y & 0xFFFF0000u);
	} else {
		const float4 f = *(const float4 *)((const float *)x + base);
		a[0] = f.x, a[1] = f.y, a[2] = f.z, a[3] = f.w;
	}
	float amax = fmaxf(fmaxf(fabsf(a[0]), fabsf(a[1])), fmaxf(fabsf(a[2]), fabsf(a[3])));
#pragma unroll
	for (int o = 16; o; o >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
	const float s = kq_fp8_block_scale(amax);
#pragma unroll
	for (int j = 0; j < 4; j++)
		v[warp][lane * 4 + j] = fminf(fmaxf(a[j] / s, -448.0f), 448.0f);
	__syncwarp();
	if (lane == 0)
		xs[r * nkb + kb] = s;
	uint32_t c[4];
#pragma unroll
	for (int j = 0; j < 4; j++)
		c[j] = kq_f32_to_e4m3(v[warp][mg_amap(WF, MODE, lane * 4 + j)]);
	const int64_t o = r * in + kb * MG_BK + lane * 4;
	if (MODE == MG_MMA_FP8) {
		((uint32_t *)xq)[o / 4] = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
	} else {
		uint32_t h[4];
#pragma unroll
		for (int j = 0; j < 4; j++) /* e4m3 values are exact in bf16: the f32 bits' top half */
			h[j] = __float_as_uint(kq_e4m3_to_f32(c[j])) >> 16;
		((uint2 *)xq)[o / 4] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
	}
}

/* ---- pass 2: the GEMM ---- */

struct mg_params {
	int64_t n_experts;             /* 1 for a linear */
	const int32_t *offsets;        /* device [n_experts + 1]; NULL: one expert owning rows [0, n_rows) */
	int64_t n_rows;                /* rows when offsets is NULL */
	const int32_t *row_src;        /* optional: the x (and xq) row of each row */
	int64_t in, out;
	const void *xq;                /* pass 1's output */
	const float *xs;
	const struct kern_wmat *w_dev; /* device array of n_experts matrices, or NULL: w0 */
	struct kern_wmat w0;           /* the linear's weight (device pointers) */
	void *y;
	int y_dt;
	int64_t ldy;
};

template <int WF, int MODE>
struct mg_cfg {
	static constexpr int A_EB = MODE == MG_MMA_FP8 ? 1 : 2;        /* bytes per stored A element */
	static constexpr int A_STRIDE = MG_BK * A_EB + 16;             /* padded row: ldmatrix conflict-free */
	static constexpr int B_ROWB = WF == MG_W_FP8 ? MG_BK : MG_BK / 2; /* weight bytes per row per K block */
	static constexpr int B_STRIDE = B_ROWB + 16;
	static constexpr int WS_BYTES = WF == MG_W_FP8 ? 16 : WF == MG_W_MXFP4 ? MG_BN * 4 : MG_BN * 8;
	static constexpr int A_OFF = 0;
	static constexpr int B_OFF = A_OFF + MG_BM * A_STRIDE;
	static constexpr int SX_OFF = B_OFF + MG_BN * B_STRIDE;
	static constexpr int WS_OFF = SX_OFF + MG_BM * 4;
	static constexpr int STAGE = WS_OFF + WS_BYTES;
	/* Three stages fit 99 KiB (sm_86, sm_120) except bf16 A with FP8 weights. */
	static constexpr int STAGES = (3 * STAGE <= 99 * 1024) ? 3 : 2;
	static constexpr int SMEM = STAGES * STAGE;
};

static __device__ __forceinline__ uint32_t mg_smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* cp.async of 16/8/4 bytes; valid == false zero-fills the destination and
 * reads nothing (src must still be a mapped address). */
static __device__ __forceinline__ void mg_cp16(void *dst, const void *src, bool valid)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mg_smem_u32(dst)), "l"(src),
		     "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void mg_cp8(void *dst, const void *src, bool valid)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(mg_smem_u32(dst)), "l"(src),
		     "r"(valid ? 8 : 0));
}
static __device__ __forceinline__ void mg_cp4(void *dst, const void *src, bool valid)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mg_smem_u32(dst)), "l"(src),
		     "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void mg_commit()
{
	asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
static __device__ __forceinline__ void mg_wait()
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void mg_ldsm4(uint32_t (&r)[4], const void *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(mg_smem_u32(p)));
}

static __device__ __forceinline__ void mg_mma_fp8(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
	/* Never launched below cc 8.9 (the variants' guards and mg_fp8_compiled). */
	(void)c, (void)a, (void)b0, (void)b1;
	__trap();
#endif
}

static __device__ __forceinline__ void mg_mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Eight e2m1 codes (element i in bits 4i..4i+3) -> e4m3 bytes: b0 = elements
 * 0..3, b1 = 4..7. Magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} are the e4m3 codes
 * 00 30 38 3C 40 44 48 4C, looked up 4 at a time by PRMT (3-bit selectors);
 * the sign bit moves from bit 3 of each nibble to bit 7 of each byte. */
static __device__ __forceinline__ void mg_fp4x8_to_e4m3(uint32_t q, uint32_t &b0, uint32_t &b1)
{
	const uint32_t lo = 0x3C383000u, hi = 0x4C484440u;
	const uint32_t q1 = q >> 16;
	b0 = __byte_perm(lo, hi, q & 0x7777u) | ((q << 4) & 0x80u) | ((q << 8) & 0x8000u) | ((q << 12) & 0x800000u) |
	     ((q << 16) & 0x80000000u);
	b1 = __byte_perm(lo, hi, q1 & 0x7777u) | ((q1 << 4) & 0x80u) | ((q1 << 8) & 0x8000u) |
	     ((q1 << 12) & 0x800000u) | ((q1 << 16) & 0x80000000u);
}

/* Four e2m1 codes (low 16 bits of n) -> bf16x2 {e0, e1}, {e2, e3}, times the
 * bf16 scale s2 (exact: at most 5 significant bits). PRMT lookup of the
 * magnitudes' bf16 high and low bytes, the sign OR-ed into bit 15. */
static __device__ __forceinline__ void mg_fp4x4_to_bf16(uint32_t n, __nv_bfloat162 s2, uint32_t &w01, uint32_t &w23)
{
	const uint32_t sel = n & 0x7777u;
	const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
	const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);
	uint32_t a = __byte_perm(lo, hi, 0x5140u) | ((n << 12) & 0x8000u) | ((n << 24) & 0x80000000u);
	uint32_t b = __byte_perm(lo, hi, 0x7362u) | ((n << 4) & 0x8000u) | ((n << 16) & 0x80000000u);
	__nv_bfloat162 va = __hmul2(*(__nv_bfloat162 *)&a, s2), vb = __hmul2(*(__nv_bfloat162 *)&b, s2);
	w01 = *(uint32_t *)&va;
	w23 = *(uint32_t *)&vb;
}

/* One e4m3 byte -> bf16 bits (exact): the 7 magnitude bits placed as an f32
 * exponent/mantissa and rescaled by 2^120 (subnormal codes included). */
static __device__ __forceinline__ uint32_t mg_e4m3_to_bf16(uint32_t c)
{
	const float f = __uint_as_float((c & 0x7Fu) << 20) * 0x1p120f;
	return (__float_as_uint(f) >> 16) | ((c & 0x80u) << 8);
}

template <int WF, int MODE>
__global__ void __launch_bounds__(MG_NT) mg_gemm_kernel(const mg_params P)
{
	typedef mg_cfg<WF, MODE> C;
	extern __shared__ __align__(16) uint8_t mg_smem[];
	__shared__ int sh_e, sh_r0, sh_r1;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, tig = lane & 3;
	const int wm = warp >> 2, wn = warp & 3;

	if (tid == 0) {
		if (P.offsets) {
			sh_e = moe_tile_of_slot(blockIdx.y, P.n_experts, P.offsets, MG_BM, &sh_r0, &sh_r1);
		} else {
			sh_e = 0;
			sh_r0 = (int)(blockIdx.y * MG_BM);
			sh_r1 = (int)min((int64_t)sh_r0 + MG_BM, P.n_rows);
		}
	}
	__syncthreads();
	const int e = sh_e;
	if (e < 0)
		return;
	const int r0 = sh_r0, r1 = sh_r1;
	const struct kern_wmat wm_ = P.w_dev ? P.w_dev[e] : P.w0;
	const uint8_t *wd = (const uint8_t *)wm_.data, *wsc = (const uint8_t *)wm_.scale;
	const int64_t in = P.in, out = P.out, nkb = in / MG_BK, n0 = (int64_t)blockIdx.x * MG_BN;
	const uint8_t *xq = (const uint8_t *)P.xq;

	/* This thread's cp.async sources: A rows (8 or 16 chunks of 16 bytes per
	 * row), the scale row (tid < 64), weight rows. */
	constexpr int A_CPR = MG_BK * C::A_EB / 16, A_RPP = MG_NT / A_CPR, A_N = MG_BM / A_RPP;
	const uint8_t *a_src[A_N];
#pragma unroll
	for (int i = 0; i < A_N; i++) {
		const int rr = r0 + tid / A_CPR + i * A_RPP;
		const int64_t src = rr < r1 ? (P.row_src ? P.row_src[rr] : rr) : -1;
		a_src[i] = src >= 0 ? xq + (src * in) * C::A_EB + (tid % A_CPR) * 16 : nullptr;
	}
	const float *sx_src = nullptr;
	if (tid < MG_BM) {
		const int rr = r0 + tid;
		const int64_t src = rr < r1 ? (P.row_src ? P.row_src[rr] : rr) : -1;
		sx_src = src >= 0 ? P.xs + src * nkb : nullptr;
	}
	constexpr int B_CPR = C::B_ROWB / 16, B_RPP = MG_NT / B_CPR, B_N = MG_BN / B_RPP;
	const int64_t wrow_bytes = WF == MG_W_FP8 ? in : in / 2;

	auto load_stage = [&](int st, int64_t kb) {
		uint8_t *base = mg_smem + st * C::STAGE;
#pragma unroll
		for (int i = 0; i < A_N; i++) {
			const int row = tid / A_CPR + i * A_RPP;
			uint8_t *d = base + C::A_OFF + row * C::A_STRIDE + (tid % A_CPR) * 16;
			mg_cp16(d, a_src[i] ? a_src[i] + kb * MG_BK * C::A_EB : xq, a_src[i] != nullptr);
		}
		if (tid < MG_BM)
			mg_cp4(base + C::SX_OFF + tid * 4, sx_src ? sx_src + kb : P.xs, sx_src != nullptr);
#pragma unroll
		for (int i = 0; i < B_N; i++) {
			const int row = tid / B_CPR + i * B_RPP;
			const bool ok = n0 + row < out;
			const uint8_t *s = ok ? wd + (n0 + row) * wrow_bytes + kb * C::B_ROWB + (tid % B_CPR) * 16 : wd;
			mg_cp16(base + C::B_OFF + row * C::B_STRIDE + (tid % B_CPR) * 16, s, ok);
		}
		if (WF == MG_W_FP8) {
			if (tid == 0)
				mg_cp4(base + C::WS_OFF, (const float *)wsc + (n0 / 128) * nkb + kb, true);
		} else if (tid < MG_BN) {
			const bool ok = n0 + tid < out;
			if (WF == MG_W_MXFP4)
				mg_cp4(base + C::WS_OFF + tid * 4, ok ? wsc + (n0 + tid) * (in / 32) + kb * 4 : wsc, ok);
			else
				mg_cp8(base + C::WS_OFF + tid * 8, ok ? wsc + (n0 + tid) * (in / 16) + kb * 8 : wsc, ok);
		}
	};

	float acc[2][4][4];
#pragma unroll
	for (int mt = 0; mt < 2; mt++)
#pragma unroll
		for (int nt = 0; nt < 4; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				acc[mt][nt][i] = 0.f;

#pragma unroll
	for (int s = 0; s < C::STAGES - 1; s++) {
		if (s < nkb)
			load_stage(s, s);
		mg_commit();
	}

	/* ldmatrix addresses (A: rows of the warp's m16 tile, lanes 16..31 the
	 * upper K chunk; B FP8: rows of two n8 tiles, lanes 8..15 / 24..31 the
	 * upper K chunk; B FP4: rows of four n8 tiles). */
	const int a_row = wm * 32 + (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
	const int bf8_row = wn * 32 + (lane >> 4) * 8 + (lane & 7), bf8_hi = (lane >> 3) & 1;
	const int bf4_row = wn * 32 + (lane >> 3) * 8 + (lane & 7);

	for (int64_t kb = 0; kb < nkb; kb++) {
		mg_wait<C::STAGES - 2>();
		__syncthreads(); /* stage kb landed for all threads; stage kb-1 is free */
		if (kb + C::STAGES - 1 < nkb)
			load_stage((int)((kb + C::STAGES - 1) % C::STAGES), kb + C::STAGES - 1);
		mg_commit();

		const uint8_t *base = mg_smem + (kb % C::STAGES) * C::STAGE;
		const uint8_t *As = base + C::A_OFF, *Bs = base + C::B_OFF;
		const float *sxs = (const float *)(base + C::SX_OFF);
		float part[2][4][4];
#pragma unroll
		for (int mt = 0; mt < 2; mt++)
#pragma unroll
			for (int nt = 0; nt < 4; nt++)
#pragma unroll
				for (int i = 0; i < 4; i++)
					part[mt][nt][i] = 0.f;

		if (MODE == MG_MMA_FP8) {
#pragma unroll
			for (int s = 0; s < 4; s++) {
				uint32_t a[2][4];
#pragma unroll
				for (int mt = 0; mt < 2; mt++)
					mg_ldsm4(a[mt], As + (a_row + mt * 16) * C::A_STRIDE + 32 * s + a_hi * 16);
				if (WF == MG_W_FP8) {
					uint32_t b[2][4];
#pragma unroll
					for (int np = 0; np < 2; np++)
						mg_ldsm4(b[np], Bs + (bf8_row + np * 16) * C::B_STRIDE + 32 * s + bf8_hi * 16);
#pragma unroll
					for (int mt = 0; mt < 2; mt++)
#pragma unroll
						for (int nt = 0; nt < 4; nt++)
							mg_mma_fp8(part[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2],
								   b[nt >> 1][(nt & 1) * 2 + 1]);
				} else {
					uint32_t q[4];
					mg_ldsm4(q, Bs + bf4_row * C::B_STRIDE + 16 * s);
#pragma unroll
					for (int nt = 0; nt < 4; nt++) {
						uint32_t b0, b1;
						mg_fp4x8_to_e4m3(q[nt], b0, b1);
						/* Scales of this thread's two output columns (C fragment cols 2·tig, 2·tig+1). */
						const int c0 = wn * 32 + nt * 8 + 2 * tig;
						if (WF == MG_W_MXFP4) {
							const uint8_t *ws = base + C::WS_OFF;
							const float s0 = kq_e8m0_to_f32(ws[c0 * 4 + s]);
							const float s1 = kq_e8m0_to_f32(ws[(c0 + 1) * 4 + s]);
#pragma unroll
							for (int mt = 0; mt < 2; mt++) {
								float p[4] = {0.f, 0.f, 0.f, 0.f};
								mg_mma_fp8(p, a[mt], b0, b1);
								part[mt][nt][0] = fmaf(s0, p[0], part[mt][nt][0]);
								part[mt][nt][1] = fmaf(s1, p[1], part[mt][nt][1]);
								part[mt][nt][2] = fmaf(s0, p[2], part[mt][nt][2]);
								part[mt][nt][3] = fmaf(s1, p[3], part[mt][nt][3]);
							}
						} else {
							/* NVFP4: K 32s..32s+15 (group 2s) comes from lanes tig 0, 1 and
							 * 32s+16..32s+31 (group 2s+1) from tig 2, 3; one MMA each. */
							const uint8_t *ws = base + C::WS_OFF;
							const float l0 = kq_e4m3_to_f32(ws[c0 * 8 + 2 * s]);
							const float l1 = kq_e4m3_to_f32(ws[(c0 + 1) * 8 + 2 * s]);
							const float h0 = kq_e4m3_to_f32(ws[c0 * 8 + 2 * s + 1]);
							const float h1 = kq_e4m3_to_f32(ws[(c0 + 1) * 8 + 2 * s + 1]);
							const bool lo = tig < 2;
							const uint32_t lb0 = lo ? b0 : 0u, lb1 = lo ? b1 : 0u;
							const uint32_t hb0 = lo ? 0u : b0, hb1 = lo ? 0u : b1;
#pragma unroll
							for (int mt = 0; mt < 2; mt++) {
								float p[4] = {0.f, 0.f, 0.f, 0.f}, r[4] = {0.f, 0.f, 0.f, 0.f};
								mg_mma_fp8(p, a[mt], lb0, lb1);
								mg_mma_fp8(r, a[mt], hb0, hb1);
								part[mt][nt][0] += fmaf(l0, p[0], h0 * r[0]);
								part[mt][nt][1] += fmaf(l1, p[1], h1 * r[1]);
								part[mt][nt][2] += fmaf(l0, p[2], h0 * r[2]);
								part[mt][nt][3] += fmaf(l1, p[3], h1 * r[3]);
							}
						}
					}
				}
			}
		} else {
			uint32_t q[4] = {0u, 0u, 0u, 0u};
#pragma unroll
			for (int s = 0; s < 8; s++) {
				uint32_t a[2][4];
#pragma unroll
				for (int mt = 0; mt < 2; mt++)
					mg_ldsm4(a[mt], As + (a_row + mt * 16) * C::A_STRIDE + (16 * s + a_hi * 8) * 2);
				uint32_t b0[4], b1[4];
				if (WF == MG_W_FP8) {
					mg_ldsm4(q, Bs + bf4_row * C::B_STRIDE + 16 * s);
#pragma unroll
					for (int nt = 0; nt < 4; nt++) {
						b0[nt] = mg_e4m3_to_bf16(q[nt] & 0xFF) | (mg_e4m3_to_bf16((q[nt] >> 8) & 0xFF) << 16);
						b1[nt] = mg_e4m3_to_bf16((q[nt] >> 16) & 0xFF) | (mg_e4m3_to_bf16(q[nt] >> 24) << 16);
					}
				} else {
					if ((s & 1) == 0)
						mg_ldsm4(q, Bs + bf4_row * C::B_STRIDE + 16 * (s >> 1));
					const uint8_t *ws = base + C::WS_OFF;
#pragma unroll
					for (int nt = 0; nt < 4; nt++) {
						const int bn = wn * 32 + nt * 8 + g; /* this lane's B column */
						const float sc = WF == MG_W_MXFP4 ? kq_e8m0_to_f32(ws[bn * 4 + (s >> 1)])
										  : kq_e4m3_to_f32(ws[bn * 8 + 2 * (s >> 1) + (tig >> 1)]);
						mg_fp4x4_to_bf16(q[nt] >> (16 * (s & 1)), __float2bfloat162_rn(sc), b0[nt], b1[nt]);
					}
				}
#pragma unroll
				for (int mt = 0; mt < 2; mt++)
#pragma unroll
					for (int nt = 0; nt < 4; nt++)
						mg_mma_bf16(part[mt][nt], a[mt], b0[nt], b1[nt]);
			}
		}

		/* Activation scale per row (and the FP8 weight's block scale), once per K block. */
		const float wsf = WF == MG_W_FP8 ? *(const float *)(base + C::WS_OFF) : 1.0f;
#pragma unroll
		for (int mt = 0; mt < 2; mt++) {
			const float sa = sxs[wm * 32 + mt * 16 + g] * wsf, sb = sxs[wm * 32 + mt * 16 + g + 8] * wsf;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				acc[mt][nt][0] = fmaf(sa, part[mt][nt][0], acc[mt][nt][0]);
				acc[mt][nt][1] = fmaf(sa, part[mt][nt][1], acc[mt][nt][1]);
				acc[mt][nt][2] = fmaf(sb, part[mt][nt][2], acc[mt][nt][2]);
				acc[mt][nt][3] = fmaf(sb, part[mt][nt][3], acc[mt][nt][3]);
			}
		}
	}
	mg_wait<0>();

	const float gs = WF == MG_W_NVFP4 ? wm_.global_scale : 1.0f;
#pragma unroll
	for (int mt = 0; mt < 2; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int rr = r0 + wm * 32 + mt * 16 + g + (i >= 2 ? 8 : 0);
			if (rr >= r1)
				continue;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				const int64_t o = n0 + wn * 32 + nt * 8 + 2 * tig + (i & 1);
				if (o < out)
					kq_store(P.y, P.y_dt, (int64_t)rr * P.ldy + o, acc[mt][nt][i] * gs);
			}
		}
}

/* ---- host side ---- */

/* Scratch bytes of pass 1 for `rows` rows of `in` columns (codes or bf16
 * values, then the scales; 256-byte aligned pieces). */
static inline size_t mg_scratch_bytes(int64_t rows, int64_t in, int mode)
{
	const size_t q = (size_t)(rows * in) * (mode == MG_MMA_FP8 ? 1 : 2);
	const size_t s = (size_t)(rows * (in / MG_BK)) * sizeof(float);
	return ((q + 255) & ~(size_t)255) + ((s + 255) & ~(size_t)255);
}

/* Both passes. x has x_rows rows (the gathered source rows for the moe op).
 * grid_y: row-tile slots (linear: ceil(n_rows / 64); moe: an upper bound).
 * The caller checked shapes (in % 128, act_quant 128) and provides scratch
 * of mg_scratch_bytes(x_rows, in, MODE). */
template <int WF, int MODE>
static cudaError_t mg_launch(mg_params P, int64_t x_rows, const void *x, int x_dt, int64_t ldx, void *scratch,
			     int64_t grid_y, cudaStream_t stream)
{
	typedef mg_cfg<WF, MODE> C;
	const int64_t nkb = P.in / MG_BK;
	uint8_t *xq = (uint8_t *)scratch;
	const size_t qb = (size_t)(x_rows * P.in) * C::A_EB;
	float *xs = (float *)(xq + ((qb + 255) & ~(size_t)255));
	const int64_t items = x_rows * nkb;
	if (items > 0) {
		const int vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
		mg_quant_kernel<WF, MODE><<<(unsigned)((items + 3) / 4), 128, 0, stream>>>(x_rows, P.in, x, x_dt, ldx,
											     vec, xq, xs);
		cudaError_t ce = cudaGetLastError();
		if (ce != cudaSuccess)
			return ce;
	}
	P.xq = xq;
	P.xs = xs;
	if (C::SMEM > 48 * 1024) {
		/* Per device, idempotent and cheap; never a stream operation (graph-capture safe). */
		cudaError_t ce = cudaFuncSetAttribute(mg_gemm_kernel<WF, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
						      C::SMEM);
		if (ce != cudaSuccess)
			return ce;
	}
	dim3 grid((unsigned)((P.out + MG_BN - 1) / MG_BN), (unsigned)grid_y);
	mg_gemm_kernel<WF, MODE><<<grid, MG_NT, C::SMEM, stream>>>(P);
	return cudaGetLastError();
}

/* Whether the FP8 MMA kernel was compiled for a cc >= 8.9 image on the
 * current device (a JIT of the sm_80 PTX would hold the trap instead). */
template <int WF>
static bool mg_fp8_compiled()
{
	cudaFuncAttributes fa;
	if (cudaFuncGetAttributes(&fa, mg_gemm_kernel<WF, MG_MMA_FP8>) != cudaSuccess) {
		cudaGetLastError();
		return false;
	}
	return fa.binaryVersion >= 89 && fa.ptxVersion >= 89;
}

#endif
