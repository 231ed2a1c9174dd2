/*
 * tests/kernels/test_linear_bf16.c (suite unit): the guards and argument
 * checks of the bf16-weight linears (linear_cuda_gemv_bf16,
 * linear_mma_bf16w; linear_bf16.h), no GPU needed.
 *
 *   - supports() on the real shapes (lm_head [129280 x 4096], its TP=2
 *     shard, the router gate [256 x 4096]): the GEMV takes decode plans
 *     (max_tokens <= 63) and refuses 64 and up, the MMA the reverse; both
 *     refuse act_quant 128, unaligned in, and the GEMV in > 16384, each with
 *     its reason;
 *   - kern_linear_bf16__check (both run()s' argument check) on host
 *     structs: every refusal, and the strides it resolves;
 *   - CUDA builds: selection on simulated cc 8.0, 8.6, 9.0, 10.0, 12.0 and
 *     12.1 devices picks the GEMV for decode plans and the MMA for prefill
 *     plans of the head and the gate (the portable image runs everywhere),
 *     and a cc 7.5 device gets neither.
 * The kernels themselves run in kernels_linear_bf16_gpu (suite gpu).
 */
#include <stdio.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "kernels/linear/linear_bf16.h"
#include "tests/test.h"

static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

static const struct kern_variant *find(const char *name)
{
	for (int i = 0; i < kern_op_linear.n_variants; i++)
		if (!strcmp(kern_op_linear.variants[i].name, name))
			return &kern_op_linear.variants[i];
	return NULL;
}

/* supports() of v on [out, in] for a plan of max_tokens: accepted (want == NULL) or refused naming want. */
static void expect(const struct kern_variant *v, int64_t out, int64_t in, int64_t max_tokens, int aq, const char *want)
{
	struct kern_linear_shape sh = {.in = in, .out = out, .max_tokens = max_tokens, .act_quant_block = aq,
				       .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = KERN_WFMT_BF16, .tp_size = 1, .shape = &sh};
	struct kern_device d;
	kern_device_simulate(&d, 9, 0);
	char why[KERN_REASON_BYTES] = "";
	const bool ok = v->supports(&p, &d, why, sizeof why);
	if (!want) {
		T_CHECKF(ok, "%s refused [%lld x %lld] max_tokens %lld: %s", v->name, (long long)out, (long long)in,
			 (long long)max_tokens, why);
		return;
	}
	T_CHECKF(!ok, "%s accepted [%lld x %lld] max_tokens %lld aq %d", v->name, (long long)out, (long long)in,
		 (long long)max_tokens, aq);
	contains(why, want);
}

static void guards(const struct kern_variant *gv, const struct kern_variant *mv)
{
	static const int64_t outs[] = {129280, 64640, 256};
	for (int i = 0; i < 3; i++) {
		static const int64_t dec[] = {1, 2, 16, 63}, pre[] = {64, 512, 8192, 131072};
		for (int j = 0; j < 4; j++) {
			expect(gv, outs[i], 4096, dec[j], 0, NULL);
			expect(mv, outs[i], 4096, dec[j], 0, "below one 64-token tile");
			expect(gv, outs[i], 4096, pre[j], 0, "above the GEMV's 63");
			expect(mv, outs[i], 4096, pre[j], 0, NULL);
		}
	}
	expect(gv, 256, 4096, 1, 128, "act_quant_block 128");
	expect(mv, 256, 4096, 512, 128, "act_quant_block 128");
	expect(gv, 256, 4100, 1, 0, "not a multiple of 8");
	expect(gv, 256, 16392, 1, 0, "above 16384");
	expect(gv, 256, 16384, 1, 0, NULL);
	expect(gv, 5, 8, 1, 0, NULL);
	expect(mv, 256, 4112, 512, 0, "not a multiple of 32");
	expect(mv, 256, 96, 512, 0, NULL);
	expect(mv, 256, 1 << 25, 512, 0, "above 2^24");
	expect(gv, 0, 4096, 1, 0, "empty weight");
}

