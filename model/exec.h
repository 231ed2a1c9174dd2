/*
 * model/exec.h: the executor interface, the contract between scheduler/ and
 * the model's forward pass.
 *
 * The scheduler plans a step in plain C (struct exec_step: one flat token
 * batch plus per-sequence metadata) and hands it to an executor, which runs
 * the forward pass over it, samples where asked, and returns the sampled ids.
 * There are at least three executors (CPU reference, CUDA, and the
 * deterministic fake in tests/scheduler/), so this is a vtable
 * (style.md rule 13). One thread (the scheduler's step loop) owns an executor;
 * nothing here is thread-safe.
 *
 * ---- Paged state: what a block is ----
 *
 * A block is a fixed span of block_tokens consecutive positions of one
 * sequence ([k*B, (k+1)*B) for the k-th entry of its block table, B =
 * block_tokens). One block table indexes every layer. For DeepSeek-V4
 * (dsv4.md sections 3.5-3.8, 4) a block holds, for every layer:
 *
 *   (a) growing rows for its span:
 *       CSA layers: B/ratio compressed KV rows and B/ratio indexer keys;
 *       HCA layers: B/ratio compressed KV rows;
 *       SWA layers: nothing.
 *   (b) a STATE REGION: the fixed-size per-sequence state as it stands after
 *       the last token written into this block:
 *       every layer: the sliding ring of the last sliding_window raw KV rows;
 *       compressing layers: the open compressor window(s) (kv and score
 *       inputs of the tokens not yet pooled; for CSA also the previous window,
 *       which the overlapping compressor pools again).
 *
 * Requirements that make the state at a block boundary well defined:
 *   block_tokens % ratio == 0 for every compress ratio, so no compressed row
 *   straddles two blocks and, at a boundary, a non-overlapping compressor's
 *   window is empty and an overlapping one holds exactly one full previous
 *   window (ratio tokens);
 *   block_tokens >= sliding_window, so the ring at the boundary holds only
 *   rows of the block's own span.
 * exec_layer_mix_check() enforces both.
 *
 * ---- What the executor must do with the state region ----
 *
 *   1. A sequence whose step starts at position p = n_cached_tokens reads its
 *      state from: the initial state (empty ring, score = -inf, kv = 0) when
 *      p == 0; otherwise the state region of block table entry (p-1)/B, the
 *      block that holds token p-1.
 *   2. When it writes the first token of block k (position k*B, k > 0) it
 *      first copies the state region of entry k-1 into entry k, then updates
 *      entry k in place. The state region of a completed block is therefore
 *      a snapshot of the state at its end boundary and is never written again.
 *   3. A chunk may cross several block boundaries in one step; every block it
 *      completes must end holding its boundary snapshot (rule 2 gives that).
 *   4. The scheduler never schedules writes into a block that another
 *      sequence or the prefix cache can read: all shared blocks are complete
 *      blocks at positions below every writer's n_cached_tokens.
 * With this, a complete block is self-contained: a sequence whose first
 * k blocks come from the prefix cache continues at position k*B exactly as if
 * it had computed them itself (the cache carries compressed rows, indexer
 * keys, the ring and the open compressor windows at the boundary).
 *
 * ---- Sampling ----
 *
 * Logits stay on the device. For each sequence with sample set, the executor
 * computes the logits of its last token in this step and samples with
 * kernels/sampling/sampling.h semantics (the CPU executor calls
 * kern_sample_ref(); other variants must agree with it), using counter =
 * n_output of that sequence (the index of the token being produced).
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

/* Bytes of one block: growing rows of its span plus its state region. */
uint64_t exec_block_bytes(const struct exec_layer_mix *mix, uint32_t block_tokens);
/* The state-region part of exec_block_bytes() alone. */
uint64_t exec_block_state_bytes(const struct exec_layer_mix *mix);

/* ---- What an executor tells the scheduler ---- */

struct exec_info {
	struct exec_layer_mix mix;
	uint32_t block_tokens;     /* B; must pass exec_layer_mix_check() */
	uint32_t n_blocks;         /* blocks the executor allocated (ids 0..n_blocks-1) */
	uint32_t vocab_size;
	int32_t eos_token_id;      /* -1 = none */
	uint32_t max_step_tokens;  /* flat batch capacity the activation arena was sized for */
	uint32_t max_step_seqs;    /* sequences per step capacity */
	uint32_t max_model_len;    /* positions the model supports (max_position_embeddings) */
};

/* ---- The step plan ---- */

/* Per-sequence row of a step. Arrays are flat over the batch so that the
 * executor can copy each one to the device once. */
struct exec_seq {
	uint64_t seq_id;           /* stable for the sequence's life; executors may key caches by it */
	uint32_t n_cached_tokens;  /* tokens already in its blocks = position of its first token here */
	uint32_t n_context_tokens; /* n_cached_tokens + query tokens: context length after the step */
	uint32_t n_blocks;         /* block table length = ceil(n_context_tokens / B) */
	uint32_t block_table_start; /* index into exec_step.block_ids of its first entry */
	bool sample;               /* compute logits at its last token and sample */
	/* When sample: parameters and the token history the penalties read. */
	const struct kern_sampling_params *sampling;
	const int32_t *prompt_ids;  /* the request's prompt */
	uint32_t n_prompt;
	const int32_t *output_ids;  /* tokens generated so far (n_output is the RNG counter) */
	uint32_t n_output;
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

/* One sampled token (one per sequence with sample set, in batch order). */
struct exec_sample {
	uint32_t seq_index;        /* index into exec_step.seqs */
	struct kern_sample_out out;
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
