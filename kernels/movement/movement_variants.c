/*
 * kernels/movement/movement_variants.c: the registry tables of the movement
 * ops (movement.h): copy_rows, embed, block_copy, block_fill, round_bf16,
 * add, act_quant_sim, moe_row_weight.
 *
 * Variants (priority order, highest first):
 *   <op>_cpu_ref   the CPU reference (movement_ref.c), every shape; the
 *                  oracle for GPU variants and for load-time self-checks.
 */
#include "kernels/movement/movement.h"

static const struct kern_variant copy_rows_variants[] = {
	{
		.name = "copy_rows_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_copy_rows_ref),
		.run_host = KERN_FN(kern_copy_rows_ref),
		.desc = "CPU reference: row gather / scatter / permutation (memcpy per row)",
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
};

const struct kern_op kern_op_moe_row_weight = {
	.name = "moe_row_weight",
	.variants = moe_row_weight_variants,
	.n_variants = (int)(sizeof moe_row_weight_variants / sizeof moe_row_weight_variants[0]),
};
