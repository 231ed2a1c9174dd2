/*
 * kernels/moe_gemm/moe_gemm.h: the routed-expert GEMM over a flat batch of
 * (token, expert) rows grouped by expert, and its registry table
 * (kern_op_moe_gemm).
 *
 * The layout is the one a grouped / varlen GPU kernel wants, so every variant
 * implements the same contract:
 *   rows r = 0 .. offsets[n_experts]-1 are sorted by expert; expert e owns
 *     rows [expert_offsets[e], expert_offsets[e+1]) (int32, nondecreasing,
 *     offsets[0] = 0, offsets[n_experts] <= n_rows; empty experts allowed).
 *     n_rows is an upper bound (n_tokens * top_k when the grouping ran on
 *     the device and the host does not know the count): rows at and past
 *     offsets[n_experts] are neither read (x, row_src) nor written (y);
 *   input row of r is x[row_src[r]] when row_src is given (w1/w3: gather
 *     each token once per chosen expert without copying), else x[r] (w2);
 *   y[r, o] = Σ_k xq[src(r), k] · W_e[o, k], f32 accumulation, every row of y
 *     below offsets[n_experts] written, with W_e decoded from its stored
 *     format (wmat.h: MXFP4 e2m1 + E8M0 per 32, NVFP4 e2m1 + e4m3 per 16 +
 *     f32 global, FP8 128x128) and xq = x or the reference's FP8
 *     act_quant(block 128) of x.
 * The routing weight and SwiGLU are not part of this op (the reference
 * applies the weight to the activation before w2, an elementwise op).
 */
#ifndef DSV4_KERNELS_MOE_GEMM_H
#define DSV4_KERNELS_MOE_GEMM_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/wmat.h"
#include "kernels/registry/registry.h"

/* kern_problem.shape for op moe_gemm. */
struct kern_moe_gemm_shape {
	int64_t in, out;          /* per expert: W_e is [out, in] */
	int64_t n_experts;        /* experts held by this rank */
	int64_t max_rows;         /* largest n_rows run() will get */
	int act_quant_block;      /* 0 or 128 */
	enum kern_dtype x_dtype, y_dtype;
};

struct kern_moe_gemm_args {
	int64_t n_rows;                 /* (token, expert) pairs, or an upper bound on them */
	int64_t n_experts;
	const int32_t *expert_offsets;  /* [n_experts + 1] */
	const int32_t *row_src;         /* optional [n_rows]: x row of each row */
	int64_t n_x_rows;               /* rows in x (bounds for row_src) */
	const void *x;                  /* [n_x_rows, ldx] */
	enum kern_dtype x_dtype;
	int64_t ldx;                    /* elements; 0 = in */
	void *y;                        /* [n_rows, ldy] */
	enum kern_dtype y_dtype;
	int64_t ldy;                    /* elements; 0 = out */
	const struct kern_wmat *w;      /* [n_experts] host array: same fmt, rows, cols; prepared for the
					 * variant; data/scale point where run() reads (device for CUDA) */
	const struct kern_wmat *w_dev;  /* CUDA variants: a device copy of the w array (built once at load) */
	int act_quant_block;            /* 0 or 128 */
	void *stream;                   /* cudaStream_t for CUDA variants */
	void *ctx;                      /* struct kern_ctx * (kernels/device/ctx.h) of the calling executor:
					 * scratch for moe_gemm_mma_* (quantized activations); NULL = the
					 * process-default context of the current device */
};

typedef enum status (*kern_moe_gemm_fn)(const struct kern_moe_gemm_args *a);

/* The CPU reference (reads offsets, row_src and weights on the host). */
enum status kern_moe_gemm_ref(const struct kern_moe_gemm_args *a) DSV4_WUR;

/* Validate a (offsets start at 0, nondecreasing, end at most n_rows;
 * row_src in range below offsets[n_experts]; x has rows when n_rows > 0;
 * experts uniform and valid). Host-side arrays only. */
enum status kern_moe_gemm_args_check(const struct kern_moe_gemm_args *a, struct err *e) DSV4_WUR;

extern const struct kern_op kern_op_moe_gemm;

/* ---- CUDA variants (kernels/moe_gemm/moe_gemm_generic.cu) ---- */

/* Generic expert GEMM for cc >= 8.0 (MXFP4, NVFP4, or FP8 with E8M0 or f32
 * 128x128 scales): weights decoded in shared memory, f32 FMA. n_rows may be
 * an upper bound (n_tokens * top_k) when the offsets were produced on the
 * device: the device offsets decide which rows exist and are written. x, y, expert_offsets, row_src and w_dev are device
 * memory; w (host array) gives the shape and format. */
enum status kern_moe_gemm_cuda_generic(const struct kern_moe_gemm_args *a);
/* The same on host buffers (copies everything in and out). */
enum status kern_moe_gemm_cuda_generic_host(const struct kern_moe_gemm_args *a);
/* Run any CUDA variant fn on host buffers: copies x, offsets, row_src and the
 * experts to the device, runs, synchronises and copies y back (self-checks,
 * tests). CUDA builds only. */
enum status kern_moe_gemm_run_on_host_buffers(const struct kern_moe_gemm_args *a, kern_moe_gemm_fn fn);

#endif
