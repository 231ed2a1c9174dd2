/*
 * kernels/compressor/compressor.h: the KV compressor of the CSA and HCA
 * layers (dsv4.md §3.6, §3.7 item 1, §4.1, §8 items 7-9, 17), written as the
 * reference's incremental state machine so that any chunking of a sequence
 * (prefill in one piece, in chunks, token by token) produces bit-identical
 * compressed entries and state.
 *
 * Per token t (fp32), with the projections done by the linear op:
 *   K_t = x_t·wkvᵀ (kv_proj), Z_t = x_t·wgateᵀ (gate_proj) + ape[t mod m].
 * State per sequence: kv_state, score_state fp32 [c·m, c·d] (c = 2 for the
 * overlapping CSA compressor, 1 for HCA), initialised by
 * kern_compressor_state_init() to kv 0, score -inf.
 *   - write (K_t, Z_t) into row c_off + (t mod m), c_off = m (CSA) or 0 (HCA);
 *   - when (t+1) mod m == 0, pool entry w = (t+1)/m - 1 over its slots,
 *     CSA: rows [0,m) columns [0,d) (previous window, first halves) and rows
 *     [m,2m) columns [d,2d) (this window, second halves); HCA: rows [0,m);
 *     the pooling is a softmax over the slots, independently per channel:
 *       C_w[c] = Σ_slots softmax(Z[c]) · K[c];
 *     then (CSA) copy rows [m,2m) to rows [0,m).
 *   - post-processing of C_w, as the reference (bf16 storage in between):
 *     RMSNorm (weighted, input and output rounded to bf16), rope on the last
 *     rope_dim dims at position w·m (bf16 out), then
 *       KERN_CMP_POST_FP8_NOPE:     FP8 e4m3 qdq of dims [0, d - rope_dim), block 64
 *                                   (the main KV compressor);
 *       KERN_CMP_POST_HADAMARD_FP4: d-point Hadamard (bf16 out), FP4 qdq of all dims,
 *                                   block 32 (the indexer's private compressor);
 *       KERN_CMP_POST_NONE:         nothing more.
 *
 * Flat batch: sequence s owns tokens [q_off[s], q_off[s+1]) at positions
 * start_pos[s].., its state is slot state_slot[s] of the state pools, and
 * its entry w goes to row out_row0[s] + w of the output pool (or the paged
 * row of out_paged, rowmap.h). Tokens of one sequence must be consecutive
 * positions continuing its state. A GPU variant parallelises over (sequence,
 * channel); the state update order matters only within a sequence.
 *
 * Simulations: FP8_NOPE and HADAMARD_FP4 model the reference's QAT roundings
 * (dsv4.md §2.2); NONE gives the plain norm + rope result, for comparisons
 * with implementations that omit them (HF transformers omits the Hadamard).
 */
#ifndef DSV4_KERNELS_COMPRESSOR_COMPRESSOR_H
#define DSV4_KERNELS_COMPRESSOR_COMPRESSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/attention/rowmap.h"
#include "kernels/registry/registry.h"

enum kern_cmp_post {
	KERN_CMP_POST_FP8_NOPE = 0,
	KERN_CMP_POST_HADAMARD_FP4 = 1,
	KERN_CMP_POST_NONE = 2,
};

struct kern_compressor_args {
	const float *kv_proj;      /* [n_tokens, c·d] K_t */
	const float *gate_proj;    /* [n_tokens, c·d] x_t·wgateᵀ, without ape */
	const float *ape;          /* [m, c·d] fp32 */
	int64_t n_tokens;          /* = q_off[n_seqs]; 0 is valid */
	int n_seqs;
	const int32_t *q_off;      /* [n_seqs + 1] */
	const int32_t *start_pos;  /* [n_seqs] position of each sequence's first token here */
	float *kv_state;           /* pool [n_state_slots, c·m, c·d] */
	float *score_state;        /* pool [n_state_slots, c·m, c·d] */
	const int32_t *state_slot; /* [n_seqs] */
	int64_t n_state_slots;
	int ratio;                 /* m: 4 (CSA) or 128 (HCA; 8 on the tiny model) */
	bool overlap;              /* c = 2 (CSA, both compressors of a CSA layer) or 1 (HCA) */
	int head_dim;              /* d: 512 main, 128 indexer */
	int rope_dim;              /* 64 */
	const uint16_t *norm_w;    /* [d] bf16 compressor.norm.weight */
	float norm_eps;            /* 1e-6 */
	const float *omega;        /* [rope_dim/2] compressed-layer rope table (θ 160000 + YaRN) */
	enum kern_cmp_post post;
	float *out;                /* pool [n_out_rows, d] compressed entries */
	const int64_t *out_row0;   /* [n_seqs] pool row of each sequence's entry 0 */
	struct kern_rowmap_paged out_paged; /* optional paged layout of out/pooled (zero: out_row0) */
	int64_t n_out_rows;
	float *pooled;             /* optional pool [n_out_rows, d]: C_w before the norm (tests, debugging) */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

/* Run the state machine over the batch. ST_INVALID for bad sizes, a state
 * slot or output row out of range (checked before anything is written). */
enum status kern_compressor_ref(const struct kern_compressor_args *a) DSV4_WUR;

/* Reset one sequence's state (kv 0, score -inf); c·m·c·d floats each. */
void kern_compressor_state_init(float *kv_state, float *score_state, int ratio, bool overlap, int head_dim);

/* Entries completed by positions [start_pos, start_pos + n_tokens):
 * floor((start+n)/m) - floor(start/m); the first is w = floor(start/m). */
static inline int64_t kern_compressor_n_emitted(int64_t start_pos, int64_t n_tokens, int ratio)
{
	return (start_pos + n_tokens) / ratio - start_pos / ratio;
}

/* ---- registry ---- */

/* Signature of run / run_host of every compressor variant. */
typedef enum status (*kern_compressor_fn)(const struct kern_compressor_args *a);
/* The registry table of op "compressor" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_compressor;

#endif
