/*
 * kernels/act/act_variants.c: the registry tables of op "swiglu".
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (act_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 * GPU variants implement the same args contract on device buffers and are
 * added above the reference with their guards (style.md rule 9).
 */
#include "kernels/act/act.h"

static const struct kern_variant swiglu_variants[] = {
	{
		.name = "swiglu_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_swiglu_ref),
		.run_host = KERN_FN(kern_swiglu_ref),
		.desc = "CPU reference: SwiGLU with the swiglu_limit clamps, row weight",
	},
};

const struct kern_op kern_op_swiglu = {
	.name = "swiglu",
	.variants = swiglu_variants,
	.n_variants = (int)(sizeof swiglu_variants / sizeof swiglu_variants[0]),
};
