/*
 * kernels/linear/linear_cublaslt.cu: the cuBLASLt FP8 block-scaled linear
 * for Hopper (variant linear_cublaslt_sm90; contract in linear_cublaslt.h).
 *
 * Two steps per call, both on the caller's stream:
 *   1. act_quant_kernel: x (f32/bf16, row stride ldx) -> e4m3 codes [T, in]
 *      and f32 scales, one warp per (token, 128-column block): amax by warp
 *      shuffle, s = pow2_ceil(max(amax, 1e-4)/448), q = e4m3_rne(clamp(x/s)),
 *      the same arithmetic as quant.h / quant_cuda.cuh, so the codes are
 *      bit-identical to the CPU reference's act_quant.
 *   2. cublasLtMatmul with A = W (TRANSA=T, BLK128x128_32F scales) and
 *      B = the codes (VEC128_32F scales), D = y. In cuBLASLt's column-major
 *      terms: D[out, T] = Aᵀ[out, in] · B[in, T], M = out, N = T, K = in.
 *
 * Scale layouts (cuBLAS docs, "block scaling factors layout"; PyTorch's
 * blockwise _scaled_mm tests use the same): the 128x128 weight scales are
 * K-block-major with the K-block count padded to a multiple of 4, which is
 * our dense [ceil(out/128), ceil(in/128)] row-major array exactly when
 * ceil(in/128) % 4 == 0 (hence the guard in % 512 == 0, which every
 * DeepSeek-V4-Flash linear and its TP=2 shards meet). The 1x128 activation
 * scales are "outer-dim-major": scale(t, kb) at kb * T + t. If the GPU test
 * disagrees only when T > 1 and in > 128, that layout is transposed: flip
 * LT_ACT_SCALE_TOKEN_MAJOR.
 *
 * A y whose rows are not 16-byte aligned (cuBLASLt's FP8 path needs that of
 * D) is written through a 4 MiB staging buffer in chunks of tokens and copied
 * out; the scales are then laid out per chunk.
 *
 * Plans (matmul descriptor, three layouts, the heuristic's algorithm) are
 * cached per (device, in, out, T, y dtype, ldy) in a mutex-protected hash
 * table, built on first use and kept for the process (style.md rule 8: no
 * descriptors or heuristic queries per call). A shape whose heuristic
 * returns nothing is cached as refused, with its status, so selection can
 * say why (kern_linear_cublaslt_check).
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/linear/linear_cublaslt.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define LT_ACT_SCALE_TOKEN_MAJOR 1 /* activation scale (t, kb) at kb*T + t (1) or t*nkb + kb (0) */
#define LT_MAX_DEVICES 16
#define LT_ALIGN 256
#define LT_STAGE_BYTES ((size_t)4 << 20) /* staging for y whose rows are not 16-byte aligned */

/* ---- step 1: activation quantization ---- */

/* Scales are laid out per chunk of Tc tokens (the GEMMs are issued per
 * chunk when y has to be staged; otherwise Tc = T and there is one chunk):
 * chunk c holds [nkb][tcur] at offset c·Tc·nkb, tcur = min(Tc, T - c·Tc). */
__global__ void __launch_bounds__(128) lt_act_quant_kernel(const void *__restrict__ x, int x_dt, int64_t ldx,
							     int64_t T, int64_t Tc, int64_t in, uint8_t *__restrict__ q,
							     float *__restrict__ sc)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t nkb = in / 128, kb = (int64_t)blockIdx.x * 4 + warp, t = blockIdx.y;
	if (kb >= nkb)
		return;
	const int64_t k0 = kb * 128 + lane * 4;
	float v[4], amax = 0.f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		v[i] = kq_load(x, x_dt, t * ldx + k0 + i);
		amax = fmaxf(amax, fabsf(v[i]));
	}
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
	const float s = kq_fp8_block_scale(amax);
	uint32_t packed = 0;
