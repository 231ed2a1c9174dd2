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
#if DSV4_HAVE_CUDA
#include "kernels/norm/norm_generic.h"
#endif

static const struct kern_variant rmsnorm_variants[] = {
	{
		.name = "rmsnorm_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_rmsnorm_ref),
		.run_host = KERN_FN(kern_rmsnorm_ref),
		.desc = "CPU reference: RMSNorm (weighted/unweighted, bf16 in/out), fp32",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "rmsnorm_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_rmsnorm_cuda_generic),
		.run_host = KERN_FN(kern_rmsnorm_cuda_generic_host),
#endif
		.desc = "portable CUDA RMSNorm: one block per row, fp32, the reference roundings",
	},
};

const struct kern_op kern_op_rmsnorm = {
	.name = "rmsnorm",
	.variants = rmsnorm_variants,
	.n_variants = (int)(sizeof rmsnorm_variants / sizeof rmsnorm_variants[0]),
};
