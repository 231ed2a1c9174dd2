/*
 * model/forward.c: the forward pass of DeepSeek-V4 over a flat batch
 * (model/forward.h). One function per stage of dsv4.md §3: embedding, the
 * mHC sites, attention (q path, shared K=V, compressors, indexer, sparse
 * attention over [compressed | fresh | ring] rows, grouped output
 * projection), MoE (routing, grouped expert GEMMs, SwiGLU, shared expert),
 * the head and the MTP layer. Every numeric op is the variant selected in the
 * layer plan; what is left here is data movement: the embedding gather, the
 * block-state copies of model/exec.h rule 2, the ring writes, the MoE
 * scatter-add, and the bf16 rounding of tensors the reference stores in bf16.
 *
 * Block rule 2 inside a step: a sequence's chunk is cut into segments at
 * block boundaries. The ring is updated segment by segment after attention.
 * The compressors run in waves: wave j holds the j-th segment of every
 * sequence (gathered contiguously), and before it runs, each segment that
 * starts a block copies the previous block's compressor state into its own,
 * so a completed block ends holding its boundary snapshot.
 */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/quant/quant.h"

struct seg {
	int s;           /* sequence */
	uint32_t i0, i1; /* flat tokens */
	int32_t pos0;    /* position of i0 */
	int32_t blk;     /* block id */
	int32_t prev_blk; /* block id of the previous table entry when pos0 % B == 0 and pos0 > 0, else -1 */
};

struct model_fwd {
	const struct model_weights *w;
	struct model_state *st;
	struct model_fwd_options opt;
	const struct model_config *cfg;
	int64_t D, n, H, d, r, G, R, QL, I, E, K, NHI, ID, V;
	int64_t EL, EB, VL, VB; /* local experts / vocabulary rows (tensor parallel) */
	int rank, ws;
	float *lg_local, *lg_all; /* TP head: this rank's vocabulary shard, the gathered shards */
	int idx_stride;

	/* the current batch */
	uint32_t T;
	int S;
	const int32_t *ids, *pos;
	int32_t *q_off, *start_pos, *bt, bt_stride;
	int64_t *ring_row0;
	int32_t *entry_blk;
	struct seg *segs;
	int n_segs, max_wave;
	int *seg_first; /* [S + 1] first segment of each sequence */

	/* activations */
	float *x, *x2, *u, *xn, *fo, *mix, *sqr, *pre, *post, *comb;
	float *qr, *q, *kv, *o, *z, *kvp, *gp, *ikvp, *igp, *wa, *wb, *qi, *hw, *topk_work;
	int32_t *topk, *idx, *idx_len;
	float *glog, *ew, *rw, *h1, *h3, *y2, *sh1, *sh3, *shy, *hh, *m1, *m2;
	int32_t *eids, *offsets, *ptok, *pslot;
	int32_t *w_q_off, *w_start, *w_slot, *w_bt;
	float *pooled;        /* FP32 mode: the compressors' pre-norm entries (largest row pool) */
	int32_t *ent_pos;     /* [T] positions w of the entries one wave emitted */
	float *x_final;
};

#define ALLOC(p, n)                                                                                \
	do {                                                                                       \
		(p) = calloc((size_t)(n) + 1, sizeof *(p));                                        \
		if (!(p))                                                                          \
			goto nomem;                                                                \
	} while (0)

