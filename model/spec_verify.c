/*
 * model/spec_verify.c: the verify rule of speculative decoding (model/spec.h,
 * docs/speculation.md): the chain rule for deterministic drafts, drawn with
 * the plain sampler's own counter-based random numbers so that speculation
 * changes no output token, and the general min(1, p/q) rule for drafts
 * drawn from a distribution.
 */
#include "model/spec.h"

#include <string.h>

enum status spec_verify_chain(const float *logits, uint32_t vocab, const struct kern_sampling_params *p,
			      const struct kern_sample_history *h, uint64_t n_output, const int32_t *drafts,
			      uint32_t n_draft, int32_t *hist_work, void *sample_work, struct kern_sample_out *out,
			      uint32_t *n_out)
{
	*n_out = 0;
	if (n_draft > EXEC_SPEC_MAX_DRAFT || (n_draft && !drafts))
		return ST_INVALID;
	/* the history row i sees: the output so far, then d1..di */
	struct kern_sample_history hh = *h;
	if (n_draft && h->n_output)
		memcpy(hist_work, h->output_ids, h->n_output * sizeof(int32_t));
	if (n_draft)
		hh.output_ids = hist_work;
	for (uint32_t i = 0; i <= n_draft; i++) {
		enum status st = kern_sample_ref(logits + (size_t)i * vocab, vocab, p, &hh, n_output + i, sample_work,
						 &out[i]);
		if (st)
			return st;
		(*n_out)++;
		if (i == n_draft || out[i].token_id != drafts[i])
			break; /* the target's own token: the correction, or the bonus after the last draft */
		hist_work[hh.n_output++] = drafts[i];
	}
	return ST_OK;
}

enum status spec_rule_general(const float *p, const float *q, uint32_t vocab, int32_t d, double u_accept,
			      double u_resample, int32_t *token, bool *accepted)
{
	*accepted = false;
	*token = -1;
	if (d < 0 || (uint32_t)d >= vocab || !(q[d] > 0.0f))
		return ST_INVALID;
	if (u_accept * (double)q[d] < (double)p[d]) {
		*accepted = true;
		*token = d;
		return ST_OK;
	}
	double mass = 0.0;
	for (uint32_t v = 0; v < vocab; v++)
		if (p[v] > q[v])
			mass += (double)p[v] - (double)q[v];
	if (!(mass > 0.0))
		return ST_INVALID;
	double target = u_resample * mass, acc = 0.0;
	int32_t last = -1;
	for (uint32_t v = 0; v < vocab; v++) {
		if (!(p[v] > q[v]))
			continue;
		acc += (double)p[v] - (double)q[v];
		last = (int32_t)v;
		if (target < acc)
			break;
	}
	*token = last;
	return ST_OK;
}
