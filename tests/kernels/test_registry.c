/*
 * tests/kernels/test_registry.c: kernel selection against simulated devices
 * (cc 8.0, 9.0, 10.0, 12.0, 12.1 and the CPU), the image check, disable
 * lists, the all-refused error, the self-check drop, weight preparation
 * (E8M0 -> f32 widening, bit-exact) and plan records.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/test.h"

/* Arrays as plain pointers (T_STR_CONTAINS tests for NULL). */
static const char *str_(const char *s) { return s; }

static void dummy_run(void) {}

static bool refuse_odd_in(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	const int64_t *in = p->shape;
	if (in && (*in & 1)) {
		snprintf(why, n, "in %lld is odd", (long long)*in);
		return false;
	}
	return true;
}

#define ALL_IMAGES                                                                                   \
	(KERN_TARGET_SM80 | KERN_TARGET_SM90A | KERN_TARGET_SM100A | KERN_TARGET_SM120A | KERN_TARGET_SM121A)
#define FP8 KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128)

static const struct kern_variant fake_variants[] = {
	{.name = "fake_cpu", .backend = KERN_BACKEND_CPU, .wfmt_accept = FP8, .run = dummy_run},
	{.name = "fake_generic", .backend = KERN_BACKEND_CUDA, .cc_min = 80, .cc_max = KERN_CC_ANY,
	 .target = KERN_TARGET_SM80, .wfmt_accept = FP8, .priority = 10, .run = dummy_run},
	{.name = "fake_sm90", .backend = KERN_BACKEND_CUDA, .cc_min = 90, .cc_max = 90, .target = KERN_TARGET_SM90A,
	 .features = KERN_FEAT_WGMMA, .wfmt_accept = FP8, .priority = 20, .run = dummy_run},
	/* Deliberately wrong cc range: claims the whole 10.0-12.1 span. Only the
	 * image check keeps it off sm_120 / sm_121. */
	{.name = "fake_sm100", .backend = KERN_BACKEND_CUDA, .cc_min = 100, .cc_max = 121,
	 .target = KERN_TARGET_SM100A, .wfmt_accept = FP8, .priority = 30, .run = dummy_run},
	{.name = "fake_sm120", .backend = KERN_BACKEND_CUDA, .cc_min = 120, .cc_max = 121,
	 .target = KERN_TARGET_SM120A, .features = KERN_FEAT_FP4_MMA_SYNC, .wfmt_accept = FP8, .priority = 25,
	 .supports = refuse_odd_in, .run = dummy_run},
	{.name = "fake_sm121", .backend = KERN_BACKEND_CUDA, .cc_min = 121, .cc_max = 121,
	 .target = KERN_TARGET_SM121A, .wfmt_accept = FP8, .priority = 26, .supports = refuse_odd_in,
	 .run = dummy_run},
};
static const struct kern_op fake_op = {.name = "fake", .variants = fake_variants, .n_variants = 6};

/* A simulated device as a CUDA build with every image would see it. */
static void sim(struct kern_device *d, int major, int minor)
{
	kern_device_simulate(d, major, minor);
	d->compiled = ALL_IMAGES;
	uint32_t can = kern_target_native_for_cc(major, minor) | (major * 10 + minor >= 80 ? KERN_TARGET_SM80 : 0);
	d->loadable = d->compiled & can;
}

static const char *pick(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *d,
			const struct kern_disabled *dis, char *msg)
{
	const struct kern_variant *v = NULL;
	struct err e = {0};
	enum status st = kern_select(op, p, d, dis, 3, &v, &e);
	if (msg)
		snprintf(msg, ERR_MSG_BYTES, "%s", e.msg);
	return st ? NULL : v->name;
}

#define T_PICK(op, p, d, dis, want)                                                                   \
	do {                                                                                          \
		const char *got_ = pick(op, p, d, dis, NULL);                                          \
		T_CHECKF(got_ && !strcmp(got_, want), "%s: picked %s, want %s", (d)->name,              \
			 got_ ? got_ : "(none)", want);                                                \
	} while (0)

