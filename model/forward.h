/*
 * model/forward.h: the DeepSeek-V4 forward pass over one flat varlen batch
 * (design.md "The executor"; dsv4.md §3), every op called through the
 * variant the layer plan (model/weights.h) holds, per-sequence state in the
 * paged block pool (model/state.h) with the block rules of model/exec.h.
 *
 * Precision (docs/forward.md): fp32 accumulation everywhere. With
 * quant_sim the reference's simulations run (FP8 act_quant block 128 before
 * FP8/FP4 GEMMs, KV nope FP8 qdq block 64, indexer Hadamard + FP4 qdq); with
 * bf16_round every tensor the reference stores in bf16 (residual streams,
 * sublayer inputs and outputs, norm outputs, bf16 linear outputs, q/kv after
 * rope, attention output) is rounded to bf16 values. Both on is the
 * reference (serving default); both off is transformers in float32 (the
 * golden files), up to the compressor op, which always rounds its entries
 * to bf16 as the reference does.
 *
 * Owned by one thread; buffers sized at create for max_tokens, in the block
 * pool's memory (host or device: model/state.h), nothing is allocated per
 * step except inside the CPU reference kernels themselves. Pointers passed
 * in and out (streams, logits) are in that memory too.
 *
 * Tensor parallel (world size w > 1): every rank runs the same step on its
 * weight shards (model/weights.h) with replicated state; four collectives
 * per layer pair: an all-reduce of the attention output (after wo_b), one of
 * the MoE output (routed experts of all ranks + the shared expert's
 * intermediate-dim slices), one of the vocab-parallel embedding, and an all-gather
 * of the lm_head's vocabulary shards, so every rank ends with full logits.
 */
#ifndef DSV4_MODEL_FORWARD_H
#define DSV4_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/exec.h"
#include "model/state.h"
#include "model/weights.h"

struct model_fwd;

struct model_fwd_options {
	uint32_t max_tokens;   /* flat batch capacity */
	uint32_t max_seqs;     /* sequences per step */
	uint32_t max_context;  /* longest context (positions) a sequence may reach */
	bool quant_sim;
	bool bf16_round;
	struct comm *comm;     /* tensor parallel group of the weights' world size (NULL when 1) */
	void *kctx;            /* struct kern_ctx * (kernels/device/ctx.h) of a GPU executor; NULL: the default */
	struct kern_graph *graph; /* decode-only steps are captured and replayed as CUDA graphs (NULL: eager) */
};

enum status model_fwd_create(struct model_fwd **out, const struct model_weights *w, struct model_state *s,
			     const struct model_fwd_options *opt, struct err *e) DSV4_WUR;
void model_fwd_destroy(struct model_fwd *f);

/* An upper bound of the bytes model_fwd_create allocates in the pool's
 * memory for these capacities (to size the KV pool before creating it). */
uint64_t model_fwd_estimate_bytes(const struct model_weights *w, uint32_t max_tokens, uint32_t max_seqs,
				  uint32_t max_context);

/* Run the main layers over step (token ids, positions, sequences, block
 * tables as model/exec.h), updating the sequences' blocks. On success the
 * pre-head streams [n_tokens, hc_mult, D] are at model_fwd_streams(). */
enum status model_fwd_run(struct model_fwd *f, const struct exec_step *step, struct err *e) DSV4_WUR;
const float *model_fwd_streams(const struct model_fwd *f);

/* Final head on rows[0..n_rows) of streams [*, hc_mult, D]: HCHead, final
 * norm, lm_head (fp32). logits [n_rows, vocab]. */
enum status model_fwd_logits(struct model_fwd *f, const float *streams, const uint32_t *rows, uint32_t n_rows,
			     float *logits, struct err *e) DSV4_WUR;

/* The MTP layer (dsv4.md §3.11): step carries the NEXT token ids (token t+1
 * at the row of position t) with the same positions and block tables as the
 * main step whose pre-head streams are given; the MTP layer's ring lives in
 * the same blocks. logits [n_tokens, vocab] (MTP head: its own HCHead and
 * norm, the shared lm_head). ST_UNSUPPORTED when MTP was not loaded. */
