/*
 * model/forward_dspark.c: the forward's DSpark entry points (0731 release,
 * model/forward.h; host memory only): the target-layer captures of the main
 * pass, main_x, a stage's context KV row, and the draft block through the
 * stages and the last stage's head. model/dspark.c drives them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"

enum status model_fwd_dspark_enable(struct model_fwd *f, struct err *e)
{
	if (!f->w->n_dspark)
		return err_set(e, ST_UNSUPPORTED, "the DSpark stages are not loaded");
	if (f->mem.device)
		return err_set(e, ST_UNSUPPORTED, "the DSpark drafter runs on the CPU executor only");
	if (f->dsp_cap)
		return ST_OK;
	size_t n = (size_t)f->opt.max_tokens * (size_t)f->cfg->dspark.n_target_layers * (size_t)f->D;
	f->dsp_cap = calloc(n ? n : 1, sizeof(float));
	return f->dsp_cap ? ST_OK : err_set(e, ST_NOMEM, "DSpark captures");
}

const float *model_fwd_dspark_captures(const struct model_fwd *f)
{
	return f->dsp_cap;
}

/* After main layer l: when it is a target layer j, its output averaged over
 * the hc streams into columns [j*D, (j+1)*D) of the captures. */
enum status fwd__dspark_capture(struct model_fwd *f, int l, struct err *e)
{
	const struct model_dspark_config *c = &f->cfg->dspark;
	int64_t D = f->D, n = f->n, nt = c->n_target_layers;
	for (int j = 0; j < nt; j++) {
		if (c->target_layer_ids[j] != l)
			continue;
		for (int64_t t = 0; t < f->T; t++) {
			float *dst = f->dsp_cap + (t * nt + j) * D;
			const float *x = f->x + t * n * D;
			for (int64_t i = 0; i < D; i++) {
				float s = 0;
				for (int64_t k = 0; k < n; k++)
					s += x[k * D + i];
				dst[i] = s / (float)n;
			}
		}
		if ((f->T && f->opt.bf16_round))
			return fwd__round_bf16(f, f->dsp_cap, f->T * nt * D, e);
	}
	return ST_OK;
}

static const struct model_layer *dspark_stage(const struct model_fwd *f, int k)
{
	return &f->w->layers[f->w->n_layers + f->w->n_mtp + k];
}

enum status model_fwd_dspark_main(struct model_fwd *f, const float *cap, uint32_t T, float *main_x, struct err *e)
{
	const struct model_layer *ly = dspark_stage(f, 0);
	int l = ly->layer;
	enum status st;
	if (T > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "DSpark main_proj: %u rows > %u", T, f->opt.max_tokens);
	if ((st = fwd__lin(f, &ly->main_proj, cap, 0, T, main_x, 0, true, l, e)))
		return st;
	return fwd__norm(f, ly, main_x, main_x, T, (int)f->D, ly->main_norm, true, l, e);
}

enum status model_fwd_dspark_kv(struct model_fwd *f, int stage, const float *main_x, const int32_t *pos, uint32_t T,
				float *kv, struct err *e)
{
	const struct model_layer *ly = dspark_stage(f, stage);
	return fwd__attn_kv(f, ly, ly->layer, main_x, pos, T, kv, e);
}

/* A stage's attention over the block: every query of sequence s sees its
 * context rows and all of its block's rows (non-causal inside the block). */
