/*
 * kernels/moe_gemm/moe_decode.c: op "moe_decode" (moe_decode.h): its CPU
 * reference, which is the unfused sequence of reference ops that
 * model/forward.c runs (so the fused CUDA variant has an oracle with the
 * forward pass's exact numerics), its guards and its registry table.
 */
#include "kernels/moe_gemm/moe_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsv4_config.h"
#include "kernels/act/act.h"
#include "kernels/moe_gemm/moe_dispatch.h"
#include "kernels/moe_gemm/moe_gemm.h"
#include "kernels/norm/lowp_sim.h"

/* Column chunk of the CUDA down pass (its combine counters are per token and chunk). */
#define MOE_DECODE_CHUNK 32

size_t kern_moe_decode_scratch_bytes(int64_t n_tokens, int64_t dim)
{
	if (n_tokens <= 0 || dim <= 0)
		return 0;
	return (size_t)n_tokens * (size_t)((dim + MOE_DECODE_CHUNK - 1) / MOE_DECODE_CHUNK) * sizeof(uint32_t);
}

static void round_rows(float *p, int64_t n, bool on)
{
	if (on)
		for (int64_t i = 0; i < n; i++)
			p[i] = kern__bf16_round(p[i]);
}

enum status kern_moe_decode_ref(const struct kern_moe_decode_args *a)
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->w1 || !a->w3 || !a->w2 ||
	    !a->expert_offsets)
		return ST_INVALID;
	const int64_t T = a->n_tokens, K = a->top_k, P = T * K;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->h || !a->y || !a->out || !a->row_src || !a->slot_row)
		return ST_INVALID;
	const int64_t D = a->w1[0].cols, I = a->w1[0].rows;
	if (a->w3[0].rows != I || a->w3[0].cols != D || a->w2[0].rows != D || a->w2[0].cols != I)
		return ST_INVALID;
	float *h3 = malloc((size_t)(P * I) * sizeof(float) + 1);
	if (!h3)
		return ST_NOMEM;
	struct kern_moe_gemm_args g = {.n_rows = P, .n_experts = a->n_experts, .expert_offsets = a->expert_offsets,
				       .row_src = a->row_src, .n_x_rows = T, .x = a->x, .x_dtype = KERN_DT_F32,
				       .y = a->h, .y_dtype = KERN_DT_F32, .w = a->w1,
				       .act_quant_block = a->act_quant_block};
	enum status st = kern_moe_gemm_ref(&g);
	if (!st) {
		g.y = h3;
		g.w = a->w3;
		st = kern_moe_gemm_ref(&g);
	}
	const int64_t R = st ? 0 : a->expert_offsets[a->n_experts];
	if (!st) {
		round_rows(a->h, R * I, a->bf16_round);
		round_rows(h3, R * I, a->bf16_round);
		struct kern_swiglu_args s = {.gate = a->h, .up = h3, .out = a->h, .row_weight = a->row_weight,
					     .n_rows = R, .dim = (int)I, .limit = a->swiglu_limit,
					     .bf16_out = a->bf16_round};
		st = kern_swiglu_ref(&s);
	}
	if (!st) {
		struct kern_moe_gemm_args d = {.n_rows = P, .n_experts = a->n_experts,
					       .expert_offsets = a->expert_offsets, .n_x_rows = P, .x = a->h,
					       .x_dtype = KERN_DT_F32, .y = a->y, .y_dtype = KERN_DT_F32, .w = a->w2,
					       .act_quant_block = a->act_quant_block};
		st = kern_moe_gemm_ref(&d);
	}
	if (!st) {
		round_rows(a->y, R * D, a->bf16_round);
		struct kern_moe_combine_args c = {.n_tokens = T, .top_k = (int)K, .dim = D, .slot_row = a->slot_row,
						  .y = a->y, .y_dtype = KERN_DT_F32, .out = a->out,
						  .out_dtype = KERN_DT_F32};
		st = kern_moe_combine_ref(&c);
	}
	free(h3);
	return st;
}

/* ---- guards ---- */

