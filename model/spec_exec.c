/*
 * model/spec_exec.c: the speculating executor (model/spec.h): wraps the
 * model executor and implements model/exec.h "Speculative decoding".
 *
 * A step without drafts runs as the wrapped executor's own step. A step
 * with drafts saves what the drafting sequences can write
 * (model_fwd_spec_save with the stash), runs the forward pass with the
 * logits of every row the verify needs, samples each sampling sequence on
 * the host (kern_sample_ref, the CPU sample op's semantics; a drafting one
 * through spec_verify_chain) and commits the accepted prefix
 * (model_fwd_spec_commit). After either kind of step the drafter commits
 * the step's kept positions and proposes drafts for every sequence that
 * sampled (none for a masked, structured-output row: the scheduler never
 * drafts for it).
 */
#include "model/spec.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/log.h"
#include "model/dspark.h"
#include "model/exec_cpu.h"
#include "model/forward.h"
#include "model/weights.h"

struct model_spec_exec {
	struct exec ex;            /* what the scheduler sees */
	struct exec *inner;
	struct model_exec_cpu *x;
	struct model_spec_exec_options opt;
	struct spec_drafter drafter;
	uint32_t K, vocab, max_seqs, max_tokens;
	float *logits;             /* [max_seqs * (K + 1), vocab] host */
	uint32_t *rows, *n_q, *n_keep; /* [max_seqs * (K + 1)], [max_seqs], [max_seqs] */
	void *sample_work;
	int32_t *hist;             /* verify history: output + drafts */
	size_t hist_cap;
	struct spec_draft_seq *dseqs; /* [max_seqs] */
	int32_t *next_ids;         /* [max_tokens] */
	int32_t *drafts;           /* [max_seqs, K] */
	int32_t *share;            /* [1 + max_seqs * (K + 3)]: spx_share's message */
	bool *quiet;               /* [max_seqs]: proposes nothing (a masked row) */
};

/* After the target step, before the drafter: every sampling sequence's
 * tokens (out) and whether it may propose (quiet), as rank 0 decided them.
 * On one rank it only sets quiet. Workers do not sample (their logits may
 * differ from rank 0's in the last bits, and they lack the structured-output
 * masks), so they take rank 0's tokens whole: the accepted prefix they
 * commit and the drafts they chain on are rank 0's.
 * mine is this rank's step status: every rank calls this after its step,
 * failed or not, so a step that fails on one rank (rank 0's sampling) ends
 * with the same message count everywhere; the message starts with rank 0's
 * status and every rank then fails the step. */
static enum status spx_share(struct model_spec_exec *sx, const struct exec_step *step, struct exec_sample *out,
			     enum status mine, struct err *e)
{
	bool root = !sx->opt.comm || comm_rank(sx->opt.comm) == 0;
	uint32_t stride = sx->K + 3, k = 0;
	sx->share[0] = root ? (int32_t)mine : 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		if (!sq->sample)
			continue;
		int32_t *w = sx->share + 1 + (size_t)k * stride;
		if (root && !mine) {
			const struct exec_sample *o = &out[k];
			w[0] = (int32_t)(1 + o->n_extra);
			w[1] = sx->opt.no_propose || sq->sampling->allow_mask;
			w[2] = o->out.token_id;
			for (uint32_t i = 0; i < o->n_extra; i++)
				w[3 + i] = o->extra[i].token_id;
		}
		k++;
	}
	if (sx->opt.comm) {
		struct err ce = {0};
		enum status st = comm_broadcast(sx->opt.comm, sx->share, sx->share,
						(1 + (size_t)k * stride) * sizeof(int32_t), COMM_DTYPE_BYTES, 0,
						COMM_MEM_HOST, &ce);
		if (st && !mine)
			return err_set(e, st, "%s", ce.msg);
	}
	if (mine)
		return mine; /* e says why */
	if (sx->share[0])
		return err_set(e, ST_ABORTED, "speculation: rank 0 failed this step (%s)",
			       status_str((enum status)sx->share[0]));
	k = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		if (!step->seqs[s].sample)
			continue;
		const int32_t *w = sx->share + 1 + (size_t)k * stride;
		if (w[0] < 1 || (uint32_t)w[0] > sx->K + 1)
			return err_set(e, ST_INVALID, "speculation: rank 0 sent %d tokens for sequence %u", w[0], s);
		sx->quiet[s] = w[1] != 0;
		if (!root) {
			struct exec_sample *o = &out[k];
			memset(o, 0, sizeof *o);
			o->seq_index = s;
			o->out.token_id = w[2];
			o->n_extra = (uint32_t)w[0] - 1;
			for (uint32_t i = 0; i < o->n_extra; i++)
				o->extra[i].token_id = w[3 + i];
		}
		k++;
	}
	return ST_OK;
}

