/*
 * kernels/linear/linear_cublaslt.h: the cuBLASLt FP8 block-scaled linear
 * (variant linear_cublaslt_sm90, kernels/linear/linear_cublaslt.cu).
 *
 * y = act_quant_fp8(x) · Wᵀ through cublasLtMatmul with DeepSeek-style block
 * scales, which cuBLASLt supports on sm_90 only (kernels.md §3.3):
 *   A = W   [out, in] e4m3, TRANSA=T, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
 *           (f32 scales: prepare() widens the checkpoint's E8M0, exactly);
 *   B = xq  [T, in] e4m3, quantized on the device first (one f32 pow2 scale
 *           per token and 128 columns, bit-identical to the CPU act_quant),
 *           CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
 *   D = y   [T, out] bf16 or f32, row stride ldy.
 * Descriptors, layouts and the heuristic's algorithm are built once per
 * (device, in, out, n_tokens, y dtype, ldy) on first use and cached for the
 * life of the process; a call only sets the two scale pointers and launches.
 * All device scratch (FP8 activations, their scales, the cuBLASLt
 * workspace) comes from the caller (kern_linear_args.workspace).
 *
 * Thread rules: the plan cache is mutex-protected; a cached plan's scale
 * pointers are set per call, so one thread per device (the executor thread
 * that owns that GPU, design.md) may call kern_linear_cublaslt at a time.
 * Present only in CUDA builds.
 */
#ifndef DSV4_KERNELS_LINEAR_CUBLASLT_H
#define DSV4_KERNELS_LINEAR_CUBLASLT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/linear/linear.h"

/* The cuBLASLt workspace the heuristic may use (Hopper guidance: 32 MiB). */
#define KERN_LINEAR_LT_WORKSPACE_BYTES ((size_t)32 << 20)

/* Bytes of kern_linear_args.workspace that one call with up to max_tokens
 * tokens and `in` input columns needs (FP8 activations + scales + a 4 MiB
 * output staging buffer + the cuBLASLt workspace, each 256-byte aligned). */
size_t kern_linear_cublaslt_workspace_bytes(int64_t max_tokens, int64_t in);

/* Build (or find) the plan for this shape on CUDA device `device` and say
 * whether cuBLASLt's heuristic returned an algorithm; false with the reason
 * ("cuBLASLt heuristic: no algorithm for ...") otherwise. Used by the
 * variant's supports() at selection time, so a refusal is a load-time
 * decision with a message, never a failure in the step. */
bool kern_linear_cublaslt_check(int device, int64_t in, int64_t out, int64_t n_tokens, enum kern_dtype y_dtype,
				char *why, size_t why_bytes);

/* Device-buffer run: x, y, w->data, w->scale (FP8_F32_B128) and workspace
 * are device pointers; act_quant_block must be 128; in % 512 == 0 and
 * out % 16 == 0 (the variant's guard); w->data 16-byte aligned; y any row
 * stride ldy >= out (unaligned rows go through a staging buffer).
 * ST_INVALID for arguments outside that, ST_UNSUPPORTED if the heuristic
 * found no algorithm for this n_tokens, ST_CUDA if a launch failed. */
enum status kern_linear_cublaslt(const struct kern_linear_args *a);
/* The same on host buffers (allocates, copies in, runs, copies back, syncs). */
enum status kern_linear_cublaslt_host(const struct kern_linear_args *a);

/* Destroy every cached plan and handle (tests, shutdown). Not concurrent with runs. */
void kern_linear_cublaslt_release(void);

#endif
