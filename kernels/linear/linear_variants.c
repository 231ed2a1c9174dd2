/*
 * kernels/linear/linear_variants.c: the registry table of op "linear", the
 * guards and prepare() steps of its variants, and its self-check.
 *
 * Variants (priority order, highest first; the table's order is the
 * registry's, `dsv4 kernels` prints it):
 *   linear_cuda_gemv (22) cc >= 8.0, sm_80 image; FP8 128x128 block scales
 *                        (E8M0 widened at load); decode plans (max_tokens
 *                        < 64, where the 64-token tensor-core tiles refuse;
 *                        on cc 9.0 <= 16, where cuBLASLt keeps the larger
 *                        ones): the weight-streaming GEMV of linear_gemv.h.
 *   linear_cublaslt_sm90 (20) cc 9.0 only; cuBLASLt FP8 x FP8 with per-row
 *                        1x128 f32 weight scales (prepare() replicates the
 *                        128x128 block scales: fp8_f32_r128) and 1x128
 *                        activation scales (BLK128 for one token);
 *                        activations quantized on the device first. Accepted
 *                        only after its once-per-device numeric probe passed.
 *   linear_mma_fp8_<image> (15) cc 9.0, 10.0, 12.0, 12.1, one row per image:
 *                        portable e4m3 tensor-core GEMM for prefill plans
 *                        (linear_mma.h).
 *   linear_mma_bf16 (12) cc >= 8.0: the same on bf16 MMAs.
 *   linear_cuda_generic (10) cc >= 8.0, sm_80 image; FP8 128x128 block
 *                        scales in f32 (E8M0 checkpoints are widened at
 *                        load, exact). Portable FMA kernel: the floor every
 *                        GPU reaches.
 *   linear_cuda_generic_bf16 (10) the same kernel for bf16 / f32 weights
 *                        (lm_head, router gate, dequantized checkpoints).
 *   linear_cpu_ref (0)   the reference; every format, every shape.
 */
#include "kernels/linear/linear.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dsv4_config.h"
#include "kernels/linear/linear_cublaslt.h"
#include "kernels/linear/linear_gemv.h"
#include "kernels/linear/linear_mma.h"

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

/* ---- guards of the arch-specific variants ---- */

/* linear_cublaslt_sm90: FP8 x FP8 through cuBLASLt's block scaling.
 * in % 512: the VEC128 layouts need only whole 128-wide K blocks, but 512
 * is what the H200 runs cover (every DeepSeek-V4-Flash FP8 linear and its
 * TP=2 shards meet it), and kernels_linear_gpu's small-in sweep (act_quant
 * 0 or 128 at random, 1e-4 tolerance) is not made for this variant; relax
 * to 128 together with a GPU run of test_linear_cublaslt_gpu at in = 128 and 640.
 * out % 16: the FP8 path's 16-byte alignment of D and of each
 * K-block column of the weight's scales. out <= 65536: a padded 16-token
 * piece fits the 4 MiB stage. On a real device the numeric probe must have
 * passed and the heuristic is asked for the plans of T = 1, 2, 16 and
 * max_tokens (linear_cublaslt.h). */
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
		snprintf(why, n, "in %lld not a multiple of 512 (shapes validated on the H200)", (long long)s->in);
		return false;
	}
	if (s->out % 16) {
		snprintf(why, n, "out %lld not a multiple of 16 (cuBLASLt FP8 alignment)", (long long)s->out);
		return false;
	}
	if (s->in > (1 << 24) || s->out > KERN_LINEAR_LT_MAX_OUT || s->max_tokens > KERN_LINEAR_LT_MAX_TOKENS) {
		snprintf(why, n, "dimension too large (in <= 2^24, out <= %d, max_tokens <= %d)", KERN_LINEAR_LT_MAX_OUT,
			 KERN_LINEAR_LT_MAX_TOKENS);
		return false;
	}
#if DSV4_HAVE_CUDA
	if (!dev->simulated) {
		if (!kern_linear_cublaslt_probe(dev->index, why, n))
			return false;
		const int64_t Ts[4] = {1, 2, 16, s->max_tokens};
		for (int i = 0; i < 4; i++)
			if ((i == 0 || Ts[i] <= s->max_tokens) &&
			    !kern_linear_cublaslt_check(dev->index, s->in, s->out, Ts[i], s->y_dtype, why, n))
				return false;
	}