static void test_selection(void)
{
	struct kern_device cpu, d80, d90, d100, d120, d121;
	kern_device_cpu(&cpu);
	sim(&d80, 8, 0);
	sim(&d90, 9, 0);
	sim(&d100, 10, 0);
	sim(&d120, 12, 0);
	sim(&d121, 12, 1);
	int64_t in = 4096;
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &in};

	T_PICK(&fake_op, &p, &cpu, NULL, "fake_cpu");
	T_PICK(&fake_op, &p, &d80, NULL, "fake_generic");
	T_PICK(&fake_op, &p, &d90, NULL, "fake_sm90");
	T_PICK(&fake_op, &p, &d100, NULL, "fake_sm100");
	T_PICK(&fake_op, &p, &d120, NULL, "fake_sm120");
	T_PICK(&fake_op, &p, &d121, NULL, "fake_sm121");

	/* The sm_100a image is refused on 12.1 by the probe result although
	 * its cc range admits 12.1. */
	char why[KERN_REASON_BYTES];
	T_CHECK(!kern_variant_accepts(&fake_variants[3], &p, &d121, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "image sm_100a not loadable");
	T_CHECK(!kern_variant_accepts(&fake_variants[3], &p, &d120, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "image sm_100a");
	/* sm_120a does not load on sm_121 (a, not f): only the native image does. */
	T_CHECK(!kern_variant_accepts(&fake_variants[4], &p, &d121, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "image sm_120a");
	/* A device whose probe failed for its native image falls back to generic. */
	struct kern_device broken = d121;
	broken.loadable &= ~KERN_TARGET_SM121A;
	T_PICK(&fake_op, &p, &broken, NULL, "fake_generic");
	/* Features are checked too: a 9.0 whose features were masked. */
	struct kern_device nowgmma = d90;
	nowgmma.features &= ~KERN_FEAT_WGMMA;
	T_PICK(&fake_op, &p, &nowgmma, NULL, "fake_generic");
	T_CHECK(!kern_variant_accepts(&fake_variants[2], &p, &nowgmma, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "features");
	/* Below 8.0 no CUDA variant fits and the CPU variant does not run on a GPU. */
	struct kern_device d75;
	sim(&d75, 7, 5);
	char msg[ERR_MSG_BYTES];
	T_CHECK(pick(&fake_op, &p, &d75, NULL, msg) == NULL);
	T_STR_CONTAINS(str_(msg), "fake_generic: cc 7.5 outside [8.0, any]");

	/* supports(): odd in refuses the sm_12x variants with their reason. */
	int64_t odd = 4097;
	struct kern_problem po = p;
	po.shape = &odd;
	T_PICK(&fake_op, &po, &d121, NULL, "fake_generic");
	T_CHECK(!kern_variant_accepts(&fake_variants[5], &po, &d121, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "in 4097 is odd");

	/* Disabled variants are skipped; the next best is used. */
	struct kern_disabled dis;
	struct err e = {0};
	T_CHECK(kern_disabled_init(&dis, "fake_sm121", false, &e) == ST_OK);
	T_PICK(&fake_op, &p, &d121, &dis, "fake_generic");
	T_CHECK(kern_disabled_add(&dis, "fake_generic", &e) == ST_OK);
	T_CHECK(kern_disabled_add(&dis, "fake_generic", &e) == ST_OK);
	T_CHECK(dis.n == 2);
	T_CHECK(pick(&fake_op, &p, &d121, &dis, msg) == NULL);
	T_STR_CONTAINS(str_(msg), "fake_sm121: disabled");
	T_STR_CONTAINS(str_(msg), "fake_generic: disabled");
	/* From the environment, with spaces, merged with the CLI list. */
	setenv("DSV4_DISABLED_KERNELS", " fake_sm90 , fake_sm100,,", 1);
	T_CHECK(kern_disabled_init(&dis, "fake_sm121", true, &e) == ST_OK);
	T_CHECK(kern_disabled_has(&dis, "fake_sm90") && kern_disabled_has(&dis, "fake_sm100") &&
		kern_disabled_has(&dis, "fake_sm121") && dis.n == 3);
	T_PICK(&fake_op, &p, &d90, &dis, "fake_generic");
	T_PICK(&fake_op, &p, &d100, &dis, "fake_generic");
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK && dis.n == 0);
	unsetenv("DSV4_DISABLED_KERNELS");
	/* Name checks catch typos. */
	const struct kern_op *ops[] = {&fake_op, &kern_op_linear};
	T_CHECK(kern_disabled_init(&dis, "fake_sm90,linear_cpu_ref", false, &e) == ST_OK);
	T_CHECK(kern_disabled_check(&dis, ops, 2, &e) == ST_OK);
	T_CHECK(kern_disabled_init(&dis, "fake_sm90,linear_cpu_rfe", false, &e) == ST_OK);
	T_CHECK(kern_disabled_check(&dis, ops, 2, &e) == ST_NOTFOUND);
	T_STR_CONTAINS(str_(e.msg), "linear_cpu_rfe");
	/* The list is bounded: one name too many is an error, not a silent drop. */
	char many[KERN_MAX_DISABLED * 8 + 16] = "";
	for (int i = 0; i <= KERN_MAX_DISABLED; i++)
		snprintf(many + strlen(many), sizeof many - strlen(many), "%sk%d", i ? "," : "", i);
	err_clear(&e);
	T_CHECK(kern_disabled_init(&dis, many, false, &e) == ST_INVALID);
	T_STR_CONTAINS(str_(e.msg), "more than");
	char longname[100];
	memset(longname, 'x', sizeof longname - 1);
	longname[99] = 0;
	err_clear(&e);
	T_CHECK(kern_disabled_init(&dis, longname, false, &e) == ST_INVALID);
}

static void test_impossible(void)
{
	/* Every variant refuses: the error names layer, op, and each reason. */
	struct kern_device cpu;
	kern_device_cpu(&cpu);
	struct kern_problem p = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1};
	const struct kern_variant *v = (const void *)1;
	struct err e = {0};
	T_CHECK(kern_select(&fake_op, &p, &cpu, NULL, 7, &v, &e) == ST_UNSUPPORTED);
	T_CHECK(v == NULL);
	T_STR_CONTAINS(str_(e.msg), "layer 7");
	T_STR_CONTAINS(str_(e.msg), "op fake");
	T_STR_CONTAINS(str_(e.msg), "fake_cpu: weight format nvfp4 not accepted");
	for (int i = 1; i < fake_op.n_variants; i++) {
		char want[96];
		snprintf(want, sizeof want, "%s: cuda variant, cpu device", fake_variants[i].name);
		T_STR_CONTAINS(str_(e.msg), want);
	}
}

/* ---- self-check: a variant that disagrees is dropped ---- */

static enum status fake_selfcheck(const struct kern_op *op, const struct kern_variant *v,
				  const struct kern_problem *p, const struct kern_device *dev, struct err *e)
{
	(void)op, (void)p, (void)dev;
	if (!strcmp(v->name, "fake_sm121"))
		return err_set(e, ST_INVALID, "element 3: got nan");
	return ST_OK;
}

static void test_selfcheck_drop(void)
{
	struct kern_op op = fake_op;
	op.selfcheck = fake_selfcheck;
	struct kern_device d121;
	sim(&d121, 12, 1);
	int64_t in = 64;
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &in};
	struct kern_disabled dis;
	struct err e = {0};
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *v = NULL;
	T_CHECK(kern_select_checked(&op, &p, &d121, &dis, 5, &v, &e) == ST_OK);
	T_CHECK(v && !strcmp(v->name, "fake_generic"));
	T_CHECK(kern_disabled_has(&dis, "fake_sm121"));
}

/* A variant never run on hardware (selfcheck_at_load) is compared with the
 * reference by plain kern_select on a real device, never on a simulated one;
 * its drop does not touch the caller's (const) list. */
static int n_selfchecks;
static enum status counting_selfcheck(const struct kern_op *op, const struct kern_variant *v,
				      const struct kern_problem *p, const struct kern_device *dev, struct err *e)
{
	n_selfchecks++;
	return fake_selfcheck(op, v, p, dev, e);
}

static void test_selfcheck_at_load(void)
{
	struct kern_variant vars[6];
	memcpy(vars, fake_variants, sizeof vars);
	vars[5].selfcheck_at_load = true; /* fake_sm121, which fake_selfcheck fails */
	struct kern_op op = {.name = "fake", .variants = vars, .n_variants = 6, .selfcheck = counting_selfcheck};
	struct kern_device sim121, real121;
	sim(&sim121, 12, 1);
	real121 = sim121;
	real121.simulated = false; /* as kern_device_detect fills it on a GB10 */
	int64_t in = 64;
	struct kern_problem p = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &in};
	struct kern_disabled dis;
	struct err e = {0};
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *v = NULL;
	n_selfchecks = 0;
	T_CHECK(kern_select(&op, &p, &sim121, &dis, 2, &v, &e) == ST_OK);
	T_CHECK(v && !strcmp(v->name, "fake_sm121") && n_selfchecks == 0);
	T_CHECK(kern_select(&op, &p, &real121, &dis, 2, &v, &e) == ST_OK);
	T_CHECK(v && !strcmp(v->name, "fake_generic") && n_selfchecks >= 1);
	T_CHECK(dis.n == 0);
	/* passing its check, it is kept; unflagged winners are never checked */
	vars[5].name = "fake_sm121_ok";
	n_selfchecks = 0;
	T_CHECK(kern_select(&op, &p, &real121, &dis, 2, &v, &e) == ST_OK);
	T_CHECK(v && !strcmp(v->name, "fake_sm121_ok") && n_selfchecks == 1);
	vars[5].selfcheck_at_load = false;
	n_selfchecks = 0;
	T_CHECK(kern_select(&op, &p, &real121, &dis, 2, &v, &e) == ST_OK);
	T_CHECK(v && !strcmp(v->name, "fake_sm121_ok") && n_selfchecks == 0);
}

