/*
 * kernels/linear/linear_cublaslt.cu: the cuBLASLt FP8 block-scaled linear
 * for Hopper (variant linear_cublaslt_sm90; contract in linear_cublaslt.h).
 *
 * Two steps per call, both on the caller's stream:
 *   1. lt_act_quant_kernel: x (f32/bf16, row stride ldx) -> e4m3 codes and
 *      f32 scales, one warp per (token, 128-column block): amax by warp
 *      shuffle, s = pow2_ceil(max(amax, 1e-4)/448), q = e4m3_rne(clamp(x/s)),
 *      the same arithmetic as quant.h / quant_cuda.cuh, so the codes are
 *      bit-identical to the CPU reference's act_quant.
 *   2. cublasLtMatmul per piece of tokens (below), A = W (TRANSA=T), B = the
 *      codes, D = y. In cuBLASLt's column-major terms D[out, N] =
 *      op(A)[out, in] · B[in, N]: M = out, N = the piece's padded token
 *      count, K = in.
 *
 * Scale modes, from the heuristic's answers on the H200 (cuBLASLt 13.1,
 * docs/gpu-runs/cublaslt_probe_result.txt): with N = 1 only A = VEC128 x
 * B = BLK128x128 has an algorithm; with N >= 16 A = VEC128 x B = VEC128 does
 * (A = BLK128x128 x B = VEC128, the earlier choice, has none at N = 1). So
 * the weight always uses VEC128 (prepare() replicates each 128x128 block
 * scale over its 128 rows: exact) and the activations use
 *   N == 1: BLK128x128 -- with one column a 128x128 block of B is exactly
 *           the 128 K values of that one token, so its scale is the token's
 *           1x128 act_quant scale (exact);
 *   N >= 2: VEC128, N padded to a multiple of 4 (zero codes, scale 1 in the
 *           padding columns, whose D columns are staged and dropped).
 *
 * Scale tensor layouts (f32, element offsets; nkb = in / 128):
 *   A, VEC128 (weight, KERN_WFMT_FP8_F32_R128): s(o, kb) at kb*out + o --
 *     outer-dim (row) contiguous, K blocks strided by out (out % 16 == 0,
 *     so each K-block column stays 16-byte aligned);
 *   B, VEC128 (activations, N >= 2, N % 4 == 0): s(t, kb) at kb*N + t --
 *     the same outer-dim-major rule, the piece's N as the stride (this is
 *     the layout PyTorch's blockwise _scaled_mm hands cuBLASLt for 1x128
 *     operands: stride 1 along rows, rows along K blocks);
 *   B, BLK128x128 (activations, N == 1): s(kb) at kb -- [ceil(N/128) = 1,
 *     nkb] block rows, K blocks contiguous (its padding of the K-block
 *     count to a multiple of 4 is slack at the end of the buffer).
 * If the probe (kern_linear_cublaslt_probe, run once per device before the
 * variant is accepted) disagrees with the CPU reference only for N >= 2,
 * the suspect is the B VEC128 rule (kb-contiguous instead: t*nkb + kb); if
 * it fails for N = 1 too, the A rule. Either way the variant is refused at
 * load with the mismatch, never served.
 *
 * Pieces: n tokens are cut into pieces of Tc tokens (the last one shorter);
 * piece c covers tokens [c*Tc, c*Tc + tcur) and is one GEMM of N =
 * lt_piece_n(tcur) columns: 1 for a single token, else tcur rounded up to
 * 4. Its codes are rows [c*P, c*P + N) of the code buffer (P = N of a full
 * piece) and its scales start at c*P*nkb. With 16-byte aligned y rows, Tc =
 * n rounded down to 4, so a call is one direct GEMM plus at most one piece
 * of 1 (direct, BLK128 path) or 2-3 tokens (N = 4, staged); y rows that
 * are not 16-byte aligned (cuBLASLt's FP8 path needs that of D) go through
 * a 4 MiB staging buffer in pieces of as many tokens as fit. If the
 * heuristic has no algorithm for some N (met first in the step), the call
 * falls back to pieces of 16 with the last one padded to 16, so only N = 1
 * and N = 16 are needed, and the guard checked both at load; should even
 * those be refused (another ld of D), the call returns ST_UNSUPPORTED with
 * an ERROR log line naming the shape: never a silent failure.
 *
 * Plans (matmul descriptor, three layouts, the heuristic's algorithm) are
 * cached per (device, in, out, N, ld of D, y dtype) in a mutex-protected
 * hash table, built on first use and kept for the process (style.md rule
 * 8: no descriptors or heuristic queries per call). A refused shape is
 * cached as refused, with its status, so selection can say why
 * (kern_linear_cublaslt_check).
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/log.h"
#include "kernels/linear/linear_cublaslt.h"
}
#include "kernels/quant/quant_cuda.cuh"

#define LT_MAX_DEVICES 16
#define LT_ALIGN 256
#define LT_STAGE_BYTES ((size_t)KERN_LINEAR_LT_STAGE_BYTES)
#define LT_FALLBACK_TC 16 /* piece size when a larger N has no algorithm (N = 16 is checked at load) */