enum status model_fwd_create(struct model_fwd **out, const struct model_weights *w, struct model_state *s,
			     const struct model_fwd_options *opt, struct err *e)
{
	*out = NULL;
	struct model_fwd *f = calloc(1, sizeof *f);
	if (!f)
		return err_set(e, ST_NOMEM, "forward");
	const struct model_config *c = w->cfg;
	f->w = w;
	f->st = s;
	f->opt = *opt;
	f->cfg = c;
	f->D = c->hidden_size;
	f->n = c->hc_mult;
	f->H = w->n_heads_local;
	f->d = c->head_dim;
	f->r = c->qk_rope_head_dim;
	f->G = w->n_groups_local;
	f->EL = w->n_experts_local;
	f->EB = w->expert_begin;
	f->VL = w->vocab_local;
	f->VB = w->vocab_begin;
	f->rank = w->rank;
	f->ws = w->world_size;
	if (f->ws > 1 && (!opt->comm || comm_n_ranks(opt->comm) != f->ws || comm_rank(opt->comm) != f->rank)) {
		free(f);
		return err_set(e, ST_INVALID, "forward: world size %d needs a communicator of that size with rank %d",
			       w->world_size, w->rank);
	}
	f->R = c->o_lora_rank;
	f->QL = c->q_lora_rank;
	f->I = c->moe_intermediate_size;
	f->E = c->n_routed_experts;
	f->K = c->num_experts_per_tok;
	f->NHI = c->index_n_heads;
	f->ID = c->index_head_dim;
	f->V = c->vocab_size;
	int64_t W = c->sliding_window;
	int64_t stride = W;
	for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
		const struct model_layer *ly = &w->layers[l];
		int64_t k = ly->kind == MODEL_ATTN_CSA ? c->index_topk
			    : ly->kind == MODEL_ATTN_HCA ? (int64_t)opt->max_context / ly->ratio + 1
							 : 0;
		if (W + k > stride)
			stride = W + k;
	}
	if (stride > (1 << 24)) {
		free(f);
		return err_set(e, ST_INVALID, "forward: index set of %lld rows per token", (long long)stride);
	}
	f->idx_stride = (int)stride;
	int64_t T = opt->max_tokens, S = opt->max_seqs, n = f->n, D = f->D;
	int64_t P = T * f->K, B = s->block_tokens;
	f->bt_stride = (int32_t)((opt->max_context + B - 1) / B + 1);
	int64_t max_segs = S + T / B + S; /* each sequence: ceil(len/B) + 1 at most */
	ALLOC(f->q_off, S + 1);
	ALLOC(f->start_pos, S);
	ALLOC(f->bt, S * f->bt_stride);
	ALLOC(f->ring_row0, S);
	ALLOC(f->entry_blk, S);
	ALLOC(f->segs, max_segs);
	ALLOC(f->seg_first, S + 1);
	ALLOC(f->x, T * n * D);
	ALLOC(f->x2, T * n * D);
	ALLOC(f->u, T * D);
	ALLOC(f->xn, T * D);
	ALLOC(f->fo, T * D);
	ALLOC(f->mix, T * (2 + n) * n);
	ALLOC(f->sqr, T);
	ALLOC(f->pre, T * n);
	ALLOC(f->post, T * n);
	ALLOC(f->comb, T * n * n);
	ALLOC(f->qr, T * f->QL);
	ALLOC(f->q, T * f->H * f->d);
	ALLOC(f->kv, T * f->d);
	ALLOC(f->o, T * f->H * f->d);
	ALLOC(f->z, T * f->G * f->R);
	ALLOC(f->kvp, T * 2 * f->d);
	ALLOC(f->gp, T * 2 * f->d);
	ALLOC(f->ikvp, T * 2 * f->ID);
	ALLOC(f->igp, T * 2 * f->ID);
	int64_t wave_w = 2 * (f->d > f->ID ? f->d : f->ID); /* widest compressor input row */
	ALLOC(f->wa, T * wave_w);
	ALLOC(f->wb, T * wave_w);
	ALLOC(f->qi, T * f->NHI * f->ID);
	ALLOC(f->hw, T * f->NHI);
	ALLOC(f->topk_work, opt->max_context / 4 + 1);
	ALLOC(f->topk, T * c->index_topk);
	ALLOC(f->idx, T * f->idx_stride);
	ALLOC(f->idx_len, T);
	ALLOC(f->glog, T * f->E);
	ALLOC(f->ew, P);
	ALLOC(f->rw, P);
	ALLOC(f->eids, P);
	ALLOC(f->offsets, f->EL + 1);
	if (f->ws > 1) {
		ALLOC(f->lg_local, T * f->VL);
		ALLOC(f->lg_all, T * f->V);
	}
	ALLOC(f->ptok, P);
	ALLOC(f->pslot, P);
	ALLOC(f->h1, P * f->I);
	ALLOC(f->h3, P * f->I);
	ALLOC(f->y2, P * D);
	ALLOC(f->sh1, T * f->I);
	ALLOC(f->sh3, T * f->I);
	ALLOC(f->shy, T * D);
	ALLOC(f->hh, T * n * D);
	ALLOC(f->m1, T * n * D);
	ALLOC(f->m2, T * n * D);
	ALLOC(f->w_q_off, S + 1);
	ALLOC(f->w_start, S);
	ALLOC(f->w_slot, S);
	ALLOC(f->w_bt, S * f->bt_stride);
	ALLOC(f->ent_pos, T);
	if (!opt->bf16_round) {
		int64_t mx = 0;
		for (int l = 0; l < s->n_layers; l++) {
			int64_t rows = (int64_t)s->ls[l].per_block * s->n_blocks;
			int64_t k = rows * (f->d > f->ID ? f->d : f->ID);
			if (k > mx)
				mx = k;
		}
		ALLOC(f->pooled, mx);
	}
	*out = f;
	return ST_OK;
nomem:
	model_fwd_destroy(f);
	return err_set(e, ST_NOMEM, "forward buffers for %u tokens", opt->max_tokens);
}

void model_fwd_destroy(struct model_fwd *f)
{
	if (!f)
		return;
	void *ps[] = {f->q_off, f->start_pos, f->bt, f->ring_row0, f->entry_blk, f->segs, f->seg_first, f->x, f->x2,
		      f->u, f->xn, f->fo, f->mix, f->sqr, f->pre, f->post, f->comb, f->qr, f->q, f->kv, f->o, f->z,
		      f->kvp, f->gp, f->ikvp, f->igp, f->wa, f->wb, f->qi, f->hw, f->topk_work, f->topk, f->idx,
		      f->idx_len, f->glog, f->ew, f->rw, f->eids, f->offsets, f->ptok, f->pslot, f->h1, f->h3, f->y2,
		      f->sh1, f->sh3, f->shy, f->hh, f->m1, f->m2, f->w_q_off, f->w_start, f->w_slot, f->w_bt, f->pooled, f->ent_pos, f->lg_local, f->lg_all};
	for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
		free(ps[i]);
	free(f);
}

const float *model_fwd_streams(const struct model_fwd *f)
{
	return f->x_final;
}

/* ---- helpers ---- */

