/*
 * kernels/linear/linear_gemv.cu: the portable FP8 block-scaled decode GEMV /
 * skinny GEMM (variant linear_cuda_gemv, linear_gemv.h), for every cc >= 8.0.
 *
 * Decode reads every weight byte once per step and does a handful of FMAs
 * per byte, so the kernel is built around the weight stream. Two forms share
 * the per-step math:
 *   - streaming (linear_gemv_stream_kernel; whenever a CTA's tokens fit in
 *     shared memory over the whole of K, up to 96 KiB: every DeepSeek-V4-Flash
 *     shape at T <= 2, in <= 4096 at T <= 4, in <= 2048 at any T):
 *     one wave of CTAs, each staging its (up to 8) tokens once and owning a
 *     range of row groups of 4 rows; each warp walks its (row group, K step)
 *     items with no barrier, two items' weights in flight while one is
 *     computed; sums parked in shared memory per row group, added at the end;
 *   - chunked (linear_gemv_kernel; the rest): CTAs of 4 * (8 / wk) rows, x
 *     staged K chunk by K chunk.
 * In both, a warp's 8 / wk row groups of 4 rows and wk interleaved 512-column
 * K steps: a lane loads 16 e4m3 bytes of each of its 4 rows per step
 * (16-byte __ldg);
 *   - e4m3 is decoded in registers with three integer operations per byte
 *     (byte to the top, arithmetic shift by 4, mask; two for the top byte of
 *     a word): the result is the f32
 *     whose bits place e4m3's exponent and mantissa in f32's fields, i.e. the
 *     code's value times 2^-120, exact for normals and subnormals;
 *   - the activations of the CTA's tokens are staged in shared memory as f32
 *     multiplied by a power of two: with act_quant 128
 *     they are the reference's e4m3 codes (amax over the 128-column block by
 *     warp shuffles, pow2-ceil scale, RNE: bit-identical to
 *     kern_act_quant_fp8) times 2^116, the block scale kept aside; with
 *     act_quant 0 they are x / s · 2^116 for a power-of-two s >= max |x| of
 *     the block (exact). Products of the two then stay normal f32 (exact for
 *     codes), and each lane's 16-column partial sum is multiplied once by
 *     weight scale · activation scale · 16. Columns are permuted within each
 *     512-column step so that the lanes' 16-byte shared loads do not conflict;
 *   - per-lane sums are reduced by warp shuffles, then across the wk warps
 *     of a row group in shared memory, and stored (f32 or bf16, RNE).
 * No workspace and one launch. Tokens beyond 8 take more CTAs (the chunks of
 * one row range adjacent in the grid so their weight reads hit L2).
 * Summation order differs from the reference's (k ascending), the
 * products are the same: agreement is within the linear tests' tolerance.
 * An e4m3 NaN code (0x7F / 0xFF; checkpoints have none) decodes as 480.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/device/ctx.h"
#include "kernels/linear/linear_gemv.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define GV_RB 4                       /* rows per warp */
#define GV_WARPS 8
#define GV_THREADS (GV_WARPS * 32)
#define GV_STEP 512                   /* K columns per warp step: 32 lanes x 16 */
#define GV_X_BYTES (32 * 1024)        /* staged activations per CTA */
#define GV_MAX_TC 8                   /* tokens per CTA */

struct gv_params {
	const void *x;
	void *y;
	const uint8_t *w;
	const float *ws;
	int64_t T, in, out, ldx, ldy, nkb;
	int x_dt, y_dt, aq;
	int wk;       /* warps along K (1, 2, 4 or 8); warps along rows: 8 / wk */
	int kc;       /* K columns staged per chunk, a multiple of 512 */
	int n_chunks; /* token chunks per row tile */
	int64_t gpb;  /* streaming kernel: row groups (of GV_RB rows) per CTA, a multiple of 8 / wk */
};