#else
	(void)dev;
#endif
	return true;
}

/* ---- guards of the portable tensor-core variants (prefill-kernels) ---- */

/* linear_mma_*: FP8 block-scaled GEMM tiles of 64 tokens x 128 outputs x 128 K
 * (linear_mma.h). act_quant 128 (the activations are FP8 codes); in % 128
 * (whole K blocks, aligned rows); max_tokens >= 64: a prefill-sized plan (the
 * kernel is correct for any n_tokens, but below one row tile the decode
 * GEMVs and the generic kernel are the better choice). On a real device the
 * FP8 rows also check that the loaded kernel is a cc >= 8.9 build. */
static bool linear_mma_supports_common(const struct kern_problem *p, char *why, size_t n)
{
	if (!linear_shape_ok(p, why, n))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d: the FP8 MMA needs 128", s->act_quant_block);
		return false;
	}
	if (s->in % 128) {
		snprintf(why, n, "in %lld not a multiple of 128", (long long)s->in);
		return false;
	}
	if (s->max_tokens < 64) {
		snprintf(why, n, "max_tokens %lld below one 64-token tile (decode plan)", (long long)s->max_tokens);
		return false;
	}
	if (s->in > (1 << 24) || s->out > (1 << 24) || s->max_tokens > 64 * 65535) {
		snprintf(why, n, "dimension too large (in, out <= 2^24, max_tokens <= %d)", 64 * 65535);
		return false;
	}
	return true;
}

static bool linear_mma_bf16_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	return linear_mma_supports_common(p, why, n);
}

static bool linear_mma_fp8_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!linear_mma_supports_common(p, why, n))
		return false;
#if DSV4_HAVE_CUDA
	if (!dev->simulated) {
		const int prev = kern_linear_cublaslt__set_device(dev->index);
		const bool ok = prev >= 0 && kern_linear_mma_fp8_compiled();
		if (prev >= 0 && prev != dev->index)
			(void)kern_linear_cublaslt__set_device(prev);
		if (!ok) {
			snprintf(why, n, "the FP8 MMA kernel loaded on device %d is not a cc >= 8.9 build", dev->index);
			return false;
		}
	}
#else
	(void)dev;
#endif
	return true;
}

/* ---- guard of the decode GEMV (fp8gemv) ---- */

/* linear_cuda_gemv: FP8 with act_quant 0 or 128, in % 128 (whole scale
 * blocks, 16-byte aligned weight rows), plans of up to
 * KERN_LINEAR_GEMV_MAX_TOKENS (63: decode and small batches; from one 64-row
 * tile on, the tensor-core variants take the plan, their run() serving its
 * small calls too). On cc 9.0 only up to LINEAR_GEMV_SM90_MAX_TOKENS: above
 * that cuBLASLt's FP8 tensor cores are expected to be faster than the GEMV's
 * f32 FMAs (the crossover is measured by bench_kernels' decode table; move
 * the bound with it). */
#define LINEAR_GEMV_SM90_MAX_TOKENS 16
static bool linear_gemv_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!linear_shape_ok(p, why, n))
		return false;
	const struct kern_linear_shape *s = p->shape;
	if (s->in % 128) {
		snprintf(why, n, "in %lld not a multiple of 128", (long long)s->in);
		return false;
	}
	if (s->max_tokens > KERN_LINEAR_GEMV_MAX_TOKENS) {
		snprintf(why, n, "max_tokens %lld above the GEMV's %d (a tensor-core tile plan)",
			 (long long)s->max_tokens, KERN_LINEAR_GEMV_MAX_TOKENS);
		return false;
	}
	if (dev && dev->cc_major == 9 && dev->cc_minor == 0 && s->max_tokens > LINEAR_GEMV_SM90_MAX_TOKENS) {
		snprintf(why, n, "max_tokens %lld above %d on cc 9.0 (cuBLASLt is faster there)", (long long)s->max_tokens,
			 LINEAR_GEMV_SM90_MAX_TOKENS);
		return false;
	}
	if (s->in > (1 << 24) || s->out > (1 << 24)) {
		snprintf(why, n, "dimension above 2^24");
		return false;
	}
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