static void round_bf16(const struct model_fwd *f, float *x, int64_t n)
{
	if (!f->opt.bf16_round)
		return;
	for (int64_t i = 0; i < n; i++)
		x[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
}

/* Sum x[n] over the tensor-parallel ranks (no-op at world size 1). */
static enum status all_reduce(struct model_fwd *f, float *x, int64_t n, struct err *e)
{
	if (f->ws == 1)
		return ST_OK;
	return comm_all_reduce_sum(f->opt.comm, x, x, (size_t)n, COMM_DTYPE_F32, COMM_MEM_HOST, e);
}

#define OK(call)                                                                                   \
	do {                                                                                       \
		enum status st_ = (call);                                                          \
		if (st_)                                                                           \
			return err_set(e, st_, "layer %d: %s failed", layer, #call);               \
	} while (0)

/* y[T, out] = x[T, in]·Wᵀ through the layer plan's variant; round: the
 * reference keeps this output in bf16. */
static enum status lin(const struct model_fwd *f, const struct model_lin *l, const float *x, int64_t ldx, int64_t T,
		       float *y, int64_t ldy, bool round, int layer, struct err *e)
{
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = KERN_DT_F32, .ldx = ldx, .y = y,
				     .y_dtype = KERN_DT_F32, .ldy = ldy, .w = &l->w,
				     .act_quant_block = l->act_quant_block};
	OK(l->run(&a));
	if (round && f->opt.bf16_round) {
		int64_t ly = ldy ? ldy : l->w.rows;
		for (int64_t t = 0; t < T; t++)
			round_bf16(f, y + t * ly, l->w.rows);
	}
	return ST_OK;
}

static enum status norm(const struct model_fwd *f, const struct model_layer *ly, float *x, float *y, int64_t rows,
			int dim, const uint16_t *w, bool round, int layer, struct err *e)
{
	struct kern_rmsnorm_args a = {.x = x, .y = y, .w_bf16 = w, .n_rows = rows, .dim = dim,
				      .eps = (float)f->cfg->rms_norm_eps, .bf16_out = round && f->opt.bf16_round};
	OK(ly->ops.rmsnorm(&a));
	return ST_OK;
}

/* ---- the batch ---- */

static enum status batch_prepare(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	uint32_t B = f->st->block_tokens;
	if (step->n_tokens > f->opt.max_tokens || step->n_seqs > f->opt.max_seqs)
		return err_set(e, ST_INVALID, "step of %u tokens / %u sequences exceeds %u / %u", step->n_tokens,
			       step->n_seqs, f->opt.max_tokens, f->opt.max_seqs);
	f->T = step->n_tokens;
	f->S = (int)step->n_seqs;
	f->ids = step->token_ids;
	f->pos = step->positions;
	f->n_segs = 0;
	f->max_wave = 0;
	for (uint32_t i = 0; i < step->n_tokens; i++)
		if (step->token_ids[i] < 0 || step->token_ids[i] >= f->V)
			return err_set(e, ST_INVALID, "token id %d outside the vocabulary", step->token_ids[i]);
	for (int s = 0; s < f->S; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t i0 = step->query_start[s], i1 = step->query_start[s + 1];
		if (i1 < i0 || i1 > step->n_tokens || (s == 0 && i0 != 0) ||
		    (s == f->S - 1 && i1 != step->n_tokens))
			return err_set(e, ST_INVALID, "sequence %d: query range [%u, %u)", s, i0, i1);
		uint32_t p = sq->n_cached_tokens;
		if (sq->n_context_tokens != p + (i1 - i0) || sq->n_context_tokens > f->opt.max_context ||
		    (uint64_t)sq->n_blocks * B < sq->n_context_tokens || sq->n_blocks > (uint32_t)f->bt_stride ||
		    sq->block_table_start + sq->n_blocks > step->n_block_ids)
			return err_set(e, ST_INVALID, "sequence %d: %u cached + %u tokens, %u blocks of %u", s, p, i1 - i0,
				       sq->n_blocks, B);
		for (uint32_t i = i0; i < i1; i++)
			if (step->positions[i] != (int32_t)(p + (i - i0)))
				return err_set(e, ST_INVALID, "sequence %d: token %u at position %d, expected %u", s, i,
					       step->positions[i], p + (i - i0));
		f->q_off[s] = (int32_t)i0;
		f->start_pos[s] = (int32_t)p;
		for (int32_t k = 0; k < f->bt_stride; k++) {
			int32_t b = -1;
			if ((uint32_t)k < sq->n_blocks) {
				uint32_t id = step->block_ids[sq->block_table_start + k];
				if (id >= f->st->n_blocks)
					return err_set(e, ST_INVALID, "sequence %d: block id %u of %u", s, id, f->st->n_blocks);
				b = (int32_t)id;
			}
			f->bt[s * f->bt_stride + k] = b;
		}
		f->entry_blk[s] = p ? f->bt[s * f->bt_stride + (p - 1) / B] : f->bt[s * f->bt_stride];
		/* segments at block boundaries */
		f->seg_first[s] = f->n_segs;
		uint32_t i = i0;
		while (i < i1) {
			uint32_t pos = p + (i - i0);
			uint32_t k = pos / B;
			uint32_t end = (k + 1) * B - p + i0;
			if (end > i1)
				end = i1;
			struct seg *g = &f->segs[f->n_segs++];
			g->s = s;
			g->i0 = i;
			g->i1 = end;
			g->pos0 = (int32_t)pos;
			g->blk = f->bt[s * f->bt_stride + k];
			g->prev_blk = pos % B == 0 && pos > 0 ? f->bt[s * f->bt_stride + k - 1] : -1;
			i = end;
		}
		int nw = f->n_segs - f->seg_first[s];
		if (nw > f->max_wave)
			f->max_wave = nw;
	}
	f->q_off[f->S] = (int32_t)step->n_tokens;
	f->seg_first[f->S] = f->n_segs;
	return ST_OK;
}

/* ---- mHC ---- */

/* (pre, post, comb) of site hc for streams x, and u = Σ pre_j x_j. */
static enum status hc_pre(struct model_fwd *f, const struct model_layer *ly, const struct model_hc *hc,
			  const float *x, float *u, int layer, struct err *e)
{
	int n = (int)f->n, k = (int)(f->n * f->D);
	struct kern_hc_prenorm_args pa = {.x = x, .fn = hc->fn, .mix = f->mix, .sqr_sum = f->sqr, .n_tokens = f->T,
					  .k = k, .n_out = (2 + n) * n};
	OK(ly->ops.hc_prenorm(&pa));
	struct kern_hc_split_args sa = {.mix = f->mix, .sqr_sum = f->sqr, .n_tokens = f->T, .n_streams = n, .k = k,
					.norm_eps = (float)f->cfg->rms_norm_eps, .scale = hc->scale, .base = hc->base,
					.sinkhorn_iters = (int)f->cfg->hc_sinkhorn_iters,
					.hc_eps = (float)f->cfg->hc_eps, .pre = f->pre, .post = f->post, .comb = f->comb};
	OK(ly->ops.hc_split(&sa));
	struct kern_hc_pre_combine_args ca = {.x = x, .pre = f->pre, .u = u, .n_tokens = f->T, .n_streams = n,
					      .dim = (int)f->D, .bf16_out = f->opt.bf16_round};
	OK(ly->ops.hc_pre_combine(&ca));
	return ST_OK;
}

static enum status hc_post(struct model_fwd *f, const struct model_layer *ly, const float *fo, const float *x,
			   float *x_out, int layer, struct err *e)
{
	struct kern_hc_post_args a = {.f = fo, .x = x, .post = f->post, .comb = f->comb, .x_out = x_out,
				      .n_tokens = f->T, .n_streams = (int)f->n, .dim = (int)f->D,
				      .bf16_out = f->opt.bf16_round};
	OK(ly->ops.hc_post(&a));
	return ST_OK;
}

/* ---- compressors ---- */

/* FP32 mode: the compressor op rounds its entries to bf16 around the norm
 * and rope, as the reference does; transformers in float32 does not. Redo
 * the norm and rope of the entries wave j emitted from their pooled
 * (pre-norm) values in fp32, with the same ops. */
static enum status cmp_fp32_post(struct model_fwd *f, const struct model_layer *ly, int l, int j, float *out,
				 int dim, const uint16_t *norm_w, struct err *e)
{
	int layer = l;
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio;
	for (int s = 0; s < f->S; s++) {
		int gi = f->seg_first[s] + j;
		if (gi >= f->seg_first[s + 1])
			continue;
		const struct seg *g = &f->segs[gi];
		int64_t w0 = g->pos0 / m, nw = kern_compressor_n_emitted(g->pos0, g->i1 - g->i0, m);
		for (int64_t w = w0; w < w0 + nw; w++) {
			int64_t row = (int64_t)f->bt[s * f->bt_stride + w / q->per_block] * q->per_block + w % q->per_block;
			float *o = out + row * dim;
			memcpy(o, f->pooled + row * dim, (size_t)dim * sizeof(float));
			struct kern_rmsnorm_args na = {.x = o, .y = o, .w_bf16 = norm_w, .n_rows = 1, .dim = dim,
						       .eps = (float)f->cfg->rms_norm_eps};
			OK(ly->ops.rmsnorm(&na));
			int32_t wp = (int32_t)w;
			struct kern_rope_args ra = {.x = o, .pos = &wp, .omega = ly->omega, .n_rows = 1, .n_heads = 1,
						    .head_dim = dim, .rope_dim = (int)f->r, .pos_mul = m};
			OK(ly->ops.rope(&ra));
		}
	}
	return ST_OK;
}

static enum status compress_waves(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e)
{
	int layer = l;
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio, d = (int)f->d, id = (int)f->ID, r = (int)f->r;
	int c = q->overlap ? 2 : 1;
	for (int j = 0; j < f->max_wave; j++) {
		int ns = 0;
		uint32_t nt = 0;
		f->w_q_off[0] = 0;
		for (int s = 0; s < f->S; s++) {
			int gi = f->seg_first[s] + j;
			if (gi >= f->seg_first[s + 1])
				continue;
			const struct seg *g = &f->segs[gi];
			if (g->pos0 == 0)
				model_state_block_init(f->st, l, (uint32_t)g->blk);
			else if (g->prev_blk >= 0)
				model_state_copy_cmp(f->st, l, (uint32_t)g->blk, (uint32_t)g->prev_blk);
			uint32_t len = g->i1 - g->i0;
			memcpy(f->wa + (size_t)nt * c * d, f->kvp + (size_t)g->i0 * c * d, (size_t)len * c * d * 4);
			memcpy(f->wb + (size_t)nt * c * d, f->gp + (size_t)g->i0 * c * d, (size_t)len * c * d * 4);
			f->w_start[ns] = g->pos0;
			f->w_slot[ns] = g->blk;
			memcpy(f->w_bt + (size_t)ns * f->bt_stride, f->bt + (size_t)s * f->bt_stride,
			       (size_t)f->bt_stride * sizeof(int32_t));
			nt += len;
			f->w_q_off[++ns] = (int32_t)nt;
		}
		if (!ns)
			continue;
		struct kern_compressor_args a = {
			.kv_proj = f->wa, .gate_proj = f->wb, .ape = ly->cmp_ape, .n_tokens = nt, .n_seqs = ns,
			.q_off = f->w_q_off, .start_pos = f->w_start, .kv_state = q->cmp_kv, .score_state = q->cmp_score,
			.state_slot = f->w_slot, .n_state_slots = f->st->n_blocks, .ratio = m, .overlap = q->overlap,
			.head_dim = d, .rope_dim = r, .norm_w = ly->cmp_norm, .norm_eps = (float)f->cfg->rms_norm_eps,
			.omega = ly->omega, .post = f->opt.quant_sim ? KERN_CMP_POST_FP8_NOPE : KERN_CMP_POST_NONE,
			.out = q->cmp,
			.out_paged = {.block_table = f->w_bt, .bt_stride = f->bt_stride, .per_block = q->per_block},
			.n_out_rows = (int64_t)f->st->n_blocks * q->per_block, .pooled = f->pooled};
		OK(ly->ops.compressor(&a));
		enum status st;
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->cmp, d, ly->cmp_norm, e)))
			return st;
		if (!q->indexer)
			continue;
		/* the indexer's private compressor, same segments */
		nt = 0;
		for (int s = 0; s < f->S; s++) {
			int gi = f->seg_first[s] + j;
			if (gi >= f->seg_first[s + 1])
				continue;
			const struct seg *g = &f->segs[gi];
			uint32_t len = g->i1 - g->i0;
			memcpy(f->wa + (size_t)nt * 2 * id, f->ikvp + (size_t)g->i0 * 2 * id, (size_t)len * 2 * id * 4);
			memcpy(f->wb + (size_t)nt * 2 * id, f->igp + (size_t)g->i0 * 2 * id, (size_t)len * 2 * id * 4);
			nt += len;
		}
		a.ape = ly->idx_cmp_ape;
		a.kv_state = q->icmp_kv;
		a.score_state = q->icmp_score;
		a.head_dim = id;
		a.norm_w = ly->idx_cmp_norm;
		a.post = f->opt.quant_sim ? KERN_CMP_POST_HADAMARD_FP4 : KERN_CMP_POST_NONE;
		a.out = q->ikeys;
		OK(ly->ops.compressor(&a));
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->ikeys, id, ly->idx_cmp_norm, e)))
			return st;
	}
	return ST_OK;
}

