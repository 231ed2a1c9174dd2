/*
 * tests/bench/bench_kernels.c (suite bench, not run by default): GPU time of
 * each CUDA variant of linear, moe_gemm and hc_prenorm at DeepSeek-V4-Flash
 * shapes, against ceilings measured in the same run, printed as markdown
 * tables for docs/perf.md.
 *
 *   ceilings (printed first): HBM bandwidth by cudaMemcpyAsync of 1 GiB
 *     device to device and by a 16-byte vectorized copy kernel (read + write
 *     bytes / time), and by a read-only kernel over 1 GiB (read bytes / time:
 *     the ceiling the weight-streaming GEMMs and GEMVs are compared against,
 *     since they read and barely write; the largest of the three is used);
 *     cuBLASLt bf16 GEMM and FP8 e4m3 GEMM (SCALAR_32F scales, TN, bf16 out),
 *     8192^3, TFLOP/s;
 *   linear (FP8 128x128 weights, act_quant 128, bf16 in/out):
 *     wq_a 4096 -> 1024, wq_b 1024 -> 32768, wo_b 8192 -> 4096,
 *     T = 1, 16, 128, 1024; linear_cuda_generic vs linear_cublaslt_sm90;
 *   moe_gemm: one expert 4096 -> 2048, NVFP4 and MXFP4, rows 1 .. 256, and
 *     six experts with T = 1 .. 64 rows each (what one decode step of T
 *     tokens at top-6 reads); moe_gemm_cuda_generic, moe_gemm_sm90_fp4 and
 *     moe_gemm_cuda_gemv (the decode GEMV; refused above 64 rows);
 *   hc_prenorm: [T, 16384] x [24, 16384]^T + sum of squares, T = 1 .. 1024;
 *   decode linears (fp8gemv): every FP8 linear shape of DeepSeek-V4-Flash
 *     (wq_a, wq_b, wkv, wo_a per group without act_quant, wo_b, indexer
 *     wq_b, shared expert w1/w3 and w2, MTP e_proj/h_proj) at T = 1, 2, 4,
 *     8, 16, 32, 64: linear_cuda_gemv (run even where its guard leaves the
 *     plan to another variant: marked *), linear_cublaslt_sm90 and the
 *     tensor-core tile variant where they accept the plan.
 *
 * Method: device buffers allocated once per case; 3 warm-up calls (they
 * also build the cuBLASLt plans); then `iters` timed calls, each preceded by
 * a 256 MiB cudaMemsetAsync that evicts L2 (50 MiB on H200), each timed
 * alone with CUDA events around the variant's run() only (no allocation,
 * copy or synchronisation inside the timed region; the variants' run()s do
 * none either); the median is reported. Bytes = weights + scales + x + y
 * once (the compulsory traffic), FLOPs = 2·M·N·K. Roofline time =
 * max(FLOPs / measured GEMM rate, bytes / measured read bandwidth), the GEMM
 * rate being cuBLASLt FP8 for linear, cuBLASLt bf16 for the W4A16 expert
 * GEMMs; hc_prenorm (f32 FMA) keeps the nominal 67 TFLOP/s. The nominal H200
 * figures (4.8 TB/s, 1580 / 790 TFLOP/s dense FP8 / bf16) are printed for
 * reference; a ceiling that cannot be measured falls back to its nominal.
 *
 * Usage: bench_kernels [iters] [gemv]   (default 20; `gemv`: the ceilings and
 * the decode-linear table only). Exits 77 without a GPU.
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

#define HBM_BPS 4.8e12
#define PEAK_FP8 1580e12
#define PEAK_BF16 790e12
#define PEAK_FP32 67e12

/* Ceilings measured at start-up (nominal values until then). */
static double g_read_bps = HBM_BPS, g_bf16_flops = PEAK_BF16, g_fp8_flops = PEAK_FP8;

