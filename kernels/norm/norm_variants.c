/*
 * kernels/norm/norm_variants.c: the registry tables of op "rmsnorm".
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (norm_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 * GPU variants implement the same args contract on device buffers and are
 * added above the reference with their guards (style.md rule 9).
 */
#include "kernels/norm/norm.h"

static const struct kern_variant rmsnorm_variants[] = {
	{
		.name = "rmsnorm_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_rmsnorm_ref),
		.run_host = KERN_FN(kern_rmsnorm_ref),
		.desc = "CPU reference: RMSNorm (weighted/unweighted, bf16 in/out), fp32",
	},
};

const struct kern_op kern_op_rmsnorm = {
	.name = "rmsnorm",
	.variants = rmsnorm_variants,
	.n_variants = (int)(sizeof rmsnorm_variants / sizeof rmsnorm_variants[0]),
};
