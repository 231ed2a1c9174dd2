/*
 * kernels/moe_gemm/moe_gemm_variants.c: the registry table of op
 * "moe_gemm", its guards and its self-check.
 *
 * Variants (priority order, highest first):
 *   moe_gemm_cuda_gemv (25) cc >= 8.0, sm_80 image; MXFP4/NVFP4; plans with
 *                          max_rows <= 64 (decode): memory-bound GEMV
 *                          (moe_gemv.h).
 *   moe_gemm_mma_fp8_<image> (22; 19 on sm_90) cc 9.0, 10.0, 12.0, 12.1:
 *                          portable e4m3 tensor-core FP4 expert GEMM for
 *                          prefill plans (moe_gemm_mma.h).
 *   moe_gemm_sm90_fp4 (20) cc 9.0, sm_90a image; MXFP4/NVFP4 unpacked in
 *                          registers to bf16, mma.sync m16n8k16.
 *   moe_gemm_mma_bf16 (15) cc >= 8.0: the tensor-core GEMM on bf16 MMAs.
 *   moe_gemm_cuda_generic (10) cc >= 8.0, sm_80 image; MXFP4, NVFP4 or FP8
 *                          experts read as stored (W4A16-style: e2m1 decoded
 *                          in shared memory, f32 FMA). The floor on every GPU.
 *   moe_gemm_cpu_ref (0)   the reference; every weight format.
 */
#include "kernels/moe_gemm/moe_gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsv4_config.h"
#include "kernels/moe_gemm/moe_gemm_mma.h"
#include "kernels/moe_gemm/moe_gemm_sm90.h"
#include "kernels/moe_gemm/moe_gemv.h"

/* ---- guards ---- */

static bool moe_shape_ok(const struct kern_problem *p, char *why, size_t n)
{
	const struct kern_moe_gemm_shape *s = p->shape;
	if (!s) {
		snprintf(why, n, "no shape given");
		return false;
	}
	if (s->in <= 0 || s->out <= 0 || s->n_experts <= 0) {
		snprintf(why, n, "empty problem: %lld experts of [%lld, %lld]", (long long)s->n_experts,
			 (long long)s->out, (long long)s->in);
		return false;
	}
	int bc = kern_wfmt_block_cols(p->wfmt);
	if ((p->wfmt == KERN_WFMT_MXFP4 || p->wfmt == KERN_WFMT_NVFP4) && s->in % bc) {
		snprintf(why, n, "in %lld not a multiple of %s's block %d", (long long)s->in, kern_wfmt_name(p->wfmt),
			 bc);
		return false;
	}
	if (s->act_quant_block != 0 && s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d (0 or 128)", s->act_quant_block);
		return false;
	}
	return true;
}

static bool moe_cpu_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	return moe_shape_ok(p, why, n);
}

static bool moe_cuda_generic_supports(const struct kern_problem *p, const struct kern_device *dev, char *why,
				      size_t n)
{
	(void)dev;
	if (!moe_shape_ok(p, why, n))
		return false;
	const struct kern_moe_gemm_shape *s = p->shape;
	bool fp4 = p->wfmt == KERN_WFMT_MXFP4 || p->wfmt == KERN_WFMT_NVFP4;
	if (fp4 && s->in % 32) {
		snprintf(why, n, "in %lld not a multiple of 32", (long long)s->in);
		return false;
	}
	if (s->max_rows > INT32_MAX / 2) {
		snprintf(why, n, "max_rows %lld too large", (long long)s->max_rows);
		return false;
	}
	return true;
}

/* f32 activations without the FP8 act_quant (fp32 precision, the golden
 * comparisons): the bf16 tensor-core paths split them into two bf16 halves,
 * which leaves a 2^-16 relative residual per element (1e-5 on the logits,
 * enough to flip an indexer top-k tie); the generic kernel is exact there. */
static bool moe_bf16_split_ok(const struct kern_problem *p, char *why, size_t n)
{
	const struct kern_moe_gemm_shape *s = p->shape;
	if (!s->act_quant_block && s->x_dtype == KERN_DT_F32) {
		snprintf(why, n, "f32 activations without act_quant (bf16 split, not exact)");
		return false;
	}
	return true;
}

