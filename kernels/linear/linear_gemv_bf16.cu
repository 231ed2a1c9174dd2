/*
 * kernels/linear/linear_gemv_bf16.cu: the portable decode GEMV / skinny GEMM
 * for bf16 weights (variant linear_cuda_gemv_bf16, linear_bf16.h), for every
 * cc >= 8.0.
 *
 * A decode step reads each weight byte once and does T multiply-adds per
 * weight, so the kernel is built around the weight stream, as the FP8 GEMV
 * (linear_gemv.cu) is:
 *   - a CTA stages the activations of its TC tokens (1, 2, 4 or 8) over the
 *     whole of K in shared memory once, as f32 (exact for f32 and bf16 x),
 *     permuted within each 256-column step so that the lanes' 16-byte shared
 *     loads do not conflict;
 *   - a tile is 8 / wk row groups of GB_RB rows; warp (wr, kp) of the CTA
 *     owns row group wr and the K steps kp, kp + wk, ... of it. A step is 256
 *     columns: each lane loads 8 bf16 (one 16-byte __ldg) of each of its
 *     GB_RB rows, widens them in registers (bf16 -> f32 is a shift) and does
 *     GB_RB * 8 * TC FMAs into f32 accumulators;
 *   - the grid is one wave (SMs x resident CTAs per SM); each CTA walks tiles
 *     blockIdx.x, blockIdx.x + gridDim.x, ..., and each warp keeps the
 *     weights of the next two (tile, step) items in flight while it computes
 *     one, across tile boundaries, in two register buffers used in turn (no
 *     barrier and no register copies in the loop);
 *   - at the end of a tile the lane sums are reduced by halving shuffles
 *     (gb_warp_sums) and stored (f32, or bf16 RNE); with wk > 1 they are parked in shared
 *     memory instead (a CTA then has at most GB_RED_TILES tiles) and the wk
 *     partial sums of each row are added after one barrier, k part
 *     ascending.
 * wk: 1 when the rows alone fill the wave (the head: 129280 rows), up to 8
 * when they do not (the router gate: 256 rows), at most the number of K
 * steps. More than TC tokens take more CTAs along gridDim.y; the CTAs of
 * the token chunks walk the same tiles in the same order at the same time,
 * so the weight rows come from memory once and from L2 after that.
 * No workspace, one launch. Summation order differs from the reference's
 * (k ascending); the products are the same.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/device/ctx.h"
#include "kernels/linear/linear_bf16.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define GB_RB 4                             /* rows per warp */
#define GB_WARPS 8
#define GB_THREADS (GB_WARPS * 32)
#define GB_STEP 256                         /* K columns per warp step: 32 lanes x 8 */
#define GB_X_BYTES (64 * 1024)              /* staged activations per CTA at most */
#define GB_MAX_TC 8                         /* tokens per CTA (GB_RB * GB_MAX_TC <= 32 lanes) */
#define GB_RED_TILES 4                      /* tiles per CTA at most when wk > 1 (sums parked) */
#define GB_RED_BYTES (GB_RED_TILES * GB_WARPS * GB_RB * GB_MAX_TC * 4)

struct gb_params {
	const void *x;
	void *y;
	const uint16_t *w;
	int64_t T, in, out, ldx, ldy;
	int x_dt, y_dt; /* 1 = bf16 */
	int in_pad;     /* in rounded up to GB_STEP: staged columns per token */
	int nsteps;     /* in_pad / GB_STEP */
	int wk;         /* warps along K: 1, 2, 4 or 8, at most nsteps */
	int64_t n_tiles; /* tiles of GB_RB * (8 / wk) rows */
};

/* Staged position of column kk (0..255) of a step: lane kk / 8 reads its
 * columns 0..3 at lane * 4 and 4..7 at 128 + lane * 4. */
static __device__ __forceinline__ int gb_pos(int kk)
{
	return ((kk >> 2) & 1) * 128 + (kk >> 3) * 4 + (kk & 3);
}

/* Tokens [t0, t0 + TC) x all columns into xs [TC][in_pad] (zeros past T and
 * past in), four columns per thread and iteration. */
