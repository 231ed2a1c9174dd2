/*
 * kernels/linear/linear_bf16.h: the portable fast linears for bf16 weights
 * (the lm_head, the router gate, dequantized checkpoints), beside the FMA
 * floor linear_cuda_generic_bf16. Both are plain CUDA of cc >= 8.0, built in
 * the sm_80 image of every target; both compute what kern_linear_ref does
 * for bf16 weights and act_quant_block 0: y[t,o] = Σ_k x[t,k] · w[o,k] with
 * x as given (f32 or bf16, never rounded), w the bf16 values, f32 sums; only
 * the summation order differs.
 *
 *   kern_linear_gemv_bf16_cuda (variant linear_cuda_gemv_bf16,
 *     linear_gemv_bf16.cu): the decode GEMV / skinny GEMM. One wave of CTAs
 *     walks the weight rows with 16-byte loads, each CTA holding its (up to
 *     8) tokens' whole activation rows in shared memory, so a weight row is
 *     read from memory once per step for those tokens (more tokens take
 *     CTAs that walk the same rows at the same time: the second read hits
 *     L2). Small `out` (the router gate's 256 rows) spreads the K steps of a
 *     row group over up to 8 warps so that the SMs fill. Limits: in % 8 == 0,
 *     in <= KERN_LINEAR_GEMV_BF16_MAX_IN, 16-byte aligned weight data.
 *   kern_linear_mma_bf16w (variant linear_mma_bf16w, linear_mma_bf16w.cu):
 *     the tensor-core GEMM for prefill-sized calls (the head over prompt
 *     rows): mma.sync m16n8k16 bf16 x bf16 -> f32. f32 activations are split
 *     exactly into up to three bf16 terms (x = hi + mid + lo; products
 *     with a bf16 weight are exact in the f32 accumulation), so the result
 *     is the reference's up to summation order; a K tile whose activations
 *     are all bf16 values (bf16 x, or x rounded upstream) runs one term.
 *     Limits: in % 32 == 0, 16-byte aligned weight data. No workspace.
 * Both take a bf16 kern_wmat (KERN_WFMT_BF16) and act_quant_block 0 only;
 * anything else is ST_INVALID. Pointers are device pointers (w itself on the
 * host); the _host forms run on host buffers (copies, self-checks, tests).
 * CUDA builds only.
 */
#ifndef DSV4_KERNELS_LINEAR_BF16_H
#define DSV4_KERNELS_LINEAR_BF16_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/linear/linear.h"

/* Largest `in` of the GEMV: one token's activation row (f32) fills at most
 * 64 KiB of shared memory. */
#define KERN_LINEAR_GEMV_BF16_MAX_IN 16384

/* Largest max_tokens of a plan the GEMV takes: below one 64-row tile of the
 * tensor-core variant, which takes plans from 64 tokens on. */
#define KERN_LINEAR_GEMV_BF16_MAX_TOKENS 63

/* The variants' guards (registry supports(), linear_bf16.c; pure C): bf16
 * weights are checked by the table's wfmt_accept, these check
 * act_quant_block 0, x and y dtypes, in's alignment and bound, and the plan's
 * token range (GEMV: max_tokens <= 63; MMA: >= 64). */
bool kern_linear_gemv_bf16_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				    size_t why_bytes);
bool kern_linear_mma_bf16w_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				    size_t why_bytes);

/* The argument checks both run()s make (pure C, linear_bf16.c): a bf16
 * weight with data 16-byte aligned, in % align == 0 and in <= max_in,
 * act_quant_block 0, f32 or bf16 x and y, strides at least a row (resolved
 * into *ldx, *ldy), x and y present when n_tokens > 0. ST_INVALID otherwise. */
enum status kern_linear_bf16__check(const struct kern_linear_args *a, int64_t align, int64_t max_in, int64_t *ldx,
				    int64_t *ldy);

/* ---- CUDA (present when built with CUDA) ---- */
enum status kern_linear_gemv_bf16_cuda(const struct kern_linear_args *a);
enum status kern_linear_gemv_bf16_cuda_host(const struct kern_linear_args *a);
enum status kern_linear_mma_bf16w(const struct kern_linear_args *a);
enum status kern_linear_mma_bf16w_host(const struct kern_linear_args *a);

#endif
