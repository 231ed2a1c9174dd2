/*
 * kernels/linear/linear_variants.c: the registry table of op "linear", the
 * guards and prepare() steps of its variants, and its self-check.
 *
 * Variants (priority order, highest first):
 *   linear_cuda_generic  cc >= 8.0, sm_80 image; FP8 128x128 block scales in
 *                        f32 (E8M0 checkpoints are widened at load, exact).
 *                        Portable FMA kernel: the floor every GPU reaches.
 *   linear_cuda_generic_bf16  the same kernel for bf16 / f32 weights (lm_head,
 *                        router gate, dequantized checkpoints).
 *   linear_cpu_ref       the reference; every format, every shape.
 * Added by cuda-kernels-2 (rows at the end of the table):
 *   linear_cublaslt_sm90 cc 9.0 only; cuBLASLt FP8 x FP8 with 128x128 f32
 *                        weight scales and 1x128 activation scales
 *                        (activations quantized on the device first).
 *   linear_sm100a_fp8, linear_sm120a_fp8, linear_sm121a_fp8: guards only
 *                        (no run() yet), refused as "not compiled".
 */
#include "kernels/linear/linear.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsv4_config.h"
#include "kernels/linear/linear_cublaslt.h"

/* ---- guards ---- */

static bool linear_shape_ok(const struct kern_problem *p, char *why, size_t n)
{
	const struct kern_linear_shape *s = p->shape;
	if (!s) {
		snprintf(why, n, "no shape given");
		return false;
	}
	if (s->in <= 0 || s->out <= 0) {
		snprintf(why, n, "empty weight [%lld, %lld]", (long long)s->out, (long long)s->in);
		return false;
	}
	if (s->act_quant_block != 0 && s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d (0 or 128)", s->act_quant_block);
		return false;
	}
	return true;
}

static bool linear_cpu_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	return linear_shape_ok(p, why, n);
}

static bool linear_cuda_generic_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
					 size_t n)
{
	(void)dev;
	if (!linear_shape_ok(p, why, n))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->in > (1 << 24) || s->out > (1 << 24)) {
		snprintf(why, n, "dimension above 2^24");
		return false;
	}
	return true;
}

/* ---- guards of the cuda-kernels-2 variants ---- */

/* linear_cublaslt_sm90: FP8 x FP8 through cuBLASLt's DeepSeek block scaling.
 * in % 512: whole 128-wide K blocks and a 4-aligned count of them per row
 * (the scale layout cuBLASLt reads; linear_cublaslt.cu). out % 16: the FP8
 * path's 16-byte alignment of D. On a real device the heuristic is asked,
 * for T = 1 and T = max_tokens, whether it has an algorithm. */
static bool linear_cublaslt_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				     size_t n)
{
	if (!linear_shape_ok(p, why, n))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d: the FP8 x FP8 GEMM needs 128", s->act_quant_block);
		return false;
	}
	if (s->in % 512) {
		snprintf(why, n, "in %lld not a multiple of 512 (cuBLASLt 128x128 scale layout)", (long long)s->in);
		return false;
	}
	if (s->out % 16) {
		snprintf(why, n, "out %lld not a multiple of 16 (cuBLASLt FP8 alignment)", (long long)s->out);
		return false;
	}
	if (s->in > (1 << 24) || s->out > (1 << 24) || s->max_tokens > 65535) {
		snprintf(why, n, "dimension too large");
		return false;
	}
#if DSV4_HAVE_CUDA
	if (!dev->simulated) {
		if (!kern_linear_cublaslt_check(dev->index, s->in, s->out, 1, s->y_dtype, why, n))
			return false;
		if (s->max_tokens > 1 &&
		    !kern_linear_cublaslt_check(dev->index, s->in, s->out, s->max_tokens, s->y_dtype, why, n))
			return false;
	}
#else
	(void)dev;
#endif
	return true;
}

/* ---- prepare ---- */

/* FP8 with E8M0 scales -> FP8 with f32 scales (bit-exact widening); f32
 * scales pass through as a view. */
