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
#include "kernels/movement/movement_generic.h"

static const struct kern_variant copy_rows_variants[] = {
	KERN_ROW_CPU_REF("copy_rows_cpu_ref", kern_copy_rows_ref,
	                 .desc = "CPU reference: row gather / scatter / permutation (memcpy per row)"),
	KERN_ROW_SM80("copy_rows_cuda_generic", 10, kern_copy_rows_cuda_generic, kern_copy_rows_cuda_generic_host,
	              .desc = "portable CUDA row gather / scatter: one CTA per row, 16-byte copies when aligned"),
};

const struct kern_op kern_op_copy_rows = {
	.name = "copy_rows",
	.variants = copy_rows_variants,
	.n_variants = (int)(sizeof copy_rows_variants / sizeof copy_rows_variants[0]),
};

static const struct kern_variant embed_variants[] = {
	KERN_ROW_CPU_REF("embed_cpu_ref", kern_embed_ref,
	                 .desc = "CPU reference: bf16 embedding rows widened to f32, n_copies each, vocab-parallel"),
	KERN_ROW_SM80("embed_cuda_generic", 10, kern_embed_cuda_generic, kern_embed_cuda_generic_host,
	              .desc = "portable CUDA embedding lookup: one CTA per token, bf16 widened by a shift"),
};

const struct kern_op kern_op_embed = {
	.name = "embed",
	.variants = embed_variants,
	.n_variants = (int)(sizeof embed_variants / sizeof embed_variants[0]),
};

static const struct kern_variant block_copy_variants[] = {
	KERN_ROW_CPU_REF("block_copy_cpu_ref", kern_block_copy_ref,
	                 .desc = "CPU reference: copy a region of pool blocks to other blocks"),
	KERN_ROW_SM80("block_copy_cuda_generic", 10, kern_block_copy_cuda_generic, kern_block_copy_cuda_generic_host,
	              .desc = "portable CUDA pool region copy: CTAs over (pair, chunk), 16-byte copies when aligned"),
};

const struct kern_op kern_op_block_copy = {
	.name = "block_copy",
	.variants = block_copy_variants,
	.n_variants = (int)(sizeof block_copy_variants / sizeof block_copy_variants[0]),
};

static const struct kern_variant block_fill_variants[] = {
	KERN_ROW_CPU_REF("block_fill_cpu_ref", kern_block_fill_ref,
	                 .desc = "CPU reference: fill a region of pool blocks with a value"),
	KERN_ROW_SM80("block_fill_cuda_generic", 10, kern_block_fill_cuda_generic, kern_block_fill_cuda_generic_host,
	              .desc = "portable CUDA pool region fill: CTAs over (block, chunk)"),
};

const struct kern_op kern_op_block_fill = {
	.name = "block_fill",
	.variants = block_fill_variants,
	.n_variants = (int)(sizeof block_fill_variants / sizeof block_fill_variants[0]),
};

static const struct kern_variant round_bf16_variants[] = {
	KERN_ROW_CPU_REF("round_bf16_cpu_ref", kern_round_bf16_ref,
	                 .desc = "CPU reference: round f32 values to bf16 values in place (RNE)"),
	KERN_ROW_SM80("round_bf16_cuda_generic", 10, kern_round_bf16_cuda_generic, kern_round_bf16_cuda_generic_host,
	              .desc = "portable CUDA bf16 rounding (integer RNE), one thread per element"),
};

const struct kern_op kern_op_round_bf16 = {
	.name = "round_bf16",
	.variants = round_bf16_variants,
	.n_variants = (int)(sizeof round_bf16_variants / sizeof round_bf16_variants[0]),
};

static const struct kern_variant add_variants[] = {
	KERN_ROW_CPU_REF("add_cpu_ref", kern_add_ref, .desc = "CPU reference: y += x, fp32"),
	KERN_ROW_SM80("add_cuda_generic", 10, kern_add_cuda_generic, kern_add_cuda_generic_host,
	              .desc = "portable CUDA y += x, one thread per element"),
};

const struct kern_op kern_op_add = {
	.name = "add",
	.variants = add_variants,
	.n_variants = (int)(sizeof add_variants / sizeof add_variants[0]),
};

static const struct kern_variant act_quant_sim_variants[] = {
	KERN_ROW_CPU_REF("act_quant_sim_cpu_ref", kern_act_quant_sim_ref,
	                 .desc = "CPU reference: FP8 / FP4 activation quantize-dequantize in place"),
	KERN_ROW_SM80("act_quant_sim_cuda_generic", 10, kern_act_quant_sim_cuda_generic,
	              kern_act_quant_sim_cuda_generic_host,
	              .desc = "portable CUDA FP8 / FP4 act quant simulation, one warp per block, bit-exact"),
};

const struct kern_op kern_op_act_quant_sim = {
	.name = "act_quant_sim",
	.variants = act_quant_sim_variants,
	.n_variants = (int)(sizeof act_quant_sim_variants / sizeof act_quant_sim_variants[0]),
};

static const struct kern_variant moe_row_weight_variants[] = {
	KERN_ROW_CPU_REF("moe_row_weight_cpu_ref", kern_moe_row_weight_ref,
	                 .desc = "CPU reference: routing weight of each grouped expert row"),
	KERN_ROW_SM80("moe_row_weight_cuda_generic", 10, kern_moe_row_weight_cuda_generic,
	              kern_moe_row_weight_cuda_generic_host,
	              .desc = "portable CUDA expert-row weights, row count read on the device"),
};

const struct kern_op kern_op_moe_row_weight = {
	.name = "moe_row_weight",
	.variants = moe_row_weight_variants,
	.n_variants = (int)(sizeof moe_row_weight_variants / sizeof moe_row_weight_variants[0]),
};