/* Byte `byte` of word (an e4m3 code) as the f32 of value code * 2^-120. */
static __device__ __forceinline__ float gv_e4m3_bits(uint32_t word, int byte)
{
	if (byte == 3) /* already on top: the mask also clears the other bytes (two operations) */
		return __int_as_float(((int32_t)word >> 4) & (int32_t)0x87F00000);
	const uint32_t top = __byte_perm(word, 0u, ((uint32_t)byte << 12) | 0x0444u);
	return __int_as_float(((int32_t)top >> 4) & (int32_t)0x87FFFFFF);
}

/* The weights of this lane for step s of the chunk at k0: 16 bytes of each
 * of the warp's rows and their block scales (zeros outside the matrix). */
static __device__ __forceinline__ void gv_load(const gv_params &P, int64_t o0, int64_t k0, int s, int klen,
					       int lane, uint4 *wv, float *sw)
{
	const int c = s * GV_STEP + lane * 16;
#pragma unroll
	for (int i = 0; i < GV_RB; i++) {
		const int64_t o = o0 + i;
		if (c < klen && o < P.out) {
			wv[i] = __ldg((const uint4 *)(P.w + o * P.in + k0 + c));
			sw[i] = __ldg(P.ws + (o >> 7) * P.nkb + ((k0 + c) >> 7));
		} else {
			wv[i] = make_uint4(0u, 0u, 0u, 0u);
			sw[i] = 0.f;
		}
	}
}

