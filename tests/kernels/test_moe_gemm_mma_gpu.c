/*
 * tests/kernels/test_moe_gemm_mma_gpu.c (suite gpu): the portable tensor-core
 * FP4 expert GEMMs (moe_gemm_mma_fp8_<image> for this device's cc, and
 * moe_gemm_mma_bf16) against the CPU reference on the real device.
 *
 *   - guards: act_quant 0, in % 128, FP8 experts and decode plans are refused
 *     with their reasons;
 *   - the kernels alone (kern_moe_gemm_mma_*_only_host, no GEMV dispatch) in a
 *     sweep against kern_moe_gemm_ref: MXFP4 and NVFP4; 1 to 12 experts with
 *     ragged loads (empty experts, one with exactly 64 rows and one with 65:
 *     a full row tile and a tile of one row); 1 to 300 rows; in 128..1152;
 *     out 8..300 (partial output tiles); gathered (row_src) and in-place rows;
 *     x f32 / bf16; y f32 / bf16 with padded ldy;
 *   - the expert shapes w1/w3 4096 -> 2048 (rows gathered from T tokens, top-6)
 *     and w2 2048 -> 4096 (rows in place) over 32 experts with ragged loads
 *     (some empty) at T = 64, 65, 200, 1024, 4096, against the reference's
 *     math on all cores (mma_ref.h, itself checked against kern_moe_gemm_ref);
 *   - outputs NaN-filled, row padding checked to stay NaN;
 *   - run() through the registry row dispatches small calls to the GEMV and
 *     large ones to the kernel: both checked; the op's self-check passes.
 * Tolerance as test_linear_mma_gpu.c: 2e-3 (f32 y), 1e-2 (bf16 y) of max |y_ref|.
 * Exits 77 without CUDA or a GPU.
 */
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/mma_ref.h"

struct runner {
	const char *name;
	kern_moe_gemm_fn fn; /* a host-buffer function */
};

struct mcase {
	enum kern_wfmt fmt;
	int64_t E, R, in, out, ldy;
	bool gather;
	int64_t X; /* x rows when gathering */
	enum kern_dtype xdt, ydt;
	bool fast;
};

/* Ragged loads: about a third of the experts empty, one with exactly 64 rows
 * and one with 65 when R allows; offsets[E] == R. */
static void make_offsets(uint64_t *rng, int64_t E, int64_t R, int32_t *off)
{
	int64_t *cnt = calloc((size_t)E, sizeof *cnt), left = R;
	int64_t fixed[2] = {64, 65};
	for (int i = 0; i < 2 && E > 2; i++)
		if (left >= fixed[i]) {
			cnt[i] = fixed[i];
			left -= fixed[i];
		}
	for (int64_t x = 2; x < E && left > 0; x++) {
		if (kern_rand_u64(rng) % 3 == 0)
			continue;
		cnt[x] = gt_rnd(rng, 0, left);
		left -= cnt[x];
	}
	/* What is left goes to a random non-fixed expert (or the first, for E <= 2). */
	cnt[E > 2 ? gt_rnd(rng, 2, E - 1) : 0] += left;
	off[0] = 0;
	for (int64_t x = 0; x < E; x++)
		off[x + 1] = off[x] + (int32_t)cnt[x];
	free(cnt);
}

