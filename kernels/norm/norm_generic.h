/*
 * kernels/norm/norm_generic.h: the portable CUDA rmsnorm (norm_generic.cu),
 * cc >= 8.0, same args contract as kern_rmsnorm_ref on device buffers, run
 * on a->stream. The _host form copies host buffers in and out (tests,
 * self-checks). Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_NORM_NORM_GENERIC_H
#define DSV4_KERNELS_NORM_NORM_GENERIC_H

#include "kernels/norm/norm.h"

enum status kern_rmsnorm_cuda_generic(const struct kern_rmsnorm_args *a);
enum status kern_rmsnorm_cuda_generic_host(const struct kern_rmsnorm_args *a);

#endif
