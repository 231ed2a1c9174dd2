/*
 * tests/model/spec_harness.h: one sequence driven by hand through a
 * (speculating) executor, shared by the speculation tests (test_spec_state.c,
 * test_dspark.c): its tokens, its block ids, one step that runs the tokens not
 * yet in the state plus the drafts to verify, and the draft hook that replaces
 * the drafter's drafts by the true continuation corrupted at one position (so
 * a test knows how many drafts each step accepts).
 */
#ifndef DSV4_TESTS_MODEL_SPEC_HARNESS_H
#define DSV4_TESTS_MODEL_SPEC_HARNESS_H

#include <string.h>

#include "model/exec.h"
#include "model/exec_cpu.h"
#include "model/spec.h"
#include "tests/test.h"

#define SH_MAX_TOKENS 128
#define SH_MAX_BLOCKS 8

/* A reference-precision executor of n_blocks blocks of block_tokens on dev
 * (NULL: the CPU), with the draft layers (MTP or DSpark stages) when with_draft. */
static inline struct model_exec_cpu *sh_exec(struct model_checkpoint *ck, uint32_t block_tokens, uint32_t n_blocks,
					     bool with_draft, const struct kern_device *dev)
{
	struct model_exec_cpu_options o = {.ck = ck, .block_tokens = block_tokens, .n_blocks = n_blocks,
					   .max_step_tokens = 64, .max_step_seqs = 4, .precision = MODEL_PREC_REFERENCE,
					   .load_mtp = with_draft, .dev = dev};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &o, &e) == ST_OK, "create: %s", e.msg);
	return x;
}

/* One sequence: block ids 0..n_blocks-1 in order unless a test changes them. */
struct sh_seq {
	uint64_t id;
	uint32_t n_prompt;     /* the first n_prompt of toks are the prompt */
	uint32_t block_tokens; /* tokens a block */
	uint32_t n_blocks;     /* entries of blocks */
	int32_t toks[SH_MAX_TOKENS];
	uint32_t n_tok;    /* prompt + produced */
	uint32_t n_cached; /* positions in the state */
	uint32_t blocks[SH_MAX_BLOCKS];
	struct kern_sampling_params sp;
};