/* ---- pieces ---- */

static int64_t lt_round4(int64_t n)
{
	return (n + 3) / 4 * 4;
}

/* GEMM columns of a piece of tcur tokens. */
static int64_t lt_piece_n(int64_t tcur)
{
	return tcur == 1 ? 1 : lt_round4(tcur);
}

struct lt_pieces {
	int64_t Tc;     /* tokens per full piece */
	int64_t np;     /* pieces */
	int64_t P;      /* code rows per full piece (its N) */
	int64_t n_last; /* N of the last piece */
	int64_t rem;    /* tokens of the last piece */
};

/* Pieces of Tc tokens; pad16: a last piece of more than one token is padded
 * to N = 16 (the fallback; rem <= 16 there). */
static void lt_pieces_make(struct lt_pieces *pc, int64_t T, int64_t Tc, bool pad16)
{
	pc->Tc = Tc;
	pc->np = (T + Tc - 1) / Tc;
	pc->rem = T - (pc->np - 1) * Tc;
	pc->n_last = pad16 && pc->rem > 1 ? LT_FALLBACK_TC : lt_piece_n(pc->rem);
	pc->P = pc->np == 1 ? pc->n_last : lt_piece_n(Tc);
}

/* ---- step 1: activation quantization ---- */

/* One warp per (code row, 128-column block); grid (code rows, ceil(nkb/4)).
 * Code row r belongs to piece c = r / P at column ti = r % P; it holds token
 * c*Tc + ti when ti < tcur, else it is padding (zero codes, scale 1). */
__global__ void __launch_bounds__(128) lt_act_quant_kernel(const void *__restrict__ x, int x_dt, int64_t ldx,
							     int64_t T, int64_t Tc, int64_t P, int64_t np,
							     int64_t n_last, int64_t in, uint8_t *__restrict__ q,
							     float *__restrict__ sc)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t nkb = in / 128, kb = (int64_t)blockIdx.y * 4 + warp, r = blockIdx.x;
	if (kb >= nkb)
		return;
	const int64_t c = r / P, ti = r - c * P;
	const bool last = c == np - 1;
	const int64_t N = last ? n_last : P, tcur = last ? T - c * Tc : Tc;
	const int64_t k0 = kb * 128 + lane * 4;
	float s = 1.0f;
	uint32_t packed = 0;
	if (ti < tcur) {
		const int64_t t = c * Tc + ti;
		float v[4], amax = 0.f;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			v[i] = kq_load(x, x_dt, t * ldx + k0 + i);
			amax = fmaxf(amax, fabsf(v[i]));
		}
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
		s = kq_fp8_block_scale(amax);
#pragma unroll
		for (int i = 0; i < 4; i++)
			packed |= kq_f32_to_e4m3(fminf(fmaxf(v[i] / s, -448.0f), 448.0f)) << (8 * i);
	}
	*(uint32_t *)(q + r * in + k0) = packed;
	if (lane == 0)
		sc[c * P * nkb + kb * N + ti] = s; /* N == 1: kb (BLK128); else kb*N + ti (VEC128) */
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
	int64_t in, out, N, ldd;
	int ok;                   /* heuristic returned an algorithm */
	int logged;               /* a refusal at run time was logged */
	cublasStatus_t status;    /* why not, when !ok */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, ld;
	cublasLtMatmulAlgo_t algo;
};

