/*
 * tests/bench/bench_prefill.c (suite bench, not run by default): the
 * prefill-sized FP8 linears and FP4 expert GEMMs against cuBLASLt's FP8 GEMM
 * on the same shape, measured in the same run; one markdown table.
 *
 * Rows:
 *   "cuBLASLt FP8 8192^3": the FP8 tensor rate cuBLASLt reaches on this GPU
 *     (e4m3 x e4m3, SCALAR_32F scales, TN, bf16 out) -- the yardstick;
 *   linear (FP8 128x128 weights, act_quant 128, bf16 x and y): wq_a 4096 ->
 *     1024, wq_b 1024 -> 32768, wkv 4096 -> 512, wo_b 8192 -> 4096 at T = 64,
 *     256, 1024, 4096, 16384: every CUDA variant this device accepts
 *     (linear_mma_fp8_*, linear_mma_bf16, linear_cublaslt_sm90;
 *     linear_cuda_generic up to T = 1024);
 *   moe_gemm (FP4 experts, act_quant 128, bf16 x and y): 256 experts of
 *     w1 4096 -> 2048 (rows gathered from T = rows / 6 tokens) and w2 2048 ->
 *     4096 (rows in place), every expert holding 16, 64, 128 or 256 rows:
 *     moe_gemm_mma_*_only (the kernels without the GEMV dispatch),
 *     moe_gemm_sm90_fp4 and moe_gemm_cuda_generic (up to 64 rows per expert).
 * Columns: median µs per call (quantization of x included: it is part of
 * run()), TFLOP/s (2·M·N·K), cuBLASLt FP8 on the same M, N, K as one dense
 * GEMM (for the experts: all rows as one GEMM, what grouping cannot beat),
 * and the variant's rate as a percentage of both cuBLASLt numbers.
 * Goals (issue 15): linears at T >= 1024 >= 70 % of cuBLASLt FP8 on the same
 * shape; experts at >= 64 rows per expert >= 50 % of the cuBLASLt FP8 rate.
 *
 * Method as bench_kernels.c: buffers allocated once per case, 3 warm-up
 * calls, then `iters` calls each after a 256 MiB memset that evicts L2, each
 * timed alone with CUDA events around run(); the median is reported. All 256
 * experts hold the bytes of one random expert (distinct device copies, so the
 * memory traffic is real; timing does not depend on the values).
 *
 * Usage: bench_prefill [iters]   (default 10). Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_cublaslt.h"
#include "tests/bench/bench_util.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

static double g_lt_peak; /* cuBLASLt FP8 8192^3, FLOP/s */

/* the cuBLASLt operands' byte: e4m3 0.5, so sums stay finite in bf16 */
#define LT_FILL 0x30

static void row(const char *op, const char *shape, const char *variant, double us, double flops, double lt_same,
		enum status st, const char *why)
{
	if (st != ST_OK || why) {
		printf("| %-8s | %-34s | %-26s | %s | | | | | |\n", op, shape, variant, why ? why : status_str(st));
		return;
	}
	const double rate = flops / (us * 1e-6);
	char same[32] = "-", pct_same[16] = "-";
	if (lt_same > 0) {
		snprintf(same, sizeof same, "%.1f", lt_same / 1e12);
		snprintf(pct_same, sizeof pct_same, "%.0f%%", 100.0 * rate / lt_same);
	}
	printf("| %-8s | %-34s | %-26s | %10.1f | %7.1f | %7s | %6s | %5.0f%% |\n", op, shape, variant, us, rate / 1e12,
	       same, pct_same, g_lt_peak > 0 ? 100.0 * rate / g_lt_peak : 0.0);
}

static const char *fp8_image(const struct kern_device *dev)
{
	switch (dev->cc_major * 10 + dev->cc_minor) {
	case 90: return "sm90a";
	case 100: return "sm100a";
	case 120: return "sm120a";
	case 121: return "sm121a";
	default: return NULL;
	}
}

/* ---- linear ---- */