/* ---- attention ---- */

static enum status attention(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
			     struct err *e)
{
	int layer = l;
	struct model_layer_state *q = &f->st->ls[l];
	int64_t T = f->T, H = f->H, d = f->d, r = f->r, W = f->cfg->sliding_window;
	enum status st;
	/* q path */
	if ((st = lin(f, &ly->wq_a, xn, 0, T, f->qr, 0, true, l, e)))
		return st;
	if ((st = norm(f, ly, f->qr, f->qr, T, (int)f->QL, ly->q_norm, true, l, e)))
		return st;
	if ((st = lin(f, &ly->wq_b, f->qr, 0, T, f->q, 0, true, l, e)))
		return st;
	if ((st = norm(f, ly, f->q, f->q, T * H, (int)d, NULL, true, l, e)))
		return st;
	struct kern_rope_args ra = {.x = f->q, .pos = f->pos, .omega = ly->omega, .n_rows = T, .n_heads = (int)H,
				    .head_dim = (int)d, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round};
	OK(ly->ops.rope(&ra));
	/* shared K = V */
	if ((st = lin(f, &ly->wkv, xn, 0, T, f->kv, 0, true, l, e)))
		return st;
	if ((st = norm(f, ly, f->kv, f->kv, T, (int)d, ly->kv_norm, true, l, e)))
		return st;
	ra.x = f->kv;
	ra.n_heads = 1;
	OK(ly->ops.rope(&ra));
	if (f->opt.quant_sim)
		kern_act_quant_fp8_sim(f->kv, T, d - r, d, 64);

