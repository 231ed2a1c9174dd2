/*
 * kernels/indexer/indexer_generic.cu: portable CUDA lightning indexer for
 * every cc >= 8.0 (variants indexer_rotate_cuda_generic,
 * indexer_scores_cuda_generic, indexer_topk_cuda_generic; contracts in
 * indexer.h).
 *
 *   rotate_kernel  one block per row, the row in shared memory: the
 *                  reference's butterflies stage by stage (the same adds in
 *                  the same order, so bit-identical), the n^-0.5 scale, then
 *                  one thread per FP4 block does the ue8m0 qdq exactly as
 *                  lowp_sim.h.
 *   scores         one 256-thread block per token; each warp takes an entry
 *                  w and loops over the heads in order (a warp-shuffle dot
 *                  per head, then the ReLU·ω accumulation in the reference's
 *                  order, with its bf16 roundings under bf16_scores). Only
 *                  the dot products' summation order differs.
 *   topk           one block per token: scores cached (shared memory, work,
 *                  or recomputed, see indexer_generic.h), then top_k rounds
 *                  of a block arg-max in the order (score desc, w asc) below
 *                  the previous pick: the reference's selection, so equal
 *                  scores give equal lists.
 * Entries whose key row is outside the pool score -inf (the reference
 * returns ST_INVALID for them). Invalid q_off / start_pos are not detected.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/indexer/indexer_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

#define IDX_NT 256
#define IDX_NW (IDX_NT / 32)
#define IDX_SMEM_SCORES 8192

/* ---- Hadamard + FP4 ---- */

__global__ void rotate_kernel(float *x, int dim, int fp4_block, float sc)
{
	extern __shared__ float v[];
	float *xr = x + (int64_t)blockIdx.x * dim;
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		v[i] = xr[i];
	__syncthreads();
	for (int h = 1; h < dim; h *= 2) {
		for (int k = threadIdx.x; k < dim / 2; k += blockDim.x) {
			int j = (k / h) * 2 * h + (k % h);
			float a = v[j], b = v[j + h];
			v[j] = __fadd_rn(a, b);
			v[j + h] = __fsub_rn(a, b);
		}
		__syncthreads();
	}
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		v[i] = __fmul_rn(v[i], sc);
	__syncthreads();
	if (fp4_block > 0) {
		for (int b0 = threadIdx.x * fp4_block; b0 < dim; b0 += blockDim.x * fp4_block)
			kd_fp4_qdq_block(v + b0, dim - b0 < fp4_block ? dim - b0 : fp4_block);
		__syncthreads();
	}
	for (int i = threadIdx.x; i < dim; i += blockDim.x)
		xr[i] = v[i];
}