static void bench_linear(const struct kern_device *dev, int iters)
{
	static const struct {
		const char *name;
		int64_t in, out;
	} shapes[] = {{"wq_a", 4096, 1024}, {"wq_b", 1024, 32768}, {"wkv", 4096, 512}, {"wo_b", 8192, 4096}};
	static const int64_t Ts[] = {64, 256, 1024, 4096, 16384};
	char fp8name[64] = "";
	if (fp8_image(dev))
		snprintf(fp8name, sizeof fp8name, "linear_mma_fp8_%s", fp8_image(dev));
	const char *vnames[] = {fp8name, "linear_mma_bf16", "linear_cublaslt_sm90", "linear_cuda_generic"};
	for (int s = 0; s < 4; s++) {
		const int64_t in = shapes[s].in, out = shapes[s].out;
		struct kern_wmat w = {0};
		struct err e = {0};
		uint64_t rng = 0x5eed1234ull + (uint64_t)s;
		if (kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, out, in, &rng, &e) != ST_OK) {
			printf("| linear | %s | weights: %s | | | | | | |\n", shapes[s].name, e.msg);
			continue;
		}
		for (int ti = 0; ti < 5; ti++) {
			const int64_t T = Ts[ti];
			char shape[96], why[KERN_REASON_BYTES];
			snprintf(shape, sizeof shape, "%s %lld -> %lld, T %lld", shapes[s].name, (long long)in, (long long)out,
				 (long long)T);
			const double flops = 2.0 * (double)T * in * out;
			const double lt_same = bench_lt_gemm_flops(true, out, T, in, LT_FILL, iters, why, sizeof why);
			row("linear", shape, "cuBLASLt FP8 (plain)", lt_same > 0 ? flops / lt_same * 1e6 : 0, flops, lt_same,
			    ST_OK, lt_same > 0 ? NULL : why);
			uint16_t *hx = malloc((size_t)(T * in) * 2);
			for (int64_t i = 0; i < T * in; i++)
				hx[i] = (uint16_t)(0x3C00 + (kern_rand_u64(&rng) & 0x3FF)) ^ (uint16_t)((i & 1) << 15);
			void *dx = bench_dev_upload(hx, (size_t)(T * in) * 2);
			void *dy = bench_dev_upload(NULL, (size_t)(T * out) * 2);
			free(hx);
			struct kern_linear_shape ls = {.in = in, .out = out, .max_tokens = T, .act_quant_block = 128,
						       .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
			struct kern_problem p = {.wfmt = w.fmt, .tp_size = 1, .shape = &ls};
			for (int vi = 0; vi < 4; vi++) {
				const struct kern_variant *v =
					vnames[vi][0] ? bench_find_variant(&kern_op_linear, vnames[vi]) : NULL;
				if (!v || (vi == 3 && T > 1024))
					continue;
				if (!kern_variant_accepts(v, &p, dev, NULL, why, sizeof why) || !v->run) {
					if (vi < 2)
						row("linear", shape, v->name, 0, 0, 0, ST_OK, why);
					continue;
				}
				struct kern_wmat wp = {0};
				if (kern_prepare_weight(v, &w, &wp, &e) != ST_OK) {
					row("linear", shape, v->name, 0, 0, 0, ST_OK, e.msg);
					continue;
				}
				struct kern_wmat dw = bench_wmat_upload(&wp);
				size_t wsb = vi == 2 ? kern_linear_cublaslt_workspace_bytes(T, in) : 0;
				void *ws = wsb ? bench_dev_upload(NULL, wsb) : NULL;
				struct bench_lin_ctx lc = {.fn = (kern_linear_fn)v->run,
						     .a = {.n_tokens = T, .x = dx, .x_dtype = KERN_DT_BF16, .y = dy,
							   .y_dtype = KERN_DT_BF16, .w = &dw, .act_quant_block = 128,
							   .workspace = ws, .workspace_bytes = wsb}};
				enum status st;
				double us = bench_time_us(bench_lin_run, &lc, iters, &st);
				row("linear", shape, v->name, us, flops, lt_same, st, NULL);
				bench_wmat_free(&dw);
				cudaFree(ws);
				kern_wmat_release(&wp);
			}
			cudaFree(dx);
			cudaFree(dy);
			fflush(stdout);
		}
		kern_wmat_release(&w);
	}
}

