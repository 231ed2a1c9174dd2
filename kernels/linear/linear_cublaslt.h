/*
 * kernels/linear/linear_cublaslt.h: the cuBLASLt FP8 block-scaled linear
 * (variant linear_cublaslt_sm90, kernels/linear/linear_cublaslt.cu).
 *
 * y = act_quant_fp8(x) · Wᵀ through cublasLtMatmul, which has DeepSeek-style
 * block scaling on sm_90 only (kernels.md §3.3):
 *   A = W   [out, in] e4m3, TRANSA=T, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
 *           per-row 1x128 f32 scales, KERN_WFMT_FP8_F32_R128 (wmat.h), which
 *           prepare() builds by replicating each 128x128 block scale over its
 *           128 rows (exact), laid out s[kb][o] (kb*out + o);
 *   B = xq  [T, in] e4m3, quantized on the device first (one f32 pow2 scale
 *           per token and 128 columns, bit-identical to the CPU act_quant):
 *           BLK128x128_32F for a 1-token GEMM (s[kb]), VEC128_32F with the
 *           token count padded to 4 otherwise (s[kb][N]: kb*N + t);
 *   D = y   [T, out] bf16 or f32, row stride ldy.
 * The .cu's header says why these modes (the H200's heuristic has nothing
 * for VEC128/BLK128 x VEC128 at N = 1) and how calls are cut into pieces.
 * Descriptors, layouts and the heuristic's algorithm are built once per
 * (device, in, out, N, ld of D, y dtype) on first use and cached for the
 * life of the process; a call only sets the two scale pointers and launches.
 * All device scratch (FP8 activations, their scales, a 4 MiB output stage,
 * the cuBLASLt workspace) comes from the caller (kern_linear_args.workspace).
 *
 * Thread rules: the plan cache is mutex-protected; a cached plan's scale
 * pointers are set per call, so one thread per device (the executor thread
 * that owns that GPU, design.md) may call kern_linear_cublaslt at a time.
 * Present only in CUDA builds, except kern_linear_cublaslt_prepare (linear_variants.c).
 */
#ifndef DSV4_KERNELS_LINEAR_CUBLASLT_H
#define DSV4_KERNELS_LINEAR_CUBLASLT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/linear/linear.h"

/* The cuBLASLt workspace the heuristic may use (Hopper guidance: 32 MiB). */
#define KERN_LINEAR_LT_WORKSPACE_BYTES ((size_t)32 << 20)
/* Staging for y rows that are not 16-byte aligned and for padded pieces. */
#define KERN_LINEAR_LT_STAGE_BYTES ((size_t)4 << 20)
/* Shape limits of run(): in % 128 == 0, out % 16 == 0, out <= MAX_OUT (a
 * padded 16-token piece of f32 fits the stage), n_tokens <= MAX_TOKENS.
 * The variant's guard asks in % 512 on top (linear_variants.c says why). */
#define KERN_LINEAR_LT_MAX_OUT 65536
#define KERN_LINEAR_LT_MAX_TOKENS 65535

struct err;

/* prepare(): an FP8 matrix with 128x128 E8M0 or f32 block scales ->
 * KERN_WFMT_FP8_F32_R128 (data shared, the per-row scales s[kb][o] =
 * block_scale[o/128][kb] in a buffer owned by out). Plain C, every build. */
enum status kern_linear_cublaslt_prepare(const struct kern_wmat *in, struct kern_wmat *out, struct err *e);

/* Bytes of kern_linear_args.workspace that one call with up to max_tokens
 * tokens and `in` input columns needs (FP8 activations + scales + a 4 MiB
 * output staging buffer + the cuBLASLt workspace, each 256-byte aligned). */
size_t kern_linear_cublaslt_workspace_bytes(int64_t max_tokens, int64_t in);

/* Build (or find) the plans a call with n_tokens tokens (16-byte aligned y)
 * uses on CUDA device `device`, with the run-time fallback to 16-token
 * pieces, and say whether cuBLASLt's heuristic has an algorithm for each;
 * false with the reason ("cuBLASLt heuristic: no algorithm for ... N = ...")
 * otherwise. The variant's supports() asks for T = 1, 2, 16 and max_tokens,
 * so a refusal is a load-time decision with a message; an N first met in
 * the step that has no algorithm makes that call ST_UNSUPPORTED with an
 * ERROR log line (never a silent failure). */
bool kern_linear_cublaslt_check(int device, int64_t in, int64_t out, int64_t n_tokens, enum kern_dtype y_dtype,
				char *why, size_t why_bytes);

/* Device-buffer run: x, y, w->data, w->scale (FP8_F32_R128) and workspace
 * are device pointers; act_quant_block must be 128; the shape limits above;
 * w->data and w->scale 16-byte aligned; y any row stride ldy >= out
 * (unaligned rows go through the stage). ST_INVALID for arguments outside
 * that, ST_UNSUPPORTED if the heuristic has no algorithm for a piece of
 * this n_tokens (logged), ST_CUDA if a launch failed. */
enum status kern_linear_cublaslt(const struct kern_linear_args *a);
/* The same on host buffers (allocates, copies in, runs, copies back, syncs). */
enum status kern_linear_cublaslt_host(const struct kern_linear_args *a);

/* Once per device (cached, thread-safe): run the variant on random 1-, 7-
 * and 16-token inputs of a [144 x 512] FP8 weight and compare with the CPU
 * reference, so a wrong scale layout or mode is refused at load with the
 * mismatch in why, never served. In linear_variants.c (CUDA builds). */
bool kern_linear_cublaslt_probe(int device, char *why, size_t why_bytes);

/* Make `device` the calling thread's current CUDA device; returns the
 * previous one, or -1 if either call failed (the probe's helper). */
int kern_linear_cublaslt__set_device(int device);

/* Destroy every cached plan and handle (tests, shutdown). Not concurrent with runs. */
void kern_linear_cublaslt_release(void);

#endif
