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
#include "kernels/indexer/indexer_generic.h"

static const struct kern_variant indexer_rotate_variants[] = {
	KERN_ROW_CPU_REF("indexer_rotate_cpu_ref", kern_indexer_rotate_quant_ref,
	                 .desc = "CPU reference: Hadamard + FP4 qdq of indexer q/k"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("indexer_rotate_cuda_generic", 10, kern_indexer_rotate_cuda_generic, NULL,
	              .desc = "portable CUDA Hadamard + FP4 qdq, one block per row"),
};

const struct kern_op kern_op_indexer_rotate = {
	.name = "indexer_rotate",
	.variants = indexer_rotate_variants,
	.n_variants = (int)(sizeof indexer_rotate_variants / sizeof indexer_rotate_variants[0]),
};

static const struct kern_variant indexer_topk_variants[] = {
	KERN_ROW_CPU_REF("indexer_topk_cpu_ref", kern_indexer_topk_ref,
	                 .desc = "CPU reference: indexer scores + top-k over a flat batch"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("indexer_topk_cuda_generic", 10, kern_indexer_topk_cuda_generic, NULL,
	              .desc = "portable CUDA indexer scores + top-k, one block per token"),
};

const struct kern_op kern_op_indexer_topk = {
	.name = "indexer_topk",
	.variants = indexer_topk_variants,
	.n_variants = (int)(sizeof indexer_topk_variants / sizeof indexer_topk_variants[0]),
};

static const struct kern_variant indexer_scores_variants[] = {
	KERN_ROW_CPU_REF("indexer_scores_cpu_ref", kern_indexer_scores_ref,
	                 .desc = "CPU reference: indexer scores alone (TP-split form)"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("indexer_scores_cuda_generic", 10, kern_indexer_scores_cuda_generic, NULL,
	              .desc = "portable CUDA indexer scores, one block per token"),
};

const struct kern_op kern_op_indexer_scores = {
	.name = "indexer_scores",
	.variants = indexer_scores_variants,
	.n_variants = (int)(sizeof indexer_scores_variants / sizeof indexer_scores_variants[0]),
};