template <int TC>
static __device__ __forceinline__ void gb_stage(const gb_params &P, float *xs, int64_t t0)
{
	const int q4 = P.in_pad >> 2;
	for (int q = threadIdx.x; q < TC * q4; q += GB_THREADS) {
		const int t = q / q4, k = (q - t * q4) * 4;
		const int64_t tg = t0 + t;
		float v[4];
		const bool ok = tg < P.T && k < P.in; /* in % 8 == 0: all four columns or none */
#pragma unroll
		for (int e = 0; e < 4; e++)
			v[e] = ok ? kq_load(P.x, P.x_dt, tg * P.ldx + k + e) : 0.f;
		*(float4 *)(xs + t * P.in_pad + (k & ~(GB_STEP - 1)) + gb_pos(k & (GB_STEP - 1))) =
			make_float4(v[0], v[1], v[2], v[3]);
	}
}

/* This lane's 16 bytes of rows o0 .. o0 + GB_RB - 1 at column c (zeros for
 * rows past out and columns past in). */
static __device__ __forceinline__ void gb_load(const gb_params &P, int64_t o0, int64_t c, uint4 *wv)
{
#pragma unroll
	for (int i = 0; i < GB_RB; i++) {
		const int64_t o = o0 + i;
		wv[i] = o < P.out && c < P.in ? __ldg((const uint4 *)(P.w + o * P.in + c)) : make_uint4(0u, 0u, 0u, 0u);
	}
}

/* bf16 pair word -> the f32 of its low and high element (exact). */
static __device__ __forceinline__ float gb_lo(uint32_t u)
{
	return __uint_as_float(u << 16);
}
static __device__ __forceinline__ float gb_hi(uint32_t u)
{
	return __uint_as_float(u & 0xFFFF0000u);
}

/* Widen one item's weights (GB_RB rows x 8 columns) to f32. */
static __device__ __forceinline__ void gb_widen(const uint4 *wv, float (*wf)[8])
{
#pragma unroll
	for (int i = 0; i < GB_RB; i++) {
		wf[i][0] = gb_lo(wv[i].x), wf[i][1] = gb_hi(wv[i].x);
		wf[i][2] = gb_lo(wv[i].y), wf[i][3] = gb_hi(wv[i].y);
		wf[i][4] = gb_lo(wv[i].z), wf[i][5] = gb_hi(wv[i].z);
		wf[i][6] = gb_lo(wv[i].w), wf[i][7] = gb_hi(wv[i].w);
	}
}

/* acc[i][t] += the lane's 8 columns of step s: rows i times token t. */
template <int TC>
static __device__ __forceinline__ void gb_fma(const float *xs, int in_pad, int s, int lane, const float (*wf)[8],
					      float (*acc)[TC])
{
	const float *xb = xs + s * GB_STEP + lane * 4;
#pragma unroll
	for (int t = 0; t < TC; t++) {
		const float4 a = *(const float4 *)(xb + t * in_pad), b = *(const float4 *)(xb + t * in_pad + 128);
#pragma unroll
		for (int i = 0; i < GB_RB; i++) {
			float v = acc[i][t];
			v = fmaf(a.x, wf[i][0], v);
			v = fmaf(a.y, wf[i][1], v);
			v = fmaf(a.z, wf[i][2], v);
			v = fmaf(a.w, wf[i][3], v);
			v = fmaf(b.x, wf[i][4], v);
			v = fmaf(b.y, wf[i][5], v);
			v = fmaf(b.z, wf[i][6], v);
			v = fmaf(b.w, wf[i][7], v);
			acc[i][t] = v;
		}
	}
}

/* Sum N values (a power of two <= 32) over the warp's lanes, by halving:
 * at the step of lane bit `off` each lane keeps half of its values and
 * receives its partner's sums of them, so after log2 N steps lane l holds
 * the sum of value l >> (5 - log2 N) (over the lanes that differ in the bits
 * done so far); the remaining bits are a plain butterfly. N - 1 + 5 - log2 N
 * shuffles instead of 5 N. */
template <int N, int HALF, int OFF>
static __device__ __forceinline__ void gb_halve(float (&v)[N], int lane)
{
	const bool up = lane & OFF;
#pragma unroll
	for (int k = 0; k < HALF; k++) { /* HALF a template constant: unrolled, v stays in registers */
		const float lo = v[k], hi = v[k + HALF];
		const float send = up ? lo : hi, keep = up ? hi : lo;
		v[k] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, OFF);
	}
	if constexpr (HALF > 1)
		gb_halve<N, HALF / 2, OFF / 2>(v, lane);
}