/* FP8 with 128x128 E8M0 or f32 block scales -> fp8_f32_r128 for
 * linear_cublaslt_sm90: s[kb][o] = block_scale[o/128][kb], exact (E8M0
 * widened bit-exactly; an f32 scale copied). The data is shared. */
enum status kern_linear_cublaslt_prepare(const struct kern_wmat *in, struct kern_wmat *out, struct err *e)
{
	if (in->fmt != KERN_WFMT_FP8_E8M0_B128 && in->fmt != KERN_WFMT_FP8_F32_B128)
		return err_set(e, ST_INVALID, "cuBLASLt prepare: weight format %s", kern_wfmt_name(in->fmt));
	const int64_t rows = in->rows, nkb = (in->cols + 127) / 128;
	float *s = malloc((size_t)(rows * nkb) * sizeof(float) + 16);
	if (!s)
		return err_set(e, ST_NOMEM, "cuBLASLt prepare: %lld x %lld row scales", (long long)nkb, (long long)rows);
	for (int64_t o = 0; o < rows; o++)
		for (int64_t kb = 0; kb < nkb; kb++) {
			const int64_t bi = (o / 128) * nkb + kb;
			s[kb * rows + o] = in->fmt == KERN_WFMT_FP8_F32_B128 ? ((const float *)in->scale)[bi]
									 : kern_e8m0_to_f32(((const uint8_t *)in->scale)[bi]);
		}
	*out = *in;
	out->fmt = KERN_WFMT_FP8_F32_R128;
	out->scale = s;
	out->owned = s;
	return ST_OK;
}

static enum status prepare_cublaslt(const struct kern_variant *v, const struct kern_wmat *in, struct kern_wmat *out,
				    struct err *e)
{
	(void)v;
	return kern_linear_cublaslt_prepare(in, out, e);
}

#if DSV4_HAVE_CUDA
/* ---- the cuBLASLt variant's numeric probe (once per device) ---- */

#define LT_PROBE_DEVICES 16
static pthread_mutex_t lt_probe_mu = PTHREAD_MUTEX_INITIALIZER;
static int lt_probe_state[LT_PROBE_DEVICES]; /* 0 not run, 1 passed, -1 failed */
static char lt_probe_why[LT_PROBE_DEVICES][KERN_REASON_BYTES];

/* One comparison: T tokens through the variant vs the reference. */
static bool lt_probe_one(int64_t T, const struct kern_wmat *w, const struct kern_wmat *wp, uint64_t *rng, char *why,
			 size_t n)
{
	const int64_t in = w->cols, out = w->rows;
	float *x = malloc((size_t)(T * in + 2 * T * out) * sizeof(float));
	if (!x) {
		snprintf(why, n, "cuBLASLt probe: out of memory");
		return false;
	}
	float *yr = x + T * in, *yg = yr + T * out;
	/* Magnitudes vary per token and per 128 columns, so every activation scale differs. */
	float mag = 1.0f;
	for (int64_t t = 0; t < T; t++)
		for (int64_t k = 0; k < in; k++) {
			if (k % 128 == 0)
				mag = ldexpf(1.0f, (int)(kern_rand_u64(rng) % 9) - 4);
			x[t * in + k] = kern_rand_f32(rng) * mag;
		}
	for (int64_t i = 0; i < T * out; i++)
		yg[i] = NAN;
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = KERN_DT_F32, .y = yr, .y_dtype = KERN_DT_F32,
				     .w = w, .act_quant_block = 128};
	enum status st = kern_linear_ref(&a);
	bool ok = st == ST_OK;
	if (!ok)
		snprintf(why, n, "cuBLASLt probe: reference failed (%s)", status_str(st));
	if (ok) {
		a.w = wp;
		a.y = yg;
		st = kern_linear_cublaslt_host(&a);
		ok = st == ST_OK;
		if (!ok)
			snprintf(why, n, "cuBLASLt probe: T = %lld run failed (%s)", (long long)T, status_str(st));
	}
	char cw[KERN_REASON_BYTES];
	if (ok && !kern_compare_f32(yr, yg, (size_t)(T * out), 1e-6, 2e-3, cw, sizeof cw)) {
		snprintf(why, n, "cuBLASLt probe: T = %lld [%lld -> %lld] differs from the reference (scale layout?): %.80s",
			 (long long)T, (long long)in, (long long)out, cw);
		ok = false;
	}
	free(x);
	return ok;
}