static void row(const char *name, const char *shape, double us, double flops, double bytes, double peak,
		enum status st, const char *why)
{
	if (st != ST_OK || why) {
		/* all seven cells, so the markdown table stays rectangular */
		printf("| %-24s | %-26s | %s | | | | |\n", name, shape, why ? why : status_str(st));
		return;
	}
	double t = us * 1e-6, roof = fmax(flops / peak, bytes / g_read_bps) * 1e6;
	printf("| %-24s | %-26s | %9.2f | %8.1f | %7.0f | %8.2f | %5.1f%% |\n", name, shape, us, flops / t / 1e12,
	       bytes / t / 1e9, roof, 100.0 * roof / us);
}

static void header(const char *title, double peak, const char *peak_what)
{
	printf("\n### %s (roofline: %.0f TFLOP/s %s, %.2f TB/s measured read)\n\n", title, peak / 1e12, peak_what,
	       g_read_bps / 1e12);
	printf("| variant | shape | us | TFLOP/s | GB/s | roofline us | of roofline |\n");
	printf("|---|---|---|---|---|---|---|\n");
}

/* Whether variant v (named vname, NULL when this build lacks it) takes problem p
 * on dev; a refusal is printed as the case's row. */
static bool accepted(const struct kern_variant *v, const char *vname, const struct kern_problem *p,
		     const struct kern_device *dev, const char *shape)
{
	char why[KERN_REASON_BYTES];
	if (v && kern_variant_accepts(v, p, dev, NULL, why, sizeof why))
		return true;
	char msg[KERN_REASON_BYTES + 16];
	snprintf(msg, sizeof msg, "refused: %s", v ? why : "absent");
	row(vname, shape, 0, 0, 0, 1, ST_OK, msg);
	return false;
}

/* ---- linear ---- */

static void bench_linear(const struct kern_device *dev, int iters)
{
	static const struct {
		const char *name;
		int64_t in, out;
	} shapes[] = {{"wq_a", 4096, 1024}, {"wq_b", 1024, 32768}, {"wo_b", 8192, 4096}};
	static const int64_t Ts[] = {1, 16, 128, 1024};
	static const char *vnames[] = {"linear_cuda_generic", "linear_cublaslt_sm90"};
	header("linear, FP8 128x128 block scales, act_quant 128, bf16 x/y", g_fp8_flops, "measured cuBLASLt fp8");
	uint64_t rng = 12345;
	for (int s = 0; s < 3; s++) {
		struct kern_wmat w;
		struct err e = {0};
		if (kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, shapes[s].out, shapes[s].in, &rng, &e))
			continue;
		for (int ti = 0; ti < 4; ti++) {
			const int64_t T = Ts[ti], in = shapes[s].in, out = shapes[s].out;
			char shape[64];
			snprintf(shape, sizeof shape, "%s %lldx%lld T=%lld", shapes[s].name, (long long)in, (long long)out,
				 (long long)T);
			for (int vi = 0; vi < 2; vi++) {
				const struct kern_variant *v = bench_find_variant(&kern_op_linear, vnames[vi]);
				struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = T, .act_quant_block = 128,
							       .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
				struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
				if (!accepted(v, vnames[vi], &p, dev, shape))
					continue;
				struct kern_wmat wp;
				if (kern_prepare_weight(v, &w, &wp, &e))
					continue;
				const size_t wb = kern_wmat_data_bytes(&wp), sb = kern_wmat_scale_bytes(&wp);
				struct kern_wmat dw = bench_wmat_upload(&wp);
				void *dx = bench_dev_upload(NULL, (size_t)(T * in) * 2), *dy = bench_dev_upload(NULL, (size_t)(T * out) * 2);
				cudaMemset(dx, 0x3c, (size_t)(T * in) * 2); /* bf16 ~1.0: finite activations */
				size_t wsb = kern_linear_cublaslt_workspace_bytes(T, in);
				void *ws = bench_dev_upload(NULL, wsb);
				struct bench_lin_ctx c = {.fn = (kern_linear_fn)v->run,
						    .a = {.n_tokens = T, .x = dx, .x_dtype = KERN_DT_BF16, .y = dy,
							  .y_dtype = KERN_DT_BF16, .w = &dw, .act_quant_block = 128,
							  .workspace = ws, .workspace_bytes = wsb}};
				enum status st;
				double us = bench_time_us(bench_lin_run, &c, iters, &st);
				row(vnames[vi], shape, us, 2.0 * T * in * out, (double)(wb + sb) + 2.0 * T * (in + out),
				    g_fp8_flops, st, NULL);
				bench_wmat_free(&dw);
				cudaFree(dx);
				cudaFree(dy);
				cudaFree(ws);
				kern_wmat_release(&wp);
			}
		}
		kern_wmat_release(&w);
	}
}