static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handle[LT_MAX_DEVICES];
static struct lt_plan **lt_slots; /* open addressing, linear probing; plans never move */
static size_t lt_cap, lt_n;

static uint64_t lt_hash(int device, int64_t in, int64_t out, int64_t N, int64_t ldd, int y_dt)
{
	uint64_t h = 0x9E3779B97F4A7C15ull;
	const uint64_t f[6] = {(uint64_t)device, (uint64_t)in, (uint64_t)out, (uint64_t)N, (uint64_t)ldd,
			       (uint64_t)y_dt};
	for (int i = 0; i < 6; i++) {
		h ^= f[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
		h *= 0xBF58476D1CE4E5B9ull;
	}
	return h ^ (h >> 31);
}

static bool lt_same(const struct lt_plan *p, int device, int64_t in, int64_t out, int64_t N, int64_t ldd, int y_dt)
{
	return p->device == device && p->in == in && p->out == out && p->N == N && p->ldd == ldd && p->y_dt == y_dt;
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
			size_t j = lt_hash(o->device, o->in, o->out, o->N, o->ldd, o->y_dt) & (cap - 1);
			while (s[j])
				j = (j + 1) & (cap - 1);
			s[j] = o;
		}
		free(lt_slots);
		lt_slots = s;
		lt_cap = cap;
	}
	size_t j = lt_hash(p->device, p->in, p->out, p->N, p->ldd, p->y_dt) & (lt_cap - 1);
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
	const int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
	const int32_t bmode = p->N == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
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
		s = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, (uint64_t)p->in, (uint64_t)p->N, p->in);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatrixLayoutCreate(&p->ld, yt, (uint64_t)p->out, (uint64_t)p->N, p->ldd);
	cublasLtMatmulPreference_t pref = NULL;
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceCreate(&pref);
	const size_t ws = KERN_LINEAR_LT_WORKSPACE_BYTES;
	const uint32_t al = 16; /* weights, codes and y (or the stage) are at least 16-byte aligned */
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
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
static struct lt_plan *lt_plan_get(int device, int64_t in, int64_t out, int64_t N, int64_t ldd, int y_dt,
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
		size_t j = lt_hash(device, in, out, N, ldd, y_dt) & (lt_cap - 1);
		for (; lt_slots[j]; j = (j + 1) & (lt_cap - 1))
			if (lt_same(lt_slots[j], device, in, out, N, ldd, y_dt)) {
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
			p->N = N;
			p->ldd = ldd;
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

/* ---- choosing the pieces of a call ---- */

struct lt_call {
	struct lt_pieces pc;
	bool staged_y;              /* y rows not 16-byte aligned: every piece through the stage */
	struct lt_plan *main, *last; /* plans of full pieces and of the last one (may be the same) */
	cublasLtHandle_t h;
};

static bool lt_piece_staged(const struct lt_call *c, int64_t tcur, int64_t N)
{
	return c->staged_y || N != tcur;
}

/* Look up (building on first use) the plans for pieces pc. ST_OK when both
 * have an algorithm; ST_UNSUPPORTED when one has none (*bad = its N). */
static enum status lt_call_plans(struct lt_call *c, int dev, int64_t in, int64_t out, int64_t ldy, int ydt,
				 int64_t *bad)
{
	cublasStatus_t cst;
	const struct lt_pieces *pc = &c->pc;
	const int64_t n_main = pc->P, n_last = pc->n_last;
	const int64_t t_main = pc->np == 1 ? pc->rem : pc->Tc;
	c->main = lt_plan_get(dev, in, out, n_main, lt_piece_staged(c, t_main, n_main) ? out : ldy, ydt, &c->h, &cst);
	if (!c->main)
		return cst == CUBLAS_STATUS_ALLOC_FAILED ? ST_NOMEM : ST_CUDA;
	c->last = c->main;
	if (pc->np > 1 || n_last != n_main) {
		c->last = lt_plan_get(dev, in, out, n_last, lt_piece_staged(c, pc->rem, n_last) ? out : ldy, ydt, &c->h,
				      &cst);
		if (!c->last)
			return cst == CUBLAS_STATUS_ALLOC_FAILED ? ST_NOMEM : ST_CUDA;
	}
	if (!c->main->ok) {
		*bad = n_main;
		return ST_UNSUPPORTED;
	}
	if (!c->last->ok) {
		*bad = n_last;
		return ST_UNSUPPORTED;
	}
	return ST_OK;
}

/* Decide the pieces of a call with T tokens and find their plans. When an N
 * has no algorithm, fall back to pieces of 16 with the last one padded to
 * 16, so only N = 16 and N = 1 remain (both checked at load: T = 16, 1).
 * staged_y: y rows are not 16-byte aligned; stage_tc: tokens one stage
 * holds (a multiple of 4, >= 16). *bad: an N without an algorithm, when
 * ST_UNSUPPORTED. */
static enum status lt_call_make(struct lt_call *c, int dev, int64_t T, int64_t in, int64_t out, int64_t ldy, int ydt,
				bool staged_y, int64_t stage_tc, int64_t *bad)
{
	memset(c, 0, sizeof *c);
	c->staged_y = staged_y;
	const int64_t Tc = staged_y ? (T > stage_tc ? stage_tc : T) : (T >= 4 ? T / 4 * 4 : T);
	lt_pieces_make(&c->pc, T, Tc, false);
	enum status st = lt_call_plans(c, dev, in, out, ldy, ydt, bad);
	if (st != ST_UNSUPPORTED || T == 1)
		return st;
	lt_pieces_make(&c->pc, T, T < LT_FALLBACK_TC ? T : LT_FALLBACK_TC, true);
	return lt_call_plans(c, dev, in, out, ldy, ydt, bad);
}

/* ---- entry points ---- */

static size_t lt_round(size_t n)
{
	return (n + LT_ALIGN - 1) / LT_ALIGN * LT_ALIGN;
}

/* Code rows a call with T tokens may use: pieces pad at most the last one, by < 16 rows. */
static size_t lt_code_rows(int64_t T)
{
	return (size_t)T + LT_FALLBACK_TC;
}

extern "C" size_t kern_linear_cublaslt_workspace_bytes(int64_t max_tokens, int64_t in)
{
	if (max_tokens < 1)
		max_tokens = 1;
	const size_t nkb = (size_t)((in + 127) / 128), rows = lt_code_rows(max_tokens);
	return lt_round(rows * (size_t)in) + lt_round((nkb * rows + 4) * sizeof(float)) + LT_STAGE_BYTES +
	       KERN_LINEAR_LT_WORKSPACE_BYTES;
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
	const int64_t T = n_tokens < 1 ? 1 : n_tokens;
	struct lt_call c;
	int64_t bad = 0;
	const enum status st = lt_call_make(&c, device, T, in, out, out, y_dtype == KERN_DT_BF16, false, 0, &bad);
	if (cur != device)
		cudaSetDevice(cur);
	if (st == ST_UNSUPPORTED) {
		snprintf(why, why_bytes,
			 "cuBLASLt heuristic: no algorithm for FP8 %s x VEC128 [%lld x %lld]ᵀ with N = %lld (T = %lld)",
			 bad == 1 ? "BLK128" : "VEC128", (long long)out, (long long)in, (long long)bad, (long long)T);
		return false;
	}
	if (st != ST_OK) {
		snprintf(why, why_bytes, "cuBLASLt: setup failed (%s)", status_str(st));
		return false;
	}
	return true;
}

extern "C" enum status kern_linear_cublaslt(const struct kern_linear_args *a)
{
	if (!a->w || a->w->fmt != KERN_WFMT_FP8_F32_R128 || a->act_quant_block != 128)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows, T = a->n_tokens;
	if (in % 128 || out % 16 || T < 0)
		return ST_INVALID;
	if (T == 0)
		return ST_OK;
	const int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	const int ydt = a->y_dtype == KERN_DT_BF16;
	const int64_t esz = kern_dtype_bytes(a->y_dtype);
	if ((uintptr_t)a->w->data % 16 || (uintptr_t)a->w->scale % 16 || ldy < out)
		return ST_INVALID;
	if (!a->workspace || a->workspace_bytes < kern_linear_cublaslt_workspace_bytes(T, in) ||
	    (uintptr_t)a->workspace % LT_ALIGN)
		return ST_INVALID;
	/* The stage must hold a padded fallback piece of 16 tokens (out <= KERN_LINEAR_LT_MAX_OUT). */
	const int64_t stage_tc = (int64_t)(LT_STAGE_BYTES / (size_t)(out * esz)) / 4 * 4;
	if (stage_tc < LT_FALLBACK_TC || T > KERN_LINEAR_LT_MAX_TOKENS)
		return ST_INVALID;
	const bool staged_y = (uintptr_t)a->y % 16 || (ldy * esz) % 16;
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess)
		return ST_CUDA;
	struct lt_call c;
	int64_t bad = 0;
	enum status st = lt_call_make(&c, dev, T, in, out, ldy, ydt, staged_y, stage_tc, &bad);
	if (st == ST_UNSUPPORTED) {
		struct lt_plan *p = c.last && !c.last->ok ? c.last : c.main;
		if (p && !p->logged) { /* once per plan; the variant's guard checked T = 1, 2, 16 and max_tokens */
			p->logged = 1;
			log_msg(LOG_ERROR, "kernels",
				"linear_cublaslt_sm90: cuBLASLt has no algorithm for [%lld -> %lld] with N = %lld "
				"(T = %lld, status %d); this call fails with ST_UNSUPPORTED",
				(long long)in, (long long)out, (long long)bad, (long long)T, (int)p->status);
		}
		return st;
	}
	if (st)
		return st;
	const struct lt_pieces *pc = &c.pc;
	const int64_t nkb = in / 128, rows = (pc->np - 1) * pc->P + pc->n_last;
	uint8_t *q = (uint8_t *)a->workspace;
	float *sc = (float *)(q + lt_round(lt_code_rows(T) * (size_t)in));
	uint8_t *stage = (uint8_t *)sc + lt_round((nkb * lt_code_rows(T) + 4) * sizeof(float));
	void *ws = stage + LT_STAGE_BYTES;
	cudaStream_t stream = (cudaStream_t)a->stream;
	dim3 grid((unsigned)rows, (unsigned)((nkb + 3) / 4));
	lt_act_quant_kernel<<<grid, 128, 0, stream>>>(a->x, (int)a->x_dtype, ldx, T, pc->Tc, pc->P, pc->np, pc->n_last,
						      in, q, sc);
	if (cudaGetLastError() != cudaSuccess)
		return ST_CUDA;
	const float alpha = 1.0f, beta = 0.0f;
	for (int64_t i = 0; i < pc->np; i++) {
		const bool last = i == pc->np - 1;
		const int64_t t0 = i * pc->Tc, tcur = last ? pc->rem : pc->Tc, N = last ? pc->n_last : pc->P;
		struct lt_plan *p = last ? c.last : c.main;
		const bool staged = lt_piece_staged(&c, tcur, N);
		const void *wsc = a->w->scale, *asc = sc + i * pc->P * nkb;
		if (cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsc, sizeof wsc) !=
			    CUBLAS_STATUS_SUCCESS ||
		    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &asc, sizeof asc) !=
			    CUBLAS_STATUS_SUCCESS)
			return ST_CUDA;
		void *d = staged ? (void *)stage : (void *)((uint8_t *)a->y + t0 * ldy * esz);
		const cublasStatus_t cst = cublasLtMatmul(c.h, p->desc, &alpha, a->w->data, p->la, q + i * pc->P * in,
							  p->lb, &beta, d, p->ld, d, p->ld, &p->algo, ws,
							  KERN_LINEAR_LT_WORKSPACE_BYTES, stream);
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

extern "C" int kern_linear_cublaslt__set_device(int device)
{
	int cur = -1;
	if (cudaGetDevice(&cur) != cudaSuccess || (cur != device && cudaSetDevice(device) != cudaSuccess)) {
		cudaGetLastError();
		return -1;
	}
	return cur;
}

/* ---- host-buffer wrapper (self-checks, tests) ---- */

extern "C" enum status kern_linear_cublaslt_host(const struct kern_linear_args *a)
{
	if (a->w && (a->w->fmt != KERN_WFMT_FP8_F32_R128 || a->act_quant_block != 128))
		return ST_INVALID;
	return kern_linear_run_on_host_buffers(a, kern_linear_cublaslt,
					       kern_linear_cublaslt_workspace_bytes(a->n_tokens, a->w ? a->w->cols : 0));
}
