/*
 * kernels/movement/movement_variants.c: the registry tables of the movement
 * ops (movement.h): copy_rows, embed, block_copy, block_fill, round_bf16,
 * add, act_quant_sim, moe_row_weight.
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (movement_ref.c), every shape; the
 *                  oracle for GPU variants and for load-time self-checks.
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (movement_generic.cu), priority
 *                  10: the portable CUDA version, bit-identical to the
 *                  reference, so selection never fails on a GPU.
 */
#include "kernels/movement/movement.h"

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/movement/movement_generic.h"
#endif

static const struct kern_variant copy_rows_variants[] = {
	{
		.name = "copy_rows_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_copy_rows_ref),
		.run_host = KERN_FN(kern_copy_rows_ref),
		.desc = "CPU reference: row gather / scatter / permutation (memcpy per row)",
	},
	{
		.name = "copy_rows_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_copy_rows_cuda_generic),
		.run_host = KERN_FN(kern_copy_rows_cuda_generic_host),
#endif
		.desc = "portable CUDA row gather / scatter: one CTA per row, 16-byte copies when aligned",
	},
};

const struct kern_op kern_op_copy_rows = {
	.name = "copy_rows",
	.variants = copy_rows_variants,
	.n_variants = (int)(sizeof copy_rows_variants / sizeof copy_rows_variants[0]),
};

static const struct kern_variant embed_variants[] = {
	{
		.name = "embed_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_embed_ref),
		.run_host = KERN_FN(kern_embed_ref),
		.desc = "CPU reference: bf16 embedding rows widened to f32, n_copies each, vocab-parallel",
	},
	{
		.name = "embed_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_embed_cuda_generic),
		.run_host = KERN_FN(kern_embed_cuda_generic_host),
#endif
		.desc = "portable CUDA embedding lookup: one CTA per token, bf16 widened by a shift",
	},
};

const struct kern_op kern_op_embed = {
	.name = "embed",
	.variants = embed_variants,
	.n_variants = (int)(sizeof embed_variants / sizeof embed_variants[0]),
};

static const struct kern_variant block_copy_variants[] = {
	{
		.name = "block_copy_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_block_copy_ref),
		.run_host = KERN_FN(kern_block_copy_ref),
		.desc = "CPU reference: copy a region of pool blocks to other blocks",
	},
	{
		.name = "block_copy_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_block_copy_cuda_generic),
		.run_host = KERN_FN(kern_block_copy_cuda_generic_host),
#endif
		.desc = "portable CUDA pool region copy: CTAs over (pair, chunk), 16-byte copies when aligned",
	},
};

const struct kern_op kern_op_block_copy = {
	.name = "block_copy",
	.variants = block_copy_variants,
	.n_variants = (int)(sizeof block_copy_variants / sizeof block_copy_variants[0]),
};

static const struct kern_variant block_fill_variants[] = {
	{
		.name = "block_fill_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_block_fill_ref),
		.run_host = KERN_FN(kern_block_fill_ref),
		.desc = "CPU reference: fill a region of pool blocks with a value",
	},
	{
		.name = "block_fill_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_block_fill_cuda_generic),
		.run_host = KERN_FN(kern_block_fill_cuda_generic_host),
#endif
		.desc = "portable CUDA pool region fill: CTAs over (block, chunk)",
	},
};

const struct kern_op kern_op_block_fill = {
	.name = "block_fill",
	.variants = block_fill_variants,
	.n_variants = (int)(sizeof block_fill_variants / sizeof block_fill_variants[0]),
};

static const struct kern_variant round_bf16_variants[] = {
	{
		.name = "round_bf16_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_round_bf16_ref),
		.run_host = KERN_FN(kern_round_bf16_ref),
		.desc = "CPU reference: round f32 values to bf16 values in place (RNE)",
	},
	{
		.name = "round_bf16_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_round_bf16_cuda_generic),
		.run_host = KERN_FN(kern_round_bf16_cuda_generic_host),
#endif
		.desc = "portable CUDA bf16 rounding (integer RNE), one thread per element",
	},
};

const struct kern_op kern_op_round_bf16 = {
	.name = "round_bf16",
	.variants = round_bf16_variants,
	.n_variants = (int)(sizeof round_bf16_variants / sizeof round_bf16_variants[0]),
};

static const struct kern_variant add_variants[] = {
	{
		.name = "add_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_add_ref),
		.run_host = KERN_FN(kern_add_ref),
		.desc = "CPU reference: y += x, fp32",
	},
	{
		.name = "add_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_add_cuda_generic),
		.run_host = KERN_FN(kern_add_cuda_generic_host),
#endif
		.desc = "portable CUDA y += x, one thread per element",
	},
};

const struct kern_op kern_op_add = {
	.name = "add",
	.variants = add_variants,
	.n_variants = (int)(sizeof add_variants / sizeof add_variants[0]),
};

static const struct kern_variant act_quant_sim_variants[] = {
	{
		.name = "act_quant_sim_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_act_quant_sim_ref),
		.run_host = KERN_FN(kern_act_quant_sim_ref),
		.desc = "CPU reference: FP8 / FP4 activation quantize-dequantize in place",
	},
	{
		.name = "act_quant_sim_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_act_quant_sim_cuda_generic),
		.run_host = KERN_FN(kern_act_quant_sim_cuda_generic_host),
#endif
		.desc = "portable CUDA FP8 / FP4 act quant simulation, one warp per block, bit-exact",
	},
};

const struct kern_op kern_op_act_quant_sim = {
	.name = "act_quant_sim",
	.variants = act_quant_sim_variants,
	.n_variants = (int)(sizeof act_quant_sim_variants / sizeof act_quant_sim_variants[0]),
};

static const struct kern_variant moe_row_weight_variants[] = {
	{
		.name = "moe_row_weight_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_moe_row_weight_ref),
		.run_host = KERN_FN(kern_moe_row_weight_ref),
		.desc = "CPU reference: routing weight of each grouped expert row",
	},
	{
		.name = "moe_row_weight_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_moe_row_weight_cuda_generic),
		.run_host = KERN_FN(kern_moe_row_weight_cuda_generic_host),
#endif
		.desc = "portable CUDA expert-row weights, row count read on the device",
	},
};

const struct kern_op kern_op_moe_row_weight = {
	.name = "moe_row_weight",
	.variants = moe_row_weight_variants,
	.n_variants = (int)(sizeof moe_row_weight_variants / sizeof moe_row_weight_variants[0]),
};
