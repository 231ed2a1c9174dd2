/*
 * kernels/movement/movement.h: the data movements of the forward pass as
 * registry ops, so the same forward code runs on host or device buffers
 * (issue 12): row gather / scatter / permutation, the embedding lookup, KV
 * pool block copies and fills, bf16 rounding, a residual add, the simulated
 * activation quantization, and the expert-row routing weights.
 *
 * Every op takes one args struct ending in `void *stream`. For CUDA variants
 * all pointers are device memory and the work is queued on a->stream
 * (cudaStream_t); the CPU references read and write host memory and ignore
 * the stream. run_host of a CUDA variant takes host pointers (copies in and
 * out) for tests and self-checks. Each reference returns ST_INVALID for NULL
 * pointers it would dereference and for negative or inconsistent sizes; a
 * count of 0 is valid and touches nothing.
 *
 * kern_<op>_check() is that size and pointer check alone, shared by every
 * variant. It does not read index lists or counts: a CUDA variant cannot
 * (they are in device memory), so the reference checks those itself and the
 * CUDA variants skip what the reference would refuse (negative block ids,
 * see each op) instead of faulting.
 */
#ifndef DSV4_KERNELS_MOVEMENT_MOVEMENT_H
#define DSV4_KERNELS_MOVEMENT_MOVEMENT_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

/* ---- copy_rows: gather, scatter and permutation of rows ---- */

/* For i < n_rows: d = dst_idx ? dst_idx[i] : i, s = src_idx ? src_idx[i] : i;
 * rows with d < 0 or s < 0 are skipped; otherwise
 * dst[d*dst_stride + 0..dim) = src[s*src_stride + 0..dim).
 * Strides are in elements; 0 means dim (a stride below dim is invalid).
 * dst and src must not alias the same rows (no row written is read by the
 * call), and no two copies write the same dst row: variants copy rows in any
 * order and in parallel. */
struct kern_copy_rows_args {
	float *dst;
	int64_t dst_stride;
	const int32_t *dst_idx;   /* [n_rows] or NULL (identity) */
	const float *src;
	int64_t src_stride;
	const int32_t *src_idx;   /* [n_rows] or NULL (identity) */
	int64_t n_rows;
	int64_t dim;              /* values per row, >= 1 */
	void *stream;
};
enum status kern_copy_rows_ref(const struct kern_copy_rows_args *a) DSV4_WUR;
enum status kern_copy_rows_check(const struct kern_copy_rows_args *a) DSV4_WUR;
typedef enum status (*kern_copy_rows_fn)(const struct kern_copy_rows_args *a);
extern const struct kern_op kern_op_copy_rows;

/* ---- embed: the token embedding lookup (vocab-parallel under TP) ---- */

/* out[t, c, :] = f32(table[ids[t] - vocab_begin, :]) for c < n_copies (the
 * hc_mult copies of the residual stream); ids outside
 * [vocab_begin, vocab_begin + vocab_rows) give zero rows, so the ranks of a
 * vocab-parallel table sum to the full lookup. */
struct kern_embed_args {
	const uint16_t *table;    /* bf16 [vocab_rows, dim] */
	int64_t vocab_begin, vocab_rows;
	const int32_t *ids;       /* [n_tokens] */
	int64_t n_tokens;
	int64_t dim;              /* >= 1 */
	int n_copies;             /* >= 1 */
	float *out;               /* [n_tokens, n_copies, dim] */
	void *stream;
};
enum status kern_embed_ref(const struct kern_embed_args *a) DSV4_WUR;
enum status kern_embed_check(const struct kern_embed_args *a) DSV4_WUR;
typedef enum status (*kern_embed_fn)(const struct kern_embed_args *a);
extern const struct kern_op kern_op_embed;

/* ---- block_copy / block_fill: regions of a pool (KV cache blocks) ---- */

/* For i < n: copy pool[src_ids[i]*region_stride + region_offset, + region_len)
 * to pool[dst_ids[i]*region_stride + region_offset, + region_len). The dst
 * ids of one call are distinct and no dst id equals any src id of the call
 * (copy-on-write forks), so the pairs run in any order. Ids must be >= 0
 * (the reference refuses a negative one, CUDA variants skip its pair);
 * region_offset + region_len <= region_stride. */
struct kern_block_copy_args {
	float *pool;
	int64_t region_stride;    /* elements between regions */
	int64_t region_len;       /* elements copied */
	int64_t region_offset;    /* elements from region start */
	const int32_t *dst_ids, *src_ids; /* [n] */
	int64_t n;
	void *stream;
};
enum status kern_block_copy_ref(const struct kern_block_copy_args *a) DSV4_WUR;
enum status kern_block_copy_check(const struct kern_block_copy_args *a) DSV4_WUR;
typedef enum status (*kern_block_copy_fn)(const struct kern_block_copy_args *a);
extern const struct kern_op kern_op_block_copy;

