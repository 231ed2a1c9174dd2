/*
 * kernels/norm/norm_ref.c: CPU reference of RMSNorm (dsv4.md §2.3, §3.3, §3.6).
 * Straightforward fp32 loops (a plain fp32 sum of squares per row), the
 * oracle for GPU variants; rows are independent.
 */
#include "kernels/norm/norm.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

enum status kern_rmsnorm_ref(const struct kern_rmsnorm_args *a)
{
	if (!a || !a->x || !a->y || a->dim <= 0 || a->n_rows < 0 || (a->w_bf16 && a->w_f32))
		return ST_INVALID;
	int64_t xs = a->x_stride ? a->x_stride : a->dim;
	int64_t ys = a->y_stride ? a->y_stride : a->dim;
	if (xs < a->dim || ys < a->dim)
		return ST_INVALID;
	for (int64_t r = 0; r < a->n_rows; r++) {
		const float *x = a->x + r * xs;
		float *y = a->y + r * ys;
		float ss = 0.0f;
		for (int i = 0; i < a->dim; i++) {
			float v = a->bf16_in ? kern__bf16_round(x[i]) : x[i];
			ss += v * v;
		}
		float rs;
		if (a->bf16_stats) {
			float ms = kern__bf16_round(kern__bf16_round(ss / (float)a->dim) + a->eps);
			rs = kern__bf16_round(1.0f / sqrtf(ms));
		} else {
			rs = 1.0f / sqrtf(ss / (float)a->dim + a->eps);
		}
		for (int i = 0; i < a->dim; i++) {
			float v = a->bf16_in ? kern__bf16_round(x[i]) : x[i];
			float w = a->w_bf16 ? kern__bf16_to_f32(a->w_bf16[i]) : (a->w_f32 ? a->w_f32[i] : 1.0f);
			float o = v * rs * w;
			y[i] = a->bf16_out ? kern__bf16_round(o) : o;
		}
	}
	return ST_OK;
}