#pragma unroll
	for (int i = 0; i < 4; i++)
		packed |= kq_f32_to_e4m3(fminf(fmaxf(v[i] / s, -448.0f), 448.0f)) << (8 * i);
	*(uint32_t *)(q + t * in + k0) = packed;
	if (lane == 0) {
		const int64_t c0 = t / Tc * Tc, tcur = min(Tc, T - c0), ti = t - c0;
		sc[c0 * nkb + (LT_ACT_SCALE_TOKEN_MAJOR ? kb * tcur + ti : ti * nkb + kb)] = s;
	}
}

/* Staged output: y rows [t0, t0 + tcur) (row stride ldy) <- stage [tcur, out]. */
__global__ void lt_unstage_kernel(const void *__restrict__ stage, void *__restrict__ y, int64_t tcur, int64_t out,
				  int64_t ldy, int bf16)
{
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= tcur * out)
		return;
	const int64_t t = i / out, o = i % out;
	if (bf16)
		((uint16_t *)y)[t * ldy + o] = ((const uint16_t *)stage)[i];
	else
		((float *)y)[t * ldy + o] = ((const float *)stage)[i];
}

/* ---- plan cache ---- */

struct lt_plan {
	int device, y_dt;
	int64_t in, out, T, ldy;
	int ok;                   /* heuristic returned an algorithm */
	cublasStatus_t status;    /* why not, when !ok */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, ld;
	cublasLtMatmulAlgo_t algo;
};

static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handle[LT_MAX_DEVICES];
static struct lt_plan **lt_slots; /* open addressing, linear probing; plans never move */
static size_t lt_cap, lt_n;

static uint64_t lt_hash(int device, int64_t in, int64_t out, int64_t T, int64_t ldy, int y_dt)
{
	uint64_t h = 0x9E3779B97F4A7C15ull;
	const uint64_t f[6] = {(uint64_t)device, (uint64_t)in, (uint64_t)out, (uint64_t)T, (uint64_t)ldy,
			       (uint64_t)y_dt};
	for (int i = 0; i < 6; i++) {
		h ^= f[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
		h *= 0xBF58476D1CE4E5B9ull;
	}
	return h ^ (h >> 31);
}

static bool lt_same(const struct lt_plan *p, int device, int64_t in, int64_t out, int64_t T, int64_t ldy, int y_dt)
{
	return p->device == device && p->in == in && p->out == out && p->T == T && p->ldy == ldy && p->y_dt == y_dt;
}

/* Insert p (lock held). false on allocation failure. */
static bool lt_insert(struct lt_plan *p)
{
	if (2 * (lt_n + 1) > lt_cap) {
		size_t cap = lt_cap ? 2 * lt_cap : 256;
		struct lt_plan **s = (struct lt_plan **)calloc(cap, sizeof *s);
		if (!s)
			return false;
		for (size_t i = 0; i < lt_cap; i++) {
			struct lt_plan *o = lt_slots[i];
			if (!o)
				continue;
			size_t j = lt_hash(o->device, o->in, o->out, o->T, o->ldy, o->y_dt) & (cap - 1);
			while (s[j])
				j = (j + 1) & (cap - 1);
			s[j] = o;
		}
		free(lt_slots);
		lt_slots = s;
		lt_cap = cap;
	}
	size_t j = lt_hash(p->device, p->in, p->out, p->T, p->ldy, p->y_dt) & (lt_cap - 1);
	while (lt_slots[j])
		j = (j + 1) & (lt_cap - 1);
	lt_slots[j] = p;
	lt_n++;
	return true;
}

static cublasStatus_t lt_build(struct lt_plan *p, cublasLtHandle_t h)
{
	cublasStatus_t s;
	const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	const int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
	const int32_t bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
	/* Placeholders for the heuristic (it never dereferences them); run() sets the real ones. */
	const void *dummy = (const void *)(uintptr_t)4096;
	const cudaDataType_t yt = p->y_dt ? CUDA_R_16BF : CUDA_R_32F;
	s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, (uint64_t)p->in, (uint64_t)p->out, p->in);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, (uint64_t)p->in, (uint64_t)p->T, p->in);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatrixLayoutCreate(&p->ld, yt, (uint64_t)p->out, (uint64_t)p->T, p->ldy);
	cublasLtMatmulPreference_t pref = NULL;
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceCreate(&pref);
	const size_t ws = KERN_LINEAR_LT_WORKSPACE_BYTES;
	const uint32_t al = 16; /* weights and y come from arenas with at least 16-byte alignment */
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
	cublasLtMatmulHeuristicResult_t res;
	memset(&res, 0, sizeof res);
	int n = 0;
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &n);
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (s == CUBLAS_STATUS_SUCCESS && n < 1)
		s = CUBLAS_STATUS_NOT_SUPPORTED;
	if (s == CUBLAS_STATUS_SUCCESS) {
		p->algo = res.algo;
		p->ok = 1;
	}
	return s;
}