template <int N>
static __device__ __forceinline__ float gb_warp_sums(float (&v)[N], int lane)
{
	constexpr int LOG = N == 32 ? 5 : N == 16 ? 4 : N == 8 ? 3 : 2;
	gb_halve<N, N / 2, 16>(v, lane);
	float r = v[0];
#pragma unroll
	for (int st = LOG; st < 5; st++)
		r += __shfl_xor_sync(0xFFFFFFFFu, r, 16 >> st);
	return r;
}

/* End of tile j (the CTA's j-th, first row row0) for this warp: the lanes'
 * sums of row i, token t end in the lanes l with l >> (5 - log2(GB_RB * TC))
 * == i * TC + t; the first of them stores it (wk == 1) or parks it in red for
 * the sum over K parts after the loop (wk > 1). Clears acc. No barrier. */
template <int TC>
static __device__ __forceinline__ void gb_end_tile(const gb_params &P, float *red, int64_t j, int64_t row0,
						   int64_t t0, int warp, int lane, float (*acc)[TC])
{
	constexpr int N = GB_RB * TC, SH = N == 32 ? 0 : N == 16 ? 1 : N == 8 ? 2 : 3; /* 5 - log2 N */
	float v[N];
#pragma unroll
	for (int i = 0; i < GB_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++) {
			v[i * TC + t] = acc[i][t];
			acc[i][t] = 0.f;
		}
	const float sum = gb_warp_sums<N>(v, lane);
	if (lane & ((1 << SH) - 1))
		return;
	const int q = lane >> SH, i = q / TC, t = q - i * TC;
	const int64_t o = row0 + (warp / P.wk) * GB_RB + i, tg = t0 + t;
	if (P.wk > 1)
		red[(j * GB_WARPS + warp) * N + q] = sum;
	else if (o < P.out && tg < P.T)
		kq_store(P.y, P.y_dt, tg * P.ldy + o, sum);
}

/* A warp's weight loader, two items ahead of its math: item (lj, ls) is
 * step kp + ls * wk of the CTA's tile lj; nl items issued so far. */
struct gb_loader {
	int64_t lj, nl;
	int ls;
	int64_t n_items;
	int my_steps;
	int64_t tile_rows, row_off; /* row_off: the warp's row group within a tile */
	int kp;
};

/* Issue the next item's loads into dst (zeros past the warp's last item). */
static __device__ __forceinline__ void gb_load_next(const gb_params &P, gb_loader &L, int lane, uint4 (&dst)[GB_RB])
{
	const int64_t o0 = L.nl < L.n_items ? ((int64_t)blockIdx.x + L.lj * gridDim.x) * L.tile_rows + L.row_off : P.out;
	gb_load(P, o0, (int64_t)(L.kp + L.ls * P.wk) * GB_STEP + lane * 8, dst);
	if (++L.ls == L.my_steps)
		L.ls = 0, L.lj++;
	L.nl++;
}

/* One item on weight buffer BUF (no copies between buffers: a move from a
 * register whose load is in flight would wait for it): widen it, reload BUF
 * with the item two ahead, do the FMAs, and end the tile after its last
 * step. */
#define GB_ITEM(BUF)                                                                                      \
	do {                                                                                              \
		float wf[GB_RB][8];                                                                       \
		gb_widen(BUF, wf);                                                                        \
		gb_load_next(P, L, lane, BUF);                                                            \
		gb_fma<TC>(xs, P.in_pad, kp + si * P.wk, lane, wf, acc);                                  \
		if (++si == my_steps) {                                                                   \
			gb_end_tile<TC>(P, red, j, ((int64_t)blockIdx.x + j * gridDim.x) * tile_rows, t0, warp, \
					lane, acc);                                                       \
			si = 0;                                                                           \
			j++;                                                                              \
		}                                                                                         \
	} while (0)

