/*
 * kernels/routing/routing_ref.c: CPU reference of sqrt(softplus) routing with
 * bias-corrected top-k or hash routing, and the by-expert grouping
 * (dsv4.md §3.9).
 */
#include "kernels/routing/routing.h"

#include <math.h>

/* softplus(x) = log(1 + e^x), computed without overflow (torch's threshold 20). */
static inline float softplus(float x)
{
	return x > 20.0f ? x : log1pf(expf(x));
}

enum status kern_route_ref(const struct kern_route_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_experts <= 0 || a->top_k <= 0 || a->top_k > a->n_experts ||
	    a->top_k > KERN_ROUTE_MAX_TOPK)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->logits || !a->expert_ids || !a->weights || (a->tid2eid && (!a->token_ids || a->vocab <= 0)))
		return ST_INVALID;
	int E = a->n_experts, K = a->top_k;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		const float *l = a->logits + t * E;
		int32_t *ids = a->expert_ids + t * K;
		float *w = a->weights + t * K;
		if (a->tid2eid) {
			int64_t tok = a->token_ids[t];
			if (tok < 0 || tok >= a->vocab)
				return ST_INVALID;
			for (int j = 0; j < K; j++) {
				int32_t e = a->tid2eid[tok * K + j];
				if (e < 0 || e >= E)
					return ST_INVALID;
				ids[j] = e;
			}
		} else {
			/* Selection sort of the k best biased scores; strict '>' keeps the
			 * lower expert id on ties. O(k·E), fine for a reference. */
			for (int j = 0; j < K; j++) {
				int best = -1;
				float bs = 0;
				for (int e = 0; e < E; e++) {
					bool used = false;
					for (int q = 0; q < j; q++)
						used |= ids[q] == e;
					if (used)
						continue;
					float s = sqrtf(softplus(l[e])) + (a->bias ? a->bias[e] : 0.0f);
					if (best < 0 || s > bs) {
						best = e;
						bs = s;
					}
				}
				ids[j] = best;
			}
		}
		float sum = 0;
		for (int j = 0; j < K; j++) {
			w[j] = sqrtf(softplus(l[ids[j]]));
			sum += w[j];
		}
		/* The reference divides by the plain sum (σ > 0 always, so sum > 0). */
		for (int j = 0; j < K; j++)
			w[j] = w[j] / sum * a->route_scale;
	}
	return ST_OK;
}

enum status kern_moe_group_ref(const struct kern_moe_group_args *a)
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_local <= 0 || !a->offsets ||
	    (a->n_tokens > 0 && (!a->expert_ids || !a->pair_token || !a->pair_slot)))
		return ST_INVALID;
	int64_t n_pairs = a->n_tokens * a->top_k;
	for (int i = 0; i <= a->n_local; i++)
		a->offsets[i] = 0;
	/* histogram, exclusive scan, stable scatter */
	for (int64_t p = 0; p < n_pairs; p++) {
		int e = a->expert_ids[p] - a->expert_begin;
		if (a->expert_ids[p] >= 0 && e >= 0 && e < a->n_local)
			a->offsets[e + 1]++;
	}
	for (int i = 0; i < a->n_local; i++)
		a->offsets[i + 1] += a->offsets[i];
	/* offsets[e] is now the start of e; use it as the scatter cursor, which
	 * leaves offsets[e] = start of e+1, then shift back by one. No scratch. */
	for (int64_t p = 0; p < n_pairs; p++) {
		int e = a->expert_ids[p] - a->expert_begin;
		if (a->expert_ids[p] < 0 || e < 0 || e >= a->n_local)
			continue;
		int32_t at = a->offsets[e]++;
		a->pair_token[at] = (int32_t)(p / a->top_k);
		a->pair_slot[at] = (int32_t)(p % a->top_k);
	}
	for (int i = a->n_local - 1; i > 0; i--)
		a->offsets[i] = a->offsets[i - 1];
	a->offsets[0] = 0;
	return ST_OK;
}
