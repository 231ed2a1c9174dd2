/*
 * kernels/indexer/indexer.h: the lightning indexer of the CSA layers
 * (dsv4.md §2.2 item 3, §3.7).
 *
 *   - kern_hadamard_ref: the n-point Walsh-Hadamard transform (Sylvester
 *     order, the fast_hadamard_transform convention) scaled by n^-0.5, so it
 *     is orthonormal; n = index_head_dim = 128 (32 on the tiny model).
 *   - kern_indexer_rotate_quant_ref: Hadamard then the FP4 (e2m1) quant->
 *     dequant simulation with ue8m0 block-32 scales, applied to the indexer
 *     queries (after their rope) and to the indexer keys (after the private
 *     compressor's norm and rope; kernels/compressor does that inline).
 *   - kern_indexer_topk_ref: scores I(t,w) = weight_scale·Σ_h ω_{t,h}·ReLU(q_{t,h}·k_w)
 *     over the visible entries w < floor((t+1)/ratio) of the token's own
 *     sequence, and the top min(top_k, #visible) entry ids in decreasing
 *     score (ties: lower w first), -1 after them.
 *
 * The top-k op works on a flat batch: per-sequence query offsets, start
 * positions and the row of each sequence's key entry 0 in a key pool; the
 * output is in entry ids w, which kern_attn_index_ref maps to rows.
 */
#ifndef DSV4_KERNELS_INDEXER_INDEXER_H
#define DSV4_KERNELS_INDEXER_INDEXER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/attention/rowmap.h"
#include "kernels/registry/registry.h"

/* In place over n_rows rows of n values (n a power of two). ST_INVALID otherwise. */
enum status kern_hadamard_ref(float *x, int64_t n_rows, int n) DSV4_WUR;

/* In place: Hadamard over each row of dim values, then FP4 qdq with
 * fp4_block-value ue8m0 blocks (32; 0 skips the quantisation). */
struct kern_indexer_rotate_args {
	float *x;                  /* [n_rows, dim] in place */
	int64_t n_rows;
	int dim;                   /* power of two: index_head_dim = 128 */
	int fp4_block;             /* 32, or 0: Hadamard only */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_indexer_rotate_quant_ref(const struct kern_indexer_rotate_args *a) DSV4_WUR;

struct kern_indexer_topk_args {
	const float *q;           /* [n_tokens, n_heads, head_dim] prepared queries */
	const float *head_w;      /* [n_tokens, n_heads] ω before weight_scale (x·weights_projᵀ) */
	float weight_scale;       /* head_dim^-0.5 · n_heads^-0.5 */
	bool bf16_scores;         /* emulate the reference's bf16 tensors: ω = bf16(head_w·weight_scale),
				   * each q·k rounded to bf16, each ReLU·ω product rounded, the head
				   * sum rounded (default: fp32 throughout, weight_scale applied last) */
	const float *keys;        /* [n_key_rows, head_dim] prepared indexer keys (pool) */
	int64_t n_key_rows;
	int64_t n_tokens;         /* = q_off[n_seqs] */
	int n_seqs;
	const int32_t *q_off;     /* [n_seqs + 1] */
	const int32_t *start_pos; /* [n_seqs] position of each sequence's first token */
	const int64_t *key_row0;  /* [n_seqs] pool row of each sequence's entry 0 */
	struct kern_rowmap_paged key_paged; /* optional paged layout of the key rows (zero: key_row0) */
	int ratio;                /* 4 */
	int n_heads;              /* index_n_heads = 64 */
	int head_dim;             /* index_head_dim = 128 */
	int top_k;                /* index_topk = 512 */
	int32_t *topk;            /* out [n_tokens, top_k] entry ids, -1 padded */
	float *scores;            /* out [n_tokens, top_k] their scores (-inf padded), or NULL */
	int32_t *topk_len;        /* out [n_tokens] min(top_k, #visible), or NULL */
	float *work;              /* optional scratch [work_len] floats: with work_len >= #visible,
				   * each score is computed once instead of once per output slot */
	int64_t work_len;
	/* Split form (tensor parallelism with the indexer heads split across ranks:
	 * the reference all-reduces the per-rank head sums before the top-k):
	 * kern_indexer_scores_ref writes score_out, the caller sums it across
	 * ranks, and kern_indexer_topk_ref selects from scores_in instead of
	 * computing (q, head_w and keys are then not read). */
	float *score_out;         /* [n_tokens, score_stride] I(t, w), -inf for w >= #visible */
	const float *scores_in;   /* [n_tokens, score_stride] or NULL (compute) */
	int64_t score_stride;     /* >= the largest #visible of the batch */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

/* CPU reference. ST_INVALID for bad sizes or a visible entry whose row is
 * outside the pool. Results are identical with and without work, and with
 * scores_in holding what kern_indexer_scores_ref wrote. */
enum status kern_indexer_topk_ref(const struct kern_indexer_topk_args *a) DSV4_WUR;

/* The scores alone into score_out (the weight_scale applied). ST_INVALID when
 * score_out is NULL or score_stride is below a token's #visible. */
enum status kern_indexer_scores_ref(const struct kern_indexer_topk_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every indexer_rotate variant. */
typedef enum status (*kern_indexer_rotate_fn)(const struct kern_indexer_rotate_args *a);
/* The registry table of op "indexer_rotate" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_indexer_rotate;

/* Signature of run / run_host of every indexer_topk variant. */
typedef enum status (*kern_indexer_topk_fn)(const struct kern_indexer_topk_args *a);
/* The registry table of op "indexer_topk" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_indexer_topk;

/* The registry table of op "indexer_scores" (run type kern_indexer_topk_fn). */
extern const struct kern_op kern_op_indexer_scores;

#endif
