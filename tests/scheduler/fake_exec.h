/*
 * tests/scheduler/fake_exec.h: a deterministic executor behind model/exec.h.
 *
 * It models the state contract of model/exec.h exactly. The live state is a
 * 64-bit rolling hash of every token so far (standing in for the ring and the
 * open compressor windows), kept in the sequence's state slot; each completed
 * block gets a boundary snapshot of it. A step restores a fresh slot from the
 * initial state or the snapshot of the block before n_cached_tokens, checks
 * that a continuing slot belongs to the same sequence at the right position,
 * that row writes into a block are contiguous, and derives the logits of each
 * sampled sequence from its state. So any scheduler mistake (a wrong block table, a reused block
 * that was overwritten, a lost prefix) changes the output, and fake_reference()
 * computes what the output must be without any scheduler at all.
 * Prompt log-probabilities (exec_seq.prompt_lp) are written from the state
 * too; fake_prompt_entry() gives entry p of a prompt without a scheduler.
 */
#ifndef DSV4_TESTS_SCHEDULER_FAKE_EXEC_H
#define DSV4_TESTS_SCHEDULER_FAKE_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "model/exec.h"

struct fake_exec_options {
	uint32_t n_blocks, block_tokens, vocab, max_step_tokens, max_step_seqs, max_model_len;
	uint32_t n_state_slots; /* slot mode: 0 = max_step_seqs */
	bool block_mode;        /* model/exec.h block mode (n_state_slots reported as 0) */
	int32_t eos_token_id;
	float eos_bias; /* added to the eos logit (negative: rarely stop) */
	uint64_t model_seed;
};

struct fake_step_record {
	uint32_t n_tokens, n_seqs, n_sample;
	uint32_t seq_tokens[64];  /* per sequence (first 64) */
	bool seq_sample[64];
	uint64_t seq_ids[64];
};

struct fake_exec {
	struct exec ex;
	struct fake_exec_options opt;
	uint64_t *blk_state;    /* boundary snapshot */
	int64_t *blk_snap_pos;  /* position the snapshot was taken after, -1 = none */
	int64_t *blk_last_pos;  /* last position whose rows were written into the block */
	uint64_t *slot_state, *slot_seq;
	int64_t *slot_pos;
	float *logits;
	void *work;
	uint64_t n_steps, n_tokens_total, n_released;
	int32_t fail_at_step; /* >= 0: that step returns ST_CUDA once */
	int32_t bad_token_at_step; /* >= 0: that step returns an out-of-vocabulary sample once */
	_Atomic uint32_t step_sleep_us; /* slow every step down (threaded tests) */
	char error[512];      /* first contract violation seen, "" if none */
	struct fake_step_record last, *records;
	uint32_t n_records, cap_records;
};

int fake_exec_init(struct fake_exec *f, const struct fake_exec_options *o);
void fake_exec_fini(struct fake_exec *f);
/* Entry p (>= 1) of a prompt's log-probabilities as the fake writes them:
 * logprob, rank and the first top id. */
void fake_prompt_entry(const struct fake_exec_options *o, const int32_t *ids, uint32_t p, float *logprob,
		       int32_t *rank, int32_t *top0);
/* A small DSv4-like layer mix that passes exec_layer_mix_check for block_tokens. */
struct exec_layer_mix fake_layer_mix(uint32_t block_tokens);

/* What the scheduler must produce for one choice. Returns the number of
 * generated tokens written to out (<= max_tokens); *stopped_by = token id
 * that stopped it or -1 (length). */
uint32_t fake_reference(const struct fake_exec_options *o, const int32_t *prompt, uint32_t n_prompt,
			const struct kern_sampling_params *sp, uint32_t max_tokens, bool ignore_eos,
			const int32_t *stop_ids, uint32_t n_stop_ids, uint32_t max_model_len, int32_t *out,
			int32_t *stopped_by);

/* The same with min_tokens: the first min_tokens samples have eos and the
 * stop ids masked with a -inf bias, and no stop ends the output before. */
uint32_t fake_reference_min(const struct fake_exec_options *o, const int32_t *prompt, uint32_t n_prompt,
			    const struct kern_sampling_params *sp, uint32_t max_tokens, uint32_t min_tokens,
			    bool ignore_eos, const int32_t *stop_ids, uint32_t n_stop_ids, uint32_t max_model_len,
			    int32_t *out, int32_t *stopped_by);

/* Detokenizer for tests: every token decodes to 1-3 ASCII letters from "abcd",
 * except tokens = 5 (mod 17), which decode to the two bytes of U+00E9 split
 * across tokens 5 and 6 (mod 17) (the first byte alone / the second alone). */
uint32_t fake_detok(void *ctx, int32_t token_id, bool keep_special, char *buf, uint32_t cap);

#endif
