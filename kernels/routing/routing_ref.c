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
