/*
 * kernels/linear/linear_mma_bf16w.cu: the portable tensor-core linear for
 * bf16 weights (variant linear_mma_bf16w, linear_bf16.h), for every
 * cc >= 8.0: the lm_head over many prompt rows, and any bf16 linear of a
 * prefill-sized step.
 *
 * y[r, o] = Σ_k x[r, k] · w[o, k] with mma.sync m16n8k16 bf16 x bf16 -> f32.
 * The reference keeps x in f32 (it never rounds activations to bf16 for a
 * bf16 weight), so each f32 activation is split into three bf16 terms:
 * hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid). The two
 * differences are exact in f32 and lo is exact in bf16 (hi and mid take 8
 * significant bits each, x has 24), so hi + mid + lo == x for every x above
 * 2^-110 in magnitude; each term times a bf16 weight is exact in the MMA's
 * f32 accumulation. The result is the reference's up to summation order
 * (and the tensor core's accumulation rounding). Most activations need all
 * three; those that are bf16 values (bf16 x, or x rounded to bf16 upstream)
 * have mid = lo = 0, and a K tile whose 64 rows have no non-zero mid (lo)
 * skips the second (third) MMA: a bf16-exact input costs one MMA per
 * fragment, an arbitrary f32 input three.
 *
 * One block of 8 warps per (64 rows, 128 outputs) tile, warps 2 (rows) x 4
 * (outputs) of 32 x 32, the fragment layout of mma_gemm.cuh (whose cp.async,
 * ldmatrix and MMA wrappers it uses). Per K tile of 32 columns, a 3-stage
 * pipeline:
 *   - weights [128 outputs x 32] by cp.async straight into shared memory
 *     (rows past out zero-filled);
 *   - activations [64 rows x 32] loaded into registers one stage ahead,
 *     split into the three terms and stored as three bf16 tiles, with a
 *     per-warp flag of which terms are non-zero (rows past the call's rows
 *     are zeros);
 *   - two k16 steps: ldmatrix of the B fragments (once) and of each needed
 *     A term, 8 MMAs per term, into sums that start from zero per K tile and
 *     are added to the f32 accumulators with ordinary (round-to-nearest)
 *     adds, so the tensor core's truncating accumulation spans 32 K only.
 * Blocks are rastered in groups of MB_GROUP row tiles (the output tiles of a
 * group's rows run before the next group's), so the weights stream from
 * memory about rows / (64 * MB_GROUP) times and the activations stay in L2.
 * Shape limits (the guard's): in % 32 == 0 (no K tail; 16-byte aligned
 * weight rows), any out, any row count up to 2^31 (the grid is 1-D).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/linear/linear_bf16.h"
}
#include "kernels/linear/mma_gemm.cuh"

#define MB_BM 64       /* rows per block */
#define MB_BN 128      /* outputs per block */
#define MB_BK 32       /* K per pipeline stage */
#define MB_NT 256      /* 8 warps: 2 (rows) x 4 (outputs), 32 x 32 each */
#define MB_STAGES 3
#define MB_GROUP 16    /* row tiles per raster group */
#define MB_STRIDE (MB_BK * 2 + 16)                    /* bytes per smem row: ldmatrix conflict-free */
#define MB_A_BYTES (MB_BM * MB_STRIDE)                /* one activation term tile */
#define MB_B_OFF (3 * MB_A_BYTES)
#define MB_FLAG_OFF (MB_B_OFF + MB_BN * MB_STRIDE)    /* int [8]: each warp's non-zero terms */
#define MB_STAGE_BYTES (MB_FLAG_OFF + 8 * 4)
#define MB_SMEM (MB_STAGES * MB_STAGE_BYTES)

struct mb_params {
	const void *x;
	int x_dt;      /* 1 = bf16 */
	int vec;       /* f32 x 16-byte aligned with ldx % 4 == 0: float4 loads */
	int64_t ldx;
	const uint16_t *w;
	void *y;
	int y_dt;
	int64_t ldy;
	int64_t T, in, out;
	int64_t n_rt, n_ct; /* row tiles, output tiles */
};

/* The split of one value: bf16 bits of hi, mid, lo. */
static __device__ __forceinline__ void mb_split(float v, uint32_t &h, uint32_t &m, uint32_t &l)
{
	const __nv_bfloat16 bh = __float2bfloat16_rn(v);
	const float fh = __bfloat162float(bh);
	const float r1 = isinf(fh) ? 0.f : v - fh; /* inf - inf would turn an infinite x into NaN */
	const __nv_bfloat16 bm = __float2bfloat16_rn(r1);
	const float r2 = r1 - __bfloat162float(bm);
	const __nv_bfloat16 bl = __float2bfloat16_rn(r2);
	h = __bfloat16_as_ushort(bh);
	m = __bfloat16_as_ushort(bm);
	l = __bfloat16_as_ushort(bl);
}

/* This thread's 2 x 4 activations of K tile kb: rows r0 + tid / 8 + 32 i,
 * columns kb * 32 + (tid % 8) * 4 .. + 3 (zeros past T). */
