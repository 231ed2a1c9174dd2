/*
 * tests/kernels/test_moe_decode.c (suite unit): the CPU reference of op
 * moe_decode (kernels/moe_gemm/moe_decode.h) against a direct computation
 * written here (each routed (token, expert) pair on its own: act_quant of the
 * token, decoded weight rows, double sums, SwiGLU with the clamp, routing
 * weight, act_quant, w2, the token's sum over its slots), on fresh random
 * problems: MXFP4 and NVFP4, 1..12 tokens, pools that put several tokens on
 * one expert and leave experts empty, ids outside the rank's range, bf16
 * rounding on and off, with and without routing weights and the clamp;
 * outputs NaN-poisoned and every element checked. Then the exactness of the
 * combine (out is the slot-order f32 sum of y), and the registry: the CPU
 * device picks the reference, simulated GPUs the fused CUDA variant where it
 * is compiled, and the guards' refusals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/moe_gemm/moe_e2m1.h"
#include "kernels/norm/lowp_sim.h"
#include "tests/kernels/moe_decode_case.h"
#include "tests/test.h"

static float rnd_bf16(float v, bool on)
{
	return on ? kern__bf16_round(v) : v;
}

/* The direct computation of one case into h_ref [P, I] (by slot row), y_ref, out_ref. */
static void direct(const struct mdc *c, float *h_ref, float *y_ref, float *out_ref)
{
	const int64_t T = c->s.T, K = c->s.K, D = c->s.D, I = c->s.I, E = c->s.E;
	float *xq = malloc((size_t)(D + I + D + I) * sizeof(float)), *hq = xq + D, *wr = hq + I, *wr2 = wr + D;
	for (int64_t t = 0; t < T; t++) {
		for (int64_t d = 0; d < D; d++)
			out_ref[t * D + d] = 0.f;
		for (int64_t j = 0; j < K; j++) {
			const int32_t r = c->slot_row[t * K + j];
			if (r < 0)
				continue;
			int64_t e = 0;
			while (!(c->off[e] <= r && r < c->off[e + 1]))
				e++;
			T_CHECK(e < E && c->row_src[r] == t);
			for (int64_t d = 0; d < D; d++)
				xq[d] = c->x[t * D + d];
			kern_act_quant_fp8_sim(xq, 1, D, D, 128);
			for (int64_t i = 0; i < I; i++) {
				double g = 0, u = 0;
				kern_wmat_decode_row(&c->w1[e], i, wr);
				for (int64_t d = 0; d < D; d++)
					g += (double)xq[d] * wr[d];
				kern_wmat_decode_row(&c->w3[e], i, wr);
				for (int64_t d = 0; d < D; d++)
					u += (double)xq[d] * wr[d];
				float gf = rnd_bf16((float)g, c->s.bf16_round), uf = rnd_bf16((float)u, c->s.bf16_round);
				if (c->s.limit > 0) {
					gf = fminf(gf, c->s.limit);
					uf = fminf(fmaxf(uf, -c->s.limit), c->s.limit);
				}
				float a = (float)((double)gf / (1.0 + exp(-(double)gf)) * uf);
				if (c->s.row_weight)
					a *= c->rw[r];
				hq[i] = rnd_bf16(a, c->s.bf16_round);
				h_ref[r * I + i] = hq[i];
			}
			kern_act_quant_fp8_sim(hq, 1, I, I, 128);
			for (int64_t d = 0; d < D; d++) {
				double s = 0;
				kern_wmat_decode_row(&c->w2[e], d, wr2);
				for (int64_t i = 0; i < I; i++)
					s += (double)hq[i] * wr2[i];
				const float yv = rnd_bf16((float)s, c->s.bf16_round);
				y_ref[r * D + d] = yv;
				out_ref[t * D + d] += yv;
			}
		}
	}
	free(xq);
}

