/*
 * kernels/compressor/compressor_variants.c: the registry tables of op "compressor".
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (compressor_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 * GPU variants implement the same args contract on device buffers and are
 * added above the reference with their guards (style.md rule 9).
 */
#include "kernels/compressor/compressor.h"

static const struct kern_variant compressor_variants[] = {
	{
		.name = "compressor_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_compressor_ref),
		.run_host = KERN_FN(kern_compressor_ref),
		.desc = "CPU reference: CSA/HCA KV compressor state machine",
	},
};

const struct kern_op kern_op_compressor = {
	.name = "compressor",
	.variants = compressor_variants,
	.n_variants = (int)(sizeof compressor_variants / sizeof compressor_variants[0]),
};
