/*
 * kernels/sampling/sampling_layout.h: the scratch layout of the device
 * sampling op (sampling_generic.cu), shared with the C side so that
 * kern_sample_batch_workspace_bytes (sampling_batch.c) and the variant agree
 * on the size. Internal to kernels/sampling/.
 *
 * Regions, each 256-byte aligned:
 *   rows    struct kern__sample_row [n_rows]: the parameters as the device reads them
 *   aux     logit-bias entries, then the history ids (8 bytes per aux entry)
 *   l       float [n_rows * vocab]: processed logits, then probabilities
 *   keys    2 x uint64 [n_rows * vocab]: the radix sort's double buffer
 *           (the second also holds the penalty counts before the sort)
 *   vals    2 x uint32 [n_rows * vocab]: token ids through the sort
 *   res     struct kern__sample_res [n_rows]
 *   out     struct kern_sample_out [n_rows]: what comes back to the host
 *   sort    CUB's temporary storage: a bound of one byte per item + 1 MiB
 *           (its onesweep lookback needs under half a byte per item; the
 *           variant checks CUB's exact figure against it)
 */
#ifndef DSV4_KERNELS_SAMPLING_LAYOUT_H
#define DSV4_KERNELS_SAMPLING_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/sampling/sampling.h"

/* One row's parameters on the device. */
struct kern__sample_row {
	float temperature, top_p, min_p, presence, frequency, repetition;
	int32_t top_k;
	uint32_t top_logprobs;
	int32_t want_lp;       /* logprobs or top_logprobs asked */
	int32_t samp;          /* index among the rows with temperature > 0; -1 for greedy rows */
	int32_t rep_on;        /* repetition penalty active (prompt ids uploaded) */
	int32_t freq_on;       /* frequency / presence penalty active */
	double u;              /* kern_sample_uniform(seed, counter) */
	uint64_t bias_off, n_bias;   /* entries in the bias region */
	uint64_t prompt_off, n_prompt, output_off, n_output; /* ids in the id region */
};

/* Per-row results of the first kernel. */
struct kern__sample_res {
	double lse;            /* raw log-sum-exp (when logprobs are wanted) */
	uint32_t n_cand;       /* tokens that survive min_p */
	uint32_t pad;
};

struct kern__sample_layout {
	size_t rows, aux, l, keys_a, keys_b, vals_a, vals_b, res, out, sort, sort_bytes, total;
};

static inline size_t kern__sample_align(size_t x)
{
	return (x + 255) & ~(size_t)255;
}

static inline void kern__sample_layout(uint32_t vocab, uint32_t n_rows, size_t n_aux, struct kern__sample_layout *L)
{
	size_t items = (size_t)vocab * n_rows, o = 0;
	L->rows = o;
	o += kern__sample_align(n_rows * sizeof(struct kern__sample_row));
	L->aux = o;
	o += kern__sample_align(n_aux * 8);
	L->l = o;
	o += kern__sample_align(items * sizeof(float));
	L->keys_a = o;
	o += kern__sample_align(items * sizeof(uint64_t));
	L->keys_b = o;
	o += kern__sample_align(items * sizeof(uint64_t));
	L->vals_a = o;
	o += kern__sample_align(items * sizeof(uint32_t));
	L->vals_b = o;
	o += kern__sample_align(items * sizeof(uint32_t));
	L->res = o;
	o += kern__sample_align(n_rows * sizeof(struct kern__sample_res));
	L->out = o;
	o += kern__sample_align(n_rows * sizeof(struct kern_sample_out));
	L->sort = o;
	L->sort_bytes = items + ((size_t)1 << 20);
	o += kern__sample_align(L->sort_bytes);
	L->total = o;
}

#endif
