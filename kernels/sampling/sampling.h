/*
 * kernels/sampling/sampling.h: per-sequence token sampling, the op that turns
 * one row of logits into one token id (plus requested logprobs).
 *
 * Sampling is an executor op (design.md "The executor"): the scheduler sends
 * these parameters with the step plan, logits never leave the device, and only
 * the sampled id and the requested logprobs come back. This header fixes the
 * semantics every variant must implement; sampling_ref.c is the CPU reference.
 *
 * Order of operations (each stage is skipped when its parameter is neutral):
 *  -1. allow_mask (structured outputs, model/gram.h): tokens whose bit is
 *                 clear get logit -inf before anything else, so the logprobs
 *                 below are those of the constrained distribution (as vLLM
 *                 reports them) and masked tokens never appear in top_logprobs.
 *                 Only the CPU reference implements it: executors sample a
 *                 row that carries a mask on the host.
 *   0. logprobs:  log_softmax of the RAW logits (before bias, penalties and
 *                 temperature; vLLM's default "raw_logprobs" mode). The chosen
 *                 token's logprob and the top_logprobs come from this.
 *   1. logit_bias: logit[id] += bias.
 *   2. repetition_penalty r (tokens seen in prompt or output): logit > 0 ?
 *                 logit / r : logit * r.
 *   3. frequency / presence penalties (tokens seen in the output only):
 *                 logit -= frequency * count + presence * (count > 0).
 *   4. temperature == 0: exact argmax of the logits after 1-3 (lowest id on
 *                 ties); stages 5-8 are skipped.
 *   5. logit /= temperature; p = softmax.
 *   6. min_p:     drop tokens with p < min_p * max(p); tokens with p == 0 (a
 *                 -inf bias, which the scheduler uses to mask tokens) never survive.
 *   7. top_k:     keep the k most probable (ties: lower id first).
 *   8. top_p:     keep the smallest most-probable prefix whose mass >= top_p
 *                 (of the mass left after 6-7); at least one token survives.
 *   9. draw u = kern_sample_uniform(seed, counter) in [0,1) and pick the first
 *      token (in descending probability, lower id on ties) whose cumulative
 *      renormalised probability exceeds u.
 *
 * Determinism: the random number is a pure function of (seed, counter), where
 * the counter is the index of the token being sampled in that sequence's
 * output. Results therefore do not depend on batch composition, step
 * boundaries or preemption. Every variant must use kern_sample_uniform().
 */
#ifndef DSV4_KERNELS_SAMPLING_H
#define DSV4_KERNELS_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* OpenAI caps top_logprobs at 20. */
#define KERN_SAMPLE_MAX_TOP_LOGPROBS 20

struct kern_logit_bias {
	int32_t token_id;
	float bias; /* added to the logit; OpenAI allows [-100, 100]; -INFINITY masks the token */
};

struct kern_sampling_params {
	float temperature;        /* 0 = greedy (exact argmax); > 0 otherwise */
	float top_p;              /* (0, 1]; 1 = off */
	int32_t top_k;            /* <= 0 = off */
	float min_p;              /* [0, 1]; 0 = off */
	float presence_penalty;   /* [-2, 2]; 0 = off */
	float frequency_penalty;  /* [-2, 2]; 0 = off */
	float repetition_penalty; /* > 0; 1 = off */
	uint64_t seed;            /* always set: the scheduler draws one when the request has none */
	const struct kern_logit_bias *logit_bias; /* n_logit_bias entries, may be NULL */
	uint32_t n_logit_bias;
	const uint32_t *allow_mask; /* NULL, or (vocab + 31) / 32 words: bit v of word v / 32 = token v allowed */
	bool logprobs;            /* return the chosen token's logprob */
	uint32_t top_logprobs;    /* 0..KERN_SAMPLE_MAX_TOP_LOGPROBS; implies logprobs */
};

/* The token history the penalties look at (host arrays, borrowed). */
struct kern_sample_history {
	const int32_t *prompt_ids;
	size_t n_prompt;
	const int32_t *output_ids;
	size_t n_output;
};

struct kern_sample_out {
	int32_t token_id;
	float logprob;      /* raw logprob of token_id (0 when not requested) */
	uint32_t n_top;     /* number of valid top entries */
	int32_t top_ids[KERN_SAMPLE_MAX_TOP_LOGPROBS];      /* descending logprob, lower id on ties */
	float top_logprobs[KERN_SAMPLE_MAX_TOP_LOGPROBS];
};

/* Uniform double in [0, 1) from (seed, counter): a counter-based generator
 * (two splitmix64 finalisation rounds over seed and counter), so any device
 * computes the same value without carrying RNG state between steps. */
