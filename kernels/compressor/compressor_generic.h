/*
 * kernels/compressor/compressor_generic.h: the portable CUDA KV compressor
 * (compressor_generic.cu), cc >= 8.0, same args contract as
 * kern_compressor_ref on device buffers, run on a->stream. Present in CUDA
 * builds only.
 */
#ifndef DSV4_KERNELS_COMPRESSOR_COMPRESSOR_GENERIC_H
#define DSV4_KERNELS_COMPRESSOR_COMPRESSOR_GENERIC_H

#include "kernels/compressor/compressor.h"

enum status kern_compressor_cuda_generic(const struct kern_compressor_args *a);

#endif
