/*
 * tests/kernels/test_select_sim.c (suite unit): selection of the
 * arch-specific variants on simulated devices, no GPU needed.
 *
 * The registry's capability guards, on a test-only table of sm_100a,
 * sm_120a and sm_121a rows with the guards such a kernel would have and no
 * run() (no kernel of ours exists for them): on kern_device_simulate(10,0),
 * (12,0) and (12,1) each must be refused for the right reason -- its own
 * capability: "not compiled into this binary"; another capability: "cc X
 * outside [...]"; a device whose probe did not load the image: "image ...
 * not loadable". Then the real tables: on those devices the portable
 * tensor-core or generic variants are chosen (CUDA builds), on a simulated
 * 9.0 the sm_90 variants (cuBLASLt FP8 linear, sm_90a FP4 expert GEMM) win.
 * The simulated device's `loadable` set is forced to what a real device of
 * that capability could load, so the verdicts do not depend on which images
 * this build contains; "chosen" checks need run() and so a CUDA build.
 * Also: linear_cublaslt_sm90's prepare() (fp8_f32_r128, per-row scales
 * replicated from the 128x128 blocks) decodes to exactly the stored weight,
 * E8M0 and f32 scales, with a partial last row block.
 */
#include <stdio.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_cublaslt.h"
#include "tests/test.h"

