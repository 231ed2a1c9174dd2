/*
 * tests/kernels/test_hc_gpu.c (suite gpu): the generic CUDA mHC ops
 * (hc_prenorm / hc_split / hc_pre_combine / hc_post _cuda_generic) against
 * the CPU references of kernels/hc on fresh random inputs.
 *
 * Shapes: n_tokens 0, 1 (decode), 3, 17, 100 (the prenorm kernel switches
 * tiling above 16 tokens); the model's n = 4 streams of D = 4096
 * (K = 16384, n_out = 24 and the HCHead's 4) plus n = 3, D = 7 (K = 21: not
 * a multiple of 4, the scalar path) and n = 2, D = 64. Every output buffer is
 * NaN-filled first so an unwritten element fails.
 * Tolerances (relative to the output's max |ref| unless said):
 *   prenorm mix: fp32 sums of 16384 products in another order (tree vs
 *     sequential): error ~ sqrt(K)·2^-24 of the magnitudes, far below 1e-5;
 *   prenorm sqr_sum: against an fp64 sum computed here, 2^-21 relative (the
 *     kernel's bound is about 6.5·2^-24: fp32 float4 chains, Kahan per
 *     thread, fp64 combine; hc_generic.cu). The CPU reference's sequential
 *     f32 sum is checked against the same fp64 sum with the recursive-
 *     summation bound (K-1)·2^-24 (worst case; on bf16 inputs it sits at
 *     about +1e-5 relative at K = 16384, biased upward, which is why run 4
 *     saw the GPU "0.23 low" against it at a 1e-5 tolerance);
 *   split: the same formulas in the same order with IEEE division and sqrt;
 *     only expf differs (CUDA's is within 2 ulp), through softmax and 20
 *     Sinkhorn normalisations of values in [0, 1]: 1e-5 absolute;
 *   pre_combine / post: the reference's order without FMA contraction, so
 *     f32 results match to 1e-6; bf16 outputs may differ by one bf16 ulp
 *     where an f32 ulp difference crosses a rounding tie: 8e-3.
 * Selection on the device must pick the generic CUDA variant of each op.
 * Exits 77 without a GPU or without CUDA.
 */
#include "tests/kernels/gpu_test_util.h"

static void cmp(const char *what, const float *ref, const float *got, size_t n, double atol, double rtol,
		int64_t T, int ns, int D)
{
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_compare_f32(ref, got, n, atol, rtol, why, sizeof why), "%s T%lld n%d D%d: %s", what,
		 (long long)T, ns, D, why);
}

