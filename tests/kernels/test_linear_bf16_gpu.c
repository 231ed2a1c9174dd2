/*
 * tests/kernels/test_linear_bf16_gpu.c (suite gpu): the bf16-weight linears
 * of linear_bf16.h -- the decode GEMV linear_cuda_gemv_bf16 and the
 * tensor-core linear_mma_bf16w -- against the CPU reference on the real
 * device, at DeepSeek-V4-Flash's bf16 shapes.
 *
 * What it checks, and why each part can fail:
 *   - GEMV: the lm_head [129280 x 4096] at T = 1, 2, 7, 16, 64 (token chunks
 *     of 1, 2, 4 and their tails); the router gate [256 x 4096] (K spread
 *     over warps) and two ragged shapes (in not a multiple of 256; in = 7168,
 *     where fewer tokens fit a CTA) for every T = 1..64;
 *   - MMA: a head slice [16384 x 4096] at T = 64, 100, 512, a [2048 x 4096]
 *     slice at T = 4000 and 4096, the whole head at T = 64, ragged shapes (out not a multiple of 128, in = 96,
 *     strided x and y) at T = 1, 65, 130. The f32 activations of the head
 *     cases are bf16 values, 16-bit values or full f32 values by (64-row
 *     tile, 32-column tile), so a K tile runs one, two or three bf16 terms:
 *     a term skipped where it is needed moves the result by ~1e-3 of max |y|,
 *     ten times the tolerance;
 *   - fresh random weights and activations (magnitudes 2^±6 per element),
 *     x in f32 and bf16, y in f32 and bf16, padded rows; outputs poisoned
 *     with NaN before each call (run() on device buffers): every element of
 *     the T rows must be written and agree with the reference, nothing in
 *     the row padding or in rows >= T may be written;
 *   - the guards' refusals with their reasons, run()'s argument checks, and
 *     selection on the device: decode plans (max_tokens 1, 16, 63) of the
 *     head pick linear_cuda_gemv_bf16, prefill plans (64, 512, 8192) pick
 *     linear_mma_bf16w, and their self-checks pass.
 * Tolerance (relative to max |y_ref|, the linear GPU tests'): 1e-4 for f32
 * y, 1e-2 for bf16 y. One reference per matrix at its largest T serves
 * every smaller T (tokens are independent: no act_quant for bf16 weights);
 * it runs on every host core (about 105 G multiply-adds in all).
 * Exits 77 without CUDA or without a GPU. Seed printed; DSV4_TEST_SEED=<seed>
 * (or argv[1]) repeats a run.
 */
#include "tests/kernels/gpu_test_util.h"

#include "kernels/linear/linear_bf16.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <unistd.h>

/* ---- the reference, on every core ---- */

struct ref_job {
	struct kern_linear_args a; /* a slice of the output rows */
	struct kern_wmat w;
	enum status st;
};

static void *ref_worker(void *p)
{
	struct ref_job *j = p;
	j->a.w = &j->w;
	j->st = kern_linear_ref(&j->a);
	return NULL;
}

/* kern_linear_ref of a (bf16 weights, f32 y dense) split by output rows over
 * the host's cores. */
static enum status ref_par(const struct kern_linear_args *a)
{
	long nc = sysconf(_SC_NPROCESSORS_ONLN);
	const int64_t out = a->w->rows;
	int n = nc < 1 ? 1 : nc > 64 ? 64 : (int)nc;
	if (n > out)
		n = (int)out;
	struct ref_job jobs[64];
	pthread_t th[64];
	for (int i = 0; i < n; i++) {
		const int64_t o0 = out * i / n, o1 = out * (i + 1) / n;
		jobs[i].a = *a;
		jobs[i].w = *a->w;
		jobs[i].w.data = (const uint16_t *)a->w->data + o0 * a->w->cols;
		jobs[i].w.rows = o1 - o0;
		jobs[i].w.owned = NULL;
		jobs[i].a.y = (float *)a->y + o0;
		jobs[i].a.ldy = out;
		jobs[i].st = ST_OK;
		if (pthread_create(&th[i], NULL, ref_worker, &jobs[i]))
			ref_worker(&jobs[i]), th[i] = 0;
	}
	enum status st = ST_OK;
	for (int i = 0; i < n; i++) {
		if (th[i])
			pthread_join(th[i], NULL);
		if (jobs[i].st)
			st = jobs[i].st;
	}
	return st;
}

