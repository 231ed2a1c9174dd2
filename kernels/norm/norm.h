/*
 * kernels/norm/norm.h: RMSNorm, the one normalisation of DeepSeek-V4
 * (dsv4.md §2.3, §3.1, §3.3 step 3, §3.6 step 1, §3.11 step 1).
 *
 * One op covers every use, because all of them are "rows of `dim` values,
 * each scaled by rsqrt(mean(x²)+eps), optionally times a weight":
 *   - attn_norm / ffn_norm / q_norm / kv_norm / final norm: rows = tokens,
 *     weighted (bf16 weight [dim]);
 *   - the per-head query norm (§3.3 step 3): rows = tokens·heads, dim = head_dim,
 *     unweighted (both weight pointers NULL);
 *   - the MTP per-stream hnorm (§3.11): rows = tokens·streams, dim = hidden;
 *   - the compressor norm (§3.6): rows = compressed entries, input cast to
 *     bf16 first (bf16_in).
 * Math is fp32: y = w ⊙ x·rsqrt(mean(x²)+eps); bf16_out rounds y to bf16
 * values (the reference casts every norm output to bf16).
 *
 * A GPU variant implements the same contract: one block (or warp) per row,
 * rows of a flat varlen batch are independent, nothing per sequence.
 */
#ifndef DSV4_KERNELS_NORM_NORM_H
#define DSV4_KERNELS_NORM_NORM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

struct kern_rmsnorm_args {
	const float *x;         /* [n_rows, x_stride] input rows (fp32 values) */
	float *y;               /* [n_rows, y_stride] output; may equal x (in place) */
	const uint16_t *w_bf16; /* [dim] bf16 weight, or NULL */
	const float *w_f32;     /* [dim] fp32 weight, or NULL; both NULL = unweighted */
	int64_t n_rows;         /* rows; 0 is valid and does nothing */
	int dim;                /* values per row normalised together (> 0) */
	int64_t x_stride;       /* elements between rows of x; 0 means dim */
	int64_t y_stride;       /* elements between rows of y; 0 means dim */
	float eps;              /* added to mean(x²); rms_norm_eps = 1e-6 */
	bool bf16_in;           /* round x to bf16 before normalising */
	bool bf16_out;          /* round y to bf16 values */
	bool bf16_stats;        /* the reference's per-head q norm runs in bf16 tensors
				 * (q * rsqrt(q.square().mean() + eps), §3.3 step 3): round
				 * mean(x²), mean+eps and the rsqrt to bf16 before scaling */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

/* CPU reference. Returns ST_INVALID (and writes nothing) for a NULL pointer,
 * dim <= 0, n_rows < 0, a stride smaller than dim, or both weights given. */
enum status kern_rmsnorm_ref(const struct kern_rmsnorm_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every rmsnorm variant. */
typedef enum status (*kern_rmsnorm_fn)(const struct kern_rmsnorm_args *a);
/* The registry table of op "rmsnorm" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_rmsnorm;

#endif
