/*
 * kernels/moe_gemm/moe_gemm_mma.h: the portable tensor-core grouped expert
 * GEMM for FP4 experts (variants moe_gemm_mma_fp8_<image> and
 * moe_gemm_mma_bf16, kernels/moe_gemm/moe_gemm_mma.cu; the kernel is
 * kernels/linear/mma_gemm.cuh).
 *
 * Contract of moe_gemm.h with act_quant_block 128: x (the n_x_rows source
 * rows when row_src is given, else n_rows rows) is quantized once to FP8 on
 * the device, then one block per (expert, 64-row tile, 128 outputs) runs
 *   kern_moe_gemm_mma_fp8   MXFP4 / NVFP4 unpacked to e4m3 in registers,
 *                           mma.sync m16n8k32 e4m3, block scales per 32 / 16 K
 *                           applied in f32 (cc >= 8.9);
 *   kern_moe_gemm_mma_bf16  e2m1 x block scale unpacked to bf16 (exact),
 *                           mma.sync m16n8k16 (cc >= 8.0).
 * n_rows may be an upper bound: the device offsets decide which rows exist
 * and are written. Scratch (kern_moe_gemm_mma_scratch_bytes) comes from the
 * call's kern_ctx (args.ctx; NULL = the default context). Limits: in % 128,
 * act_quant_block 128, 16-byte aligned expert data, at most 65535 - n_experts
 * row tiles of 64. CUDA builds only.
 */
#ifndef DSV4_KERNELS_MOE_GEMM_MMA_H
#define DSV4_KERNELS_MOE_GEMM_MMA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/moe_gemm/moe_gemm.h"

/* Scratch bytes for x_rows source rows of `in` columns. */
size_t kern_moe_gemm_mma_scratch_bytes(int64_t x_rows, int64_t in, bool bf16);

/* run(): calls with n_rows <= KERN_MOE_GEMV_MAX_ROWS (decode steps of a
 * prefill-sized plan) go to the GEMV dispatcher (moe_gemv.h), the rest to the
 * tensor-core kernel. */
enum status kern_moe_gemm_mma_fp8(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_fp8_host(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_bf16(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_bf16_host(const struct kern_moe_gemm_args *a);
/* The tensor-core kernels alone, any n_rows (tests, the benchmark). */
enum status kern_moe_gemm_mma_fp8_only(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_fp8_only_host(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_bf16_only(const struct kern_moe_gemm_args *a);
enum status kern_moe_gemm_mma_bf16_only_host(const struct kern_moe_gemm_args *a);

/* Whether the FP8 kernels loaded on CUDA device `device` are cc >= 8.9 builds
 * (false when only the sm_80 PTX could be JIT-compiled for it). */
bool kern_moe_gemm_mma_fp8_compiled_on(int device);

#endif