static enum status spx_sample_plain(struct model_spec_exec *sx, const struct exec_seq *sq, const float *row,
				    struct kern_sample_out *out)
{
	struct kern_sample_history h = {.prompt_ids = sq->prompt_ids, .n_prompt = sq->n_prompt,
					.output_ids = sq->output_ids, .n_output = sq->n_output};
	return kern_sample_ref(row, sx->vocab, sq->sampling, &h, sq->n_output, sx->sample_work, out);
}

static enum status spx_verify_sample(struct model_spec_exec *sx, const struct exec_step *step,
				     struct exec_sample *out, struct err *e);

/* The verify step: forward with the chain rows, host sampling (rank 0),
 * the tokens shared, commit. */
static enum status spx_verify(struct model_spec_exec *sx, const struct exec_step *step, struct exec_sample *out,
			      struct err *e)
{
	struct model_fwd *f = model_exec_cpu_fwd(sx->x);
	uint32_t nr = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		sx->n_q[s] = sq->n_draft ? sq->n_draft + 1 : 0;
		if (!sq->sample)
			continue;
		uint32_t end = step->query_start[s + 1];
		for (uint32_t i = end - 1 - sq->n_draft; i < end; i++)
			sx->rows[nr++] = i;
	}
	enum status st = model_fwd_spec_save(f, step, sx->n_q, 0, model_exec_cpu_weights(sx->x)->n_layers, true, e);
	if (!st)
		st = model_exec_cpu_forward(sx->x, step, sx->rows, nr, sx->logits, e);
	if (!st && (!sx->opt.comm || comm_rank(sx->opt.comm) == 0))
		st = spx_verify_sample(sx, step, out, e);
	if ((st = spx_share(sx, step, out, st, e)))
		return st;
	uint32_t k = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		sx->n_keep[s] = 0;
		if (sq->sample && sq->n_draft)
			sx->n_keep[s] = 1 + out[k].n_extra; /* t and the accepted drafts */
		k += sq->sample;
	}
	return model_fwd_spec_commit(f, sx->n_keep, e);
}

/* Rank 0's half of the verify: each sampling sequence's chain rows (the
 * logits in sx->logits, in step order) sampled into out. */
static enum status spx_verify_sample(struct model_spec_exec *sx, const struct exec_step *step,
				     struct exec_sample *out, struct err *e)
{
	enum status st;
	uint32_t k = 0, r = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		if (!sq->sample)
			continue;
		struct exec_sample *o = &out[k++];
		o->seq_index = s;
		const float *lg = sx->logits + (size_t)r * sx->vocab;
		r += sq->n_draft + 1;
		if (!sq->n_draft) {
			if ((st = spx_sample_plain(sx, sq, lg, &o->out)))
				return err_set(e, st, "sampling sequence %u", s);
			continue;
		}
		if (sq->n_output + (size_t)sq->n_draft > sx->hist_cap) {
			size_t c = (sq->n_output + (size_t)sq->n_draft) * 2;
			int32_t *h = realloc(sx->hist, c * sizeof *h);
			if (!h)
				return err_set(e, ST_NOMEM, "verify history");
			sx->hist = h;
			sx->hist_cap = c;
		}
		struct kern_sample_history h = {.prompt_ids = sq->prompt_ids, .n_prompt = sq->n_prompt,
						.output_ids = sq->output_ids, .n_output = sq->n_output};
		struct kern_sample_out res[EXEC_SPEC_MAX_DRAFT + 1];
		uint32_t n = 0, q0 = step->query_start[s + 1] - sq->n_draft;
		if ((st = spec_verify_chain(lg, sx->vocab, sq->sampling, &h, sq->n_output, step->token_ids + q0,
					    sq->n_draft, sx->hist, sx->sample_work, res, &n)))
			return err_set(e, st, "verifying sequence %u", s);
		o->out = res[0];
		o->n_extra = n - 1;
		for (uint32_t i = 1; i < n; i++)
			o->extra[i - 1] = res[i];
	}
	return ST_OK;
}

