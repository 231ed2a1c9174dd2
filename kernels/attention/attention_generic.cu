/*
 * kernels/attention/attention_generic.cu: portable CUDA sparse MQA attention,
 * index builders and ring writes for every cc >= 8.0 (variants
 * sparse_attn_cuda_generic, attn_index_cuda_generic, ring_write_cuda_generic;
 * contracts in attention.h).
 *
 *   sparse_attn_kernel  one 256-thread block per (token, head). q in shared
 *                       memory; each of the 8 warps takes every 8th index, a
 *                       warp-shuffle dot product per key, and keeps its own
 *                       online softmax (max, denominator, fp32 accumulator row
 *                       in shared memory); the warps are merged in a fixed
 *                       order with the sink, then the inverse rope (double
 *                       cos/sin rounded to float, as the reference) and the
 *                       optional bf16 rounding. Differs from the reference's
 *                       two-pass fp32 only in summation order. Indices outside
 *                       [0, Σ kv_rows) are skipped (the reference refuses the
 *                       call instead).
 *   attn_index_kernel   one block per token: the window part and the HCA
 *                       entries in parallel, the CSA top-k list compacted in
 *                       order by one thread; -1 fill. An entry that would not
 *                       fit idx_stride or has no row is dropped (the
 *                       reference returns ST_INVALID).
 *   ring_write_kernel   one block per token; only a sequence's last `window`
 *                       tokens are stored, so no two blocks write one slot.
 *                       A ring outside [0, n_ring_rows) is not written.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/attention/attention_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

#define ATT_NT 256
#define ATT_NW (ATT_NT / 32)

struct kv_srcs {
	const float *kv[KERN_ATTN_MAX_SRC];
	int64_t rows[KERN_ATTN_MAX_SRC];
};

__global__ void __launch_bounds__(ATT_NT) sparse_attn_kernel(const float *q, float *out, kv_srcs src, int64_t stride,
							      const int32_t *idx, const int32_t *idx_len, int idx_stride,
							      const float *sink, float scale, const int32_t *pos,
							      const float *omega, int rope_dim, int H, int d,
							      bool bf16_out)
{
	extern __shared__ float sh[]; /* q[d], acc[ATT_NW][d], o[d] */
	__shared__ float wm[ATT_NW], wl[ATT_NW];
	float *qs = sh, *acc = sh + d, *os = sh + (ATT_NW + 1) * d;
	const int64_t t = blockIdx.x / H;
	const int h = (int)(blockIdx.x % H);
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const float *qr = q + (t * H + h) * d;
	for (int c = threadIdx.x; c < d; c += ATT_NT)
		qs[c] = qr[c];
	float *aw = acc + (int64_t)wid * d;
	for (int c = lane; c < d; c += 32)
		aw[c] = 0.f;
	__syncthreads();
	const int32_t *ix = idx + t * idx_stride;
	int len = idx_len ? idx_len[t] : idx_stride;
	len = len < 0 ? 0 : (len > idx_stride ? idx_stride : len);
	int64_t total = src.rows[0] + src.rows[1] + src.rows[2];
	float m = -INFINITY, l = 0.f;
	for (int j = wid; j < len; j += ATT_NW) {
		int64_t i = ix[j];
		if (i < 0 || i >= total)
			continue;
		const float *e = NULL;
		for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
			if (i < src.rows[s]) {
				e = src.kv[s] + i * stride;
				break;
			}
			i -= src.rows[s];
		}
		float dot = 0.f;
		for (int c = lane; c < d; c += 32)
			dot = fmaf(qs[c], e[c], dot);
		dot = kd_warp_sum(dot);
		float sc = dot * scale;
		if (sc > m) {
			float r = m == -INFINITY ? 0.f : expf(m - sc);
			l *= r;
			for (int c = lane; c < d; c += 32)
				aw[c] *= r;
			m = sc;
		}
		float p = expf(sc - m);
		l += p;
		for (int c = lane; c < d; c += 32)
			aw[c] = fmaf(p, e[c], aw[c]);
	}
	if (lane == 0) {
		wm[wid] = m;
		wl[wid] = l;
	}
	__syncthreads();
	float M = sink ? sink[h] : -INFINITY;
	for (int w = 0; w < ATT_NW; w++)
		M = fmaxf(M, wm[w]);
	float den = sink && M != -INFINITY ? expf(sink[h] - M) : 0.f;
	float f[ATT_NW];
	for (int w = 0; w < ATT_NW; w++) {
		f[w] = wm[w] == -INFINITY ? 0.f : expf(wm[w] - M);
		den += wl[w] * f[w];
	}
	float inv = den > 0 ? 1.0f / den : 0.0f;
	for (int c = threadIdx.x; c < d; c += ATT_NT) {
		float v = 0.f;
		for (int w = 0; w < ATT_NW; w++)
			v += acc[(int64_t)w * d + c] * f[w];
		os[c] = v * inv;
	}
	__syncthreads();
	if (omega) {
		float tp = (float)pos[t];
		for (int i = threadIdx.x; i < rope_dim / 2; i += ATT_NT) {
			float ang = __fmul_rn(tp, omega[i]);
			float cs = (float)cos((double)ang), sn = -(float)sin((double)ang);
			float *p = os + d - rope_dim + 2 * i;
			float re = p[0], im = p[1];
			p[0] = __fsub_rn(__fmul_rn(re, cs), __fmul_rn(im, sn));
			p[1] = __fadd_rn(__fmul_rn(re, sn), __fmul_rn(im, cs));
		}
		__syncthreads();
	}
	float *o = out + (t * H + h) * d;
	for (int c = threadIdx.x; c < d; c += ATT_NT)
		o[c] = bf16_out ? kd_bf16_round(os[c]) : os[c];
}

