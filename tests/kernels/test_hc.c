/*
 * tests/kernels/test_hc.c: the mHC ops (dsv4.md §3.2, §3.10) against a
 * double-precision oracle written here, the Sinkhorn invariants (rows and
 * columns ≈ 1), the HC_post orientation (comb consumed transposed), bf16
 * outputs, and, given a golden file from tests/kernels/ref_mops.py (numpy),
 * the split against numpy: `test_hc FILE`.
 */
#include "kernels/hc/hc.h"
#include "kernels/norm/lowp_sim.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

/* Oracle of the split for one token, in double. */
static void oracle_split(const float *mix, double sq, int n, int k, const float *scale, const float *base,
			 int iters, double eps, bool head, double *pre, double *post, double *comb)
{
	double rho = 1.0 / sqrt(sq / k + 1e-6);
	for (int j = 0; j < n; j++)
		pre[j] = 1.0 / (1.0 + exp(-(scale[0] * rho * mix[j] + base[j]))) + eps;
	if (head)
		return;
	for (int j = 0; j < n; j++)
		post[j] = 2.0 / (1.0 + exp(-(scale[1] * rho * mix[n + j] + base[n + j])));
	double P[8][8];
	for (int j = 0; j < n; j++) {
		double z = 0;
		for (int c = 0; c < n; c++)
			z += exp(scale[2] * rho * mix[2 * n + n * j + c] + base[2 * n + n * j + c]);
		for (int c = 0; c < n; c++)
			P[j][c] = exp(scale[2] * rho * mix[2 * n + n * j + c] + base[2 * n + n * j + c]) / z + eps;
	}
	/* 1 column norm, then iters-1 (row, column) pairs */
	for (int step = 0; step < 2 * iters - 1; step++) {
		bool col = step % 2 == 0;
		for (int a = 0; a < n; a++) {
			double s = 0;
			for (int b = 0; b < n; b++)
				s += col ? P[b][a] : P[a][b];
			for (int b = 0; b < n; b++) {
				if (col)
					P[b][a] /= s + eps;
				else
					P[a][b] /= s + eps;
			}
		}
	}
	for (int j = 0; j < n; j++)
		for (int c = 0; c < n; c++)
			comb[j * n + c] = P[j][c];
}

