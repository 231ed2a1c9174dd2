/*
 * tests/bench/bench_util.h: the timing plumbing the GPU kernel benchmarks
 * (bench_kernels, bench_prefill, bench_attn_decode) share, so that "median of
 * `iters`, L2 flushed, CUDA events around run() alone" means one thing in
 * every table of docs/perf.md: the timer, the read-bandwidth ceiling (the
 * read-only 16-byte-vector kernel, kern_moe_gemv_bench_read), the cuBLASLt
 * GEMM rate the tensor-core variants are compared against, and the small
 * device and registry helpers every case uses.
 *
 * Method of bench_time_us: 3 warm-up calls; then `iters` calls, each after a
 * 256 MiB cudaMemsetAsync that evicts L2 (50 MiB on H200), each timed alone
 * with CUDA events around fn() only; the median is returned. A CUDA error is
 * cleared (cudaGetLastError) so the next case starts clean.
 */
#ifndef DSV4_TESTS_BENCH_UTIL_H
#define DSV4_TESTS_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"

#if DSV4_HAVE_CUDA

#define BENCH_FLUSH_BYTES ((size_t)256 << 20)

typedef enum status (*bench_fn)(void *ctx);

/* A benchmark's start: device 0 (into *dev) and the timer. 0, or the exit code
 * main() returns: 77 (skip) without a usable GPU, 1 without the flush buffer,
 * each said on stderr. */
int bench_start(struct kern_device *dev);

/* The L2 flush buffer and the two timing events; ST_CUDA when they cannot be made. */
enum status bench_timer_init(void);
void bench_timer_release(void);

/* Median microseconds of `iters` calls of fn(ctx), L2 flushed before each; NAN
 * and *st set when a call or the device fails. */
double bench_time_us(bench_fn fn, void *ctx, int iters, enum status *st);

/* A device copy of n host bytes (h NULL: uninitialised), NULL when cudaMalloc fails. */
void *bench_dev_upload(const void *h, size_t n);

/* A device copy of host weight w (data and scales; owned NULL), for bench_wmat_free. */
struct kern_wmat bench_wmat_upload(const struct kern_wmat *w);
void bench_wmat_free(struct kern_wmat *dw);

/* The variant of op named name, NULL when this build has none. */
const struct kern_variant *bench_find_variant(const struct kern_op *op, const char *name);

/* bench_time_us callables for a linear and an expert-GEMM variant's run(). */
struct bench_lin_ctx {
	kern_linear_fn fn;
	struct kern_linear_args a;
};
enum status bench_lin_run(void *c);

struct bench_moe_ctx {
	kern_moe_gemm_fn fn;
	struct kern_moe_gemm_args a;
};
enum status bench_moe_run(void *c);

/* Device bandwidth: cudaMemcpyAsync device to device, the 16-byte-vector copy
 * kernel, or the read-only kernel (the ceiling of the weight-streaming GEMMs
 * and GEMVs, which read and barely write). */
enum bench_bw_kind { BENCH_BW_MEMCPY, BENCH_BW_COPY, BENCH_BW_READ };

struct bench_bw_ctx {
	enum bench_bw_kind kind;
	void *dst, *src, *sink; /* sink: the read kernel's result, 1 MiB */
	size_t bytes;
};
enum status bench_bw_run(void *c);

/* cuBLASLt GEMM D [n][m] = B [n][k] · A [m][k]^T (TN, both K-major), bf16 out,
 * f32 compute; fp8: e4m3 A and B with SCALAR_32F scales of 1, else bf16 A and
 * B. A and B are filled with the byte `fill` (finite values whose sums stay
 * finite in bf16). FLOP/s of the median call, or 0 when cuBLASLt refuses
 * (why says so). */
double bench_lt_gemm_flops(bool fp8, int64_t m, int64_t n, int64_t k, int fill, int iters, char *why,
			   size_t why_bytes);

#endif
#endif
