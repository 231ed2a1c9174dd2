/* kernels/fill/fill_random_generic.h: the CUDA variant of fill_random
 * (fill_random_generic.cu); _host takes a host dst (tests). */
#ifndef DSV4_KERNELS_FILL_FILL_RANDOM_GENERIC_H
#define DSV4_KERNELS_FILL_FILL_RANDOM_GENERIC_H

#include "kernels/fill/fill_random.h"

enum status kern_fill_random_cuda_generic(const struct kern_fill_random_args *a);
enum status kern_fill_random_cuda_generic_host(const struct kern_fill_random_args *a);

#endif