/* ---- one matrix with TM rows of activations on the device ---- */

struct mcase {
	const char *name;
	int64_t out, in, TM, ldx;
	enum kern_dtype xdt;
	struct kern_wmat w, dw; /* host; device view */
	void *x, *dx;
	float *yref;            /* [TM, out] */
};

/* Keep the top `bits` significant bits of f (truncation; bits 8: a bf16 value). */
static float keep_bits(float f, int bits)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u &= ~((1u << (24 - bits)) - 1u);
	memcpy(&f, &u, 4);
	return f;
}

static void mcase_init(struct mcase *m, uint64_t *rng, const char *name, int64_t out, int64_t in, int64_t TM,
		       int64_t ldx, enum kern_dtype xdt, bool mixed_terms)
{
	struct err e = {0};
	memset(m, 0, sizeof *m);
	m->name = name;
	m->out = out, m->in = in, m->TM = TM, m->ldx = ldx ? ldx : in, m->xdt = xdt;
	T_CHECK(kern_wmat_make_random(&m->w, KERN_WFMT_BF16, out, in, rng, &e) == ST_OK);
	m->x = gt_x_rand(rng, TM, in, m->ldx, xdt, 6, 1);
	if (mixed_terms && xdt == KERN_DT_F32) /* tile (r / 64, k / 32): 8, 16 or 24 significant bits */
		for (int64_t r = 0; r < TM; r++)
			for (int64_t k = 0; k < in; k++) {
				float *f = (float *)m->x + r * m->ldx + k;
				const int cat = (int)((r / 64 + k / 32) % 3);
				*f = cat == 0 ? keep_bits(*f, 8) : cat == 1 ? keep_bits(*f, 16) : *f;
			}
	m->yref = gt_malloc((size_t)(TM * out) * sizeof(float));
	struct kern_linear_args a = {.n_tokens = TM, .x = m->x, .x_dtype = xdt, .ldx = m->ldx, .y = m->yref,
				     .y_dtype = KERN_DT_F32, .w = &m->w};
	T_CHECKF(ref_par(&a) == ST_OK, "%s: reference failed", name);
	m->dx = gt_dup(m->x, (size_t)(TM * m->ldx) * kern_dtype_bytes(xdt));
	m->dw = m->w;
	m->dw.data = gt_dup(m->w.data, kern_wmat_data_bytes(&m->w));
	m->dw.owned = NULL;
}

static void mcase_free(struct mcase *m)
{
	free(m->x);
	free(m->yref);
	kern_wmat_release(&m->w);
}

/* v's run() on the first T rows, y of ydt with row stride out + pad,
 * poisoned; checked against the reference. Returns true on a pass. */
