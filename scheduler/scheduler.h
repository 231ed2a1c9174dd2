/*
 * scheduler/scheduler.h: requests, admission, step planning, paged blocks with
 * prefix caching, preemption, stop handling and the metrics snapshot.
 *
 * Two layers:
 *   struct sched       the single-threaded core. sched_submit / sched_abort /
 *                      sched_step are called from ONE thread (the step loop,
 *                      or a test). Events go out through each request's
 *                      on_event callback, called on that thread.
 *   struct sched_loop  the threaded wrapper the server uses: a step-loop
 *                      thread owns the core and the executor; other threads
 *                      submit and abort through locked queues and pull token
 *                      events from a per-request struct sched_stream without
 *                      ever blocking the step loop.
 * sched_stats_get() and sched_loop_stats() may be called from any thread.
 *
 * Policy (serving.md 3.3): each step schedules every running decode first,
 * then running prefills, then admits waiting requests, chunking prefills to
 * fill max_num_batched_tokens (chunked prefill is always on). A request's
 * prompt blocks are reserved when it is admitted; decodes that find no free
 * block preempt the newest running sequence (recompute: its blocks are
 * released and it returns to the head of the waiting queue, keeping its
 * generated tokens, which it later recomputes; the counter-based RNG makes its
 * final output identical).
 */
#ifndef DSV4_SCHEDULER_SCHEDULER_H
#define DSV4_SCHEDULER_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/exec.h"
#include "scheduler/limits.h"

/* ---- Options ---- */

/* Text of one token, for stop strings: write the bytes token_id decodes to
 * (byte-level BPE: the concatenation of pieces is the text; special tokens
 * give 0 bytes unless keep_special) into buf (cap bytes) and return the
 * count (<= cap). The server passes model_detok_piece (model/detok.h); the
 * bytes go through the sequence's streaming detokenizer, so events carry
 * whole UTF-8 characters. Called on the step-loop thread only. */
typedef uint32_t (*sched_detok_fn)(void *ctx, int32_t token_id, bool keep_special, char *buf, uint32_t cap);

enum sched_policy { SCHED_POLICY_FCFS = 0, SCHED_POLICY_PRIORITY = 1 };

struct sched_options {
	uint32_t max_num_seqs;           /* running sequences per step; 0 = default */
	uint32_t max_num_batched_tokens; /* tokens per step; 0 = default (clamped to the executor's) */
	uint32_t max_queued_requests;    /* waiting requests; 0 = default */
	uint32_t max_model_len;          /* prompt + output tokens; 0 = the executor's */
	enum sched_policy policy;
	bool disable_prefix_caching;     /* prefix caching is on unless set */
	sched_detok_fn detokenize;       /* (optional) needed for stop strings and event text */
	void *detok_ctx;
	/* (optional, sched_loop only) called on the step-loop thread after every
	 * step and at least every heartbeat_ms while idle (systemd WATCHDOG=1);
	 * must not block. heartbeat_ms 0 = 1000. */
	void (*heartbeat)(void *ctx);
	void *heartbeat_ctx;
	uint32_t heartbeat_ms;
};

/* ---- Requests ---- */

/* PROMPT_LOGPROBS: once per request that asked (choice 0), after its prompt
 * is computed and before any TOKEN event of the request. */
enum sched_event_kind { SCHED_EV_TOKEN = 1, SCHED_EV_FINISH = 2, SCHED_EV_PROMPT_LOGPROBS = 3 };

enum sched_finish_reason {
	SCHED_FINISH_NONE = 0,
	SCHED_FINISH_STOP,     /* eos, a stop token id or a stop string */
	SCHED_FINISH_LENGTH,   /* max_tokens or max_model_len */
	SCHED_FINISH_ABORT,    /* client disconnect or explicit abort */
	SCHED_FINISH_TIMEOUT,  /* deadline passed */
	SCHED_FINISH_SHUTDOWN, /* server stopping */
	SCHED_FINISH_ERROR,    /* executor failure */
	SCHED_FINISH_N_REASONS
};
const char *sched_finish_reason_str(enum sched_finish_reason r); /* "stop", "length", "abort", ... */

