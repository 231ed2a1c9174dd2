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
 * kernel on the same call (its own row: 1.00x); prefill rows also give
 * cuBLASLt's bf16 GEMM rate on the same M, N, K (bf16 in and out, f32
 * compute: the tensor-core yardstick) and the variant's share of it.
 *
 * Method: bench_util.h's timer (median of `iters` calls, L2 flushed before
 * each, CUDA events around run() alone; the generic kernel at most 3 calls
 * from T = 512 on: about 0.65 s per 4096-row head); buffers allocated once;
 * x f32 and y f32 (the model's), random values.
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

#include "tests/bench/bench_util.h"

#define LT_FILL 0x30 /* cuBLASLt operands: bf16 0x3030, finite sums */

/* One row per variant of vs[n] on the same call; the last one (the generic
 * kernel, gen_iters calls) is what the speed-up column divides. lt: add
 * cuBLASLt's bf16 rate on the same shape. */
static void rows(const char *what, const char *xdesc, const struct kern_variant *const *vs, int n,
		 const struct kern_linear_args *a, int iters, int gen_iters, bool lt)
{
	const double bytes = 2.0 * (double)a->w->rows * (double)a->w->cols;
	const double flop = 2.0 * (double)a->n_tokens * (double)a->w->rows * (double)a->w->cols;
	double ts[4];
	enum status ss[4];
	for (int i = n - 1; i >= 0; i--) {
		struct bench_lin_ctx c = {.fn = (kern_linear_fn)vs[i]->run, .a = *a};
		ts[i] = bench_time_us(bench_lin_run, &c, i == n - 1 ? gen_iters : iters, &ss[i]);
	}
	char why[KERN_REASON_BYTES] = "", lts[64] = "";
	const double lt_flops = lt ? bench_lt_gemm_flops(false, a->w->rows, a->n_tokens, a->w->cols, LT_FILL, iters, why,
							 sizeof why)
				   : 0.0;
	if (lt)
		snprintf(lts, sizeof lts, lt_flops > 0 ? "%.1f" : "refused", lt_flops * 1e-12);
	for (int i = 0; i < n; i++) {
		if (ss[i]) {
			printf("| %s | %lld | %s | %s | failed: %s | | | | |\n", what, (long long)a->n_tokens, xdesc,
			       vs[i]->name, status_str(ss[i]));
			continue;
		}
		char share[32] = "";
		if (lt && lt_flops > 0 && i < n - 1)
			snprintf(share, sizeof share, " (%.0f %%)", 100.0 * flop / (ts[i] * 1e-6) / lt_flops);
		printf("| %s | %lld | %s | %s | %.1f | %.0f | %.2f | %.2fx | %s%s |\n", what, (long long)a->n_tokens, xdesc,
		       vs[i]->name, ts[i], bytes / ts[i] * 1e-3, flop / ts[i] * 1e-6, ts[n - 1] / ts[i], lts, share);
	}
	if (lt && lt_flops <= 0)
		fprintf(stderr, "cuBLASLt bf16 [%lld x %lld x %lld]: %s\n", (long long)a->w->rows, (long long)a->n_tokens,
			(long long)a->w->cols, why);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const int iters = argc > 1 ? atoi(argv[1]) : 10;
	if (iters < 1) {
		fprintf(stderr, "usage: bench_bf16_linear [iters >= 1]\n");
		return 2;
	}
	struct kern_device dev;
	int rc = bench_start(&dev);
	if (rc)
		return rc;
	const struct kern_variant *gv = bench_find_variant(&kern_op_linear, "linear_cuda_gemv_bf16");
	const struct kern_variant *mv = bench_find_variant(&kern_op_linear, "linear_mma_bf16w");
	const struct kern_variant *gen = bench_find_variant(&kern_op_linear, "linear_cuda_generic_bf16");
	if (!gv || !mv || !gen || !gv->run || !mv->run || !gen->run) {
		fprintf(stderr, "a bf16 linear variant is missing from this build\n");
		return 1;
	}

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
	struct kern_wmat dhead = bench_wmat_upload(&head), dgate = bench_wmat_upload(&gate);
	void *dx = bench_dev_upload(x, (size_t)(TM * in) * sizeof(float));
	void *dxr = bench_dev_upload(xr, (size_t)(TM * in) * sizeof(float));
	void *dy = bench_dev_upload(NULL, (size_t)(TM * n_head) * sizeof(float));
	if (!dhead.data || !dgate.data || !dx || !dxr || !dy) {
		fprintf(stderr, "device buffers: out of memory\n");
		return 1;
	}

	printf("## bf16-weight linears on %s (cc %d.%d, %d SMs), %d iterations, x and y f32\n\n", dev.name,
	       dev.cc_major, dev.cc_minor, dev.sm_count, iters);
	printf("| linear | T | x | variant | µs | GB/s (weights) | TFLOP/s | speed-up | cuBLASLt bf16 TFLOP/s |\n");
	printf("|---|---|---|---|---|---|---|---|---|\n");
	/* Decode sizes: the GEMV, the MMA (correct at any T; where it overtakes the
	 * GEMV is where KERN_LINEAR_GEMV_BF16_MAX_TOKENS belongs) and the floor. */
	static const int64_t dec_T[] = {1, 2, 7, 16, 32, 64};
	const struct kern_variant *dec_vs[3] = {gv, mv, gen}, *pre_vs[2] = {mv, gen};
	for (int m = 0; m < 2; m++)
		for (int i = 0; i < 6; i++) {
			struct kern_linear_args a = {.n_tokens = dec_T[i], .x = dx, .x_dtype = KERN_DT_F32, .y = dy,
						     .y_dtype = KERN_DT_F32, .w = m ? &dgate : &dhead};
			rows(m ? "router gate 256x4096" : "lm_head 129280x4096", "f32", dec_vs, 3, &a, iters, iters, false);
		}
	static const int64_t pre_T[] = {64, 100, 512, 4096};
	for (int i = 0; i < 4; i++)
		for (int r = 0; r < 2; r++) {
			struct kern_linear_args a = {.n_tokens = pre_T[i], .x = r ? dxr : dx, .x_dtype = KERN_DT_F32,
						     .y = dy, .y_dtype = KERN_DT_F32, .w = &dhead};
			rows("lm_head 129280x4096", r ? "f32 of bf16 values (1 term)" : "f32 (3 terms)", pre_vs, 2, &a, iters,
			     pre_T[i] >= 512 && iters > 3 ? 3 : iters, r == 0);
		}
	printf("\n");
	cudaFree(dx);
	cudaFree(dxr);
	cudaFree(dy);
	bench_wmat_free(&dhead);
	bench_wmat_free(&dgate);
	bench_timer_release();
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
