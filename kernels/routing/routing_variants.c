/*
 * kernels/routing/routing_variants.c: the registry tables of ops "route", "moe_group".
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (routing_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 * GPU variants implement the same args contract on device buffers and are
 * added above the reference with their guards (style.md rule 9).
 */
#include "kernels/routing/routing.h"

static const struct kern_variant route_variants[] = {
	{
		.name = "route_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_route_ref),
		.run_host = KERN_FN(kern_route_ref),
		.desc = "CPU reference: sqrt(softplus) top-k / hash routing",
	},
};

const struct kern_op kern_op_route = {
	.name = "route",
	.variants = route_variants,
	.n_variants = (int)(sizeof route_variants / sizeof route_variants[0]),
};

static const struct kern_variant moe_group_variants[] = {
	{
		.name = "moe_group_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_moe_group_ref),
		.run_host = KERN_FN(kern_moe_group_ref),
		.desc = "CPU reference: (token, expert) pairs grouped by expert",
	},
};

const struct kern_op kern_op_moe_group = {
	.name = "moe_group",
	.variants = moe_group_variants,
	.n_variants = (int)(sizeof moe_group_variants / sizeof moe_group_variants[0]),
};