static enum status prepare_fp8_f32_scales(const struct kern_variant *v, const struct kern_wmat *in,
					  struct kern_wmat *out, struct err *e)
{
	(void)v;
	if (in->fmt == KERN_WFMT_FP8_E8M0_B128)
		return kern_wmat_widen_e8m0(in, out, e);
	if (in->fmt != KERN_WFMT_FP8_F32_B128)
		return err_set(e, ST_INVALID, "weight format %s", kern_wfmt_name(in->fmt));
	*out = *in;
	out->owned = NULL;
	return ST_OK;
}

/* ---- self-check ---- */

/* Keep a big dimension's remainder mod 128 (tails are where kernels go
 * wrong) while bounding the CPU reference's cost. */
static int64_t shrink_dim(int64_t n)
{
	return n <= 640 ? n : 512 + n % 128;
}

static enum status linear_selfcheck(const struct kern_op *op, const struct kern_variant *v,
				    const struct kern_problem *p, const struct kern_device *dev, struct err *e)
{
	(void)op;
	const struct kern_linear_shape *s = p->shape;
	if (!v->run_host || !s)
		return ST_OK;
	struct kern_linear_shape small = *s;
	small.in = shrink_dim(s->in);
	small.out = shrink_dim(s->out);
	small.max_tokens = 5;
	struct kern_problem sp = *p;
	sp.shape = &small;
	char why[KERN_REASON_BYTES];
	if (!kern_variant_accepts(v, &sp, dev, NULL, why, sizeof why))
		return ST_OK; /* the small stand-in is outside its limits: nothing to compare */

	uint64_t rng = 0x5eedull ^ (uint64_t)small.in * 131 ^ (uint64_t)small.out;
	int64_t T = small.max_tokens, in = small.in, out = small.out;
	struct kern_wmat w = {0}, wp = {0};
	enum status st = kern_wmat_make_random(&w, p->wfmt, out, in, &rng, e);
	if (st)
		return st;
	st = kern_prepare_weight(v, &w, &wp, e);
	if (st) {
		kern_wmat_release(&w);
		return st;
	}
	size_t xb = (size_t)(T * in) * 4;
	float *x = malloc(xb + (size_t)(T * out) * 8);
	if (!x) {
		kern_wmat_release(&wp);
		kern_wmat_release(&w);
		return err_set(e, ST_NOMEM, "linear self-check buffers");
	}
	float *y_ref = x + T * in, *y_got = y_ref + T * out;
	for (int64_t i = 0; i < T * in; i++)
		kern_store_f32(x, small.x_dtype, i, kern_rand_f32(&rng));
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = small.x_dtype, .y = y_ref,
				     .y_dtype = KERN_DT_F32, .w = &w, .act_quant_block = small.act_quant_block};
	st = kern_linear_ref(&a);
	if (st == ST_OK) {
		for (int64_t i = 0; i < T * out; i++)
			y_got[i] = NAN;
		a.w = &wp;
		a.y = y_got;
		a.y_dtype = small.y_dtype;
		st = ((kern_linear_fn)v->run_host)(&a);
		if (st)
			err_set(e, st, "%s: run failed: %s", v->name, status_str(st));
	} else {
		err_set(e, st, "reference failed: %s", status_str(st));
	}
	if (st == ST_OK) {
		if (small.y_dtype == KERN_DT_BF16) /* widen in place, back to front */
			for (int64_t i = T * out - 1; i >= 0; i--)
				y_got[i] = kern_load_f32(y_got, KERN_DT_BF16, i);
		double rtol = small.y_dtype == KERN_DT_BF16 ? 1e-2 : 2e-3;
		if (!kern_compare_f32(y_ref, y_got, (size_t)(T * out), 1e-6, rtol, why, sizeof why))
			st = err_set(e, ST_INVALID, "%s vs reference on [%lld x %lld] x [%lld x %lld]: %s", v->name,
				     (long long)T, (long long)in, (long long)out, (long long)in, why);
	}
	free(x);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
	return st;
}

/* ---- the table ---- */

