/*
 * tests/bench/bench_util.c: the timer, bandwidth runs, cuBLASLt GEMM rate and
 * device helpers the GPU kernel benchmarks share (bench_util.h says what each
 * measures). Built without CUDA it holds nothing: the benchmarks then skip.
 */
#include "tests/bench/bench_util.h"

#if DSV4_HAVE_CUDA
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "kernels/moe_gemm/moe_gemv.h"

static void *flush_buf;
static cudaEvent_t ev0, ev1;

enum status bench_timer_init(void)
{
	if (cudaMalloc(&flush_buf, BENCH_FLUSH_BYTES) != cudaSuccess)
		return ST_CUDA;
	cudaEventCreate(&ev0);
	cudaEventCreate(&ev1);
	return ST_OK;
}

void bench_timer_release(void)
{
	cudaFree(flush_buf);
	flush_buf = NULL;
}

int bench_start(struct kern_device *dev)
{
	if (kern_device_count() == 0) {
		fprintf(stderr, "SKIP: no CUDA device\n");
		return 77;
	}
	struct err e = {0};
	if (kern_device_detect(0, dev, &e) != ST_OK) {
		fprintf(stderr, "SKIP: %s\n", e.msg);
		return 77;
	}
	if (bench_timer_init() != ST_OK) {
		fprintf(stderr, "cannot allocate the L2 flush buffer\n");
		return 1;
	}
	return 0;
}

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

double bench_time_us(bench_fn fn, void *ctx, int iters, enum status *st)
{
	*st = ST_OK;
	for (int i = 0; i < 3 && *st == ST_OK; i++)
		*st = fn(ctx);
	if (*st || cudaDeviceSynchronize() != cudaSuccess) {
		if (!*st)
			*st = ST_CUDA;
		cudaGetLastError();
		return NAN;
	}
	float *ms = malloc(sizeof(float) * (size_t)iters);
	for (int i = 0; i < iters && *st == ST_OK; i++) {
		cudaMemsetAsync(flush_buf, i & 0xFF, BENCH_FLUSH_BYTES, 0);
		cudaEventRecord(ev0, 0);
		*st = fn(ctx);
		cudaEventRecord(ev1, 0);
		cudaEventSynchronize(ev1);
		cudaEventElapsedTime(&ms[i], ev0, ev1);
	}
	qsort(ms, (size_t)iters, sizeof *ms, cmp_f);
	double med = ms[iters / 2] * 1e3;
	free(ms);
	if (cudaDeviceSynchronize() != cudaSuccess && !*st) {
		*st = ST_CUDA;
		cudaGetLastError();
	}
	return *st ? NAN : med;
}

void *bench_dev_upload(const void *h, size_t n)
{
	void *d = NULL;
	if (cudaMalloc(&d, n ? n : 1) != cudaSuccess)
		return NULL;
	if (h && n)
		cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
	return d;
}

struct kern_wmat bench_wmat_upload(const struct kern_wmat *w)
{
	struct kern_wmat dw = *w;
	dw.owned = NULL;
	dw.data = bench_dev_upload(w->data, kern_wmat_data_bytes(w));
	dw.scale = bench_dev_upload(w->scale, kern_wmat_scale_bytes(w));
	return dw;
}

void bench_wmat_free(struct kern_wmat *dw)
{
	cudaFree((void *)dw->data);
	cudaFree((void *)dw->scale);
}

const struct kern_variant *bench_find_variant(const struct kern_op *op, const char *name)
{
	for (int i = 0; i < op->n_variants; i++)
		if (!strcmp(op->variants[i].name, name))
			return &op->variants[i];
	return NULL;
}

enum status bench_lin_run(void *c)
{
	struct bench_lin_ctx *l = c;
	return l->fn(&l->a);
}

enum status bench_moe_run(void *c)
{
	struct bench_moe_ctx *m = c;
	return m->fn(&m->a);
}

enum status bench_bw_run(void *c)
{
	struct bench_bw_ctx *b = c;
	if (b->kind == BENCH_BW_MEMCPY)
		return cudaMemcpyAsync(b->dst, b->src, b->bytes, cudaMemcpyDeviceToDevice, 0) == cudaSuccess ? ST_OK
													: ST_CUDA;
	if (b->kind == BENCH_BW_COPY)
		return kern_moe_gemv_bench_copy(b->dst, b->src, b->bytes, NULL);
	return kern_moe_gemv_bench_read(b->src, b->bytes, b->sink, NULL);
}

