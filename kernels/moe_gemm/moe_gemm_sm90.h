/*
 * kernels/moe_gemm/moe_gemm_sm90.h: the Hopper FP4 expert GEMM (variant
 * moe_gemm_sm90_fp4, kernels/moe_gemm/moe_gemm_sm90.cu, built into the
 * sm_90a image only). Same contract as kern_moe_gemm_cuda_generic
 * (moe_gemm.h): rows sorted by expert, device offsets, optional row_src
 * gather, optional FP8 act_quant, every existing row of y written.
 * Weights: MXFP4 or NVFP4 as stored (no prepare step), in % 32 == 0.
 * Present when the build has the sm_90a target (DSV4_HAVE_SM_90A).
 */
#ifndef DSV4_KERNELS_MOE_GEMM_SM90_H
#define DSV4_KERNELS_MOE_GEMM_SM90_H

#include "kernels/moe_gemm/moe_gemm.h"

enum status kern_moe_gemm_sm90_fp4(const struct kern_moe_gemm_args *a);
/* The same on host buffers (copies everything in and out, syncs). */
enum status kern_moe_gemm_sm90_fp4_host(const struct kern_moe_gemm_args *a);

#endif
