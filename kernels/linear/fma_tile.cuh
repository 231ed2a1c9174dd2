/*
 * kernels/linear/fma_tile.cuh: the f32 FMA tile that the portable CUDA
 * linear (linear_generic.cu) and the portable grouped expert GEMM
 * (moe_gemm_generic.cu) are both made of, so that the two compute the same
 * way (k ascending, the CPU reference's act_quant bit for bit).
 *
 * A block of FT_NT threads owns FT_TM rows x FT_TN outputs and walks K in
 * tiles of FT_TK (one 128-column scale block). Per K tile the kernel
 *   1. stages FT_TM x FT_TK activations (ft_stage_x: 16 lanes per row, 8
 *      values each, optional FP8 act_quant over the 128-column block by a
 *      16-lane shuffle amax, pow2-ceil scale, e4m3 RNE);
 *   2. stages FT_TN x FT_TK decoded weights (4 threads per row, 32 values
 *      each: ft_stage_w_fp8 / ft_stage_w_wide, or the caller's own decoder
 *      for formats only it has, writing the same slots);
 *   3. accumulates 4 rows x 1 output per thread (ft_fma);
 * and finally writes its outputs (ft_store).
 */
#ifndef DSV4_KERNELS_LINEAR_FMA_TILE_CUH
#define DSV4_KERNELS_LINEAR_FMA_TILE_CUH

#include <stdint.h>

#include "kernels/quant/quant_cuda.cuh"

#define FT_TM 16  /* rows (tokens) per block */
#define FT_TN 64  /* outputs per block */
#define FT_TK 128 /* K per tile = one scale block */
#define FT_NT 256 /* threads per block */

struct ft_smem {
	float x[FT_TM][FT_TK + 1];
	float w[FT_TN][FT_TK + 1];
};

/* Which rows, outputs and staging slots thread tid owns. */
struct ft_lanes {
	int col, trow;  /* compute: output col, rows trow..trow+3 */
	int xr, xseg;   /* x staging: row xr, columns xseg..xseg+7 */
	int wr, wseg;   /* w staging: output row wr, columns wseg..wseg+31 */
};

static __device__ __forceinline__ struct ft_lanes ft_lanes_of(int tid)
{
	struct ft_lanes l;
	l.col = tid % FT_TN;
	l.trow = (tid / FT_TN) * 4;
	l.xr = tid / 16;
	l.xseg = (tid % 16) * 8;
	l.wr = tid / 4;
	l.wseg = (tid % 4) * 32;
	return l;
}

/* Step 1: this thread's 8 activations of K tile k0 from x row `row`
 * (element offset row * ldx; row < 0: zeros). */
static __device__ __forceinline__ void ft_stage_x(struct ft_smem *s, const struct ft_lanes *l, const void *x,
						  int x_dt, int64_t ldx, int64_t row, int64_t k0, int64_t in,
						  int act_quant)
{
	float v[8];
	float amax = 0.f;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		const int64_t k = k0 + l->xseg + i;
		v[i] = (row >= 0 && k < in) ? kq_load(x, x_dt, row * ldx + k) : 0.f;
		amax = fmaxf(amax, fabsf(v[i]));
	}
	if (act_quant) {
#pragma unroll
		for (int off = 8; off > 0; off >>= 1)
			amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
		const float sc = kq_fp8_block_scale(amax);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = kq_fp8_qdq(v[i], sc);
	}
#pragma unroll
	for (int i = 0; i < 8; i++)
		s->x[l->xr][l->xseg + i] = v[i];
}

/* Step 2, e4m3 weights [out, in] times the tile's one block scale `scale`
 * (FT_TN rows never straddle a 128-row scale block). o = output row. */
static __device__ __forceinline__ void ft_stage_w_fp8(struct ft_smem *s, const struct ft_lanes *l, const uint8_t *w,
						      float scale, int64_t o, int64_t out, int64_t k0, int64_t in)
{
#pragma unroll 4
	for (int i = 0; i < 32; i++) {
		const int64_t k = k0 + l->wseg + i;
		s->w[l->wr][l->wseg + i] = (o < out && k < in) ? kq_e4m3_to_f32(w[o * in + k]) * scale : 0.f;
	}
}

/* Step 2, unquantized weights [out, in] of dtype dt (bf16 or f32). */
static __device__ __forceinline__ void ft_stage_w_wide(struct ft_smem *s, const struct ft_lanes *l, const void *w,
						       int dt, int64_t o, int64_t out, int64_t k0, int64_t in)
{
#pragma unroll 4
	for (int i = 0; i < 32; i++) {
		const int64_t k = k0 + l->wseg + i;
		s->w[l->wr][l->wseg + i] = (o < out && k < in) ? kq_load(w, dt, o * in + k) : 0.f;
	}
}

/* Step 3: acc[i] += Σ_k x[trow + i][k] · w[col][k], k ascending. */
static __device__ __forceinline__ void ft_fma(const struct ft_smem *s, const struct ft_lanes *l, float acc[4])
{
#pragma unroll 8
	for (int k = 0; k < FT_TK; k++) {
		const float wv = s->w[l->col][k];
#pragma unroll
		for (int i = 0; i < 4; i++)
			acc[i] = fmaf(s->x[l->trow + i][k], wv, acc[i]);
	}
}

/* Writes this thread's outputs: rows row0 + trow + i below row_end, output
 * n0 + col below out. */
static __device__ __forceinline__ void ft_store(const struct ft_lanes *l, const float acc[4], void *y, int y_dt,
						int64_t ldy, int64_t row0, int64_t row_end, int64_t n0, int64_t out)
{
	const int64_t o = n0 + l->col;
	if (o >= out)
		return;
	for (int i = 0; i < 4; i++) {
		const int64_t r = row0 + l->trow + i;
		if (r < row_end)
			kq_store(y, y_dt, r * ldy + o, acc[i]);
	}
}

#endif