	/* compressed rows of this step (they may serve this step's own queries) */
	if (ly->ratio) {
		int c = q->overlap ? 2 : 1;
		(void)c;
		if ((st = lin(f, &ly->cmp_wkv, xn, 0, T, f->kvp, 0, false, l, e)) ||
		    (st = lin(f, &ly->cmp_wgate, xn, 0, T, f->gp, 0, false, l, e)))
			return st;
		if (q->indexer && ((st = lin(f, &ly->idx_cmp_wkv, xn, 0, T, f->ikvp, 0, false, l, e)) ||
				   (st = lin(f, &ly->idx_cmp_wgate, xn, 0, T, f->igp, 0, false, l, e))))
			return st;
		if ((st = compress_waves(f, ly, l, e)))
			return st;
	}
	struct kern_rowmap_paged paged = {.block_table = f->bt, .bt_stride = f->bt_stride, .per_block = q->per_block};
	if (q->indexer) {
		int NHI = (int)f->NHI, ID = (int)f->ID;
		if ((st = lin(f, &ly->idx_wq_b, f->qr, 0, T, f->qi, 0, true, l, e)))
			return st;
		struct kern_rope_args ia = {.x = f->qi, .pos = f->pos, .omega = ly->omega, .n_rows = T, .n_heads = NHI,
					    .head_dim = ID, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round};
		OK(ly->ops.rope(&ia));
		if (f->opt.quant_sim) {
			struct kern_indexer_rotate_args qa = {.x = f->qi, .n_rows = T * NHI, .dim = ID, .fp4_block = 32};
			OK(ly->ops.indexer_rotate(&qa));
		}
		if ((st = lin(f, &ly->idx_wproj, xn, 0, T, f->hw, 0, false, l, e)))
			return st;
		struct kern_indexer_topk_args ta = {
			.q = f->qi, .head_w = f->hw, .weight_scale = (float)(1.0 / sqrt((double)ID * NHI)),
			.keys = q->ikeys, .n_key_rows = (int64_t)f->st->n_blocks * q->per_block, .n_tokens = T,
			.n_seqs = f->S, .q_off = f->q_off, .start_pos = f->start_pos, .key_paged = paged,
			.ratio = ly->ratio, .n_heads = NHI, .head_dim = ID, .top_k = (int)f->cfg->index_topk,
			.topk = f->topk, .work = f->topk_work, .work_len = f->opt.max_context / 4 + 1};
		OK(ly->ops.indexer_topk(&ta));
	}