/* Why submit said no (the server maps these to its protocol's statuses). */
enum sched_refusal {
	SCHED_ACCEPTED = 0,
	SCHED_REFUSE_INVALID,    /* a parameter out of its range */
	SCHED_REFUSE_TOO_LONG,   /* prompt + max_tokens over max_model_len or the whole KV cache */
	SCHED_REFUSE_QUEUE_FULL, /* max_queued_requests reached (try later) */
	SCHED_REFUSE_DRAINING,   /* shutting down */
	SCHED_REFUSE_NOMEM,      /* allocation failed */
	SCHED_REFUSE_N
};

/* The request parameter a refusal is about (sched_check_param), as data:
 * the server names it in its own terms. */
enum sched_req_param {
	SCHED_PARAM_NONE = 0, SCHED_PARAM_PROMPT, SCHED_PARAM_N, SCHED_PARAM_TEMPERATURE, SCHED_PARAM_TOP_P,
	SCHED_PARAM_MIN_P, SCHED_PARAM_TOP_K, SCHED_PARAM_PENALTY, SCHED_PARAM_REPETITION_PENALTY,
	SCHED_PARAM_TOP_LOGPROBS, SCHED_PARAM_LOGIT_BIAS, SCHED_PARAM_STOP_TOKEN_IDS, SCHED_PARAM_STOP,
	SCHED_PARAM_MIN_TOKENS, SCHED_PARAM_MAX_TOKENS, SCHED_PARAM_PROMPT_LOGPROBS, SCHED_PARAM_GRAMMAR,
	SCHED_PARAM_PRIORITY,
};

/* Per-request timing (monotonic seconds, time_mono_s()); 0 = not yet. */
struct sched_timing {
	double arrival_s;
	double first_scheduled_s;
	double first_token_s;
	double finish_s;
	uint32_t n_preemptions;
};

/* One event. Token events carry the sampled id, the text it released (held
 * back while it might start a stop string; never includes a stop string),
 * and logprobs if asked. The finish event of a choice is its last event. */
struct sched_event {
	enum sched_event_kind kind;
	uint64_t request_id;
	uint32_t choice;                  /* 0..n-1 */
	int32_t token_id;                 /* TOKEN: the sampled id; FINISH: -1 */
	char *text;                       /* released bytes (heap, owned by the event; may be NULL) */
	uint32_t text_bytes;
	double time_s;                    /* when the step that produced it finished */
	struct kern_sample_out sample;    /* logprob / top_logprobs when requested */
	/* PROMPT_LOGPROBS only: n_prompt_tokens entries (model/exec.h; entry 0,
	 * the first prompt token, is empty); heap, owned by the event. */
	struct exec_prompt_lp *prompt_lp;
	/* FINISH only: */
	enum sched_finish_reason finish;
	int32_t stop_token_id;            /* the stop token / eos that ended it, or -1 */
	int32_t stop_string_index;        /* index into stop_strings that matched, or -1 */
	uint32_t n_prompt_tokens;
	uint32_t n_output_tokens;
	uint32_t n_cached_tokens;         /* prompt tokens served from the prefix cache (first admission) */
	struct sched_timing timing;
};
/* Free what an event owns (its text). */
void sched_event_clear(struct sched_event *ev);

/* Called on the step-loop thread for every event; must not block. The
 * callee takes ownership of ev->text (or calls sched_event_clear). */
typedef void (*sched_event_fn)(void *user, struct sched_event *ev);

/* A request's sampling parameters, in the scheduler's terms (the server
 * fills them from the request body). The scheduler turns them into the
 * sampling op's per-row arguments (kern_sampling_params, model/exec.h)
 * itself, adding the seed it draws and the masks of min_tokens and grammars;
 * the semantics are kernels/sampling/sampling.h's. */
