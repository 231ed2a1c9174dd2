/*
 * server/bench_run.c: how `dsv4 bench decode` drives the executor: open it
 * with the block size the contexts were rounded to, prefill the prompts in
 * chunks, and run a batch of sequences continuing from them for timed decode
 * steps (greedy, the sampled token fed back), or for one warm and one
 * profiled step with the registry's hook active.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/bench_decode.h"


/* Open the executor (model/exec_open.h) with the block size B the contexts were rounded to. */
enum status bench__open(struct bench *b, const struct model_exec_open_options *xo, uint32_t B, struct err *e)
{
	enum status st = model_exec_open(&b->mx, xo, e);
	if (st)
		return st;
	b->ex = model_exec_open_exec(b->mx);
	b->B = b->ex->info.block_tokens;
	if (b->B != B)
		return err_set(e, ST_INVALID, "the executor chose blocks of %u tokens (expected %u)", b->B, B);
	return ST_OK;
}

enum status bench__prefill(struct bench *b, uint32_t C, uint32_t np, double *tok_s, struct err *e)
{
	const struct exec_info *in = &b->ex->info;
	uint32_t T = in->max_step_tokens, nbc = C / b->B;
	int32_t *pos = malloc((size_t)T * sizeof *pos);
	if (!pos)
		return err_set(e, ST_NOMEM, "prefill positions");
	struct kern_sampling_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
	enum status st = ST_OK;
	double t0 = bench__now_s();
	for (uint32_t p = 0; p < np && !st; p++) {
		const int32_t *ids = b->prompts + (size_t)p * C;
		uint64_t sid = ++b->seq_id;
		for (uint32_t done = 0; done < C && !st;) {
			uint32_t q = C - done < T ? C - done : T;
			for (uint32_t k = 0; k < q; k++)
				pos[k] = (int32_t)(done + k);
			bool last = done + q == C;
			struct exec_seq es = {.seq_id = sid, .n_cached_tokens = done, .n_context_tokens = done + q,
					      .n_blocks = (done + q + b->B - 1) / b->B, .block_table_start = 0,
					      .state_slot = in->n_state_slots ? 0 : EXEC_NO_SLOT,
					      .restore_state = done == 0, .sample = last,
					      .sampling = &sp, .prompt_ids = ids, .n_prompt = C};
			uint32_t qs[2] = {0, q};
			struct exec_step step = {.n_tokens = q, .token_ids = ids + done, .positions = pos, .n_seqs = 1,
						 .seqs = &es, .query_start = qs, .block_ids = b->block_ids + (size_t)p * nbc,
						 .n_block_ids = es.n_blocks, .n_sample = last ? 1 : 0};
			struct exec_sample smp;
			st = b->ex->ops->step(b->ex->ctx, &step, &smp, e);
			done += q;
		}
		if (b->ex->ops->seq_release)
			b->ex->ops->seq_release(b->ex->ctx, sid);
	}
	double dt = bench__now_s() - t0;
	*tok_s = dt > 0 ? (double)C * np / dt : 0;
	free(pos);
	return st;
}

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* b sequences from the prefilled prompts: warmup + steps timed (profile false), or
 * one warm step and one profiled step (profile true: the hook's timing and the
 * routing capture; needs an eager executor, as a CUDA graph replay calls no host code). */