/* ---- weight preparation ---- */

static enum status bad_prepare(const struct kern_variant *v, const struct kern_wmat *in, struct kern_wmat *out,
			       struct err *e)
{
	(void)v, (void)e;
	*out = *in; /* claims FP8_F32 in the table but leaves E8M0: must be caught */
	out->owned = NULL;
	return ST_OK;
}

static void test_widen(uint64_t *rng)
{
	const struct kern_variant *gen = NULL;
	for (int i = 0; i < kern_op_linear.n_variants; i++)
		if (!strcmp(kern_op_linear.variants[i].name, "linear_cuda_generic"))
			gen = &kern_op_linear.variants[i];
	T_CHECK(gen && gen->prepare && gen->wfmt_run == KERN_WFMT_FP8_F32_B128);
	if (!gen)
		return;
	/* 2300 x 2200: 18 x 18 scale blocks (partial at both edges), scale
	 * codes cycling over all 255 finite E8M0 values. */
	struct kern_wmat w, wp;
	struct err e = {0};
	T_CHECK(kern_wmat_make_random(&w, KERN_WFMT_FP8_E8M0_B128, 2300, 2200, rng, &e) == ST_OK);
	size_t ns = kern_wmat_scale_bytes(&w);
	T_CHECK(ns == 18 * 18);
	for (size_t i = 0; i < ns; i++)
		((uint8_t *)w.owned)[(const uint8_t *)w.scale - (const uint8_t *)w.owned + i] = (uint8_t)(i % 255);
	T_CHECK(kern_prepare_weight(gen, &w, &wp, &e) == ST_OK);
	T_CHECK(wp.fmt == KERN_WFMT_FP8_F32_B128 && wp.data == w.data && wp.owned);
	int bad = 0;
	for (size_t i = 0; i < ns; i++) {
		float want = ldexpf(1.0f, (int)(i % 255) - 127);
		uint32_t a, b;
		memcpy(&a, &((const float *)wp.scale)[i], 4);
		memcpy(&b, &want, 4);
		bad += a != b;
	}
	T_CHECKF(bad == 0, "%d widened scales not bit-exact", bad);
	/* Decoding either form gives bit-identical weights. */
	float *r0 = malloc(2200 * sizeof(float)), *r1 = malloc(2200 * sizeof(float));
	bad = 0;
	for (int64_t r = 0; r < 2300; r += 129) {
		kern_wmat_decode_row(&w, r, r0);
		kern_wmat_decode_row(&wp, r, r1);
		bad += memcmp(r0, r1, 2200 * sizeof(float)) != 0;
	}
	T_CHECK(bad == 0);
	free(r0);
	free(r1);
	/* f32-scale input passes through as a view. */
	struct kern_wmat wp2;
	T_CHECK(kern_prepare_weight(gen, &wp, &wp2, &e) == ST_OK);
	T_CHECK(wp2.scale == wp.scale && wp2.owned == NULL);
	/* A prepare that does not produce the declared format is refused. */
	struct kern_variant liar = *gen;
	liar.prepare = bad_prepare;
	T_CHECK(kern_prepare_weight(&liar, &w, &wp2, &e) == ST_INVALID);
	T_STR_CONTAINS(str_(e.msg), "fp8_f32_b128");
	/* Widening anything but E8M0 is an error. */
	T_CHECK(kern_wmat_widen_e8m0(&wp, &wp2, &e) == ST_INVALID);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
	kern_wmat_release(NULL);
}

