/*
 * model/exec_cpu.c: the CPU executor (model/exec_cpu.h): load-time set-up
 * (weights and plan, block pool, forward buffers), the exec vtable's step
 * (forward, logits of each sampling sequence's last token, kern_sample_ref),
 * and the test / speculative-decoding entry points.
 */
#include "model/exec_cpu.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/forward.h"
#include "model/state.h"
#include "model/weights.h"

struct model_exec_cpu {
	struct exec ex;
	struct model_weights w;
	struct model_state st;
	struct model_fwd *fwd;
	float *logits;   /* [max_step_seqs, vocab] */
	uint32_t *rows;  /* [max_step_seqs] */
	void *sample_work;
	uint32_t vocab;
	int rank;
	bool weights_loaded;
};

static enum status cpu_step(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e)
{
	struct model_exec_cpu *x = ctx;
	enum status st = model_fwd_run(x->fwd, step, e);
	if (st)
		return st;
	uint32_t n = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++)
		if (step->seqs[s].sample) {
			if (step->query_start[s + 1] == step->query_start[s])
				return err_set(e, ST_INVALID, "sequence %u samples with no token in the step", s);
			x->rows[n++] = step->query_start[s + 1] - 1;
		}
	if (n != step->n_sample)
		return err_set(e, ST_INVALID, "step says %u samples, %u sequences sample", step->n_sample, n);
	if (!n)
		return ST_OK;
	if ((st = model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), x->rows, n, x->logits, e)))
		return st;
	if (x->rank)
		return ST_OK; /* rank 0 samples (design.md "Tensor parallelism") */
	uint32_t k = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		if (!sq->sample)
			continue;
		struct kern_sample_history h = {.prompt_ids = sq->prompt_ids, .n_prompt = sq->n_prompt,
						.output_ids = sq->output_ids, .n_output = sq->n_output};
		out[k].seq_index = s;
		st = kern_sample_ref(x->logits + (size_t)k * x->vocab, x->vocab, sq->sampling, &h, sq->n_output,
				     x->sample_work, &out[k].out);
		if (st)
			return err_set(e, st, "sampling sequence %u", s);
		k++;
	}
	return ST_OK;
}

static const struct exec_ops cpu_ops = {.step = cpu_step, .seq_release = NULL};

static uint32_t default_block_tokens(const struct model_config *cfg, uint32_t want)
{
	uint32_t B = want ? want : 256;
	if (!want) {
		if (B < (uint32_t)cfg->sliding_window)
			B = (uint32_t)cfg->sliding_window;
		for (int iter = 0; iter < 64; iter++) {
			bool ok = true;
			for (int l = 0; l < cfg->n_layers_total; l++) {
				uint32_t m = (uint32_t)cfg->compress_ratios[l];
				if (m && B % m) {
					B = (B / m + 1) * m;
					ok = false;
				}
			}
			if (ok)
				break;
		}
	}
	return B;
}