extern "C" enum status kern_sparse_attn_cuda_generic(const struct kern_sparse_attn_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->idx_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->q || !a->out || (a->idx_stride > 0 && !a->idx))
		return ST_INVALID;
	if (a->omega && (!a->pos || a->rope_dim <= 0 || a->rope_dim % 2 || a->rope_dim > a->head_dim))
		return ST_INVALID;
	int64_t stride = a->kv_stride ? a->kv_stride : a->head_dim;
	if (stride < a->head_dim)
		return ST_INVALID;
	kv_srcs src;
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (a->kv_rows[s] < 0 || (a->kv_rows[s] > 0 && !a->kv[s]))
			return ST_INVALID;
		src.kv[s] = a->kv[s];
		src.rows[s] = a->kv_rows[s];
	}
	size_t smem = (size_t)(ATT_NW + 2) * a->head_dim * sizeof(float);
	if (smem > 48 * 1024)
		return ST_UNSUPPORTED;
	int64_t n_blocks = a->n_tokens * a->n_heads;
	if (n_blocks > 0x7fffffffLL)
		return ST_UNSUPPORTED;
	sparse_attn_kernel<<<(unsigned)n_blocks, ATT_NT, smem, (cudaStream_t)a->stream>>>(
		a->q, a->out, src, stride, a->idx, a->idx_len, a->idx_stride, a->sink, a->softmax_scale, a->pos,
		a->omega, a->rope_dim, a->n_heads, a->head_dim, a->bf16_out);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

/* ---- index sets ---- */

static __device__ __forceinline__ int64_t rowmap_d(const int64_t *row0, const kern_rowmap_paged &pg, int s, int64_t w)
{
	if (!pg.block_table)
		return row0 && row0[s] >= 0 ? row0[s] + w : -1;
	if (pg.per_block <= 0 || w < 0 || w / pg.per_block >= pg.bt_stride)
		return -1;
	int32_t blk = pg.block_table[(int64_t)s * pg.bt_stride + w / pg.per_block];
	return blk < 0 ? -1 : (int64_t)blk * pg.per_block + w % pg.per_block;
}