/* ---- the real tables ---- */

static void test_real_ops(void)
{
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	T_CHECK(n_ops >= 2);
	T_CHECK(kern_registry_find_op("linear") == &kern_op_linear);
	T_CHECK(kern_registry_find_op("moe_gemm") == &kern_op_moe_gemm);
	T_CHECK(kern_registry_find_op("nope") == NULL);
	for (int o = 0; o < n_ops; o++) {
		/* The first entry of every op is its CPU reference; names are unique. */
		T_CHECKF(ops[o]->n_variants > 0 && ops[o]->variants[0].backend == KERN_BACKEND_CPU &&
				 ops[o]->variants[0].run && ops[o]->variants[0].priority == 0,
			 "op %s: entry 0 must be a CPU reference", ops[o]->name);
		for (int v = 0; v < ops[o]->n_variants; v++)
			for (int p = 0; p < n_ops; p++)
				for (int w = 0; w < ops[p]->n_variants; w++)
					if (p != o || w != v)
						T_CHECKF(strcmp(ops[o]->variants[v].name, ops[p]->variants[w].name),
							 "duplicate name %s", ops[o]->variants[v].name);
	}
	struct kern_device cpu, d[5];
	kern_device_cpu(&cpu);
	int ccs[5][2] = {{8, 0}, {9, 0}, {10, 0}, {12, 0}, {12, 1}};
	for (int i = 0; i < 5; i++)
		kern_device_simulate(&d[i], ccs[i][0], ccs[i][1]);
	struct kern_linear_shape ls = {.in = 4096, .out = 1000, .max_tokens = 64, .act_quant_block = 128};
	struct kern_problem lp = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &ls};
	struct kern_moe_gemm_shape ms = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 384,
					 .act_quant_block = 128};
	struct kern_problem mp = {.wfmt = KERN_WFMT_MXFP4, .tp_size = 1, .shape = &ms};
	T_PICK(&kern_op_linear, &lp, &cpu, NULL, "linear_cpu_ref");
	T_PICK(&kern_op_moe_gemm, &mp, &cpu, NULL, "moe_gemm_cpu_ref");
	for (int i = 0; i < 5; i++) {
#if DSV4_HAVE_CUDA && DSV4_HAVE_SM_80
		/* Prefill plans (64 tokens, 384 expert rows; out 1000 is no cuBLASLt shape): the
		 * tensor-core variants, e4m3 where the build has the device's image, else bf16.
		 * cc 9.0 with the sm_90a image: the Hopper FP4 expert kernel still outranks
		 * the portable one. */
		static const bool have_img[5] = {false, DSV4_HAVE_SM_90A, DSV4_HAVE_SM_100A, DSV4_HAVE_SM_120A,
						 DSV4_HAVE_SM_121A};
		static const char *const lin_fp8[5] = {"", "linear_mma_fp8_sm90a", "linear_mma_fp8_sm100a",
						       "linear_mma_fp8_sm120a", "linear_mma_fp8_sm121a"};
		static const char *const moe_fp8[5] = {"", "moe_gemm_mma_fp8_sm90a", "moe_gemm_mma_fp8_sm100a",
						       "moe_gemm_mma_fp8_sm120a", "moe_gemm_mma_fp8_sm121a"};
		T_PICK(&kern_op_linear, &lp, &d[i], NULL, have_img[i] ? lin_fp8[i] : "linear_mma_bf16");
		T_PICK(&kern_op_moe_gemm, &mp, &d[i], NULL,
		       i == 1 && DSV4_HAVE_SM_90A ? "moe_gemm_sm90_fp4" : have_img[i] ? moe_fp8[i] : "moe_gemm_mma_bf16");
#else
		/* A CPU-only binary has no kernel for a GPU, and says why. */
		char msg[ERR_MSG_BYTES];
		T_CHECK(pick(&kern_op_linear, &lp, &d[i], NULL, msg) == NULL);
		T_STR_CONTAINS(str_(msg), "linear_cuda_generic: image sm_80 not loadable");
#endif
	}
	/* The report lists every variant with its verdict. */
	char rep[1024];
	size_t need = kern_select_report(&kern_op_linear, &lp, &cpu, NULL, rep, sizeof rep);
	T_CHECK(need == strlen(rep));
	T_STR_CONTAINS(str_(rep), "* linear_cpu_ref");
	T_STR_CONTAINS(str_(rep), "linear_cuda_generic");
	T_STR_CONTAINS(str_(rep), "refused: cuda variant, cpu device");
	/* MXFP4 with in not a multiple of 32 is refused with the reason. */
	ms.in = 4000 + 16;
	char why[KERN_REASON_BYTES];
	T_CHECK(!kern_variant_accepts(&kern_op_moe_gemm.variants[0], &mp, &cpu, NULL, why, sizeof why));
	T_STR_CONTAINS(str_(why), "block 32");
	/* NVFP4 on the linear CUDA variant: format refused. */
	struct kern_problem np = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &ls};
	T_CHECK(!kern_variant_accepts(&kern_op_linear.variants[1], &np, &d[4], NULL, why, sizeof why));
}