/* ---- moe_gemm ---- */

static void bench_moe(const struct kern_device *dev, int iters)
{
	const int64_t E = 256;
	static const int64_t rpes[] = {16, 64, 128, 256};
	static const int64_t shapes[2][2] = {{4096, 2048}, {2048, 4096}};
	char fp8name[64] = "";
	if (fp8_image(dev))
		snprintf(fp8name, sizeof fp8name, "moe_gemm_mma_fp8_%s", fp8_image(dev));
	for (int f = 0; f < 2; f++)
		for (int s = 0; s < 2; s++) {
			const enum kern_wfmt fmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4;
			const int64_t in = shapes[s][0], out = shapes[s][1];
			struct kern_wmat w = {0};
			struct err e = {0};
			uint64_t rng = 0xabcdull + (uint64_t)(2 * f + s);
			if (kern_wmat_make_random(&w, fmt, out, in, &rng, &e) != ST_OK)
				continue;
			const size_t db = kern_wmat_data_bytes(&w), sb = kern_wmat_scale_bytes(&w);
			const size_t stride = ((db + 255) & ~(size_t)255) + ((sb + 255) & ~(size_t)255);
			uint8_t *dwbuf = bench_dev_upload(NULL, (size_t)E * stride);
			struct kern_wmat *hw = calloc((size_t)E, sizeof *hw);
			for (int64_t x = 0; dwbuf && x < E; x++) {
				hw[x] = w;
				hw[x].owned = NULL;
				hw[x].data = dwbuf + x * stride;
				hw[x].scale = dwbuf + x * stride + ((db + 255) & ~(size_t)255);
				cudaMemcpy((void *)hw[x].data, w.data, db, cudaMemcpyHostToDevice);
				cudaMemcpy((void *)hw[x].scale, w.scale, sb, cudaMemcpyHostToDevice);
			}
			void *dwm = bench_dev_upload(hw, (size_t)E * sizeof *hw);
			for (int ri = 0; ri < 4; ri++) {
				const int64_t rpe = rpes[ri], R = E * rpe, X = s == 0 ? (R + 5) / 6 : R;
				char shape[96], why[KERN_REASON_BYTES];
				snprintf(shape, sizeof shape, "%s %s %lld -> %lld, %lld x %lld rows", kern_wfmt_name(fmt),
					 s == 0 ? "w1" : "w2", (long long)in, (long long)out, (long long)E, (long long)rpe);
				const double flops = 2.0 * (double)R * in * out;
				const double lt_same = bench_lt_gemm_flops(true, out, R, in, LT_FILL, iters, why, sizeof why);
				row("moe_gemm", shape, "cuBLASLt FP8 (dense, all rows)",
				    lt_same > 0 ? flops / lt_same * 1e6 : 0, flops, lt_same, ST_OK, lt_same > 0 ? NULL : why);
				int32_t *off = malloc(sizeof(int32_t) * (size_t)(E + 1)), *src = malloc(sizeof(int32_t) * (size_t)R);
				for (int64_t x = 0; x <= E; x++)
					off[x] = (int32_t)(x * rpe);
				for (int64_t r = 0; r < R; r++)
					src[r] = (int32_t)(kern_rand_u64(&rng) % (uint64_t)X);
				uint16_t *hx = malloc((size_t)(X * in) * 2);
				for (int64_t i = 0; i < X * in; i++)
					hx[i] = (uint16_t)(0x3C00 + (kern_rand_u64(&rng) & 0x3FF)) ^ (uint16_t)((i & 1) << 15);
				void *dx = bench_dev_upload(hx, (size_t)(X * in) * 2);
				void *dy = bench_dev_upload(NULL, (size_t)(R * out) * 2);
				void *doff = bench_dev_upload(off, sizeof(int32_t) * (size_t)(E + 1));
				void *dsrc = s == 0 ? bench_dev_upload(src, sizeof(int32_t) * (size_t)R) : NULL;
				free(hx);
				struct kern_moe_gemm_shape ms = {.in = in, .out = out, .n_experts = E, .max_rows = R,
								 .act_quant_block = 128, .x_dtype = KERN_DT_BF16,
								 .y_dtype = KERN_DT_BF16};
				struct kern_problem p = {.wfmt = fmt, .tp_size = 1, .shape = &ms};
				struct {
					const char *name;
					kern_moe_gemm_fn fn;
				} vs[4] = {{fp8name, kern_moe_gemm_mma_fp8_only},
					   {"moe_gemm_mma_bf16", kern_moe_gemm_mma_bf16_only},
					   {"moe_gemm_sm90_fp4", NULL},
					   {"moe_gemm_cuda_generic", NULL}};
				for (int vi = 0; vi < 4; vi++) {
					const struct kern_variant *v =
						vs[vi].name[0] ? bench_find_variant(&kern_op_moe_gemm, vs[vi].name) : NULL;
					if (!v || (vi == 3 && rpe > 64))
						continue;
					if (!kern_variant_accepts(v, &p, dev, NULL, why, sizeof why) || !v->run) {
						if (vi < 2)
							row("moe_gemm", shape, v->name, 0, 0, 0, ST_OK, why);
						continue;
					}
					struct bench_moe_ctx mc = {.fn = vs[vi].fn ? vs[vi].fn : (kern_moe_gemm_fn)v->run,
							     .a = {.n_rows = R, .n_experts = E, .expert_offsets = doff,
								   .row_src = dsrc, .n_x_rows = X, .x = dx,
								   .x_dtype = KERN_DT_BF16, .y = dy, .y_dtype = KERN_DT_BF16,
								   .w = hw, .w_dev = dwm, .act_quant_block = 128}};
					enum status st;
					double us = bench_time_us(bench_moe_run, &mc, iters, &st);
					row("moe_gemm", shape, v->name, us, flops, lt_same, st, NULL);
				}
				cudaFree(dx);
				cudaFree(dy);
				cudaFree(doff);
				cudaFree(dsrc);
				free(off);
				free(src);
				fflush(stdout);
			}
			cudaFree(dwm);
			cudaFree(dwbuf);
			free(hw);
			kern_wmat_release(&w);
		}
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 10;
	if (iters < 1)
		iters = 10;
	struct kern_device dev;
	int rc = bench_start(&dev);
	if (rc)
		return rc;
	char why[KERN_REASON_BYTES] = "";
	g_lt_peak = bench_lt_gemm_flops(true, 8192, 8192, 8192, LT_FILL, iters, why, sizeof why);
	printf("## Prefill GEMMs on %s (cc %d.%d, %d SMs), median of %d calls, L2 flushed\n\n", dev.name, dev.cc_major,
	       dev.cc_minor, dev.sm_count, iters);
	if (g_lt_peak > 0)
		printf("cuBLASLt FP8 8192^3 (e4m3, TN, bf16 out): **%.0f TFLOP/s** (the %% of peak column)\n\n",
		       g_lt_peak / 1e12);
	else
		printf("cuBLASLt FP8 8192^3: %s (%% of peak column is 0)\n\n", why);
	printf("| op | shape | variant | us | TFLOP/s | cuBLASLt FP8 same shape TFLOP/s | of same shape | of FP8 peak |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	bench_linear(&dev, iters);
	bench_moe(&dev, iters);
	kern_linear_cublaslt_release();
	bench_timer_release();
	return 0;
}

#else
int main(void)
{
	fprintf(stderr, "built without CUDA\n");
	return 77;
}
#endif