static __device__ __forceinline__ uint32_t gv_word(const uint4 &v, int j)
{
	return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* One step's math: the lane's 16 columns of GV_RB rows times TC tokens. */
template <int TC>
static __device__ __forceinline__ void gv_step(const float *xs, const float *sx, int s, int klen, int lane, int kc,
					       const uint4 *wv, const float *sw, float (*acc)[TC])
{
	const int c = s * GV_STEP + lane * 16;
	if (c >= klen)
		return;
	float d[GV_RB][TC];
#pragma unroll
	for (int i = 0; i < GV_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++)
			d[i][t] = 0.f;
	const float *xb = xs + s * GV_STEP + lane * 4;
#pragma unroll
	for (int j = 0; j < 4; j++) {
		float wf[GV_RB][4];
#pragma unroll
		for (int i = 0; i < GV_RB; i++) {
			const uint32_t u = gv_word(wv[i], j);
#pragma unroll
			for (int e = 0; e < 4; e++)
				wf[i][e] = gv_e4m3_bits(u, e);
		}
#pragma unroll
		for (int t = 0; t < TC; t++) {
			const float4 xv = *(const float4 *)(xb + t * kc + j * 128);
#pragma unroll
			for (int i = 0; i < GV_RB; i++) {
				float a = d[i][t];
				a = fmaf(xv.x, wf[i][0], a);
				a = fmaf(xv.y, wf[i][1], a);
				a = fmaf(xv.z, wf[i][2], a);
				a = fmaf(xv.w, wf[i][3], a);
				d[i][t] = a;
			}
		}
	}
	const int nkbc = kc >> 7, b = c >> 7;
#pragma unroll
	for (int t = 0; t < TC; t++) {
		const float sxt = sx[t * nkbc + b] * 16.0f; /* 2^116 * 2^-120 undone */
#pragma unroll
		for (int i = 0; i < GV_RB; i++)
			acc[i][t] = fmaf(d[i][t], sw[i] * sxt, acc[i][t]);
	}
}

/* Stage tokens [t0, t0 + TC) x columns [k0, k0 + klen) (klen % 128 == 0):
 * warp w takes the 128-column blocks w, w + 8, ...; the loads of up to
 * GV_STAGE_BATCH of its blocks are issued together (one L2 round trip per
 * batch, not per block), then each block's amax, scale and codes. */
#define GV_STAGE_BATCH 4
template <int TC>
static __device__ __forceinline__ void gv_stage(const gv_params &P, float *xs, float *sx, int64_t t0, int64_t k0,
						int klen, int warp, int lane)
{
	const int nb = klen >> 7, nkbc = P.kc >> 7, nblk = TC * nb;
	for (int blk0 = warp; blk0 < nblk; blk0 += GV_WARPS * GV_STAGE_BATCH) {
		float v[GV_STAGE_BATCH][4];
#pragma unroll
		for (int u = 0; u < GV_STAGE_BATCH; u++) {
			const int blk = blk0 + u * GV_WARPS;
			const int t = blk / nb, b = blk - t * nb;
			const int64_t tg = t0 + t;
			const bool ok = blk < nblk && tg < P.T;
#pragma unroll
			for (int e = 0; e < 4; e++)
				v[u][e] = ok ? kq_load(P.x, P.x_dt, tg * P.ldx + k0 + b * 128 + lane * 4 + e) : 0.f;
		}
#pragma unroll
		for (int u = 0; u < GV_STAGE_BATCH; u++) {
			const int blk = blk0 + u * GV_WARPS;
			if (blk >= nblk) /* warp-uniform */
				break;
			const int t = blk / nb, b = blk - t * nb;
			const int c = b * 128 + lane * 4;
			float amax = 0.f;
#pragma unroll
			for (int e = 0; e < 4; e++)
				amax = fmaxf(amax, fabsf(v[u][e]));
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
			float s;
			if (P.aq) {
				s = kq_fp8_block_scale(amax);
#pragma unroll
				for (int e = 0; e < 4; e++)
					v[u][e] = kq_e4m3_to_f32(kq_f32_to_e4m3(fminf(fmaxf(v[u][e] / s, -448.0f), 448.0f))) *
						  0x1p116f;
			} else {
				s = fminf(fmaxf(kq_pow2_ceil(amax), 0x1p-10f), 0x1p126f);
				const float f = 0x1p116f / s; /* a power of two in [2^-10, 2^126]: exact */
#pragma unroll
				for (int e = 0; e < 4; e++)
					v[u][e] *= f;
			}
			const int st = c >> 9, cc = c & 511;
			const int idx = t * P.kc + st * GV_STEP + ((((cc >> 2) & 3) * 32) + (cc >> 4)) * 4;
			*(float4 *)(xs + idx) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
			if (lane == 0)
				sx[t * nkbc + b] = s;
		}
	}
}

/* Reduce a warp's finished sums over its lanes and park them at slot
 * ((local row group) * wk + k part) of red; clear them for the next group. */
template <int TC>
static __device__ __forceinline__ void gv_park(float *red, int64_t slot, int lane, float (*acc)[TC])
{
#pragma unroll
	for (int i = 0; i < GV_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++) {
			float v = acc[i][t];
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
			if (lane == 0)
				red[(slot * GV_RB + i) * TC + t] = v;
			acc[i][t] = 0.f;
		}
}

template <int TC>
__global__ void __launch_bounds__(GV_THREADS) linear_gemv_kernel(const gv_params P)
{
	extern __shared__ float4 gv_smem4[];
	float *xs = (float *)gv_smem4;            /* [TC][kc], permuted within 512-column steps */
	float *sx = xs + TC * P.kc;               /* [TC][kc / 128] activation block scales */
	float *red = sx + TC * (P.kc >> 7);       /* [8 warps][GV_RB][TC] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int wk = warp % P.wk, wr = warp / P.wk, nwr = GV_WARPS / P.wk;
	const int64_t tile = blockIdx.x / P.n_chunks;
	const int64_t t0 = (int64_t)(blockIdx.x - tile * P.n_chunks) * TC;
	const int64_t orow0 = tile * (GV_RB * nwr), o0 = orow0 + wr * GV_RB;

	float acc[GV_RB][TC];
#pragma unroll
	for (int i = 0; i < GV_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++)
			acc[i][t] = 0.f;
	for (int64_t k0 = 0; k0 < P.in; k0 += P.kc) {
		const int klen = (int)min((int64_t)P.kc, P.in - k0);
		const int nsteps = (klen + GV_STEP - 1) / GV_STEP;
		uint4 wv[GV_RB];
		float sw[GV_RB];
		int s = wk;
		gv_load(P, o0, k0, s, klen, lane, wv, sw); /* in flight while x is staged */
		if (k0)
			__syncthreads(); /* the previous chunk's readers are done */
		gv_stage<TC>(P, xs, sx, t0, k0, klen, warp, lane);
		__syncthreads();
		while (s < nsteps) {
			uint4 wn[GV_RB];
			float swn[GV_RB];
			const int sn = s + P.wk;
			gv_load(P, o0, k0, sn, klen, lane, wn, swn);
			gv_step<TC>(xs, sx, s, klen, lane, P.kc, wv, sw, acc);
#pragma unroll
			for (int i = 0; i < GV_RB; i++) {
				wv[i] = wn[i];
				sw[i] = swn[i];
			}
			s = sn;
		}
	}
	gv_park<TC>(red, warp, lane, acc);
	__syncthreads();
	const int nrows = GV_RB * nwr;
	for (int q = threadIdx.x; q < nrows * TC; q += GV_THREADS) {
		const int r = q / TC, t = q - r * TC;
		const int g = r / GV_RB, i = r - g * GV_RB;
		float sum = 0.f;
		for (int kq = 0; kq < P.wk; kq++)
			sum += red[((g * P.wk + kq) * GV_RB + i) * TC + t];
		const int64_t o = orow0 + r, tg = t0 + t;
		if (o < P.out && tg < P.T)
			kq_store(P.y, P.y_dt, tg * P.ldy + o, sum);
	}
}