template <int TC>
__global__ void __launch_bounds__(GB_THREADS, 2) linear_gemv_bf16_kernel(const gb_params P)
{
	extern __shared__ float4 gb_smem4[];
	float *xs = (float *)gb_smem4;     /* [TC][in_pad] */
	float *red = xs + TC * P.in_pad;   /* [GB_RED_TILES][8 warps][GB_RB][TC], wk > 1 */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int kp = warp % P.wk, wr = warp / P.wk, nwr = GB_WARPS / P.wk;
	const int64_t t0 = (int64_t)blockIdx.y * TC, tile_rows = GB_RB * nwr;
	gb_stage<TC>(P, xs, t0);

	/* items (j, si): local tile j (tile blockIdx.x + j * gridDim.x), step kp + si * wk */
	const int my_steps = (P.nsteps - kp + P.wk - 1) / P.wk; /* >= 1: the host keeps wk <= nsteps */
	const int64_t my_tiles = blockIdx.x < P.n_tiles ? (P.n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
	const int64_t n_items = my_tiles * my_steps;
	gb_loader L = {0, 0, 0, n_items, my_steps, tile_rows, wr * GB_RB, kp};
	uint4 wa[GB_RB], wb[GB_RB];
	gb_load_next(P, L, lane, wa); /* in flight while x is staged */
	gb_load_next(P, L, lane, wb);
	__syncthreads();

	float acc[GB_RB][TC];
#pragma unroll
	for (int i = 0; i < GB_RB; i++)
#pragma unroll
		for (int t = 0; t < TC; t++)
			acc[i][t] = 0.f;
	int64_t j = 0; /* the math's tile and step */
	int si = 0;
	for (int64_t n = 0; n < n_items; n += 2) {
		GB_ITEM(wa);
		if (n + 1 >= n_items)
			break;
		GB_ITEM(wb);
	}
	if (P.wk == 1)
		return;
	/* wk > 1: the K parts of each row meet here, k part ascending. */
	__syncthreads();
	const int per_tile = nwr * GB_RB * TC;
	for (int64_t q = threadIdx.x; q < my_tiles * per_tile; q += GB_THREADS) {
		const int64_t jt = q / per_tile;
		const int rem = (int)(q - jt * per_tile), g = rem / (GB_RB * TC), r = rem - g * (GB_RB * TC);
		const int i = r / TC, t = r - i * TC;
		float sum = 0.f;
		for (int kq = 0; kq < P.wk; kq++) /* warp g * wk + kq holds k part kq of row group g */
			sum += red[(jt * GB_WARPS + g * P.wk + kq) * (GB_RB * TC) + r];
		const int64_t o = ((int64_t)blockIdx.x + jt * gridDim.x) * tile_rows + g * GB_RB + i, tg = t0 + t;
		if (o < P.out && tg < P.T)
			kq_store(P.y, P.y_dt, tg * P.ldy + o, sum);
	}
}
#undef GB_ITEM

/* ---- host side ---- */

/* Per device and instantiation: the dynamic shared memory allowed so far
 * (raised once to the largest size asked, so that the warm-up steps before a
 * graph capture set it and the captured ones do not) and the resident CTAs
 * per SM at the last size asked (a step asks the same few sizes again and
 * again). */
struct gb_dev_state {
	int attr;    /* bytes allowed beyond the default 48 KiB; 0: not raised */
	size_t smem; /* the occupancy below is for this size */
	int n;
};
static gb_dev_state gb_dev[64][4];

/* The state of instantiation TC on the current device (NULL: unknown device). */
template <int TC>
static gb_dev_state *gb_state(void)
{
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return dev >= 0 && dev < 64 ? &gb_dev[dev][TC == 1 ? 0 : TC == 2 ? 1 : TC == 4 ? 2 : 3] : NULL;
}

/* Allow smem bytes of dynamic shared memory, then the resident CTAs per SM (>= 1). */
template <int TC>
static cudaError_t gb_prepare(size_t smem, int *per_sm)
{
	gb_dev_state *d = gb_state<TC>();
	if (smem > 48 * 1024 && (!d || (size_t)d->attr < smem)) {
		/* Idempotent and never a stream operation. */
		cudaError_t ce = cudaFuncSetAttribute(linear_gemv_bf16_kernel<TC>,
						      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
		if (ce != cudaSuccess)
			return ce;
		if (d)
			d->attr = (int)smem;
	}
	if (d && d->smem == smem && d->n > 0) {
		*per_sm = d->n;
		return cudaSuccess;
	}
	int n = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, linear_gemv_bf16_kernel<TC>, GB_THREADS, smem) !=
		    cudaSuccess ||
	    n < 1) {
		cudaGetLastError();
		n = 1;
	}
	if (d) {
		d->smem = smem;
		d->n = n;
	}
	*per_sm = n;
	return cudaSuccess;
}

