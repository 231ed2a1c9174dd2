/*
 * tests/bench/bench_bf16_linear.c (suite bench, not run by default): the
 * bf16-weight linears of linear_bf16.h against the FMA floor they replace
 * (linear_cuda_generic_bf16), at DeepSeek-V4-Flash's bf16 shapes; one
 * markdown table.
 *
 * Rows:
 *   decode (linear_cuda_gemv_bf16, linear_mma_bf16w, linear_cuda_generic_bf16):
 *     the lm_head [129280 x 4096] and the router gate [256 x 4096] at T = 1,
 *     2, 7, 16, 32, 64 (the MMA beside the GEMV shows where their plans
 *     should meet); GB/s = the weight bytes the call must read / time (the
 *     roofline column for a GEMV);
 *   prefill (linear_mma_bf16w vs linear_cuda_generic_bf16): the lm_head at
 *     T = 64, 100, 512, 4096 (prompt log-probabilities run it over the
 *     prompt rows), with f32 activations as they come (three bf16 terms per
 *     K tile) and with f32 activations that are bf16 values (one term: what
 *     a bf16-rounded hidden state costs); TFLOP/s = 2·T·out·in / time.
 * Columns: median µs per call, GB/s, TFLOP/s, speed-up over the generic
 * kernel on the same call (its own row: 1.00x).
 *
 * Method as bench_prefill.c: buffers allocated once, 2 warm-up calls, then
 * `iters` calls (the generic kernel: at most 3 from T = 512 on, it takes
 * about 0.65 s per 4096-row head) each after a 256 MiB memset that evicts
 * L2, each timed alone with CUDA events; the median is reported. x f32 and
 * y f32 (the model's), random values.
 *
 * Usage: bench_bf16_linear [iters]   (default 10). Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_bf16.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

#define FLUSH_BYTES ((size_t)256 << 20)

static void *flush_buf;
static cudaEvent_t ev0, ev1;

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median µs of iters calls of v on a (after 2 warm-up calls); NAN on a failure (reported in *st). */
static double time_us(const struct kern_variant *v, const struct kern_linear_args *a, int iters, enum status *st)
{
	const kern_linear_fn fn = (kern_linear_fn)v->run;
	*st = ST_OK;
	for (int i = 0; i < 2 && *st == ST_OK; i++)
		*st = fn(a);
	if (*st || cudaDeviceSynchronize() != cudaSuccess) {
		if (!*st)
			*st = ST_CUDA;
		cudaGetLastError();
		return NAN;
	}
	float *ms = malloc(sizeof(float) * (size_t)iters);
	if (!ms) {
		*st = ST_NOMEM;
		return NAN;
	}
	for (int i = 0; i < iters && *st == ST_OK; i++) {
		cudaMemsetAsync(flush_buf, i & 0xFF, FLUSH_BYTES, 0);
		cudaEventRecord(ev0, 0);
		*st = fn(a);
		cudaEventRecord(ev1, 0);
		cudaEventSynchronize(ev1);
		cudaEventElapsedTime(&ms[i], ev0, ev1);
	}
	if (cudaGetLastError() != cudaSuccess && *st == ST_OK)
		*st = ST_CUDA;
	qsort(ms, (size_t)iters, sizeof *ms, cmp_f);
	const double us = 1000.0 * ms[iters / 2];
	free(ms);
	return *st ? NAN : us;
}

static void *dev_copy(const void *h, size_t bytes)
{
	void *d = NULL;
	if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
		fprintf(stderr, "device copy of %zu bytes failed\n", bytes);
		exit(1);
	}
	return d;
}

/* One row per variant of vs[n] on the same call; the last one (the generic
 * kernel, gen_iters calls) is what the speed-up column divides. */
static void rows(const char *what, const char *xdesc, const struct kern_variant *const *vs, int n,
		 struct kern_linear_args *a, int iters, int gen_iters)
{
	const double bytes = 2.0 * (double)a->w->rows * (double)a->w->cols;
	const double flop = 2.0 * (double)a->n_tokens * (double)a->w->rows * (double)a->w->cols;
	double ts[4];
	enum status ss[4];
	for (int i = n - 1; i >= 0; i--)
		ts[i] = time_us(vs[i], a, i == n - 1 ? gen_iters : iters, &ss[i]);
	for (int i = 0; i < n; i++) {
		if (ss[i]) {
			printf("| %s | %lld | %s | %s | failed: %s | | | |\n", what, (long long)a->n_tokens, xdesc, vs[i]->name,
			       status_str(ss[i]));
			continue;
		}
		printf("| %s | %lld | %s | %s | %.1f | %.0f | %.2f | %.2fx |\n", what, (long long)a->n_tokens, xdesc,
		       vs[i]->name, ts[i], bytes / ts[i] * 1e-3, flop / ts[i] * 1e-6, ts[n - 1] / ts[i]);
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const int iters = argc > 1 ? atoi(argv[1]) : 10;
	int n_dev = 0;
	if (iters < 1 || cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
		fprintf(stderr, "no CUDA device (or bad iteration count)\n");
		return 77;
	}
	const struct kern_variant *gv = NULL, *mv = NULL, *gen = NULL;
	for (int i = 0; i < kern_op_linear.n_variants; i++) {
		const struct kern_variant *v = &kern_op_linear.variants[i];
		if (!strcmp(v->name, "linear_cuda_gemv_bf16"))
			gv = v;
		else if (!strcmp(v->name, "linear_mma_bf16w"))
			mv = v;
		else if (!strcmp(v->name, "linear_cuda_generic_bf16"))
			gen = v;
	}
	if (!gv || !mv || !gen || !gv->run || !mv->run || !gen->run) {
		fprintf(stderr, "a bf16 linear variant is missing from this build\n");
		return 1;
	}
	struct cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, 0);
	if (cudaMalloc(&flush_buf, FLUSH_BYTES) != cudaSuccess)
		return 1;
	cudaEventCreate(&ev0);
	cudaEventCreate(&ev1);