extern "C" enum status kern_indexer_rotate_cuda_generic(const struct kern_indexer_rotate_args *a)
{
	if (!a || a->fp4_block < 0 || a->dim <= 0 || (a->dim & (a->dim - 1)) || a->n_rows < 0 ||
	    (a->n_rows > 0 && !a->x))
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	if ((size_t)a->dim * sizeof(float) > 48 * 1024 || a->n_rows > 0x7fffffffLL)
		return ST_UNSUPPORTED;
	float sc = 1.0f / sqrtf((float)a->dim);
	int nt = a->dim / 2 < 256 ? (a->dim / 2 < 32 ? 32 : a->dim / 2) : 256;
	rotate_kernel<<<(unsigned)a->n_rows, nt, a->dim * sizeof(float), (cudaStream_t)a->stream>>>(a->x, a->dim,
												      a->fp4_block, sc);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

/* ---- scores ---- */

struct idx_p {
	const float *q, *head_w, *keys;
	float weight_scale;
	bool bf16;
	int64_t n_key_rows;
	int n_seqs;
	const int32_t *q_off, *start_pos;
	const int64_t *key_row0;
	kern_rowmap_paged pg;
	int ratio, H, D, top_k;
};

static __device__ __forceinline__ int64_t rowmap_d(const int64_t *row0, const kern_rowmap_paged &pg, int s, int64_t w)
{
	if (!pg.block_table)
		return row0 && row0[s] >= 0 ? row0[s] + w : -1;
	if (pg.per_block <= 0 || w < 0 || w / pg.per_block >= pg.bt_stride)
		return -1;
	int32_t blk = pg.block_table[(int64_t)s * pg.bt_stride + w / pg.per_block];
	return blk < 0 ? -1 : (int64_t)blk * pg.per_block + w % pg.per_block;
}

/* Score of (token tok, entry w) by one full warp (every lane gets it). */
static __device__ float score_warp(const idx_p &p, int64_t tok, int s, int64_t w)
{
	int64_t r = rowmap_d(p.key_row0, p.pg, s, w);
	if (r < 0 || r >= p.n_key_rows)
		return -INFINITY;
	const float *k = p.keys + r * p.D;
	const int lane = threadIdx.x & 31;
	float acc = 0.f;
	for (int h = 0; h < p.H; h++) {
		const float *q = p.q + (tok * p.H + h) * p.D;
		float dot = 0.f;
		for (int c = lane; c < p.D; c += 32)
			dot = fmaf(q[c], k[c], dot);
		dot = kd_warp_sum(dot);
		float wv = p.head_w[tok * p.H + h];
		if (p.bf16) {
			dot = kd_bf16_round(dot);
			acc = __fadd_rn(acc, kd_bf16_round(__fmul_rn(dot > 0 ? dot : 0.f,
								      kd_bf16_round(__fmul_rn(wv, p.weight_scale)))));
		} else {
			acc = __fadd_rn(acc, __fmul_rn(wv, dot > 0 ? dot : 0.f));
		}
	}
	return p.bf16 ? kd_bf16_round(acc) : __fmul_rn(acc, p.weight_scale);
}

/* The same by one thread (the recompute fallback of top-k). */
static __device__ float score_thread(const idx_p &p, int64_t tok, int s, int64_t w)
{
	int64_t r = rowmap_d(p.key_row0, p.pg, s, w);
	if (r < 0 || r >= p.n_key_rows)
		return -INFINITY;
	const float *k = p.keys + r * p.D;
	float acc = 0.f;
	for (int h = 0; h < p.H; h++) {
		const float *q = p.q + (tok * p.H + h) * p.D;
		float dot = 0.f;
		for (int c = 0; c < p.D; c++)
			dot = fmaf(q[c], k[c], dot);
		float wv = p.head_w[tok * p.H + h];
		if (p.bf16) {
			dot = kd_bf16_round(dot);
			acc = __fadd_rn(acc, kd_bf16_round(__fmul_rn(dot > 0 ? dot : 0.f,
								      kd_bf16_round(__fmul_rn(wv, p.weight_scale)))));
		} else {
			acc = __fadd_rn(acc, __fmul_rn(wv, dot > 0 ? dot : 0.f));
		}
	}
	return p.bf16 ? kd_bf16_round(acc) : __fmul_rn(acc, p.weight_scale);
}

__global__ void __launch_bounds__(IDX_NT) scores_kernel(idx_p p, float *score_out, int64_t score_stride)
{
	const int64_t i = blockIdx.x;
	const int s = kd_seq_of(p.q_off, p.n_seqs, i);
	const int64_t t = p.start_pos[s] + (i - p.q_off[s]);
	const int64_t n_vis = (t + 1) / p.ratio;
	float *row = score_out + i * score_stride;
	const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
	for (int64_t w = wid; w < score_stride; w += IDX_NW) {
		float v = w < n_vis ? score_warp(p, i, s, w) : -INFINITY;
		if (lane == 0)
			row[w] = v;
	}
}

static enum status fill_p(const struct kern_indexer_topk_args *a, idx_p *p)
{
	p->q = a->q;
	p->head_w = a->head_w;
	p->keys = a->keys;
	p->weight_scale = a->weight_scale;
	p->bf16 = a->bf16_scores;
	p->n_key_rows = a->n_key_rows;
	p->n_seqs = a->n_seqs;
	p->q_off = a->q_off;
	p->start_pos = a->start_pos;
	p->key_row0 = a->key_row0;
	p->pg = a->key_paged;
	p->ratio = a->ratio;
	p->H = a->n_heads;
	p->D = a->head_dim;
	p->top_k = a->top_k;
	if (!a->q_off || !a->start_pos || a->n_seqs <= 0)
		return ST_INVALID;
	return a->n_tokens > 0x7fffffffLL ? ST_UNSUPPORTED : ST_OK;
}

extern "C" enum status kern_indexer_scores_cuda_generic(const struct kern_indexer_topk_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->n_heads <= 0 || a->head_dim <= 0 ||
	    a->score_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->score_out || !a->q || !a->head_w || (!a->key_row0 && !a->key_paged.block_table) ||
	    (a->n_key_rows > 0 && !a->keys))
		return ST_INVALID;
	idx_p p;
	enum status st = fill_p(a, &p);
	if (st)
		return st;
	if (a->score_stride == 0)
		return ST_OK;
	scores_kernel<<<(unsigned)a->n_tokens, IDX_NT, 0, (cudaStream_t)a->stream>>>(p, a->score_out, a->score_stride);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

/* ---- top-k ---- */

/* (s, w) first in the order score desc, w asc; w < 0 = none. */
static __device__ __forceinline__ bool before(float s, int64_t w, float bs, int64_t bw)
{
	return w >= 0 && (bw < 0 || s > bs || (s == bs && w < bw));
}

__global__ void __launch_bounds__(IDX_NT) topk_kernel(idx_p p, const float *scores_in, int64_t score_stride,
						       float *work, int64_t work_row, int64_t cache_cap, int32_t *topk,
						       float *scores_out, int32_t *topk_len)
{
	extern __shared__ float cache_sh[]; /* [cache_cap] */
	__shared__ float rs[IDX_NW];
	__shared__ long long rw[IDX_NW];
	__shared__ float prev_s_sh;
	__shared__ long long prev_w_sh;
	const int64_t i = blockIdx.x;
	const int s = kd_seq_of(p.q_off, p.n_seqs, i);
	const int64_t t = p.start_pos[s] + (i - p.q_off[s]);
	const int64_t n_vis = (t + 1) / p.ratio;
	const int n_out = n_vis < p.top_k ? (int)n_vis : p.top_k;
	const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
	/* where the scores are: given, cached (shared or work), or recomputed */
	const float *sc = NULL;
	if (scores_in) {
		sc = scores_in + i * score_stride;
	} else if (n_vis <= cache_cap || (work && n_vis <= work_row)) {
		float *c = n_vis <= cache_cap ? cache_sh : work + i * work_row;
		for (int64_t w = wid; w < n_vis; w += IDX_NW) {
			float v = score_warp(p, i, s, w);
			if (lane == 0)
				c[w] = v;
		}
		__syncthreads();
		sc = c;
	}
	float prev_s = INFINITY;
	int64_t prev_w = -1;
	for (int j = 0; j < n_out; j++) {
		float bs = -INFINITY;
		int64_t bw = -1;
		for (int64_t w = threadIdx.x; w < n_vis; w += IDX_NT) {
			float v = sc ? sc[w] : score_thread(p, i, s, w);
			bool after_prev = v < prev_s || (v == prev_s && w > prev_w);
			if (after_prev && before(v, w, bs, bw)) {
				bs = v;
				bw = w;
			}
		}
		for (int o = 16; o > 0; o >>= 1) {
			float s2 = __shfl_xor_sync(0xffffffffu, bs, o);
			long long w2 = __shfl_xor_sync(0xffffffffu, (long long)bw, o);
			if (before(s2, w2, bs, bw)) {
				bs = s2;
				bw = w2;
			}
		}
		if (lane == 0) {
			rs[wid] = bs;
			rw[wid] = bw;
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			float b = -INFINITY;
			int64_t bi = -1;
			for (int w = 0; w < IDX_NW; w++)
				if (before(rs[w], rw[w], b, bi)) {
					b = rs[w];
					bi = rw[w];
				}
			topk[i * p.top_k + j] = (int32_t)bi;
			if (scores_out)
				scores_out[i * p.top_k + j] = b;
			prev_s_sh = b;
			prev_w_sh = bi;
		}
		__syncthreads();
		prev_s = prev_s_sh;
		prev_w = prev_w_sh;
	}
	for (int j = n_out + threadIdx.x; j < p.top_k; j += IDX_NT) {
		topk[i * p.top_k + j] = -1;
		if (scores_out)
			scores_out[i * p.top_k + j] = -INFINITY;
	}
	if (topk_len && threadIdx.x == 0)
		topk_len[i] = n_out;
}

extern "C" enum status kern_indexer_topk_cuda_generic(const struct kern_indexer_topk_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->top_k <= 0 ||
	    (!a->scores_in && (a->n_heads <= 0 || a->head_dim <= 0)))
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->topk || (!a->scores_in && (!a->q || !a->head_w || (!a->key_row0 && !a->key_paged.block_table) ||
					   (a->n_key_rows > 0 && !a->keys))))
		return ST_INVALID;
	idx_p p;
	enum status st = fill_p(a, &p);
	if (st)
		return st;
	int64_t work_row = a->work ? a->work_len / a->n_tokens : 0;
	/* The shared-memory score cache: 8192 entries, or as many as work_len
	 * promises (#visible <= work_len by the args contract) up to the
	 * device's opt-in limit. */
	int64_t cap = 0;
	if (!a->scores_in) {
		int dev = 0, optin = 48 * 1024;
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
			optin = 48 * 1024;
		int64_t lim = (optin - 1024) / (int64_t)sizeof(float);
		cap = a->work && a->work_len > IDX_SMEM_SCORES ? a->work_len : IDX_SMEM_SCORES;
		cap = cap < lim ? cap : lim;
		size_t bytes = (size_t)cap * sizeof(float);
		if (bytes > 48 * 1024 &&
		    cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess) {
			(void)cudaGetLastError();
			cap = IDX_SMEM_SCORES;
		}
	}
	topk_kernel<<<(unsigned)a->n_tokens, IDX_NT, (size_t)cap * sizeof(float), (cudaStream_t)a->stream>>>(
		p, a->scores_in, a->score_stride, a->work, work_row, cap, a->topk, a->scores, a->topk_len);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
