/*
 * kernels/sampling/sampling_variants.c: the registry table of op "sample",
 * batched token sampling (sampling.h).
 *
 * Variants (priority order, highest first):
 *   sample_cuda_generic  cc >= 8.0, sm_80 image (sampling_generic.cu),
 *                        priority 10: logits stay on the device, only the
 *                        sampled ids and logprobs come back.
 *   sample_cpu_ref       kern_sample_ref per row (sampling_batch.c): the
 *                        oracle, and the CPU executor's variant.
 */
#include "kernels/sampling/sampling.h"

#include "dsv4_config.h"
#include "kernels/registry/registry.h"
#include "kernels/sampling/sampling_generic.h"

static const struct kern_variant sample_variants[] = {
	KERN_ROW_CPU_REF("sample_cpu_ref", kern_sample_batch_ref,
	                 .desc = "CPU reference: kern_sample_ref per row (penalties, min_p, top_k, top_p, logprobs)"),
	KERN_ROW_SM80("sample_cuda_generic", 10, kern_sample_cuda_generic, kern_sample_cuda_generic_host,
	              .desc = "portable CUDA sampling: CTA per row, CUB radix sort of the probabilities, ids back only"),
};

const struct kern_op kern_op_sample = {
	.name = "sample",
	.variants = sample_variants,
	.n_variants = (int)(sizeof sample_variants / sizeof sample_variants[0]),
};
