/*
 * kernels/moe_gemm/moe_gemm_ref.c: the CPU reference of the grouped expert
 * GEMM. Per expert, each weight row is decoded once into an f32 buffer
 * (MXFP4/NVFP4/FP8 read in their stored form, no dequantized model copy)
 * and dotted with every row routed to that expert. Only the rows below
 * offsets[n_experts] exist; n_rows is an upper bound (moe_gemm.h).
 */
#include "kernels/moe_gemm/moe_gemm.h"

#include <stdlib.h>

enum status kern_moe_gemm_args_check(const struct kern_moe_gemm_args *a, struct err *e)
{
	if (a->n_experts <= 0 || !a->w || !a->expert_offsets)
		return err_set(e, ST_INVALID, "moe_gemm: no experts, weights or offsets");
	if (a->n_rows < 0 || a->n_rows > INT32_MAX)
		return err_set(e, ST_INVALID, "moe_gemm: n_rows %lld", (long long)a->n_rows);
	for (int64_t x = 0; x < a->n_experts; x++) {
		const struct kern_wmat *w = &a->w[x];
		enum status st = kern_wmat_validate(w, "moe_gemm expert weight", e);
		if (st)
			return err_prefix(e, "expert %lld", (long long)x);
		if (w->fmt != a->w[0].fmt || w->rows != a->w[0].rows || w->cols != a->w[0].cols)
			return err_set(e, ST_INVALID, "moe_gemm: expert %lld is %s [%lld, %lld], expert 0 %s [%lld, %lld]",
				       (long long)x, kern_wfmt_name(w->fmt), (long long)w->rows, (long long)w->cols,
				       kern_wfmt_name(a->w[0].fmt), (long long)a->w[0].rows, (long long)a->w[0].cols);
	}
	const int32_t *off = a->expert_offsets;
	if (off[0] != 0 || off[a->n_experts] > a->n_rows)
		return err_set(e, ST_INVALID, "moe_gemm: offsets run %d..%d, rows at most %lld", off[0],
			       off[a->n_experts], (long long)a->n_rows);
	for (int64_t x = 0; x < a->n_experts; x++)
		if (off[x + 1] < off[x])
			return err_set(e, ST_INVALID, "moe_gemm: offsets decrease at expert %lld", (long long)x);
	int64_t in = a->w[0].cols, out = a->w[0].rows;
	if (a->n_rows && (!a->x || !a->y))
		return err_set(e, ST_INVALID, "moe_gemm: x or y missing");
	if ((a->ldx && a->ldx < in) || (a->ldy && a->ldy < out))
		return err_set(e, ST_INVALID, "moe_gemm: row stride below row length");
	const int64_t used = off[a->n_experts]; /* rows past it are neither read nor written */
	if (a->n_rows && a->n_x_rows < 1)
		return err_set(e, ST_INVALID, "moe_gemm: %lld rows but x has none", (long long)a->n_rows);
	if (a->row_src) {
		for (int64_t r = 0; r < used; r++)
			if (a->row_src[r] < 0 || a->row_src[r] >= a->n_x_rows)
				return err_set(e, ST_INVALID, "moe_gemm: row %lld reads x row %d of %lld", (long long)r,
					       a->row_src[r], (long long)a->n_x_rows);
	} else if (a->n_x_rows < used) {
		return err_set(e, ST_INVALID, "moe_gemm: %lld rows but x has %lld", (long long)used,
			       (long long)a->n_x_rows);
	}
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return err_set(e, ST_INVALID, "moe_gemm: act_quant_block %d (0 or 128)", a->act_quant_block);
	return ST_OK;
}

enum status kern_moe_gemm_ref(const struct kern_moe_gemm_args *a)
{
	enum status st = kern_moe_gemm_args_check(a, NULL);
	if (st)
		return st;
	int64_t R = a->expert_offsets[a->n_experts], in = a->w[0].cols, out = a->w[0].rows;
	int64_t ldx = a->ldx ? a->ldx : in, ldy = a->ldy ? a->ldy : out;
	if (R == 0)
		return ST_OK;
	float *xf = malloc((size_t)(R * in + in) * sizeof(float));
	if (!xf)
		return ST_NOMEM;
	float *wrow = xf + R * in;
	for (int64_t r = 0; r < R; r++) {
		int64_t src = a->row_src ? a->row_src[r] : r;
		for (int64_t k = 0; k < in; k++)
			xf[r * in + k] = kern_load_f32(a->x, a->x_dtype, src * ldx + k);
	}
	if (a->act_quant_block)
		kern_act_quant_fp8_sim(xf, R, in, in, a->act_quant_block);
	for (int64_t x = 0; x < a->n_experts; x++) {
		int64_t r0 = a->expert_offsets[x], r1 = a->expert_offsets[x + 1];
		if (r0 == r1)
			continue;
		for (int64_t o = 0; o < out; o++) {
			kern_wmat_decode_row(&a->w[x], o, wrow);
			for (int64_t r = r0; r < r1; r++) {
				const float *xr = xf + r * in;
				float acc = 0.0f;
				for (int64_t k = 0; k < in; k++)
					acc += xr[k] * wrow[k];
				kern_store_f32(a->y, a->y_dtype, r * ldy + o, acc);
			}
		}
	}
	free(xf);
	return ST_OK;
}