static bool decode_shape_ok(const struct kern_problem *p, char *why, size_t n)
{
	const struct kern_moe_decode_shape *s = p->shape;
	if (!s) {
		snprintf(why, n, "no shape given");
		return false;
	}
	if (s->dim <= 0 || s->inter <= 0 || s->n_experts <= 0 || s->top_k <= 0) {
		snprintf(why, n, "empty problem: %lld experts, D %lld, I %lld, top_k %d", (long long)s->n_experts,
			 (long long)s->dim, (long long)s->inter, s->top_k);
		return false;
	}
	if (s->dim % 32 || s->inter % 32) {
		snprintf(why, n, "D %lld / I %lld not multiples of 32", (long long)s->dim, (long long)s->inter);
		return false;
	}
	return true;
}

static bool decode_cpu_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	return decode_shape_ok(p, why, n);
}

/* The fused CUDA pass: FP8 act_quant (its activations are staged as bf16,
 * exact for act_quant values only), whole 128-wide quant blocks, the offsets
 * scan in shared memory (at most 1024 local experts), and a staged row of D
 * (the gate/up pass's widest) in shared memory. */
static bool decode_cuda_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	if (!decode_shape_ok(p, why, n))
		return false;
	const struct kern_moe_decode_shape *s = p->shape;
	if (s->act_quant_block != 128) {
		snprintf(why, n, "act_quant_block %d (the fused pass needs the FP8 act_quant, 128)", s->act_quant_block);
		return false;
	}
	if (s->dim % 128 || s->inter % 128) {
		snprintf(why, n, "D %lld / I %lld not multiples of 128", (long long)s->dim, (long long)s->inter);
		return false;
	}
	if (s->n_experts > 1024) {
		snprintf(why, n, "%lld local experts (at most 1024)", (long long)s->n_experts);
		return false;
	}
	if (s->top_k > 64) {
		snprintf(why, n, "top_k %d (at most 64)", s->top_k);
		return false;
	}
	int64_t need = (s->dim + s->dim / 32 * 8) * 2 + (s->n_experts + 1) * 8 + 1024;
	if (dev && dev->smem_optin_bytes < need) {
		snprintf(why, n, "D %lld needs %lld B of shared memory, device has %d", (long long)s->dim,
			 (long long)need, dev->smem_optin_bytes);
		return false;
	}
	return true;
}

/* ---- self-check (--kernel-selfcheck): a small problem shaped like p, the
 * variant on host buffers against the reference ---- */