struct sched_logit_bias {
	int32_t token_id;
	float bias; /* added to the logit; -100..100 */
};
struct sched_sampling {
	float temperature;        /* 0 = greedy; 0..100 */
	float top_p;              /* (0, 1] */
	int32_t top_k;            /* <= 0 = off */
	float min_p;              /* [0, 1] */
	float presence_penalty;   /* [-2, 2] */
	float frequency_penalty;  /* [-2, 2] */
	float repetition_penalty; /* > 0; 1 = off */
	uint64_t seed;            /* used only if sched_request_params.has_seed */
	const struct sched_logit_bias *logit_bias; /* n_logit_bias entries (copied) */
	uint32_t n_logit_bias;    /* <= SCHED_MAX_LOGIT_BIAS */
	bool logprobs;            /* the chosen token's logprob in each TOKEN event */
	uint32_t top_logprobs;    /* 0..SCHED_MAX_TOP_LOGPROBS; implies logprobs */
};

/* Neutral sampling parameters (temperature 1, top_p 1, repetition_penalty 1,
 * everything else off): start from these, a zeroed struct is refused (top_p 0). */
struct sched_sampling sched_sampling_defaults(void);

struct sched_request_params {
	uint64_t request_id;            /* 0 = let the scheduler assign one */
	const int32_t *prompt_ids;      /* copied */
	uint32_t n_prompt;
	struct sched_sampling sampling; /* logit_bias copied; seed used only if has_seed */
	bool has_seed;                  /* without a seed the scheduler draws one (kept across preemption) */
	uint32_t max_tokens;            /* 0 = up to max_model_len */
	uint32_t min_tokens;            /* the first min_tokens tokens are sampled with eos and
					   stop_token_ids masked (-inf bias); stop strings are matched from
					   the min_tokens-th token on (vLLM); must be <= max_tokens */
	bool ignore_eos;
	const int32_t *stop_token_ids;  /* copied */
	uint32_t n_stop_token_ids;
	const char *const *stop_strings; /* copied; need options.detokenize */
	uint32_t n_stop_strings;
	bool include_stop_str_in_output; /* a matched stop string ends the released text instead of being cut */
	bool keep_special_tokens;       /* special tokens' text in the events (vLLM's skip_special_tokens: false) */
	uint32_t n;                     /* choices; 0 = 1 */
	int32_t priority;               /* SCHED_POLICY_PRIORITY: lower runs first; must be 0 under FCFS */
	uint64_t cache_salt;            /* mixed into the first block's hash (tenant isolation); 0 = none */
	/* Prompt log-probabilities (echo + logprobs, vLLM's prompt_logprobs):
	 * every prompt position is computed (prefix-cache hits never skip one
	 * that is still to be scored) and one SCHED_EV_PROMPT_LOGPROBS event
	 * carries them. prompt_top_logprobs <= SCHED_MAX_TOP_LOGPROBS. */
	bool prompt_logprobs;
	uint32_t prompt_top_logprobs;
	bool score_only;                /* generate nothing (echo with max_tokens 0): every choice finishes with
					   LENGTH once the prompt is computed, with no TOKEN event */
	/* Structured outputs (model/gram.h): NULL, or the grammar every choice
	 * follows. The scheduler retains it; each choice gets its own state,
	 * its allowed-token mask goes to the sampling op (allow_mask) at every
	 * sample and each sampled token advances it. eos is allowed exactly when
	 * the output is complete (min_tokens does not hold it back then). A
	 * token outside the mask (an executor that ignores it) drops the
	 * constraint for that choice (logged).
	 * gram_vocab: the vocabulary it was built over (borrowed; outlives the
	 * request; at most the executor's vocab_size tokens). */
	struct gram *grammar;
	const struct gram_vocab *gram_vocab;
	double arrival_s;               /* 0 = now */
	double deadline_s;              /* monotonic; 0 = none */
	sched_event_fn on_event;
	void *user;
};

/* ---- Metrics snapshot (serving.md 2.1 names in comments) ---- */

/* Upper bounds (inclusive) of the tokens-per-step histogram buckets, vLLM's
 * vllm:iteration_tokens_total; the last bucket is +Inf. */
