/*
 * tests/bench/bench_moe_decode.c (suite bench, not run by default): GPU time
 * of the fused routed-expert decode (moe_decode_cuda and moe_decode_cuda_mma,
 * both launches: gate/up + SwiGLU and down + combine) at DeepSeek-V4-Flash shapes (hidden 4096,
 * moe_intermediate 2048, 256 experts, top-6) for T = 1, 2, 4, 8, 16, 32, 64
 * tokens routed uniformly at random (distinct experts per token), NVFP4 and
 * MXFP4, against the read bandwidth measured in the same run; and the
 * unfused baseline (the decode GEMV three times, SwiGLU, combine: 5 launches).
 *
 * Bytes = w1 + w3 + w2 (data and scales, as stored) of every expert the step
 * touches, once: what the step must read (activations and outputs, < 1 % at
 * T = 64, are left out). Read ceiling = a 16-byte-load read-only kernel over
 * 1 GiB (kern_moe_gemv_bench_read), median of 10. Method: all 768 expert
 * matrices resident on the device (3.4 GiB for NVFP4), one routing per T;
 * 3 warm-up calls; then `iters` timed calls, each preceded by a read-only pass
 * over 256 MiB (evicts L2 without leaving dirty lines to write back during
 * the timed call), CUDA events around the run() alone; the median is
 * reported, with the time the bytes take at the measured ceiling.
 *
 * Usage: bench_moe_decode [iters]   (default 20). Exits 77 without a GPU.
 * Prints a markdown table for docs/perf.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/moe_gemm/moe_decode.h"
#include "kernels/moe_gemm/moe_gemv.h"
#if DSV4_HAVE_CUDA
#include "kernels/act/act_generic.h"
#endif
#include "tests/test.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

#define D_ 4096
#define I_ 2048
#define E_ 256
#define K_ 6
#define FLUSH_BYTES ((size_t)256 << 20)
#define CEIL_BYTES ((size_t)1 << 30)

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

static void *flush_buf, *sink;
static float *g_h3; /* the unfused baseline's w3 output [64 * 6, I] */

/* The baseline: what model/forward_moe.c runs without the fused op, on the decode GEMV
 * (moe_gemm_cuda_gemv) for w1, w3 and w2, the generic SwiGLU and combine (the
 * bf16 rounding passes left out): 5 launches. */
static enum status unfused(const struct kern_moe_decode_args *a)
{
	const int64_t P = a->n_tokens * a->top_k;
	struct kern_moe_gemm_args g = {.n_rows = P, .n_experts = a->n_experts, .expert_offsets = a->expert_offsets,
				       .row_src = a->row_src, .n_x_rows = a->n_tokens, .x = a->x, .x_dtype = KERN_DT_F32,
				       .y = a->h, .y_dtype = KERN_DT_F32, .w = a->w1, .w_dev = a->w1_dev,
				       .act_quant_block = 128};
	enum status st = kern_moe_gemv_cuda(&g);
	g.y = g_h3;
	g.w = a->w3;
	g.w_dev = a->w3_dev;
	if (!st)
		st = kern_moe_gemv_cuda(&g);
	struct kern_swiglu_args sw = {.gate = a->h, .up = g_h3, .out = a->h, .row_weight = a->row_weight, .n_rows = P,
				      .dim = I_, .limit = a->swiglu_limit, .bf16_out = a->bf16_round};
	if (!st)
		st = kern_swiglu_cuda_generic(&sw);
	struct kern_moe_gemm_args d = {.n_rows = P, .n_experts = a->n_experts, .expert_offsets = a->expert_offsets,
				       .n_x_rows = P, .x = a->h, .x_dtype = KERN_DT_F32, .y = a->y, .y_dtype = KERN_DT_F32,
				       .w = a->w2, .w_dev = a->w2_dev, .act_quant_block = 128};
	if (!st)
		st = kern_moe_gemv_cuda(&d);
	struct kern_moe_combine_args c = {.n_tokens = a->n_tokens, .top_k = a->top_k, .dim = D_, .slot_row = a->slot_row,
					  .y = a->y, .y_dtype = KERN_DT_F32, .out = a->out, .out_dtype = KERN_DT_F32};
	if (!st)
		st = kern_moe_combine_cuda_generic(&c);
	return st;
}
static cudaEvent_t ev0, ev1;

static double read_ceiling(void)
{
	void *buf = NULL;
	if (cudaMalloc(&buf, CEIL_BYTES) != cudaSuccess)
		return 0;
	cudaMemset(buf, 1, CEIL_BYTES);
	float ms[10] = {0};
	for (int i = 0; i < 12; i++) {
		cudaEventRecord(ev0, 0);
		if (kern_moe_gemv_bench_read(buf, CEIL_BYTES, sink, 0) != ST_OK)
			break;
		cudaEventRecord(ev1, 0);
		cudaEventSynchronize(ev1);
		if (i >= 2)
			cudaEventElapsedTime(&ms[i - 2], ev0, ev1);
	}
	cudaFree(buf);
	qsort(ms, 10, sizeof *ms, cmp_f);
	return ms[5] > 0 ? (double)CEIL_BYTES / (ms[5] * 1e-3) : 0;
}