enum status model_fwd_mtp(struct model_fwd *f, const struct exec_step *step, const float *streams,
			  float *logits, struct err *e) DSV4_WUR;

/* The MTP layer on step (as model_fwd_mtp) with the head on rows[0..n_rows)
 * only (n_rows may be 0: the layer's ring rows are written all the same). */
enum status model_fwd_mtp_rows(struct model_fwd *f, const struct exec_step *step, const float *streams,
			       const uint32_t *rows, uint32_t n_rows, float *logits, struct err *e) DSV4_WUR;
/* The MTP block's output streams [n_tokens, hc_mult, D] of the last MTP
 * call (the next draft step's input); valid until the next forward call. */
const float *model_fwd_mtp_streams(const struct model_fwd *f);
/* Where the forward's buffers live (host or the executor's device). */
const struct kern_mem *model_fwd_mem(const struct model_fwd *f);

/* ---- DSpark (0731 release; model/dspark.h; host memory only) ----
 * model_fwd_dspark_enable: from now on every model_fwd_run also keeps the
 * target layers' outputs (dspark_target_layer_ids), each averaged over the
 * hc streams: model_fwd_dspark_captures() [n_tokens, n_targets * D] of the
 * last run. model_fwd_dspark_main: main_x = main_norm(main_proj(cap)) [T, D].
 * model_fwd_dspark_kv: stage's kv_norm(wkv(x)) with RoPE at pos and the FP8
 * simulation of the rest (quant_sim) [T, head_dim]: a context row.
 * model_fwd_dspark_draft: the draft block of each sequence (block_tokens
 * rows: ids, positions) through the stages, each row's attention seeing
 * the sequence's context rows ctx_kv[stage][ctx_off[s] .. ctx_off[s+1]) and
 * every row of its block; logits [n_seqs * n_head, vocab] of the last
 * stage's head (before the Markov head). */
struct model_fwd_dspark_block {
	uint32_t n_seqs, block_tokens;
	uint32_t n_head;                /* logits of the first n_head rows of each block (1..block_tokens) */
	const int32_t *ids, *pos;       /* [n_seqs * block_tokens] */
	const float *const *ctx_kv;     /* [n_stages] -> [ctx_off[n_seqs], head_dim] */
	const uint32_t *ctx_off;        /* [n_seqs + 1] */
};
enum status model_fwd_dspark_enable(struct model_fwd *f, struct err *e) DSV4_WUR;
const float *model_fwd_dspark_captures(const struct model_fwd *f);
enum status model_fwd_dspark_main(struct model_fwd *f, const float *cap, uint32_t T, float *main_x,
				  struct err *e) DSV4_WUR;
enum status model_fwd_dspark_kv(struct model_fwd *f, int stage, const float *x, const int32_t *pos, uint32_t T,
				float *kv, struct err *e) DSV4_WUR;
enum status model_fwd_dspark_draft(struct model_fwd *f, const struct model_fwd_dspark_block *b, float *logits,
				   struct err *e) DSV4_WUR;

/* ---- Speculative decoding: verify rollback (docs/speculation.md) ----
 * model_fwd_spec_enable: buffers for up to max_stash_tokens kept tokens a step.
 * model_fwd_spec_save: before a step (the same pointer, run next): n_q[s] =
 * the last n_q[s] query tokens of sequence s may be rolled back (0: none);
 * saves everything those tokens can write in layers [layer_begin,
 * layer_end); stash: the next model_fwd_run also keeps their state inputs
 * (main layers only). model_fwd_spec_commit: after the step, sequence s
 * keeps the first n_keep[s] of its covered tokens (NULL: none): the state
 * ends exactly as if only those had been processed (restore, then replay
 * from the stash). step must still be valid. */
enum status model_fwd_spec_enable(struct model_fwd *f, uint32_t max_stash_tokens, struct err *e) DSV4_WUR;
enum status model_fwd_spec_save(struct model_fwd *f, const struct exec_step *step, const uint32_t *n_q,
				int layer_begin, int layer_end, bool stash, struct err *e) DSV4_WUR;
enum status model_fwd_spec_commit(struct model_fwd *f, const uint32_t *n_keep, struct err *e) DSV4_WUR;

#endif
