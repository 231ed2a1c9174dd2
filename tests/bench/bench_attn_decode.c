/*
 * tests/bench/bench_attn_decode.c (suite bench, not run by default): GPU time
 * of op sparse_attn's CUDA variants (sparse_attn_cuda_decode,
 * sparse_attn_cuda_generic) on decode steps at the DeepSeek-V4-Flash shapes
 * (64 heads, head_dim 512, rope 64, window 128; CSA ratio 4 with top-k 512,
 * HCA ratio 128, SWA): T = 1, 8, 32 sequences of one token each, at 1k and
 * 32k tokens of context, laid out as the forward pass does ([compressed
 * pool | fresh KV | rings], index sets from kern_attn_index_ref, CSA top-k
 * lists of random visible entries). Printed as a markdown table.
 *
 * Method: the read ceiling is measured first in the same run (a read-only
 * 16-byte-vector kernel over 1 GiB, kern_moe_gemv_bench_read); each case:
 * 3 warm-up calls, then `iters` calls each preceded by a 256 MiB memset that
 * evicts L2 and timed alone with CUDA events; the median is reported.
 * Bytes = the distinct key/value rows the step reads (the union of its
 * index sets) + q + out + the index lists (the compulsory traffic);
 * "of read bw" = bytes / time / ceiling.
 *
 * Usage: bench_attn_decode [iters]   (default 20). Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/bench/bench_util.h"
#include "tests/test.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

#define H 64
#define D 512
#define RD 64
#define WIN 128
#define TOPK 512

static uint64_t rng = 0x5eed1234abcdull;

struct at_ctx {
	kern_sparse_attn_fn fn;
	struct kern_sparse_attn_args a;
};

static enum status at_run(void *c)
{
	struct at_ctx *x = c;
	return x->fn(&x->a);
}

static void *dup_d(const void *h, size_t bytes)
{
	void *d = NULL;
	if (cudaMalloc(&d, bytes + 16) != cudaSuccess)
		return NULL;
	cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
	return d;
}

static float *frand(size_t n)
{
	float *p = malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = kern_rand_f32(&rng);
	return p;
}

static const char *kind_name(int ratio)
{
	return ratio == 4 ? "CSA" : ratio == 128 ? "HCA" : "SWA";
}

static void bench_case(int T, int64_t ctx, int ratio, int iters, double read_bps)
{
	if (T < 1 || T > 4096)
		return;
	const bool csa = ratio == 4;
	int32_t *q_off = malloc((size_t)(T + 1) * 4), *start = malloc((size_t)T * 4);
	int64_t *cmp_row0 = malloc((size_t)T * 8), *ring_row0 = malloc((size_t)T * 8);
	int64_t n_vis = ratio ? (ctx + 1) / ratio : 0;
	int64_t cmp_rows = ratio ? (int64_t)T * n_vis : 0, ring_rows = (int64_t)T * WIN;
	for (int s = 0; s <= T; s++)
		q_off[s] = s;
	for (int s = 0; s < T; s++) {
		start[s] = (int32_t)ctx;
		cmp_row0[s] = (int64_t)s * n_vis;
		ring_row0[s] = cmp_rows + T + (int64_t)s * WIN;
	}
	int idx_stride = WIN + (csa ? TOPK : (int)n_vis);
	int32_t *topk = NULL;
	if (csa) {
		topk = malloc((size_t)T * TOPK * 4);
		/* distinct visible entries spread over the context (what a top-k of a long context reads) */
		for (int t = 0; t < T; t++)
			for (int j = 0; j < TOPK; j++)
				topk[(int64_t)t * TOPK + j] = j >= n_vis ? -1
							   : n_vis <= TOPK ? j
									   : (int32_t)((int64_t)j * n_vis / TOPK);
	}
	int32_t *idx = malloc((size_t)T * idx_stride * 4), *len = malloc((size_t)T * 4);
	struct kern_attn_index_args xa = {.n_tokens = T, .n_seqs = T, .q_off = q_off, .start_pos = start,
					  .window = WIN, .cur_row0 = cmp_rows, .ring_row0 = ring_row0, .ratio = ratio,
					  .cmp_row0 = ratio ? cmp_row0 : NULL, .topk = topk, .topk_stride = TOPK,
					  .idx = idx, .idx_len = len, .idx_stride = idx_stride};
	if (kern_attn_index_ref(&xa) != ST_OK) {
		printf("| %s | %d | %lld | index build failed | | | |\n", kind_name(ratio), T, (long long)ctx);
		goto out;
	}
	/* distinct rows (sequences own disjoint rows here: the sum of the set sizes) */
	int64_t n_rows = 0;
	for (int t = 0; t < T; t++)
		n_rows += len[t];
	const double bytes = (double)n_rows * D * 4 + 2.0 * T * H * D * 4 + (double)T * idx_stride * 4;
	int64_t total = cmp_rows + T + ring_rows;
	float *kv = frand((size_t)(total * D)), *q = frand((size_t)T * H * D), *snk = frand(H);
	float om[RD / 2];
	int32_t *pos = malloc((size_t)T * 4);
	for (int t = 0; t < T; t++)
		pos[t] = start[t];
	if (kern_rope_freqs_build(om, RD, 10000, NULL) != ST_OK)
		goto out2;
	float *kv_d = dup_d(kv, (size_t)(total * D) * 4), *q_d = dup_d(q, (size_t)T * H * D * 4), *o_d = NULL;
	cudaMalloc((void **)&o_d, (size_t)T * H * D * 4);
	struct kern_sparse_attn_args a = {.q = q_d, .out = o_d, .kv_stride = D, .idx_stride = idx_stride,
					  .idx = dup_d(idx, (size_t)T * idx_stride * 4), .idx_len = dup_d(len, (size_t)T * 4),
					  .sink = dup_d(snk, H * 4), .softmax_scale = 1.0f / sqrtf((float)D),
					  .pos = dup_d(pos, (size_t)T * 4), .omega = dup_d(om, sizeof om), .rope_dim = RD,
					  .n_tokens = T, .n_heads = H, .head_dim = D, .bf16_out = true};
	int ns = 0;
	if (ratio) {
		a.kv[ns] = kv_d;
		a.kv_rows[ns++] = cmp_rows;
	}
	a.kv[ns] = kv_d + cmp_rows * D;
	a.kv_rows[ns++] = T;
	a.kv[ns] = kv_d + (cmp_rows + T) * D;
	a.kv_rows[ns++] = ring_rows;
	static const char *names[] = {"sparse_attn_cuda_decode", "sparse_attn_cuda_generic"};
	for (int k = 0; k < 2; k++) {
		const struct kern_variant *v = bench_find_variant(&kern_op_sparse_attn, names[k]);
		if (!v || !v->run)
			continue;
		struct at_ctx c = {.fn = (kern_sparse_attn_fn)v->run, .a = a};
		enum status st;
		double us = bench_time_us(at_run, &c, iters, &st);
		if (st != ST_OK) {
			printf("| %s | %d | %lld | %s | %s | | |\n", kind_name(ratio), T, (long long)ctx, names[k],
			       status_str(st));
			continue;
		}
		printf("| %s | %d | %lld | %s | %.1f | %.3g | %.1f %% |\n", kind_name(ratio), T, (long long)ctx,
		       names[k], us, bytes, 100.0 * bytes / (us * 1e-6) / read_bps);
	}
	cudaFree(kv_d), cudaFree(q_d), cudaFree(o_d), cudaFree((void *)a.idx), cudaFree((void *)a.idx_len);
	cudaFree((void *)a.sink), cudaFree((void *)a.pos), cudaFree((void *)a.omega);