/* The streaming form, used when a CTA's tokens fit in shared memory over the
 * whole of K (every decode shape at T = 1): x is staged once per CTA, then
 * each warp walks its (row group, K step) items without any barrier, the
 * weights of the next two items in flight while one is computed (so a warp
 * always has 128 bytes per lane outstanding, across row groups too); a
 * finished row group's sums are reduced by shuffles and parked in shared
 * memory; one barrier at the end, then the wk partial sums of each row are
 * added and stored. Grid: one wave of CTAs (occupancy x SMs), each owning
 * gpb consecutive row groups of one token chunk. */
template <int TC>
__global__ void __launch_bounds__(GV_THREADS, TC <= 2 ? 2 : 1) linear_gemv_stream_kernel(const gv_params P)
{
	extern __shared__ float4 gv_smem4[];
	float *xs = (float *)gv_smem4;            /* [TC][kc], permuted within 512-column steps */
	float *sx = xs + TC * P.kc;               /* [TC][kc / 128] activation block scales */
	float *red = sx + TC * (P.kc >> 7);       /* [gpb][wk][GV_RB][TC] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int wk = warp % P.wk, wr = warp / P.wk, nwr = GV_WARPS / P.wk;
	const int64_t range = blockIdx.x / P.n_chunks;
	const int64_t t0 = (int64_t)(blockIdx.x - range * P.n_chunks) * TC;
	const int64_t n_groups = (P.out + GV_RB - 1) / GV_RB;
	const int64_t g0 = range * P.gpb, g1 = min(g0 + P.gpb, n_groups);
	const int klen = (int)P.in;
	const int nsteps = (klen + GV_STEP - 1) / GV_STEP;
	const int my_steps = (nsteps - wk + P.wk - 1) / P.wk; /* >= 1: the host keeps wk <= nsteps */
	const int64_t my_groups = g1 - g0 > wr ? (g1 - g0 - wr + nwr - 1) / nwr : 0;
	const int64_t n_items = my_groups * my_steps;

	/* item (gi, si): row group g0 + wr + gi * nwr, step wk + si * P.wk */
	uint4 wa[GV_RB], wb[GV_RB];
	float sa[GV_RB], sb[GV_RB];
	int64_t lg = 0; /* the loader's position, two items ahead of the math */
	int ls = 0;
	gv_load(P, n_items > 0 ? (g0 + wr) * GV_RB : P.out, 0, wk, klen, lane, wa, sa);
	if (++ls == my_steps)
		ls = 0, lg++;
	gv_load(P, n_items > 1 ? (g0 + wr + lg * nwr) * GV_RB : P.out, 0, wk + ls * P.wk, klen, lane, wb, sb);
	if (++ls == my_steps)
		ls = 0, lg++;
	gv_stage<TC>(P, xs, sx, t0, 0, klen, warp, lane);
	__syncthreads();

	float acc[GV_RB][TC];
#pragma unroll
	for (int i = 0; i < GV_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++)
			acc[i][t] = 0.f;
	int64_t gi = 0;
	int si = 0;
	/* One item: load item n + 2 into NXT, compute item n from CUR, park a
	 * finished row group. Unrolled by three over rotating buffers (no copies). */
#define GV_STREAM_ITEM(CUR, SCUR, NXT, SNXT)                                                              \
	do {                                                                                              \
		gv_load(P, n + 2 < n_items ? (g0 + wr + lg * nwr) * GV_RB : P.out, 0, wk + ls * P.wk, klen, lane, \
			NXT, SNXT);                                                                       \
		if (++ls == my_steps)                                                                     \
			ls = 0, lg++;                                                                     \
		gv_step<TC>(xs, sx, wk + si * P.wk, klen, lane, P.kc, CUR, SCUR, acc);                    \
		if (++si == my_steps) {                                                                   \
			gv_park<TC>(red, (gi * nwr + wr) * P.wk + wk, lane, acc);                          \
			si = 0;                                                                           \
			gi++;                                                                             \
		}                                                                                         \
		n++;                                                                                      \
	} while (0)
	uint4 wc[GV_RB];
	float sc[GV_RB];
	for (int64_t n = 0; n < n_items;) {
		GV_STREAM_ITEM(wa, sa, wc, sc);
		if (n >= n_items)
			break;
		GV_STREAM_ITEM(wb, sb, wa, sa);
		if (n >= n_items)
			break;
		GV_STREAM_ITEM(wc, sc, wb, sb);
	}
#undef GV_STREAM_ITEM
	__syncthreads();
	const int64_t nq = (g1 - g0) * GV_RB * TC;
	for (int64_t q = threadIdx.x; q < nq; q += GV_THREADS) {
		const int64_t r = q / TC; /* row within the CTA's range */
		const int t = (int)(q - r * TC);
		const int64_t gl = r / GV_RB;
		const int i = (int)(r - gl * GV_RB);
		float sum = 0.f;
		for (int kq = 0; kq < P.wk; kq++)
			sum += red[((gl * P.wk + kq) * GV_RB + i) * TC + t];
		const int64_t o = g0 * GV_RB + r, tg = t0 + t;
		if (o < P.out && tg < P.T)
			kq_store(P.y, P.y_dt, tg * P.ldy + o, sum);
	}
}

