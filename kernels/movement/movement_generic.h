/*
 * kernels/movement/movement_generic.h: the portable CUDA movement ops
 * (movement_generic.cu), cc >= 8.0, same contracts as the references in
 * movement.h. kern_<op>_cuda_generic takes device pointers and queues its
 * work on a->stream; kern_<op>_cuda_generic_host takes host buffers (copy
 * in, run on the default stream, synchronize, copy out) for tests and
 * self-checks. Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_MOVEMENT_GENERIC_H
#define DSV4_KERNELS_MOVEMENT_GENERIC_H

#include "kernels/movement/movement.h"

enum status kern_copy_rows_cuda_generic(const struct kern_copy_rows_args *a);
enum status kern_copy_rows_cuda_generic_host(const struct kern_copy_rows_args *a);
enum status kern_embed_cuda_generic(const struct kern_embed_args *a);
enum status kern_embed_cuda_generic_host(const struct kern_embed_args *a);
enum status kern_block_copy_cuda_generic(const struct kern_block_copy_args *a);
enum status kern_block_copy_cuda_generic_host(const struct kern_block_copy_args *a);
enum status kern_block_fill_cuda_generic(const struct kern_block_fill_args *a);
enum status kern_block_fill_cuda_generic_host(const struct kern_block_fill_args *a);
enum status kern_round_bf16_cuda_generic(const struct kern_round_bf16_args *a);
enum status kern_round_bf16_cuda_generic_host(const struct kern_round_bf16_args *a);
enum status kern_add_cuda_generic(const struct kern_add_args *a);
enum status kern_add_cuda_generic_host(const struct kern_add_args *a);
enum status kern_act_quant_sim_cuda_generic(const struct kern_act_quant_sim_args *a);
enum status kern_act_quant_sim_cuda_generic_host(const struct kern_act_quant_sim_args *a);
enum status kern_moe_row_weight_cuda_generic(const struct kern_moe_row_weight_args *a);
enum status kern_moe_row_weight_cuda_generic_host(const struct kern_moe_row_weight_args *a);

#endif
