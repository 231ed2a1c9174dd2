/*
 * kernels/moe_gemm/moe_dispatch.h: the two index ops around the expert GEMM.
 *
 *   moe_dispatch  routing output (top-k expert ids per token) -> the grouped
 *                 layout moe_gemm consumes: rows sorted by local expert
 *                 (stable: by token, then by k slot), per-expert offsets,
 *                 row_src (token of each row, the w1/w3 gather) and the
 *                 slot -> row map for the combine. Experts outside this
 *                 rank's range [expert_base, expert_base + n_experts) are
 *                 skipped (expert parallelism), their slots map to -1, as do
 *                 slots with a negative id ("no expert"). This is the one
 *                 place the expert layout is built.
 *   moe_combine   out[t] (+)= Σ_j weight[t,j] · y[slot_row[t,j]], j ascending,
 *                 f32 accumulation; slots mapped to -1 contribute nothing.
 *                 (The reference applies the routing weight before w2, so the
 *                 model passes weight = NULL here; the weighted form serves
 *                 callers that scale after w2.)
 */
#ifndef DSV4_KERNELS_MOE_DISPATCH_H
#define DSV4_KERNELS_MOE_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/quant/quant.h"
#include "kernels/registry/registry.h"

/* kern_problem.shape for op moe_dispatch (may be NULL for moe_combine). */
struct kern_moe_dispatch_shape {
	int64_t n_experts;         /* local experts */
	int top_k;
	int64_t max_tokens;
};

struct kern_moe_dispatch_args {
	int64_t n_tokens;
	int top_k;
	const int32_t *topk_ids;   /* [n_tokens, top_k] global expert ids */
	int32_t expert_base;       /* first expert held here */
	int64_t n_experts;         /* experts held here */
	int32_t *expert_offsets;   /* out [n_experts + 1] */
	int32_t *row_src;          /* out [n_tokens * top_k]: token of each row (first n_rows used) */
	int32_t *row_slot;         /* out [n_tokens * top_k]: t * top_k + j of each row (optional) */
	int32_t *slot_row;         /* out [n_tokens * top_k]: row of slot (t, j), or -1 */
	int64_t *n_rows;           /* out: rows routed to this rank */
	void *stream;              /* CUDA variants */
};

struct kern_moe_combine_args {
	int64_t n_tokens;
	int top_k;
	int64_t dim;               /* row length */
	const int32_t *slot_row;   /* [n_tokens * top_k], from moe_dispatch */
	const float *slot_weight;  /* optional [n_tokens * top_k] */
	const void *y;             /* [n_rows, ldy] expert outputs */
	enum kern_dtype y_dtype;
	int64_t ldy;               /* elements; 0 = dim */
	void *out;                 /* [n_tokens, ldo] */
	enum kern_dtype out_dtype;
	int64_t ldo;               /* elements; 0 = dim */
	bool accumulate;           /* add to out (e.g. onto the shared expert's output) */
	void *stream;
};

typedef enum status (*kern_moe_dispatch_fn)(const struct kern_moe_dispatch_args *a);
typedef enum status (*kern_moe_combine_fn)(const struct kern_moe_combine_args *a);

/* CPU references. ST_INVALID for bad sizes or missing outputs. */
enum status kern_moe_dispatch_ref(const struct kern_moe_dispatch_args *a) DSV4_WUR;
enum status kern_moe_combine_ref(const struct kern_moe_combine_args *a) DSV4_WUR;

/* CUDA variants (moe_dispatch_generic.cu): every pointer is device memory,
 * n_rows included (the host never needs it: moe_gemm's CUDA variant takes
 * n_rows = n_tokens * top_k as an upper bound and reads the device offsets).
 * dispatch needs n_experts <= 1024. *_host: the same on host buffers. */
enum status kern_moe_dispatch_cuda_generic(const struct kern_moe_dispatch_args *a);
enum status kern_moe_dispatch_cuda_generic_host(const struct kern_moe_dispatch_args *a);
enum status kern_moe_combine_cuda_generic(const struct kern_moe_combine_args *a);
enum status kern_moe_combine_cuda_generic_host(const struct kern_moe_combine_args *a);

extern const struct kern_op kern_op_moe_dispatch;
extern const struct kern_op kern_op_moe_combine;

#endif