static bool run_T(const struct kern_variant *v, const struct mcase *m, int64_t T, enum kern_dtype ydt, int64_t pad)
{
	const int64_t ldy = m->out + pad, TM = m->TM;
	void *yg = gt_poisoned(ydt, TM, ldy);
	const size_t ybytes = (size_t)(TM * ldy) * kern_dtype_bytes(ydt);
	void *dy = NULL; /* freed here: the head's outputs are large and gt_dalloc keeps 256 buffers */
	T_CHECK(cudaMalloc(&dy, ybytes) == cudaSuccess);
	T_CHECK(cudaMemcpy(dy, yg, ybytes, cudaMemcpyHostToDevice) == cudaSuccess);
	struct kern_linear_args g = {.n_tokens = T, .x = m->dx, .x_dtype = m->xdt, .ldx = m->ldx, .y = dy,
				     .y_dtype = ydt, .ldy = ldy, .w = &m->dw, .stream = gt_stream};
	const enum status st = ((kern_linear_fn)v->run)(&g);
	gt_down(yg, dy, ybytes);
	char label[160];
	snprintf(label, sizeof label, "%s [%lld x %lld] T %lld x %s y %s ldx %lld ldy %lld", m->name, (long long)m->out,
		 (long long)m->in, (long long)T, m->xdt ? "bf16" : "f32", ydt ? "bf16" : "f32", (long long)m->ldx,
		 (long long)ldy);
	bool ok = gt_check_rows(v->name, label, st, m->yref, yg, ydt, T, m->out, ldy, ydt == KERN_DT_BF16 ? 1e-2 : 1e-4);
	int64_t stray = 0; /* rows T .. TM - 1: nothing may be written there */
	for (int64_t i = T * ldy; i < TM * ldy; i++)
		stray += !isnan(kern_load_f32(yg, ydt, i));
	T_CHECKF(stray == 0, "%s %s: %lld elements written in rows >= T", v->name, label, (long long)stray);
	free(yg);
	cudaFree(dy);
	return ok && stray == 0;
}

/* ---- guards and selection ---- */

static void expect_refusal(const struct kern_variant *v, const struct kern_device *dev, enum kern_wfmt f,
			   int64_t in, int64_t out, int64_t max_tokens, int aq, const char *want)
{
	struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = max_tokens, .act_quant_block = aq,
				       .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = f, .tp_size = 1, .shape = &sh};
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(!kern_variant_accepts(v, &p, dev, NULL, why, sizeof why), "%s accepted [%lld, %lld] max_tokens %lld",
		 v->name, (long long)out, (long long)in, (long long)max_tokens);
	gt_contains(why, want);
}

static void expect_pick(const struct kern_device *dev, int64_t out, int64_t in, int64_t max_tokens, const char *want)
{
	struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = max_tokens, .x_dtype = KERN_DT_F32,
				       .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = KERN_WFMT_BF16, .tp_size = 1, .shape = &sh};
	int dropped = 0;
	const struct kern_variant *got = gt_select_checked(&kern_op_linear, &p, dev, 0, &dropped);
	T_CHECKF(got && !strcmp(got->name, want), "[%lld x %lld] max_tokens %lld chose %s, expected %s",
		 (long long)out, (long long)in, (long long)max_tokens, got ? got->name : "nothing", want);
	T_CHECKF(dropped == 0, "max_tokens %lld: %d variant(s) failed their self-check", (long long)max_tokens, dropped);
}

