/*
 * scheduler/limits.h: the scheduler's named limits, with units and reasons.
 */
#ifndef DSV4_SCHEDULER_LIMITS_H
#define DSV4_SCHEDULER_LIMITS_H

/* Default block span; DSv4 recipes use 256 (serving.md 3.3), a multiple of both compress ratios (4, 128)
 * and >= the 128-token sliding window, as model/exec.h requires. */
#define SCHED_DEFAULT_BLOCK_TOKENS 256
/* vLLM's API-server default for >= 70 GiB GPUs (serving.md 3.1). */
#define SCHED_DEFAULT_MAX_BATCHED_TOKENS 8192
#define SCHED_DEFAULT_MAX_NUM_SEQS 256
/* Bound on requests waiting (not yet running); beyond it submit refuses with 429. */
#define SCHED_DEFAULT_MAX_QUEUED_REQUESTS 1024
/* OpenAI allows n up to 128; each choice is a sequence with its own blocks past the prompt. */
#define SCHED_MAX_N 128
/* OpenAI allows 4 stop strings; we allow a few more for agent tools. */
#define SCHED_MAX_STOP_STRINGS 16
/* One stop string's bytes: the hold-back buffer is bounded by this. */
#define SCHED_MAX_STOP_STRING_BYTES 256
#define SCHED_MAX_STOP_TOKEN_IDS 64
/* OpenAI's logit_bias maps at most 300 tokens. */
#define SCHED_MAX_LOGIT_BIAS 300
/* top_logprobs / prompt_logprobs: what the sampling op returns (OpenAI's limit too). */
#define SCHED_MAX_TOP_LOGPROBS 20
/* Bytes one token's text may take (byte-level BPE pieces are far shorter). */
#define SCHED_MAX_TOKEN_BYTES 256

/* Events one request's stream may hold that its consumer has not taken (a
 * slow SSE reader): past this the request is aborted instead of queueing
 * for as long as it generates (issue 17); sched_set_stream_backlog_bytes. */
#define SCHED_DEFAULT_STREAM_BACKLOG_BYTES ((size_t)4 << 20)

#endif
