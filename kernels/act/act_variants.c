/*
 * kernels/act/act_variants.c: the registry tables of op "swiglu".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (act_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (act_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/act/act.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/act/act_generic.h"
#endif

static const struct kern_variant swiglu_variants[] = {
	{
		.name = "swiglu_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_swiglu_ref),
		.run_host = KERN_FN(kern_swiglu_ref),
		.desc = "CPU reference: SwiGLU with the swiglu_limit clamps, row weight",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "swiglu_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_swiglu_cuda_generic),
#endif
		.desc = "portable CUDA clamped SwiGLU (+ row weight), one thread per element",
	},
};

const struct kern_op kern_op_swiglu = {
	.name = "swiglu",
	.variants = swiglu_variants,
	.n_variants = (int)(sizeof swiglu_variants / sizeof swiglu_variants[0]),
};