#define LINEAR_ALL_FORMATS                                                                          \
	(KERN_WFMT_BIT(KERN_WFMT_F32) | KERN_WFMT_BIT(KERN_WFMT_BF16) |                              \
	 KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128) | KERN_WFMT_BIT(KERN_WFMT_FP8_F32_B128) |             \
	 KERN_WFMT_BIT(KERN_WFMT_MXFP4) | KERN_WFMT_BIT(KERN_WFMT_NVFP4))

static const struct kern_variant linear_variants[] = {
	{
		.name = "linear_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.wfmt_accept = LINEAR_ALL_FORMATS,
		.priority = 0,
		.supports = linear_cpu_supports,
		.run = KERN_FN(kern_linear_ref),
		.run_host = KERN_FN(kern_linear_ref),
		.desc = "CPU reference: per-row decode, f32 accumulation",
	},
	{
		.name = "linear_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128) | KERN_WFMT_BIT(KERN_WFMT_FP8_F32_B128),
		.wfmt_run = KERN_WFMT_FP8_F32_B128,
		.priority = 10,
		.supports = linear_cuda_generic_supports,
		.prepare = prepare_fp8_f32_scales,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_linear_cuda_generic),
		.run_host = KERN_FN(kern_linear_cuda_generic_host),
#endif
		.desc = "portable CUDA FP8 block-scaled linear (f32 FMA, f32 block scales)",
	},
	{
		.name = "linear_cuda_generic_bf16",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_BF16) | KERN_WFMT_BIT(KERN_WFMT_F32),
		.priority = 10,
		.supports = linear_cuda_generic_supports,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_linear_cuda_generic),
		.run_host = KERN_FN(kern_linear_cuda_generic_host),
#endif
		.desc = "portable CUDA linear for bf16 / f32 weights (lm_head, gate; f32 FMA)",
	},
	/* ---- cuda-kernels-2 ---- */
	{
		.name = "linear_cublaslt_sm90",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 90,
		.cc_max = 90,
		.target = KERN_TARGET_SM80, /* its act-quant kernel; the GEMM is cuBLASLt's */
		.features = KERN_FEAT_FP8_MMA,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128) | KERN_WFMT_BIT(KERN_WFMT_FP8_F32_B128),
		.wfmt_run = KERN_WFMT_FP8_F32_B128,
		.priority = 20,
		.supports = linear_cublaslt_supports,
		.prepare = prepare_fp8_f32_scales,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_linear_cublaslt),
		.run_host = KERN_FN(kern_linear_cublaslt_host),
#endif
		.desc = "cuBLASLt FP8 GEMM, BLK128x128 f32 weight scales x VEC128 activation scales (sm_90 only)",
	},
	/* Block-scaled FP8 tensor-core variants of later issues: real guards, no
	 * run() in this build, so selection refuses them ("not compiled into this
	 * binary") and falls through to the generic kernel. */
	{
		.name = "linear_sm100a_fp8",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 100,
		.cc_max = 100,
		.target = KERN_TARGET_SM100A,
		.features = KERN_FEAT_TCGEN05,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128),
		.priority = 30,
		.supports = linear_cuda_generic_supports,
		.desc = "tcgen05 kind::mxf8f6f4 with ue8m0 scales (not implemented yet)",
	},
	{
		.name = "linear_sm120a_fp8",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 120,
		.cc_max = 120,
		.target = KERN_TARGET_SM120A,
		.features = KERN_FEAT_FP4_MMA_SYNC,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128),
		.priority = 30,
		.supports = linear_cuda_generic_supports,
		.desc = "mma.sync kind::mxf8f6f4.block_scale ue8m0 (not implemented yet)",
	},
	{
		.name = "linear_sm121a_fp8",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 121,
		.cc_max = 121,
		.target = KERN_TARGET_SM121A,
		.features = KERN_FEAT_FP4_MMA_SYNC,
		.wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128),
		.priority = 30,
		.supports = linear_cuda_generic_supports,
		.desc = "mma.sync kind::mxf8f6f4.block_scale ue8m0 on GB10 (not implemented yet)",
	},
};

const struct kern_op kern_op_linear = {
	.name = "linear",
	.variants = linear_variants,
	.n_variants = (int)(sizeof linear_variants / sizeof linear_variants[0]),
	.selfcheck = linear_selfcheck,
};
