/*
 * kernels/linear/linear_mma.h: the portable tensor-core FP8 block-scaled
 * linear (variants linear_mma_fp8_<image> and linear_mma_bf16,
 * kernels/linear/linear_mma.cu; the kernel is kernels/linear/mma_gemm.cuh).
 *
 * y = act_quant_fp8(x) · Wᵀ with W e4m3 and f32 128x128 block scales
 * (KERN_WFMT_FP8_F32_B128: prepare() widens E8M0, exact):
 *   kern_linear_mma_fp8   mma.sync m16n8k32 e4m3 (cc >= 8.9; present in the
 *                         sm_90a, sm_100a, sm_120a and sm_121a images);
 *   kern_linear_mma_bf16  mma.sync m16n8k16 bf16 on the same data decoded
 *                         exactly (cc >= 8.0, the sm_80 image).
 * Both quantize x on the device first (bit-identical to kern_act_quant_fp8)
 * into scratch of kern_linear_mma_scratch_bytes(n_tokens, in): the call's
 * workspace when it is large enough, else its kern_ctx's scratch
 * (kern_linear_args.ctx; NULL = the default context). Limits: act_quant_block
 * 128, in % 128 == 0, 16-byte aligned weight data, n_tokens <= 4M; any out,
 * any ldy. Tuned for n_tokens >= 64 (prefill); smaller calls are correct.
 * CUDA builds only.
 */
#ifndef DSV4_KERNELS_LINEAR_MMA_H
#define DSV4_KERNELS_LINEAR_MMA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/linear/linear.h"

/* Device scratch one call with n_tokens tokens needs (FP8 codes or their bf16
 * values, and the activation scales). */
size_t kern_linear_mma_scratch_bytes(int64_t n_tokens, int64_t in, bool bf16);

enum status kern_linear_mma_fp8(const struct kern_linear_args *a);
enum status kern_linear_mma_fp8_host(const struct kern_linear_args *a);
enum status kern_linear_mma_bf16(const struct kern_linear_args *a);
enum status kern_linear_mma_bf16_host(const struct kern_linear_args *a);

/* Whether the FP8 kernel loaded on the current device is a cc >= 8.9 build
 * (false when only the sm_80 PTX could be JIT-compiled for it). */
bool kern_linear_mma_fp8_compiled(void);

#endif