/* ---- decode linears (fp8gemv): the FP8 GEMV at every FP8 linear shape ---- */

static void bench_linear_decode(const struct kern_device *dev, int iters)
{
	static const struct {
		const char *name;
		int64_t in, out;
		int aq;
	} shapes[] = {{"wq_a", 4096, 1024, 128},     {"wq_b", 1024, 32768, 128},    {"wkv", 4096, 512, 128},
		      {"wo_a/group", 4096, 1024, 0}, {"wo_b", 8192, 4096, 128},     {"idx.wq_b", 1024, 8192, 128},
		      {"sh.w1/w3", 4096, 2048, 128}, {"sh.w2", 2048, 4096, 128},    {"e/h_proj", 4096, 4096, 128}};
	static const int64_t Ts[] = {1, 2, 4, 8, 16, 32, 64};
	char vnames[3][KERN_NAME_BYTES] = {"linear_cuda_gemv", "linear_cublaslt_sm90", "linear_mma_bf16"};
	const int cc = dev->cc_major * 10 + dev->cc_minor;
	const char *img = cc == 90 && DSV4_HAVE_SM_90A     ? "sm90a"
			  : cc == 100 && DSV4_HAVE_SM_100A ? "sm100a"
			  : cc == 120 && DSV4_HAVE_SM_120A ? "sm120a"
			  : cc == 121 && DSV4_HAVE_SM_121A ? "sm121a"
							   : NULL;
	if (img)
		snprintf(vnames[2], sizeof vnames[2], "linear_mma_fp8_%s", img);
	header("decode linears: every FP8 linear of DeepSeek-V4-Flash, T = 1 .. 64, bf16 x/y (* = run although its "
	       "guard gives this plan size to another variant)",
	       g_fp8_flops, "measured cuBLASLt fp8");
	uint64_t rng = 4242;
	for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
		struct kern_wmat w;
		struct err e = {0};
		const int64_t in = shapes[s].in, out = shapes[s].out;
		if (kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, out, in, &rng, &e))
			continue;
		void *dx = bench_dev_upload(NULL, (size_t)(64 * in) * 2), *dy = bench_dev_upload(NULL, (size_t)(64 * out) * 2);
		cudaMemset(dx, 0x3c, (size_t)(64 * in) * 2); /* bf16 ~1.0: finite activations */
		for (int vi = 0; vi < 3; vi++) {
			const struct kern_variant *v = bench_find_variant(&kern_op_linear, vnames[vi]);
			struct kern_wmat wp;
			if (!v || !v->run || kern_prepare_weight(v, &w, &wp, &e))
				continue;
			const size_t wb = kern_wmat_data_bytes(&wp), sb = kern_wmat_scale_bytes(&wp);
			struct kern_wmat dw = bench_wmat_upload(&wp);
			const size_t wsb = vi == 1 ? kern_linear_cublaslt_workspace_bytes(64, in) : 0;
			void *ws = wsb ? bench_dev_upload(NULL, wsb) : NULL;
			for (int ti = 0; ti < 7; ti++) {
				const int64_t T = Ts[ti];
				char shape[64], name[2 * KERN_NAME_BYTES];
				snprintf(shape, sizeof shape, "%s %lldx%lld T=%lld%s", shapes[s].name, (long long)in,
					 (long long)out, (long long)T, shapes[s].aq ? "" : " no-aq");
				struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = T,
							       .act_quant_block = shapes[s].aq, .x_dtype = KERN_DT_BF16,
							       .y_dtype = KERN_DT_BF16};
				struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
				char why[KERN_REASON_BYTES];
				const bool ok = kern_variant_accepts(v, &p, dev, NULL, why, sizeof why);
				snprintf(name, sizeof name, "%.*s%s", KERN_NAME_BYTES - 1, vnames[vi], ok ? "" : "*");
				if (!ok && vi != 0)
					continue; /* the other variants only where they would be chosen */
				struct bench_lin_ctx c = {.fn = (kern_linear_fn)v->run,
						    .a = {.n_tokens = T, .x = dx, .x_dtype = KERN_DT_BF16, .y = dy,
							  .y_dtype = KERN_DT_BF16, .w = &dw,
							  .act_quant_block = shapes[s].aq, .workspace = ws,
							  .workspace_bytes = wsb}};
				enum status st;
				double us = bench_time_us(bench_lin_run, &c, iters, &st);
				row(name, shape, us, 2.0 * T * in * out, (double)(wb + sb) + 2.0 * T * (in + out),
				    g_fp8_flops, st, NULL);
			}
			bench_wmat_free(&dw);
			cudaFree(ws);
			kern_wmat_release(&wp);
		}
		cudaFree(dx);
		cudaFree(dy);
		kern_wmat_release(&w);
	}
}