/* prepare() for the cuBLASLt variant: every decoded row equals the stored one. */
static void check_r128_prepare(enum kern_wfmt fmt)
{
	struct kern_wmat w, wp;
	struct err e = {0};
	uint64_t rng = 0x77u + (uint64_t)fmt;
	T_CHECK(kern_wmat_make_random(&w, fmt, 144, 640, &rng, &e) == ST_OK);
	T_CHECKF(kern_linear_cublaslt_prepare(&w, &wp, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wp.fmt == KERN_WFMT_FP8_F32_R128 && wp.data == w.data);
	T_CHECK(kern_wmat_scale_bytes(&wp) == (size_t)(144 * 5) * sizeof(float));
	float a[640], b[640];
	int bad = 0;
	for (int64_t r = 0; r < 144; r++) {
		kern_wmat_decode_row(&w, r, a);
		kern_wmat_decode_row(&wp, r, b);
		bad += memcmp(a, b, sizeof a) != 0;
	}
	T_CHECKF(bad == 0, "%s: %d rows of the fp8_f32_r128 copy decode differently", kern_wfmt_name(fmt), bad);
	struct kern_wmat sl;
	T_CHECK(kern_wmat_slice(&wp, 0, 128, 0, 640, &sl, &e) == ST_INVALID); /* prepared layouts are not sliced */
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
}

/* T_STR_CONTAINS on a char array trips -Waddress; take a pointer. */
static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

static const struct kern_variant *find(const struct kern_op *op, const char *name)
{
	for (int i = 0; i < op->n_variants; i++)
		if (!strcmp(op->variants[i].name, name))
			return &op->variants[i];
	return NULL;
}

/* A simulated cc major.minor whose probe loaded its native image and sm_80. */
static void sim(struct kern_device *d, int major, int minor)
{
	kern_device_simulate(d, major, minor);
	d->loadable = kern_target_native_for_cc(major, minor) | KERN_TARGET_SM80;
}

/* Test-only arch-specific rows (see the top): registry guards, no run(). */
#define SIM_FMTS (KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128) | KERN_WFMT_BIT(KERN_WFMT_MXFP4) | KERN_WFMT_BIT(KERN_WFMT_NVFP4))
static const struct kern_variant sim_sm100a = {.name = "sim_sm100a", .backend = KERN_BACKEND_CUDA, .cc_min = 100,
					       .cc_max = 100, .target = KERN_TARGET_SM100A,
					       .features = KERN_FEAT_TCGEN05, .wfmt_accept = SIM_FMTS, .priority = 30};
static const struct kern_variant sim_sm120a = {.name = "sim_sm120a", .backend = KERN_BACKEND_CUDA, .cc_min = 120,
					       .cc_max = 120, .target = KERN_TARGET_SM120A,
					       .features = KERN_FEAT_FP4_MMA_SYNC, .wfmt_accept = SIM_FMTS, .priority = 30};
static const struct kern_variant sim_sm121a = {.name = "sim_sm121a", .backend = KERN_BACKEND_CUDA, .cc_min = 121,
					       .cc_max = 121, .target = KERN_TARGET_SM121A,
					       .features = KERN_FEAT_FP4_MMA_SYNC, .wfmt_accept = SIM_FMTS, .priority = 30};

/* Variant v is refused for p on dev with a reason containing `want`. */
static void expect_refused_v(const struct kern_variant *v, const struct kern_problem *p,
			     const struct kern_device *dev, const char *want)
{
	const char *name = v->name;
	/* Format and shape guards come after the "compiled" check: in a build
	 * without this variant's code the refusal is that one. */
	if (!v->run && !strstr(want, "cc ") && !strstr(want, "image "))
		want = "not compiled into this binary";
	char why[KERN_REASON_BYTES] = "";
	bool ok = kern_variant_accepts(v, p, dev, NULL, why, sizeof why);
	T_CHECKF(!ok, "%s accepted on %s", name, dev->name);
	T_CHECKF(strstr(why, want) != NULL, "%s on %s: reason '%s', expected '%s'", name, dev->name, why, want);
}

/* Variant `name` of op is refused for p on dev with a reason containing `want`. */
static void expect_refused(const struct kern_op *op, const char *name, const struct kern_problem *p,
			   const struct kern_device *dev, const char *want)
{
	const struct kern_variant *v = find(op, name);
	T_CHECKF(v != NULL, "variant %s missing from op %s", name, op->name);
	if (v)
		expect_refused_v(v, p, dev, want);
}

/* The portable tensor-core variant a prefill plan gets on dev: "<base>_fp8_<image>"
 * when this build has dev's native image, else "<base>_bf16". */
static const char *mma_name(const char *base, const struct kern_device *dev)
{
	static char buf[8][64];
	static int next;
	char *b = buf[next++ % 8];
	const int cc = dev->cc_major * 10 + dev->cc_minor;
	const char *img = cc == 90 && DSV4_HAVE_SM_90A     ? "sm90a"
			  : cc == 100 && DSV4_HAVE_SM_100A ? "sm100a"
			  : cc == 120 && DSV4_HAVE_SM_120A ? "sm120a"
			  : cc == 121 && DSV4_HAVE_SM_121A ? "sm121a"
							   : NULL;
	if (img)
		snprintf(b, 64, "%s_fp8_%s", base, img);
	else
		snprintf(b, 64, "%s_bf16", base);
	return b;
}

/* In a CUDA build op selects `name` for p on dev; otherwise selection fails
 * and the error says the CUDA variants are not compiled. */
static void expect_chosen(const struct kern_op *op, const char *name, const struct kern_problem *p,
			  const struct kern_device *dev, bool needs_sm90a)
{
	const struct kern_variant *v = NULL;
	struct err e = {0};
	enum status st = kern_select(op, p, dev, NULL, 7, &v, &e);
	bool compiled = DSV4_HAVE_CUDA && (!needs_sm90a || DSV4_HAVE_SM_90A);
	if (compiled) {
		T_CHECKF(st == ST_OK && v && !strcmp(v->name, name), "op %s on %s: chose %s, expected %s (%s)", op->name,
			 dev->name, v ? v->name : "nothing", name, e.msg);
	} else if (st != ST_OK) {
		contains(e.msg, "not compiled into this binary");
	} else {
		T_CHECKF(v && strcmp(v->name, name) != 0, "op %s: %s chosen without being compiled", op->name, name);
	}
}

int main(void)
{
	struct kern_device d100, d120, d121, d90;
	sim(&d100, 10, 0);
	sim(&d120, 12, 0);
	sim(&d121, 12, 1);
	sim(&d90, 9, 0);

	/* ---- linear: the FP8 block-scaled layers (wq_a 4096 -> 1024) ---- */
	struct kern_linear_shape lsh = {.in = 4096, .out = 1024, .max_tokens = 256, .act_quant_block = 128,
					.x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
	struct kern_problem lp = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &lsh};
	expect_refused_v(&sim_sm100a, &lp, &d100, "not compiled into this binary");
	expect_refused_v(&sim_sm100a, &lp, &d120, "cc 12.0 outside [10.0, 10.0]");
	expect_refused_v(&sim_sm120a, &lp, &d120, "not compiled into this binary");
	expect_refused_v(&sim_sm120a, &lp, &d121, "cc 12.1 outside [12.0, 12.0]");
	expect_refused_v(&sim_sm121a, &lp, &d121, "not compiled into this binary");
	expect_refused_v(&sim_sm121a, &lp, &d100, "cc 10.0 outside [12.1, 12.1]");
	for (int i = 0; i < 3; i++) {
		const struct kern_device *d = i == 0 ? &d100 : i == 1 ? &d120 : &d121;
		char want[64];
		snprintf(want, sizeof want, "cc %d.%d outside [9.0, 9.0]", d->cc_major, d->cc_minor);
		expect_refused(&kern_op_linear, "linear_cublaslt_sm90", &lp, d, want);
		/* Prefill plan: the portable tensor-core linear (e4m3 with this device's image, else bf16). */
		expect_chosen(&kern_op_linear, mma_name("linear_mma", d), &lp, d, false);
	}
	/* A decode plan (max_tokens < 64) gets the portable FP8 GEMV (fp8gemv), on every GPU
	 * of cc >= 8.0; on cc 9.0 up to 16 tokens, cuBLASLt above. */
	struct kern_linear_shape dsh = lsh;
	dsh.max_tokens = 16;
	struct kern_problem dlp = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &dsh};
	expect_refused(&kern_op_linear, "linear_mma_bf16", &dlp, &d120, "below one 64-token tile");
	expect_refused(&kern_op_linear, "linear_cuda_gemv", &lp, &d120, "above the GEMV's 63");
	{
		struct kern_device d80g;
		sim(&d80g, 8, 0);
		const struct kern_device *dd[] = {&d80g, &d90, &d100, &d120, &d121};
		for (int i = 0; i < 5; i++)
			expect_chosen(&kern_op_linear, "linear_cuda_gemv", &dlp, dd[i], false);
		struct kern_linear_shape d63 = dsh;
		d63.max_tokens = 63;
		struct kern_problem p63 = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &d63};
		expect_chosen(&kern_op_linear, "linear_cuda_gemv", &p63, &d121, false);
		expect_refused(&kern_op_linear, "linear_cuda_gemv", &p63, &d90, "cuBLASLt is faster there");
		expect_chosen(&kern_op_linear, "linear_cublaslt_sm90", &p63, &d90, false);
		struct kern_linear_shape d_odd = dsh;
		d_odd.in = 4096 + 64;
		struct kern_problem p_odd = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &d_odd};
		expect_refused(&kern_op_linear, "linear_cuda_gemv", &p_odd, &d121, "not a multiple of 128");
		expect_chosen(&kern_op_linear, "linear_cuda_generic", &p_odd, &d121, false);
	}
	/* A GB10 whose probe failed to load the sm_121a image: refused by the probe. */
	struct kern_device d121_noimg = d121;
	d121_noimg.loadable &= ~KERN_TARGET_SM121A;
	expect_refused_v(&sim_sm121a, &lp, &d121_noimg, "image sm_121a not loadable");
	/* Hopper: cuBLASLt wins; its shape guard refuses what its scale layout cannot take. */
	expect_chosen(&kern_op_linear, "linear_cublaslt_sm90", &lp, &d90, false);
	struct kern_linear_shape odd = lsh;
	odd.in = 4096 + 128;
	struct kern_problem op_odd = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &odd};
	expect_refused(&kern_op_linear, "linear_cublaslt_sm90", &op_odd, &d90, "not a multiple of 512");
	expect_chosen(&kern_op_linear, mma_name("linear_mma", &d90), &op_odd, &d90, false);
	struct kern_linear_shape noq = lsh;
	noq.act_quant_block = 0;
	struct kern_problem op_noq = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &noq};
	expect_refused(&kern_op_linear, "linear_cublaslt_sm90", &op_noq, &d90, "act_quant_block 0");
	struct kern_problem op_bf16 = {.wfmt = KERN_WFMT_BF16, .tp_size = 1, .shape = &lsh};
	expect_refused(&kern_op_linear, "linear_cublaslt_sm90", &op_bf16, &d90, "weight format bf16 not accepted");

	/* ---- moe_gemm: NVFP4 and MXFP4 experts, w1 4096 -> 2048 ---- */
	for (int f = 0; f < 2; f++) {
		struct kern_moe_gemm_shape msh = {.in = 4096, .out = 2048, .n_experts = 256, .max_rows = 384,
						  .act_quant_block = 128, .x_dtype = KERN_DT_BF16,
						  .y_dtype = KERN_DT_BF16};
		struct kern_problem mp = {.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .tp_size = 1, .shape = &msh};
		expect_refused_v(&sim_sm100a, &mp, &d100, "not compiled into this binary");
		expect_refused_v(&sim_sm100a, &mp, &d121, "cc 12.1 outside [10.0, 10.0]");
		expect_refused_v(&sim_sm120a, &mp, &d120, "not compiled into this binary");
		expect_refused_v(&sim_sm120a, &mp, &d121, "cc 12.1 outside [12.0, 12.0]");
		expect_refused_v(&sim_sm121a, &mp, &d121, "not compiled into this binary");
		expect_refused_v(&sim_sm121a, &mp, &d120, "cc 12.0 outside [12.1, 12.1]");
		expect_refused_v(&sim_sm121a, &mp, &d121_noimg, "image sm_121a not loadable");
		for (int i = 0; i < 3; i++) {
			const struct kern_device *d = i == 0 ? &d100 : i == 1 ? &d120 : &d121;
			char want[64];
			snprintf(want, sizeof want, "cc %d.%d outside [9.0, 9.0]", d->cc_major, d->cc_minor);
			expect_refused(&kern_op_moe_gemm, "moe_gemm_sm90_fp4", &mp, d, want);
			expect_chosen(&kern_op_moe_gemm, mma_name("moe_gemm_mma", d), &mp, d, false);
		}
		expect_chosen(&kern_op_moe_gemm, "moe_gemm_sm90_fp4", &mp, &d90, true);
		/* An sm_90 device whose probe did not load the sm_90a image falls back. */
		struct kern_device d90_noimg = d90;
		d90_noimg.loadable &= ~KERN_TARGET_SM90A;
		expect_refused(&kern_op_moe_gemm, "moe_gemm_sm90_fp4", &mp, &d90_noimg, "image sm_90a not loadable");
		expect_refused(&kern_op_moe_gemm, "moe_gemm_mma_fp8_sm90a", &mp, &d90_noimg, "image sm_90a not loadable");
		expect_chosen(&kern_op_moe_gemm, "moe_gemm_mma_bf16", &mp, &d90_noimg, false);
	}
	struct kern_moe_gemm_shape fsh = {.in = 4096, .out = 2048, .n_experts = 8, .max_rows = 64};
	struct kern_problem fp8 = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = &fsh};
	expect_refused(&kern_op_moe_gemm, "moe_gemm_sm90_fp4", &fp8, &d90, "weight format fp8");

	/* ---- mHC: our generic CUDA ops are what every GPU gets (no DeepGEMM) ---- */
	const struct kern_op *hc_ops[] = {&kern_op_hc_prenorm, &kern_op_hc_split, &kern_op_hc_pre_combine,
					  &kern_op_hc_post};
	const char *hc_names[] = {"hc_prenorm_cuda_generic", "hc_split_cuda_generic", "hc_pre_combine_cuda_generic",
				  "hc_post_cuda_generic"};
	struct kern_problem hp = {.wfmt = KERN_WFMT_NONE, .tp_size = 1, .shape = NULL};
	struct kern_device d80;
	sim(&d80, 8, 0);
	const struct kern_device *all[] = {&d80, &d90, &d100, &d120, &d121};
	for (int o = 0; o < 4; o++)
		for (int i = 0; i < 5; i++)
			expect_chosen(hc_ops[o], hc_names[o], &hp, all[i], false);
	struct kern_device d75;
	kern_device_simulate(&d75, 7, 5);
	expect_refused(&kern_op_hc_prenorm, "hc_prenorm_cuda_generic", &hp, &d75, "cc 7.5 outside [8.0, any]");

	/* The CPU still gets the references. */
	struct kern_device cpu;
	kern_device_cpu(&cpu);
	const struct kern_variant *v = NULL;
	struct err e = {0};
	T_CHECK(kern_select(&kern_op_hc_prenorm, &hp, &cpu, NULL, 0, &v, &e) == ST_OK && v == &kern_op_hc_prenorm.variants[0]);
	T_CHECK(kern_select(&kern_op_moe_gemm, &fp8, &cpu, NULL, 0, &v, &e) == ST_OK && v == &kern_op_moe_gemm.variants[0]);
	check_r128_prepare(KERN_WFMT_FP8_E8M0_B128);
	check_r128_prepare(KERN_WFMT_FP8_F32_B128);
	return test_exit();
}
