/*
 * kernels/attention/attention_variants.c: the registry tables of ops "sparse_attn", "attn_index",
 * "ring_write".
 *
 * Variants (priority order, highest first):
 *   sparse_attn_cuda_decode  cc >= 8.0, sm_80 image (attn_decode.cu): steps of
 *                  <= 64 tokens read each row once per 32 heads; others go
 *                  to the generic kernel.
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (attention_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (attention_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/attention/attention.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/attention/attention_generic.h"
#include "kernels/attention/attn_decode.h"
#endif

static const struct kern_variant sparse_attn_variants[] = {
	{
		.name = "sparse_attn_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_sparse_attn_ref),
		.run_host = KERN_FN(kern_sparse_attn_ref),
		.desc = "CPU reference: sparse MQA attention with sink and inverse rope",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "sparse_attn_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_sparse_attn_cuda_generic),
#endif
		.desc = "portable CUDA sparse MQA: block per (token, head), online softmax per warp",
	},
	/* ---- decode cuda ops ---- */
	{
		.name = "sparse_attn_cuda_decode",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 20,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_sparse_attn_cuda_decode),
#endif
		.desc = "portable CUDA decode sparse MQA (T <= 64): 32 heads per CTA, rows split over CTAs + "
			"combine; larger steps run the generic kernel",
	},
};

const struct kern_op kern_op_sparse_attn = {
	.name = "sparse_attn",
	.variants = sparse_attn_variants,
	.n_variants = (int)(sizeof sparse_attn_variants / sizeof sparse_attn_variants[0]),
};

static const struct kern_variant attn_index_variants[] = {
	{
		.name = "attn_index_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_attn_index_ref),
		.run_host = KERN_FN(kern_attn_index_ref),
		.desc = "CPU reference: SWA/CSA/HCA index sets for a flat batch",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "attn_index_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_attn_index_cuda_generic),
#endif
		.desc = "portable CUDA SWA/CSA/HCA index sets, one block per token",
	},
};

const struct kern_op kern_op_attn_index = {
	.name = "attn_index",
	.variants = attn_index_variants,
	.n_variants = (int)(sizeof attn_index_variants / sizeof attn_index_variants[0]),
};

static const struct kern_variant ring_write_variants[] = {
	{
		.name = "ring_write_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_ring_write_ref),
		.run_host = KERN_FN(kern_ring_write_ref),
		.desc = "CPU reference: store a step's raw KV into the sliding-window rings",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "ring_write_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_ring_write_cuda_generic),
#endif
		.desc = "portable CUDA ring store of a step's raw KV, one block per token",
	},
};

const struct kern_op kern_op_ring_write = {
	.name = "ring_write",
	.variants = ring_write_variants,
	.n_variants = (int)(sizeof ring_write_variants / sizeof ring_write_variants[0]),
};