static void test_full(int64_t T, int n, int D, int iters, bool head)
{
	int k = n * D, n_out = head ? n : (2 + n) * n;
	float *x = xcalloc((size_t)(T * k) + 1, sizeof *x), *fn = xcalloc((size_t)(n_out * k), sizeof *fn);
	float *mix = xcalloc((size_t)(T * n_out) + 1, sizeof *mix), *sq = xcalloc((size_t)T + 1, sizeof *sq);
	float *pre = xcalloc((size_t)(T * n) + 1, 4), *post = xcalloc((size_t)(T * n) + 1, 4);
	float *comb = xcalloc((size_t)(T * n * n) + 1, 4);
	float scale[3], base[48];
	for (int64_t i = 0; i < T * k; i++)
		x[i] = kern__bf16_round(mt_unif(-3, 3));
	mt_fill(fn, (size_t)(n_out * k), -0.05f, 0.05f);
	mt_fill(scale, 3, 0.1f, 2.0f);
	mt_fill(base, 48, -1, 1);
	fill_nan(mix, (size_t)(T * n_out));
	fill_nan(sq, (size_t)T);
	struct kern_hc_prenorm_args pa = {.x = x, .fn = fn, .mix = mix, .sqr_sum = sq, .n_tokens = T, .k = k,
					  .n_out = n_out};
	T_CHECK(kern_hc_prenorm_ref(&pa) == ST_OK);
	int bad = 0;
	for (int64_t t = 0; t < T; t++) {
		double s = 0;
		for (int i = 0; i < k; i++)
			s += (double)x[t * k + i] * x[t * k + i];
		bad += !(fabs(sq[t] - s) <= 1e-4 * s);
		for (int o = 0; o < n_out; o++) {
			double d = 0, mag = 0;
			for (int i = 0; i < k; i++) {
				d += (double)x[t * k + i] * fn[o * k + i];
				mag += fabs((double)x[t * k + i] * fn[o * k + i]);
			}
			bad += !(fabs(mix[t * n_out + o] - d) <= 1e-5 * mag + 1e-6);
		}
	}
	T_CHECKF(bad == 0, "prenorm T %lld n %d D %d: %d bad", (long long)T, n, D, bad);

	fill_nan(pre, (size_t)(T * n));
	fill_nan(post, (size_t)(T * n));
	fill_nan(comb, (size_t)(T * n * n));
	struct kern_hc_split_args sa = {.mix = mix, .sqr_sum = sq, .n_tokens = T, .n_streams = n, .k = k,
					.norm_eps = 1e-6f, .scale = scale, .base = base, .sinkhorn_iters = iters,
					.hc_eps = 1e-6f, .head = head, .pre = pre, .post = post, .comb = comb};
	T_CHECK(kern_hc_split_ref(&sa) == ST_OK);
	bad = 0;
	double worst_row = 0, worst_col = 0;
	for (int64_t t = 0; t < T; t++) {
		double rp[8], rq[8], rc[64];
		oracle_split(mix + t * n_out, sq[t], n, k, scale, base, iters, 1e-6, head, rp, rq, rc);
		for (int j = 0; j < n; j++) {
			bad += !(fabs(pre[t * n + j] - rp[j]) <= 1e-5);
			if (!head)
				bad += !(fabs(post[t * n + j] - rq[j]) <= 1e-5);
		}
		if (head)
			continue;
		for (int j = 0; j < n * n; j++)
			bad += !(fabs(comb[t * n * n + j] - rc[j]) <= 2e-5);
		for (int a = 0; a < n; a++) {
			double rs = 0, cs = 0;
			for (int b = 0; b < n; b++) {
				rs += comb[t * n * n + a * n + b];
				cs += comb[t * n * n + b * n + a];
			}
			worst_row = fmax(worst_row, fabs(rs - 1));
			worst_col = fmax(worst_col, fabs(cs - 1));
		}
	}
	T_CHECKF(bad == 0, "split T %lld n %d iters %d head %d: %d bad", (long long)T, n, iters, head, bad);
	/* Columns are normalised last, so they are 1 up to eps; rows converge
	 * (linearly, at a rate that depends on the matrix): with many iterations
	 * they must be 1 too. */
	if (!head && iters >= 20)
		T_CHECKF(worst_col < 1e-4, "columns: %g", worst_col);
	if (!head && iters >= 200)
		T_CHECKF(worst_row < 1e-4, "rows after %d iterations: %g", iters, worst_row);
	if (head) {
		T_CHECK(count_nan(post, (size_t)(T * n)) == (size_t)(T * n)); /* untouched */
	}
	T_CHECK(count_nan(pre, (size_t)(T * n)) == 0);
	if (!head)
		T_CHECK(count_nan(comb, (size_t)(T * n * n)) == 0 && count_nan(post, (size_t)(T * n)) == 0);

	/* combine and post */
	float *u = xcalloc((size_t)(T * D) + 1, 4), *f = xcalloc((size_t)(T * D) + 1, 4);
	float *xo = xcalloc((size_t)(T * k) + 1, 4);
	mt_fill(f, (size_t)(T * D), -2, 2);
	fill_nan(u, (size_t)(T * D));
	struct kern_hc_pre_combine_args ca = {.x = x, .pre = pre, .u = u, .n_tokens = T, .n_streams = n, .dim = D};
	T_CHECK(kern_hc_pre_combine_ref(&ca) == ST_OK);
	bad = 0;
	for (int64_t t = 0; t < T; t++)
		for (int i = 0; i < D; i++) {
			double s = 0;
			for (int j = 0; j < n; j++)
				s += (double)pre[t * n + j] * x[(t * n + j) * D + i];
			bad += !(fabs(u[t * D + i] - s) <= 1e-5 * (1 + fabs(s)));
		}
	T_CHECKF(bad == 0, "pre_combine: %d bad", bad);
	if (!head) {
		fill_nan(xo, (size_t)(T * k));
		struct kern_hc_post_args qa = {.f = f, .x = x, .post = post, .comb = comb, .x_out = xo, .n_tokens = T,
					       .n_streams = n, .dim = D};
		T_CHECK(kern_hc_post_ref(&qa) == ST_OK);
		bad = 0;
		for (int64_t t = 0; t < T; t++)
			for (int s = 0; s < n; s++)
				for (int i = 0; i < D; i++) {
					double v = (double)post[t * n + s] * f[t * D + i];
					for (int j = 0; j < n; j++)
						v += (double)comb[(t * n + j) * n + s] * x[(t * n + j) * D + i];
					bad += !(fabs(xo[(t * n + s) * D + i] - v) <= 1e-5 * (1 + fabs(v)));
				}
		T_CHECKF(bad == 0, "post: %d bad", bad);
		/* bf16 outputs are the rounded fp32 outputs */
		float *xb = xcalloc((size_t)(T * k) + 1, 4);
		qa.x_out = xb;
		qa.bf16_out = true;
		T_CHECK(kern_hc_post_ref(&qa) == ST_OK);
		bad = 0;
		for (int64_t i = 0; i < T * k; i++)
			bad += xb[i] != kern__bf16_round(xo[i]);
		T_CHECK(bad == 0);
		qa.x_out = (float *)x;
		T_CHECK(T == 0 || kern_hc_post_ref(&qa) == ST_INVALID); /* aliasing refused */
		free(xb);
	}
	free(u);
	free(f);
	free(xo);
	free(x);
	free(fn);
	free(mix);
	free(sq);
	free(pre);
	free(post);
	free(comb);
}