	/* index sets over [compressed pool | fresh kv | rings] (compressed rows
	 * first: their paged rows carry no base offset) */
	int64_t cmp_rows = ly->ratio ? (int64_t)f->st->n_blocks * q->per_block : 0;
	int64_t ring_rows = (int64_t)f->st->n_blocks * W;
	for (int s = 0; s < f->S; s++)
		f->ring_row0[s] = cmp_rows + T + (int64_t)f->entry_blk[s] * W;
	struct kern_attn_index_args xa = {
		.n_tokens = T, .n_seqs = f->S, .q_off = f->q_off, .start_pos = f->start_pos, .window = (int)W,
		.cur_row0 = cmp_rows, .ring_row0 = f->ring_row0, .ratio = ly->ratio,
		.cmp_paged = ly->ratio ? paged : (struct kern_rowmap_paged){0},
		.topk = q->indexer ? f->topk : NULL, .topk_stride = (int)f->cfg->index_topk, .idx = f->idx,
		.idx_len = f->idx_len, .idx_stride = f->idx_stride};
	int64_t zero_row0[1] = {0};
	(void)zero_row0;
	OK(ly->ops.attn_index(&xa));
	struct kern_sparse_attn_args aa = {.q = f->q, .out = f->o, .kv_stride = d, .idx = f->idx,
					   .idx_len = f->idx_len, .idx_stride = f->idx_stride, .sink = ly->attn_sink,
					   .softmax_scale = (float)(1.0 / sqrt((double)d)), .pos = f->pos,
					   .omega = ly->omega, .rope_dim = (int)r, .n_tokens = T, .n_heads = (int)H,
					   .head_dim = (int)d, .bf16_out = f->opt.bf16_round};
	int ns = 0;
	if (ly->ratio) {
		aa.kv[ns] = q->cmp;
		aa.kv_rows[ns++] = cmp_rows;
	}
	aa.kv[ns] = f->kv;
	aa.kv_rows[ns++] = T;
	aa.kv[ns] = q->ring;
	aa.kv_rows[ns++] = ring_rows;
	OK(ly->ops.sparse_attn(&aa));

	/* grouped low-rank output projection */
	int64_t hpg = H / f->G;
	for (int64_t g = 0; g < f->G; g++)
		if ((st = lin(f, &ly->wo_a[g], f->o + g * hpg * d, H * d, T, f->z + g * f->R, f->G * f->R, true, l, e)))
			return st;
	if ((st = lin(f, &ly->wo_b, f->z, 0, T, out, 0, false, l, e)) || (st = all_reduce(f, out, T * f->D, e)))
		return st;
	round_bf16(f, out, T * f->D);

	/* the ring, segment by segment (rule 2 for the ring part of the state) */
	uint32_t B = f->st->block_tokens;
	(void)B;
	for (int gi = 0; gi < f->n_segs; gi++) {
		const struct seg *g = &f->segs[gi];
		if (g->prev_blk >= 0)
			model_state_copy_ring(f->st, l, (uint32_t)g->blk, (uint32_t)g->prev_blk);
		uint32_t len = g->i1 - g->i0, skip = len > (uint32_t)W ? len - (uint32_t)W : 0;
		float *ring = q->ring + (size_t)g->blk * W * d;
		for (uint32_t i = g->i0 + skip; i < g->i1; i++) {
			int64_t p = g->pos0 + (i - g->i0);
			memcpy(ring + (p % W) * d, f->kv + (size_t)i * d, (size_t)d * 4);
		}
	}
	return ST_OK;
}

/* ---- MoE ---- */

