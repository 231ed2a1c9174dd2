/*
 * kernels/compressor/compressor_variants.c: the registry tables of op "compressor".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (compressor_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (compressor_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/compressor/compressor.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/compressor/compressor_generic.h"
#endif

static const struct kern_variant compressor_variants[] = {
	{
		.name = "compressor_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_compressor_ref),
		.run_host = KERN_FN(kern_compressor_ref),
		.desc = "CPU reference: CSA/HCA KV compressor state machine",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "compressor_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_compressor_cuda_generic),
#endif
		.desc = "portable CUDA compressor state machine, one block per sequence",
	},
};

const struct kern_op kern_op_compressor = {
	.name = "compressor",
	.variants = compressor_variants,
	.n_variants = (int)(sizeof compressor_variants / sizeof compressor_variants[0]),
};