static inline double kern_sample_uniform(uint64_t seed, uint64_t counter)
{
	uint64_t x = seed ^ (counter * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
	for (int r = 0; r < 2; r++) {
		x += 0x9E3779B97F4A7C15ull;
		x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
		x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
		x ^= x >> 31;
	}
	return (double)(x >> 11) * 0x1.0p-53;
}

/* Bytes of scratch kern_sample_ref() needs for a vocabulary of vocab entries. */
size_t kern_sample_workspace_bytes(uint32_t vocab);

/* Sample one token from logits[vocab] (fp32, host). work: at least
 * kern_sample_workspace_bytes(vocab) bytes, 8-byte aligned, caller-owned.
 * counter: index of this token in the sequence's output (0 for the first).
 * Returns ST_INVALID for bad parameters (vocab 0, temperature < 0, top_p out
 * of (0,1], a bias or history id outside the vocabulary), ST_OK otherwise. */
enum status kern_sample_ref(const float *logits, uint32_t vocab, const struct kern_sampling_params *p,
			    const struct kern_sample_history *h, uint64_t counter, void *work,
			    struct kern_sample_out *out) DSV4_WUR;

/* ---- the batched op "sample" (registry; kernels/sampling/sampling_variants.c) ----
 *
 * One call samples n_rows rows of a logits matrix with per-row parameters,
 * histories and counters, with exactly the semantics above. Variants:
 *   sample_cpu_ref       kern_sample_ref per row; logits and work on the host.
 *   sample_cuda_generic  logits and work on the device (sampling_generic.cu):
 *     parameters, logit biases and the histories the penalties need go up
 *     into the scratch, the penalty counts are made on the device, and only
 *     the kern_sample_out rows come back; the call waits for the stream, so
 *     out is filled when it returns. Greedy rows, the penalties, the biases
 *     and the top_logprobs ids are bit-identical to the reference. Where the
 *     float arithmetic differs:
 *       - softmax sums (the raw log-sum-exp and the temperature softmax's
 *         normaliser) are double sums in a tree order instead of a
 *         sequential one, and exp is the device's double exp rounded to
 *         float where the reference calls the host's expf, so a probability
 *         can differ in its last bit (and logprobs by ~1e-7 relative);
 *       - the cumulative sums of top_p and of the draw are double prefix
 *         sums over contiguous chunks (a block scan) instead of one
 *         sequential sum.
 *     A draw whose u lands within that rounding (~1e-15 relative) of a
 *     cumulative boundary, a top_p cut exactly at a boundary, a min_p
 *     threshold or two probabilities that tie in one and not the other can
 *     pick a different token: rare (tests require >= 99.9 % identical ids).
 *     NaN logits are outside the contract (the reference's own answer then
 *     depends on its scan order). A row whose candidates are all gone (NaN
 *     logits) makes the call return ST_INVALID, as the reference does. */
struct kern_sample_batch_args {
	const float *logits;                       /* [n_rows, ld]: device for CUDA, host for the CPU variant */
	int64_t ld;                                /* elements between rows, >= vocab */
	uint32_t vocab;
	uint32_t n_rows;
	const struct kern_sampling_params *params; /* host [n_rows] */
	const struct kern_sample_history *hist;    /* host [n_rows], or NULL: no history */
	const uint64_t *counter;                   /* host [n_rows]: index of the token in its output */
	struct kern_sample_out *out;               /* host [n_rows] */
	void *work;                                /* scratch, 256-byte aligned (device for CUDA) */
	size_t work_bytes;                         /* >= kern_sample_batch_workspace_bytes(...) */
	void *stream;                              /* cudaStream_t for CUDA variants */
};

/* Logit-bias entries plus history ids of a batch: the n_aux argument of
 * kern_sample_batch_workspace_bytes that this batch needs. */
size_t kern_sample_batch_aux_count(const struct kern_sampling_params *params, const struct kern_sample_history *hist,
				   uint32_t n_rows);
/* Scratch every variant of op "sample" needs for up to n_rows rows of vocab
 * logits carrying up to n_aux logit-bias entries plus history ids in all
 * (about 29 bytes per logit, 1 MiB, and 8 bytes per aux entry). */
size_t kern_sample_batch_workspace_bytes(uint32_t vocab, uint32_t n_rows, size_t n_aux);

/* The CPU variant: kern_sample_ref per row (host logits and work). Returns
 * the first row's error. */
enum status kern_sample_batch_ref(const struct kern_sample_batch_args *a) DSV4_WUR;

typedef enum status (*kern_sample_batch_fn)(const struct kern_sample_batch_args *a);
struct kern_op;
extern const struct kern_op kern_op_sample;

#endif
