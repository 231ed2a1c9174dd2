/*
 * kernels/sampling/logprobs_ref.c: the CPU reference of op "token_logprobs"
 * (logprobs.h), and the scratch size every variant agrees on. Same sums and
 * the same top-n order as kern_sample_ref's raw logprobs, so a prompt
 * token's logprob and a sampled token's agree bit for bit on one row.
 */
#include "kernels/sampling/logprobs.h"

#include <math.h>

size_t kern_token_logprobs_workspace_bytes(uint32_t n_rows, uint32_t n_top)
{
	/* targets, logprobs, ranks, top ids, top logprobs; 256-byte aligned parts */
	size_t r = ((size_t)n_rows * 4 + 255) & ~(size_t)255;
	size_t t = ((size_t)n_rows * n_top * 4 + 255) & ~(size_t)255;
	return 3 * r + 2 * t + 256;
}

static void row(const float *l, uint32_t vocab, int32_t target, uint32_t n_top, float *lp, int32_t *rank,
		int32_t *top_ids, float *top_lp)
{
	float mx = -INFINITY;
	for (uint32_t v = 0; v < vocab; v++)
		mx = fmaxf(mx, l[v]);
	double s = 0.0;
	for (uint32_t v = 0; v < vocab; v++)
		s += exp((double)l[v] - (double)mx);
	double lse = (double)mx + log(s);
	*lp = 0.0f;
	*rank = 0;
	if (target >= 0) {
		float t = l[target];
		int32_t above = 0;
		for (uint32_t v = 0; v < vocab; v++)
			above += l[v] > t;
		*lp = (float)((double)t - lse);
		*rank = above + 1;
	}
	/* insertion into a sorted list of at most n_top; strict > keeps the lower id first on ties */
	uint32_t k = 0;
	for (uint32_t v = 0; v < vocab && n_top; v++) {
		if (k == n_top && !(l[v] > l[top_ids[k - 1]]))
			continue;
		uint32_t pos = k < n_top ? k++ : n_top - 1;
		while (pos > 0 && l[v] > l[top_ids[pos - 1]]) {
			top_ids[pos] = top_ids[pos - 1];
			pos--;
		}
		top_ids[pos] = (int32_t)v;
	}
	for (uint32_t i = 0; i < n_top; i++)
		top_lp[i] = i < k ? (float)((double)l[top_ids[i]] - lse) : -INFINITY;
	for (uint32_t i = k; i < n_top; i++)
		top_ids[i] = -1;
}

enum status kern_token_logprobs_ref(const struct kern_token_logprobs_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab || a->n_top > KERN_SAMPLE_MAX_TOP_LOGPROBS)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits || !a->target || !a->logprob || !a->rank || (a->n_top && (!a->top_ids || !a->top_logprobs)))
		return ST_INVALID;
	for (uint32_t r = 0; r < a->n_rows; r++)
		if (a->target[r] < -1 || a->target[r] >= (int32_t)a->vocab)
			return ST_INVALID;
	for (uint32_t r = 0; r < a->n_rows; r++)
		row(a->logits + (size_t)r * (size_t)a->ld, a->vocab, a->target[r], a->n_top, &a->logprob[r], &a->rank[r],
		    a->top_ids ? a->top_ids + (size_t)r * a->n_top : NULL,
		    a->top_logprobs ? a->top_logprobs + (size_t)r * a->n_top : NULL);
	return ST_OK;
}