static __device__ __forceinline__ void mb_load_a(const mb_params &P, int64_t r0, int64_t kb, float (&v)[2][4])
{
	const int tid = threadIdx.x;
	const int64_t k = kb * MB_BK + (tid & 7) * 4;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int64_t r = r0 + (tid >> 3) + 32 * i;
		if (r >= P.T) {
			v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
		} else if (P.vec) {
			const float4 f = *(const float4 *)((const float *)P.x + r * P.ldx + k);
			v[i][0] = f.x, v[i][1] = f.y, v[i][2] = f.z, v[i][3] = f.w;
		} else {
#pragma unroll
			for (int e = 0; e < 4; e++)
				v[i][e] = kq_load(P.x, P.x_dt, r * P.ldx + k + e);
		}
	}
}

/* Split v into the three term tiles of stage base and set this warp's flag
 * (bit 0: some mid != 0, bit 1: some lo != 0). */
static __device__ __forceinline__ void mb_store_a(uint8_t *base, const float (&v)[2][4])
{
	const int tid = threadIdx.x;
	uint32_t nz = 0;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		uint32_t h[4], m[4], l[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			mb_split(v[i][e], h[e], m[e], l[e]);
			nz |= ((m[e] & 0x7FFFu) != 0) | (((l[e] & 0x7FFFu) != 0) << 1);
		}
		const int off = ((tid >> 3) + 32 * i) * MB_STRIDE + (tid & 7) * 8;
		*(uint2 *)(base + off) = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
		*(uint2 *)(base + MB_A_BYTES + off) = make_uint2(m[0] | (m[1] << 16), m[2] | (m[3] << 16));
		*(uint2 *)(base + 2 * MB_A_BYTES + off) = make_uint2(l[0] | (l[1] << 16), l[2] | (l[3] << 16));
	}
	nz = __reduce_or_sync(0xFFFFFFFFu, nz);
	if ((tid & 31) == 0)
		((int *)(base + MB_FLAG_OFF))[tid >> 5] = (int)nz;
}

/* cp.async of this thread's two 16-byte chunks of the weight tile (outputs
 * n0 + tid / 4 + 64 i, columns kb * 32 + (tid % 4) * 8 .. + 7). */
static __device__ __forceinline__ void mb_load_b(const mb_params &P, uint8_t *base, int64_t n0, int64_t kb)
{
	const int tid = threadIdx.x;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int row = (tid >> 2) + 64 * i;
		const bool ok = n0 + row < P.out;
		const uint16_t *src = ok ? P.w + (n0 + row) * P.in + kb * MB_BK + (tid & 3) * 8 : P.w;
		mg_cp16(base + MB_B_OFF + row * MB_STRIDE + (tid & 3) * 16, src, ok);
	}
}

