/*
 * tests/kernels/test_moe_decode_gpu.c (suite gpu): the fused routed-expert
 * decode (moe_decode_cuda and moe_decode_cuda_mma, kernels/moe_gemm/
 * moe_decode.h) against its CPU reference (moe_decode_cpu_ref: the unfused
 * reference ops) on the device; each case's reference serves both variants.
 *
 * Cases: the real DeepSeek-V4-Flash shapes (hidden 4096, moe_intermediate
 * 2048, 256 experts, top-6) at T = 1, 2, 3, 8 and 64 tokens (T = 64 drawn
 * from a pool of 12 experts: ~32 rows per expert, the kernel's 8-row chunks,
 * most experts empty), then T = 1 ... 64 at reduced shapes (D 128..512, I
 * 128..384, 16..64 experts) with pools from top_k to past the rank's range
 * (slots with no local row, tokens with none), MXFP4 and NVFP4, bf16 rounding
 * on and off, routing weights on and off, swiglu_limit 10 and 0. Every
 * output (h, y, out) is NaN-poisoned and every element checked:
 *   h against the reference (f32 sums in another order; a sum that lands
 *     on the other side of a bf16 rounding boundary moves g or u, then h, by
 *     up to 2^-7 each: 3e-2 of max |h|);
 *   y and out against the reference recomputed from the GPU's own h (so an
 *     FP8 act_quant flip of h does not count; 1.6e-2 of max: two bf16 ulps);
 *   out against the full reference (4e-2), and bit-exactly against the
 *     slot-order f32 sum of the GPU's y (the combine's contract).
 * First, selection with the self-check on this device: the real NVFP4 and
 * MXFP4 problems pick moe_decode_cuda and its self-check passes. Fresh random
 * inputs every run (the seed is printed). Exits 77 without CUDA or a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/norm/lowp_sim.h"
#include "tests/kernels/moe_decode_case.h"
#include "tests/test.h"

static const struct kern_variant *find(const char *name)
{
	for (int i = 0; i < kern_op_moe_decode.n_variants; i++)
		if (!strcmp(kern_op_moe_decode.variants[i].name, name))
			return &kern_op_moe_decode.variants[i];
	return NULL;
}

/* One problem: the reference once, then every variant in vs[] on freshly poisoned outputs. */
static int one(const struct kern_variant *const *vs, int nv, uint64_t *rng, const struct mdc_spec *s)
{
	struct mdc c;
	enum status st = mdc_make(&c, s, rng);
	T_CHECKF(st == ST_OK, "case build: %s", status_str(st));
	if (st) {
		mdc_free(&c);
		return 0;
	}
	const int64_t T = s->T, K = s->K, P = T * K, D = s->D, I = s->I, R = c.n_rows;
	char name[200], why[KERN_REASON_BYTES] = "";
	snprintf(name, sizeof name, "%s T%lld K%lld E%lld base%lld pool%lld D%lld I%lld bf16 %d rw %d limit %g rows %lld",
		 kern_wfmt_name(s->fmt), (long long)T, (long long)K, (long long)s->E, (long long)s->base,
		 (long long)s->pool, (long long)D, (long long)I, s->bf16_round, s->row_weight, (double)s->limit,
		 (long long)R);
	float *ref = malloc((size_t)(P * I + P * D + T * D + P * D + T * D) * sizeof(float));
	float *h_ref = ref, *y_ref = h_ref + P * I, *out_ref = y_ref + P * D, *y2 = out_ref + T * D, *out2 = y2 + P * D;
	struct kern_moe_decode_args ra = c.a;
	ra.h = h_ref;
	ra.y = y_ref;
	ra.out = out_ref;
	st = kern_moe_decode_ref(&ra);
	T_CHECKF(st == ST_OK, "reference (%s): %s", name, status_str(st));
	bool ok = st == ST_OK;
	for (int vi = 0; vi < nv && st == ST_OK; vi++) {
		const struct kern_variant *v = vs[vi];
		mdc_poison(&c);
		enum status gst = ((kern_moe_decode_fn)v->run_host)(&c.a);
		T_CHECKF(gst == ST_OK, "%s (%s): %s", v->name, name, status_str(gst));
		if (gst != ST_OK) {
			ok = false;
			continue;
		}
		bool oh = kern_compare_f32(h_ref, c.h, (size_t)(R * I), 1e-6, 3e-2, why, sizeof why);
		T_CHECKF(oh, "%s h: %s: %s", v->name, name, why);
		/* y and out from the GPU's own h */
		struct kern_moe_gemm_args d = {.n_rows = P, .n_experts = s->E, .expert_offsets = c.off, .n_x_rows = P,
					       .x = c.h, .x_dtype = KERN_DT_F32, .y = y2, .y_dtype = KERN_DT_F32,
					       .w = c.w2, .act_quant_block = 128};
		enum status st2 = kern_moe_gemm_ref(&d);
		T_CHECK(st2 == ST_OK);
		if (s->bf16_round)
			for (int64_t i = 0; i < R * D; i++)
				y2[i] = kern__bf16_round(y2[i]);
		struct kern_moe_combine_args cb = {.n_tokens = T, .top_k = (int)K, .dim = D, .slot_row = c.slot_row,
						   .y = y2, .y_dtype = KERN_DT_F32, .out = out2, .out_dtype = KERN_DT_F32};
		T_CHECK(st2 == ST_OK && kern_moe_combine_ref(&cb) == ST_OK);
		bool oy = kern_compare_f32(y2, c.y, (size_t)(R * D), 1e-6, 1.6e-2, why, sizeof why);
		T_CHECKF(oy, "%s y vs reference from the GPU's h: %s: %s", v->name, name, why);
		bool oo = kern_compare_f32(out2, c.out, (size_t)(T * D), 1e-6, 1.6e-2, why, sizeof why);
		T_CHECKF(oo, "%s out vs reference from the GPU's h: %s: %s", v->name, name, why);
		bool of = kern_compare_f32(out_ref, c.out, (size_t)(T * D), 1e-6, 4e-2, why, sizeof why);
		T_CHECKF(of, "%s out vs reference: %s: %s", v->name, name, why);
		int bad = 0;
		for (int64_t t = 0; t < T; t++)
			for (int64_t x = 0; x < D; x++) {
				float sum = 0.f;
				for (int64_t j = 0; j < K; j++)
					if (c.slot_row[t * K + j] >= 0)
						sum += c.y[(int64_t)c.slot_row[t * K + j] * D + x];
				bad += !(sum == c.out[t * D + x]);
			}
		T_CHECKF(bad == 0, "%s %s: %d combined values differ from the slot-order sum of y", v->name, name, bad);
		ok = ok && oh && oy && oo && of && bad == 0;
	}
	free(ref);
	mdc_free(&c);
	return ok;
}