bool kern_linear_cublaslt_probe(int device, char *why, size_t why_bytes)
{
	if (device < 0 || device >= LT_PROBE_DEVICES) {
		snprintf(why, why_bytes, "cuBLASLt probe: device index %d", device);
		return false;
	}
	pthread_mutex_lock(&lt_probe_mu);
	if (!lt_probe_state[device]) {
		char w[KERN_REASON_BYTES] = "";
		struct kern_wmat wb = {0}, wp = {0};
		struct err e = {0};
		uint64_t rng = 0x1b7a5eedull + (uint64_t)device;
		bool ok = kern_wmat_make_random(&wb, KERN_WFMT_FP8_F32_B128, 144, 512, &rng, &e) == ST_OK &&
			  kern_linear_cublaslt_prepare(&wb, &wp, &e) == ST_OK;
		if (!ok)
			snprintf(w, sizeof w, "cuBLASLt probe: %.140s", e.msg);
		const int prev = ok ? kern_linear_cublaslt__set_device(device) : -1;
		if (ok && prev < 0) {
			snprintf(w, sizeof w, "cuBLASLt probe: cannot select device %d", device);
			ok = false;
		}
		static const int64_t Ts[3] = {1, 7, 16}; /* BLK128 path; a direct piece + a staged 3; one piece */
		for (int i = 0; ok && i < 3; i++)
			ok = lt_probe_one(Ts[i], &wb, &wp, &rng, w, sizeof w);
		if (prev >= 0 && prev != device)
			(void)kern_linear_cublaslt__set_device(prev);
		kern_wmat_release(&wp);
		kern_wmat_release(&wb);
		lt_probe_state[device] = ok ? 1 : -1;
		memcpy(lt_probe_why[device], w, sizeof w);
		if (!ok)
			log_msg(LOG_WARN, "kernels", "linear_cublaslt_sm90 refused on device %d: %s", device, w);
	}
	const bool ok = lt_probe_state[device] > 0;
	if (!ok)
		snprintf(why, why_bytes, "%.*s", (int)KERN_REASON_BYTES - 1, lt_probe_why[device]);
	pthread_mutex_unlock(&lt_probe_mu);
	return ok;
}
#endif

/* ---- self-check ---- */

/* Keep a big dimension's remainder mod 128 (tails are where kernels go
 * wrong) while bounding the CPU reference's cost. */
static int64_t shrink_dim(int64_t n)
{
	return n <= 640 ? n : 512 + n % 128;
}

/* One comparison of v with the reference on T tokens of [out, in]. */
static enum status linear_selfcheck_one(const struct kern_variant *v, const struct kern_linear_shape *small,
					const struct kern_wmat *w, const struct kern_wmat *wp, int64_t T, uint64_t *rng,
					struct err *e)
{
	const int64_t in = small->in, out = small->out;
	float *x = malloc((size_t)(T * in) * 4 + (size_t)(T * out) * 8);
	if (!x)
		return err_set(e, ST_NOMEM, "linear self-check buffers");
	float *y_ref = x + T * in, *y_got = y_ref + T * out;
	for (int64_t i = 0; i < T * in; i++)
		kern_store_f32(x, small->x_dtype, i, kern_rand_f32(rng));
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = small->x_dtype, .y = y_ref,
				     .y_dtype = KERN_DT_F32, .w = w, .act_quant_block = small->act_quant_block};
	enum status st = kern_linear_ref(&a);
	if (st == ST_OK) {
		for (int64_t i = 0; i < T * out; i++)
			y_got[i] = NAN;
		a.w = wp;
		a.y = y_got;
		a.y_dtype = small->y_dtype;
		st = ((kern_linear_fn)v->run_host)(&a);
		if (st)
			err_set(e, st, "%s: run failed on T = %lld: %s", v->name, (long long)T, status_str(st));
	} else {
		err_set(e, st, "reference failed: %s", status_str(st));
	}
	if (st == ST_OK) {
		if (small->y_dtype == KERN_DT_BF16) /* widen in place, back to front */
			for (int64_t i = T * out - 1; i >= 0; i--)
				y_got[i] = kern_load_f32(y_got, KERN_DT_BF16, i);
		double rtol = small->y_dtype == KERN_DT_BF16 ? 1e-2 : 2e-3;
		char why[KERN_REASON_BYTES];
		if (!kern_compare_f32(y_ref, y_got, (size_t)(T * out), 1e-6, rtol, why, sizeof why))
			st = err_set(e, ST_INVALID, "%s vs reference on [%lld x %lld] x [%lld x %lld]: %s", v->name,
				     (long long)T, (long long)in, (long long)out, (long long)in, why);
	}
	free(x);
	return st;
}