/* One format: the 3 x 256 expert matrices in one allocation, filled with a
 * fixed byte pattern (finite codes; scales 1.0). */
struct experts {
	void *buf;
	struct kern_wmat w[3][E_];
	struct kern_wmat *dev[3];
	size_t bytes[3]; /* data + scales of one expert's matrix, per projection */
};

static enum status experts_make(struct experts *x, enum kern_wfmt f)
{
	memset(x, 0, sizeof *x);
	size_t off[3], stride[3], total = 0;
	for (int p = 0; p < 3; p++) {
		struct kern_wmat m = {.fmt = f, .rows = p == 2 ? D_ : I_, .cols = p == 2 ? I_ : D_, .global_scale = 1.0f};
		const size_t db = kern_wmat_data_bytes(&m), sb = kern_wmat_scale_bytes(&m);
		x->bytes[p] = db + sb;
		stride[p] = ((db + 255) & ~(size_t)255) + ((sb + 255) & ~(size_t)255);
		off[p] = total;
		total += stride[p] * E_;
	}
	if (cudaMalloc(&x->buf, total) != cudaSuccess)
		return ST_NOMEM;
	for (int p = 0; p < 3; p++) {
		struct kern_wmat m = {.fmt = f, .rows = p == 2 ? D_ : I_, .cols = p == 2 ? I_ : D_, .global_scale = 1.0f};
		const size_t db = kern_wmat_data_bytes(&m), sb = kern_wmat_scale_bytes(&m);
		for (int e = 0; e < E_; e++) {
			uint8_t *base = (uint8_t *)x->buf + off[p] + stride[p] * (size_t)e;
			x->w[p][e] = m;
			x->w[p][e].data = base;
			x->w[p][e].scale = base + ((db + 255) & ~(size_t)255);
			cudaMemset(base, 0x2A, db); /* codes +1.0 and -1.0 */
			cudaMemset((void *)x->w[p][e].scale, f == KERN_WFMT_NVFP4 ? 0x38 : 0x7F, sb); /* scale 1.0 */
		}
		if (cudaMalloc((void **)&x->dev[p], sizeof x->w[p]) != cudaSuccess)
			return ST_NOMEM;
		cudaMemcpy(x->dev[p], x->w[p], sizeof x->w[p], cudaMemcpyHostToDevice);
	}
	return cudaDeviceSynchronize() == cudaSuccess ? ST_OK : ST_CUDA;
}

static void experts_free(struct experts *x)
{
	cudaFree(x->buf);
	for (int p = 0; p < 3; p++)
		cudaFree(x->dev[p]);
}

static void *up(const void *h, size_t n)
{
	void *d = NULL;
	if (cudaMalloc(&d, n ? n : 16) != cudaSuccess)
		return NULL;
	if (h && n)
		cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
	return d;
}