/* SM count of the current device (cached per device index). */

/* The chunked form (x staged K chunk by K chunk): CTAs of 4 * (8 / wk) rows. */
template <int TC>
static cudaError_t gv_launch_chunked(gv_params P, cudaStream_t stream)
{
	int kc = (GV_X_BYTES / (4 * TC)) / GV_STEP * GV_STEP;
	const int64_t in_r = (P.in + GV_STEP - 1) / GV_STEP * GV_STEP;
	if (in_r < kc)
		kc = (int)in_r;
	P.kc = kc;
	/* Rows per CTA: 16 while that gives at least two CTAs per SM, else fewer
	 * (more warps along K); never more warps along K than the chunk has steps. */
	const int64_t need = 2 * (int64_t)kern_device_sm_count();
	int wk = 2;
	while (wk < GV_WARPS && (P.out + GV_RB * (GV_WARPS / wk) - 1) / (GV_RB * (GV_WARPS / wk)) * P.n_chunks < need)
		wk *= 2;
	const int nsteps = (int)((min((int64_t)kc, P.in) + GV_STEP - 1) / GV_STEP);
	while (wk > 1 && wk > nsteps)
		wk /= 2;
	P.wk = wk;
	const int64_t rows = GV_RB * (GV_WARPS / wk);
	const int64_t tiles = (P.out + rows - 1) / rows;
	const int64_t blocks = tiles * P.n_chunks;
	if (blocks > 0x7FFFFFFF)
		return cudaErrorInvalidConfiguration;
	const size_t smem = ((size_t)TC * kc + (size_t)TC * (kc / 128) + (size_t)GV_WARPS * GV_RB * TC) * sizeof(float);
	linear_gemv_kernel<TC><<<(unsigned)blocks, GV_THREADS, smem, stream>>>(P);
	return cudaGetLastError();
}

