/*
 * kernels/indexer/indexer_variants.c: the registry tables of ops "indexer_rotate", "indexer_topk",
 * "indexer_scores".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (indexer_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (indexer_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/indexer/indexer.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/indexer/indexer_generic.h"
#endif

static const struct kern_variant indexer_rotate_variants[] = {
	{
		.name = "indexer_rotate_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_indexer_rotate_quant_ref),
		.run_host = KERN_FN(kern_indexer_rotate_quant_ref),
		.desc = "CPU reference: Hadamard + FP4 qdq of indexer q/k",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "indexer_rotate_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_indexer_rotate_cuda_generic),
#endif
		.desc = "portable CUDA Hadamard + FP4 qdq, one block per row",
	},
};

const struct kern_op kern_op_indexer_rotate = {
	.name = "indexer_rotate",
	.variants = indexer_rotate_variants,
	.n_variants = (int)(sizeof indexer_rotate_variants / sizeof indexer_rotate_variants[0]),
};

static const struct kern_variant indexer_topk_variants[] = {
	{
		.name = "indexer_topk_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_indexer_topk_ref),
		.run_host = KERN_FN(kern_indexer_topk_ref),
		.desc = "CPU reference: indexer scores + top-k over a flat batch",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "indexer_topk_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_indexer_topk_cuda_generic),
#endif
		.desc = "portable CUDA indexer scores + top-k, one block per token",
	},
};

const struct kern_op kern_op_indexer_topk = {
	.name = "indexer_topk",
	.variants = indexer_topk_variants,
	.n_variants = (int)(sizeof indexer_topk_variants / sizeof indexer_topk_variants[0]),
};

static const struct kern_variant indexer_scores_variants[] = {
	{
		.name = "indexer_scores_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_indexer_scores_ref),
		.run_host = KERN_FN(kern_indexer_scores_ref),
		.desc = "CPU reference: indexer scores alone (TP-split form)",
	},
	/* ---- generic cuda ops ---- */
	{
		.name = "indexer_scores_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_indexer_scores_cuda_generic),
#endif
		.desc = "portable CUDA indexer scores, one block per token",
	},
};

const struct kern_op kern_op_indexer_scores = {
	.name = "indexer_scores",
	.variants = indexer_scores_variants,
	.n_variants = (int)(sizeof indexer_scores_variants / sizeof indexer_scores_variants[0]),
};
