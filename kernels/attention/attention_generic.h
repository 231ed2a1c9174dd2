/*
 * kernels/attention/attention_generic.h: the portable CUDA attention ops
 * (attention_generic.cu), cc >= 8.0, same args contracts as the CPU
 * references in attention.h on device buffers, run on a->stream:
 *   sparse_attn_cuda_generic, attn_index_cuda_generic, ring_write_cuda_generic.
 * Checks that need device data (index ranges, q_off consistency, a set that
 * overflows idx_stride) cannot return ST_INVALID from the device; see
 * attention_generic.cu for what each kernel does with such input instead
 * (it never reads or writes out of bounds). Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_ATTENTION_ATTENTION_GENERIC_H
#define DSV4_KERNELS_ATTENTION_ATTENTION_GENERIC_H

#include "kernels/attention/attention.h"

enum status kern_sparse_attn_cuda_generic(const struct kern_sparse_attn_args *a);
enum status kern_attn_index_cuda_generic(const struct kern_attn_index_args *a);
enum status kern_ring_write_cuda_generic(const struct kern_ring_write_args *a);

#endif
