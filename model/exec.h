/*
 * model/exec.h: the executor interface, the contract between scheduler/ and
 * the model's forward pass.
 *
 * The scheduler plans a step in plain C (struct exec_step: one flat token
 * batch plus per-sequence metadata) and hands it to an executor, which runs
 * the forward pass over it, samples where asked, and returns the sampled ids.
 * There are several executors (the model's on the CPU or one GPU,
 * model/exec_cpu.c; tensor-parallel rank 0, model/exec_tp.c; the
 * deterministic test executor, model/exec_test.c; the scheduler tests'
 * fake, tests/scheduler/fake_exec.c), so this is a vtable
 * (style.md rule 13). One thread (the scheduler's step loop) owns an executor;
 * nothing here is thread-safe.
 *
 * ---- Paged state: blocks and state slots ----
 *
 * DeepSeek-V4 keeps two kinds of per-sequence state (dsv4.md 3.5-3.8, 4):
 * rows that grow with the context (compressed KV, indexer keys) and a fixed
 * amount of "live" state (the sliding ring of the last sliding_window raw KV
 * rows of every layer, and the open compressor windows). They live in:
 *
 *   BLOCKS: a block is a fixed span of B = block_tokens positions of one
 *   sequence ([k*B, (k+1)*B) for entry k of its block table); one table
 *   indexes every layer. A block holds
 *     (a) the growing rows of its span: CSA layers B/ratio compressed KV rows
 *         and B/ratio indexer keys; HCA layers B/ratio compressed KV rows;
 *         SWA layers nothing;
 *     (b) a BOUNDARY SNAPSHOT, written when the block is completed: the live
 *         state as it stands after the block's last token, reduced to what is
 *         non-empty at a boundary: every layer's sliding ring, and for an
 *         overlapping (CSA) compressor its previous window (ratio tokens of
 *         kv/score inputs, main and indexer compressor). A non-overlapping
 *         (HCA) window is empty at a boundary and is not stored.
 *   STATE SLOTS: each running sequence owns one slot (exec_seq.state_slot,
 *   0..n_state_slots-1, stable while it runs) holding its live state with
 *   full open-window capacity (ring + up to ratio, or 2*ratio for CSA,
 *   tokens of compressor inputs).
 *
 * Two modes, chosen by the executor through exec_info.n_state_slots:
 *   SLOT MODE (n_state_slots > 0): as above; memory-lean (for DSv4-Flash FP8
 *   a block is ~4.7 MiB and a slot ~14.7 MiB, see exec_block_bytes); what a
 *   GPU executor should do. Running sequences are bounded by the slot count.
 *   BLOCK MODE (n_state_slots == 0): there are no slots; every block's
 *   snapshot area has full open-window capacity and serves as the live state
 *   while the block is the sequence's tail (rules 1b/2b below). Simple, and
 *   what the CPU reference executor does; costs a slot's worth per block.
 *
 * Requirements that make the boundary state well defined (exec_layer_mix_check):
 *   block_tokens % ratio == 0 for every compress ratio, so no compressed row
 *   straddles two blocks and every window is either empty (HCA) or exactly
 *   one full previous window (CSA) at a boundary;
 *   block_tokens >= sliding_window, so the ring at a boundary holds only
 *   rows of the block's own span.
 *
 * ---- What the executor must do ----
 *
 * restore_state is set on the first step of a sequence after it was
 * admitted (fresh, from the prefix cache, after preemption, or forked as a
 * child of an n > 1 request); n_cached_tokens is then a multiple of B.
 *
 * Slot mode:
 *   1. restore_state: initialise the slot from the initial state (empty
 *      ring, score = -inf, kv = 0) when n_cached_tokens == 0, else from the
 *      boundary snapshot of block table entry n_cached_tokens/B - 1.
 *   2. Otherwise the slot holds the state after token n_cached_tokens - 1,
 *      as the executor left it at the end of this sequence's previous step.
 *   3. Process the tokens in order; whenever a token completes block k
 *      (position (k+1)*B - 1; a chunk may complete several blocks), write
 *      block k's boundary snapshot from the live state.
 * Block mode (state_slot is EXEC_NO_SLOT):
 *   1b. The live state for a step starting at p = n_cached_tokens is the
 *      initial state when p == 0, else the state area of block table entry
 *      (p-1)/B (the block holding token p-1).
 *   2b. Before writing the first token of block k (position k*B, k > 0),
 *      copy the state area of entry k-1 into entry k, then update entry k in
 *      place; a completed block's area is then its boundary snapshot and is
 *      never written again.
 * Both modes:
 *   4. The scheduler never schedules writes into a block that another
 *      sequence or the prefix cache can read (shared blocks are complete
 *      blocks below every writer's n_cached_tokens), and never gives one slot
 *      to two running sequences.
 * A complete block is therefore self-contained: a sequence whose first k
 * blocks come from the prefix cache continues at k*B exactly as if it had
 * computed them (the cache carries compressed rows, indexer keys, the ring
 * and the CSA carry at the boundary). Preemption (recompute) simply drops
 * the slot; the sequence later restarts from a boundary with a fresh one.
 *
 * ---- Sampling ----
 *
 * Logits stay on the device. For each sequence with sample set, the executor
 * computes the logits of its last token in this step and samples with
 * kernels/sampling/sampling.h semantics (the CPU executor calls
 * kern_sample_ref(); other variants must agree with it), using counter =
 * n_output of that sequence (the index of the token being produced).
 *
 * ---- Prompt log-probabilities ----
 *
 * For each sequence with prompt_lp set, every token of the step at position
 * p with p + 1 < n_prompt yields entry p + 1 of prompt_lp: the raw
 * log-probability (sampling.h stage 0) of prompt_ids[p + 1] given the
 * context up to p, its rank and the top n_top tokens (kernels/sampling/
 * logprobs.h semantics; entry 0, the first prompt token, has none). The
 * head runs on those rows only, in chunks of the executor's logits buffer
 * (no prompt-by-vocabulary buffer), log-softmax and top-n where the logits
 * are; only the entries come back. prompt_ids and n_prompt are set for
 * such a sequence whether or not it samples. Under tensor parallelism every
 * rank runs the head on the same rows (its collectives) and rank 0 writes
 * the entries (workers get a prompt_lp with NULL arrays).
 */