static void lt_plan_free(struct lt_plan *p)
{
	if (!p)
		return;
	if (p->ld)
		cublasLtMatrixLayoutDestroy(p->ld);
	if (p->lb)
		cublasLtMatrixLayoutDestroy(p->lb);
	if (p->la)
		cublasLtMatrixLayoutDestroy(p->la);
	if (p->desc)
		cublasLtMatmulDescDestroy(p->desc);
	free(p);
}

/* The plan for this shape on `device` (the current device), building it on
 * first use. NULL only on allocation or handle failure (*st says which). */
static struct lt_plan *lt_plan_get(int device, int64_t in, int64_t out, int64_t T, int64_t ldy, int y_dt,
				   cublasLtHandle_t *hout, cublasStatus_t *st)
{
	*st = CUBLAS_STATUS_SUCCESS;
	if (device < 0 || device >= LT_MAX_DEVICES) {
		*st = CUBLAS_STATUS_INVALID_VALUE;
		return NULL;
	}
	pthread_mutex_lock(&lt_mu);
	struct lt_plan *p = NULL;
	if (!lt_handle[device]) {
		*st = cublasLtCreate(&lt_handle[device]);
		if (*st != CUBLAS_STATUS_SUCCESS) {
			lt_handle[device] = NULL;
			pthread_mutex_unlock(&lt_mu);
			return NULL;
		}
	}
	*hout = lt_handle[device];
	if (lt_cap) {
		size_t j = lt_hash(device, in, out, T, ldy, y_dt) & (lt_cap - 1);
		for (; lt_slots[j]; j = (j + 1) & (lt_cap - 1))
			if (lt_same(lt_slots[j], device, in, out, T, ldy, y_dt)) {
				p = lt_slots[j];
				break;
			}
	}
	if (!p) {
		p = (struct lt_plan *)calloc(1, sizeof *p);
		if (p) {
			p->device = device;
			p->in = in;
			p->out = out;
			p->T = T;
			p->ldy = ldy;
			p->y_dt = y_dt;
			p->status = lt_build(p, lt_handle[device]);
			if (!lt_insert(p)) {
				lt_plan_free(p);
				p = NULL;
				*st = CUBLAS_STATUS_ALLOC_FAILED;
			}
		} else {
			*st = CUBLAS_STATUS_ALLOC_FAILED;
		}
	}
	pthread_mutex_unlock(&lt_mu);
	return p;
}

extern "C" void kern_linear_cublaslt_release(void)
{
	pthread_mutex_lock(&lt_mu);
	for (size_t i = 0; i < lt_cap; i++)
		lt_plan_free(lt_slots[i]);
	free(lt_slots);
	lt_slots = NULL;
	lt_cap = lt_n = 0;
	for (int d = 0; d < LT_MAX_DEVICES; d++)
		if (lt_handle[d]) {
			cublasLtDestroy(lt_handle[d]);
			lt_handle[d] = NULL;
		}
	pthread_mutex_unlock(&lt_mu);
}

/* ---- entry points ---- */

static size_t lt_round(size_t n)
{
	return (n + LT_ALIGN - 1) / LT_ALIGN * LT_ALIGN;
}

