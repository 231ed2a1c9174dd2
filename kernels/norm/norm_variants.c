/*
 * kernels/norm/norm_variants.c: the registry tables of op "rmsnorm".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (norm_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (norm_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/norm/norm.h"

#include "dsv4_config.h"
#include "kernels/norm/norm_generic.h"

static const struct kern_variant rmsnorm_variants[] = {
	KERN_ROW_CPU_REF("rmsnorm_cpu_ref", kern_rmsnorm_ref,
	                 .desc = "CPU reference: RMSNorm (weighted/unweighted, bf16 in/out), fp32"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("rmsnorm_cuda_generic", 10, kern_rmsnorm_cuda_generic, kern_rmsnorm_cuda_generic_host,
	              .desc = "portable CUDA RMSNorm: one block per row, fp32, the reference roundings"),
};

const struct kern_op kern_op_rmsnorm = {
	.name = "rmsnorm",
	.variants = rmsnorm_variants,
	.n_variants = (int)(sizeof rmsnorm_variants / sizeof rmsnorm_variants[0]),
};
