/*
 * kernels/rope/rope.h: rotary position embedding of DeepSeek-V4 (dsv4.md §3.4).
 *
 * - Interleaved pairs on the LAST rope_dim dims of each head: pair i is
 *   (x[h0+2i], x[h0+2i+1]) with h0 = head_dim - rope_dim, rotated as the
 *   complex number x_{2i} + j·x_{2i+1} times e^{j·t·ω_i}.
 * - inverse rotates by -t (the attention output path, §3.3 "Output path").
 * - ω comes from a frequency table built once at load by
 *   kern_rope_freqs_build(): ω_i = θ^(-2i/rope_dim), and on compressed layers
 *   YaRN interpolation ω'_i = ω_i·(1-ramp_i) + (ω_i/s)·ramp_i, with NO mscale.
 * - The angle is computed as in the reference: fp32 product (float)t·ω_i,
 *   then cos/sin of that fp32 angle.
 *
 * The op works on a flat varlen batch: every row carries its own absolute
 * position (pos[row]), so one launch covers all sequences. Rows may hold
 * several heads (q: [T, H, d]; kv: [T, 1, d]; compressed entries with
 * positions w·m).
 */
#ifndef DSV4_KERNELS_ROPE_ROPE_H
#define DSV4_KERNELS_ROPE_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

/* The YaRN numbers of config.json rope_scaling (§1.1). */
struct kern_rope_yarn {
	double factor;           /* s = 16 */
	double original_max_pos; /* L0 = original_max_position_embeddings = 65536 */
	double beta_fast;        /* 32 */
	double beta_slow;        /* 1 */
};

/* Fill omega[rope_dim/2] (radians per position) for base theta; yarn NULL
 * means plain θ (sliding-only layers). Returns ST_INVALID for an odd or
 * non-positive rope_dim, theta <= 1, or a YaRN factor <= 0. The table is
 * computed in double and stored as float (the reference builds it in fp32;
 * the two agree to within 1 ulp). */
enum status kern_rope_freqs_build(float *omega, int rope_dim, double theta,
				  const struct kern_rope_yarn *yarn) DSV4_WUR;

/* The YaRN correction range (for logs and tests): low = floor(corr(β_fast)),
 * high = ceil(corr(β_slow)), clamped to [0, rope_dim-1], with
 * corr(β) = rope_dim·ln(L0/(2πβ)) / (2 ln θ). */
void kern_rope_yarn_range(int rope_dim, double theta, const struct kern_rope_yarn *yarn, int *low, int *high);

struct kern_rope_args {
	float *x;            /* [n_rows, row_stride] rotated in place */
	const int32_t *pos;  /* [n_rows] absolute position of each row */
	const float *omega;  /* [rope_dim/2] from kern_rope_freqs_build() */
	int64_t n_rows;      /* rows (tokens or compressed entries); 0 is valid */
	int n_heads;         /* heads per row (>= 1) */
	int head_dim;        /* values per head; rope applies to the last rope_dim */
	int rope_dim;        /* even, <= head_dim */
	int64_t row_stride;  /* elements between rows; 0 means n_heads·head_dim */
	int pos_mul;         /* position multiplier: the angle uses pos[row]·pos_mul
			      * (1 normally; m for compressed entries given as w). 0 means 1 */
	bool inverse;        /* rotate by -t */
	bool bf16_out;       /* round the rotated values to bf16 */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

/* CPU reference. ST_INVALID for NULL pointers or inconsistent dims. */
enum status kern_rope_ref(const struct kern_rope_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every rope variant. */
typedef enum status (*kern_rope_fn)(const struct kern_rope_args *a);
/* The registry table of op "rope" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_rope;

#endif
