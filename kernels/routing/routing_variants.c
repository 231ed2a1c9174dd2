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
#include "kernels/routing/routing_generic.h"

static const struct kern_variant route_variants[] = {
	KERN_ROW_CPU_REF("route_cpu_ref", kern_route_ref, .desc = "CPU reference: sqrt(softplus) top-k / hash routing"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("route_cuda_generic", 10, kern_route_cuda_generic, NULL,
	              .desc = "portable CUDA sqrt(softplus) top-k / hash routing, one block per token"),
};

const struct kern_op kern_op_route = {
	.name = "route",
	.variants = route_variants,
	.n_variants = (int)(sizeof route_variants / sizeof route_variants[0]),
};
