/*
 * kernels/sampling/logprobs_variants.c: the registry table of op
 * "token_logprobs" (logprobs.h), prompt log-probabilities over logit rows.
 *
 * Variants (priority order, highest first):
 *   token_logprobs_cuda_generic  cc >= 8.0, sm_80 image: logits stay on the
 *                                device, only per-row results come back.
 *   token_logprobs_cpu_ref       the oracle, and the CPU executor's variant.
 */
#include "kernels/sampling/logprobs.h"

#include "dsv4_config.h"
#include "kernels/registry/registry.h"
#if DSV4_HAVE_CUDA
#include "kernels/sampling/logprobs_generic.h"
#endif

static const struct kern_variant token_logprobs_variants[] = {
	{
		.name = "token_logprobs_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_token_logprobs_ref),
		.run_host = KERN_FN(kern_token_logprobs_ref),
		.desc = "CPU reference: log-sum-exp, target logprob and rank, top-n per row",
	},
	{
		.name = "token_logprobs_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_token_logprobs_cuda_generic),
		.run_host = KERN_FN(kern_token_logprobs_cuda_generic_host),
#endif
		.desc = "portable CUDA prompt logprobs: CTA per row, results back only",
	},
};

const struct kern_op kern_op_token_logprobs = {
	.name = "token_logprobs",
	.variants = token_logprobs_variants,
	.n_variants = (int)(sizeof token_logprobs_variants / sizeof token_logprobs_variants[0]),
};