static enum status spx_step(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e)
{
	struct model_spec_exec *sx = ctx;
	bool drafts = false, plp = false;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		plp |= sq->prompt_lp != NULL;
		if (!sq->n_draft)
			continue;
		uint32_t nq = step->query_start[s + 1] - step->query_start[s];
		if (!sq->sample || sq->n_draft > sx->K || sq->n_draft >= nq)
			return err_set(e, ST_INVALID, "sequence %u: %u drafts in %u tokens (at most %u, sampling)", s,
				       sq->n_draft, nq, sx->K);
		drafts = true;
	}
	if (drafts && plp)
		return err_set(e, ST_INVALID, "a step with drafts carries prompt log-probabilities");
	if (step->n_seqs > sx->max_seqs)
		return err_set(e, ST_INVALID, "step of %u sequences", step->n_seqs);
	enum status st;
	if (drafts) {
		st = spx_verify(sx, step, out, e);
	} else {
		st = sx->inner->ops->step(sx->inner->ctx, step, out, e);
		for (uint32_t k0 = 0; !st && k0 < step->n_sample; k0++)
			out[k0].n_extra = 0; /* the wrapped executor's samples: one token each */
		st = spx_share(sx, step, out, st, e);
	}
	if (st)
		return st;
	/* the drafter: every sequence's kept positions and the token after each */
	uint32_t nd = 0, nn = 0, k = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t q0 = step->query_start[s], q1 = step->query_start[s + 1];
		struct exec_sample *o = sq->sample ? &out[k++] : NULL;
		uint32_t n = sq->n_draft ? 1 + o->n_extra : q1 - q0;
		if (!n)
			continue;
		struct spec_draft_seq *d = &sx->dseqs[nd++];
		*d = (struct spec_draft_seq){.seq_id = sq->seq_id, .seq_index = s, .pos0 = sq->n_cached_tokens,
					     .n_commit = n, .row0 = q0, .next_ids = sx->next_ids + nn,
					     .drafts = sx->drafts + (size_t)(nd - 1) * sx->K};
		for (uint32_t i = 0; i + 1 < n; i++)
			sx->next_ids[nn + i] = step->token_ids[q0 + i + 1];
		if (o) {
			/* the last new token follows the last kept position */
			sx->next_ids[nn + n - 1] = o->n_extra ? o->extra[o->n_extra - 1].token_id : o->out.token_id;
			d->n_propose = sx->quiet[s] ? 0 : sx->K;
		} else if (sq->has_next_token) {
			sx->next_ids[nn + n - 1] = sq->next_token;
		} else {
			return err_set(e, ST_INVALID, "sequence %u: the token after position %u is unknown", s,
				       sq->n_context_tokens - 1);
		}
		nn += n;
		if (o)
			o->n_next_draft = 0;
	}
	struct spec_draft_batch b = {.step = step, .streams = model_exec_cpu_streams(sx->x), .seqs = sx->dseqs,
				     .n_seqs = nd};
	if ((st = sx->drafter.ops->commit(sx->drafter.ctx, &b, e)) ||
	    (st = sx->drafter.ops->propose(sx->drafter.ctx, &b, e)))
		return st;
	k = 0;
	for (uint32_t s = 0, j = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		bool has = step->query_start[s + 1] > step->query_start[s];
		struct spec_draft_seq *d = has ? &sx->dseqs[j++] : NULL;
		if (!sq->sample)
			continue;
		struct exec_sample *o = &out[k++];
		if (!d || !d->n_propose)
			continue;
		if (sx->opt.draft_hook)
			sx->opt.draft_hook(sx->opt.draft_hook_ctx, sq, 1 + o->n_extra, d->drafts, d->n_drafts);
		o->n_next_draft = d->n_drafts;
		memcpy(o->next_draft, d->drafts, d->n_drafts * sizeof(int32_t));
	}
	return ST_OK;
}

static void spx_seq_release(void *ctx, uint64_t seq_id)
{
	struct model_spec_exec *sx = ctx;
	if (sx->inner->ops->seq_release)
		sx->inner->ops->seq_release(sx->inner->ctx, seq_id);
	if (sx->drafter.ops->seq_release)
		sx->drafter.ops->seq_release(sx->drafter.ctx, seq_id);
}

static const struct exec_ops spx_ops = {.step = spx_step, .seq_release = spx_seq_release};

void model_spec_exec_destroy(struct model_spec_exec *sx)
{
	if (!sx)
		return;
	if (sx->drafter.ops)
		sx->drafter.ops->destroy(sx->drafter.ctx);
	free(sx->logits);
	free(sx->rows);
	free(sx->n_q);
	free(sx->n_keep);
	free(sx->sample_work);
	free(sx->hist);
	free(sx->dseqs);
	free(sx->next_ids);
	free(sx->drafts);
	free(sx->share);
	free(sx->quiet);
	free(sx);
}