/* A warp's C fragments: d += s, or d = 0 when s is NULL. */
static __device__ __forceinline__ void mb_frag_acc(float (&d)[2][4][4], const float (*s)[4][4])
{
#pragma unroll
	for (int mt = 0; mt < 2; mt++)
#pragma unroll
		for (int nt = 0; nt < 4; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				d[mt][nt][i] = s ? d[mt][nt][i] + s[mt][nt][i] : 0.f;
}

__global__ void __launch_bounds__(MB_NT) linear_mma_bf16w_kernel(const mb_params P)
{
	extern __shared__ __align__(16) uint8_t mb_smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, tig = lane & 3;
	const int wm = warp >> 2, wn = warp & 3;

	/* Raster: groups of MB_GROUP row tiles; inside one, row tile fastest. */
	const int64_t L = blockIdx.x, per_group = MB_GROUP * P.n_ct;
	const int64_t grp = L / per_group, first = grp * MB_GROUP, local = L - grp * per_group;
	const int64_t gm = min((int64_t)MB_GROUP, P.n_rt - first);
	const int64_t r0 = (first + local % gm) * MB_BM, n0 = (local / gm) * MB_BN;
	const int64_t nkb = P.in / MB_BK;

	float acc[2][4][4];
	mb_frag_acc(acc, NULL);

	float av[2][4];
#pragma unroll
	for (int s = 0; s < MB_STAGES - 1; s++) {
		if (s < nkb) {
			uint8_t *base = mb_smem + s * MB_STAGE_BYTES;
			mb_load_b(P, base, n0, s);
			mb_load_a(P, r0, s, av);
			mb_store_a(base, av);
		}
		mg_commit();
	}

	/* ldmatrix rows: A rows of the warp's m16 tiles (lanes 16..31 the upper
	 * 8 K), B rows of two n8 tiles per x4 (lanes 8..15 / 24..31 the upper 8 K). */
	const int a_row = wm * 32 + (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
	const int b_row = wn * 32 + (lane >> 4) * 8 + (lane & 7), b_hi = (lane >> 3) & 1;

	for (int64_t kb = 0; kb < nkb; kb++) {
		mg_wait<MB_STAGES - 2>();
		__syncthreads(); /* stage kb landed (cp.async and the A stores); stage kb - 1 is free */
		const int64_t kn = kb + MB_STAGES - 1;
		uint8_t *nbase = mb_smem + (kn % MB_STAGES) * MB_STAGE_BYTES;
		if (kn < nkb) {
			mb_load_b(P, nbase, n0, kn);
			mb_load_a(P, r0, kn, av); /* in flight during the MMAs below */
		}
		mg_commit();

		const uint8_t *base = mb_smem + (kb % MB_STAGES) * MB_STAGE_BYTES;
		const int *fl = (const int *)(base + MB_FLAG_OFF);
		const int nz = fl[0] | fl[1] | fl[2] | fl[3] | fl[4] | fl[5] | fl[6] | fl[7];
		const int terms = nz & 2 ? 3 : nz & 1 ? 2 : 1; /* uniform over the block */
		/* The tile's sums start from zero and are added to acc in f32 (RN): the
		 * tensor core's own accumulation (truncating) spans 32 K, not all of K. */
		float part[2][4][4];
		mb_frag_acc(part, NULL);
#pragma unroll
		for (int ks = 0; ks < MB_BK / 16; ks++) {
			uint32_t b[2][4];
#pragma unroll
			for (int np = 0; np < 2; np++)
				mg_ldsm4(b[np], base + MB_B_OFF + (b_row + np * 16) * MB_STRIDE + (ks * 16 + b_hi * 8) * 2);
#pragma unroll
			for (int p = 0; p < 3; p++) {
				if (p >= terms)
					break;
				uint32_t a[2][4];
#pragma unroll
				for (int mt = 0; mt < 2; mt++)
					mg_ldsm4(a[mt], base + p * MB_A_BYTES + (a_row + mt * 16) * MB_STRIDE +
								(ks * 16 + a_hi * 8) * 2);
#pragma unroll
				for (int mt = 0; mt < 2; mt++)
#pragma unroll
					for (int nt = 0; nt < 4; nt++)
						mg_mma_bf16(part[mt][nt], a[mt], b[nt >> 1][(nt & 1) * 2],
							    b[nt >> 1][(nt & 1) * 2 + 1]);
			}
		}
		mb_frag_acc(acc, part);
		if (kn < nkb)
			mb_store_a(nbase, av); /* slot kn % STAGES was last read in iteration kb - 1 */
	}
	mg_wait<0>();

#pragma unroll
	for (int mt = 0; mt < 2; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int64_t r = r0 + wm * 32 + mt * 16 + g + (i >= 2 ? 8 : 0);
			if (r >= P.T)
				continue;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				const int64_t o = n0 + wn * 32 + nt * 8 + 2 * tig + (i & 1);
				if (o < P.out)
					kq_store(P.y, P.y_dt, r * P.ldy + o, acc[mt][nt][i]);
			}
		}
}

extern "C" enum status kern_linear_mma_bf16w(const struct kern_linear_args *a)
{
	int64_t ldx, ldy;
	const enum status st = kern_linear_bf16__check(a, MB_BK, INT64_MAX, &ldx, &ldy);
	if (st || a->n_tokens == 0)
		return st;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	mb_params P = {};
	P.x = a->x;
	P.x_dt = a->x_dtype == KERN_DT_BF16;
	P.vec = !P.x_dt && (uintptr_t)a->x % 16 == 0 && ldx % 4 == 0;
	P.ldx = ldx;
	P.w = (const uint16_t *)a->w->data;
	P.y = a->y;
	P.y_dt = a->y_dtype == KERN_DT_BF16;
	P.ldy = ldy;
	P.T = T;
	P.in = in;
	P.out = out;
	P.n_rt = (T + MB_BM - 1) / MB_BM;
	P.n_ct = (out + MB_BN - 1) / MB_BN;
	const int64_t blocks = P.n_rt * P.n_ct;
	if (blocks > 0x7FFFFFFF)
		return ST_INVALID;
	cudaStream_t s = (cudaStream_t)a->stream;
	/* Raise the kernel's shared memory once per device (the first call, a
	 * warm-up step before any graph capture); never a stream operation. */
	static bool raised[64];
	int dev = -1;
	cudaError_t ce = cudaGetDevice(&dev);
	if (ce == cudaSuccess && (dev < 0 || dev >= 64 || !raised[dev])) {
		ce = cudaFuncSetAttribute(linear_mma_bf16w_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MB_SMEM);
		if (ce == cudaSuccess && dev >= 0 && dev < 64)
			raised[dev] = true;
	}
	if (ce == cudaSuccess) {
		linear_mma_bf16w_kernel<<<(unsigned)blocks, MB_NT, MB_SMEM, s>>>(P);
		ce = cudaGetLastError();
	}
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_linear_mma_bf16w_host(const struct kern_linear_args *a)
{
	if (a->w && a->w->fmt != KERN_WFMT_BF16)
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_mma_bf16w, 0);
}