#define SCHED_ITER_BUCKETS 14
extern const uint32_t sched_iter_bucket_le[SCHED_ITER_BUCKETS - 1];

struct sched_stats {
	uint32_t n_requests_running;       /* vllm:num_requests_running */
	uint32_t n_requests_waiting;       /* vllm:num_requests_waiting */
	uint32_t n_seqs_running, n_seqs_waiting;
	uint32_t n_blocks_total, n_blocks_used, n_blocks_cached_free;
	double kv_usage;                   /* vllm:kv_cache_usage_perc, used / total */
	uint64_t prefix_cache_queries_tokens; /* vllm:prefix_cache_queries_total */
	uint64_t prefix_cache_hits_tokens;    /* vllm:prefix_cache_hits_total */
	uint64_t n_preemptions;            /* vllm:num_preemptions_total */
	uint64_t prompt_tokens;            /* vllm:prompt_tokens_total (prompt tokens of admitted requests) */
	uint64_t prefill_computed_tokens;  /* prompt + recompute tokens actually run */
	uint64_t generation_tokens;        /* vllm:generation_tokens_total */
	uint64_t n_steps;
	uint64_t last_step_tokens;
	uint64_t iter_tokens_count[SCHED_ITER_BUCKETS]; /* vllm:iteration_tokens_total, per bucket (not cumulative) */
	uint64_t iter_tokens_sum;
	uint64_t n_finished[SCHED_FINISH_N_REASONS]; /* vllm:request_success_total{finished_reason} */
	uint64_t n_refused[SCHED_REFUSE_N];          /* vllm:admission_rejections_total */
	/* speculative decoding (docs/speculation.md), vLLM's spec-decode counters */
	uint64_t spec_num_drafts;           /* vllm:spec_decode_num_drafts: verifies with >= 1 draft */
	uint64_t spec_num_draft_tokens;     /* vllm:spec_decode_num_draft_tokens */
	uint64_t spec_num_accepted_tokens;  /* vllm:spec_decode_num_accepted_tokens */
	uint64_t spec_accepted_per_pos[EXEC_SPEC_MAX_DRAFT]; /* vllm:spec_decode_num_accepted_tokens_per_pos{position} */
};

/* ---- Core (single thread) ---- */

struct sched;

/* ex is borrowed and must outlive the scheduler. Fails on a block size the
 * layer mix rejects or an executor without blocks. */
enum status sched_create(struct sched **out, const struct sched_options *opt, struct exec *ex, struct err *e) DSV4_WUR;
/* Frees everything; requests still present are dropped without events. NULL is a no-op. */
void sched_destroy(struct sched *s);

/* Check a request against the limits without submitting it (any thread:
 * reads only immutable configuration). */
enum sched_refusal sched_check(const struct sched *s, const struct sched_request_params *p, struct err *e);
/* sched_check, and *param (may be NULL) = the parameter refused
 * (SCHED_PARAM_NONE when accepted). TOO_LONG names the prompt when it alone
 * fills the context, else max_tokens. */
enum sched_refusal sched_check_param(const struct sched *s, const struct sched_request_params *p,
				     enum sched_req_param *param, struct err *e);

/* Queue a request. On refusal returns ST_INVALID / ST_BUSY / ST_NOMEM, sets
 * *why and e, and emits no events. On success *id_out (may be NULL) is the
 * request id; its events then arrive through p->on_event. */
enum status sched_submit(struct sched *s, const struct sched_request_params *p, uint64_t *id_out,
			 enum sched_refusal *why, struct err *e) DSV4_WUR;

/* Abort a request in any state; its blocks are released at once and every
 * unfinished choice gets a FINISH event with reason. ST_NOTFOUND if unknown
 * or already finished. */
enum status sched_abort(struct sched *s, uint64_t request_id, enum sched_finish_reason reason);

/* Abort everything (shutdown). */
void sched_abort_all(struct sched *s, enum sched_finish_reason reason);