static void test_plan(void)
{
	struct kern_plan plan;
	struct err e = {0};
	kern_plan_init(&plan);
	for (int l = 0; l < 5; l++) {
		T_CHECK(kern_plan_add(&plan, l, &kern_op_linear, &kern_op_linear.variants[0], &e) == ST_OK);
		T_CHECK(kern_plan_add(&plan, l, &kern_op_moe_gemm,
				      &kern_op_moe_gemm.variants[l < 3 ? 0 : 1], &e) == ST_OK);
	}
	T_CHECK(kern_plan_add(&plan, -1, &kern_op_linear, &kern_op_linear.variants[0], &e) == ST_OK);
	T_CHECK(plan.n == 11);
	for (int i = 0; i < 300; i++) /* growth past the first allocation */
		T_CHECK(kern_plan_add(&plan, 100 + i, &kern_op_linear, &kern_op_linear.variants[0], &e) == ST_OK);
	T_CHECK(plan.n == 311 && plan.entries[310].layer == 399);
	plan.n = 11;
	size_t need = kern_plan_metrics(&plan, NULL, 0);
	char *buf = malloc(need + 1);
	T_CHECK(kern_plan_metrics(&plan, buf, need + 1) == need && strlen(buf) == need);
	T_STR_CONTAINS(str_(buf), "dsv4_kernel_info{layer=\"3\",op=\"moe_gemm\",kernel=\"moe_gemm_cuda_generic\"} 1\n");
	T_STR_CONTAINS(str_(buf), "dsv4_kernel_info{layer=\"none\",op=\"linear\",kernel=\"linear_cpu_ref\"} 1\n");
	char small[40];
	T_CHECK(kern_plan_metrics(&plan, small, sizeof small) == need && strlen(small) == sizeof small - 1);
	kern_plan_log(&plan);
	free(buf);
	kern_plan_free(&plan);
	kern_plan_free(NULL);
}

int main(void)
{
	uint64_t rng = test_seed();
	test_selection();
	test_impossible();
	test_selfcheck_drop();
	test_selfcheck_at_load();
	test_widen(&rng);
	test_real_ops();
	test_plan();
	return test_exit();
}