#define GV_STREAM_SMEM (96 * 1024) /* the streaming form's shared memory at most (x, scales, sums) */
#define GV_RED_BYTES (8 * 1024)     /* of which its parked row sums */

/* Per device: the streaming kernels' shared-memory limit (GV_STREAM_SMEM or
 * the device's opt-in maximum, raised for all four instantiations at the
 * first call, so no attribute is set while a stream may be capturing later)
 * and their resident CTAs per SM by 16 KiB step of shared memory. */
struct gv_dev_state {
	int limit;      /* bytes; 0 = not set up */
	int occ[4][7];  /* [log2 TC][ceil(smem / 16 KiB)] */
};
static gv_dev_state gv_dev[64];

template <int TC>
static void gv_stream_attr(int limit)
{
	cudaFuncSetAttribute(linear_gemv_stream_kernel<TC>, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
}

static gv_dev_state *gv_stream_setup(void)
{
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
		return NULL;
	gv_dev_state *d = &gv_dev[dev];
	if (d->limit)
		return d;
	int optin = 0;
	if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
		optin = 48 * 1024;
	const int limit = optin < GV_STREAM_SMEM ? optin : GV_STREAM_SMEM;
	gv_stream_attr<1>(limit);
	gv_stream_attr<2>(limit);
	gv_stream_attr<4>(limit);
	gv_stream_attr<GV_MAX_TC>(limit);
	cudaGetLastError(); /* a refused raise leaves 48 KiB: checked by the occupancy query below */
	d->limit = limit;
	return d;
}

template <int TC>
static int gv_stream_occupancy(gv_dev_state *d, size_t smem)
{
	const int lt = TC == 1 ? 0 : TC == 2 ? 1 : TC == 4 ? 2 : 3;
	const int b = (int)((smem + 16383) / 16384);
	if (b < 7 && d->occ[lt][b] != 0)
		return d->occ[lt][b];
	int n = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, linear_gemv_stream_kernel<TC>, GV_THREADS,
							  (size_t)b * 16384 < (size_t)d->limit ? (size_t)b * 16384
											: (size_t)d->limit) !=
		    cudaSuccess ||
	    n < 1)
		n = -1; /* cannot run at this size: the chunked form takes it */
	cudaGetLastError();
	if (b < 7)
		d->occ[lt][b] = n;
	return n;
}