/* T = 1 (decode; cuBLASLt's single-column path), 7 (a multiple-of-4 piece
 * plus a padded remainder) and 16, each on fresh activations; plans of 64
 * tokens or more also T = 65 (the tensor-core variants' row tile and a tail). */
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
	small.max_tokens = s->max_tokens >= 64 ? 65 : 16; /* prefill plans: one full 64-row tile and a tail */
	struct kern_problem sp = *p;
	sp.shape = &small;
	char why[KERN_REASON_BYTES];
	if (!kern_variant_accepts(v, &sp, dev, NULL, why, sizeof why))
		return ST_OK; /* the small stand-in is outside its limits: nothing to compare */

	uint64_t rng = 0x5eedull ^ (uint64_t)small.in * 131 ^ (uint64_t)small.out;
	struct kern_wmat w = {0}, wp = {0};
	enum status st = kern_wmat_make_random(&w, p->wfmt, small.out, small.in, &rng, e);
	if (st)
		return st;
	st = kern_prepare_weight(v, &w, &wp, e);
	static const int64_t Ts[4] = {1, 7, 16, 65};
	for (int i = 0; st == ST_OK && i < 4; i++)
		if (Ts[i] <= small.max_tokens)
			st = linear_selfcheck_one(v, &small, &w, &wp, Ts[i], &rng, e);
	kern_wmat_release(&wp);
	kern_wmat_release(&w);
	return st;
}

/* ---- the table ---- */