/* A greedy sequence with a random prompt of n_prompt tokens in 3..3+vocab_span-1. */
static inline void sh_seq_init(struct sh_seq *q, uint64_t id, uint32_t n_prompt, uint32_t block_tokens,
			       uint32_t n_blocks, int vocab_span)
{
	memset(q, 0, sizeof *q);
	q->id = id;
	q->n_prompt = n_prompt;
	q->block_tokens = block_tokens;
	q->n_blocks = n_blocks;
	for (uint32_t i = 0; i < n_prompt; i++)
		q->toks[i] = 3 + rand() % vocab_span;
	q->n_tok = n_prompt;
	for (uint32_t i = 0; i < n_blocks; i++)
		q->blocks[i] = i;
	q->sp = (struct kern_sampling_params){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
}

/* The verify step over [toks[n_cached..n_tok), drafts[0..n_draft)] on ex, its
 * status returned (q is not advanced): for tests that expect a failure. */
static inline enum status sh_step_status(struct exec *ex, const struct sh_seq *q, const int32_t *drafts,
					 uint32_t n_draft, struct exec_sample *o, struct err *e)
{
	int32_t ids[64], pos[64];
	uint32_t n = 0;
	for (uint32_t p = q->n_cached; p < q->n_tok; p++)
		ids[n++] = q->toks[p];
	for (uint32_t i = 0; i < n_draft; i++)
		ids[n++] = drafts[i];
	for (uint32_t i = 0; i < n; i++)
		pos[i] = (int32_t)(q->n_cached + i);
	uint32_t ctx = q->n_cached + n, B = q->block_tokens;
	struct exec_seq es = {.seq_id = q->id, .n_cached_tokens = q->n_cached, .n_context_tokens = ctx,
			      .n_blocks = (ctx + B - 1) / B, .state_slot = EXEC_NO_SLOT, .sample = true,
			      .sampling = &q->sp, .prompt_ids = q->toks, .n_prompt = q->n_prompt,
			      .output_ids = q->toks + q->n_prompt, .n_output = q->n_tok - q->n_prompt, .n_draft = n_draft};
	uint32_t qs[2] = {0, n};
	struct exec_step st = {.n_tokens = n, .token_ids = ids, .positions = pos, .n_seqs = 1, .seqs = &es,
			       .query_start = qs, .block_ids = q->blocks, .n_block_ids = q->n_blocks, .n_sample = 1};
	memset(o, 0, sizeof *o);
	return ex->ops->step(ex->ctx, &st, o, e);
}

/* Run [toks[n_cached..n_tok), drafts[0..n_draft)] on ex; the produced tokens
 * are appended; returns how many (0 after a failed step, which is checked). */
static inline uint32_t sh_step(struct exec *ex, struct sh_seq *q, const int32_t *drafts, uint32_t n_draft,
			       struct exec_sample *o)
{
	struct err e = {0};
	enum status rc = sh_step_status(ex, q, drafts, n_draft, o, &e);
	T_CHECKF(rc == ST_OK, "step at %u: %s", q->n_cached, e.msg);
	if (rc)
		return 0;
	uint32_t made = 1 + o->n_extra;
	q->n_cached = q->n_tok + o->n_extra; /* t and the accepted drafts */
	for (uint32_t i = 0; i < made; i++)
		q->toks[q->n_tok++] = i ? o->extra[i - 1].token_id : o->out.token_id;
	return made;
}

/* What the draft hook writes: the true continuation, corrupted at one position. */
struct sh_hook_state {
	const int32_t *truth; /* the plain run's tokens (prompt + output) */
	uint32_t n_prompt;
	uint32_t vocab;
	uint32_t next;    /* index in truth of the first draft */
	uint32_t corrupt; /* 0..K-1: that draft is wrong; K: none */
};
static struct sh_hook_state sh_hook_st;

/* A spec_draft_hook_fn writing sh_hook_st's drafts; checks that the drafts
 * it is asked for start where the test expects. */
static inline void sh_hook(void *ctx, const struct exec_seq *sq, uint32_t n_new, int32_t *d, uint32_t n)
{
	(void)ctx;
	const struct sh_hook_state *h = &sh_hook_st;
	T_CHECK(h->n_prompt + sq->n_output + n_new == h->next);
	for (uint32_t i = 0; i < n; i++) {
		d[i] = h->truth[h->next + i];
		if (i == h->corrupt)
			d[i] = (d[i] + 1 + (int32_t)(h->next % 17)) % (int32_t)h->vocab;
	}
}

/* Executor A (speculating, its drafts replaced by sh_hook's) and executor B
 * (proposing nothing) driven in lockstep over sequences a and b: A's verify
 * step i has its drafts corrupted so that i % (K + 1) of them are accepted,
 * then B verifies exactly the drafts A accepted. */
struct sh_lockstep {
	struct exec *ea, *eb;
	struct sh_seq *a, *b;
	uint32_t max_drafts; /* K: A proposes K drafts a step */
	bool check_b_accepts_all; /* also check that B accepts every draft it is given */
	int32_t drafts[EXEC_SPEC_MAX_DRAFT];
	uint32_t n_drafts; /* A's proposal for its next step */
	uint32_t steps;    /* verify steps done: the caller counts them after its own checks */
	uint32_t accepted_at[EXEC_SPEC_MAX_DRAFT + 1];
};

/* The prefill of both; A's first proposal is kept for its first verify step. */
static inline void sh_lockstep_prefill(struct sh_lockstep *ls)
{
	struct exec_sample o;
	sh_hook_st.corrupt = 0;
	sh_hook_st.next = ls->a->n_prompt + 1;
	sh_step(ls->ea, ls->a, NULL, 0, &o);
	ls->n_drafts = o.n_next_draft;
	memcpy(ls->drafts, o.next_draft, sizeof ls->drafts);
	sh_step(ls->eb, ls->b, NULL, 0, &o);
	T_CHECKF(o.n_next_draft == 0, "B proposes nothing");
}

/* One verify step of A, then B's with A's accepted drafts; returns the
 * tokens A made (0 after a failed step). */
static inline uint32_t sh_lockstep_step(struct sh_lockstep *ls)
{
	struct exec_sample o;
	struct sh_seq *a = ls->a, *b = ls->b;
	const uint32_t K = ls->max_drafts, nd = ls->n_drafts;
	const uint32_t want = ls->steps % (K + 1); /* drafts accepted this step (corrupted when proposed) */
	T_CHECKF(nd == K, "A proposed %u drafts at %u", nd, a->n_tok);
	/* the proposal made during this step is for the tokens after its last one */
	sh_hook_st.next = a->n_tok + (want < nd ? want : nd) + 1;
	sh_hook_st.corrupt = (ls->steps + 1) % (K + 1);
	uint32_t made = sh_step(ls->ea, a, ls->drafts, nd, &o);
	if (!made)
		return 0;
	ls->accepted_at[o.n_extra]++;
	T_CHECKF(o.n_extra == (want < nd ? want : nd), "step %u: accepted %u, expected %u", ls->steps, o.n_extra, want);
	ls->n_drafts = o.n_next_draft;
	memcpy(ls->drafts, o.next_draft, sizeof ls->drafts);
	uint32_t made_b = sh_step(ls->eb, b, a->toks + b->n_tok, made - 1, &o);
	T_CHECKF(made_b == made && (!ls->check_b_accepts_all || o.n_extra == made - 1), "B made %u of %u", made_b,
		 made);
	return made;
}

#endif
