/*
 * kernels/moe_gemm/moe_decode.h: the fused routed-expert pass of a small
 * (decode-size) step, op "moe_decode" (kern_op_moe_decode).
 *
 * It replaces, for one layer, what model/forward_moe.c otherwise runs between the
 * dispatch and the shared expert:
 *   h1 = moe_gemm(x[row_src], w1); h3 = moe_gemm(x[row_src], w3)   (act_quant 128)
 *   [round h1, h3 to bf16]
 *   h  = swiglu(h1, h3, swiglu_limit) · row_weight                 [bf16 values]
 *   y  = moe_gemm(h, w2)                                            (act_quant 128)
 *   [round y to bf16]
 *   out[t] = Σ_j y[slot_row[t, j]], j ascending (moe_combine, no weights;
 *            a token with no local row gets zeros)
 * with the same numerics (bracketed steps when bf16_round). The CPU reference
 * variant composes exactly those reference ops; the CUDA variant does it in
 * two launches: gate + up of every (row, expert) fused with SwiGLU, the clamp
 * and the routing weight (writes h), then down fused with the bf16 rounding
 * and the combine (writes y, then out). The routing weight is applied where
 * the reference applies it, before the FP8 act_quant of w2's input (so it
 * lives in the first launch, not the second).
 *
 * Layout: the grouped rows of moe_dispatch (moe_gemm.h): expert e owns rows
 * [expert_offsets[e], expert_offsets[e+1]); row_src gives the token of each
 * row, slot_row the row of slot (t, j) or -1. n_rows (= n_tokens · top_k,
 * an upper bound) sizes h and y; rows at and past offsets[n_experts] are
 * neither read nor written.
 */
#ifndef DSV4_KERNELS_MOE_DECODE_H
#define DSV4_KERNELS_MOE_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/quant/wmat.h"
#include "kernels/registry/registry.h"

/* The step size the fused path is for (model/forward_moe.c takes the unfused path
 * above it; run() itself takes any n_tokens). */
#define KERN_MOE_DECODE_MAX_TOKENS 64

/* kern_problem.shape for op moe_decode. */
struct kern_moe_decode_shape {
	int64_t dim;          /* D: w1/w3 in, w2 out */
	int64_t inter;        /* I (this rank's): w1/w3 out, w2 in */
	int64_t n_experts;    /* experts held by this rank */
	int top_k;
	int64_t max_tokens;   /* largest step the plan runs */
	int act_quant_block;  /* 0 or 128 (the CUDA variant needs 128) */
};

struct kern_moe_decode_args {
	int64_t n_tokens;               /* T */
	int top_k;                      /* K */
	int64_t n_experts;              /* E local */
	const int32_t *expert_offsets;  /* [E + 1] */
	const int32_t *row_src;         /* [T·K]: token of each row */
	const int32_t *slot_row;        /* [T·K]: row of slot t·K + j, or -1 */
	const float *row_weight;        /* [T·K] routing weight of each row, or NULL (= 1) */
	const float *x;                 /* [T, D] f32 */
	float *h;                       /* [T·K, I] out: the SwiGLU activations (w2's input) */
	float *y;                       /* [T·K, D] out: the expert outputs (w2) */
	float *out;                     /* [T, D] out: the combined rows */
	const struct kern_wmat *w1, *w3, *w2;          /* [E] host arrays (shape, format) */
	const struct kern_wmat *w1_dev, *w3_dev, *w2_dev; /* CUDA: device copies of the arrays */
	int act_quant_block;            /* 0 or 128 */
	float swiglu_limit;             /* <= 0: no clamp */
	bool bf16_round;                /* the reference's bf16 storage rounding (h1, h3, h, y) */
	void *stream;                   /* cudaStream_t */
	void *ctx;                      /* struct kern_ctx * (NULL: the default context): counters */
};

typedef enum status (*kern_moe_decode_fn)(const struct kern_moe_decode_args *a);

/* The CPU reference (host buffers): moe_gemm / swiglu / moe_combine refs. */
enum status kern_moe_decode_ref(const struct kern_moe_decode_args *a) DSV4_WUR;

/* Bytes of device scratch the CUDA variant takes from the context for a
 * step of n_tokens (the combine's per-(token, column chunk) counters). */
size_t kern_moe_decode_scratch_bytes(int64_t n_tokens, int64_t dim);

/* CUDA variant (moe_decode.cu), cc >= 8.0, MXFP4 / NVFP4 experts, act_quant
 * 128, D and I multiples of 128, 16-byte aligned x/h/y/out and weights (2-byte
 * scales). Device pointers everywhere (offsets, row_src, slot_row,
 * row_weight included). ST_UNSUPPORTED for what it cannot take. */
enum status kern_moe_decode_cuda(const struct kern_moe_decode_args *a);
/* The same on host buffers (copies everything in and out, synchronises). */
enum status kern_moe_decode_cuda_host(const struct kern_moe_decode_args *a);
/* Variant moe_decode_cuda_mma: the same contract and limits, the GEMVs on
 * bf16 mma.sync m16n8k16 (cc >= 8.0) instead of f32 FMA (fewer instructions
 * per weight byte: e2m1 pairs scaled in bf16, the products on the tensor
 * cores). *_host: on host buffers. */
enum status kern_moe_decode_cuda_mma(const struct kern_moe_decode_args *a);
enum status kern_moe_decode_cuda_mma_host(const struct kern_moe_decode_args *a);

extern const struct kern_op kern_op_moe_decode;

#endif
