/*
 * kernels/compressor/compressor_generic.cu: portable CUDA CSA/HCA KV
 * compressor for every cc >= 8.0 (variant compressor_cuda_generic; contract
 * in compressor.h).
 *
 * One 256-thread block per sequence runs the reference's state machine over
 * that sequence's tokens in order (the state update order matters only
 * within a sequence): write (K_t, Z_t + ape) into the state row, and on an
 * entry boundary pool per channel (the reference's slot order and max /
 * exp-sum passes), RMSNorm (bf16 in and out), rope at w·m (bf16 out) and the
 * post simulation (FP8 nope qdq, or Hadamard + bf16 + FP4 qdq), then the CSA
 * shift of the second half of the state rows. Everything is the reference's
 * arithmetic in its order with _rn operations, except the norm's sum of
 * squares (a block reduction) and expf's last bits. The entry lives in
 * shared memory (head_dim floats). A state slot out of range skips the
 * sequence and an output row out of range skips that entry's store (the
 * reference returns ST_INVALID before writing anything).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/compressor/compressor_generic.h"
}
#include "kernels/norm/lowp_cuda.cuh"

#define CMP_NT 256

struct cmp_p {
	const float *kv_proj, *gate_proj, *ape;
	const int32_t *q_off, *start_pos, *state_slot;
	float *kv_state, *score_state;
	int64_t n_state_slots;
	int m, d, rope_dim;
	bool overlap;
	const uint16_t *norm_w;
	float eps;
	const float *omega;
	int post;
	float *out;
	const int64_t *out_row0;
	kern_rowmap_paged pg;
	int64_t n_out_rows;
	float *pooled;
	float hsc;
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

static __device__ void emit(const cmp_p &p, const float *kv, const float *sc, int s, int64_t w, float *e, float *red)
{
	const int m = p.m, d = p.d, cd = (p.overlap ? 2 : 1) * d, n_slots = p.overlap ? 2 * m : m;
	for (int ch = threadIdx.x; ch < d; ch += CMP_NT) {
		float mx = -INFINITY;
		for (int j = 0; j < n_slots; j++) {
			int col = p.overlap && j >= m ? d + ch : ch;
			mx = fmaxf(mx, sc[(int64_t)j * cd + col]);
		}
		float den = 0.f, acc = 0.f;
		for (int j = 0; j < n_slots; j++) {
			int col = p.overlap && j >= m ? d + ch : ch;
			float sv = sc[(int64_t)j * cd + col];
			if (sv == -INFINITY)
				continue;
			float pr = expf(__fsub_rn(sv, mx));
			den = __fadd_rn(den, pr);
			acc = __fadd_rn(acc, __fmul_rn(pr, kv[(int64_t)j * cd + col]));
		}
		e[ch] = __fdiv_rn(acc, den);
	}
	const int64_t orow = rowmap_d(p.out_row0, p.pg, s, w);
	const bool store = orow >= 0 && orow < p.n_out_rows;
	__syncthreads();
	/* RMSNorm: bf16 in, weighted, bf16 out */
	float ss = 0.f;
	for (int ch = threadIdx.x; ch < d; ch += CMP_NT) {
		if (store && p.pooled)
			p.pooled[orow * d + ch] = e[ch];
		float v = kd_bf16_round(e[ch]);
		ss = __fadd_rn(ss, __fmul_rn(v, v));
	}
	ss = kd_block_sum(ss, red);
	float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), p.eps)));
	for (int ch = threadIdx.x; ch < d; ch += CMP_NT) {
		float v = kd_bf16_round(e[ch]);
		e[ch] = kd_bf16_round(__fmul_rn(__fmul_rn(v, rs), kd_bf16_to_f32(p.norm_w[ch])));
	}
	__syncthreads();
	/* rope at position w·m, bf16 out */
	float tp = (float)(int32_t)(w * m);
	for (int i = threadIdx.x; i < p.rope_dim / 2; i += CMP_NT) {
		float ang = __fmul_rn(tp, p.omega[i]);
		float c = (float)cos((double)ang), sn = (float)sin((double)ang);
		float *q = e + d - p.rope_dim + 2 * i;
		float re = q[0], im = q[1];
		q[0] = kd_bf16_round(__fsub_rn(__fmul_rn(re, c), __fmul_rn(im, sn)));
		q[1] = kd_bf16_round(__fadd_rn(__fmul_rn(re, sn), __fmul_rn(im, c)));
	}
	__syncthreads();
	if (p.post == KERN_CMP_POST_FP8_NOPE) {
		int n = d - p.rope_dim;
		for (int b0 = threadIdx.x * 64; b0 < n; b0 += CMP_NT * 64)
			kd_fp8_qdq_block(e + b0, n - b0 < 64 ? n - b0 : 64);
		__syncthreads();
	} else if (p.post == KERN_CMP_POST_HADAMARD_FP4) {
		for (int h = 1; h < d; h *= 2) {
			for (int k = threadIdx.x; k < d / 2; k += CMP_NT) {
				int j = (k / h) * 2 * h + (k % h);
				float a = e[j], b = e[j + h];
				e[j] = __fadd_rn(a, b);
				e[j + h] = __fsub_rn(a, b);
			}
			__syncthreads();
		}
		for (int ch = threadIdx.x; ch < d; ch += CMP_NT)
			e[ch] = kd_bf16_round(__fmul_rn(e[ch], p.hsc));
		__syncthreads();
		for (int b0 = threadIdx.x * 32; b0 < d; b0 += CMP_NT * 32)
			kd_fp4_qdq_block(e + b0, d - b0 < 32 ? d - b0 : 32);
		__syncthreads();
	}
	if (store)
		for (int ch = threadIdx.x; ch < d; ch += CMP_NT)
			p.out[orow * d + ch] = e[ch];
	__syncthreads();
}

