/*
 * kernels/rope/rope_variants.c: the registry tables of op "rope".
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (rope_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 * GPU variants implement the same args contract on device buffers and are
 * added above the reference with their guards (style.md rule 9).
 */
#include "kernels/rope/rope.h"

static const struct kern_variant rope_variants[] = {
	{
		.name = "rope_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_rope_ref),
		.run_host = KERN_FN(kern_rope_ref),
		.desc = "CPU reference: interleaved rope on the last dims, forward/inverse",
	},
};

const struct kern_op kern_op_rope = {
	.name = "rope",
	.variants = rope_variants,
	.n_variants = (int)(sizeof rope_variants / sizeof rope_variants[0]),
};