/* Plan one step, run it on the executor, process the samples and emit events.
 * *n_tokens_out (may be NULL) = tokens in the step (0 when idle). An executor
 * failure aborts the step's requests with SCHED_FINISH_ERROR and returns its status. */
enum status sched_step(struct sched *s, uint32_t *n_tokens_out, struct err *e);

bool sched_has_work(const struct sched *s);

/* Thread-safe copy of the counters (updated at the end of each step and on submit/abort). */
void sched_stats_get(struct sched *s, struct sched_stats *out);

/* Debug / tests: check the block accounting invariants (every block either
 * free or referenced the right number of times, free list consistent, hash
 * table consistent). ST_OK or ST_INVALID with the first violation. */
enum status sched_check_invariants(struct sched *s, struct err *e);

/* The options as resolved at create (defaults filled in, limits clamped to
 * the executor and the KV cache), for /metrics info and error messages. Any thread. */
const struct sched_options *sched_resolved_options(const struct sched *s);
uint32_t sched_block_tokens(const struct sched *s);

/* Seed choice i of a request uses (choice 0 uses the request's seed). */
uint64_t sched_choice_seed(uint64_t seed, uint32_t choice);

/* ---- Threaded wrapper ---- */

struct sched_loop;
struct sched_stream;

/* Creates the core and starts the step-loop thread, which owns ex from now on. */
enum status sched_loop_create(struct sched_loop **out, const struct sched_options *opt, struct exec *ex,
			      struct err *e) DSV4_WUR;
/* Aborts every request (SCHED_FINISH_SHUTDOWN), joins the thread, frees. Streams
 * still held by callers stay valid until released. NULL is a no-op. */
void sched_loop_destroy(struct sched_loop *l);

/* Stop accepting (later submits refuse with SCHED_REFUSE_DRAINING); running
 * requests continue. */
void sched_loop_drain(struct sched_loop *l);
/* Requests waiting or running (0 when drained). */
uint32_t sched_loop_n_active(struct sched_loop *l);

/* Submit from any thread. p->on_event / p->user are ignored: events go to the
 * returned stream, which the caller must sched_stream_release(). Admission
 * refusals are synchronous. */
enum status sched_loop_submit(struct sched_loop *l, const struct sched_request_params *p,
			      struct sched_stream **stream_out, uint64_t *id_out, enum sched_refusal *why,
			      struct err *e) DSV4_WUR;
/* Abort from any thread (asynchronous: blocks are freed on the loop's next turn,
 * before it plans another step). */
void sched_loop_abort(struct sched_loop *l, uint64_t request_id, enum sched_finish_reason reason);
void sched_loop_stats(struct sched_loop *l, struct sched_stats *out);
/* The core the loop owns, for sched_resolved_options() / sched_check() only
 * (both read immutable state); never step or submit on it directly. */
const struct sched *sched_loop_core(const struct sched_loop *l);

/* Move up to max events into evs. timeout_ms: 0 = do not wait, < 0 = wait
 * until at least one event or the stream ends. Returns the number moved.
 * Never blocks the step loop. */
uint32_t sched_stream_pull(struct sched_stream *st, struct sched_event *evs, uint32_t max, int timeout_ms);
/* True once every choice's FINISH event has been pulled. */
bool sched_stream_done(struct sched_stream *st);
/* (optional) fn(user) is called on the step-loop thread when events arrive
 * (e.g. to resume a suspended libmicrohttpd connection); must not block. */
void sched_stream_set_notify(struct sched_stream *st, void (*fn)(void *user), void *user);
/* Drop the caller's reference; an unfinished request is aborted (client gone). */
void sched_stream_release(struct sched_stream *st);
/* Process-wide bound on the bytes of events one stream holds untaken, for
 * streams created later (0 = SCHED_DEFAULT_STREAM_BACKLOG_BYTES): past it
 * the request is aborted (SCHED_FINISH_ABORT). Set once at start-up. */
void sched_set_stream_backlog_bytes(size_t bytes);

#endif