/* ---- moe_gemm ---- */

/* E experts of [2048, 4096], each owning rows_per_expert[ri] rows (so
 * E = 1 is the single-expert sweep, E = 6 a decode step of T tokens × top-6
 * when every token picks the same 6 experts: T rows each). */
static void bench_moe_set(const struct kern_device *dev, int iters, int E, const int64_t *rows, int n_rows_cases)
{
	static const char *vnames[] = {"moe_gemm_cuda_generic", "moe_gemm_sm90_fp4", "moe_gemm_cuda_gemv"};
	const int64_t in = 4096, out = 2048;
	int64_t max_r = 0;
	for (int i = 0; i < n_rows_cases; i++)
		max_r = rows[i] > max_r ? rows[i] : max_r;
	uint64_t rng = 777;
	for (int f = 0; f < 2; f++) {
		const enum kern_wfmt fmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4;
		struct kern_wmat w;
		struct err e = {0};
		if (kern_wmat_make_random(&w, fmt, out, in, &rng, &e))
			continue;
		const size_t wb = kern_wmat_data_bytes(&w), sb = kern_wmat_scale_bytes(&w);
		/* Every expert gets its own copy, so E experts really read E × the bytes. */
		struct kern_wmat dw[8];
		for (int x = 0; x < E; x++) {
			dw[x] = bench_wmat_upload(&w);
		}
		void *dwm = bench_dev_upload(dw, sizeof dw[0] * (size_t)E);
		const size_t xrows = (size_t)(max_r * E);
		void *dx = bench_dev_upload(NULL, xrows * (size_t)in * 2), *dy = bench_dev_upload(NULL, xrows * (size_t)out * 2);
		cudaMemset(dx, 0x3c, xrows * (size_t)in * 2);
		int32_t *doff = bench_dev_upload(NULL, (size_t)(E + 1) * sizeof(int32_t));
		for (int ri = 0; ri < n_rows_cases; ri++) {
			const int64_t R = rows[ri];
			int32_t off[9];
			for (int x = 0; x <= E; x++)
				off[x] = (int32_t)(R * x);
			cudaMemcpy(doff, off, sizeof(int32_t) * (size_t)(E + 1), cudaMemcpyHostToDevice);
			char shape[64];
			snprintf(shape, sizeof shape, "%s %dx rows=%lld", kern_wfmt_name(fmt), E, (long long)R);
			for (int vi = 0; vi < 3; vi++) {
				const struct kern_variant *v = bench_find_variant(&kern_op_moe_gemm, vnames[vi]);
				struct kern_moe_gemm_shape sh = {.in = in, .out = out, .n_experts = E, .max_rows = R * E,
								 .act_quant_block = 128, .x_dtype = KERN_DT_BF16,
								 .y_dtype = KERN_DT_BF16};
				struct kern_problem p = {.wfmt = fmt, .tp_size = 1, .shape = &sh};
				if (!accepted(v, vnames[vi], &p, dev, shape))
					continue;
				struct bench_moe_ctx c = {.fn = (kern_moe_gemm_fn)v->run,
						    .a = {.n_rows = R * E, .n_experts = E, .expert_offsets = doff,
							  .n_x_rows = R * E, .x = dx, .x_dtype = KERN_DT_BF16, .y = dy,
							  .y_dtype = KERN_DT_BF16, .w = dw, .w_dev = dwm,
							  .act_quant_block = 128}};
				enum status st;
				double us = bench_time_us(bench_moe_run, &c, iters, &st);
				row(vnames[vi], shape, us, 2.0 * R * E * in * out,
				    (double)E * (wb + sb) + 2.0 * R * E * (in + out), g_bf16_flops, st, NULL);
			}
		}
		for (int x = 0; x < E; x++)
			bench_wmat_free(&dw[x]);
		cudaFree(dwm);
		cudaFree(dx);
		cudaFree(dy);
		cudaFree(doff);
		kern_wmat_release(&w);
	}
}