	/* Weights (random bf16), activations (4096 rows, f32, and the same rounded to bf16 values), outputs. */
	const int64_t in = 4096, n_head = 129280, n_gate = 256, TM = 4096;
	uint64_t rng = 0xbf16bf16ull;
	struct err e = {0};
	struct kern_wmat head, gate;
	if (kern_wmat_make_random(&head, KERN_WFMT_BF16, n_head, in, &rng, &e) ||
	    kern_wmat_make_random(&gate, KERN_WFMT_BF16, n_gate, in, &rng, &e)) {
		fprintf(stderr, "weights: %s\n", e.msg);
		return 1;
	}
	float *x = malloc((size_t)(TM * in) * sizeof(float)), *xr = malloc((size_t)(TM * in) * sizeof(float));
	if (!x || !xr)
		return 1;
	for (int64_t i = 0; i < TM * in; i++) {
		x[i] = kern_rand_f32(&rng);
		xr[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
	}
	struct kern_wmat dhead = head, dgate = gate;
	dhead.data = dev_copy(head.data, kern_wmat_data_bytes(&head));
	dgate.data = dev_copy(gate.data, kern_wmat_data_bytes(&gate));
	dhead.owned = dgate.owned = NULL;
	void *dx = dev_copy(x, (size_t)(TM * in) * sizeof(float)), *dxr = dev_copy(xr, (size_t)(TM * in) * sizeof(float));
	void *dy = NULL;
	if (cudaMalloc(&dy, (size_t)(TM * n_head) * sizeof(float)) != cudaSuccess)
		return 1;

	printf("## bf16-weight linears on %s (cc %d.%d, %d SMs), %d iterations, x and y f32\n\n", prop.name, prop.major,
	       prop.minor, prop.multiProcessorCount, iters);
	printf("| linear | T | x | variant | µs | GB/s (weights) | TFLOP/s | speed-up |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	/* Decode sizes: the GEMV, the MMA (correct at any T; where it overtakes the
	 * GEMV is where KERN_LINEAR_GEMV_BF16_MAX_TOKENS belongs) and the floor. */
	static const int64_t dec_T[] = {1, 2, 7, 16, 32, 64};
	const struct kern_variant *dec_vs[3] = {gv, mv, gen}, *pre_vs[2] = {mv, gen};
	for (int m = 0; m < 2; m++)
		for (int i = 0; i < 6; i++) {
			struct kern_linear_args a = {.n_tokens = dec_T[i], .x = dx, .x_dtype = KERN_DT_F32, .y = dy,
						     .y_dtype = KERN_DT_F32, .w = m ? &dgate : &dhead};
			rows(m ? "router gate 256x4096" : "lm_head 129280x4096", "f32", dec_vs, 3, &a, iters, iters);
		}
	static const int64_t pre_T[] = {64, 100, 512, 4096};
	for (int i = 0; i < 4; i++)
		for (int r = 0; r < 2; r++) {
			struct kern_linear_args a = {.n_tokens = pre_T[i], .x = r ? dxr : dx, .x_dtype = KERN_DT_F32,
						     .y = dy, .y_dtype = KERN_DT_F32, .w = &dhead};
			rows("lm_head 129280x4096", r ? "f32 of bf16 values (1 term)" : "f32 (3 terms)", pre_vs, 2, &a, iters,
			     pre_T[i] >= 512 && iters > 3 ? 3 : iters);
		}
	printf("\n");
	cudaFree(dx);
	cudaFree(dxr);
	cudaFree(dy);
	cudaFree((void *)dhead.data);
	cudaFree((void *)dgate.data);
	cudaFree(flush_buf);
	kern_wmat_release(&head);
	kern_wmat_release(&gate);
	free(x);
	free(xr);
	return 0;
}

#else

int main(void)
{
	fprintf(stderr, "built without CUDA\n");
	return 77;
}

#endif
