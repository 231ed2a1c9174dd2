/*
 * tests/model/route_gap.h: the smallest routing margin of a CPU run, for tests
 * that compare two summation orders (world sizes) on random prompts.
 *
 * A learned MoE layer keeps the top_k experts by biased score; where the k-th
 * and the (k+1)-th scores are closer than the two orders' rounding (~1e-6 on
 * the tiny models), the two runs may pick different experts, with correct
 * code, and their logits then differ by far more than any summation-order
 * tolerance. Measured on the tiny fp8 checkpoint (model_forward_tp, seed 7):
 * world size 2's scores differ from world size 1's by up to 9.1e-7 (3200
 * scores), and the margins have a density of about 2-15 per unit near 0, so
 * a run of a few hundred to a few thousand decisions routes a near-tie the
 * other way about once in 10^3-10^4 runs. Such a test measures the margins
 * of its reference run with rg_begin()/rg_end() and draws other inputs when
 * the smallest is under RG_NEAR_TIE (22 times the largest measured difference;
 * the differences are sums of roundings, ~2.6e-7 one sigma).
 *
 * rg_install() must come before the executors are created (the registry's
 * profiling hook wraps the variants selected after it); only CPU variants
 * may run while it is active (the hook reads the gate logits on the host).
 */
#ifndef DSV4_TESTS_MODEL_ROUTE_GAP_H
#define DSV4_TESTS_MODEL_ROUTE_GAP_H

#include <math.h>
#include <string.h>

#include "kernels/registry/registry.h"
#include "kernels/routing/routing.h"

#define RG_NEAR_TIE 2e-5

static double rg__min_gap = INFINITY;
static long rg__n;

static void rg__before(void *user, const struct kern_op *op, const struct kern_variant *base, const void *args)
{
	(void)user;
	(void)base;
	const struct kern_route_args *a = args;
	if (strcmp(op->name, "route") || a->tid2eid || a->top_k >= a->n_experts || a->n_experts > 4096)
		return;
	double s[4096];
	for (int64_t t = 0; t < a->n_tokens; t++) {
		for (int e = 0; e < a->n_experts; e++) {
			double l = a->logits[t * a->n_experts + e];
			s[e] = sqrt(l > 20 ? l : log1p(exp(l))) + (a->bias ? a->bias[e] : 0.0);
		}
		/* the top_k + 1 largest, descending (insertion) */
		double top[KERN_ROUTE_MAX_TOPK + 1];
		int n = 0;
		for (int e = 0; e < a->n_experts; e++) {
			int i = n < a->top_k + 1 ? n++ : a->top_k + 1;
			if (i == a->top_k + 1 && !(s[e] > top[a->top_k]))
				continue;
			if (i == a->top_k + 1)
				i = a->top_k;
			while (i > 0 && top[i - 1] < s[e]) {
				top[i] = top[i - 1];
				i--;
			}
			top[i] = s[e];
		}
		double kth = top[a->top_k - 1], next = top[a->top_k];
		rg__min_gap = fmin(rg__min_gap, kth - next);
		rg__n++;
	}
}

static inline void rg_install(void)
{
	static const struct kern_profile_hooks h = {.before = rg__before};
	kern_profile_install(&h);
}

static inline void rg_begin(void)
{
	rg__min_gap = INFINITY;
	rg__n = 0;
	kern_profile_set_active(true);
}

/* The smallest margin since rg_begin() (INFINITY when nothing was routed). */
static inline double rg_end(long *n_decisions)
{
	kern_profile_set_active(false);
	if (n_decisions)
		*n_decisions = rg__n;
	return rg__min_gap;
}

#endif
