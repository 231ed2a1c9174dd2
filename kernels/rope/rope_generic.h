/*
 * kernels/rope/rope_generic.h: the portable CUDA rope (rope_generic.cu),
 * cc >= 8.0, same args contract as kern_rope_ref on device buffers, run on
 * a->stream. Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_ROPE_ROPE_GENERIC_H
#define DSV4_KERNELS_ROPE_ROPE_GENERIC_H

#include "kernels/rope/rope.h"

enum status kern_rope_cuda_generic(const struct kern_rope_args *a);

#endif