/* model_spec_exec_create's checks; the caller destroys opt->drafter on a refusal */
static enum status spx_check(const struct model_spec_exec_options *opt, struct err *e)
{
	if (!opt->x)
		return err_set(e, ST_INVALID, "speculation: no executor");
	const struct model_weights *w = model_exec_cpu_weights(opt->x);
	enum status st = spec_config_check(&opt->cfg, w->cfg, e);
	if (st)
		return st;
	if (!opt->drafter.ops && opt->cfg.method != MODEL_DRAFT_MTP && opt->cfg.method != MODEL_DRAFT_DSPARK)
		return err_set(e, ST_UNSUPPORTED, "speculation: method %s has no drafter yet (mtp does)",
			       model_draft_kind_str(opt->cfg.method));
	if (!opt->cfg.num_speculative_tokens || opt->cfg.num_speculative_tokens > EXEC_SPEC_MAX_DRAFT)
		return err_set(e, ST_INVALID, "speculation: %u draft tokens", opt->cfg.num_speculative_tokens);
	return ST_OK;
}

enum status model_spec_exec_create(struct model_spec_exec **out, const struct model_spec_exec_options *opt,
				   struct err *e)
{
	*out = NULL;
	if (!opt)
		return err_set(e, ST_INVALID, "speculation: no options");
	enum status st = spx_check(opt, e);
	if (st) {
		if (opt->drafter.ops)
			opt->drafter.ops->destroy(opt->drafter.ctx);
		return st;
	}
	struct model_spec_exec *sx = calloc(1, sizeof *sx);
	if (!sx) {
		if (opt->drafter.ops)
			opt->drafter.ops->destroy(opt->drafter.ctx);
		return err_set(e, ST_NOMEM, "speculation");
	}
	sx->opt = *opt;
	sx->x = opt->x;
	sx->inner = model_exec_cpu_exec(opt->x);
	sx->ex = *sx->inner;
	sx->ex.ops = &spx_ops;
	sx->ex.ctx = sx;
	sx->K = opt->cfg.num_speculative_tokens;
	sx->ex.info.max_draft_tokens = sx->K;
	sx->vocab = sx->inner->info.vocab_size;
	sx->max_seqs = sx->inner->info.max_step_seqs;
	sx->max_tokens = sx->inner->info.max_step_tokens;
	sx->drafter = opt->drafter;
	if ((!sx->drafter.ops && (st = opt->cfg.method == MODEL_DRAFT_DSPARK /* model/dspark.h */
					       ? spec_dspark_drafter_create(&sx->drafter, opt->x, sx->K, e)
					       : spec_mtp_drafter_create(&sx->drafter, opt->x, sx->K, e))) ||
	    (st = model_fwd_spec_enable(model_exec_cpu_fwd(opt->x), sx->max_seqs * (sx->K + 1), e))) {
		model_spec_exec_destroy(sx);
		return st;
	}
	size_t S = sx->max_seqs, R = S * (sx->K + 1);
	sx->logits = malloc(R * sx->vocab * sizeof(float));
	sx->rows = malloc(R * sizeof(uint32_t));
	sx->n_q = calloc(S + 1, sizeof(uint32_t));
	sx->n_keep = calloc(S + 1, sizeof(uint32_t));
	sx->sample_work = malloc(kern_sample_workspace_bytes(sx->vocab));
	sx->dseqs = calloc(S + 1, sizeof *sx->dseqs);
	sx->next_ids = malloc((sx->max_tokens + 1) * sizeof(int32_t));
	sx->drafts = malloc(S * sx->K * sizeof(int32_t));
	sx->share = malloc((1 + S * (sx->K + 3)) * sizeof(int32_t));
	sx->quiet = calloc(S + 1, sizeof(bool));
	if (!sx->share || !sx->quiet || !sx->logits || !sx->rows || !sx->n_q || !sx->n_keep || !sx->sample_work || !sx->dseqs || !sx->next_ids ||
	    !sx->drafts) {
		model_spec_exec_destroy(sx);
		return err_set(e, ST_NOMEM, "speculation buffers for %zu rows", R);
	}
	log_msg(LOG_INFO, "spec", "speculative decoding: %s drafter, up to %u drafts per sequence and step",
		sx->drafter.ops->name, sx->K);
	*out = sx;
	return ST_OK;
}

struct exec *model_spec_exec_exec(struct model_spec_exec *sx)
{
	return &sx->ex;
}