#ifndef DSV4_MODEL_EXEC_H
#define DSV4_MODEL_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/sampling/sampling.h"

/* ---- Layer mix: what one block costs ---- */

/* One kind of attention layer and the bytes of each thing it caches. */
struct exec_layer_kind {
	uint32_t n_layers;               /* layers of this kind (MTP counts as SWA when loaded) */
	uint32_t compress_ratio;         /* tokens per compressed row; 0 = sliding only */
	bool overlap;                    /* window w also pools window w-1 (CSA) */
	uint32_t kv_entry_bytes;         /* one compressed KV row (584 fp8 "MODEL1", 1024 bf16) */
	uint32_t indexer_entry_bytes;    /* one indexer key row (68 fp4, 132 fp8, 256 bf16); 0 = no indexer */
	uint32_t ring_entry_bytes;       /* one raw KV row of the sliding ring */
	uint32_t compressor_token_bytes; /* open-window state per token: kv + score, main + indexer compressor */
};

struct exec_layer_mix {
	uint32_t sliding_window; /* ring length in tokens (128 for DSv4-Flash) */
	struct exec_layer_kind swa, csa, hca;
};

/* ST_INVALID (with a message naming the ratio or window) unless every
 * compress ratio divides block_tokens and block_tokens >= sliding_window. */
enum status exec_layer_mix_check(const struct exec_layer_mix *mix, uint32_t block_tokens, struct err *e) DSV4_WUR;

/* Bytes of one block: growing rows of its span plus its boundary snapshot
 * (slot mode) or its full live-state area (block mode, slot_mode false). */
uint64_t exec_block_bytes(const struct exec_layer_mix *mix, uint32_t block_tokens, bool slot_mode);
/* The boundary-snapshot part of a slot-mode block alone. */
uint64_t exec_block_snapshot_bytes(const struct exec_layer_mix *mix);
/* Bytes of one state slot (live ring + full open compressor windows). */
uint64_t exec_slot_bytes(const struct exec_layer_mix *mix);
/* Blocks that fit in kv_bytes once n_slots slots are set aside (0 if none);
 * n_slots 0 sizes block-mode blocks. */
uint32_t exec_blocks_for_bytes(const struct exec_layer_mix *mix, uint32_t block_tokens, uint64_t kv_bytes,
			       uint32_t n_slots);

/* ---- What an executor tells the scheduler ---- */

struct exec_info {
	struct exec_layer_mix mix;
	uint32_t block_tokens;     /* B; must pass exec_layer_mix_check() */
	uint32_t n_blocks;         /* blocks the executor allocated (ids 0..n_blocks-1) */
	uint32_t n_state_slots;    /* slot mode: slots allocated (ids 0..n-1), bounds running sequences;
				      0 = block mode */
	uint32_t vocab_size;
	int32_t eos_token_id;      /* -1 = none */
	uint32_t max_step_tokens;  /* flat batch capacity the activation arena was sized for */
	uint32_t max_step_seqs;    /* sequences per step capacity */
	uint32_t max_model_len;    /* positions the model supports (max_position_embeddings) */
	uint32_t max_draft_tokens; /* speculative decoding: drafts a sequence may verify per step (0 = none;
				      "Speculative decoding" below) */
};

/* ---- The step plan ---- */

#define EXEC_NO_SLOT UINT32_MAX

/* Where the executor writes prompt log-probabilities (caller-owned arrays of
 * n_prompt entries each; top_ids / top_logprobs n_prompt * n_top). */
