/*
 * kernels/fill/fill_random.h: op fill_random, deterministic random tensor
 * contents in a stored format (--load-format dummy, model/dummy.h), so a
 * device loader generates each weight where it lives (no host buffer).
 *
 * Element i depends only on (seed, i): h = mix(seed ^ mix(i)) with mix the
 * splitmix64 finalizer, u = (h >> 40) * 2^-24 in [0, 1). Kinds:
 *   UNIFORM_F32 / UNIFORM_BF16: lo + (hi - lo) * u (no FMA; bf16 by RNE);
 *   E4M3: byte sign(h >> 63, 0 when positive) | exponent field
 *         e_lo + ((h >> 8) % (e_hi - e_lo + 1)) | mantissa h & 7 (e_hi <= 14: never NaN);
 *   E8M0: byte e_lo + ((h >> 8) % (e_hi - e_lo + 1));
 *   BYTES: byte h >> 56 (packed e2m1 pairs: every code is finite);
 *   INDEX_I64 / INDEX_I32: row r = i / cols, col c = i % cols:
 *         (mix(seed ^ r) + c) % n_index (distinct in a row when cols <= n_index).
 * Variants are bit-identical to the reference.
 */
#ifndef DSV4_KERNELS_FILL_FILL_RANDOM_H
#define DSV4_KERNELS_FILL_FILL_RANDOM_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

enum kern_fill_kind {
	KERN_FILL_UNIFORM_F32 = 0,
	KERN_FILL_UNIFORM_BF16,
	KERN_FILL_E4M3,
	KERN_FILL_E8M0,
	KERN_FILL_BYTES,
	KERN_FILL_INDEX_I64,
	KERN_FILL_INDEX_I32,
	KERN_FILL_KIND_COUNT
};

struct kern_fill_random_args {
	void *dst;            /* n elements of the kind's size (4, 2, 1, 1, 1, 8, 4 bytes) */
	int64_t n;
	enum kern_fill_kind kind;
	uint64_t seed;
	float lo, hi;         /* UNIFORM_* */
	int e_lo, e_hi;       /* E4M3 exponent fields (0..14), E8M0 bytes (0..254); e_lo <= e_hi */
	int positive;         /* E4M3: sign 0 */
	int64_t cols, n_index; /* INDEX_*: >= 1 */
	void *stream;
};

/* Bytes per element of kind k (0 for an invalid kind). */
int kern_fill_elem_bytes(enum kern_fill_kind k);

enum status kern_fill_random_ref(const struct kern_fill_random_args *a) DSV4_WUR;
enum status kern_fill_random_check(const struct kern_fill_random_args *a) DSV4_WUR;
typedef enum status (*kern_fill_random_fn)(const struct kern_fill_random_args *a);
extern const struct kern_op kern_op_fill_random;


#endif