/* The FP4 tensor-core variants: MXFP4 / NVFP4 only, in % 32. */
static bool moe_fp4_mma_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!moe_cuda_generic_supports(p, dev, why, n))
		return false;
	if (p->wfmt != KERN_WFMT_MXFP4 && p->wfmt != KERN_WFMT_NVFP4) {
		snprintf(why, n, "FP4 experts only");
		return false;
	}
	return moe_bf16_split_ok(p, why, n);
}

/* ---- moe gemv ---- */
/* The decode GEMV: FP4 only, and only for plans whose largest batch is small
 * (max_rows bounds every expert's rows; the kernel chunks an expert by 8
 * rows), with activations it can stage as bf16 and a staged row that fits
 * the device's shared memory: every refusal here is what run() cannot do,
 * so run() never hands work to another kernel itself. */
static bool moe_gemv_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!moe_fp4_mma_supports(p, dev, why, n))
		return false;
	const struct kern_moe_gemm_shape *s = p->shape;
	if (s->max_rows > KERN_MOE_GEMV_MAX_ROWS) {
		snprintf(why, n, "max_rows %lld above the GEMV's %d", (long long)s->max_rows, KERN_MOE_GEMV_MAX_ROWS);
		return false;
	}
	if (s->x_dtype != KERN_DT_BF16 && s->act_quant_block == 0) {
		snprintf(why, n, "f32 x without act_quant (the GEMV stages bf16)");
		return false;
	}
	if (dev && dev->smem_optin_bytes < kern_moe_gemv_min_smem(s->in)) {
		snprintf(why, n, "in %lld needs %lld B of shared memory, device has %d", (long long)s->in,
			 (long long)kern_moe_gemv_min_smem(s->in), dev->smem_optin_bytes);
		return false;
	}
	return true;
}

/* ---- prefill-kernels: the portable tensor-core FP4 expert GEMM (moe_gemm_mma.h) ----
 * FP4 experts with FP8 activations (act_quant 128), in % 128 (whole K blocks),
 * plans of >= 64 rows (prefill; smaller calls of such a plan go to the GEMV
 * inside run()). The FP8 rows check on a real device that the loaded kernels
 * are cc >= 8.9 builds. */
static bool moe_mma_supports_common(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!moe_fp4_mma_supports(p, dev, why, n))
		return false;
	const struct kern_moe_gemm_shape *s = p->shape;
	if (s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d: the FP8 MMA needs 128", s->act_quant_block);
		return false;
	}
	if (s->in % 128) {
		snprintf(why, n, "in %lld not a multiple of 128", (long long)s->in);
		return false;
	}
	if (s->max_rows < 64) {
		snprintf(why, n, "max_rows %lld below one 64-row tile (decode plan)", (long long)s->max_rows);
		return false;
	}
	if (s->max_rows / 64 + s->n_experts > 65535) {
		snprintf(why, n, "max_rows %lld: more than 65535 row tiles", (long long)s->max_rows);
		return false;
	}
	return true;
}

static bool moe_mma_bf16_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	return moe_mma_supports_common(p, dev, why, n);
}

static bool moe_mma_fp8_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!moe_mma_supports_common(p, dev, why, n))
		return false;
#if DSV4_HAVE_CUDA
	if (!dev->simulated && !kern_moe_gemm_mma_fp8_compiled_on(dev->index)) {
		snprintf(why, n, "the FP8 MMA kernels loaded on device %d are not cc >= 8.9 builds", dev->index);
		return false;
	}
#endif
	return true;
}

/* ---- self-check ---- */

static int64_t shrink_dim(int64_t n, int64_t mult)
{
	if (n <= 512)
		return n;
	int64_t r = 256 + n % 128;
	return (r + mult - 1) / mult * mult;
}

