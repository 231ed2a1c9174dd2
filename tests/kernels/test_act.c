/*
 * tests/kernels/test_act.c: clamped SwiGLU (dsv4.md §3.9) against a double
 * computation: both clamps, the routing weight before w2, fused gate/up
 * layout, in place, no clamp, and silu.
 */
#include "kernels/act/act.h"
#include "kernels/norm/lowp_sim.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static double oracle(double g, double u, double lim, double w)
{
	if (lim > 0) {
		g = g > lim ? lim : g;
		u = u > lim ? lim : (u < -lim ? -lim : u);
	}
	return w * (g / (1 + exp(-g))) * u;
}

static void run_case(int64_t rows, int dim, bool fused, bool weighted, float lim, bool inplace)
{
	size_t n = (size_t)(rows * dim);
	float *gu = xcalloc(2 * n + 1, sizeof *gu), *out = xcalloc(n + 1, sizeof *out);
	float *rw = xcalloc((size_t)rows + 1, sizeof *rw);
	double *ref = xcalloc(n + 1, sizeof *ref);
	mt_fill(gu, 2 * n, -25, 25); /* well past the limit on both sides */
	mt_fill(rw, (size_t)rows, 0, 1.5f);
	const float *g = gu, *u = fused ? gu + dim : gu + n;
	int64_t st = fused ? 2 * dim : dim;
	for (int64_t r = 0; r < rows; r++)
		for (int i = 0; i < dim; i++)
			ref[r * dim + i] = oracle(g[r * st + i], u[r * st + i], lim, weighted ? rw[r] : 1.0);
	fill_nan(out, n);
	struct kern_swiglu_args a = {.gate = g, .up = u, .out = inplace ? gu : out, .row_weight = weighted ? rw : NULL,
				     .n_rows = rows, .dim = dim, .gate_stride = st, .up_stride = st,
				     .out_stride = inplace ? st : 0, .limit = lim};
	T_CHECK(kern_swiglu_ref(&a) == ST_OK);
	double worst = 0;
	size_t nn = 0;
	for (int64_t r = 0; r < rows; r++) {
		const float *o = inplace ? gu + r * st : out + r * dim;
		nn += count_nan(o, (size_t)dim);
		double e = max_rel_err(o, ref + r * dim, (size_t)dim, 1e-5, 1e-5);
		worst = e > worst ? e : worst;
	}
	T_CHECKF(nn == 0 && worst <= 1, "rows %lld dim %d fused %d w %d lim %g: worst %g", (long long)rows, dim,
		 fused, weighted, lim, worst);
	free(gu);
	free(out);
	free(rw);
	free(ref);
}

int main(void)
{
	mt_seed_from_env("test_act");
	run_case(5, 2048, false, false, 10, false);
	run_case(7, 32, true, true, 10, false);
	run_case(3, 33, true, true, 10, true); /* fused, in place over the gate half */
	run_case(4, 64, false, true, 0, false);   /* no clamp */
	run_case(0, 64, false, true, 10, false);  /* empty */
	/* clamp edges: gate clamps above only, up both sides */
	{
		float g[3] = {50, -50, 3}, u[3] = {50, -50, -50}, o[3];
		struct kern_swiglu_args a = {.gate = g, .up = u, .out = o, .n_rows = 1, .dim = 3, .limit = 10};
		T_CHECK(kern_swiglu_ref(&a) == ST_OK);
		T_CLOSE(o[0], 10 / (1 + exp(-10.0)) * 10, 1e-5, 1e-6);
		T_CLOSE(o[1], -50 / (1 + exp(50.0)) * -10, 1e-6, 1e-5);
		T_CLOSE(o[2], 3 / (1 + exp(-3.0)) * -10, 1e-5, 1e-6);
		a.bf16_out = true;
		T_CHECK(kern_swiglu_ref(&a) == ST_OK);
		T_CHECK(o[0] == kern__bf16_round(o[0]) && o[2] == kern__bf16_round(o[2]));
		a.dim = 0;
		T_CHECK(kern_swiglu_ref(&a) == ST_INVALID);
	}
	{
		float x[5] = {-3, -0.5f, 0, 0.5f, 7};
		double x0[5] = {-3, -0.5, 0, 0.5, 7};
		kern_silu_ref(x, 5);
		for (int i = 0; i < 5; i++)
			T_CLOSE(x[i], x0[i] / (1 + exp(-x0[i])), 1e-6, 1e-6);
	}
	return test_exit();
}
