/*
 * model/spec.h: speculative decoding (docs/speculation.md): the
 * --speculative-config value, the drafter interface (MTP here; DSpark
 * plugs in beside it), the verify rule, and the speculating executor that
 * wraps the model executor (model/exec_cpu.h) and implements model/exec.h
 * "Speculative decoding" for the scheduler.
 */
#ifndef DSV4_MODEL_SPEC_H
#define DSV4_MODEL_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/sampling/sampling.h"
#include "model/config.h"
#include "model/exec.h"

struct model_exec_cpu;

/* ---- --speculative-config (vLLM's spelling) ---- */

#define SPEC_MAX_MTP_TOKENS 3    /* MTP reuses its one layer: K = 1..3 */
#define SPEC_MAX_DSPARK_TOKENS 5 /* one DSpark block */

struct spec_config {
	enum model_draft_kind method;    /* MODEL_DRAFT_NONE: speculation off */
	uint32_t num_speculative_tokens; /* K */
};

/* Parse '{"method": "mtp"|"dspark", "num_speculative_tokens": K}' (other
 * keys refused by name). NULL or "" gives method NONE. */
enum status spec_config_parse(const char *json, struct spec_config *out, struct err *e) DSV4_WUR;

/* The method must match the checkpoint's draft model (dsv4-0731.md
 * "Pitfalls": MTP on a 0731 checkpoint reads the DSpark stages as a NextN
 * layer) and K its range. ST_INVALID / ST_UNSUPPORTED naming the reason. */
enum status spec_config_check(const struct spec_config *c, const struct model_config *cfg, struct err *e) DSV4_WUR;

/* ---- The drafter interface ---- */

/* One sequence of a step, as the drafter sees it. */
struct spec_draft_seq {
	uint64_t seq_id;
	uint32_t seq_index;        /* into step->seqs (block table, positions) */
	uint32_t pos0, n_commit;   /* positions [pos0, pos0 + n_commit) were committed by this step */
	uint32_t row0;             /* flat row of pos0 in the target step (its streams, captures) */
	const int32_t *next_ids;   /* [n_commit]: the token after each committed position */
	uint32_t n_propose;        /* drafts wanted after the last next id (0: none) */
	int32_t *drafts;           /* out: [n_propose] */
	uint32_t n_drafts;         /* out: how many were proposed (may be fewer near a block's end) */
};

struct spec_draft_batch {
	const struct exec_step *step; /* the target step that ran */
	const float *streams;         /* its pre-head streams [n_tokens, hc_mult, hidden] (host) */
	struct spec_draft_seq *seqs;
	uint32_t n_seqs;
};

/* A drafter proposes draft tokens from the target's committed tokens. Its
 * own per-sequence state (MTP: the MTP layer's ring in the blocks; DSpark:
 * its stage rings) must end, after every step, exactly as if only committed
 * tokens had been seen: commit writes it for the committed positions only;
 * whatever propose writes for draft positions it undoes before returning.
 * Drafts are deterministic (the drafter's argmax): the verify rule treats
 * them as q = one-hot (docs/speculation.md). */
struct spec_drafter_ops {
	const char *name;
	enum status (*commit)(void *ctx, const struct spec_draft_batch *b, struct err *e);
	/* after commit of the same batch */
	enum status (*propose)(void *ctx, struct spec_draft_batch *b, struct err *e);
	void (*seq_release)(void *ctx, uint64_t seq_id); /* optional */
	void (*destroy)(void *ctx);
};

struct spec_drafter {
	const struct spec_drafter_ops *ops;
	void *ctx;
};

/* The June release's MTP layer (dsv4.md 3.11), reused autoregressively:
 * draft 1 from (h_t, t+1), draft k from the MTP block's own output streams
 * and draft k-1. max_draft <= SPEC_MAX_MTP_TOKENS; x loaded with load_mtp. */
enum status spec_mtp_drafter_create(struct spec_drafter *out, struct model_exec_cpu *x, uint32_t max_draft,
				    struct err *e) DSV4_WUR;

/* ---- The verify rule ---- */

/* Verify drafts[0..n_draft) against logits rows [n_draft + 1, vocab] (host)
 * of the chain [t, d1..dn]: row i is sampled exactly as a plain step would
 * sample the token at output index n_output + i (kern_sample_ref: counter
 * n_output + i, history output_ids followed by d1..di; hist_work holds
 * n_output + n_draft ids), and the chain stops at the first row whose token
 * differs from the draft. For drafts with q one-hot this is the rule "accept
 * with min(1, p/q), else sample norm(max(0, p - q)), a bonus token when all
 * pass" drawn with the plain sampler's own random number, so the output is
 * the plain output token for token. out[0..*n_out) are the produced tokens
 * (*n_out = accepted + 1). */
enum status spec_verify_chain(const float *logits, uint32_t vocab, const struct kern_sampling_params *p,
			      const struct kern_sample_history *h, uint64_t n_output, const int32_t *drafts,
			      uint32_t n_draft, int32_t *hist_work, void *sample_work, struct kern_sample_out *out,
			      uint32_t *n_out) DSV4_WUR;

/* The general rule for a draft d drawn from a distribution q (a drafter
 * that samples): p and q are the target's and the drafter's processed
 * distributions over vocab. Accept d when u_accept * q[d] < p[d] (that is,
 * with probability min(1, p[d]/q[d])); else return a token drawn with
 * u_resample from norm(max(0, p - q)). Returns the token (d when accepted)
 * and sets *accepted. ST_INVALID when q[d] == 0 or the residual is empty
 * while d is rejected (p == q up to rounding: then d is accepted). */
enum status spec_rule_general(const float *p, const float *q, uint32_t vocab, int32_t d, double u_accept,
			      double u_resample, int32_t *token, bool *accepted) DSV4_WUR;

/* ---- The speculating executor ---- */

struct model_spec_exec;

/* Test hook: may rewrite the n drafts proposed for sequence sq of the step
 * (they follow its n_new new tokens, output index sq->n_output + n_new on)
 * before they go to the scheduler (the rollback tests corrupt them). */
typedef void (*spec_draft_hook_fn)(void *ctx, const struct exec_seq *sq, uint32_t n_new, int32_t *drafts, uint32_t n);

struct comm;

struct model_spec_exec_options {
	struct model_exec_cpu *x;  /* borrowed, must outlive it; loaded with load_mtp for MTP */
	struct spec_config cfg;    /* method MTP or DSpark (model/dspark.h; x loaded with load_mtp) */
	/* (optional) the drafter to use instead of the method's own (DSpark's,
	 * or a test's); owned by the executor from create on, destroyed with it */
	struct spec_drafter drafter;
	bool no_propose;           /* tests: commit drafter state but propose nothing */
	spec_draft_hook_fn draft_hook;
	void *draft_hook_ctx;
	/* tensor parallelism: the group x runs in (borrowed; NULL on one rank).
	 * Every rank wraps its own executor; rank 0's samples and draft
	 * decisions are broadcast, so all ranks commit the same prefix. */
	struct comm *comm;
};

enum status model_spec_exec_create(struct model_spec_exec **out, const struct model_spec_exec_options *opt,
				   struct err *e) DSV4_WUR;
void model_spec_exec_destroy(struct model_spec_exec *sx);
/* The executor for the scheduler: info of the wrapped one with max_draft_tokens = K. */
struct exec *model_spec_exec_exec(struct model_spec_exec *sx);

#endif