static enum status moe_selfcheck(const struct kern_op *op, const struct kern_variant *v,
				 const struct kern_problem *p, const struct kern_device *dev, struct err *e)
{
	(void)op;
	const struct kern_moe_gemm_shape *s = p->shape;
	if (!v->run_host || !s)
		return ST_OK;
	struct kern_moe_gemm_shape small = *s;
	int64_t mult = kern_wfmt_block_cols(p->wfmt) > 0 ? kern_wfmt_block_cols(p->wfmt) : 1;
	small.in = shrink_dim(s->in, mult < 32 ? 32 : mult);
	small.out = shrink_dim(s->out, 1);
	small.n_experts = s->n_experts < 4 ? s->n_experts : 4;
	small.max_rows = s->max_rows >= 64 ? 70 : 9; /* prefill plans: past the GEMV's 64 rows */
	struct kern_problem sp = *p;
	sp.shape = &small;
	char why[KERN_REASON_BYTES];
	if (!kern_variant_accepts(v, &sp, dev, NULL, why, sizeof why))
		return ST_OK;

	uint64_t rng = 0xfeedull ^ (uint64_t)small.in * 977 ^ (uint64_t)small.out;
	int64_t E = small.n_experts, R = small.max_rows, X = 4, in = small.in, out = small.out;
	struct kern_wmat w[4] = {0}, wp[4] = {0};
	int32_t off[5], src[70];
	enum status st = ST_OK;
	for (int64_t x = 0; x < E && !st; x++) {
		st = kern_wmat_make_random(&w[x], p->wfmt, out, in, &rng, e);
		if (!st)
			st = kern_prepare_weight(v, &w[x], &wp[x], e);
	}
	float *xb = st ? NULL : malloc((size_t)(X * in + 2 * R * out) * sizeof(float));
	if (!st && !xb)
		st = err_set(e, ST_NOMEM, "moe_gemm self-check buffers");
	if (!st) {
		float *y_ref = xb + X * in, *y_got = y_ref + R * out;
		for (int64_t i = 0; i < X * in; i++)
			kern_store_f32(xb, small.x_dtype, i, kern_rand_f32(&rng));
		/* Rows spread over the experts, the last expert possibly empty. */
		off[0] = 0;
		for (int64_t x = 0; x < E; x++)
			off[x + 1] = x + 1 == E ? (int32_t)R : (int32_t)((R * (x + 1)) / (E + 1));
		for (int64_t r = 0; r < R; r++)
			src[r] = (int32_t)(kern_rand_u64(&rng) % (uint64_t)X);
		struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
					       .n_x_rows = X, .x = xb, .x_dtype = small.x_dtype, .y = y_ref,
					       .y_dtype = KERN_DT_F32, .w = w, .act_quant_block = small.act_quant_block};
		st = kern_moe_gemm_ref(&a);
		if (st) {
			err_set(e, st, "reference failed: %s", status_str(st));
		} else {
			for (int64_t i = 0; i < R * out; i++)
				y_got[i] = NAN;
			a.w = wp;
			a.y = y_got;
			a.y_dtype = small.y_dtype;
			st = ((kern_moe_gemm_fn)v->run_host)(&a);
			if (st)
				err_set(e, st, "%s: run failed: %s", v->name, status_str(st));
		}
		if (!st) {
			if (small.y_dtype == KERN_DT_BF16)
				for (int64_t i = R * out - 1; i >= 0; i--)
					y_got[i] = kern_load_f32(y_got, KERN_DT_BF16, i);
			double rtol = small.y_dtype == KERN_DT_BF16 ? 1e-2 : 2e-3;
			if (!kern_compare_f32(y_ref, y_got, (size_t)(R * out), 1e-6, rtol, why, sizeof why))
				st = err_set(e, ST_INVALID, "%s vs reference (%s, %lld experts, [%lld, %lld]): %s", v->name,
					     kern_wfmt_name(p->wfmt), (long long)E, (long long)out, (long long)in, why);
		}
	}
	free(xb);
	for (int64_t x = 0; x < E; x++) {
		kern_wmat_release(&wp[x]);
		kern_wmat_release(&w[x]);
	}
	return st;
}

/* ---- the table ---- */

