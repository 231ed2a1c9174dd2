/*
 * kernels/linear/linear_ref.c: the CPU reference of the dense linear layer,
 * the oracle every GPU linear kernel is compared with.
 *
 * Straightforward on purpose: the activations are loaded (and act-quantized
 * when asked) into an f32 copy once, then each weight row is decoded into an
 * f32 row buffer (the "per-tile decode": one row at a time, never the whole
 * matrix) and dotted with every token row, accumulating in f32.
 */
#include "kernels/linear/linear.h"

#include <stdlib.h>

enum status kern_linear_args_check(const struct kern_linear_args *a, struct err *e)
{
	if (!a->w)
		return err_set(e, ST_INVALID, "linear: no weight");
	enum status st = kern_wmat_validate(a->w, "linear weight", e);
	if (st)
		return st;
	int64_t in = a->w->cols, out = a->w->rows;
	if (a->n_tokens < 0)
		return err_set(e, ST_INVALID, "linear: n_tokens %lld < 0", (long long)a->n_tokens);
	if (a->n_tokens && (!a->x || !a->y))
		return err_set(e, ST_INVALID, "linear: x or y missing");
	if ((a->ldx && a->ldx < in) || (a->ldy && a->ldy < out))
		return err_set(e, ST_INVALID, "linear: row stride below row length");
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return err_set(e, ST_INVALID, "linear: act_quant_block %d (0 or 128)", a->act_quant_block);
	return ST_OK;
}

enum status kern_linear_ref(const struct kern_linear_args *a)
{
	enum status st = kern_linear_args_check(a, NULL);
	if (st)
		return st;
	int64_t T = a->n_tokens, in = a->w->cols, out = a->w->rows;
	int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	if (T == 0)
		return ST_OK;
	float *xf = malloc((size_t)(T * in + in) * sizeof(float));
	if (!xf)
		return ST_NOMEM;
	float *wrow = xf + T * in;
	for (int64_t t = 0; t < T; t++)
		for (int64_t k = 0; k < in; k++)
			xf[t * in + k] = kern_load_f32(a->x, a->x_dtype, t * ldx + k);
	if (a->act_quant_block)
		kern_act_quant_fp8_sim(xf, T, in, in, a->act_quant_block);
	for (int64_t o = 0; o < out; o++) {
		kern_wmat_decode_row(a->w, o, wrow);
		for (int64_t t = 0; t < T; t++) {
			const float *xr = xf + t * in;
			float acc = 0.0f;
			for (int64_t k = 0; k < in; k++)
				acc += xr[k] * wrow[k];
			kern_store_f32(a->y, a->y_dtype, t * ldy + o, acc);
		}
	}
	free(xf);
	return ST_OK;
}