static int one(uint64_t *rng, const struct mdc_spec *s)
{
	struct mdc c;
	enum status st = mdc_make(&c, s, rng);
	T_CHECKF(st == ST_OK, "case build: %s", status_str(st));
	if (st) {
		mdc_free(&c);
		return 0;
	}
	const int64_t P = s->T * s->K, R = c.n_rows;
	float *h_ref = malloc((size_t)(P * s->I + P * s->D + s->T * s->D) * sizeof(float));
	float *y_ref = h_ref + P * s->I, *out_ref = y_ref + P * s->D;
	direct(&c, h_ref, y_ref, out_ref);
	st = kern_moe_decode_ref(&c.a);
	T_CHECKF(st == ST_OK, "reference: %s", status_str(st));
	char why[KERN_REASON_BYTES] = "", name[160];
	snprintf(name, sizeof name, "%s T%lld K%lld E%lld pool%lld D%lld I%lld bf16 %d rw %d limit %g rows %lld",
		 kern_wfmt_name(s->fmt), (long long)s->T, (long long)s->K, (long long)s->E, (long long)s->pool,
		 (long long)s->D, (long long)s->I, s->bf16_round, s->row_weight, (double)s->limit, (long long)R);
	bool ok = st == ST_OK;
	if (ok) {
		ok = kern_compare_f32(h_ref, c.h, (size_t)(R * s->I), 1e-6, 3e-2, why, sizeof why);
		T_CHECKF(ok, "h: %s: %s", name, why);
		bool oy = kern_compare_f32(y_ref, c.y, (size_t)(R * s->D), 1e-6, 4e-2, why, sizeof why);
		T_CHECKF(oy, "y: %s: %s", name, why);
		bool oo = kern_compare_f32(out_ref, c.out, (size_t)(s->T * s->D), 1e-6, 4e-2, why, sizeof why);
		T_CHECKF(oo, "out: %s: %s", name, why);
		/* the combine adds y's rows in slot order in f32: exactly */
		int bad = 0;
		for (int64_t t = 0; t < s->T; t++)
			for (int64_t d = 0; d < s->D; d++) {
				float sum = 0.f;
				for (int64_t j = 0; j < s->K; j++)
					if (c.slot_row[t * s->K + j] >= 0)
						sum += c.y[(int64_t)c.slot_row[t * s->K + j] * s->D + d];
				bad += sum != c.out[t * s->D + d];
			}
		T_CHECKF(bad == 0, "%s: %d combined values differ from the slot-order sum", name, bad);
		ok = ok && oy && oo && bad == 0;
	}
	free(h_ref);
	mdc_free(&c);
	return ok;
}

/* The kernel's in-register e2m1 decode (moe_e2m1.h, the same source) on
 * every 16-bit half and on random words, against the scalar decode. */
static void e2m1_decode_checks(uint64_t *rng)
{
	int bad = 0;
	float f[8];
	for (uint32_t m = 0; m < 65536; m++) {
		const uint32_t w = m | (uint32_t)(kern_rand_u64(rng) & 0xFFFF) << 16;
		const uint32_t w2 = (w << 16) | (w >> 16);
		for (int k = 0; k < 2; k++) {
			const uint32_t n = k ? w2 : w;
			kern_e2m1x8_to_f32(n, f);
			for (int i = 0; i < 8; i++) {
				const float want = kern_e2m1_to_f32((uint8_t)((n >> (4 * i)) & 0xFu));
				bad += memcmp(&want, &f[i], sizeof want) != 0;
			}
		}
	}
	T_CHECKF(bad == 0, "in-register e2m1 decode: %d of %d values wrong", bad, 65536 * 16);
}

/* through a pointer parameter (T_STR_CONTAINS on an array trips -Waddress) */
static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