static enum status dspark_attention(struct model_fwd *f, const struct model_layer *ly, int stage,
				    const struct model_fwd_dspark_block *b, const float *xn, float *out, struct err *e)
{
	int l = ly->layer;
	int64_t T = f->T, H = f->H, d = f->d, nb = b->block_tokens;
	enum status st;
	if ((st = fwd__attn_q(f, ly, l, xn, f->pos, e)) || (st = fwd__attn_kv(f, ly, l, xn, f->pos, T, f->kv, e)))
		return st;
	for (uint32_t s = 0; s < b->n_seqs; s++) {
		uint32_t c0 = b->ctx_off[s], nc = b->ctx_off[s + 1] - c0;
		if (nc + nb > (uint32_t)f->idx_stride)
			return err_set(e, ST_INVALID, "DSpark: %u context rows + %lld block rows > %d", nc, (long long)nb,
				       f->idx_stride);
		for (int64_t i = 0; i < nb; i++) {
			int64_t t = s * nb + i;
			int32_t *ix = f->idx + t * f->idx_stride;
			for (uint32_t j = 0; j < nc; j++)
				ix[j] = (int32_t)(T + c0 + j);
			for (int64_t j = 0; j < nb; j++)
				ix[nc + j] = (int32_t)(s * nb + j);
			f->idx_len[t] = (int32_t)(nc + nb);
		}
	}
	struct kern_sparse_attn_args aa = {.q = f->q, .out = f->o, .kv_stride = d, .idx = f->idx,
					   .idx_len = f->idx_len, .idx_stride = f->idx_stride, .sink = ly->attn_sink,
					   .softmax_scale = (float)(1.0 / sqrt((double)d)), .pos = f->pos,
					   .omega = ly->omega, .rope_dim = (int)f->r, .n_tokens = T, .n_heads = (int)H,
					   .head_dim = (int)d, .bf16_out = f->opt.bf16_round, .stream = f->mem.stream};
	aa.kv[0] = f->kv;
	aa.kv_rows[0] = T;
	aa.kv[1] = b->ctx_kv[stage];
	aa.kv_rows[1] = b->ctx_off[b->n_seqs];
	OK(ly->layer, ly->ops.sparse_attn(&aa));
	/* under tensor parallelism each rank holds its heads' share of the
	 * output projection: summed as in the main layers' attention */
	if ((st = fwd__attn_out(f, ly, l, out, e)) || (st = fwd__all_reduce(f, out, T * f->D, e)))
		return st;
	return fwd__round_bf16(f, out, T * f->D, e);
}

enum status model_fwd_dspark_draft(struct model_fwd *f, const struct model_fwd_dspark_block *b, float *logits,
				   struct err *e)
{
	if (!f->dsp_cap)
		return err_set(e, ST_INVALID, "DSpark: model_fwd_dspark_enable was not called");
	uint64_t T = (uint64_t)b->n_seqs * b->block_tokens;
	if (!T || T > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "DSpark block of %llu rows (1..%u)", (unsigned long long)T, f->opt.max_tokens);
	enum status st = fwd__meta_reset(f, e);
	if (st)
		return st;
	f->T = (uint32_t)T;
	f->S = (int)b->n_seqs;
	for (uint64_t i = 0; i < T; i++)
		if (b->ids[i] < 0 || b->ids[i] >= f->V)
			return err_set(e, ST_INVALID, "DSpark: token id %d outside the vocabulary", b->ids[i]);
	TAKE(f, f->ids, T);
	TAKE(f, f->pos, T);
	memcpy(f->ids, b->ids, T * sizeof(int32_t));
	memcpy(f->pos, b->pos, T * sizeof(int32_t));
	if (!b->n_head || b->n_head > b->block_tokens)
		return err_set(e, ST_INVALID, "DSpark: %u head rows of a %u-row block", b->n_head, b->block_tokens);
	uint32_t *rows, nr = b->n_seqs * b->n_head;
	TAKE(f, rows, nr);
	for (uint32_t s = 0; s < b->n_seqs; s++)
		for (uint32_t i = 0; i < b->n_head; i++)
			rows[s * b->n_head + i] = s * b->block_tokens + i;
	if ((st = fwd__meta_flush(f, e)) || (st = fwd__embed(f, f->x, f->n, e)))
		return st;
	int64_t D = f->D;
	for (int k = 0; k < f->w->n_dspark; k++) {
		const struct model_layer *ly = dspark_stage(f, k);
		int l = ly->layer;
		float *t;
		if ((st = fwd__hc_pre(f, ly, &ly->hc_attn, f->x, f->u, l, e)) ||
		    (st = fwd__norm(f, ly, f->u, f->xn, f->T, (int)D, ly->attn_norm, true, l, e)) ||
		    (st = dspark_attention(f, ly, k, b, f->xn, f->fo, e)) || (st = fwd__hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
			return st;
		t = f->x, f->x = f->x2, f->x2 = t;
		if ((st = fwd__hc_pre(f, ly, &ly->hc_ffn, f->x, f->u, l, e)) ||
		    (st = fwd__norm(f, ly, f->u, f->xn, f->T, (int)D, ly->ffn_norm, true, l, e)) ||
		    (st = fwd__moe(f, ly, l, f->xn, f->fo, e)) || (st = fwd__hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
			return st;
		t = f->x, f->x = f->x2, f->x2 = t;
	}
	const struct model_layer *last = dspark_stage(f, f->w->n_dspark - 1);
	return fwd__head(f, last, &last->mtp_hc_head, last->mtp_norm, f->x, rows, nr, logits, e);
}
