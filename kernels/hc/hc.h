/*
 * kernels/hc/hc.h: manifold-constrained hyper-connections (mHC) of
 * DeepSeek-V4 (dsv4.md §3.2, §3.10, §8 item 5), split in three ops so that a
 * GPU variant can replace each one on its own:
 *
 *   1. kern_hc_prenorm_ref: mix = v·fnᵀ and sqr_sum = Σ v² per token, where v is
 *      the token's n·D stream values flattened stream-major. This is exactly
 *      the contract of DeepGEMM's tf32_hc_prenorm_gemm, the call that broke
 *      GB10 when made unguarded (design.md; kernels.md §4.1), so it is its own
 *      op with its own registry chain.
 *   2. kern_hc_split_ref: per token, ρ = rsqrt(sqr_sum/(n·D) + norm_eps),
 *      m = ρ·mix, then
 *        pre_j  = sigmoid(scale[0]·m_j + base_j) + hc_eps
 *        post_j = 2·sigmoid(scale[1]·m_{n+j} + base_{n+j})
 *        P[j][k] = softmax_k(scale[2]·m_{2n+n·j+k} + base_{2n+n·j+k}) + hc_eps
 *      and col-norm-first Sinkhorn: P /= (col sums + hc_eps), then
 *      (iters-1) × {P /= (row sums + hc_eps); P /= (col sums + hc_eps)}.
 *      In head mode (HCHead, §3.10) mix has n columns and only pre is made,
 *      pre_j = sigmoid(scale[0]·m_j + base_j) + hc_eps; no post, no Sinkhorn.
 *   3. kern_hc_pre_combine_ref: u = Σ_j pre_j·X_j (the sublayer input), and
 *      kern_hc_post_ref: X'_k = post_k·f + Σ_j comb[j][k]·X_j (comb consumed
 *      transposed: the sum runs over the FIRST index).
 *
 * All math is fp32; bf16_out rounds the stored result to bf16 values as the
 * reference does (streams and u are bf16 between sublayers, §2.3). Every op
 * is per token over a flat batch.
 */
#ifndef DSV4_KERNELS_HC_HC_H
#define DSV4_KERNELS_HC_HC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

#define KERN_HC_MAX_STREAMS 8 /* n = hc_mult = 4; the bound sizes stack scratch */

struct kern_hc_prenorm_args {
	const float *x;    /* [n_tokens, k] flattened streams (bf16 values in fp32) */
	const float *fn;   /* [n_out, k] fp32 (hc_*_fn) */
	float *mix;        /* out [n_tokens, n_out] = x·fnᵀ, not yet normalised */
	float *sqr_sum;    /* out [n_tokens] Σ_k x² */
	int64_t n_tokens;  /* 0 is valid */
	int k;             /* n·D = 16384 */
	int n_out;         /* (2+n)·n = 24, or n = 4 for HCHead */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_hc_prenorm_ref(const struct kern_hc_prenorm_args *a) DSV4_WUR;

struct kern_hc_split_args {
	const float *mix;     /* [n_tokens, n_out] from the prenorm op */
	const float *sqr_sum; /* [n_tokens] */
	int64_t n_tokens;
	int n_streams;        /* n = 4 (<= KERN_HC_MAX_STREAMS) */
	int k;                /* n·D: the RMS mean divides by it */
	float norm_eps;       /* rms_norm_eps = 1e-6 */
	const float *scale;   /* [3] (hc_*_scale), or [1] in head mode */
	const float *base;    /* [(2+n)·n] (hc_*_base), or [n] in head mode */
	int sinkhorn_iters;   /* hc_sinkhorn_iters = 20 (>= 1) */
	float hc_eps;         /* hc_eps = 1e-6 */
	bool head;            /* HCHead: mix is [T, n], only pre is written */
	float *pre;           /* out [n_tokens, n] */
	float *post;          /* out [n_tokens, n]; unused in head mode */
	float *comb;          /* out [n_tokens, n, n] row-major comb[j][k]; unused in head mode */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_hc_split_ref(const struct kern_hc_split_args *a) DSV4_WUR;

struct kern_hc_pre_combine_args {
	const float *x;    /* [n_tokens, n, D] streams */
	const float *pre;  /* [n_tokens, n] */
	float *u;          /* out [n_tokens, D] */
	int64_t n_tokens;
	int n_streams;
	int dim;           /* D */
	bool bf16_out;     /* round u to bf16 (the reference casts before the norm) */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_hc_pre_combine_ref(const struct kern_hc_pre_combine_args *a) DSV4_WUR;

struct kern_hc_post_args {
	const float *f;    /* [n_tokens, D] sublayer output */
	const float *x;    /* [n_tokens, n, D] streams before the sublayer */
	const float *post; /* [n_tokens, n] */
	const float *comb; /* [n_tokens, n, n] */
	float *x_out;      /* out [n_tokens, n, D]; must not overlap x */
	int64_t n_tokens;
	int n_streams;
	int dim;
	bool bf16_out;     /* round the new streams to bf16 (reference: type_as(x)) */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_hc_post_ref(const struct kern_hc_post_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every hc_prenorm variant. */
typedef enum status (*kern_hc_prenorm_fn)(const struct kern_hc_prenorm_args *a);
/* The registry table of op "hc_prenorm" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_hc_prenorm;

/* Signature of run / run_host of every hc_split variant. */
typedef enum status (*kern_hc_split_fn)(const struct kern_hc_split_args *a);
/* The registry table of op "hc_split" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_hc_split;

/* Signature of run / run_host of every hc_pre_combine variant. */
typedef enum status (*kern_hc_pre_combine_fn)(const struct kern_hc_pre_combine_args *a);
/* The registry table of op "hc_pre_combine" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_hc_pre_combine;

/* Signature of run / run_host of every hc_post variant. */
typedef enum status (*kern_hc_post_fn)(const struct kern_hc_post_args *a);
/* The registry table of op "hc_post" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_hc_post;

#endif