static void registry_checks(void)
{
	struct kern_moe_decode_shape sh = {.dim = 4096, .inter = 2048, .n_experts = 256, .top_k = 6, .max_tokens = 64,
					   .act_quant_block = 128};
	struct kern_problem p = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
	struct err e = {0};
	const struct kern_variant *v = NULL;
	struct kern_device cpu;
	kern_device_cpu(&cpu);
	T_CHECK(kern_select(&kern_op_moe_decode, &p, &cpu, NULL, 3, &v, &e) == ST_OK);
	T_CHECKF(v && !strcmp(v->name, "moe_decode_cpu_ref"), "cpu device chose %s", v ? v->name : "nothing");
	T_CHECK(kern_registry_find_op("moe_decode") == &kern_op_moe_decode);
	/* the self-check's harness, run with the reference as the variant (it must agree with itself) */
	for (int f = 0; f < 2; f++) {
		struct kern_problem sp = {.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
		T_CHECKF(kern_op_moe_decode.selfcheck(&kern_op_moe_decode, &kern_op_moe_decode.variants[0], &sp, &cpu, &e) ==
				 ST_OK,
			 "self-check of the reference: %s", e.msg);
	}
	static const int ccs[][2] = {{8, 0}, {9, 0}, {10, 0}, {12, 0}, {12, 1}};
	for (int i = 0; i < 5; i++) {
		struct kern_device d;
		kern_device_simulate(&d, ccs[i][0], ccs[i][1]);
		for (int f = 0; f < 2; f++) {
			p.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4;
			v = NULL;
			enum status st = kern_select(&kern_op_moe_decode, &p, &d, NULL, 3, &v, &e);
			if (DSV4_HAVE_CUDA)
				T_CHECKF(st == ST_OK && v && !strcmp(v->name, "moe_decode_cuda"), "cc %d.%d %s: %s",
					 ccs[i][0], ccs[i][1], kern_wfmt_name(p.wfmt), st ? e.msg : v->name);
			else
				T_CHECKF(st != ST_OK, "cc %d.%d: a CUDA variant without CUDA", ccs[i][0], ccs[i][1]);
		}
	}
	/* the guards */
	const struct kern_variant *cu = &kern_op_moe_decode.variants[1];
	struct kern_device d90;
	kern_device_simulate(&d90, 9, 0);
	char why[KERN_REASON_BYTES];
	p.wfmt = KERN_WFMT_NVFP4;
	struct kern_moe_decode_shape bad = sh;
	bad.act_quant_block = 0;
	p.shape = &bad;
	T_CHECK(!cu->supports(&p, &d90, why, sizeof why));
	contains(why, "act_quant");
	bad = sh;
	bad.inter = 2048 + 64;
	T_CHECK(!cu->supports(&p, &d90, why, sizeof why));
	contains(why, "128");
	bad = sh;
	bad.n_experts = 2048;
	T_CHECK(!cu->supports(&p, &d90, why, sizeof why));
	contains(why, "1024");
	p.shape = &sh;
	T_CHECKF(cu->supports(&p, &d90, why, sizeof why), "real shapes refused: %s", why);
	p.wfmt = KERN_WFMT_FP8_E8M0_B128;
	T_CHECK(!kern_variant_accepts(cu, &p, &d90, NULL, why, sizeof why));
	/* the CPU reference takes an FP8 problem, and refuses a shape outside the contract */
	T_CHECK(kern_variant_accepts(&kern_op_moe_decode.variants[0], &p, &cpu, NULL, why, sizeof why));
	bad = sh;
	bad.dim = 100;
	p.shape = &bad;
	T_CHECK(!kern_variant_accepts(&kern_op_moe_decode.variants[0], &p, &cpu, NULL, why, sizeof why));
}

int main(void)
{
	uint64_t rng = test_seed() * 0x9E3779B97F4A7C15ull;
	registry_checks();
	e2m1_decode_checks(&rng);
	int failed = 0, ran = 0;
	for (int i = 0; i < 12; i++) {
		struct mdc_spec s = {.fmt = (i & 1) ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4,
				     .T = mdc_rnd(&rng, 1, 12), .K = mdc_rnd(&rng, 1, 4), .E = mdc_rnd(&rng, 4, 12),
				     .D = 128 * mdc_rnd(&rng, 1, 2), .I = 128 * mdc_rnd(&rng, 1, 2), .n_sets = 3,
				     .bf16_round = (i >> 1) & 1, .row_weight = i % 3 != 0, .limit = i % 4 == 3 ? 0.f : 10.f};
		/* pools: inside the local range, or spilling past it (slots without a local row) */
		s.base = i % 3 == 2 ? mdc_rnd(&rng, 1, 4) : 0;
		s.pool0 = 0;
		s.pool = s.K + mdc_rnd(&rng, 0, s.E);
		failed += !one(&rng, &s);
		ran++;
	}
	fprintf(stderr, "%d cases, %d failed\n", ran, failed);
	return test_exit();
}