/* HC_post orientation on a hand-made case: comb = e_{0,1} (j=0 -> k=1). */
static void test_orientation(void)
{
	float x[2 * 2] = {1, 1, 5, 5}, f[2] = {0, 0}, post[2] = {0, 0}, comb[4] = {0, 1, 0, 0}, xo[4];
	struct kern_hc_post_args a = {.f = f, .x = x, .post = post, .comb = comb, .x_out = xo, .n_tokens = 1,
				      .n_streams = 2, .dim = 2};
	T_CHECK(kern_hc_post_ref(&a) == ST_OK);
	/* X'_1 = comb[0][1]·X_0 = X_0; X'_0 = 0 */
	T_CHECK(xo[0] == 0 && xo[1] == 0 && xo[2] == 1 && xo[3] == 1);
}

/* Golden check against numpy: the file holds n, iters, k, mix, sqr_sum, scale,
 * base and the expected pre, post, comb. */
static int run_golden(const char *path)
{
	struct gf g;
	if (gf_load(&g, path)) {
		fprintf(stderr, "cannot read %s\n", path);
		return 1;
	}
	size_t nmix = 0;
	int n = (int)gf_get(&g, "n", NULL)[0], iters = (int)gf_get(&g, "iters", NULL)[0];
	int k = (int)gf_get(&g, "k", NULL)[0];
	float *mix = gf_floats(&g, "mix", &nmix), *sq = gf_floats(&g, "sqr_sum", NULL);
	float *scale = gf_floats(&g, "scale", NULL), *base = gf_floats(&g, "base", NULL);
	int64_t T = (int64_t)(nmix / (size_t)((2 + n) * n));
	float *pre = xcalloc((size_t)(T * n), 4), *post = xcalloc((size_t)(T * n), 4);
	float *comb = xcalloc((size_t)(T * n * n), 4);
	struct kern_hc_split_args sa = {.mix = mix, .sqr_sum = sq, .n_tokens = T, .n_streams = n, .k = k,
					.norm_eps = 1e-6f, .scale = scale, .base = base, .sinkhorn_iters = iters,
					.hc_eps = 1e-6f, .pre = pre, .post = post, .comb = comb};
	T_CHECK(kern_hc_split_ref(&sa) == ST_OK);
	const double *ep = gf_get(&g, "pre", NULL), *eq = gf_get(&g, "post", NULL), *ec = gf_get(&g, "comb", NULL);
	double w1 = max_rel_err(pre, ep, (size_t)(T * n), 1e-6, 1e-5);
	double w2 = max_rel_err(post, eq, (size_t)(T * n), 1e-6, 1e-5);
	double w3 = max_rel_err(comb, ec, (size_t)(T * n * n), 2e-6, 1e-4);
	T_CHECKF(w1 <= 1 && w2 <= 1 && w3 <= 1, "numpy golden: pre %g post %g comb %g (T %lld)", w1, w2, w3,
		 (long long)T);
	free(mix);
	free(sq);
	free(scale);
	free(base);
	free(pre);
	free(post);
	free(comb);
	gf_free(&g);
	return test_exit();
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return run_golden(argv[1]);
	mt_seed_from_env("test_hc");
	test_full(5, 4, 256, 20, false);  /* tiny model dims */
	test_full(2, 4, 4096, 20, false); /* Flash dims */
	test_full(3, 4, 64, 1, false);    /* a single column norm */
	test_full(3, 4, 64, 3, false);
	test_full(6, 4, 64, 400, false);  /* converged Sinkhorn: rows and columns ≈ 1 */
	test_full(4, 4, 256, 20, true);   /* HCHead */
	test_full(3, 2, 40, 20, false);   /* other n */
	test_full(0, 4, 64, 20, false);   /* empty */
	test_orientation();
	struct kern_hc_split_args bad = {.n_streams = 9, .k = 1, .sinkhorn_iters = 1};
	T_CHECK(kern_hc_split_ref(&bad) == ST_INVALID);
	return test_exit();
}
