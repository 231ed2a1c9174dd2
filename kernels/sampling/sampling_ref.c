/*
 * kernels/sampling/sampling_ref.c: the CPU reference of the sampling op.
 *
 * One variant, written to be obviously right rather than fast: fp32 logits,
 * double accumulation for softmax sums, a full sort of the surviving
 * candidates. The CPU executor calls it once per sampled sequence; GPU
 * variants are checked against it. The semantics (stage order, tie rules,
 * the counter-based RNG) are fixed in sampling.h.
 */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t kern_sample_workspace_bytes(uint32_t vocab)
{
	/* logits copy (float) + output counts (uint32) + candidate ids (uint32) */
	return (size_t)vocab * (sizeof(float) + 2 * sizeof(uint32_t)) + 64;
}

/* Descending value, then ascending id: the one candidate order every stage uses. */
static int cmp_desc(const void *a, const void *b, void *ctx)
{
	const float *l = ctx;
	uint32_t ia = *(const uint32_t *)a, ib = *(const uint32_t *)b;
	if (l[ia] > l[ib])
		return -1;
	if (l[ia] < l[ib])
		return 1;
	return ia < ib ? -1 : ia > ib;
}

#define SEEN_IN_PROMPT 0x80000000u

static inline bool masked_out(const uint32_t *m, uint32_t v) { return m && !(m[v >> 5] >> (v & 31) & 1u); }

/* Top-n of the raw logits as logprobs (n <= KERN_SAMPLE_MAX_TOP_LOGPROBS). */
static void raw_logprobs(const float *logits, const uint32_t *m, uint32_t vocab, uint32_t n, double lse,
			 struct kern_sample_out *out)
{
	uint32_t k = 0;
	for (uint32_t v = 0; v < vocab; v++) {
		if (masked_out(m, v))
			continue;
		/* insertion into a sorted list of at most n entries; strict > keeps lower id first on ties */
		if (k == n && !(logits[v] > logits[out->top_ids[k - 1]]))
			continue;
		uint32_t pos = k < n ? k++ : n - 1;
		while (pos > 0 && logits[v] > logits[out->top_ids[pos - 1]]) {
			out->top_ids[pos] = out->top_ids[pos - 1];
			pos--;
		}
		out->top_ids[pos] = (int32_t)v;
	}
	out->n_top = k;
	for (uint32_t i = 0; i < k; i++)
		out->top_logprobs[i] = (float)((double)logits[out->top_ids[i]] - lse);
}