static enum status moe(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
		       struct err *e)
{
	int layer = l;
	int64_t T = f->T, D = f->D, I = f->I, E = f->E, K = f->K, EL = f->EL;
	enum status st;
	if ((st = lin(f, &ly->gate, xn, 0, T, f->glog, 0, false, l, e)))
		return st;
	struct kern_route_args ra = {.logits = f->glog, .bias = ly->hash ? NULL : ly->gate_bias,
				     .tid2eid = ly->hash ? ly->tid2eid : NULL, .token_ids = f->ids, .vocab = f->V,
				     .n_tokens = T, .n_experts = (int)E, .top_k = (int)K,
				     .route_scale = (float)f->cfg->routed_scaling_factor, .expert_ids = f->eids,
				     .weights = f->ew};
	OK(ly->ops.route(&ra));
	struct kern_moe_group_args ga = {.expert_ids = f->eids, .n_tokens = T, .top_k = (int)K,
					 .expert_begin = (int)f->EB, .n_local = (int)EL, .offsets = f->offsets, .pair_token = f->ptok,
					 .pair_slot = f->pslot};
	OK(ly->ops.moe_group(&ga));
	int64_t P = f->offsets[EL];
	for (int64_t p = 0; p < P; p++)
		f->rw[p] = f->ew[f->ptok[p] * K + f->pslot[p]];
	const struct model_experts *x = &ly->experts;
	struct kern_moe_gemm_args ma = {.n_rows = P, .n_experts = EL, .expert_offsets = f->offsets, .row_src = f->ptok,
					.n_x_rows = T, .x = xn, .x_dtype = KERN_DT_F32, .y = f->h1,
					.y_dtype = KERN_DT_F32, .w = x->w1, .act_quant_block = x->act_quant_block};
	OK(x->run13(&ma));
	ma.y = f->h3;
	ma.w = x->w3;
	OK(x->run13(&ma));
	round_bf16(f, f->h1, P * I);
	round_bf16(f, f->h3, P * I);
	float limit = (float)f->cfg->swiglu_limit;
	struct kern_swiglu_args sa = {.gate = f->h1, .up = f->h3, .out = f->h1, .row_weight = f->rw, .n_rows = P,
				      .dim = (int)I, .limit = limit, .bf16_out = f->opt.bf16_round};
	OK(ly->ops.swiglu(&sa));
	struct kern_moe_gemm_args m2 = {.n_rows = P, .n_experts = EL, .expert_offsets = f->offsets, .n_x_rows = P,
					.x = f->h1, .x_dtype = KERN_DT_F32, .y = f->y2, .y_dtype = KERN_DT_F32,
					.w = x->w2, .act_quant_block = x->act_quant_block};
	OK(x->run2(&m2));
	round_bf16(f, f->y2, P * D);
	memset(out, 0, (size_t)(T * D) * sizeof(float));
	for (int64_t p = 0; p < P; p++) {
		float *o = out + (int64_t)f->ptok[p] * D;
		const float *y = f->y2 + p * D;
		for (int64_t i = 0; i < D; i++)
			o[i] += y[i];
	}
	/* shared expert (same clamp, weight 1); under TP each rank holds a slice
	 * of its intermediate dim and the all-reduce sums the partial outputs */
	int64_t IL = ly->sh_w1.w.rows;
	if ((st = lin(f, &ly->sh_w1, xn, 0, T, f->sh1, 0, true, l, e)) ||
	    (st = lin(f, &ly->sh_w3, xn, 0, T, f->sh3, 0, true, l, e)))
		return st;
	struct kern_swiglu_args ss = {.gate = f->sh1, .up = f->sh3, .out = f->sh1, .n_rows = T, .dim = (int)IL,
				      .limit = limit, .bf16_out = f->opt.bf16_round};
	OK(ly->ops.swiglu(&ss));
	if ((st = lin(f, &ly->sh_w2, f->sh1, 0, T, f->shy, 0, f->ws == 1, l, e)))
		return st;
	for (int64_t i = 0; i < T * D; i++)
		out[i] += f->shy[i];
	if ((st = all_reduce(f, out, T * D, e)))
		return st;
	round_bf16(f, out, T * D);
	return ST_OK;
}

/* ---- one block ---- */