int main(void)
{
	if (!DSV4_HAVE_CUDA)
		return test_skip("built without CUDA");
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	struct kern_device dev;
	struct err e = {0};
	if (kern_device_detect(0, &dev, &e) != ST_OK)
		return test_skip(e.msg);
	const struct kern_variant *v = find("moe_decode_cuda"), *vm = find("moe_decode_cuda_mma");
	T_CHECK(v != NULL && v->run_host != NULL && vm != NULL && vm->run_host != NULL);
	if (!v || !v->run_host || !vm || !vm->run_host)
		return test_exit();
	const struct kern_variant *const vs[2] = {v, vm};
	fprintf(stderr, "device %s (cc %d.%d)\n", dev.name, dev.cc_major, dev.cc_minor);
	uint64_t rng = test_seed() * 0x9E3779B97F4A7C15ull;

	/* The guard and selection on this device, real shapes. */
	struct kern_moe_decode_shape sh = {.dim = 4096, .inter = 2048, .n_experts = 256, .top_k = 6, .max_tokens = 64,
					   .act_quant_block = 128};
	for (int f = 0; f < 2; f++) {
		struct kern_problem p = {.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
		const struct kern_variant *got = NULL;
		struct kern_disabled dis;
		T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
		T_CHECKF(kern_select_checked(&kern_op_moe_decode, &p, &dev, &dis, 3, &got, &e) == ST_OK, "%s", e.msg);
		T_CHECKF(got == v && dis.n == 0, "%s: chose %s (%d dropped by the self-check)", kern_wfmt_name(p.wfmt),
			 got ? got->name : "nothing", dis.n);
		/* the tensor-core variant's self-check too */
		T_CHECKF(kern_op_moe_decode.selfcheck(&kern_op_moe_decode, vm, &p, &dev, &e) == ST_OK, "%s self-check: %s",
			 vm->name, e.msg);
	}

	int failed = 0, ran = 0;
	/* Real shapes. */
	static const int64_t real_T[] = {1, 2, 3, 8, 64};
	for (int i = 0; i < 5; i++) {
		struct mdc_spec s = {.fmt = (i & 1) ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .T = real_T[i], .K = 6, .E = 256,
				     .D = 4096, .I = 2048, .n_sets = 4, .bf16_round = i != 3, .row_weight = true,
				     .limit = i == 2 ? 0.f : 10.f};
		s.pool = real_T[i] >= 8 ? 12 : 256;
		s.pool0 = s.pool == 256 ? 0 : mdc_rnd(&rng, 0, 256 - s.pool);
		failed += !one(vs, 2, &rng, &s);
		ran++;
		fprintf(stderr, "real shapes T=%lld done\n", (long long)s.T);
	}
	/* T = 1 .. 64 at reduced shapes. */
	for (int64_t T = 1; T <= 64; T++) {
		struct mdc_spec s = {.fmt = (T & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4, .T = T, .K = mdc_rnd(&rng, 1, 8),
				     .E = mdc_rnd(&rng, 16, 64), .D = 128 * mdc_rnd(&rng, 1, 4),
				     .I = 128 * mdc_rnd(&rng, 1, 3), .n_sets = 3, .bf16_round = T % 5 != 0,
				     .row_weight = T % 7 != 0, .limit = T % 3 == 0 ? 0.f : 10.f};
		switch (T % 4) {
		case 0: s.pool = s.K; break;                                /* every token on the same experts */
		case 1: s.pool = s.E; break;                                /* spread over the rank's experts */
		case 2: s.pool = s.K + mdc_rnd(&rng, 0, 6); break;          /* a few hot experts */
		default: s.pool = s.E + 16, s.base = 8; break;              /* ids outside the rank's range */
		}
		failed += !one(vs, 2, &rng, &s);
		ran++;
	}
	fprintf(stderr, "%d cases, %d failed\n", ran, failed);
	return test_exit();
}