static const struct kern_variant linear_variants[] = {
	KERN_ROW_CPU_REF("linear_cpu_ref", kern_linear_ref, .wfmt_accept = KERN_WFMT_MASK_CHECKPOINT,
	                 .supports = linear_cpu_supports, .desc = "CPU reference: per-row decode, f32 accumulation"),
	KERN_ROW_SM80("linear_cuda_generic", 10, kern_linear_cuda_generic, kern_linear_cuda_generic_host,
	              .wfmt_accept = KERN_WFMT_MASK_FP8, .wfmt_run = KERN_WFMT_FP8_F32_B128,
	              .supports = linear_cuda_generic_supports, .prepare = prepare_fp8_f32_scales,
	              .desc = "portable CUDA FP8 block-scaled linear (f32 FMA, f32 block scales)"),
	KERN_ROW_SM80("linear_cuda_generic_bf16", 10, kern_linear_cuda_generic, kern_linear_cuda_generic_host,
	              .wfmt_accept = KERN_WFMT_BIT(KERN_WFMT_BF16) | KERN_WFMT_BIT(KERN_WFMT_F32),
	              .supports = linear_cuda_generic_supports,
	              .desc = "portable CUDA linear for bf16 / f32 weights (lm_head, gate; f32 FMA)"),
	/* ---- arch-specific: cuBLASLt FP8 on sm_90 (image: its act-quant kernel's; the GEMM is cuBLASLt's) ---- */
	KERN_ROW_CUDA("linear_cublaslt_sm90", 90, 90, KERN_TARGET_SM80, 20, DSV4_HAVE_CUDA, kern_linear_cublaslt,
	              kern_linear_cublaslt_host, .features = KERN_FEAT_FP8_MMA, .wfmt_accept = KERN_WFMT_MASK_FP8,
	              .wfmt_run = KERN_WFMT_FP8_F32_R128, .supports = linear_cublaslt_supports,
	              .prepare = prepare_cublaslt,
	              .desc = "cuBLASLt FP8 GEMM, VEC128 per-row weight scales x VEC128 (BLK128 at T = 1) activation scales (sm_90 only)"),
	/* ---- prefill-kernels: portable tensor-core FP8 linears (linear_mma.h) ----
	 * The e4m3 kernel is in every cc >= 8.9 image of the generic library (one
	 * row per image, so target says which); the bf16 one serves cc 8.0 - 8.8.
	 * Priority 15: above the generic FMA kernel, below cuBLASLt on sm_90
	 * (which the H200 benchmark compares it with). */
#define LINEAR_MMA_FP8_ROW(NAME, CC, TGT, HAVE)                                                               \
	KERN_ROW_CUDA(NAME, CC, CC, TGT, 15, HAVE, kern_linear_mma_fp8, kern_linear_mma_fp8_host,                  \
	              .features = KERN_FEAT_FP8_MMA, .wfmt_accept = KERN_WFMT_MASK_FP8,                              \
	              .wfmt_run = KERN_WFMT_FP8_F32_B128, .supports = linear_mma_fp8_supports,                       \
	              .prepare = prepare_fp8_f32_scales,                                                             \
	              .desc = "tensor-core FP8 linear: mma.sync m16n8k32 e4m3, f32 block scales per 128 K (T >= 64)")
	LINEAR_MMA_FP8_ROW("linear_mma_fp8_sm90a", 90, KERN_TARGET_SM90A, DSV4_HAVE_SM_90A),
	LINEAR_MMA_FP8_ROW("linear_mma_fp8_sm100a", 100, KERN_TARGET_SM100A, DSV4_HAVE_SM_100A),
	LINEAR_MMA_FP8_ROW("linear_mma_fp8_sm120a", 120, KERN_TARGET_SM120A, DSV4_HAVE_SM_120A),
	LINEAR_MMA_FP8_ROW("linear_mma_fp8_sm121a", 121, KERN_TARGET_SM121A, DSV4_HAVE_SM_121A),
#undef LINEAR_MMA_FP8_ROW
	KERN_ROW_SM80("linear_mma_bf16", 12, kern_linear_mma_bf16, kern_linear_mma_bf16_host,
	              .features = KERN_FEAT_BF16_MMA, .wfmt_accept = KERN_WFMT_MASK_FP8,
	              .wfmt_run = KERN_WFMT_FP8_F32_B128, .supports = linear_mma_bf16_supports,
	              .prepare = prepare_fp8_f32_scales,
	              .desc = "tensor-core FP8 linear on bf16 mma.sync m16n8k16 (e4m3 decoded exactly; cc >= 8.0, T >= 64)"),
	/* ---- fp8gemv: the portable decode GEMV (linear_gemv.h) ---- */
	KERN_ROW_SM80("linear_cuda_gemv", 22, kern_linear_gemv_cuda, kern_linear_gemv_cuda_host,
	              .wfmt_accept = KERN_WFMT_MASK_FP8, .wfmt_run = KERN_WFMT_FP8_F32_B128,
	              .supports = linear_gemv_supports, .prepare = prepare_fp8_f32_scales,
	              .desc = "decode FP8 GEMV / skinny GEMM, T <= 64 (16-byte e4m3 loads decoded in registers, f32 FMA)"),
};

const struct kern_op kern_op_linear = {
	.name = "linear",
	.variants = linear_variants,
	.n_variants = (int)(sizeof linear_variants / sizeof linear_variants[0]),
	.selfcheck = linear_selfcheck,
};

size_t kern_linear_workspace_bytes(const struct kern_variant *v, int64_t max_tokens, int64_t in)
{
#if DSV4_HAVE_CUDA
	if (v && kern_variant_base(v)->run == KERN_FN(kern_linear_cublaslt)) /* base: profiled copies */
		return kern_linear_cublaslt_workspace_bytes(max_tokens, in);
#else
	(void)max_tokens;
	(void)in;
#endif
	(void)v;
	return 0;
}
