/*
 * kernels/act/act_generic.h: the portable CUDA SwiGLU and silu
 * (act_generic.cu), cc >= 8.0, same contracts as kern_swiglu_ref /
 * kern_silu_ref on device buffers, run on a->stream (silu: on stream).
 * Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_ACT_ACT_GENERIC_H
#define DSV4_KERNELS_ACT_ACT_GENERIC_H

#include "kernels/act/act.h"

enum status kern_swiglu_cuda_generic(const struct kern_swiglu_args *a);
/* silu in place over n device floats. ST_INVALID for n < 0 or x NULL with n > 0. */
enum status kern_silu_cuda_generic(float *x, int64_t n, void *stream);

#endif
