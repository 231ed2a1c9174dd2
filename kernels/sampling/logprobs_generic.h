/*
 * kernels/sampling/logprobs_generic.h: the portable CUDA variant of op
 * "token_logprobs" (logprobs_generic.cu), cc >= 8.0: device logits and
 * device scratch, queued on a->stream, waits for it. The _host form takes
 * host logits (copies them up, allocates its own scratch) for tests and
 * self-checks. Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_SAMPLING_LOGPROBS_GENERIC_H
#define DSV4_KERNELS_SAMPLING_LOGPROBS_GENERIC_H

#include "kernels/sampling/logprobs.h"

enum status kern_token_logprobs_cuda_generic(const struct kern_token_logprobs_args *a);
enum status kern_token_logprobs_cuda_generic_host(const struct kern_token_logprobs_args *a);

#endif
