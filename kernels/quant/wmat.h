/*
 * kernels/quant/wmat.h: how a weight matrix is stored, in the formats the
 * checkpoints carry and the layouts prepare() converts them into.
 *
 * A struct kern_wmat is a view (it owns nothing unless `owned` is set by a
 * prepare step): a logical [rows = out, cols = in] matrix, row-major, plus its
 * block scales. Kernels read these formats directly; nobody dequantizes the
 * model into a second copy.
 *
 *   format            data                         scale                                  extra
 *   F32               float [rows, cols]           -                                      -
 *   BF16              uint16 [rows, cols]          -                                      -
 *   FP8_E8M0_B128     e4m3 [rows, cols]            e8m0 [ceil(rows/128), ceil(cols/128)]  -
 *   FP8_F32_B128      e4m3 [rows, cols]            f32  [ceil(rows/128), ceil(cols/128)]  -
 *   MXFP4             e2m1x2 [rows, cols/2]        e8m0 [rows, cols/32]                   cols % 32 == 0
 *   NVFP4             e2m1x2 [rows, cols/2]        e4m3 [rows, cols/16]                   f32 global_scale
 *   FP8_F32_R128      e4m3 [rows, cols]            f32  [ceil(cols/128), rows]            prepared only
 *
 * FP8_F32_R128 is not a checkpoint format: linear_cublaslt_sm90's prepare()
 * replicates each 128x128 block scale over its 128 rows (exact) and stores
 * the per-row 1x128 scales transposed, s[c/128][r], which is the layout
 * cuBLASLt's VEC128_32F mode reads for its A operand (linear_cublaslt.h).
 * It cannot be sliced or concatenated (shard and fuse before prepare).
 * e2m1x2: two elements per byte, low nibble = even column. Scale tensors are
 * dense row-major. Decoded value:
 *   FP8_*   w = e4m3(q) * s[r/128][c/128]          (FP8_F32_R128: s[c/128][r])
 *   MXFP4   w = e2m1(q) * e8m0(s[r][c/32])
 *   NVFP4   w = e2m1(q) * (e4m3(s[r][c/16]) * global)   (block x global formed first, in f32)
 */
#ifndef DSV4_KERNELS_WMAT_H
#define DSV4_KERNELS_WMAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

enum kern_wfmt {
	KERN_WFMT_NONE = 0,       /* op has no weights */
	KERN_WFMT_F32 = 1,
	KERN_WFMT_BF16 = 2,
	KERN_WFMT_FP8_E8M0_B128 = 3, /* the official checkpoint's FP8 linears */
	KERN_WFMT_FP8_F32_B128 = 4,  /* the same after E8M0 -> f32 widening (or fp32-scale checkpoints) */
	KERN_WFMT_MXFP4 = 5,         /* official routed experts */
	KERN_WFMT_NVFP4 = 6,         /* ModelOpt NVFP4 experts */
	KERN_WFMT_FP8_F32_R128 = 7,  /* prepared: per-row 1x128 f32 scales, transposed (cuBLASLt VEC128) */
	KERN_WFMT_COUNT
};

/* Bit for a mask of formats (variant declarations: formats accepted). */
#define KERN_WFMT_BIT(f) (1u << (unsigned)(f))
/* The masks variant tables share: the checkpoint FP8 formats, the FP4 expert
 * formats, and every checkpoint format (the references read them all). */
#define KERN_WFMT_MASK_FP8 (KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128) | KERN_WFMT_BIT(KERN_WFMT_FP8_F32_B128))
#define KERN_WFMT_MASK_FP4 (KERN_WFMT_BIT(KERN_WFMT_MXFP4) | KERN_WFMT_BIT(KERN_WFMT_NVFP4))
#define KERN_WFMT_MASK_CHECKPOINT \
	(KERN_WFMT_BIT(KERN_WFMT_F32) | KERN_WFMT_BIT(KERN_WFMT_BF16) | KERN_WFMT_MASK_FP8 | KERN_WFMT_MASK_FP4)

struct kern_wmat {
	enum kern_wfmt fmt;
	int64_t rows, cols;  /* logical [out, in] */
	const void *data;    /* see the table above */
	const void *scale;   /* block scales, NULL for F32/BF16 */
	float global_scale;  /* NVFP4 only (weight_scale_2); 1 otherwise */
	void *owned;         /* buffer this view owns (from a prepare step), or NULL */
};

/* "fp8_e8m0_b128", ... (static). */
const char *kern_wfmt_name(enum kern_wfmt f);

/* Block geometry: rows/cols covered by one scale (0 for unscaled formats). */
int kern_wfmt_block_rows(enum kern_wfmt f);
int kern_wfmt_block_cols(enum kern_wfmt f);

/* Bytes of the data and scale arrays of m. */
size_t kern_wmat_data_bytes(const struct kern_wmat *m);
size_t kern_wmat_scale_bytes(const struct kern_wmat *m);

/* Check that m's shape fits its format (cols % 32 for MXFP4, ...) and that its
 * pointers are set. what names the tensor in the error. */
enum status kern_wmat_validate(const struct kern_wmat *m, const char *what, struct err *e) DSV4_WUR;

/* Decode row r of m into out[cols] as f32, scales applied (exact for E8M0
 * scales; one f32 multiply otherwise). The per-tile decode of the CPU refs. */
void kern_wmat_decode_row(const struct kern_wmat *m, int64_t r, float *out);

/* Widen an FP8_E8M0_B128 matrix to FP8_F32_B128: the data is shared (not
 * copied), the scales are converted bit-exactly into a new buffer owned by
 * out (release with kern_wmat_release). Other formats: ST_INVALID. */
enum status kern_wmat_widen_e8m0(const struct kern_wmat *in, struct kern_wmat *out, struct err *e) DSV4_WUR;

/* Rows [r0, r1) and columns [c0, c1) of m, for tensor-parallel shards.
 * Boundaries must fall on scale blocks (128 for FP8 rows and columns, 32/16
 * columns for MXFP4/NVFP4, 2 columns for packing) except at the matrix's
 * end. A full-width row range is a view into m (no copy, out owns nothing);
 * a column range is copied into a buffer owned by out. */
enum status kern_wmat_slice(const struct kern_wmat *m, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
			    struct kern_wmat *out, struct err *e) DSV4_WUR;

/* Rows of a then rows of b, into one matrix owned by out (fused gate/up:
 * w1 and w3 of an expert as one [2*inter, hidden] GEMM). Same format and
 * cols; for FP8 a->rows must be a multiple of 128; NVFP4 needs equal global
 * scales (otherwise ST_INVALID: fold them into the block scales first). */
enum status kern_wmat_concat_rows(const struct kern_wmat *a, const struct kern_wmat *b, struct kern_wmat *out,
				  struct err *e) DSV4_WUR;

/* A random matrix of format fmt (codes spread over the whole valid range,
 * no NaN codes; scales in a moderate power-of-two or positive range), data
 * and scales in one buffer owned by m. *rng is a splitmix64 state. For tests
 * and self-checks. */
enum status kern_wmat_make_random(struct kern_wmat *m, enum kern_wfmt fmt, int64_t rows, int64_t cols,
				  uint64_t *rng, struct err *e) DSV4_WUR;

/* splitmix64: next 64 random bits / a float uniform in [-1, 1). */
uint64_t kern_rand_u64(uint64_t *state);
float kern_rand_f32(uint64_t *state);

/* Free what m owns and clear it. NULL-safe. */
void kern_wmat_release(struct kern_wmat *m);

#endif