enum status kern_sample_ref(const float *logits, uint32_t vocab, const struct kern_sampling_params *p,
			    const struct kern_sample_history *h, uint64_t counter, void *work,
			    struct kern_sample_out *out)
{
	if (!vocab || !logits || !p || !work || !out)
		return ST_INVALID;
	if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) ||
	    !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !(p->repetition_penalty > 0.0f) ||
	    p->top_logprobs > KERN_SAMPLE_MAX_TOP_LOGPROBS)
		return ST_INVALID;
	memset(out, 0, sizeof(*out));

	float *l = work;
	uint32_t *cnt = (uint32_t *)(l + vocab);
	uint32_t *cand = cnt + vocab;
	memcpy(l, logits, (size_t)vocab * sizeof(float));
	const uint32_t *m = p->allow_mask;

	/* -1. allowed tokens (the logprobs below are over them only) */
	if (m)
		for (uint32_t v = 0; v < vocab; v++)
			if (masked_out(m, v))
				l[v] = -INFINITY;

	/* 0. raw logprobs */
	double lse = 0.0;
	bool want_lp = p->logprobs || p->top_logprobs > 0;
	if (want_lp) {
		float mx = -INFINITY;
		for (uint32_t v = 0; v < vocab; v++)
			if (!masked_out(m, v))
				mx = fmaxf(mx, logits[v]);
		double s = 0.0;
		for (uint32_t v = 0; v < vocab; v++)
			if (!masked_out(m, v))
				s += exp((double)logits[v] - (double)mx);
		lse = (double)mx + log(s);
		if (p->top_logprobs)
			raw_logprobs(logits, m, vocab, p->top_logprobs, lse, out);
	}

	/* 1. logit bias */
	for (uint32_t i = 0; i < p->n_logit_bias; i++) {
		int32_t id = p->logit_bias[i].token_id;
		if (id < 0 || (uint32_t)id >= vocab)
			return ST_INVALID;
		l[id] += p->logit_bias[i].bias;
	}

	/* 2-3. penalties */
	bool rep = p->repetition_penalty != 1.0f;
	bool freq = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
	if (h && (rep || freq)) {
		memset(cnt, 0, (size_t)vocab * sizeof(uint32_t));
		for (size_t i = 0; i < h->n_prompt; i++) {
			if (h->prompt_ids[i] < 0 || (uint32_t)h->prompt_ids[i] >= vocab)
				return ST_INVALID;
			cnt[h->prompt_ids[i]] |= SEEN_IN_PROMPT;
		}
		for (size_t i = 0; i < h->n_output; i++) {
			if (h->output_ids[i] < 0 || (uint32_t)h->output_ids[i] >= vocab)
				return ST_INVALID;
			cnt[h->output_ids[i]]++;
		}
		for (uint32_t v = 0; v < vocab; v++) {
			if (!cnt[v])
				continue;
			uint32_t c = cnt[v] & ~SEEN_IN_PROMPT;
			if (rep)
				l[v] = l[v] > 0.0f ? l[v] / p->repetition_penalty : l[v] * p->repetition_penalty;
			if (c)
				l[v] -= p->frequency_penalty * (float)c + p->presence_penalty;
		}
	}

	int32_t chosen = 0;
	if (p->temperature == 0.0f) {
		/* 4. exact argmax, lowest id on ties */
		for (uint32_t v = 1; v < vocab; v++)
			if (l[v] > l[chosen])
				chosen = (int32_t)v;
	} else {
		/* 5. temperature + softmax (probabilities overwrite l) */
		float mx = -INFINITY;
		for (uint32_t v = 0; v < vocab; v++) {
			l[v] /= p->temperature;
			mx = fmaxf(mx, l[v]);
		}
		double s = 0.0;
		for (uint32_t v = 0; v < vocab; v++) {
			l[v] = expf(l[v] - mx);
			s += l[v];
		}
		for (uint32_t v = 0; v < vocab; v++)
			l[v] = (float)(l[v] / s);
		float pmax = 0.0f;
		for (uint32_t v = 0; v < vocab; v++)
			pmax = fmaxf(pmax, l[v]);

		/* 6. min_p, collecting candidates; a token of probability 0 (a -inf
		 * bias, or underflow) is never a candidate */
		uint32_t n = 0;
		float thr = p->min_p * pmax;
		for (uint32_t v = 0; v < vocab; v++)
			if (l[v] > 0.0f && l[v] >= thr)
				cand[n++] = v;
		if (!n) /* pmax itself always passes; only reachable with NaN logits */
			return ST_INVALID;
		qsort_r(cand, n, sizeof(*cand), cmp_desc, l);

		/* 7. top_k */
		if (p->top_k > 0 && (uint32_t)p->top_k < n)
			n = (uint32_t)p->top_k;

		/* 8. top_p over the mass that survived 6-7 */
		double mass = 0.0;
		for (uint32_t i = 0; i < n; i++)
			mass += l[cand[i]];
		if (p->top_p < 1.0f) {
			double target = (double)p->top_p * mass, c = 0.0;
			uint32_t keep = n;
			for (uint32_t i = 0; i < n; i++) {
				c += l[cand[i]];
				if (c >= target) {
					keep = i + 1;
					break;
				}
			}
			n = keep;
			mass = 0.0;
			for (uint32_t i = 0; i < n; i++)
				mass += l[cand[i]];
		}

		/* 9. inverse CDF with the counter-based uniform */
		double u = kern_sample_uniform(p->seed, counter) * mass, c = 0.0;
		chosen = (int32_t)cand[n - 1];
		for (uint32_t i = 0; i < n; i++) {
			c += l[cand[i]];
			if (c > u) {
				chosen = (int32_t)cand[i];
				break;
			}
		}
	}
	out->token_id = chosen;
	if (want_lp)
		out->logprob = (float)((double)logits[chosen] - lse);
	return ST_OK;
}
