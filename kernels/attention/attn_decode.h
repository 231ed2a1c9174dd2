/*
 * kernels/attention/attn_decode.h: the portable decode variant of op
 * sparse_attn (attn_decode.cu), cc >= 8.0, same args contract as
 * kern_sparse_attn_ref (attention.h) on device buffers, run on a->stream.
 * Steps of up to KERN_ATTN_DECODE_MAX_TOKENS tokens with head_dim a multiple
 * of 128 (<= 512), 16-byte aligned q, out and kv rows take the decode path;
 * anything else is passed on to kern_sparse_attn_cuda_generic, so the row
 * accepts every shape. Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_ATTENTION_ATTN_DECODE_H
#define DSV4_KERNELS_ATTENTION_ATTN_DECODE_H

#include "kernels/attention/attention.h"

#define KERN_ATTN_DECODE_MAX_TOKENS 64

enum status kern_sparse_attn_cuda_decode(const struct kern_sparse_attn_args *a);

#endif