static void bench_fmt(enum kern_wfmt f, kern_moe_decode_fn fn, const char *vname, int iters, double bps)
{
	struct experts x;
	if (experts_make(&x, f) != ST_OK) {
		printf("| %s | %s | | | | | | | could not allocate the experts |\n", vname, kern_wfmt_name(f));
		experts_free(&x);
		return;
	}
	static const int Ts[] = {1, 2, 4, 8, 16, 32, 64};
	uint64_t rng = 0x5eed;
	for (int ti = 0; ti < 7; ti++) {
		const int64_t T = Ts[ti], P = T * K_;
		int32_t *ids = malloc(sizeof(int32_t) * (size_t)(4 * P + E_ + 1));
		int32_t *off = ids + P, *row_src = off + E_ + 1, *row_slot = row_src + P, *slot_row = row_slot + P;
		float *rw = malloc(sizeof(float) * (size_t)P), *xh = malloc(sizeof(float) * (size_t)(T * D_));
		for (int64_t t = 0; t < T; t++)
			for (int j = 0; j < K_; j++) {
				bool dup;
				do {
					ids[t * K_ + j] = (int32_t)(kern_rand_u64(&rng) % E_);
					dup = false;
					for (int i = 0; i < j; i++)
						dup |= ids[t * K_ + i] == ids[t * K_ + j];
				} while (dup);
			}
		for (int64_t i = 0; i < P; i++)
			rw[i] = 0.5f;
		for (int64_t i = 0; i < T * D_; i++)
			xh[i] = kern_rand_f32(&rng);
		int64_t nr = 0;
		struct kern_moe_dispatch_args da = {.n_tokens = T, .top_k = K_, .topk_ids = ids, .n_experts = E_,
						    .expert_offsets = off, .row_src = row_src, .row_slot = row_slot,
						    .slot_row = slot_row, .n_rows = &nr};
		if (kern_moe_dispatch_ref(&da) != ST_OK) {
			free(ids);
			free(rw);
			free(xh);
			continue;
		}
		int touched = 0;
		for (int e = 0; e < E_; e++)
			touched += off[e + 1] > off[e];
		const double bytes = (double)touched * (double)(x.bytes[0] + x.bytes[1] + x.bytes[2]);
		struct kern_moe_decode_args a = {
			.n_tokens = T, .top_k = K_, .n_experts = E_,
			.expert_offsets = up(off, sizeof(int32_t) * (E_ + 1)),
			.row_src = up(row_src, sizeof(int32_t) * (size_t)P), .slot_row = up(slot_row, sizeof(int32_t) * (size_t)P),
			.row_weight = up(rw, sizeof(float) * (size_t)P), .x = up(xh, sizeof(float) * (size_t)(T * D_)),
			.h = up(NULL, sizeof(float) * (size_t)(P * I_)), .y = up(NULL, sizeof(float) * (size_t)(P * D_)),
			.out = up(NULL, sizeof(float) * (size_t)(T * D_)), .w1 = x.w[0], .w3 = x.w[1], .w2 = x.w[2],
			.w1_dev = x.dev[0], .w3_dev = x.dev[1], .w2_dev = x.dev[2], .act_quant_block = 128,
			.swiglu_limit = 10.0f, .bf16_round = true};
		enum status st = ST_OK;
		for (int i = 0; i < 3 && !st; i++)
			st = fn(&a);
		if (!st && cudaDeviceSynchronize() != cudaSuccess)
			st = ST_CUDA;
		float *ms = malloc(sizeof(float) * (size_t)iters);
		for (int i = 0; i < iters && !st; i++) {
			kern_moe_gemv_bench_read(flush_buf, FLUSH_BYTES, sink, 0);
			cudaEventRecord(ev0, 0);
			st = fn(&a);
			cudaEventRecord(ev1, 0);
			cudaEventSynchronize(ev1);
			cudaEventElapsedTime(&ms[i], ev0, ev1);
		}
		if (st) {
			printf("| %s | %s | %lld | %d | %.1f | %s | | | |\n", vname, kern_wfmt_name(f), (long long)T, touched,
			       bytes / 1048576.0, status_str(st));
		} else {
			qsort(ms, (size_t)iters, sizeof *ms, cmp_f);
			const double us = ms[iters / 2] * 1e3, roof = bytes / bps * 1e6;
			printf("| %s | %s | %lld | %d | %.1f | %.2f | %.0f | %.2f | %.1f %% |\n", vname, kern_wfmt_name(f),
			       (long long)T, touched, bytes / 1048576.0, us, bytes / (us * 1e-6) / 1e9, roof, 100.0 * roof / us);
		}
		fflush(stdout);
		free(ms);
		cudaFree((void *)a.expert_offsets);
		cudaFree((void *)a.row_src);
		cudaFree((void *)a.slot_row);
		cudaFree((void *)a.row_weight);
		cudaFree((void *)a.x);
		cudaFree(a.h);
		cudaFree(a.y);
		cudaFree(a.out);
		free(ids);
		free(rw);
		free(xh);
	}
	experts_free(&x);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 20;
	if (iters < 1)
		iters = 1;
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	struct kern_device dev;
	struct err e = {0};
	if (kern_device_detect(0, &dev, &e) != ST_OK)
		return test_skip(e.msg);
	cudaEventCreate(&ev0);
	cudaEventCreate(&ev1);
	int sms = 132;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	if (cudaMalloc(&flush_buf, FLUSH_BYTES) != cudaSuccess || cudaMalloc(&sink, (size_t)sms * 8 * 4) != cudaSuccess)
		return test_skip("cannot allocate the L2 flush buffer");
	cudaMemset(flush_buf, 3, FLUSH_BYTES);
	if (cudaMalloc((void **)&g_h3, sizeof(float) * 64 * K_ * I_) != cudaSuccess)
		g_h3 = NULL;
	const double bps = read_ceiling();
	if (bps <= 0)
		return test_skip("read ceiling not measurable");
	printf("\n### moe_decode on %s (cc %d.%d), read ceiling %.2f TB/s measured, median of %d\n\n", dev.name,
	       dev.cc_major, dev.cc_minor, bps / 1e12, iters);
	printf("| variant | format | T | experts touched | MiB read | us | GB/s | roofline us | of read roofline |\n");
	printf("|---|---|---|---|---|---|---|---|---|\n");
	for (int f = 0; f < 2; f++) {
		const enum kern_wfmt fmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4;
		bench_fmt(fmt, kern_moe_decode_cuda, "moe_decode_cuda", iters, bps);
		bench_fmt(fmt, kern_moe_decode_cuda_mma, "moe_decode_cuda_mma", iters, bps);
		if (g_h3)
			bench_fmt(fmt, unfused, "unfused (3 gemv + swiglu + combine)", iters, bps);
	}
	cudaFree(flush_buf);
	cudaFree(sink);
	cudaFree(g_h3);
	return 0;
}
#else
int main(void)
{
	return test_skip("built without CUDA");
}
#endif