__global__ void __launch_bounds__(CMP_NT) compressor_kernel(cmp_p p)
{
	extern __shared__ float e[];
	__shared__ float red[32];
	const int s = blockIdx.x;
	const int slot = p.state_slot[s];
	if (slot < 0 || slot >= p.n_state_slots)
		return;
	const int m = p.m, d = p.d, c = p.overlap ? 2 : 1, cd = c * d;
	const int64_t state_floats = (int64_t)c * m * cd;
	float *kv = p.kv_state + slot * state_floats;
	float *sc = p.score_state + slot * state_floats;
	for (int64_t i = p.q_off[s]; i < p.q_off[s + 1]; i++) {
		const int64_t t = p.start_pos[s] + (i - p.q_off[s]);
		const int64_t row = (p.overlap ? m : 0) + t % m;
		const float *ape = p.ape + (t % m) * cd;
		for (int ch = threadIdx.x; ch < cd; ch += CMP_NT) {
			kv[row * cd + ch] = p.kv_proj[i * cd + ch];
			sc[row * cd + ch] = __fadd_rn(p.gate_proj[i * cd + ch], ape[ch]);
		}
		__syncthreads();
		if ((t + 1) % m)
			continue;
		emit(p, kv, sc, s, (t + 1) / m - 1, e, red);
		if (p.overlap) {
			for (int64_t k = threadIdx.x; k < (int64_t)m * cd; k += CMP_NT) {
				kv[k] = kv[(int64_t)m * cd + k];
				sc[k] = sc[(int64_t)m * cd + k];
			}
			__syncthreads();
		}
	}
}

extern "C" enum status kern_compressor_cuda_generic(const struct kern_compressor_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->head_dim <= 0 || a->rope_dim <= 0 ||
	    a->rope_dim > a->head_dim || a->rope_dim % 2 || a->post < KERN_CMP_POST_FP8_NOPE ||
	    a->post > KERN_CMP_POST_NONE)
		return ST_INVALID;
	if (a->post == KERN_CMP_POST_HADAMARD_FP4 && (a->head_dim & (a->head_dim - 1)))
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->kv_proj || !a->gate_proj || !a->ape || !a->q_off || !a->start_pos || !a->kv_state ||
	    !a->score_state || !a->state_slot || !a->norm_w || !a->omega || !a->out ||
	    (!a->out_row0 && !a->out_paged.block_table) || a->n_seqs == 0)
		return ST_INVALID;
	if ((size_t)a->head_dim * sizeof(float) > 40 * 1024)
		return ST_UNSUPPORTED;
	cmp_p p;
	p.kv_proj = a->kv_proj;
	p.gate_proj = a->gate_proj;
	p.ape = a->ape;
	p.q_off = a->q_off;
	p.start_pos = a->start_pos;
	p.state_slot = a->state_slot;
	p.kv_state = a->kv_state;
	p.score_state = a->score_state;
	p.n_state_slots = a->n_state_slots;
	p.m = a->ratio;
	p.d = a->head_dim;
	p.rope_dim = a->rope_dim;
	p.overlap = a->overlap;
	p.norm_w = a->norm_w;
	p.eps = a->norm_eps;
	p.omega = a->omega;
	p.post = (int)a->post;
	p.out = a->out;
	p.out_row0 = a->out_row0;
	p.pg = a->out_paged;
	p.n_out_rows = a->n_out_rows;
	p.pooled = a->pooled;
	p.hsc = 1.0f / sqrtf((float)a->head_dim);
	compressor_kernel<<<(unsigned)a->n_seqs, CMP_NT, a->head_dim * sizeof(float), (cudaStream_t)a->stream>>>(p);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_INVALID;
}
