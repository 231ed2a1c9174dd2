/*
 * kernels/hc/hc_variants.c: the registry tables of ops "hc_prenorm", "hc_split",
 * "hc_pre_combine", "hc_post".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (hc_generic.cu): our own
 *                  prenorm GEMM + Σx², Sinkhorn split and stream combines,
 *                  so no GPU depends on DeepGEMM's tf32_hc_prenorm_gemm.
 *   <op>_cpu_ref   the CPU reference (hc_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/hc/hc.h"

#include "dsv4_config.h"
#include "kernels/hc/hc_generic.h"

static const struct kern_variant hc_prenorm_variants[] = {
	KERN_ROW_CPU_REF("hc_prenorm_cpu_ref", kern_hc_prenorm_ref,
	                 .desc = "CPU reference: mHC prenorm GEMM v·fnᵀ + Σv², fp32 loops"),
	/* ---- portable CUDA ---- */
	KERN_ROW_SM80("hc_prenorm_cuda_generic", 10, kern_hc_prenorm_cuda_generic, kern_hc_prenorm_cuda_generic_host,
	              .desc = "portable CUDA mHC prenorm: x·fnᵀ + Σx², fp32, deterministic split over outputs"),
};

const struct kern_op kern_op_hc_prenorm = {
	.name = "hc_prenorm",
	.variants = hc_prenorm_variants,
	.n_variants = (int)(sizeof hc_prenorm_variants / sizeof hc_prenorm_variants[0]),
};

static const struct kern_variant hc_split_variants[] = {
	KERN_ROW_CPU_REF("hc_split_cpu_ref", kern_hc_split_ref,
	                 .desc = "CPU reference: mHC sigmoid/softmax + col-first Sinkhorn, HCHead"),
	/* ---- portable CUDA ---- */
	KERN_ROW_SM80("hc_split_cuda_generic", 10, kern_hc_split_cuda_generic, kern_hc_split_cuda_generic_host,
	              .desc = "portable CUDA mHC split: sigmoid/softmax + col-first Sinkhorn, one thread per token"),
};

const struct kern_op kern_op_hc_split = {
	.name = "hc_split",
	.variants = hc_split_variants,
	.n_variants = (int)(sizeof hc_split_variants / sizeof hc_split_variants[0]),
};

static const struct kern_variant hc_pre_combine_variants[] = {
	KERN_ROW_CPU_REF("hc_pre_combine_cpu_ref", kern_hc_pre_combine_ref,
	                 .desc = "CPU reference: mHC u = Σ pre_j X_j"),
	/* ---- portable CUDA ---- */
	KERN_ROW_SM80("hc_pre_combine_cuda_generic", 10, kern_hc_pre_combine_cuda_generic,
	              kern_hc_pre_combine_cuda_generic_host, .desc = "portable CUDA mHC u = Σ pre_j X_j"),
};

const struct kern_op kern_op_hc_pre_combine = {
	.name = "hc_pre_combine",
	.variants = hc_pre_combine_variants,
	.n_variants = (int)(sizeof hc_pre_combine_variants / sizeof hc_pre_combine_variants[0]),
};

static const struct kern_variant hc_post_variants[] = {
	KERN_ROW_CPU_REF("hc_post_cpu_ref", kern_hc_post_ref,
	                 .desc = "CPU reference: mHC X'_k = post_k f + Σ_j comb[j][k] X_j"),
	/* ---- portable CUDA ---- */
	KERN_ROW_SM80("hc_post_cuda_generic", 10, kern_hc_post_cuda_generic, kern_hc_post_cuda_generic_host,
	              .desc = "portable CUDA mHC X'_k = post_k f + Σ_j comb[j][k] X_j"),
};

const struct kern_op kern_op_hc_post = {
	.name = "hc_post",
	.variants = hc_post_variants,
	.n_variants = (int)(sizeof hc_post_variants / sizeof hc_post_variants[0]),
};
