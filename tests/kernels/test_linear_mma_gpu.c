/*
 * tests/kernels/test_linear_mma_gpu.c (suite gpu): the portable tensor-core
 * FP8 linears (linear_mma_fp8_<image> for this device's cc, and
 * linear_mma_bf16) against the CPU reference on the real device.
 *
 *   - guards: act_quant 0, in % 128, decode plans (max_tokens < 64) and bf16
 *     weights are refused with their reasons;
 *   - a sweep against kern_linear_ref itself: T 1..200 (partial 64-row tiles,
 *     one row), in 128..1152 (1 to 9 K blocks: the pipeline's prologue with
 *     fewer blocks than stages), out 8..300 (partial 128-output tiles and n8
 *     tiles), x f32 / bf16 with ldx = in or padded (ldx % 4 != 0 takes the
 *     quantizer's scalar path), y f32 / bf16 with a padded ldy, E8M0 and f32
 *     weight scales;
 *   - the DeepSeek-V4-Flash shapes wq_a 4096 -> 1024, wq_b 1024 -> 32768,
 *     wkv 4096 -> 512, wo_b 8192 -> 4096 at T = 64, 65, 200, 1024, 4096 and
 *     wq_a at T = 16384, against the same math run on all cores (mma_ref.h,
 *     itself checked against kern_linear_ref first);
 *   - outputs pre-filled with NaN and the row padding checked to stay NaN;
 *   - activations whose magnitude changes per token and per 128 columns by up
 *     to 2^±6, so every activation scale differs (a transposed scale index
 *     fails);
 *   - the op's self-check accepts both variants on this device, and a
 *     kern_ctx's scratch grows on demand.
 * Tolerance (relative to max |y_ref|): the activation codes and scales are
 * bit-identical to the reference's and every product is exact, so only the
 * summation order differs, plus the FP8 MMA's accumulation inside a k32 step
 * on Hopper (reduced precision, as cuBLASLt's test notes): 2e-3 for f32 y,
 * 1e-2 for bf16 y (one bf16 rounding).
 * Exits 77 without CUDA or a GPU.
 */
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/mma_ref.h"

/* x [T, ldx] of dtype dt; magnitudes change per token and per 128 columns. */
static void *make_x(uint64_t *rng, int64_t T, int64_t in, int64_t ldx, enum kern_dtype dt)
{
	return gt_x_rand(rng, T, in, ldx, dt, 6, 128);
}

struct lcase {
	int64_t T, in, out, ldx, ldy;
	enum kern_dtype xdt, ydt;
	enum kern_wfmt fmt;
	bool fast; /* reference: mma_ref.h on all cores instead of kern_linear_ref */
};

/* Runs every variant in vs[nv] on one random problem; returns the failures. */
static int one_case(const struct kern_variant *const *vs, int nv, uint64_t *rng, const struct lcase *c)
{
	struct err e = {0};
	struct kern_wmat w = {0};
	T_CHECK(kern_wmat_make_random(&w, c->fmt, c->out, c->in, rng, &e) == ST_OK);
	void *x = make_x(rng, c->T, c->in, c->ldx, c->xdt);
	float *yr = gt_malloc((size_t)(c->T * c->out) * 4);
	char label[128];
	snprintf(label, sizeof label, "T %lld [%lld -> %lld] ldx %lld ldy %lld x %s y %s %s", (long long)c->T,
		 (long long)c->in, (long long)c->out, (long long)c->ldx, (long long)c->ldy, c->xdt ? "bf16" : "f32",
		 c->ydt ? "bf16" : "f32", kern_wfmt_name(c->fmt));
	if (c->fast) {
		float *xq = mref_act_quant(x, c->xdt, c->T, c->in, c->ldx), *wd = mref_decode(&w);
		T_CHECK(xq && wd);
		if (xq && wd)
			mref_gemm(xq, NULL, 0, c->T, wd, c->in, c->out, yr, 0, c->out);
		free(xq);
		free(wd);
	} else {
		struct kern_linear_args ra = {.n_tokens = c->T, .x = x, .x_dtype = c->xdt, .ldx = c->ldx, .y = yr,
					      .y_dtype = KERN_DT_F32, .w = &w, .act_quant_block = 128};
		T_CHECK(kern_linear_ref(&ra) == ST_OK);
	}
	int failed = 0;
	for (int vi = 0; vi < nv; vi++) {
		const struct kern_variant *v = vs[vi];
		struct kern_wmat wp = {0};
		T_CHECK(kern_prepare_weight(v, &w, &wp, &e) == ST_OK);
		void *yg = gt_poisoned(c->ydt, c->T, c->ldy);
		struct kern_linear_args a = {.n_tokens = c->T, .x = x, .x_dtype = c->xdt, .ldx = c->ldx, .y = yg,
					     .y_dtype = c->ydt, .ldy = c->ldy, .w = &wp, .act_quant_block = 128};
		failed += !gt_check_rows(v->name, label, ((kern_linear_fn)v->run_host)(&a), yr, yg, c->ydt, c->T, c->out,
					 c->ldy, c->ydt == KERN_DT_BF16 ? 1e-2 : 2e-3);
		free(yg);
		kern_wmat_release(&wp);
	}
	free(x);
	free(yr);
	kern_wmat_release(&w);
	return failed;
}