__global__ void attn_index_kernel(int n_seqs, const int32_t *q_off, const int32_t *start_pos, int window,
				  int64_t cur_row0, const int64_t *ring_row0, int ratio, const int64_t *cmp_row0,
				  kern_rowmap_paged pg, const int32_t *topk, int topk_stride, int32_t *idx,
				  int32_t *idx_len, int idx_stride)
{
	__shared__ int n_sh;
	const int64_t i = blockIdx.x;
	const int s = kd_seq_of(q_off, n_seqs, i);
	const int64_t sp = start_pos[s];
	const int64_t t = sp + (i - q_off[s]);
	int32_t *row = idx + i * idx_stride;
	const int64_t p0 = t - window + 1 < 0 ? 0 : t - window + 1;
	const int n_win = (int)(t - p0 + 1);
	int64_t n_vis = ratio > 0 ? (t + 1) / ratio : 0;
	int n = n_win < idx_stride ? n_win : idx_stride;
	for (int j = threadIdx.x; j < n; j += blockDim.x) {
		int64_t p = p0 + j;
		int64_t r = p >= sp ? cur_row0 + q_off[s] + (p - sp) : (ring_row0 ? ring_row0[s] + p % window : -1);
		row[j] = r < 0 || r > INT32_MAX ? -1 : (int32_t)r;
	}
	if (ratio > 0 && !topk) {
		int64_t m = n_vis < idx_stride - n ? n_vis : idx_stride - n;
		for (int64_t w = threadIdx.x; w < m; w += blockDim.x) {
			int64_t r = rowmap_d(cmp_row0, pg, s, w);
			row[n + w] = r < 0 || r > INT32_MAX ? -1 : (int32_t)r;
		}
		n += (int)m;
	} else if (ratio > 0 && threadIdx.x == 0) {
		const int32_t *tk = topk + i * topk_stride;
		for (int j = 0; j < topk_stride && n < idx_stride; j++) {
			if (tk[j] < 0 || tk[j] >= n_vis)
				continue;
			int64_t r = rowmap_d(cmp_row0, pg, s, tk[j]);
			if (r < 0 || r > INT32_MAX)
				continue;
			row[n++] = (int32_t)r;
		}
	}
	if (threadIdx.x == 0)
		n_sh = n;
	__syncthreads();
	n = n_sh;
	if (threadIdx.x == 0)
		idx_len[i] = n;
	for (int j = n + threadIdx.x; j < idx_stride; j += blockDim.x)
		row[j] = -1;
}

extern "C" enum status kern_attn_index_cuda_generic(const struct kern_attn_index_args *a)
{
	if (!a || a->n_seqs < 0 || a->n_tokens < 0 || a->window <= 0 || a->ratio < 0 || a->idx_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->q_off || !a->start_pos || !a->idx || !a->idx_len || a->n_seqs == 0 ||
	    (a->ratio > 0 && !a->cmp_row0 && !a->cmp_paged.block_table) ||
	    (a->topk && (a->ratio == 0 || a->topk_stride < 0)))
		return ST_INVALID;
	if (a->n_tokens > 0x7fffffffLL)
		return ST_UNSUPPORTED;
	attn_index_kernel<<<(unsigned)a->n_tokens, 128, 0, (cudaStream_t)a->stream>>>(
		a->n_seqs, a->q_off, a->start_pos, a->window, a->cur_row0, a->ring_row0, a->ratio, a->cmp_row0,
		a->cmp_paged, a->topk, a->topk_stride, a->idx, a->idx_len, a->idx_stride);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}

/* ---- ring writes ---- */

__global__ void ring_write_kernel(const float *src, int64_t ss, float *ring, int64_t rs, const int64_t *ring_row0,
				  int64_t n_ring_rows, int n_seqs, const int32_t *q_off, const int32_t *start_pos,
				  int window, int dim)
{
	const int64_t i = blockIdx.x;
	const int s = kd_seq_of(q_off, n_seqs, i);
	const int64_t end = q_off[s + 1], beg = q_off[s];
	const int64_t first = end - window > beg ? end - window : beg;
	if (i < first || i >= end)
		return;
	const int64_t r0 = ring_row0[s];
	if (r0 < 0 || r0 + window > n_ring_rows)
		return;
	const int64_t p = start_pos[s] + (i - beg);
	float *dst = ring + (r0 + p % window) * rs;
	for (int c = threadIdx.x; c < dim; c += blockDim.x)
		dst[c] = src[i * ss + c];
}

extern "C" enum status kern_ring_write_cuda_generic(const struct kern_ring_write_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->window <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	int64_t ss = a->src_stride ? a->src_stride : a->dim, rs = a->ring_stride ? a->ring_stride : a->dim;
	if (!a->src || !a->ring || !a->ring_row0 || !a->q_off || !a->start_pos || ss < a->dim || rs < a->dim ||
	    a->n_seqs == 0)
		return ST_INVALID;
	if (a->n_tokens > 0x7fffffffLL)
		return ST_UNSUPPORTED;
	ring_write_kernel<<<(unsigned)a->n_tokens, 128, 0, (cudaStream_t)a->stream>>>(
		a->src, ss, a->ring, rs, a->ring_row0, a->n_ring_rows, a->n_seqs, a->q_off, a->start_pos, a->window,
		a->dim);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