out2:
	free(kv), free(q), free(snk), free(pos);
out:
	free(q_off), free(start), free(cmp_row0), free(ring_row0), free(topk), free(idx), free(len);
}
#endif

int main(int argc, char **argv)
{
#if DSV4_HAVE_CUDA
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	int iters = argc > 1 ? atoi(argv[1]) : 20;
	if (iters < 1)
		iters = 1;
	if (bench_timer_init() != ST_OK)
		return 1;
	double read_bps = 4.8e12;
	struct bench_bw_ctx r = {.kind = BENCH_BW_READ, .bytes = (size_t)1 << 30};
	enum status st = ST_NOMEM;
	if (cudaMalloc(&r.src, r.bytes) == cudaSuccess && cudaMalloc(&r.sink, 1 << 20) == cudaSuccess) {
		cudaMemset(r.src, 0x5a, r.bytes);
		double us = bench_time_us(bench_bw_run, &r, iters, &st);
		if (st == ST_OK)
			read_bps = (double)r.bytes / (us * 1e-6);
	}
	printf("### sparse_attn decode (H %d, head_dim %d, window %d; read ceiling %s %.2f TB/s)\n\n", H, D, WIN,
	       st == ST_OK ? "measured" : "nominal", read_bps / 1e12);
	cudaFree(r.src), cudaFree(r.sink);
	printf("| layer | T | context | variant | us | bytes | of read bw |\n|---|---|---|---|---|---|---|\n");
	const int ts[] = {1, 8, 32};
	const int64_t ctxs[] = {1024, 32768};
	const int ratios[] = {4, 128, 0};
	for (int ri = 0; ri < 3; ri++)
		for (int ci = 0; ci < 2; ci++)
			for (int ti = 0; ti < 3; ti++)
				bench_case(ts[ti], ctxs[ci], ratios[ri], iters, read_bps);
	bench_timer_release();
	return 0;
#else
	(void)argc, (void)argv;
	return test_skip("built without CUDA");
#endif
}