template <int TC>
static cudaError_t gb_launch(gb_params P, int64_t n_chunks, cudaStream_t stream)
{
	const size_t smem = (size_t)TC * P.in_pad * sizeof(float) + GB_RED_BYTES;
	int per_sm = 1;
	cudaError_t ce = gb_prepare<TC>(smem, &per_sm);
	if (ce != cudaSuccess)
		return ce;
	const int64_t target = (int64_t)kern_device_sm_count() * per_sm; /* one wave */
	/* Warps along K: as few as give the wave a tile per CTA (fewer partial
	 * sums), at most the number of K steps. */
	int wk = 1;
	while (wk < GB_WARPS && 2 * wk <= P.nsteps &&
	       (P.out + GB_RB * (GB_WARPS / wk) - 1) / (GB_RB * (GB_WARPS / wk)) * n_chunks < target)
		wk *= 2;
	P.wk = wk;
	const int64_t tile_rows = GB_RB * (GB_WARPS / wk);
	P.n_tiles = (P.out + tile_rows - 1) / tile_rows;
	int64_t ctas = target / n_chunks;
	if (ctas < 1)
		ctas = 1;
	if (ctas > P.n_tiles)
		ctas = P.n_tiles;
	if (wk > 1 && (P.n_tiles + ctas - 1) / ctas > GB_RED_TILES) /* the parked sums fit red */
		ctas = (P.n_tiles + GB_RED_TILES - 1) / GB_RED_TILES;
	if (ctas > 0x7FFFFFFF || n_chunks > 65535)
		return cudaErrorInvalidConfiguration;
	linear_gemv_bf16_kernel<TC><<<dim3((unsigned)ctas, (unsigned)n_chunks), GB_THREADS, smem, stream>>>(P);
	return cudaGetLastError();
}

extern "C" enum status kern_linear_gemv_bf16_cuda(const struct kern_linear_args *a)
{
	int64_t ldx, ldy;
	const enum status st = kern_linear_bf16__check(a, 8, KERN_LINEAR_GEMV_BF16_MAX_IN, &ldx, &ldy);
	if (st || a->n_tokens == 0)
		return st;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	gb_params P = {};
	P.x = a->x;
	P.y = a->y;
	P.w = (const uint16_t *)a->w->data;
	P.T = T;
	P.in = in;
	P.out = out;
	P.ldx = ldx;
	P.ldy = ldy;
	P.x_dt = a->x_dtype == KERN_DT_BF16;
	P.y_dt = a->y_dtype == KERN_DT_BF16;
	P.in_pad = (int)((in + GB_STEP - 1) / GB_STEP * GB_STEP);
	P.nsteps = P.in_pad / GB_STEP;
	/* Tokens per CTA: enough for T, as many as fit GB_X_BYTES (in <= 16384:
	 * one token always fits). */
	int tc = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : GB_MAX_TC;
	while (tc > 1 && (size_t)tc * P.in_pad * sizeof(float) > GB_X_BYTES)
		tc /= 2;
	const int64_t n_chunks = (T + tc - 1) / tc;
	cudaStream_t s = (cudaStream_t)a->stream;
	cudaError_t ce;
	switch (tc) {
	case 1: ce = gb_launch<1>(P, n_chunks, s); break;
	case 2: ce = gb_launch<2>(P, n_chunks, s); break;
	case 4: ce = gb_launch<4>(P, n_chunks, s); break;
	default: ce = gb_launch<GB_MAX_TC>(P, n_chunks, s); break;
	}
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_linear_gemv_bf16_cuda_host(const struct kern_linear_args *a)
{
	if (a->w && a->w->fmt != KERN_WFMT_BF16)
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_gemv_bf16_cuda, 0);
}