static int one_case(const struct runner *rs, int nr, uint64_t *rng, const struct mcase *c)
{
	struct err e = {0};
	struct kern_wmat *w = calloc((size_t)c->E, sizeof *w);
	for (int64_t x = 0; x < c->E; x++)
		T_CHECK(kern_wmat_make_random(&w[x], c->fmt, c->out, c->in, rng, &e) == ST_OK);
	int32_t *off = calloc((size_t)c->E + 1, sizeof *off);
	make_offsets(rng, c->E, c->R, off);
	const int64_t X = c->gather ? c->X : (c->R ? c->R : 1);
	int32_t *src = c->gather ? malloc(sizeof(int32_t) * (size_t)(c->R + 1)) : NULL;
	for (int64_t r = 0; c->gather && r < c->R; r++)
		src[r] = (int32_t)gt_rnd(rng, 0, X - 1);
	void *xb = gt_x_rand(rng, X, c->in, c->in, c->xdt, 6, 128);
	float *yr = gt_malloc((size_t)(c->R * c->out) * 4);
	char label[160];
	snprintf(label, sizeof label, "%s E%lld R%lld [%lld -> %lld] ldy %lld gather %d (X %lld) x %s y %s",
		 kern_wfmt_name(c->fmt), (long long)c->E, (long long)c->R, (long long)c->in, (long long)c->out,
		 (long long)c->ldy, c->gather, (long long)X, c->xdt ? "bf16" : "f32", c->ydt ? "bf16" : "f32");
	struct kern_moe_gemm_args a = {.n_rows = c->R, .n_experts = c->E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = c->xdt, .y = yr, .y_dtype = KERN_DT_F32,
				       .w = w, .act_quant_block = 128};
	T_CHECKF(kern_moe_gemm_args_check(&a, &e) == ST_OK, "test arguments (%s): %s", label, e.msg);
	if (c->fast) {
		float *xq = mref_act_quant(xb, c->xdt, X, c->in, c->in);
		T_CHECK(xq != NULL);
		for (int64_t x = 0; xq && x < c->E; x++) {
			if (off[x + 1] == off[x])
				continue;
			float *wd = mref_decode(&w[x]);
			T_CHECK(wd != NULL);
			if (wd)
				mref_gemm(xq, src, off[x], off[x + 1], wd, c->in, c->out, yr, off[x], c->out);
			free(wd);
		}
		free(xq);
	} else {
		T_CHECK(kern_moe_gemm_ref(&a) == ST_OK);
	}
	int failed = 0;
	for (int ri = 0; ri < nr; ri++) {
		void *yg = gt_poisoned(c->ydt, c->R, c->ldy);
		a.y = yg;
		a.y_dtype = c->ydt;
		a.ldy = c->ldy;
		failed += !gt_check_rows(rs[ri].name, label, rs[ri].fn(&a), yr, yg, c->ydt, c->R, c->out, c->ldy,
					 c->ydt == KERN_DT_BF16 ? 1e-2 : 2e-3);
		free(yg);
	}
	free(xb);
	free(yr);
	free(src);
	free(off);
	for (int64_t x = 0; x < c->E; x++)
		kern_wmat_release(&w[x]);
	free(w);
	return failed;
}

/* mma_ref.h agrees with kern_moe_gemm_ref on a gathered ragged problem. */
static void check_fast_ref(uint64_t *rng)
{
	struct err e = {0};
	const int64_t E = 5, R = 150, X = 40, in = 256, out = 200;
	struct kern_wmat w[5] = {0};
	for (int x = 0; x < E; x++)
		T_CHECK(kern_wmat_make_random(&w[x], KERN_WFMT_NVFP4, out, in, rng, &e) == ST_OK);
	int32_t off[6], src[150];
	make_offsets(rng, E, R, off);
	for (int r = 0; r < R; r++)
		src[r] = (int32_t)gt_rnd(rng, 0, X - 1);
	float *xb = malloc((size_t)(X * in) * 4), *y1 = malloc((size_t)(R * out) * 4), *y2 = malloc((size_t)(R * out) * 4);
	for (int64_t i = 0; i < X * in; i++)
		xb[i] = kern_rand_f32(rng) * ldexpf(1.0f, (int)((i / 128) % 9) - 4);
	struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = KERN_DT_F32, .y = y1, .y_dtype = KERN_DT_F32,
				       .w = w, .act_quant_block = 128};
	T_CHECK(kern_moe_gemm_ref(&a) == ST_OK);
	float *xq = mref_act_quant(xb, KERN_DT_F32, X, in, in);
	for (int x = 0; x < E; x++) {
		float *wd = mref_decode(&w[x]);
		mref_gemm(xq, src, off[x], off[x + 1], wd, in, out, y2, off[x], out);
		free(wd);
	}
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(kern_compare_f32(y1, y2, (size_t)(R * out), 1e-6, 1e-5, why, sizeof why), "mma_ref vs reference: %s",
		 why);
	free(xq);
	free(xb);
	free(y1);
	free(y2);
	for (int x = 0; x < E; x++)
		kern_wmat_release(&w[x]);
}