extern "C" size_t kern_linear_cublaslt_workspace_bytes(int64_t max_tokens, int64_t in)
{
	if (max_tokens < 1)
		max_tokens = 1;
	const size_t nkb = (size_t)((in + 127) / 128);
	return lt_round((size_t)max_tokens * (size_t)in) + lt_round(nkb * (size_t)max_tokens * sizeof(float)) +
	       LT_STAGE_BYTES + KERN_LINEAR_LT_WORKSPACE_BYTES;
}

extern "C" bool kern_linear_cublaslt_check(int device, int64_t in, int64_t out, int64_t n_tokens,
					   enum kern_dtype y_dtype, char *why, size_t why_bytes)
{
	int cur = -1;
	if (cudaGetDevice(&cur) != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, why_bytes, "cuBLASLt: no CUDA device");
		return false;
	}
	if (cur != device && cudaSetDevice(device) != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, why_bytes, "cuBLASLt: cannot select device %d", device);
		return false;
	}
	cublasLtHandle_t h;
	cublasStatus_t st;
	const int64_t T = n_tokens < 1 ? 1 : n_tokens;
	struct lt_plan *p = lt_plan_get(device, in, out, T, out, y_dtype == KERN_DT_BF16, &h, &st);
	if (cur != device)
		cudaSetDevice(cur);
	if (!p) {
		snprintf(why, why_bytes, "cuBLASLt: setup failed (status %d)", (int)st);
		return false;
	}
	if (!p->ok) {
		snprintf(why, why_bytes, "cuBLASLt heuristic: no algorithm for FP8 block-scaled [%lld x %lld] x [%lld x %lld]ᵀ (status %d)",
			 (long long)T, (long long)in, (long long)out, (long long)in, (int)p->status);
		return false;
	}
	return true;
}

extern "C" enum status kern_linear_cublaslt(const struct kern_linear_args *a)
{
	if (!a->w || a->w->fmt != KERN_WFMT_FP8_F32_B128 || a->act_quant_block != 128)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if (in % 512 || out % 16 || T < 0)
		return ST_INVALID;
	if (T == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const int ydt = a->y_dtype == KERN_DT_BF16;
	const int64_t esz = kern_dtype_bytes(a->y_dtype);
	if ((uintptr_t)a->w->data % 16 || ldy < out)
		return ST_INVALID;
	if (!a->workspace || a->workspace_bytes < kern_linear_cublaslt_workspace_bytes(T, in) ||
	    (uintptr_t)a->workspace % LT_ALIGN)
		return ST_INVALID;
	if (T > 65535)
		return ST_INVALID;
	/* y rows that are not 16-byte aligned cannot be cuBLASLt's D: the GEMM then
	 * writes chunks of Tc tokens into a dense staging buffer, copied out after. */
	const bool staged = (uintptr_t)a->y % 16 || (ldy * esz) % 16;
	int64_t Tc = T;
	if (staged) {
		Tc = (int64_t)(LT_STAGE_BYTES / (size_t)(out * esz));
		if (Tc < 1)
			return ST_INVALID;
		if (Tc > T)
			Tc = T;
	}
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess)
		return ST_CUDA;
	const int64_t nkb = in / 128;
	uint8_t *q = (uint8_t *)a->workspace;
	float *sc = (float *)(q + lt_round((size_t)(T * in)));
	uint8_t *stage = (uint8_t *)sc + lt_round((size_t)(nkb * T) * sizeof(float));
	void *ws = stage + LT_STAGE_BYTES;
	cudaStream_t stream = (cudaStream_t)a->stream;
	dim3 grid((unsigned)((nkb + 3) / 4), (unsigned)T);
	lt_act_quant_kernel<<<grid, 128, 0, stream>>>(a->x, (int)a->x_dtype, ldx, T, Tc, in, q, sc);
	if (cudaGetLastError() != cudaSuccess)
		return ST_CUDA;
	const float alpha = 1.0f, beta = 0.0f;
	for (int64_t t0 = 0; t0 < T; t0 += Tc) {
		const int64_t tcur = T - t0 < Tc ? T - t0 : Tc;
		cublasLtHandle_t h;
		cublasStatus_t cst;
		struct lt_plan *p = lt_plan_get(dev, in, out, tcur, staged ? out : ldy, ydt, &h, &cst);
		if (!p)
			return cst == CUBLAS_STATUS_ALLOC_FAILED ? ST_NOMEM : ST_CUDA;
		if (!p->ok)
			return ST_UNSUPPORTED;
		const void *wsc = a->w->scale, *asc = sc + t0 * nkb;
		if (cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsc, sizeof wsc) !=
			    CUBLAS_STATUS_SUCCESS ||
		    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &asc, sizeof asc) !=
			    CUBLAS_STATUS_SUCCESS)
			return ST_CUDA;
		void *d = staged ? (void *)stage : (void *)((uint8_t *)a->y + t0 * ldy * esz);
		cst = cublasLtMatmul(h, p->desc, &alpha, a->w->data, p->la, q + t0 * in, p->lb, &beta, d, p->ld, d, p->ld,
				     &p->algo, ws, KERN_LINEAR_LT_WORKSPACE_BYTES, stream);
		if (cst != CUBLAS_STATUS_SUCCESS)
			return ST_CUDA;
		if (staged) {
			const int64_t n = tcur * out;
			lt_unstage_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
				stage, (uint8_t *)a->y + t0 * ldy * esz, tcur, out, ldy, ydt);
			if (cudaGetLastError() != cudaSuccess)
				return ST_CUDA;
		}
	}
	return ST_OK;
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