static void arg_checks(void)
{
	_Alignas(16) uint16_t wbuf[16] = {0};
	float xy[64] = {0};
	struct kern_wmat w = {.fmt = KERN_WFMT_BF16, .rows = 4, .cols = 64, .data = wbuf};
	struct kern_linear_args a = {.n_tokens = 1, .x = xy, .x_dtype = KERN_DT_F32, .y = xy, .y_dtype = KERN_DT_F32,
				     .w = &w};
	int64_t ldx = -1, ldy = -1;
	T_CHECK(kern_linear_bf16__check(&a, 32, 16384, &ldx, &ldy) == ST_OK && ldx == 64 && ldy == 4);
	a.ldx = 80, a.ldy = 7;
	T_CHECK(kern_linear_bf16__check(&a, 32, 16384, &ldx, &ldy) == ST_OK && ldx == 80 && ldy == 7);
	a.ldx = 63; /* below a row */
	T_CHECK(kern_linear_bf16__check(&a, 32, 16384, &ldx, &ldy) == ST_INVALID);
	a.ldx = 0, a.ldy = 3;
	T_CHECK(kern_linear_bf16__check(&a, 32, 16384, &ldx, &ldy) == ST_INVALID);
	a.ldy = 0;
	T_CHECK(kern_linear_bf16__check(&a, 128, 16384, &ldx, &ldy) == ST_INVALID); /* 64 % 128 */
	T_CHECK(kern_linear_bf16__check(&a, 8, 32, &ldx, &ldy) == ST_INVALID);      /* in > max_in */
	a.act_quant_block = 128;
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_INVALID);
	a.act_quant_block = 0;
	a.x_dtype = (enum kern_dtype)7;
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_INVALID);
	a.x_dtype = KERN_DT_BF16, a.y_dtype = KERN_DT_BF16;
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_OK);
	a.x = NULL;
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_INVALID);
	a.n_tokens = 0; /* nothing to read or write: no buffers needed */
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_OK);
	a.n_tokens = 1, a.x = xy;
	w.data = (const uint8_t *)wbuf + 2; /* not 16-byte aligned */
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_INVALID);
	w.data = wbuf;
	w.fmt = KERN_WFMT_F32;
	T_CHECK(kern_linear_bf16__check(&a, 8, 16384, &ldx, &ldy) == ST_INVALID);
	const struct kern_linear_args none = {.n_tokens = 1}; /* no weight */
	T_CHECK(kern_linear_bf16__check(&none, 8, 16384, &ldx, &ldy) == ST_INVALID);
}

#if DSV4_HAVE_CUDA
/* Selection on a simulated device of cc major.minor (loadable forced to what
 * a real one could load, as test_select_sim does). */
static void pick(int major, int minor, int64_t out, int64_t max_tokens, const char *want)
{
	struct kern_device d;
	kern_device_simulate(&d, major, minor);
	d.loadable = kern_target_native_for_cc(major, minor) | KERN_TARGET_SM80;
	struct kern_linear_shape sh = {.in = 4096, .out = out, .max_tokens = max_tokens, .x_dtype = KERN_DT_F32,
				       .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = KERN_WFMT_BF16, .tp_size = 1, .shape = &sh};
	const struct kern_variant *v = NULL;
	struct err e = {0};
	const enum status st = kern_select(&kern_op_linear, &p, &d, NULL, 7, &v, &e);
	if (!want) {
		T_CHECKF(st != ST_OK || v->backend == KERN_BACKEND_CPU, "cc %d.%d: chose %s", major, minor, v->name);
		return;
	}
	T_CHECKF(st == ST_OK && v && !strcmp(v->name, want), "cc %d.%d [%lld x 4096] max_tokens %lld: chose %s (%s), expected %s",
		 major, minor, (long long)out, (long long)max_tokens, st == ST_OK && v ? v->name : "nothing", e.msg, want);
}
#endif

int main(void)
{
	const struct kern_variant *gv = find("linear_cuda_gemv_bf16"), *mv = find("linear_mma_bf16w");
	T_CHECK(gv && mv && gv->supports && mv->supports);
	if (!gv || !mv || !gv->supports || !mv->supports)
		return test_exit();
	T_CHECK(gv->cc_min == 80 && mv->cc_min == 80 && gv->target == KERN_TARGET_SM80 && mv->target == KERN_TARGET_SM80);
	const struct kern_variant *gen = find("linear_cuda_generic_bf16");
	T_CHECK(gen && gv->priority > gen->priority && mv->priority > gen->priority);
	guards(gv, mv);
	arg_checks();
#if DSV4_HAVE_CUDA
	static const int ccs[][2] = {{8, 0}, {8, 6}, {9, 0}, {10, 0}, {12, 0}, {12, 1}};
	for (int i = 0; i < 6; i++)
		for (int o = 0; o < 2; o++) {
			const int64_t out = o ? 256 : 129280;
			pick(ccs[i][0], ccs[i][1], out, 1, gv->name);
			pick(ccs[i][0], ccs[i][1], out, 63, gv->name);
			pick(ccs[i][0], ccs[i][1], out, 64, mv->name);
			pick(ccs[i][0], ccs[i][1], out, 8192, mv->name);
		}
	pick(7, 5, 129280, 1, NULL);
#endif
	return test_exit();
}
