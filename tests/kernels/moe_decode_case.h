/*
 * tests/kernels/moe_decode_case.h: one random problem of op moe_decode
 * (kernels/moe_gemm/moe_decode.h) for the CPU and GPU tests: experts whose
 * w1/w3/w2 views share a few distinct random matrices (real shapes without
 * generating 768 of them), top-k routing drawn from a pool of global experts
 * (pool < E: several tokens per expert; ids outside this rank's range: slots
 * with no local row, tokens with none), laid out by the reference
 * moe_dispatch, random routing weights, NaN-poisoned outputs.
 */
#ifndef DSV4_TESTS_MOE_DECODE_CASE_H
#define DSV4_TESTS_MOE_DECODE_CASE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/moe_gemm/moe_decode.h"

#define MDC_MAX_SETS 8

struct mdc_spec {
	enum kern_wfmt fmt;
	int64_t T, K, E;      /* tokens, top_k, local experts */
	int64_t base;         /* first local expert id */
	int64_t pool;         /* ids drawn from [pool0, pool0 + pool) */
	int64_t pool0;
	int64_t D, I;
	int n_sets;           /* distinct weight matrices per projection */
	bool bf16_round, row_weight;
	float limit;
};

struct mdc {
	struct mdc_spec s;
	struct kern_wmat set[3][MDC_MAX_SETS];
	struct kern_wmat *w1, *w3, *w2; /* [E] views */
	int32_t *ids, *off, *row_src, *slot_row;
	float *rw, *x, *h, *y, *out;
	int64_t n_rows;                 /* rows that exist */
	struct kern_moe_decode_args a;
};

static inline int64_t mdc_rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

static inline void mdc_free(struct mdc *c)
{
	for (int p = 0; p < 3; p++)
		for (int i = 0; i < MDC_MAX_SETS; i++)
			kern_wmat_release(&c->set[p][i]);
	free(c->w1);
	free(c->ids);
	free(c->rw);
	free(c->x);
	free(c->h);
	free(c->y);
	free(c->out);
	memset(c, 0, sizeof *c);
}

static inline void mdc_poison(struct mdc *c)
{
	const int64_t P = c->s.T * c->s.K;
	for (int64_t i = 0; i < P * c->s.I; i++)
		c->h[i] = NAN;
	for (int64_t i = 0; i < P * c->s.D; i++)
		c->y[i] = NAN;
	for (int64_t i = 0; i < c->s.T * c->s.D; i++)
		c->out[i] = NAN;
}

/* Builds the problem; ST_OK or the failing step's status. */
static inline enum status mdc_make(struct mdc *c, const struct mdc_spec *s, uint64_t *rng)
{
	memset(c, 0, sizeof *c);
	c->s = *s;
	const int64_t T = s->T, K = s->K, E = s->E, P = T * K, D = s->D, I = s->I;
	struct err e = {0};
	enum status st = ST_OK;
	int n = s->n_sets < 1 ? 1 : s->n_sets > MDC_MAX_SETS ? MDC_MAX_SETS : s->n_sets;
	for (int i = 0; i < n && !st; i++) {
		st = kern_wmat_make_random(&c->set[0][i], s->fmt, I, D, rng, &e);
		if (!st)
			st = kern_wmat_make_random(&c->set[1][i], s->fmt, I, D, rng, &e);
		if (!st)
			st = kern_wmat_make_random(&c->set[2][i], s->fmt, D, I, rng, &e);
	}
	c->w1 = calloc((size_t)(3 * E), sizeof *c->w1);
	c->ids = malloc((size_t)(4 * P + E + 1) * sizeof(int32_t));
	c->rw = malloc((size_t)P * sizeof(float));
	c->x = malloc((size_t)(T * D) * sizeof(float));
	c->h = malloc((size_t)(P * I) * sizeof(float));
	c->y = malloc((size_t)(P * D) * sizeof(float));
	c->out = malloc((size_t)(T * D) * sizeof(float));
	if (!st && (!c->w1 || !c->ids || !c->rw || !c->x || !c->h || !c->y || !c->out))
		st = ST_NOMEM;
	if (st)
		return st;
	c->w3 = c->w1 + E;
	c->w2 = c->w3 + E;
	for (int64_t x = 0; x < E; x++) {
		int k = (int)((x * 5 + 3) % n);
		c->w1[x] = c->set[0][k];
		c->w3[x] = c->set[1][(k + 1) % n];
		c->w2[x] = c->set[2][(k + 2) % n];
		c->w1[x].owned = c->w3[x].owned = c->w2[x].owned = NULL;
	}
	c->off = c->ids + P;
	c->row_src = c->off + E + 1;
	c->slot_row = c->row_src + P;
	int32_t *row_slot = c->slot_row + P;
	/* K distinct ids per token from the pool (K <= pool) */
	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < K; j++) {
			int32_t id;
			bool dup;
			do {
				id = (int32_t)(s->pool0 + mdc_rnd(rng, 0, s->pool - 1));
				dup = false;
				for (int64_t i = 0; i < j; i++)
					dup |= c->ids[t * K + i] == id;
			} while (dup);
			c->ids[t * K + j] = id;
		}
	int64_t nr = 0;
	struct kern_moe_dispatch_args da = {.n_tokens = T, .top_k = (int)K, .topk_ids = c->ids,
					    .expert_base = (int32_t)s->base, .n_experts = E, .expert_offsets = c->off,
					    .row_src = c->row_src, .row_slot = row_slot, .slot_row = c->slot_row,
					    .n_rows = &nr};
	if ((st = kern_moe_dispatch_ref(&da)))
		return st;
	c->n_rows = nr;
	/* routing weights per row (moe_row_weight's output), and the tokens */
	for (int64_t i = 0; i < P; i++)
		c->rw[i] = 0.25f + 0.75f * (0.5f + 0.5f * kern_rand_f32(rng));
	for (int64_t i = 0; i < T * D; i++)
		c->x[i] = kern_rand_f32(rng) * ldexpf(1.0f, (int)mdc_rnd(rng, -3, 2));
	mdc_poison(c);
	c->a = (struct kern_moe_decode_args){
		.n_tokens = T, .top_k = (int)K, .n_experts = E, .expert_offsets = c->off, .row_src = c->row_src,
		.slot_row = c->slot_row, .row_weight = s->row_weight ? c->rw : NULL, .x = c->x, .h = c->h, .y = c->y,
		.out = c->out, .w1 = c->w1, .w3 = c->w3, .w2 = c->w2, .act_quant_block = 128,
		.swiglu_limit = s->limit, .bf16_round = s->bf16_round};
	return ST_OK;
}

#endif
