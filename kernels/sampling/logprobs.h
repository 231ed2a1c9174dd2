/*
 * kernels/sampling/logprobs.h: op "token_logprobs", the log-probabilities of
 * given tokens over a batch of logit rows (prompt log-probabilities: row i
 * holds the logits after position p, target[i] is the prompt token at p+1).
 *
 * Per row, with the semantics of sampling.h stage 0 (raw logits, nothing
 * applied): lse = max + log(sum exp(l - max)) (double sum), then
 *   logprob[i]  = (float)(l[target] - lse);
 *   rank[i]     = 1 + the number of tokens whose logit is strictly larger
 *                 than the target's (vLLM's rank; ties share a rank);
 *   top_ids / top_logprobs [i * n_top ..]: the n_top largest logits in
 *                 (logit desc, id asc) order as logprobs, exactly the
 *                 top_logprobs kern_sample_ref returns for the same row.
 * A target of -1 leaves logprob 0 and rank 0 (the top entries are still
 * written). Only these small outputs reach the host: the CUDA variant keeps
 * the logits on the device (one CTA per row) and copies back the results.
 * Where the float sums differ from the reference: the CUDA variant's
 * log-sum-exp is a double tree sum (~1e-7 relative on a logprob, as the
 * sample op's).
 */
#ifndef DSV4_KERNELS_SAMPLING_LOGPROBS_H
#define DSV4_KERNELS_SAMPLING_LOGPROBS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/sampling/sampling.h"

struct kern_token_logprobs_args {
	const float *logits;   /* [n_rows, ld]: device for CUDA, host for the CPU variant */
	int64_t ld;            /* elements between rows, >= vocab */
	uint32_t vocab;
	uint32_t n_rows;
	const int32_t *target; /* host [n_rows]: the token to score, or -1 */
	uint32_t n_top;        /* 0..KERN_SAMPLE_MAX_TOP_LOGPROBS */
	float *logprob;        /* host [n_rows] */
	int32_t *rank;         /* host [n_rows] */
	int32_t *top_ids;      /* host [n_rows * n_top] (may be NULL when n_top is 0) */
	float *top_logprobs;   /* host [n_rows * n_top] */
	void *work;            /* CUDA: device scratch, 256-byte aligned; CPU: unused */
	size_t work_bytes;     /* >= kern_token_logprobs_workspace_bytes(n_rows, n_top) */
	void *stream;          /* cudaStream_t for CUDA variants; the call waits for it */
};

/* Device scratch the CUDA variant needs for up to n_rows rows (targets in,
 * results out). */
size_t kern_token_logprobs_workspace_bytes(uint32_t n_rows, uint32_t n_top);

/* The CPU reference (host logits). ST_INVALID for bad arguments or a target
 * outside the vocabulary. */
enum status kern_token_logprobs_ref(const struct kern_token_logprobs_args *a) DSV4_WUR;

typedef enum status (*kern_token_logprobs_fn)(const struct kern_token_logprobs_args *a);
struct kern_op;
extern const struct kern_op kern_op_token_logprobs;

#endif
