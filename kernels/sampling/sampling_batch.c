/*
 * kernels/sampling/sampling_batch.c: the batched sampling op's CPU variant
 * (kern_sample_ref per row) and the scratch size every variant of op
 * "sample" agrees on (sampling.h).
 */
#include "kernels/sampling/sampling.h"

#include "kernels/sampling/sampling_layout.h"

size_t kern_sample_batch_aux_count(const struct kern_sampling_params *params, const struct kern_sample_history *hist,
				   uint32_t n_rows)
{
	size_t n = 0;
	for (uint32_t r = 0; params && r < n_rows; r++) {
		n += params[r].n_logit_bias;
		if (hist)
			n += hist[r].n_prompt + hist[r].n_output;
	}
	return n;
}

size_t kern_sample_batch_workspace_bytes(uint32_t vocab, uint32_t n_rows, size_t n_aux)
{
	struct kern__sample_layout L;
	kern__sample_layout(vocab, n_rows, n_aux, &L);
	size_t cpu = kern_sample_workspace_bytes(vocab);
	return L.total > cpu ? L.total : cpu;
}

enum status kern_sample_batch_ref(const struct kern_sample_batch_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab || !a->params || !a->counter || !a->out)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits || !a->work || ((uintptr_t)a->work & 7) || a->work_bytes < kern_sample_workspace_bytes(a->vocab))
		return ST_INVALID;
	for (uint32_t r = 0; r < a->n_rows; r++) {
		enum status st = kern_sample_ref(a->logits + (size_t)r * (size_t)a->ld, a->vocab, &a->params[r],
						 a->hist ? &a->hist[r] : NULL, a->counter[r], a->work, &a->out[r]);
		if (st)
			return st;
	}
	return ST_OK;
}