enum status bench__decode_run(struct bench *b, uint32_t C, uint32_t np, uint32_t batch, bool profile,
			      struct result *r, struct err *e)
{
	const struct bench_opts *o = b->o;
	uint32_t n_steps = profile ? 2 : o->warmup + o->steps, nbc = C / b->B;
	uint32_t nt = (n_steps + b->B - 1) / b->B + 1, bt = nbc + nt;
	uint32_t need = np * nbc + batch * nt;
	if (need > b->ex->info.n_blocks) {
		r->skipped = true;
		snprintf(r->why, sizeof r->why, "needs %u blocks, the pool has %u", need, b->ex->info.n_blocks);
		return ST_OK;
	}
	bool slots = b->ex->info.n_state_slots > 0; /* slot mode: one live-state slot per sequence */
	if (slots && batch > b->ex->info.n_state_slots) {
		r->skipped = true;
		snprintf(r->why, sizeof r->why, "needs %u state slots, the executor has %u", batch,
			 b->ex->info.n_state_slots);
		return ST_OK;
	}
	struct exec_seq *seqs = calloc(batch, sizeof *seqs);
	uint32_t *qs = calloc(batch + 1, sizeof *qs), *bids = calloc((size_t)batch * bt, sizeof *bids);
	int32_t *tok = calloc(batch, sizeof *tok), *pos = calloc(batch, sizeof *pos);
	int32_t *outs = calloc((size_t)batch * n_steps, sizeof *outs);
	struct exec_sample *smp = calloc(batch, sizeof *smp);
	double *ms = calloc(o->steps, sizeof *ms);
	enum status st = ST_OK;
	if (!seqs || !qs || !bids || !tok || !pos || !outs || !smp || !ms) {
		st = err_set(e, ST_NOMEM, "decode batch %u", batch);
		goto out;
	}
	struct kern_sampling_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
	uint64_t rs = o->seed ^ ((uint64_t)C << 20) ^ batch;
	for (uint32_t i = 0; i < batch; i++) {
		uint32_t p = i % np;
		for (uint32_t k = 0; k < nbc; k++)
			bids[(size_t)i * bt + k] = b->block_ids[(size_t)p * nbc + k];
		for (uint32_t k = 0; k < nt; k++)
			bids[(size_t)i * bt + nbc + k] = np * nbc + i * nt + k;
		tok[i] = (int32_t)(bench__rng_next(&rs) % (b->ex->info.vocab_size - 2)) + 2;
		qs[i] = i;
		seqs[i] = (struct exec_seq){.seq_id = ++b->seq_id, .block_table_start = i * bt,
					    .state_slot = slots ? i : EXEC_NO_SLOT,
					    .sample = true, .sampling = &sp, .prompt_ids = b->prompts + (size_t)p * C,
					    .n_prompt = C, .output_ids = outs + (size_t)i * n_steps};
	}
	qs[batch] = batch;
	for (uint32_t s = 0; s < n_steps && !st; s++) {
		bool profiled = profile && s == n_steps - 1;
		for (uint32_t i = 0; i < batch; i++) {
			struct exec_seq *q = &seqs[i];
			q->n_cached_tokens = C + s;
			q->n_context_tokens = C + s + 1;
			q->n_blocks = (C + s + 1 + b->B - 1) / b->B;
			q->restore_state = s == 0;
			q->n_output = s;
			pos[i] = (int32_t)(C + s);
		}
		struct exec_step step = {.n_tokens = batch, .token_ids = tok, .positions = pos, .n_seqs = batch,
					 .seqs = seqs, .query_start = qs, .block_ids = bids, .n_block_ids = batch * bt,
					 .n_sample = batch};
		if (profiled) {
			struct prof *p = b->prof;
			p->timing = true;
			p->n_post = p->n_route = p->n_recs = 0;
			memset(p->ids_n, 0, (size_t)p->n_layers * sizeof *p->ids_n);
			kern_profile_set_active(true);
		}
		double t0 = bench__now_s();
		st = b->ex->ops->step(b->ex->ctx, &step, smp, e);
		double dt = bench__now_s() - t0;
		if (profiled)
			kern_profile_set_active(false);
		if (st)
			break;
		if (!profile && s >= o->warmup)
			ms[s - o->warmup] = dt * 1e3;
		for (uint32_t j = 0; j < batch; j++) {
			uint32_t i = smp[j].seq_index < batch ? smp[j].seq_index : j;
			tok[i] = smp[j].out.token_id;
			outs[(size_t)i * n_steps + s] = tok[i];
		}
	}
	if (st || profile)
		goto out;
	double sum = 0;
	for (uint32_t i = 0; i < o->steps; i++)
		sum += ms[i];
	qsort(ms, o->steps, sizeof *ms, dbl_cmp);
	r->ms_mean = sum / o->steps;
	r->ms_min = ms[0];
	r->ms_median = o->steps % 2 ? ms[o->steps / 2] : 0.5 * (ms[o->steps / 2 - 1] + ms[o->steps / 2]);
	r->tok_s = batch / (r->ms_median * 1e-3);
	r->ctx_mean = C + o->warmup + 0.5 * (o->steps - 1);
out:
	if (b->ex->ops->seq_release && seqs)
		for (uint32_t i = 0; i < batch; i++)
			b->ex->ops->seq_release(b->ex->ctx, seqs[i].seq_id);
	free(seqs);
	free(qs);
	free(bids);
	free(tok);
	free(pos);
	free(outs);
	free(smp);
	free(ms);
	return st;
}