static enum status block(struct model_fwd *f, int l, struct err *e)
{
	const struct model_layer *ly = &f->w->layers[l];
	int64_t T = f->T, D = f->D;
	enum status st;
	if ((st = hc_pre(f, ly, &ly->hc_attn, f->x, f->u, l, e)) ||
	    (st = norm(f, ly, f->u, f->xn, T, (int)D, ly->attn_norm, true, l, e)) ||
	    (st = attention(f, ly, l, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	float *t = f->x;
	f->x = f->x2;
	f->x2 = t;
	if ((st = hc_pre(f, ly, &ly->hc_ffn, f->x, f->u, l, e)) ||
	    (st = norm(f, ly, f->u, f->xn, T, (int)D, ly->ffn_norm, true, l, e)) ||
	    (st = moe(f, ly, l, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	t = f->x;
	f->x = f->x2;
	f->x2 = t;
	return ST_OK;
}

/* The embedding rows of ids, copied n_copies times per token (the mHC
 * streams). Vocab-parallel: a rank holds rows [VB, VB+VL) and contributes
 * zeros for other ids; the sum over ranks is exact (one nonzero term). */
static enum status embed(struct model_fwd *f, const int32_t *ids, float *out, int64_t n_copies, struct err *e)
{
	int64_t D = f->D;
	float *tmp = f->ws > 1 ? f->u : NULL;
	for (uint32_t t = 0; t < f->T; t++) {
		float *o = tmp ? tmp + (int64_t)t * D : out + (int64_t)t * n_copies * D;
		int64_t id = ids[t];
		if (id < f->VB || id >= f->VB + f->VL) {
			memset(o, 0, (size_t)D * sizeof(float));
			continue;
		}
		const uint16_t *row = f->w->embed + id * D;
		for (int64_t i = 0; i < D; i++)
			o[i] = kern_bf16_to_f32(row[i]);
	}
	if (tmp) {
		enum status st = all_reduce(f, tmp, f->T * D, e);
		if (st)
			return st;
		for (uint32_t t = 0; t < f->T; t++)
			memmove(out + (int64_t)t * n_copies * D, tmp + (int64_t)t * D, (size_t)D * sizeof(float));
	}
	for (uint32_t t = 0; t < f->T; t++) {
		float *o = out + (int64_t)t * n_copies * D;
		for (int64_t j = 1; j < n_copies; j++)
			memcpy(o + j * D, o, (size_t)D * sizeof(float));
	}
	return ST_OK;
}

enum status model_fwd_run(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	enum status st = batch_prepare(f, step, e);
	if (st)
		return st;
	f->x_final = NULL;
	if ((st = embed(f, f->ids, f->x, f->n, e)))
		return st;
	for (int l = 0; l < f->w->n_layers; l++)
		if ((st = block(f, l, e)))
			return st;
	f->x_final = f->x;
	return ST_OK;
}

static enum status head(struct model_fwd *f, const struct model_layer *ly0, const struct model_hc *hc,
			const uint16_t *norm_w, const float *streams, const uint32_t *rows, uint32_t n_rows,
			float *logits, struct err *e)
{
	int layer = -1;
	int n = (int)f->n, k = (int)(f->n * f->D);
	int64_t D = f->D;
	if (n_rows > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "head: %u rows > %u", n_rows, f->opt.max_tokens);
	for (uint32_t i = 0; i < n_rows; i++)
		memcpy(f->hh + (size_t)i * k, streams + (size_t)rows[i] * k, (size_t)k * sizeof(float));
	struct kern_hc_prenorm_args pa = {.x = f->hh, .fn = hc->fn, .mix = f->mix, .sqr_sum = f->sqr,
					  .n_tokens = n_rows, .k = k, .n_out = n};
	OK(ly0->ops.hc_prenorm(&pa));
	struct kern_hc_split_args sa = {.mix = f->mix, .sqr_sum = f->sqr, .n_tokens = n_rows, .n_streams = n, .k = k,
					.norm_eps = (float)f->cfg->rms_norm_eps, .scale = hc->scale, .base = hc->base,
					.sinkhorn_iters = (int)f->cfg->hc_sinkhorn_iters,
					.hc_eps = (float)f->cfg->hc_eps, .head = true, .pre = f->pre};
	OK(ly0->ops.hc_split(&sa));
	struct kern_hc_pre_combine_args ca = {.x = f->hh, .pre = f->pre, .u = f->u, .n_tokens = n_rows,
					      .n_streams = n, .dim = (int)D, .bf16_out = f->opt.bf16_round};
	OK(ly0->ops.hc_pre_combine(&ca));
	enum status st = norm(f, ly0, f->u, f->u, n_rows, (int)D, norm_w, true, -1, e);
	if (st)
		return st;
	if (f->ws == 1)
		return lin(f, &f->w->head, f->u, 0, n_rows, logits, 0, false, -1, e);
	/* vocab-parallel: this rank's rows, gathered from all ranks, then laid
	 * out as [n_rows, vocab] */
	if ((st = lin(f, &f->w->head, f->u, 0, n_rows, f->lg_local, 0, false, -1, e)) ||
	    (st = comm_all_gather(f->opt.comm, f->lg_local, f->lg_all, (size_t)n_rows * f->VL, COMM_DTYPE_F32,
				  COMM_MEM_HOST, e)))
		return st;
	for (int rk = 0; rk < f->ws; rk++)
		for (uint32_t i = 0; i < n_rows; i++)
			memcpy(logits + (size_t)i * f->V + (size_t)rk * f->VL,
			       f->lg_all + ((size_t)rk * n_rows + i) * f->VL, (size_t)f->VL * sizeof(float));
	return ST_OK;
}

enum status model_fwd_logits(struct model_fwd *f, const float *streams, const uint32_t *rows, uint32_t n_rows,
			     float *logits, struct err *e)
{
	return head(f, &f->w->layers[0], &f->w->hc_head, f->w->norm, streams, rows, n_rows, logits, e);
}

enum status model_fwd_mtp(struct model_fwd *f, const struct exec_step *step, const float *streams, float *logits,
			  struct err *e)
{
	if (!f->w->n_mtp)
		return err_set(e, ST_UNSUPPORTED, "the MTP layer is not loaded");
	int l = f->w->n_layers, layer = l;
	const struct model_layer *ly = &f->w->layers[l];
	enum status st = batch_prepare(f, step, e);
	if (st)
		return st;
	int64_t T = f->T, D = f->D, n = f->n;
	/* streams may be f->x (the main pass's result): copy them out of the way first */
	memcpy(f->m2, streams, (size_t)(T * n * D) * sizeof(float));
	if ((st = embed(f, f->ids, f->fo, 1, e)))
		return st;
	memcpy(f->u, f->fo, (size_t)(T * D) * sizeof(float));
	if ((st = norm(f, ly, f->u, f->u, T, (int)D, ly->enorm, true, l, e)) ||
	    (st = lin(f, &ly->e_proj, f->u, 0, T, f->fo, 0, true, l, e)) ||
	    (st = norm(f, ly, f->m2, f->m1, T * n, (int)D, ly->hnorm, true, l, e)) ||
	    (st = lin(f, &ly->h_proj, f->m1, 0, T * n, f->m2, 0, true, l, e)))
		return st;
	(void)layer;
	for (int64_t t = 0; t < T; t++)
		for (int64_t j = 0; j < n; j++)
			for (int64_t i = 0; i < D; i++)
				f->x[(t * n + j) * D + i] = f->fo[t * D + i] + f->m2[(t * n + j) * D + i];
	round_bf16(f, f->x, T * n * D);
	if ((st = block(f, l, e)))
		return st;
	uint32_t *rows = (uint32_t *)f->ptok; /* T * K >= T entries */
	for (uint32_t i = 0; i < f->T; i++)
		rows[i] = i;
	return head(f, ly, &ly->mtp_hc_head, ly->mtp_norm, f->x, rows, f->T, logits, e);
}