static void guards(const struct kern_variant *gv, const struct kern_variant *mv, const struct kern_device *dev)
{
	expect_refusal(gv, dev, KERN_WFMT_BF16, 4096, 129280, 64, 0, "above the GEMV's 63");
	expect_refusal(gv, dev, KERN_WFMT_BF16, 4100, 256, 1, 0, "not a multiple of 8");
	expect_refusal(gv, dev, KERN_WFMT_BF16, 16392, 256, 1, 0, "above 16384");
	expect_refusal(gv, dev, KERN_WFMT_BF16, 4096, 256, 1, 128, "act_quant_block 128");
	expect_refusal(gv, dev, KERN_WFMT_FP8_E8M0_B128, 4096, 256, 1, 0, "weight format");
	expect_refusal(mv, dev, KERN_WFMT_BF16, 4096, 129280, 63, 0, "below one 64-token tile");
	expect_refusal(mv, dev, KERN_WFMT_BF16, 4112, 129280, 512, 0, "not a multiple of 32");
	expect_refusal(mv, dev, KERN_WFMT_F32, 4096, 129280, 512, 0, "weight format");

	/* run()'s own checks: other formats, act_quant, misaligned K; n_tokens 0 launches nothing. */
	_Alignas(16) uint64_t dummy[4] = {0}; /* run() checks the weight data is 16-byte aligned */
	struct kern_wmat fp8 = {.fmt = KERN_WFMT_FP8_F32_B128, .rows = 128, .cols = 128, .data = dummy, .scale = dummy};
	struct kern_wmat odd = {.fmt = KERN_WFMT_BF16, .rows = 128, .cols = 100, .data = dummy};
	struct kern_wmat ok = {.fmt = KERN_WFMT_BF16, .rows = 128, .cols = 128, .data = dummy};
	struct kern_linear_args a = {.n_tokens = 1, .w = &fp8};
	T_CHECK(kern_linear_gemv_bf16_cuda(&a) == ST_INVALID);
	T_CHECK(kern_linear_mma_bf16w(&a) == ST_INVALID);
	a.w = &odd;
	T_CHECK(kern_linear_gemv_bf16_cuda(&a) == ST_INVALID); /* 100 % 8 */
	T_CHECK(kern_linear_mma_bf16w(&a) == ST_INVALID);      /* 100 % 32 */
	a.w = &ok;
	a.act_quant_block = 128;
	T_CHECK(kern_linear_gemv_bf16_cuda(&a) == ST_INVALID);
	T_CHECK(kern_linear_mma_bf16w(&a) == ST_INVALID);
	a.act_quant_block = 0;
	a.n_tokens = 0;
	T_CHECK(kern_linear_gemv_bf16_cuda(&a) == ST_OK);
	T_CHECK(kern_linear_mma_bf16w(&a) == ST_OK);

	/* The head's plans: decode sizes take the GEMV, prefill sizes the MMA (self-checks included). */
	static const int64_t dec_T[] = {1, 16, 63}, pre_T[] = {64, 512, 8192};
	for (int i = 0; i < 3; i++) {
		expect_pick(dev, 129280, 4096, dec_T[i], gv->name);
		expect_pick(dev, 129280, 4096, pre_T[i], mv->name);
	}
	expect_pick(dev, 256, 4096, 16, gv->name); /* the router gate */
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	const struct kern_variant *gv = gt_find(&kern_op_linear, "linear_cuda_gemv_bf16");
	const struct kern_variant *mv = gt_find(&kern_op_linear, "linear_mma_bf16w");
	T_CHECK(gv && gv->run && mv && mv->run);
	if (!gv || !gv->run || !mv || !mv->run)
		return test_exit();
	uint64_t rng = gt_seed(argc, argv, &dev);
	gt_stream_create();
	guards(gv, mv, &dev);
	int failed = 0;

	/* The head at 64 tokens: the GEMV's T = 1, 2, 7, 16, 64 and the MMA's T = 64. */
	struct mcase m;
	mcase_init(&m, &rng, "lm_head", 129280, 4096, 64, 0, KERN_DT_F32, true);
	static const int64_t head_T[] = {1, 2, 7, 16, 64};
	for (int i = 0; i < 5; i++)
		failed += !run_T(gv, &m, head_T[i], (enum kern_dtype)(i & 1), i == 2 ? 5 : 0);
	failed += !run_T(mv, &m, 64, KERN_DT_F32, 0);
	failed += !run_T(mv, &m, 64, KERN_DT_BF16, 3);
	mcase_free(&m);
	gt_dfree_all();
	fprintf(stderr, "lm_head [129280 x 4096]: GEMV T = 1, 2, 7, 16, 64; MMA T = 64: %s\n", failed ? "FAILED" : "ok");

	/* GEMV, every T = 1..64: the router gate and ragged shapes. */
	static const struct {
		const char *name;
		int64_t out, in, ldx;
	} gshapes[] = {
		{"ffn.gate", 256, 4096, 0},
		{"ragged 1001x2056", 1001, 2056, 2060},
		{"wide-in 3000x7168", 3000, 7168, 0},
		{"tiny 5x8", 5, 8, 0},
	};
	for (int s = 0; s < 4; s++) {
		const enum kern_dtype xdt = (enum kern_dtype)(kern_rand_u64(&rng) & 1);
		mcase_init(&m, &rng, gshapes[s].name, gshapes[s].out, gshapes[s].in, 64, gshapes[s].ldx, xdt, false);
		int f = 0;
		for (int64_t T = 1; T <= 64 && !f; T++)
			f += !run_T(gv, &m, T, (enum kern_dtype)((T + s) & 1), T % 3 == 0 ? 3 : 0);
		fprintf(stderr, "GEMV %-20s [%5lld x %5lld] x %s: T = 1..64 %s\n", gshapes[s].name,
			(long long)gshapes[s].out, (long long)gshapes[s].in, xdt ? "bf16" : "f32 ", f ? "FAILED" : "ok");
		failed += f;
		mcase_free(&m);
		gt_dfree_all();
	}

	/* MMA on head slices at prompt sizes: [16384 x 4096] at T = 64, 100, 512
	 * (one reference of 512 rows), [2048 x 4096] at T = 4096 (64 row tiles, 4
	 * raster groups; a smaller slice keeps the CPU reference to ~35 G
	 * multiply-adds). */
	mcase_init(&m, &rng, "lm_head slice", 16384, 4096, 512, 0, KERN_DT_F32, true);
	static const int64_t pre_T[] = {64, 100, 512};
	for (int i = 0; i < 3; i++)
		failed += !run_T(mv, &m, pre_T[i], (enum kern_dtype)(i == 1), i == 2 ? 8 : 0);
	mcase_free(&m);
	gt_dfree_all();
	mcase_init(&m, &rng, "lm_head slice", 2048, 4096, 4096, 0, KERN_DT_F32, true);
	failed += !run_T(mv, &m, 4096, KERN_DT_F32, 0);
	failed += !run_T(mv, &m, 4000, KERN_DT_BF16, 5);
	mcase_free(&m);
	gt_dfree_all();
	fprintf(stderr, "lm_head slices: MMA [16384 x 4096] T = 64, 100, 512, [2048 x 4096] T = 4000, 4096: %s\n",
		failed ? "FAILED" : "ok");

	/* MMA, ragged: out not a multiple of 128, in one or three K tiles, strided x, bf16 x. */
	static const struct {
		const char *name;
		int64_t out, in, ldx;
		enum kern_dtype xdt;
	} mshapes[] = {
		{"ragged 1001x96", 1001, 96, 100, KERN_DT_F32},
		{"ragged 77x32", 77, 32, 0, KERN_DT_BF16},
		{"ffn.gate", 256, 4096, 0, KERN_DT_BF16},
	};
	for (int s = 0; s < 3; s++) {
		mcase_init(&m, &rng, mshapes[s].name, mshapes[s].out, mshapes[s].in, 130, mshapes[s].ldx, mshapes[s].xdt,
			   true);
		static const int64_t Ts[] = {1, 65, 130};
		int f = 0;
		for (int i = 0; i < 3; i++)
			f += !run_T(mv, &m, Ts[i], (enum kern_dtype)((i + s) & 1), i == 1 ? 3 : 0);
		fprintf(stderr, "MMA %-20s [%5lld x %5lld]: T = 1, 65, 130 %s\n", mshapes[s].name, (long long)mshapes[s].out,
			(long long)mshapes[s].in, f ? "FAILED" : "ok");
		failed += f;
		mcase_free(&m);
		gt_dfree_all();
	}
	fprintf(stderr, "%d case(s) failed\n", failed);
	return test_exit();
}

#else

int main(void)
{
	return test_skip("built without CUDA");
}

#endif