static enum status decode_selfcheck(const struct kern_op *op, const struct kern_variant *v,
				    const struct kern_problem *p, const struct kern_device *dev, struct err *e)
{
	(void)op;
	const struct kern_moe_decode_shape *s = p->shape;
	if (!v->run_host || !s)
		return ST_OK;
	struct kern_moe_decode_shape small = *s;
	small.dim = 256;
	small.inter = 128;
	small.n_experts = 4;
	small.top_k = s->top_k < 2 ? s->top_k : 2;
	small.max_tokens = 3;
	struct kern_problem sp = *p;
	sp.shape = &small;
	char why[KERN_REASON_BYTES];
	if (!kern_variant_accepts(v, &sp, dev, NULL, why, sizeof why))
		return ST_OK;
	const int64_t D = small.dim, I = small.inter, E = small.n_experts, K = small.top_k, T = 3, P = T * K;
	uint64_t rng = 0x5e1fc4ec ^ (uint64_t)s->dim;
	struct kern_wmat w[3][4] = {{{0}}};
	enum status st = ST_OK;
	for (int64_t x = 0; x < E && !st; x++)
		for (int m = 0; m < 3 && !st; m++)
			st = kern_wmat_make_random(&w[m][x], p->wfmt, m == 2 ? D : I, m == 2 ? I : D, &rng, e);
	const size_t nf = (size_t)(T * D + 2 * (P * I + P * D + T * D) + P);
	float *buf = st ? NULL : malloc(nf * sizeof(float));
	if (!st && !buf)
		st = err_set(e, ST_NOMEM, "moe_decode self-check buffers");
	if (!st) {
		float *x = buf, *h0 = x + T * D, *y0 = h0 + P * I, *o0 = y0 + P * D, *h1 = o0 + T * D, *y1 = h1 + P * I,
		      *o1 = y1 + P * D, *rw = o1 + T * D;
		for (int64_t i = 0; i < T * D; i++)
			x[i] = kern_rand_f32(&rng);
		for (int64_t i = 0; i < P; i++)
			rw[i] = 0.5f + 0.25f * kern_rand_f32(&rng);
		for (size_t i = (size_t)(T * D); i < nf - (size_t)P; i++)
			buf[i] = NAN;
		/* token t on experts (t + j) % E; token 2 on none of this rank's (slot -1) */
		int32_t off[5] = {0}, src[6], slot[6];
		int32_t ids[6];
		for (int64_t t = 0; t < T; t++)
			for (int64_t j = 0; j < K; j++)
				ids[t * K + j] = t == 2 ? -1 : (int32_t)((t + j) % E);
		int64_t nr = 0;
		struct kern_moe_dispatch_args da = {.n_tokens = T, .top_k = (int)K, .topk_ids = ids, .n_experts = E,
						    .expert_offsets = off, .row_src = src, .slot_row = slot,
						    .n_rows = &nr};
		st = kern_moe_dispatch_ref(&da);
		struct kern_moe_decode_args a = {.n_tokens = T, .top_k = (int)K, .n_experts = E, .expert_offsets = off,
						 .row_src = src, .slot_row = slot, .row_weight = rw, .x = x, .h = h0,
						 .y = y0, .out = o0, .w1 = w[0], .w3 = w[1], .w2 = w[2],
						 .act_quant_block = small.act_quant_block, .swiglu_limit = 10.0f,
						 .bf16_round = true};
		if (!st)
			st = kern_moe_decode_ref(&a);
		if (!st) {
			a.h = h1;
			a.y = y1;
			a.out = o1;
			st = ((kern_moe_decode_fn)v->run_host)(&a);
			if (st)
				err_set(e, st, "%s: run failed: %s", v->name, status_str(st));
		}
		if (!st && !kern_compare_f32(o0, o1, (size_t)(T * D), 1e-6, 4e-2, why, sizeof why))
			st = err_set(e, ST_INVALID, "%s vs reference (%s, D %lld, I %lld): %s", v->name,
				     kern_wfmt_name(p->wfmt), (long long)D, (long long)I, why);
	}
	free(buf);
	for (int m = 0; m < 3; m++)
		for (int64_t x = 0; x < E; x++)
			kern_wmat_release(&w[m][x]);
	return st;
}

static const struct kern_variant moe_decode_variants[] = {
	KERN_ROW_CPU_REF("moe_decode_cpu_ref", kern_moe_decode_ref, .wfmt_accept = KERN_WFMT_MASK_CHECKPOINT,
	                 .supports = decode_cpu_supports,
	                 .desc = "CPU reference: moe_gemm w1, w3, swiglu, moe_gemm w2, combine (the unfused refs)"),
	KERN_ROW_SM80("moe_decode_cuda", 30, kern_moe_decode_cuda, kern_moe_decode_cuda_host,
	              .wfmt_accept = KERN_WFMT_MASK_FP4, .supports = decode_cuda_supports,
	              .desc = "fused decode experts, MXFP4/NVFP4: gate+up+SwiGLU+weight, down+combine (2 launches)"),
	/* below moe_decode_cuda until the H200 benchmark (bench_moe_decode) has compared the two */
	KERN_ROW_SM80("moe_decode_cuda_mma", 20, kern_moe_decode_cuda_mma, kern_moe_decode_cuda_mma_host,
	              .features = KERN_FEAT_BF16_MMA, .wfmt_accept = KERN_WFMT_MASK_FP4,
	              .supports = decode_cuda_supports,
	              .desc = "fused decode experts on bf16 mma.sync (e2m1 x scale exact in bf16), MXFP4/NVFP4, 2 launches"),
};

const struct kern_op kern_op_moe_decode = {
	.name = "moe_decode",
	.variants = moe_decode_variants,
	.n_variants = (int)(sizeof moe_decode_variants / sizeof moe_decode_variants[0]),
	.selfcheck = decode_selfcheck,
};
