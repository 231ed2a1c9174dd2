/*
 * kernels/moe_gemm/moe_decode_mma.cu: the kernels of variant
 * moe_decode_cuda_mma of op moe_decode (moe_decode.h; host side in
 * moe_decode.cu, the steps both variants share in moe_decode.cuh): the passes
 * of moe_decode_fma.cu on bf16 mma.sync, cc >= 8.0, in every image.
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
 * slot is. The NVFP4 global scale multiplies the sums.
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

#define MM_WARPS 4
#define MM_NT (MM_WARPS * 32)
#define MM_S 4                  /* 64-byte steps per load batch */
#define MM_OUT0 (MM_WARPS * 8)  /* pass 0 outputs per item */
#define MM_OUT1 (MM_WARPS * 16) /* pass 1 outputs per item: the combine's chunk */

static_assert(MM_OUT1 % MD_CHUNK == 0, "the counters are sized for 32-column chunks");

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

	if (warp == 0)
		md_scan_experts<RC>(p, lane, s_pref, s_off);
	__syncthreads();

	const int per = MODE == 0 ? MM_OUT0 : MM_OUT1;
	const int64_t n_chunks = (out + per - 1) / per;
	const int64_t n_items = (int64_t)s_pref[E] * n_chunks;

	for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
		const md_item it = md_item_at<RC>(s_pref, s_off, E, n_chunks, item);
		const int64_t xc = it.xc;
		const int e = it.e, r0 = it.r0, nr = it.nr;

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
		md_stage_rows<MODE, MM_WARPS>(p, xs, ld, r0, nr, warp, lane);
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
				if (r < nr && ok[0])
					md_swiglu_store(p, r0 + r, o[0], d[cc] * gsc[0], d[2 + cc] * gsc[1]);
			}
		} else {
#pragma unroll
			for (int cc = 0; cc < 2; cc++) {
				const int r = 2 * t4 + cc;
#pragma unroll
				for (int rr = 0; rr < 2; rr++)
					if (r < nr && ok[rr])
						md_store_y(p, r0 + r, o[rr], d[2 * rr + cc] * gsc[rr]);
			}
			md_combine<MM_OUT1, MM_NT>(p, s_flag, tid, r0, nr, n_chunks, xc);
		}
	}

	md_finish<MODE, MM_NT>(p, tid);
}

/* ---- the family as moe_decode.cu drives it ---- */

const struct md_pass_kind kern__moe_decode_mma = {
	{{mm_kernel<0, 1>, mm_kernel<0, 2>, mm_kernel<0, 4>, mm_kernel<0, 8>},
	 {mm_kernel<1, 1>, mm_kernel<1, 2>, mm_kernel<1, 4>, mm_kernel<1, 8>}},
	MM_NT,
	MM_OUT0,
	MM_OUT1,
	mm_stage_bytes,
};
