/*
 * kernels/linear/linear.h: the dense linear layer y = x · Wᵀ, and its
 * registry table (kern_op_linear).
 *
 * Contract shared by every variant (the CPU reference is the oracle):
 *   x [n_tokens, in] (f32 or bf16, row stride ldx elements)
 *   W [out, in] in any kern_wmat format the variant accepts (FP8 with
 *     128x128 E8M0 or f32 block scales, bf16, f32, ...)
 *   y [n_tokens, out] (f32 or bf16, row stride ldy), fully overwritten
 *   y[t,o] = Σ_k xq[t,k] · w[o,k], accumulated in f32, where w is the
 *   decoded weight (wmat.h) and xq is x, or, when act_quant_block is 128,
 *   x after the reference's FP8 act_quant (quant.h: pow2-ceil scales per 128
 *   columns, e4m3 RNE), as the reference does before every FP8 GEMM.
 * Shapes need not be multiples of 128; the last scale block is partial.
 * n_tokens == 0 is a valid no-op.
 */
#ifndef DSV4_KERNELS_LINEAR_H
#define DSV4_KERNELS_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/wmat.h"
#include "kernels/registry/registry.h"

/* What selection sees (kern_problem.shape for op linear). */
struct kern_linear_shape {
	int64_t in, out;
	int64_t max_tokens;       /* largest n_tokens run() will get (the step's token budget) */
	int act_quant_block;      /* 0 or 128 */
	enum kern_dtype x_dtype, y_dtype;
};

struct kern_linear_args {
	int64_t n_tokens;
	const void *x;            /* [n_tokens, ldx] */
	enum kern_dtype x_dtype;
	int64_t ldx;              /* elements; 0 = in */
	void *y;                  /* [n_tokens, ldy] */
	enum kern_dtype y_dtype;
	int64_t ldy;              /* elements; 0 = out */
	const struct kern_wmat *w; /* [out, in], already prepared for the variant */
	int act_quant_block;      /* 0 or 128 */
	void *stream;             /* cudaStream_t for CUDA variants, ignored on the CPU */
	void *workspace;          /* device scratch planned at load, for variants that need it
				   * (linear_cublaslt_sm90: FP8 activations + cuBLASLt workspace;
				   * size from kern_linear_cublaslt_workspace_bytes); NULL otherwise */
	size_t workspace_bytes;
	void *ctx;                /* struct kern_ctx * (kernels/device/ctx.h) of the calling executor: the
				   * stream's scratch and library handles for the variants that keep state
				   * (linear_mma_*: scratch when workspace is NULL or too small). NULL = the
				   * process-default context of the current device (tests, run_host). */
};

/* Signature of run / run_host of every linear variant. */
typedef enum status (*kern_linear_fn)(const struct kern_linear_args *a);

/* The CPU reference: any wmat format, any shape. ST_INVALID on a malformed
 * argument, ST_NOMEM if its row buffers cannot be allocated. */
enum status kern_linear_ref(const struct kern_linear_args *a) DSV4_WUR;

/* Check a's fields against each other (pointers, strides, act_quant_block). */
enum status kern_linear_args_check(const struct kern_linear_args *a, struct err *e) DSV4_WUR;

extern const struct kern_op kern_op_linear;

/* Device scratch variant v (of kern_op_linear) needs in kern_linear_args.workspace
 * for calls of up to max_tokens tokens and `in` input columns; 0 for the
 * variants that need none (the CPU reference among them). */
size_t kern_linear_workspace_bytes(const struct kern_variant *v, int64_t max_tokens, int64_t in);

/* ---- CUDA variants (kernels/linear/linear_generic.cu; present when built with CUDA) ---- */

/* Generic linear for cc >= 8.0: f32 FMA on tiles decoded in shared memory.
 * Takes FP8_F32_B128 (prepare() widens E8M0), BF16 or F32 weights; anything
 * else is ST_INVALID. Pointers are device pointers (w->data/scale included,
 * w itself on the host). */
enum status kern_linear_cuda_generic(const struct kern_linear_args *a);
/* The same on host buffers: allocates, copies in, runs, copies back, syncs. */
enum status kern_linear_cuda_generic_host(const struct kern_linear_args *a);
/* Run any CUDA variant fn on host buffers: copies x, y and the weight to the
 * device (with a workspace of workspace_bytes when > 0), runs, synchronises and
 * copies y back (self-checks, tests). CUDA builds only. */
enum status kern_linear_run_on_host_buffers(const struct kern_linear_args *a, kern_linear_fn fn,
					    size_t workspace_bytes);

#endif
