/*
 * kernels/indexer/indexer_generic.h: the portable CUDA lightning-indexer ops
 * (indexer_generic.cu), cc >= 8.0, same args contracts as the CPU references
 * in indexer.h on device buffers, run on a->stream:
 *   indexer_rotate_cuda_generic (Hadamard + FP4 qdq),
 *   indexer_scores_cuda_generic, indexer_topk_cuda_generic.
 * work / work_len of kern_indexer_topk_args: the CUDA top-k caches each
 * token's scores in dynamic shared memory sized max(8192, work_len) floats
 * (work_len >= #visible by the contract) up to the device's opt-in limit
 * (about 56K entries on an H200: 224K tokens of context at ratio 4); past
 * that, in work seen as [n_tokens, work_len / n_tokens] rows when #visible
 * fits a row, else it recomputes the scores in every selection round (same
 * result, much slower).
 * Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_INDEXER_INDEXER_GENERIC_H
#define DSV4_KERNELS_INDEXER_INDEXER_GENERIC_H

#include "kernels/indexer/indexer.h"

enum status kern_indexer_rotate_cuda_generic(const struct kern_indexer_rotate_args *a);
enum status kern_indexer_scores_cuda_generic(const struct kern_indexer_topk_args *a);
enum status kern_indexer_topk_cuda_generic(const struct kern_indexer_topk_args *a);

#endif
