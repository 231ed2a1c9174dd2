/*
 * kernels/rope/rope_variants.c: the registry tables of op "rope".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (rope_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (rope_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/rope/rope.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/rope/rope_generic.h"
#endif

static const struct kern_variant rope_variants[] = {
	{
		.name = "rope_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_rope_ref),
		.run_host = KERN_FN(kern_rope_ref),
		.desc = "CPU reference: interleaved rope on the last dims, forward/inverse",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "rope_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_rope_cuda_generic),
#endif
		.desc = "portable CUDA interleaved rope, one thread per (row, pair, head)",
	},
};

const struct kern_op kern_op_rope = {
	.name = "rope",
	.variants = rope_variants,
	.n_variants = (int)(sizeof rope_variants / sizeof rope_variants[0]),
};
