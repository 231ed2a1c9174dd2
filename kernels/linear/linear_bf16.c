/*
 * kernels/linear/linear_bf16.c: the guards of the bf16-weight linears
 * linear_cuda_gemv_bf16 and linear_mma_bf16w (linear_bf16.h), in pure C so
 * that selection (and `dsv4 kernels --simulate-cc`) runs without CUDA. Each
 * guard refuses with the reason the kernel's own argument check would give,
 * so a plan never holds a variant whose run() answers ST_INVALID.
 */
#include "kernels/linear/linear_bf16.h"

#include <stdint.h>
#include <stdio.h>

/* What both take: a shape, act_quant_block 0 (the bf16 weights' plans: the
 * reference quantizes activations only before FP8 GEMMs), f32 or bf16 x and
 * y, in a multiple of `align` columns, in and out <= 2^24. */
static bool bf16_shape_ok(const struct kern_problem *p, int align, char *why, size_t n)
{
	const struct kern_linear_shape *s = p->shape;
	if (!s) {
		snprintf(why, n, "no shape given");
		return false;
	}
	if (s->in <= 0 || s->out <= 0) {
		snprintf(why, n, "empty weight [%lld, %lld]", (long long)s->out, (long long)s->in);
		return false;
	}
	if (s->act_quant_block != 0) {
		snprintf(why, n, "act_quant_block %d (bf16 weights take unquantized activations)", s->act_quant_block);
		return false;
	}
	if ((s->x_dtype != KERN_DT_F32 && s->x_dtype != KERN_DT_BF16) ||
	    (s->y_dtype != KERN_DT_F32 && s->y_dtype != KERN_DT_BF16)) {
		snprintf(why, n, "x or y dtype not f32 / bf16");
		return false;
	}
	if (s->in % align) {
		snprintf(why, n, "in %lld not a multiple of %d", (long long)s->in, align);
		return false;
	}
	if (s->in > (1 << 24) || s->out > (1 << 24)) {
		snprintf(why, n, "dimension above 2^24");
		return false;
	}
	return true;
}

/* GEMV: in % 8 (16-byte weight loads of whole rows), in <= 16384 (one
 * token's row staged in 64 KiB of shared memory), decode plans (max_tokens
 * <= 63: from one 64-row tile on the tensor-core variant takes the plan). */
bool kern_linear_gemv_bf16_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				    size_t why_bytes)
{
	(void)dev;
	if (!bf16_shape_ok(p, 8, why, why_bytes))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->in > KERN_LINEAR_GEMV_BF16_MAX_IN) {
		snprintf(why, why_bytes, "in %lld above %d (activations staged in shared memory)", (long long)s->in,
			 KERN_LINEAR_GEMV_BF16_MAX_IN);
		return false;
	}
	if (s->max_tokens > KERN_LINEAR_GEMV_BF16_MAX_TOKENS) {
		snprintf(why, why_bytes, "max_tokens %lld above the GEMV's %d (a tensor-core tile plan)",
			 (long long)s->max_tokens, KERN_LINEAR_GEMV_BF16_MAX_TOKENS);
		return false;
	}
	return true;
}

/* MMA: in % 32 (whole K tiles, 16-byte aligned weight rows), prefill plans
 * (max_tokens >= 64: below one row tile the GEMV is the better choice; the
 * kernel is correct for any n_tokens), a 1-D grid of at most 2^31 - 1
 * blocks of 64 rows x 128 outputs. */
bool kern_linear_mma_bf16w_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				    size_t why_bytes)
{
	(void)dev;
	if (!bf16_shape_ok(p, 32, why, why_bytes))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->max_tokens < 64) {
		snprintf(why, why_bytes, "max_tokens %lld below one 64-token tile (decode plan)", (long long)s->max_tokens);
		return false;
	}
	if ((s->max_tokens + 63) / 64 * ((s->out + 127) / 128) > 0x7FFFFFFF) {
		snprintf(why, why_bytes, "max_tokens %lld x out %lld: more than 2^31 - 1 tiles", (long long)s->max_tokens,
			 (long long)s->out);
		return false;
	}
	return true;
}

enum status kern_linear_bf16__check(const struct kern_linear_args *a, int64_t align, int64_t max_in, int64_t *ldx,
				    int64_t *ldy)
{
	if (!a->w || a->w->fmt != KERN_WFMT_BF16 || !a->w->data || a->act_quant_block != 0)
		return ST_INVALID;
	const int64_t in = a->w->cols, out = a->w->rows;
	if (in <= 0 || in % align || in > max_in || out <= 0 || a->n_tokens < 0 || (uintptr_t)a->w->data % 16)
		return ST_INVALID;
	if ((a->x_dtype != KERN_DT_F32 && a->x_dtype != KERN_DT_BF16) ||
	    (a->y_dtype != KERN_DT_F32 && a->y_dtype != KERN_DT_BF16))
		return ST_INVALID;
	*ldx = a->ldx ? a->ldx : in;
	*ldy = a->ldy ? a->ldy : out;
	if (*ldx < in || *ldy < out || (a->n_tokens > 0 && (!a->x || !a->y)))
		return ST_INVALID;
	return ST_OK;
}