enum status model_exec_cpu_create(struct model_exec_cpu **out, const struct model_exec_cpu_options *opt,
				  struct err *e)
{
	*out = NULL;
	if (!opt || !opt->ck)
		return err_set(e, ST_INVALID, "exec_cpu: no checkpoint");
	if (opt->dev && (opt->dev->cc_major || opt->dev->cc_minor))
		return err_set(e, ST_INVALID, "exec_cpu: device %s is a GPU; the CPU executor runs CPU variants only "
					      "(model_weights_load plans for any device)", opt->dev->name);
	const struct model_config *cfg = model_checkpoint_config(opt->ck);
	struct model_exec_cpu *x = calloc(1, sizeof *x);
	if (!x)
		return err_set(e, ST_NOMEM, "exec_cpu");
	int world = opt->world_size ? opt->world_size : 1;
	uint32_t T = opt->max_step_tokens ? opt->max_step_tokens : 512;
	uint32_t S = opt->max_step_seqs ? opt->max_step_seqs : 64;
	uint32_t nb = opt->n_blocks ? opt->n_blocks : 64;
	uint32_t B = default_block_tokens(cfg, opt->block_tokens);
	uint64_t max_len = opt->max_model_len ? opt->max_model_len : (uint64_t)nb * B;
	if (max_len > (uint64_t)cfg->max_position_embeddings)
		max_len = (uint64_t)cfg->max_position_embeddings;
	if (max_len > (uint64_t)nb * B)
		max_len = (uint64_t)nb * B;
	bool ref = opt->precision == MODEL_PREC_REFERENCE;
	struct model_weights_options wo = {.ck = opt->ck, .dev = opt->dev, .disabled = opt->disabled,
					   .selfcheck = opt->kernel_selfcheck,
					   .max_step_tokens = T, .quant_sim = ref, .load_mtp = opt->load_mtp,
					   .rank = opt->rank, .world_size = world};
	enum status st = model_weights_load(&x->w, &wo, e);
	if (st) {
		free(x);
		return st;
	}
	x->weights_loaded = true;
	if ((st = model_state_create(&x->st, &x->w, nb, B, e)))
		goto fail;
	struct model_fwd_options fo = {.max_tokens = T, .max_seqs = S, .max_context = (uint32_t)max_len,
				       .quant_sim = ref, .bf16_round = ref, .comm = world > 1 ? opt->comm : NULL};
	if ((st = model_fwd_create(&x->fwd, &x->w, &x->st, &fo, e)))
		goto fail;
	x->vocab = (uint32_t)cfg->vocab_size;
	x->rank = opt->rank;
	x->logits = malloc((size_t)S * x->vocab * sizeof(float));
	x->rows = malloc((size_t)S * sizeof(uint32_t));
	x->sample_work = malloc(kern_sample_workspace_bytes(x->vocab));
	if (!x->logits || !x->rows || !x->sample_work) {
		st = err_set(e, ST_NOMEM, "exec_cpu: logits for %u sequences", S);
		goto fail;
	}
	x->ex.ops = &cpu_ops;
	x->ex.ctx = x;
	model_state_mix(&x->w, &x->ex.info.mix);
	x->ex.info.block_tokens = B;
	x->ex.info.n_blocks = nb;
	x->ex.info.vocab_size = x->vocab;
	x->ex.info.eos_token_id = (int32_t)cfg->eos_token_id;
	x->ex.info.max_step_tokens = T;
	x->ex.info.max_step_seqs = S;
	x->ex.info.max_model_len = (uint32_t)max_len;
	log_msg(LOG_INFO, "model", "cpu executor: %u blocks of %u tokens, %u tokens x %u sequences per step, %s",
		nb, B, T, S, ref ? "reference precision" : "fp32 precision");
	*out = x;
	return ST_OK;
fail:
	model_exec_cpu_destroy(x);
	return st;
}

void model_exec_cpu_destroy(struct model_exec_cpu *x)
{
	if (!x)
		return;
	model_fwd_destroy(x->fwd);
	model_state_free(&x->st);
	if (x->weights_loaded)
		model_weights_free(&x->w);
	free(x->logits);
	free(x->rows);
	free(x->sample_work);
	free(x);
}

struct exec *model_exec_cpu_exec(struct model_exec_cpu *x)
{
	return &x->ex;
}

enum status model_exec_cpu_forward(struct model_exec_cpu *x, const struct exec_step *step, const uint32_t *rows,
				   uint32_t n_rows, float *logits, struct err *e)
{
	enum status st = model_fwd_run(x->fwd, step, e);
	if (st || !n_rows)
		return st;
	for (uint32_t i = 0; i < n_rows; i++)
		if (rows[i] >= step->n_tokens)
			return err_set(e, ST_INVALID, "logit row %u of a %u-token step", rows[i], step->n_tokens);
	return model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), rows, n_rows, logits, e);
}

const float *model_exec_cpu_streams(const struct model_exec_cpu *x)
{
	return model_fwd_streams(x->fwd);
}

enum status model_exec_cpu_mtp(struct model_exec_cpu *x, const struct exec_step *mtp_step, const float *streams,
			       float *logits, struct err *e)
{
	return model_fwd_mtp(x->fwd, mtp_step, streams, logits, e);
}

size_t model_exec_cpu_plan_str(const struct model_exec_cpu *x, char *buf, size_t n)
{
	return model_weights_plan_str(&x->w, buf, n);
}

const struct kern_plan *model_exec_cpu_plan(const struct model_exec_cpu *x)
{
	return &x->w.plan;
}
