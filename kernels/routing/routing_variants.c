/*
 * kernels/routing/routing_variants.c: the registry table of op "route".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (routing_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (routing_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/routing/routing.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/routing/routing_generic.h"
#endif

static const struct kern_variant route_variants[] = {
	{
		.name = "route_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_route_ref),
		.run_host = KERN_FN(kern_route_ref),
		.desc = "CPU reference: sqrt(softplus) top-k / hash routing",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "route_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_route_cuda_generic),
#endif
		.desc = "portable CUDA sqrt(softplus) top-k / hash routing, one block per token",
	},
};

const struct kern_op kern_op_route = {
	.name = "route",
	.variants = route_variants,
	.n_variants = (int)(sizeof route_variants / sizeof route_variants[0]),
};