/* For i < n: pool[ids[i]*region_stride + region_offset, + region_len) = value.
 * Ids must be >= 0 (reference: ST_INVALID; CUDA variants skip a negative
 * one); repeats are harmless. */
struct kern_block_fill_args {
	float *pool;
	int64_t region_stride, region_len, region_offset;
	const int32_t *ids;       /* [n] */
	int64_t n;
	float value;
	void *stream;
};
enum status kern_block_fill_ref(const struct kern_block_fill_args *a) DSV4_WUR;
enum status kern_block_fill_check(const struct kern_block_fill_args *a) DSV4_WUR;
typedef enum status (*kern_block_fill_fn)(const struct kern_block_fill_args *a);
extern const struct kern_op kern_op_block_fill;

/* ---- round_bf16: x = the bf16 value of x, in place ---- */

/* Exactly kern_bf16_to_f32(kern_f32_to_bf16(x)) (kernels/quant/quant.h):
 * round to nearest even, NaN stays NaN, overflow becomes inf. */
struct kern_round_bf16_args {
	float *x;
	int64_t n;
	void *stream;
};
enum status kern_round_bf16_ref(const struct kern_round_bf16_args *a) DSV4_WUR;
enum status kern_round_bf16_check(const struct kern_round_bf16_args *a) DSV4_WUR;
typedef enum status (*kern_round_bf16_fn)(const struct kern_round_bf16_args *a);
extern const struct kern_op kern_op_round_bf16;

/* ---- add: y += x (the residual add), fp32 ---- */

/* y and x may be the same buffer (y = 2y) but must not partly overlap. */
struct kern_add_args {
	float *y;
	const float *x;
	int64_t n;
	void *stream;
};
enum status kern_add_ref(const struct kern_add_args *a) DSV4_WUR;
enum status kern_add_check(const struct kern_add_args *a) DSV4_WUR;
typedef enum status (*kern_add_fn)(const struct kern_add_args *a);
extern const struct kern_op kern_op_add;

/* ---- act_quant_sim: simulated FP8 / FP4 activation quantization ---- */

/* In place over x [n_rows, n_cols] (row stride ld >= n_cols): fp4 == 0 is
 * exactly kern_act_quant_fp8_sim(x, n_rows, n_cols, ld, block), fp4 == 1
 * kern_act_quant_fp4_sim (kernels/quant/quant.h). Every variant is
 * bit-identical to those. block >= 1; elements between n_cols and ld are not
 * touched. */
struct kern_act_quant_sim_args {
	float *x;
	int64_t n_rows, n_cols, ld;
	int block;
	int fp4;                  /* 0: FP8 e4m3, 1: FP4 e2m1 */
	void *stream;
};
enum status kern_act_quant_sim_ref(const struct kern_act_quant_sim_args *a) DSV4_WUR;
enum status kern_act_quant_sim_check(const struct kern_act_quant_sim_args *a) DSV4_WUR;
typedef enum status (*kern_act_quant_sim_fn)(const struct kern_act_quant_sim_args *a);
extern const struct kern_op kern_op_act_quant_sim;

/* ---- moe_row_weight: the routing weight of each grouped expert row ---- */

/* row_weight[r] = slot_weight[row_slot[r]] for r < *n_rows; rows >= *n_rows
 * are left untouched. n_rows points at ONE int64 in the same memory as the
 * data (device memory for CUDA variants: the grouping writes the row count on
 * the device and the host never waits for it). The reference refuses
 * *n_rows outside [0, max_rows]; CUDA variants clamp it to that range.
 * row_slot entries index slot_weight ([n_tokens*top_k]) and are trusted for
 * r < *n_rows. */
struct kern_moe_row_weight_args {
	const float *slot_weight;  /* [n_tokens*top_k] */
	const int32_t *row_slot;   /* [max_rows] */
	const int64_t *n_rows;     /* one value: rows that exist */
	int64_t max_rows;
	float *row_weight;         /* [max_rows] */
	void *stream;
};
enum status kern_moe_row_weight_ref(const struct kern_moe_row_weight_args *a) DSV4_WUR;
enum status kern_moe_row_weight_check(const struct kern_moe_row_weight_args *a) DSV4_WUR;
typedef enum status (*kern_moe_row_weight_fn)(const struct kern_moe_row_weight_args *a);
extern const struct kern_op kern_op_moe_row_weight;

#endif
