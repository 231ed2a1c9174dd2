/*
 * kernels/routing/routing_generic.h: the portable CUDA route
 * (routing_generic.cu), cc >= 8.0, the args contract of kern_route_ref on
 * device buffers, run on a->stream. Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_ROUTING_ROUTING_GENERIC_H
#define DSV4_KERNELS_ROUTING_ROUTING_GENERIC_H

#include "kernels/routing/routing.h"

enum status kern_route_cuda_generic(const struct kern_route_args *a);

#endif