/* ---- cuBLASLt GEMM rate ---- */

struct lt_ctx {
	cublasLtHandle_t h;
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulHeuristicResult_t heur;
	const void *A, *B;
	void *C, *ws;
	size_t ws_bytes;
};

static enum status lt_run(void *c)
{
	struct lt_ctx *l = c;
	const float alpha = 1.0f, beta = 0.0f;
	return cublasLtMatmul(l->h, l->op, &alpha, l->A, l->la, l->B, l->lb, &beta, l->C, l->lc, l->C, l->lc,
			      &l->heur.algo, l->ws, l->ws_bytes, 0) == CUBLAS_STATUS_SUCCESS
		       ? ST_OK
		       : ST_CUDA;
}

double bench_lt_gemm_flops(bool fp8, int64_t m, int64_t n, int64_t k, int fill, int iters, char *why,
			   size_t why_bytes)
{
	struct lt_ctx l = {0};
	double flops = 0;
	const size_t eb = fp8 ? 1 : 2;
	const cudaDataType_t ab_t = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
	const char *what = fp8 ? "FP8" : "bf16";
	void *A = NULL, *B = NULL, *C = NULL;
	float *dscale = NULL;
	const float one = 1.0f;
	l.ws_bytes = (size_t)64 << 20;
	snprintf(why, why_bytes, "cuBLASLt setup failed");
	if (cudaMalloc(&A, (size_t)(m * k) * eb) || cudaMalloc(&B, (size_t)(n * k) * eb) ||
	    cudaMalloc(&C, (size_t)(m * n) * 2) || cudaMalloc(&l.ws, l.ws_bytes) ||
	    cudaMalloc((void **)&dscale, sizeof(float)))
		goto out;
	cudaMemset(A, fill, (size_t)(m * k) * eb);
	cudaMemset(B, fill, (size_t)(n * k) * eb);
	cudaMemcpy(dscale, &one, sizeof one, cudaMemcpyHostToDevice);
	l.A = A;
	l.B = B;
	l.C = C;
	if (cublasLtCreate(&l.h) != CUBLAS_STATUS_SUCCESS ||
	    cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
		goto out;
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
	cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
	if (fp8) {
		cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dscale, sizeof dscale);
		cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dscale, sizeof dscale);
	}
	if (cublasLtMatrixLayoutCreate(&l.la, ab_t, (uint64_t)k, (uint64_t)m, k) != CUBLAS_STATUS_SUCCESS ||
	    cublasLtMatrixLayoutCreate(&l.lb, ab_t, (uint64_t)k, (uint64_t)n, k) != CUBLAS_STATUS_SUCCESS ||
	    cublasLtMatrixLayoutCreate(&l.lc, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, m) != CUBLAS_STATUS_SUCCESS)
		goto out;
	cublasLtMatmulPreference_t pref = NULL;
	int found = 0;
	if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
		cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &l.ws_bytes,
						     sizeof l.ws_bytes);
		if (cublasLtMatmulAlgoGetHeuristic(l.h, l.op, l.la, l.lb, l.lc, l.lc, pref, 1, &l.heur, &found) !=
		    CUBLAS_STATUS_SUCCESS)
			found = 0;
		cublasLtMatmulPreferenceDestroy(pref);
	}
	if (!found) {
		snprintf(why, why_bytes, "cuBLASLt found no %s algorithm", what);
		goto out;
	}
	enum status st;
	double us = bench_time_us(lt_run, &l, iters, &st);
	if (st == ST_OK && us > 0)
		flops = 2.0 * (double)m * n * k / (us * 1e-6);
	else
		snprintf(why, why_bytes, "cuBLASLt %s matmul failed", what);
out:
	if (l.la)
		cublasLtMatrixLayoutDestroy(l.la);
	if (l.lb)
		cublasLtMatrixLayoutDestroy(l.lb);
	if (l.lc)
		cublasLtMatrixLayoutDestroy(l.lc);
	if (l.op)
		cublasLtMatmulDescDestroy(l.op);
	if (l.h)
		cublasLtDestroy(l.h);
	cudaFree(A);
	cudaFree(B);
	cudaFree(C);
	cudaFree(l.ws);
	cudaFree(dscale);
	cudaGetLastError();
	return flops;
}

#endif