static void one_case(uint64_t *rng, int64_t T, int ns, int D, bool head, bool bf16)
{
	const struct kern_variant *vp = gt_cuda_generic(&kern_op_hc_prenorm), *vs = gt_cuda_generic(&kern_op_hc_split),
				  *vc = gt_cuda_generic(&kern_op_hc_pre_combine), *vo = gt_cuda_generic(&kern_op_hc_post);
	const int k = ns * D, n_out = head ? ns : (2 + ns) * ns;
	const size_t Tz = (size_t)T;
	/* Streams look like bf16 activations of magnitude ~1 (the prenorm input is bf16 values in f32). */
	float *x = gt_frand(rng, Tz * k, 2.0f);
	for (size_t i = 0; i < Tz * k; i++)
		x[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
	float *fn = gt_frand(rng, (size_t)n_out * k, 0.05f);

	/* prenorm */
	float *mix_r = gt_fnan(Tz * n_out), *mix_g = gt_fnan(Tz * n_out), *sq_r = gt_fnan(Tz), *sq_g = gt_fnan(Tz);
	struct kern_hc_prenorm_args pa = {.x = x, .fn = fn, .mix = mix_r, .sqr_sum = sq_r, .n_tokens = T, .k = k,
					  .n_out = n_out};
	T_CHECK(kern_hc_prenorm_ref(&pa) == ST_OK);
	pa.mix = mix_g;
	pa.sqr_sum = sq_g;
	T_CHECK(((kern_hc_prenorm_fn)vp->run_host)(&pa) == ST_OK);
	cmp("hc_prenorm mix", mix_r, mix_g, Tz * n_out, 1e-6, 1e-5, T, ns, D);
	float *sq_x = gt_fnan(Tz); /* Σx² in fp64, rounded once */
	for (size_t t = 0; t < Tz; t++) {
		double ss = 0.0;
		for (int i = 0; i < k; i++)
			ss += (double)x[t * k + i] * (double)x[t * k + i];
		sq_x[t] = (float)ss;
	}
	cmp("hc_prenorm sqr_sum (vs fp64)", sq_x, sq_g, Tz, 1e-30, ldexp(1.0, -21), T, ns, D);
	cmp("hc_prenorm_ref sqr_sum (vs fp64)", sq_x, sq_r, Tz, 1e-30, (k - 1) * ldexp(1.0, -24) + ldexp(1.0, -24),
	    T, ns, D);
	free(sq_x);

	/* split, from the reference's mix (so only split is under test) */
	float scale[3] = {0.5f + kern_rand_f32(rng) * 0.3f, 0.8f, 1.2f};
	float *base = gt_frand(rng, (size_t)n_out, 1.0f);
	float *pre_r = gt_fnan(Tz * ns), *pre_g = gt_fnan(Tz * ns), *post_r = gt_fnan(Tz * ns), *post_g = gt_fnan(Tz * ns);
	float *comb_r = gt_fnan(Tz * ns * ns), *comb_g = gt_fnan(Tz * ns * ns);
	struct kern_hc_split_args sa = {.mix = mix_r, .sqr_sum = sq_r, .n_tokens = T, .n_streams = ns, .k = k,
					.norm_eps = 1e-6f, .scale = scale, .base = base, .sinkhorn_iters = 20,
					.hc_eps = 1e-6f, .head = head, .pre = pre_r, .post = post_r, .comb = comb_r};
	T_CHECK(kern_hc_split_ref(&sa) == ST_OK);
	sa.pre = pre_g;
	sa.post = post_g;
	sa.comb = comb_g;
	T_CHECK(((kern_hc_split_fn)vs->run_host)(&sa) == ST_OK);
	cmp("hc_split pre", pre_r, pre_g, Tz * ns, 1e-5, 0, T, ns, D);
	if (!head) {
		cmp("hc_split post", post_r, post_g, Tz * ns, 1e-5, 0, T, ns, D);
		cmp("hc_split comb", comb_r, comb_g, Tz * ns * ns, 1e-5, 0, T, ns, D);
	} else {
		for (size_t i = 0; i < Tz * ns; i++)
			T_CHECKF(isnan(post_g[i]), "head mode wrote post");
	}

	/* pre_combine and post, from the reference's pre/post/comb */
	float *u_r = gt_fnan(Tz * D), *u_g = gt_fnan(Tz * D);
	struct kern_hc_pre_combine_args ca = {.x = x, .pre = pre_r, .u = u_r, .n_tokens = T, .n_streams = ns,
					      .dim = D, .bf16_out = bf16};
	T_CHECK(kern_hc_pre_combine_ref(&ca) == ST_OK);
	ca.u = u_g;
	T_CHECK(((kern_hc_pre_combine_fn)vc->run_host)(&ca) == ST_OK);
	cmp("hc_pre_combine", u_r, u_g, Tz * D, 1e-6, bf16 ? 8e-3 : 1e-6, T, ns, D);
	if (!head) {
		float *f = gt_frand(rng, Tz * D, 1.0f);
		float *xo_r = gt_fnan(Tz * k), *xo_g = gt_fnan(Tz * k);
		struct kern_hc_post_args oa = {.f = f, .x = x, .post = post_r, .comb = comb_r, .x_out = xo_r,
					       .n_tokens = T, .n_streams = ns, .dim = D, .bf16_out = bf16};
		T_CHECK(kern_hc_post_ref(&oa) == ST_OK);
		oa.x_out = xo_g;
		T_CHECK(((kern_hc_post_fn)vo->run_host)(&oa) == ST_OK);
		cmp("hc_post", xo_r, xo_g, Tz * k, 1e-6, bf16 ? 8e-3 : 1e-6, T, ns, D);
		free(f);
		free(xo_r);
		free(xo_g);
	}
	free(x);
	free(fn);
	free(mix_r);
	free(mix_g);
	free(sq_r);
	free(sq_g);
	free(base);
	free(pre_r);
	free(pre_g);
	free(post_r);
	free(post_g);
	free(comb_r);
	free(comb_g);
	free(u_r);
	free(u_g);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	const struct kern_op *ops[] = {&kern_op_hc_prenorm, &kern_op_hc_split, &kern_op_hc_pre_combine,
				       &kern_op_hc_post};
	/* Selection on the device picks our generic CUDA ops (DeepGEMM is never needed). */
	if (!gt_generic_ops_picked(ops, 4, &dev, true))
		return test_exit();
	uint64_t rng = gt_seed(argc, argv, &dev);
	static const int64_t Ts[] = {0, 1, 3, 17, 100};
	for (int i = 0; i < 5; i++) {
		one_case(&rng, Ts[i], 4, 4096, false, i & 1);
		one_case(&rng, Ts[i], 4, 4096, true, !(i & 1));
		one_case(&rng, Ts[i], 3, 7, false, true);
		one_case(&rng, Ts[i], 2, 64, i & 1, false);
	}
	return test_exit();
}
