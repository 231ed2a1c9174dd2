/*
 * kernels/rope/rope_ref.c: CPU reference of the interleaved rope and the
 * frequency table with YaRN interpolation (dsv4.md §3.4).
 */
#include "kernels/rope/rope.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

void kern_rope_yarn_range(int rope_dim, double theta, const struct kern_rope_yarn *y, int *low, int *high)
{
	const double pi = 3.14159265358979323846;
	double cf = rope_dim * log(y->original_max_pos / (2 * pi * y->beta_fast)) / (2 * log(theta));
	double cs = rope_dim * log(y->original_max_pos / (2 * pi * y->beta_slow)) / (2 * log(theta));
	double lo = floor(cf), hi = ceil(cs);
	if (lo < 0)
		lo = 0;
	if (hi > rope_dim - 1)
		hi = rope_dim - 1;
	*low = (int)lo;
	*high = (int)hi;
}

enum status kern_rope_freqs_build(float *omega, int rope_dim, double theta, const struct kern_rope_yarn *yarn)
{
	if (!omega || rope_dim <= 0 || rope_dim % 2 || !(theta > 1.0) || (yarn && !(yarn->factor > 0)))
		return ST_INVALID;
	int low = 0, high = 0;
	if (yarn)
		kern_rope_yarn_range(rope_dim, theta, yarn, &low, &high);
	/* The reference nudges a degenerate range so the ramp stays finite. */
	double span = high == low ? 0.001 : (double)(high - low);
	for (int i = 0; i < rope_dim / 2; i++) {
		double w = pow(theta, -2.0 * i / rope_dim);
		if (yarn) {
			double ramp = (i - low) / span;
			ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
			w = w * (1 - ramp) + (w / yarn->factor) * ramp;
		}
		omega[i] = (float)w;
	}
	return ST_OK;
}

enum status kern_rope_ref(const struct kern_rope_args *a)
{
	if (!a || (a->n_rows > 0 && (!a->x || !a->pos || !a->omega)) || a->n_rows < 0 || a->n_heads < 1 ||
	    a->rope_dim <= 0 || a->rope_dim % 2 || a->rope_dim > a->head_dim)
		return ST_INVALID;
	int64_t rs = a->row_stride ? a->row_stride : (int64_t)a->n_heads * a->head_dim;
	if (rs < (int64_t)a->n_heads * a->head_dim)
		return ST_INVALID;
	int mul = a->pos_mul ? a->pos_mul : 1;
	int half = a->rope_dim / 2;
	for (int64_t r = 0; r < a->n_rows; r++) {
		float t = (float)((int64_t)a->pos[r] * mul);
		for (int i = 0; i < half; i++) {
			float ang = t * a->omega[i]; /* fp32, as torch.outer(t, freqs) */
			float c = (float)cos((double)ang), s = (float)sin((double)ang);
			if (a->inverse)
				s = -s;
			for (int h = 0; h < a->n_heads; h++) {
				float *p = a->x + r * rs + (int64_t)h * a->head_dim + (a->head_dim - a->rope_dim) + 2 * i;
				float re = p[0], im = p[1];
				float o0 = re * c - im * s, o1 = re * s + im * c;
				p[0] = a->bf16_out ? kern__bf16_round(o0) : o0;
				p[1] = a->bf16_out ? kern__bf16_round(o1) : o1;
			}
		}
	}
	return ST_OK;
}
