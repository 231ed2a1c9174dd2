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
#include "kernels/attention/attention_generic.h"
#include "kernels/attention/attn_decode.h"

static const struct kern_variant sparse_attn_variants[] = {
	KERN_ROW_CPU_REF("sparse_attn_cpu_ref", kern_sparse_attn_ref,
	                 .desc = "CPU reference: sparse MQA attention with sink and inverse rope"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("sparse_attn_cuda_generic", 10, kern_sparse_attn_cuda_generic, NULL,
	              .desc = "portable CUDA sparse MQA: block per (token, head), online softmax per warp"),
	/* ---- decode cuda ops ---- */
	KERN_ROW_SM80("sparse_attn_cuda_decode", 20, kern_sparse_attn_cuda_decode, NULL,
	              .desc = "portable CUDA decode sparse MQA (T <= 64): 32 heads per CTA, rows split over CTAs + combine; larger steps run the generic kernel"),
};

const struct kern_op kern_op_sparse_attn = {
	.name = "sparse_attn",
	.variants = sparse_attn_variants,
	.n_variants = (int)(sizeof sparse_attn_variants / sizeof sparse_attn_variants[0]),
};

static const struct kern_variant attn_index_variants[] = {
	KERN_ROW_CPU_REF("attn_index_cpu_ref", kern_attn_index_ref,
	                 .desc = "CPU reference: SWA/CSA/HCA index sets for a flat batch"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("attn_index_cuda_generic", 10, kern_attn_index_cuda_generic, NULL,
	              .desc = "portable CUDA SWA/CSA/HCA index sets, one block per token"),
};

const struct kern_op kern_op_attn_index = {
	.name = "attn_index",
	.variants = attn_index_variants,
	.n_variants = (int)(sizeof attn_index_variants / sizeof attn_index_variants[0]),
};

static const struct kern_variant ring_write_variants[] = {
	KERN_ROW_CPU_REF("ring_write_cpu_ref", kern_ring_write_ref,
	                 .desc = "CPU reference: store a step's raw KV into the sliding-window rings"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("ring_write_cuda_generic", 10, kern_ring_write_cuda_generic, NULL,
	              .desc = "portable CUDA ring store of a step's raw KV, one block per token"),
};

const struct kern_op kern_op_ring_write = {
	.name = "ring_write",
	.variants = ring_write_variants,
	.n_variants = (int)(sizeof ring_write_variants / sizeof ring_write_variants[0]),
};