static void bench_moe(const struct kern_device *dev, int iters)
{
	static const int64_t one[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
	static const int64_t six[] = {1, 4, 16, 64};
	header("moe_gemm, one expert 4096 -> 2048, act_quant 128, bf16 x/y", g_bf16_flops, "measured cuBLASLt bf16");
	bench_moe_set(dev, iters, 1, one, 9);
	header("moe_gemm, 6 experts 4096 -> 2048 (a decode step of T tokens, top-6: T rows each)", g_bf16_flops,
	       "measured cuBLASLt bf16");
	bench_moe_set(dev, iters, 6, six, 4);
}

/* ---- hc_prenorm ---- */

struct hc_ctx {
	kern_hc_prenorm_fn fn;
	struct kern_hc_prenorm_args a;
};

static enum status hc_run(void *c)
{
	struct hc_ctx *h = c;
	return h->fn(&h->a);
}

static void bench_hc(const struct kern_device *dev, int iters)
{
	static const int64_t Ts[] = {1, 16, 128, 1024};
	const int k = 16384, n_out = 24;
	header("hc_prenorm, [T, 16384] x [24, 16384]^T + sum of squares, fp32", PEAK_FP32, "nominal fp32 FMA");
	const struct kern_variant *v = bench_find_variant(&kern_op_hc_prenorm, "hc_prenorm_cuda_generic");
	struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
	char why[KERN_REASON_BYTES];
	if (!v || !kern_variant_accepts(v, &p, dev, NULL, why, sizeof why)) {
		row("hc_prenorm_cuda_generic", "-", 0, 0, 0, 1, ST_OK, v ? why : "absent");
		return;
	}
	float *dfn = bench_dev_upload(NULL, (size_t)n_out * k * 4), *dx = bench_dev_upload(NULL, (size_t)1024 * k * 4);
	float *dmix = bench_dev_upload(NULL, (size_t)1024 * n_out * 4), *dsq = bench_dev_upload(NULL, 1024 * 4);
	cudaMemset(dfn, 0, (size_t)n_out * k * 4);
	cudaMemset(dx, 0, (size_t)1024 * k * 4);
	for (int ti = 0; ti < 4; ti++) {
		const int64_t T = Ts[ti];
		char shape[64];
		snprintf(shape, sizeof shape, "T=%lld", (long long)T);
		struct hc_ctx c = {.fn = (kern_hc_prenorm_fn)v->run,
				   .a = {.x = dx, .fn = dfn, .mix = dmix, .sqr_sum = dsq, .n_tokens = T, .k = k,
					 .n_out = n_out}};
		enum status st;
		double us = bench_time_us(hc_run, &c, iters, &st);
		row(v->name, shape, us, 2.0 * T * k * (n_out + 1), 4.0 * ((double)n_out * k + (double)T * k + T * (n_out + 1)),
		    PEAK_FP32, st, NULL);
	}
	cudaFree(dfn);
	cudaFree(dx);
	cudaFree(dmix);
	cudaFree(dsq);
}

/* ---- ceilings measured in this run ---- */

static void bench_ceilings(int iters)
{
	const size_t bytes = (size_t)1 << 30;
	printf("\n### ceilings measured in this run (nominal H200: %.1f TB/s HBM, %.0f / %.0f TFLOP/s dense FP8 / "
	       "bf16, %.0f TFLOP/s fp32)\n\n",
	       HBM_BPS / 1e12, PEAK_FP8 / 1e12, PEAK_BF16 / 1e12, PEAK_FP32 / 1e12);
	printf("| ceiling | what | us | bytes or FLOPs | rate |\n|---|---|---|---|---|\n");
	void *a = NULL, *b = NULL, *sink = NULL;
	double best = 0;
	if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
	    cudaMalloc(&sink, 1 << 20) == cudaSuccess) {
		cudaMemset(a, 0x5a, bytes);
		static const char *names[] = {"cudaMemcpyAsync D2D", "copy kernel (16-byte vector)",
					      "read-only kernel (16-byte vector)"};
		for (int k = 0; k < 3; k++) {
			struct bench_bw_ctx c = {.kind = (enum bench_bw_kind)k, .dst = b, .src = a, .sink = sink, .bytes = bytes};
			enum status st;
			double us = bench_time_us(bench_bw_run, &c, iters, &st);
			const double moved = k < 2 ? 2.0 * (double)bytes : (double)bytes;
			if (st != ST_OK) {
				printf("| %s | 1 GiB | %s | | |\n", names[k], status_str(st));
				continue;
			}
			const double bps = moved / (us * 1e-6);
			printf("| %s | %s of 1 GiB | %.1f | %.3g B | %.2f TB/s |\n", names[k],
			       k < 2 ? "read + write" : "read", us, moved, bps / 1e12);
			if (bps > best)
				best = bps;
		}
	} else {
		printf("| bandwidth | 1 GiB buffers | cannot allocate | | |\n");
	}
	cudaFree(a);
	cudaFree(b);
	cudaFree(sink);
	cudaGetLastError();
	if (best > 0)
		g_read_bps = best;
	char why[128];
	const int64_t n = 8192;
	for (int fp8 = 0; fp8 < 2; fp8++) {
		/* finite, nonzero inputs: e4m3 0x38 = 1.0 (sums of 8192 stay finite in bf16), bf16 0x3c3c ~ 0.0115 */
		double f = bench_lt_gemm_flops(fp8, n, n, n, fp8 ? 0x38 : 0x3c, iters, why, sizeof why);
		const char *nm = fp8 ? "cuBLASLt fp8 e4m3 GEMM" : "cuBLASLt bf16 GEMM";
		if (f > 0) {
			printf("| %s | 8192^3, TN, f32 accumulate, bf16 out%s | %.1f | %.3g FLOP | %.0f TFLOP/s |\n", nm,
			       fp8 ? ", SCALAR_32F scales" : "", 2.0 * n * n * n / f * 1e6, 2.0 * n * n * n, f / 1e12);
			if (fp8)
				g_fp8_flops = f;
			else
				g_bf16_flops = f;
		} else {
			printf("| %s | 8192^3 | %s (nominal used) | | |\n", nm, why);
		}
	}
	printf("\nRoofline columns below: bytes / %.2f TB/s (the largest measured bandwidth above: read + write "
	       "bytes for the copies, read bytes for the read-only kernel; the GEMMs and GEMVs mostly read) and "
	       "FLOPs / the measured cuBLASLt rate of their class.\n",
	       g_read_bps / 1e12);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 20;
	const bool only_gemv = argc > 2 && !strcmp(argv[2], "gemv");
	if (iters < 1)
		iters = 1;
	struct kern_device dev;
	int rc = bench_start(&dev);
	if (rc)
		return rc;
	printf("## kernel benchmark: %s (cc %d.%d, %d SMs), median of %d, L2 flushed\n", dev.name, dev.cc_major,
	       dev.cc_minor, dev.sm_count, iters);
	bench_ceilings(iters);
	if (!only_gemv) {
		bench_linear(&dev, iters);
		bench_moe(&dev, iters);
		bench_hc(&dev, iters);
	}
	bench_linear_decode(&dev, iters);
	kern_linear_cublaslt_release();
	bench_timer_release();
	return 0;
}

#else

int main(void)
{
	fprintf(stderr, "SKIP: built without CUDA\n");
	return 77;
}

#endif