static const struct kern_variant moe_gemm_variants[] = {
	KERN_ROW_CPU_REF("moe_gemm_cpu_ref", kern_moe_gemm_ref, .wfmt_accept = KERN_WFMT_MASK_CHECKPOINT,
	                 .supports = moe_cpu_supports,
	                 .desc = "CPU reference: per-expert row decode, f32 accumulation"),
	KERN_ROW_SM80("moe_gemm_cuda_generic", 10, kern_moe_gemm_cuda_generic, kern_moe_gemm_cuda_generic_host,
	              .wfmt_accept = KERN_WFMT_MASK_CHECKPOINT, .supports = moe_cuda_generic_supports,
	              .desc = "portable CUDA grouped expert GEMM, MXFP4/NVFP4/FP8/bf16/f32 experts (f32 FMA)"),
	/* ---- arch-specific: FP4 mma.sync on sm_90a ---- */
	KERN_ROW_CUDA("moe_gemm_sm90_fp4", 90, 90, KERN_TARGET_SM90A, 20, DSV4_HAVE_SM_90A, kern_moe_gemm_sm90_fp4,
	              kern_moe_gemm_sm90_fp4_host, .features = KERN_FEAT_BF16_MMA, .wfmt_accept = KERN_WFMT_MASK_FP4,
	              .supports = moe_fp4_mma_supports,
	              .desc = "Hopper W4A16 expert GEMM: e2m1 unpacked in registers to bf16, mma.sync m16n8k16"),
	/* ---- moe gemv ---- */
	KERN_ROW_SM80("moe_gemm_cuda_gemv", 25, kern_moe_gemv_cuda, kern_moe_gemv_cuda_host,
	              .wfmt_accept = KERN_WFMT_MASK_FP4, .supports = moe_gemv_supports,
	              .desc = "decode expert GEMV, MXFP4/NVFP4 (warp per 2 outputs, 16-byte e2m1 loads, f32 FMA)"),
	/* ---- prefill-kernels: portable tensor-core FP4 expert GEMMs (moe_gemm_mma.h) ----
	 * e4m3 mma.sync in every cc >= 8.9 image (one row per image), bf16 in the
	 * sm_80 one. Priority 22 above the generic kernel and below the decode
	 * GEMV (which refuses plans above 64 rows); on sm_90 19, below
	 * moe_gemm_sm90_fp4 until the H200 benchmark has compared the two. */
#define MOE_MMA_FP8_ROW(NAME, CC, TGT, HAVE, PRIO)                                                            \
	KERN_ROW_CUDA(NAME, CC, CC, TGT, PRIO, HAVE, kern_moe_gemm_mma_fp8, kern_moe_gemm_mma_fp8_host,            \
	              .features = KERN_FEAT_FP8_MMA, .wfmt_accept = KERN_WFMT_MASK_FP4,                              \
	              .supports = moe_mma_fp8_supports,                                                              \
	              .desc = "tensor-core FP4 expert GEMM: e2m1 -> e4m3 in registers, mma.sync m16n8k32, "         \
	                      "f32 block scales (>= 64-row plans)")
	MOE_MMA_FP8_ROW("moe_gemm_mma_fp8_sm90a", 90, KERN_TARGET_SM90A, DSV4_HAVE_SM_90A, 19),
	MOE_MMA_FP8_ROW("moe_gemm_mma_fp8_sm100a", 100, KERN_TARGET_SM100A, DSV4_HAVE_SM_100A, 22),
	MOE_MMA_FP8_ROW("moe_gemm_mma_fp8_sm120a", 120, KERN_TARGET_SM120A, DSV4_HAVE_SM_120A, 22),
	MOE_MMA_FP8_ROW("moe_gemm_mma_fp8_sm121a", 121, KERN_TARGET_SM121A, DSV4_HAVE_SM_121A, 22),
#undef MOE_MMA_FP8_ROW
	KERN_ROW_SM80("moe_gemm_mma_bf16", 15, kern_moe_gemm_mma_bf16, kern_moe_gemm_mma_bf16_host,
	              .features = KERN_FEAT_BF16_MMA, .wfmt_accept = KERN_WFMT_MASK_FP4,
	              .supports = moe_mma_bf16_supports,
	              .desc = "tensor-core FP4 expert GEMM on bf16 mma.sync m16n8k16 (e2m1 x scale exact; cc >= 8.0)"),
};

const struct kern_op kern_op_moe_gemm = {
	.name = "moe_gemm",
	.variants = moe_gemm_variants,
	.n_variants = (int)(sizeof moe_gemm_variants / sizeof moe_gemm_variants[0]),
	.selfcheck = moe_selfcheck,
};