/* mma_ref.h agrees with kern_linear_ref (so the real-shape checks mean something). */
static void check_fast_ref(uint64_t *rng)
{
	struct err e = {0};
	const int64_t T = 70, in = 640, out = 300;
	struct kern_wmat w = {0};
	T_CHECK(kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, out, in, rng, &e) == ST_OK);
	void *x = make_x(rng, T, in, in, KERN_DT_BF16);
	float *y1 = malloc((size_t)(T * out) * 4), *y2 = malloc((size_t)(T * out) * 4);
	struct kern_linear_args ra = {.n_tokens = T, .x = x, .x_dtype = KERN_DT_BF16, .y = y1, .y_dtype = KERN_DT_F32,
				      .w = &w, .act_quant_block = 128};
	T_CHECK(kern_linear_ref(&ra) == ST_OK);
	float *xq = mref_act_quant(x, KERN_DT_BF16, T, in, in), *wd = mref_decode(&w);
	mref_gemm(xq, NULL, 0, T, wd, in, out, y2, 0, out);
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_compare_f32(y1, y2, (size_t)(T * out), 1e-6, 1e-5, why, sizeof why), "mma_ref vs reference: %s",
		 why);
	free(xq);
	free(wd);
	free(x);
	free(y1);
	free(y2);
	kern_wmat_release(&w);
}