int main(int argc, char **argv)
{
	struct gt_env env;
	if (gt_start(argc, argv, &env))
		return env.exit_code;
	struct err e = {0};

	struct kern_moe_gemm_shape sh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 6 * 4096,
					 .act_quant_block = 128, .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem p = {.wfmt = KERN_WFMT_MXFP4, .tp_size = 1, .shape = &sh};
	const struct kern_variant *vs[2];
	const int nv = gt_mma_variants(&kern_op_moe_gemm, "moe_gemm_mma", &p, &env.dev, vs);
	if (!nv)
		return test_exit();

	/* Guards: sh and p with one thing changed, refused with the reason named. */
	static const struct {
		int act_quant_block;
		int64_t in, max_rows;
		enum kern_wfmt wfmt;
		const char *why;
	} guards[] = {
		{0, 4096, 6 * 4096, KERN_WFMT_MXFP4, "act_quant_block 0"},
		{128, 4096 + 32, 6 * 4096, KERN_WFMT_MXFP4, "not a multiple of 128"},
		{128, 4096, 48, KERN_WFMT_MXFP4, "below one 64-row tile"},
		{128, 4096, 6 * 4096, KERN_WFMT_FP8_E8M0_B128, "weight format fp8"},
	};
	for (int i = 0; i < nv; i++)
		for (size_t j = 0; j < sizeof guards / sizeof guards[0]; j++) {
			struct kern_moe_gemm_shape g = sh;
			struct kern_problem gp = p;
			gp.shape = &g;
			gp.wfmt = guards[j].wfmt;
			g.act_quant_block = guards[j].act_quant_block;
			g.in = guards[j].in;
			g.max_rows = guards[j].max_rows;
			gt_refuses(vs[i], &gp, &env.dev, guards[j].why);
		}

	check_fast_ref(&env.rng);

	/* The kernels alone. */
	struct runner only[2];
	int nonly = 0;
#if DSV4_HAVE_CUDA /* the host-buffer entry points exist in CUDA builds only */
	only[nonly++] = (struct runner){"moe_gemm_mma_bf16 (kernel only)", kern_moe_gemm_mma_bf16_only_host};
	if (nv == 2)
		only[nonly++] = (struct runner){"moe_gemm_mma_fp8 (kernel only)", kern_moe_gemm_mma_fp8_only_host};
#endif
	static const int64_t Rs[] = {1, 7, 64, 65, 129, 300};
	static const int64_t ins[] = {128, 256, 640, 1152};
	static const int64_t outs[] = {8, 100, 128, 129, 300};
	int failed = 0, ran = 0;
	for (int i = 0; i < 48; i++) {
		struct mcase c = {.fmt = (i & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4, .E = gt_rnd(&env.rng, 1, 12),
				  .R = Rs[i % 6], .in = ins[gt_rnd(&env.rng, 0, 3)],
				  .out = outs[gt_rnd(&env.rng, 0, 4)],
				  .gather = (i >> 1) & 1, .X = gt_rnd(&env.rng, 1, 70),
				  .xdt = (enum kern_dtype)((i >> 2) & 1),
				  .ydt = (enum kern_dtype)(kern_rand_u64(&env.rng) & 1)};
		c.ldy = c.out + (i % 5 == 4 ? 3 : 0);
		failed += one_case(only, nonly, &env.rng, &c);
		ran++;
	}
	fprintf(stderr, "sweep: %d cases x %d kernels, %d failures\n", ran, nonly, failed);

	/* Expert shapes, 32 experts with ragged loads, top-6 rows of T tokens. */
	static const int64_t bigT[] = {64, 65, 200, 1024, 4096};
	int big_failed = 0;
	for (int t = 0; t < 5; t++)
		for (int s = 0; s < 2; s++)
			for (int f = 0; f < 2; f++) {
				struct mcase c = {.fmt = f ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4, .E = 32, .R = 6 * bigT[t],
						  .in = s ? 2048 : 4096, .out = s ? 4096 : 2048, .gather = s == 0,
						  .X = bigT[t], .xdt = KERN_DT_BF16, .ydt = (enum kern_dtype)(t & 1),
						  .fast = true};
				c.ldy = c.out;
				big_failed += one_case(only, nonly, &env.rng, &c);
			}
	fprintf(stderr, "expert shapes: 20 cases x %d kernels, %d failures\n", nonly, big_failed);

	/* Through the registry rows: run() sends <= 64 rows to the GEMV, more to the kernel. */
	for (int i = 0; i < nv; i++) {
		struct runner r = {vs[i]->name, (kern_moe_gemm_fn)vs[i]->run_host};
		struct mcase small = {.fmt = KERN_WFMT_NVFP4, .E = 8, .R = 48, .in = 4096, .out = 2048, .ldy = 2048,
				      .gather = true, .X = 8, .xdt = KERN_DT_BF16, .ydt = KERN_DT_BF16};
		struct mcase large = small;
		large.R = 600;
		large.X = 100;
		large.fmt = KERN_WFMT_MXFP4;
		one_case(&r, 1, &env.rng, &small);
		one_case(&r, 1, &env.rng, &large);
		enum status st = kern_op_moe_gemm.selfcheck(&kern_op_moe_gemm, vs[i], &p, &env.dev, &e);
		T_CHECKF(st == ST_OK, "self-check of %s: %s", vs[i]->name, e.msg);
	}
	gt_mma_selected(&kern_op_moe_gemm, &p, &env.dev, vs, nv, "MXFP4 [4096 -> 2048], 24576-row plan");
	return test_exit();
}
