/*
 * kernels/act/act.h: the expert activation of DeepSeek-V4 (dsv4.md §3.9,
 * "Experts"): SwiGLU with the swiglu_limit clamps, optionally scaled by the
 * row's routing weight before w2, and plain silu.
 *
 *   g = min(g, limit);  u = clamp(u, -limit, limit);  a = silu(g)·u;  a *= w_row
 *
 * The clamp applies to routed and shared experts alike (§8 item 12). Rows are
 * independent, so the op runs unchanged over the (token, expert) pair rows of
 * the grouped expert GEMM (kernels/moe_gemm/moe_dispatch.h).
 * gate and up may be two tensors or the halves of one fused [rows, 2·I] output
 * (gate = p, up = p + I, both with stride 2·I).
 */
#ifndef DSV4_KERNELS_ACT_ACT_H
#define DSV4_KERNELS_ACT_ACT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

struct kern_swiglu_args {
	const float *gate;        /* [n_rows, gate_stride] w1 output */
	const float *up;          /* [n_rows, up_stride] w3 output */
	float *out;               /* [n_rows, out_stride]; may equal gate (in place) */
	const float *row_weight;  /* [n_rows] routing weight per row, or NULL (= 1) */
	int64_t n_rows;           /* rows; 0 is valid */
	int dim;                  /* I, values per row */
	int64_t gate_stride;      /* elements between rows; 0 means dim */
	int64_t up_stride;        /* 0 means dim */
	int64_t out_stride;       /* 0 means dim */
	float limit;              /* swiglu_limit (10); <= 0 disables both clamps */
	bool bf16_out;            /* round the result to bf16 values */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

/* CPU reference. ST_INVALID for NULL pointers, dim <= 0, short strides. */
enum status kern_swiglu_ref(const struct kern_swiglu_args *a) DSV4_WUR;

/* silu(x) = x / (1 + e^-x), in place over n values. */
void kern_silu_ref(float *x, int64_t n);

/* ---- registry ---- */

/* Signature of run / run_host of every swiglu variant. */
typedef enum status (*kern_swiglu_fn)(const struct kern_swiglu_args *a);
/* The registry table of op "swiglu" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_swiglu;

#endif
