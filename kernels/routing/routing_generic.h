/*
 * kernels/routing/routing_generic.h: the portable CUDA route and moe_group
 * (routing_generic.cu), cc >= 8.0, same args contracts as kern_route_ref /
 * kern_moe_group_ref on device buffers, run on a->stream. Present in CUDA
 * builds only.
 */
#ifndef DSV4_KERNELS_ROUTING_ROUTING_GENERIC_H
#define DSV4_KERNELS_ROUTING_ROUTING_GENERIC_H

#include "kernels/routing/routing.h"

enum status kern_route_cuda_generic(const struct kern_route_args *a);
enum status kern_moe_group_cuda_generic(const struct kern_moe_group_args *a);

#endif