int main(int argc, char **argv)
{
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	struct err e = {0};

	/* The variants this device runs. */
	struct kern_linear_shape sh = {.in = 4096, .out = 1024, .max_tokens = 4096, .act_quant_block = 128,
				       .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &sh};
	const struct kern_variant *vs[2];
	const int nv = gt_mma_variants(&kern_op_linear, "linear_mma", &p, &env.dev, vs);
	if (!nv)
		return test_exit();

	/* Guards: sh and p with one thing changed, refused with the reason named. */
	static const struct {
		int act_quant_block;
		int64_t in, max_tokens;
		enum kern_wfmt wfmt;
		const char *why;
	} guards[] = {
		{0, 4096, 4096, KERN_WFMT_FP8_E8M0_B128, "act_quant_block 0"},
		{128, 4096 + 64, 4096, KERN_WFMT_FP8_E8M0_B128, "not a multiple of 128"},
		{128, 4096, 16, KERN_WFMT_FP8_E8M0_B128, "below one 64-token tile"},
		{128, 4096, 4096, KERN_WFMT_BF16, "weight format bf16 not accepted"},
	};
	for (int i = 0; i < nv; i++)
		for (size_t j = 0; j < sizeof guards / sizeof guards[0]; j++) {
			struct kern_linear_shape g = sh;
			struct kern_problem gp = p;
			gp.shape = &g;
			gp.wfmt = guards[j].wfmt;
			g.act_quant_block = guards[j].act_quant_block;
			g.in = guards[j].in;
			g.max_tokens = guards[j].max_tokens;
			gt_refuses(vs[i], &gp, &env.dev, guards[j].why);
		}

	check_fast_ref(&env.rng);

	/* Sweep against kern_linear_ref. */
	static const int64_t Ts[] = {1, 5, 63, 64, 65, 127, 200};
	static const int64_t ins[] = {128, 256, 640, 1152};
	static const int64_t outs[] = {8, 100, 128, 129, 300};
	int failed = 0, ran = 0;
	for (int i = 0; i < 48; i++) {
		struct lcase c = {.T = Ts[i % 7], .in = ins[gt_rnd(&env.rng, 0, 3)],
				  .out = outs[gt_rnd(&env.rng, 0, 4)],
				  .xdt = (enum kern_dtype)(i & 1), .ydt = (enum kern_dtype)((i >> 1) & 1),
				  .fmt = (i >> 2) & 1 ? KERN_WFMT_FP8_F32_B128 : KERN_WFMT_FP8_E8M0_B128};
		c.ldx = c.in + (i % 3 == 0 ? 0 : i % 3 == 1 ? 8 : 3);
		c.ldy = c.out + (i % 4 == 3 ? 5 : 0);
		failed += one_case(vs, nv, &env.rng, &c);
		ran++;
	}
	fprintf(stderr, "sweep: %d cases x %d variants, %d failures\n", ran, nv, failed);

	/* DeepSeek-V4-Flash shapes. */
	static const int64_t shapes[4][2] = {{4096, 1024}, {1024, 32768}, {4096, 512}, {8192, 4096}};
	static const int64_t bigT[] = {64, 65, 200, 1024, 4096};
	int big_failed = 0;
	for (int s = 0; s < 4; s++)
		for (int t = 0; t < 5; t++) {
			struct lcase c = {.T = bigT[t], .in = shapes[s][0], .out = shapes[s][1], .ldx = shapes[s][0],
					  .ldy = shapes[s][1], .xdt = KERN_DT_BF16, .ydt = (enum kern_dtype)(t & 1),
					  .fmt = KERN_WFMT_FP8_E8M0_B128, .fast = true};
			big_failed += one_case(vs, nv, &env.rng, &c);
		}
	struct lcase c16k = {.T = 16384, .in = 4096, .out = 1024, .ldx = 4096, .ldy = 1024, .xdt = KERN_DT_BF16,
			     .ydt = KERN_DT_BF16, .fmt = KERN_WFMT_FP8_E8M0_B128, .fast = true};
	big_failed += one_case(vs, nv, &env.rng, &c16k);
	fprintf(stderr, "model shapes: 21 cases x %d variants, %d failures\n", nv, big_failed);

	/* The op's self-check (what --kernel-selfcheck runs at load) passes for both on a prefill plan. */
	for (int i = 0; i < nv; i++) {
		enum status st = kern_op_linear.selfcheck(&kern_op_linear, vs[i], &p, &env.dev, &e);
		T_CHECKF(st == ST_OK, "self-check of %s: %s", vs[i]->name, e.msg);
	}
	/* Selection on this device for a prefill plan: cuBLASLt on sm_90, the e4m3 kernel on 10.0 / 12.x. */
	gt_mma_selected(&kern_op_linear, &p, &env.dev, vs, nv, "[4096 -> 1024], 4096-token plan");

#if DSV4_HAVE_CUDA /* kern_ctx exists in CUDA builds only */
	/* A context's scratch grows on demand and is reused. */
	struct kern_ctx *kc = NULL;
	T_CHECK(kern_ctx_create(env.dev.index, NULL, &kc, &e) == ST_OK);
	T_CHECK(kern_ctx_reserve(kc, 1000, &e) == ST_OK);
	void *s1 = kern_ctx_scratch(kc, 1000, NULL);
	T_CHECK(s1 != NULL && kern_ctx_scratch(kc, 10, NULL) == s1);
	T_CHECK(kern_ctx_scratch(kc, (size_t)64 << 20, NULL) != NULL);
	kern_ctx_destroy(kc);
#endif
	return test_exit();
}
