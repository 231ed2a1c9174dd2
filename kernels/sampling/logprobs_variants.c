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
#include "kernels/sampling/logprobs_generic.h"

static const struct kern_variant token_logprobs_variants[] = {
	KERN_ROW_CPU_REF("token_logprobs_cpu_ref", kern_token_logprobs_ref,
	                 .desc = "CPU reference: log-sum-exp, target logprob and rank, top-n per row"),
	KERN_ROW_SM80("token_logprobs_cuda_generic", 10, kern_token_logprobs_cuda_generic,
	              kern_token_logprobs_cuda_generic_host,
	              .desc = "portable CUDA prompt logprobs: CTA per row, results back only"),
};

const struct kern_op kern_op_token_logprobs = {
	.name = "token_logprobs",
	.variants = token_logprobs_variants,
	.n_variants = (int)(sizeof token_logprobs_variants / sizeof token_logprobs_variants[0]),
};