/* The streaming form where the tokens' whole rows fit, else the chunked one. */
template <int TC>
static cudaError_t gv_launch(gv_params P, cudaStream_t stream)
{
	const int64_t in_r = (P.in + GV_STEP - 1) / GV_STEP * GV_STEP;
	const size_t xbytes = ((size_t)TC * in_r + (size_t)TC * (in_r / 128)) * sizeof(float);
	gv_dev_state *d = gv_stream_setup();
	if (!d || xbytes + GV_RED_BYTES > (size_t)d->limit)
		return gv_launch_chunked<TC>(P, stream);
	const int per_sm = gv_stream_occupancy<TC>(d, xbytes + GV_RED_BYTES);
	if (per_sm < 1)
		return gv_launch_chunked<TC>(P, stream);
	P.kc = (int)in_r;
	const int nsteps = (int)((P.in + GV_STEP - 1) / GV_STEP);
	const int64_t n_groups = (P.out + GV_RB - 1) / GV_RB;
	const int64_t target = (int64_t)kern_device_sm_count() * per_sm; /* one wave */
	/* Warps along K: as few as give every CTA of the wave a set of 8 / wk row
	 * groups (fewer partial sums), at most the number of K steps. */
	int wk = 1;
	while (wk < GV_WARPS && 2 * wk <= nsteps &&
	       (n_groups + GV_WARPS / wk - 1) / (GV_WARPS / wk) * P.n_chunks < target)
		wk *= 2; /* wk <= nsteps: every warp has at least one K step */
	P.wk = wk;
	const int64_t nwr = GV_WARPS / wk, units = (n_groups + nwr - 1) / nwr;
	int64_t bpc = target / P.n_chunks; /* CTAs per token chunk */
	if (bpc < 1)
		bpc = 1;
	if (bpc > units)
		bpc = units;
	int64_t gpb = (units + bpc - 1) / bpc * nwr;
	const int64_t max_gpb = GV_RED_BYTES / ((int64_t)wk * GV_RB * TC * (int64_t)sizeof(float)) / nwr * nwr;
	if (gpb > max_gpb)
		gpb = max_gpb;
	P.gpb = gpb;
	bpc = (n_groups + gpb - 1) / gpb;
	const int64_t blocks = bpc * P.n_chunks;
	if (blocks > 0x7FFFFFFF)
		return cudaErrorInvalidConfiguration;
	const size_t smem = xbytes + (size_t)gpb * wk * GV_RB * TC * sizeof(float);
	linear_gemv_stream_kernel<TC><<<(unsigned)blocks, GV_THREADS, smem, stream>>>(P);
	return cudaGetLastError();
}

extern "C" enum status kern_linear_gemv_cuda(const struct kern_linear_args *a)
{
	if (!a->w || a->w->fmt != KERN_WFMT_FP8_F32_B128 || !a->w->data || !a->w->scale)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if ((a->act_quant_block != 0 && a->act_quant_block != 128) || in <= 0 || in % 128 || out <= 0 || T < 0 ||
	    (uintptr_t)a->w->data % 16 || (uintptr_t)a->w->scale % 4)
		return ST_INVALID;
	if (a->x_dtype != KERN_DT_F32 && a->x_dtype != KERN_DT_BF16)
		return ST_INVALID;
	if (a->y_dtype != KERN_DT_F32 && a->y_dtype != KERN_DT_BF16)
		return ST_INVALID;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	if (ldx < in || ldy < out)
		return ST_INVALID;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->y)
		return ST_INVALID;
	const int tc = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : GV_MAX_TC;
	gv_params P = {};
	P.x = a->x;
	P.y = a->y;
	P.w = (const uint8_t *)a->w->data;
	P.ws = (const float *)a->w->scale;
	P.T = T;
	P.in = in;
	P.out = out;
	P.ldx = ldx;
	P.ldy = ldy;
	P.nkb = (in + 127) / 128;
	P.x_dt = a->x_dtype == KERN_DT_BF16;
	P.y_dt = a->y_dtype == KERN_DT_BF16;
	P.aq = a->act_quant_block != 0;
	P.n_chunks = (int)((T + tc - 1) / tc);
	if ((T + tc - 1) / tc > 0x7FFFFFFF)
		return ST_INVALID;
	cudaStream_t s = (cudaStream_t)a->stream;
	cudaError_t ce;
	switch (tc) {
	case 1: ce = gv_launch<1>(P, s); break;
	case 2: ce = gv_launch<2>(P, s); break;
	case 4: ce = gv_launch<4>(P, s); break;
	default: ce = gv_launch<GV_MAX_TC>(P, s); break;
	}
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_linear_gemv_cuda_host(const struct kern_linear_args *a)
{
	if (a->w && a->w->fmt != KERN_WFMT_FP8_F32_B128)
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_gemv_cuda, 0);
}