extern "C" enum status kern_linear_cublaslt_host(const struct kern_linear_args *a)
{
	enum status st = kern_linear_args_check(a, NULL);
	if (st)
		return st;
	if (a->w->fmt != KERN_WFMT_FP8_F32_B128 || a->act_quant_block != 128)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if (T == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const size_t xb = (size_t)((T - 1) * ldx + in) * kern_dtype_bytes(a->x_dtype);
	const size_t yb = (size_t)((T - 1) * ldy + out) * kern_dtype_bytes(a->y_dtype);
	const size_t wb = kern_wmat_data_bytes(a->w), sb = kern_wmat_scale_bytes(a->w);
	const size_t wsb = kern_linear_cublaslt_workspace_bytes(T, in);
	void *dx = NULL, *dy = NULL, *dw = NULL, *ds = NULL, *dws = NULL;
	cudaError_t ce = cudaMalloc(&dx, xb);
	if (ce == cudaSuccess) ce = cudaMalloc(&dy, yb);
	if (ce == cudaSuccess) ce = cudaMalloc(&dw, wb);
	if (ce == cudaSuccess) ce = cudaMalloc(&ds, sb ? sb : 1);
	if (ce == cudaSuccess) ce = cudaMalloc(&dws, wsb);
	if (ce == cudaSuccess) ce = cudaMemcpy(dx, a->x, xb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess) ce = cudaMemcpy(dy, a->y, yb, cudaMemcpyHostToDevice); /* keeps unwritten sentinels */
	if (ce == cudaSuccess) ce = cudaMemcpy(dw, a->w->data, wb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess && sb) ce = cudaMemcpy(ds, a->w->scale, sb, cudaMemcpyHostToDevice);
	if (ce == cudaSuccess) {
		struct kern_wmat dwm = *a->w;
		dwm.data = dw;
		dwm.scale = ds;
		dwm.owned = NULL;
		struct kern_linear_args da = *a;
		da.x = dx;
		da.y = dy;
		da.w = &dwm;
		da.stream = 0;
		da.workspace = dws;
		da.workspace_bytes = wsb;
		st = kern_linear_cublaslt(&da);
		if (st == ST_OK) {
			ce = cudaDeviceSynchronize();
			if (ce == cudaSuccess)
				ce = cudaMemcpy(a->y, dy, yb, cudaMemcpyDeviceToHost);
		}
	}
	cudaFree(dx);
	cudaFree(dy);
	cudaFree(dw);
	cudaFree(ds);
	cudaFree(dws);
	if (st)
		return st;
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}
