/*
 * kernels/linear/linear_gemv.h: the portable FP8 block-scaled decode GEMV /
 * skinny GEMM (variant linear_cuda_gemv, kernels/linear/linear_gemv.cu).
 *
 * y = xq · Wᵀ for decode-sized n_tokens (any n_tokens is correct; the kernel
 * is built for 1..64), W e4m3 with f32 128x128 block
 * scales (KERN_WFMT_FP8_F32_B128: prepare() widens E8M0, exact), x f32 or
 * bf16, y f32 or bf16, any row strides. xq is the reference's FP8 act_quant
 * of x (act_quant_block 128, bit-identical codes and scales, computed per
 * call inside the kernel) or x itself (act_quant_block 0). One launch, no
 * workspace, plain CUDA of cc >= 8.0 (16-byte weight loads, e4m3 decoded in
 * registers by bit operations, warp shuffles). Limits: in % 128 == 0,
 * 16-byte aligned weight data.
 */
#ifndef DSV4_KERNELS_LINEAR_GEMV_H
#define DSV4_KERNELS_LINEAR_GEMV_H

#include "kernels/linear/linear.h"

/* Largest max_tokens of a plan the variant accepts: below one 64-token tile of
 * the tensor-core variants, which take plans from 64 tokens on. */
#define KERN_LINEAR_GEMV_MAX_TOKENS 63

enum status kern_linear_gemv_cuda(const struct kern_linear_args *a);
enum status kern_linear_gemv_cuda_host(const struct kern_linear_args *a);

#endif
