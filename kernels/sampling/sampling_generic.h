/*
 * kernels/sampling/sampling_generic.h: the portable CUDA sampling op
 * (sampling_generic.cu), cc >= 8.0, contract and its rounding differences
 * from the reference in sampling.h. kern_sample_cuda_generic takes device
 * logits and device scratch and queues on a->stream (then waits for it);
 * kern_sample_cuda_generic_host takes host logits (copies them up, allocates
 * its own scratch, ignores a->work) for tests and self-checks. Present in
 * CUDA builds only.
 */
#ifndef DSV4_KERNELS_SAMPLING_GENERIC_H
#define DSV4_KERNELS_SAMPLING_GENERIC_H

#include "kernels/sampling/sampling.h"

enum status kern_sample_cuda_generic(const struct kern_sample_batch_args *a);
enum status kern_sample_cuda_generic_host(const struct kern_sample_batch_args *a);

#endif