struct exec_prompt_lp {
	uint32_t n_top;      /* 0..KERN_SAMPLE_MAX_TOP_LOGPROBS */
	float *logprob;      /* [n_prompt] entry p: log P(prompt[p] | prompt[0..p)) */
	int32_t *rank;       /* [n_prompt] 1 + tokens with a strictly larger logit */
	int32_t *top_ids;    /* [n_prompt * n_top] */
	float *top_logprobs; /* [n_prompt * n_top] */
};

/* Per-sequence row of a step. Arrays are flat over the batch so that the
 * executor can copy each one to the device once. */
struct exec_seq {
	uint64_t seq_id;           /* stable for the sequence's life; executors may key caches by it */
	uint32_t n_cached_tokens;  /* tokens already in its blocks = position of its first token here */
	uint32_t n_context_tokens; /* n_cached_tokens + query tokens: context length after the step */
	uint32_t n_blocks;         /* block table length = ceil(n_context_tokens / B) */
	uint32_t block_table_start; /* index into exec_step.block_ids of its first entry */
	uint32_t state_slot;       /* slot mode: its live-state slot; block mode: EXEC_NO_SLOT */
	bool restore_state;        /* first step since admission (rule 1 above) */
	bool sample;               /* compute logits at its last token and sample */
	/* When sample: parameters and the token history the penalties read. */
	const struct kern_sampling_params *sampling;
	const int32_t *prompt_ids;  /* the request's prompt */
	uint32_t n_prompt;
	const int32_t *output_ids;  /* tokens generated so far (n_output is the RNG counter) */
	uint32_t n_output;
	/* NULL, or where this step's prompt log-probabilities go ("Prompt
	 * log-probabilities" above; needs prompt_ids / n_prompt). */
	struct exec_prompt_lp *prompt_lp;
	/* Speculative decoding (below): the last n_draft query tokens are
	 * drafts to verify (sample set, n_draft <= info.max_draft_tokens);
	 * next_token (has_next_token) is the token after the last query token
	 * when the scheduler knows it (a prompt chunk that does not sample). */
	uint32_t n_draft;
	bool has_next_token;
	int32_t next_token;
};

struct exec_step {
	uint32_t n_tokens;            /* flat batch size */
	const int32_t *token_ids;     /* [n_tokens] */
	const int32_t *positions;     /* [n_tokens], contiguous per sequence */
	uint32_t n_seqs;
	const struct exec_seq *seqs;  /* [n_seqs]: decodes first, then prefill chunks */
	const uint32_t *query_start;  /* [n_seqs + 1]: seq i owns tokens [query_start[i], query_start[i+1]) */
	const uint32_t *block_ids;    /* all block tables concatenated */
	uint32_t n_block_ids;
	uint32_t n_sample;            /* sequences with sample set */
};

/* ---- Speculative decoding (docs/speculation.md) ----
 * An executor with info.max_draft_tokens = K > 0 verifies drafts and
 * proposes them. A sampling sequence with n_draft = k > 0 has query tokens
 * [t, d1..dk] (t the last sampled token); the executor samples row i
 * (counter n_output + i, history output_ids + d1..di) exactly as a plain
 * step would, stops at the first row whose token differs from d(i+1), and
 * returns the 1 + n_extra tokens produced (n_extra = accepted drafts); its
 * state then holds t, d1..d(n_extra) and nothing of the rejected drafts.
 * After every step it may return drafts for the tokens that follow the last
 * produced one (n_next_draft <= K), which the scheduler verifies next. A step
 * with n_draft > 0 carries no prompt_lp. */
#define EXEC_SPEC_MAX_DRAFT 8

/* One sampled token (one per sequence with sample set, in batch order). */
struct exec_sample {
	uint32_t seq_index;        /* index into exec_step.seqs */
	struct kern_sample_out out;  /* the (first) new token */
	/* speculative decoding (zeroed by the caller; executors without it leave them): */
	uint32_t n_extra;            /* accepted drafts: the new tokens are out, then extra[0..n_extra) */
	struct kern_sample_out extra[EXEC_SPEC_MAX_DRAFT];
	uint32_t n_next_draft;       /* proposed drafts after the last new token */
	int32_t next_draft[EXEC_SPEC_MAX_DRAFT];
};

/* ---- The vtable ---- */

struct exec_ops {
	/* Run one step: forward pass over the flat batch, then sampling. out has
	 * room for step->n_sample entries (caller-owned) and is filled in batch
	 * order. A failure fails the whole step; the scheduler then aborts the
	 * step's requests with an error and carries on. */
	enum status (*step)(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e);
	/* (optional) The sequence ended or was preempted: drop anything cached
	 * under seq_id (penalty counts, graphs). Block contents stay valid. */
	void (*seq_release)(void *ctx, uint64_t seq_id);
};

struct exec {
	const struct exec_ops *ops;
	void *ctx;
	struct exec_info info;
};

#endif
