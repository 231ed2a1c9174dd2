/*
 * kernels/act/act_ref.c: CPU reference of the clamped SwiGLU and silu
 * (dsv4.md §3.9). fp32 throughout, like the reference's .float() path.
 */
#include "kernels/act/act.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

static inline float silu(float g)
{
	return g / (1.0f + expf(-g));
}

void kern_silu_ref(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = silu(x[i]);
}

enum status kern_swiglu_ref(const struct kern_swiglu_args *a)
{
	if (!a || a->dim <= 0 || a->n_rows < 0 || (a->n_rows > 0 && (!a->gate || !a->up || !a->out)))
		return ST_INVALID;
	int64_t gs = a->gate_stride ? a->gate_stride : a->dim;
	int64_t us = a->up_stride ? a->up_stride : a->dim;
	int64_t os = a->out_stride ? a->out_stride : a->dim;
	if (gs < a->dim || us < a->dim || os < a->dim)
		return ST_INVALID;
	float lim = a->limit;
	for (int64_t r = 0; r < a->n_rows; r++) {
		float w = a->row_weight ? a->row_weight[r] : 1.0f;
		for (int i = 0; i < a->dim; i++) {
			float g = a->gate[r * gs + i], u = a->up[r * us + i];
			if (lim > 0) {
				g = fminf(g, lim);
				u = fminf(fmaxf(u, -lim), lim);
			}
			float o = silu(g) * u;
			if (a->row_weight)
				o = w * o;
			a->out[r * os + i] = a->bf16_out ? kern__bf16_round(o) : o;
		}
	}
	return ST_OK;
}
