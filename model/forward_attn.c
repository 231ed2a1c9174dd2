/*
 * model/forward_attn.c: a layer's attention (dsv4.md §3): the q and shared
 * KV paths, the compressors and the indexer over the step's waves, the
 * index sets over [compressed pool | fresh kv | rings], sparse attention,
 * the grouped output projection, and the ring writes after it; block rule 2
 * for the compressor and ring state (model/forward_internal.h).
 */
#include <math.h>

#include "model/forward_internal.h"

/* ---- block state (rule 2) ---- */

/* Copy (cp) or initialise (init) the regions of the blocks of wave wv in one
 * state array of layer l: region_floats per block, value for init. */
static enum status state_regions(struct model_fwd *f, const struct wave *wv, float *pool, int64_t region_floats,
				 bool init, float value, struct err *e)
{
	if (init && wv->n_init) {
		struct kern_block_fill_args a = {.pool = pool, .region_stride = region_floats,
						 .region_len = region_floats, .ids = DEV(f, wv->init_ids),
						 .n = wv->n_init, .value = value, .stream = f->mem.stream};
		OK(-1, f->g->block_fill(&a));
	}
	if (!init && wv->n_cp) {
		struct kern_block_copy_args a = {.pool = pool, .region_stride = region_floats,
						 .region_len = region_floats, .dst_ids = DEV(f, wv->cp_dst),
						 .src_ids = DEV(f, wv->cp_src), .n = wv->n_cp, .stream = f->mem.stream};
		OK(-1, f->g->block_copy(&a));
	}
	return ST_OK;
}

/* Rule 2 for one compressor's state (its kv and score regions, floats per
 * block) before wave wv runs: a block at position 0 starts at kv 0 and
 * score -inf, a block that starts a table entry copies the previous one. */
static enum status cmp_state_pair(struct model_fwd *f, const struct wave *wv, float *kv, float *score,
				  int64_t floats, struct err *e)
{
	enum status st;
	if ((st = state_regions(f, wv, kv, floats, true, 0.0f, e)) ||
	    (st = state_regions(f, wv, score, floats, true, -INFINITY, e)) ||
	    (st = state_regions(f, wv, kv, floats, false, 0, e)) ||
	    (st = state_regions(f, wv, score, floats, false, 0, e)))
		return st;
	return ST_OK;
}

/* Rule 2 for the compressor state of layer l before wave wv runs. */
static enum status compressor_state(struct model_fwd *f, const struct model_layer_state *q, const struct wave *wv,
				    struct err *e)
{
	enum status st = cmp_state_pair(f, wv, q->cmp_kv, q->cmp_score, q->cmp_state_floats, e);
	if (st || !q->indexer)
		return st;
	return cmp_state_pair(f, wv, q->icmp_kv, q->icmp_score, q->icmp_state_floats, e);
}

/* ---- compressors ---- */

/* FP32 mode: the compressor op rounds its entries to bf16 around the norm
 * and rope, as the reference does; transformers in float32 does not. Redo
 * the norm and rope of the entries wave j emitted from their pooled
 * (pre-norm) values in fp32, with the same ops: gather the pooled rows, norm
 * and rope them, scatter them back over the entries. */
static enum status cmp_fp32_post(struct model_fwd *f, const struct model_layer *ly, int l, int j, float *out,
				 int dim, const uint16_t *norm_w, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio;
	int64_t n = 0;
	for (int s = 0; s < f->S; s++) {
		const struct seg *g = fwd__wave_seg(f, s, j);
		if (g)
			n += kern_compressor_n_emitted(g->pos0, g->i1 - g->i0, m);
	}
	if (!n)
		return ST_OK;
	int32_t *rows, *wpos;
	TAKE(f, rows, n);
	TAKE(f, wpos, n);
	int64_t k = 0;
	for (int s = 0; s < f->S; s++) {
		const struct seg *g = fwd__wave_seg(f, s, j);
		if (!g)
			continue;
		int64_t w0 = g->pos0 / m, nw = kern_compressor_n_emitted(g->pos0, g->i1 - g->i0, m);
		for (int64_t w = w0; w < w0 + nw; w++, k++) {
			rows[k] = (int32_t)((int64_t)f->bt_h[s * f->bt_stride + w / q->per_block] * q->per_block +
					    w % q->per_block);
			wpos[k] = (int32_t)w;
		}
	}
	enum status st = fwd__meta_flush(f, e);
	if (st)
		return st;
	float *tmp = f->wa; /* free until the indexer's gathers */
	if ((st = fwd__copy_rows(f, tmp, dim, NULL, f->pooled, dim, DEV(f, rows), n, dim, e)))
		return st;
	struct kern_rmsnorm_args na = {.x = tmp, .y = tmp, .w_bf16 = norm_w, .n_rows = n, .dim = dim,
				       .eps = (float)f->cfg->rms_norm_eps, .stream = f->mem.stream};
	OK(l, ly->ops.rmsnorm(&na));
	struct kern_rope_args ra = {.x = tmp, .pos = DEV(f, wpos), .omega = ly->omega, .n_rows = n, .n_heads = 1,
				    .head_dim = dim, .rope_dim = (int)f->r, .pos_mul = m, .stream = f->mem.stream};
	OK(l, ly->ops.rope(&ra));
	return fwd__copy_rows(f, out, dim, DEV(f, rows), tmp, dim, NULL, n, dim, e);
}

enum status fwd__compress_waves(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio, d = (int)f->d, id = (int)f->ID, r = (int)f->r;
	int c = q->overlap ? 2 : 1;
	enum status st;
	for (int j = 0; j < f->max_wave; j++) {
		const struct wave *wv = &f->waves[j];
		if (!wv->ns)
			continue;
		if ((st = compressor_state(f, q, wv, e)))
			return st;
		const float *kv = f->kvp, *gate = f->gp;
		if (wv->gather) {
			if ((st = fwd__copy_rows(f, f->wa, 0, NULL, f->kvp, 0, DEV(f, wv->gather), wv->nt, c * d, e)) ||
			    (st = fwd__copy_rows(f, f->wb, 0, NULL, f->gp, 0, DEV(f, wv->gather), wv->nt, c * d, e)))
				return st;
			kv = f->wa;
			gate = f->wb;
		}
		struct kern_compressor_args a = {
			.kv_proj = kv, .gate_proj = gate, .ape = ly->cmp_ape, .n_tokens = wv->nt, .n_seqs = wv->ns,
			.q_off = DEV(f, wv->q_off), .start_pos = DEV(f, wv->start), .kv_state = q->cmp_kv,
			.score_state = q->cmp_score, .state_slot = DEV(f, wv->slot), .n_state_slots = f->st->n_blocks,
			.ratio = m, .overlap = q->overlap, .head_dim = d, .rope_dim = r, .norm_w = ly->cmp_norm,
			.norm_eps = (float)f->cfg->rms_norm_eps, .omega = ly->omega,
			.post = f->opt.quant_sim ? KERN_CMP_POST_FP8_NOPE : KERN_CMP_POST_NONE, .out = q->cmp,
			.out_paged = {.block_table = DEV(f, wv->bt), .bt_stride = f->bt_stride, .per_block = q->per_block},
			.n_out_rows = (int64_t)f->st->n_blocks * q->per_block, .pooled = f->pooled,
			.stream = f->mem.stream};
		OK(l, ly->ops.compressor(&a));
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->cmp, d, ly->cmp_norm, e)))
			return st;
		if (!q->indexer)
			continue;
		/* the indexer's private compressor, same segments */
		kv = f->ikvp;
		gate = f->igp;
		if (wv->gather) {
			if ((st = fwd__copy_rows(f, f->wa, 0, NULL, f->ikvp, 0, DEV(f, wv->gather), wv->nt, 2 * id, e)) ||
			    (st = fwd__copy_rows(f, f->wb, 0, NULL, f->igp, 0, DEV(f, wv->gather), wv->nt, 2 * id, e)))
				return st;
			kv = f->wa;
			gate = f->wb;
		}
		a.kv_proj = kv;
		a.gate_proj = gate;
		a.ape = ly->idx_cmp_ape;
		a.kv_state = q->icmp_kv;
		a.score_state = q->icmp_score;
		a.head_dim = id;
		a.norm_w = ly->idx_cmp_norm;
		a.post = f->opt.quant_sim ? KERN_CMP_POST_HADAMARD_FP4 : KERN_CMP_POST_NONE;
		a.out = q->ikeys;
		OK(l, ly->ops.compressor(&a));
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->ikeys, id, ly->idx_cmp_norm, e)))
			return st;
	}
	return ST_OK;
}

/* ---- attention ---- */

static int kind_of(const struct model_fwd *f, int64_t cmp_rows)
{
	for (int k = 0; k < f->n_kinds; k++)
		if (f->kind_rows[k] == cmp_rows)
			return k;
	return -1;
}

/* After attention: this step's raw KV rows into the rings, wave by wave
 * (rule 2 for the ring part of the state). */
enum status fwd__ring_waves(struct model_fwd *f, int l, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int64_t W = f->cfg->sliding_window, d = f->d;
	enum status st;
	for (int j = 0; j < f->max_wave; j++) {
		const struct wave *wv = &f->waves[j];
		if (!wv->ns)
			continue;
		if ((st = state_regions(f, wv, q->ring, W * d, false, 0, e)))
			return st;
		const float *src = f->kv;
		if (wv->gather) {
			if ((st = fwd__copy_rows(f, f->wa, 0, NULL, f->kv, 0, DEV(f, wv->gather), wv->nt, d, e)))
				return st;
			src = f->wa;
		}
		struct kern_ring_write_args a = {.src = src, .ring = q->ring, .ring_row0 = DEV(f, wv->ring_row0),
						 .n_ring_rows = (int64_t)f->st->n_blocks * W, .n_tokens = wv->nt,
						 .n_seqs = wv->ns, .q_off = DEV(f, wv->q_off), .start_pos = DEV(f, wv->start),
						 .window = (int)W, .dim = (int)d, .stream = f->mem.stream};
		OK(l, f->g->ring_write(&a));
	}
	return ST_OK;
}

/* ---- the q, KV and output paths (the main layers' and DSpark's) ---- */

/* The queries of the step's tokens at positions pos into f->q:
 * rope(norm(wq_b(q_norm(wq_a(xn))))) per head; f->qr keeps the low-rank q
 * the indexer reads. */
enum status fwd__attn_q(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn,
			const int32_t *pos, struct err *e)
{
	int64_t T = f->T, H = f->H, d = f->d;
	enum status st;
	if ((st = fwd__lin(f, &ly->wq_a, xn, 0, T, f->qr, 0, true, l, e)))
		return st;
	if ((st = fwd__norm(f, ly, f->qr, f->qr, T, (int)f->QL, ly->q_norm, true, l, e)))
		return st;
	if ((st = fwd__lin(f, &ly->wq_b, f->qr, 0, T, f->q, 0, true, l, e)))
		return st;
	fwd__trace(f, "q", l, f->q, T * H * d);
	if ((st = fwd__norm(f, ly, f->q, f->q, T * H, (int)d, NULL, true, l, e)))
		return st;
	struct kern_rope_args ra = {.x = f->q, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = (int)H,
				    .head_dim = (int)d, .rope_dim = (int)f->r, .bf16_out = f->opt.bf16_round,
				    .stream = f->mem.stream};
	OK(l, ly->ops.rope(&ra));
	return ST_OK;
}

/* The shared K = V row of T rows x at positions pos into kv [T, head_dim]:
 * kv_norm(wkv(x)), rope, and with quant_sim the FP8 simulation of the
 * non-rope part. */
enum status fwd__attn_kv(struct model_fwd *f, const struct model_layer *ly, int l, const float *x,
			 const int32_t *pos, int64_t T, float *kv, struct err *e)
{
	int64_t d = f->d, r = f->r;
	enum status st;
	if ((st = fwd__lin(f, &ly->wkv, x, 0, T, kv, 0, true, l, e)) ||
	    (st = fwd__norm(f, ly, kv, kv, T, (int)d, ly->kv_norm, true, l, e)))
		return st;
	struct kern_rope_args ra = {.x = kv, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = 1,
				    .head_dim = (int)d, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round,
				    .stream = f->mem.stream};
	OK(l, ly->ops.rope(&ra));
	fwd__trace(f, "kv", l, kv, T * d);
	if (f->opt.quant_sim) {
		struct kern_act_quant_sim_args qa = {.x = kv, .n_rows = T, .n_cols = d - r, .ld = d, .block = 64,
						     .stream = f->mem.stream};
		OK(l, f->g->act_quant_sim(&qa));
	}
	return ST_OK;
}

/* The grouped low-rank output projection of the attention output f->o:
 * out = wo_b(wo_a_g(o_g) for each group g), before any all-reduce. */
enum status fwd__attn_out(struct model_fwd *f, const struct model_layer *ly, int l, float *out, struct err *e)
{
	int64_t T = f->T, H = f->H, d = f->d;
	enum status st;
	int64_t hpg = H / f->G;
	for (int64_t g = 0; g < f->G; g++)
		if ((st = fwd__lin(f, &ly->wo_a[g], f->o + g * hpg * d, H * d, T, f->z + g * f->R, f->G * f->R, false, l, e)))
			return st;
	if ((st = fwd__round_bf16(f, f->z, T * f->G * f->R, e)) ||
	    (st = fwd__lin(f, &ly->wo_b, f->z, 0, T, out, 0, false, l, e)))
		return st;
	return ST_OK;
}

enum status fwd__attention(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
			     struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int64_t T = f->T, H = f->H, d = f->d, r = f->r, W = f->cfg->sliding_window;
	void *sm = f->mem.stream;
	const int32_t *pos = DEV(f, f->pos);
	enum status st;
	/* q and the shared K = V row */
	if ((st = fwd__attn_q(f, ly, l, xn, pos, e)) || (st = fwd__attn_kv(f, ly, l, xn, pos, T, f->kv, e)))
		return st;

	/* compressed rows of this step (they may serve this step's own queries) */
	if (ly->ratio) {
		if ((st = fwd__lin(f, &ly->cmp_wkv, xn, 0, T, f->kvp, 0, false, l, e)) ||
		    (st = fwd__lin(f, &ly->cmp_wgate, xn, 0, T, f->gp, 0, false, l, e)))
			return st;
		if (q->indexer && ((st = fwd__lin(f, &ly->idx_cmp_wkv, xn, 0, T, f->ikvp, 0, false, l, e)) ||
				   (st = fwd__lin(f, &ly->idx_cmp_wgate, xn, 0, T, f->igp, 0, false, l, e))))
			return st;
		if ((st = fwd__compress_waves(f, ly, l, e)))
			return st;
		fwd__trace(f, "kvp", l, f->kvp, T * ly->cmp_wkv.w.rows);
	}
	struct kern_rowmap_paged paged = {.block_table = DEV(f, f->bt), .bt_stride = f->bt_stride,
					  .per_block = q->per_block};
	if (q->indexer) {
		int NHI = (int)f->NHI, ID = (int)f->ID;
		if ((st = fwd__lin(f, &ly->idx_wq_b, f->qr, 0, T, f->qi, 0, true, l, e)))
			return st;
		struct kern_rope_args ia = {.x = f->qi, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = NHI,
					    .head_dim = ID, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round,
					    .stream = sm};
		OK(l, ly->ops.rope(&ia));
		if (f->opt.quant_sim) {
			struct kern_indexer_rotate_args qa = {.x = f->qi, .n_rows = T * NHI, .dim = ID, .fp4_block = 32,
							      .stream = sm};
			OK(l, ly->ops.indexer_rotate(&qa));
		}
		if ((st = fwd__lin(f, &ly->idx_wproj, xn, 0, T, f->hw, 0, false, l, e)))
			return st;
		struct kern_indexer_topk_args ta = {
			.q = f->qi, .head_w = f->hw, .weight_scale = (float)(1.0 / sqrt((double)ID * NHI)),
			.keys = q->ikeys, .n_key_rows = (int64_t)f->st->n_blocks * q->per_block, .n_tokens = T,
			.n_seqs = f->S, .q_off = DEV(f, f->q_off), .start_pos = DEV(f, f->start_pos),
			.key_paged = paged, .ratio = ly->ratio, .n_heads = NHI, .head_dim = ID,
			.top_k = (int)f->cfg->index_topk, .topk = f->topk, .work = f->topk_work,
			.work_len = f->opt.max_context / 4 + 1, .stream = sm};
		OK(l, ly->ops.indexer_topk(&ta));
	}

	/* index sets over [compressed pool | fresh kv | rings] (compressed rows
	 * first: their paged rows carry no base offset) */
	int64_t cmp_rows = ly->ratio ? (int64_t)f->st->n_blocks * q->per_block : 0;
	int64_t ring_rows = (int64_t)f->st->n_blocks * W;
	int kind = kind_of(f, cmp_rows);
	if (kind < 0)
		return err_set(e, ST_INVALID, "layer %d: compressed pool of %lld rows was not planned", l,
			       (long long)cmp_rows);
	struct kern_attn_index_args xa = {
		.n_tokens = T, .n_seqs = f->S, .q_off = DEV(f, f->q_off), .start_pos = DEV(f, f->start_pos),
		.window = (int)W, .cur_row0 = cmp_rows, .ring_row0 = DEV(f, f->ring_row0[kind]), .ratio = ly->ratio,
		.cmp_paged = ly->ratio ? paged : (struct kern_rowmap_paged){0},
		.topk = q->indexer ? f->topk : NULL, .topk_stride = (int)f->cfg->index_topk, .idx = f->idx,
		.idx_len = f->idx_len, .idx_stride = f->idx_stride, .stream = sm};
	OK(l, ly->ops.attn_index(&xa));
	struct kern_sparse_attn_args aa = {.q = f->q, .out = f->o, .kv_stride = d, .idx = f->idx,
					   .idx_len = f->idx_len, .idx_stride = f->idx_stride, .sink = ly->attn_sink,
					   .softmax_scale = (float)(1.0 / sqrt((double)d)), .pos = pos,
					   .omega = ly->omega, .rope_dim = (int)r, .n_tokens = T, .n_heads = (int)H,
					   .head_dim = (int)d, .bf16_out = f->opt.bf16_round, .stream = sm, .ctx = f->opt.kctx};
	int ns = 0;
	if (ly->ratio) {
		aa.kv[ns] = q->cmp;
		aa.kv_rows[ns++] = cmp_rows;
	}
	aa.kv[ns] = f->kv;
	aa.kv_rows[ns++] = T;
	aa.kv[ns] = q->ring;
	aa.kv_rows[ns++] = ring_rows;
	OK(l, ly->ops.sparse_attn(&aa));
	fwd__trace(f, "attn_o", l, f->o, T * H * d);

	/* grouped low-rank output projection */
	if ((st = fwd__attn_out(f, ly, l, out, e)) || (st = fwd__all_reduce(f, out, T * f->D, e)) ||
	    (st = fwd__round_bf16(f, out, T * f->D, e)))
		return st;
	if (f->spec && (st = fwd__spec_stash(f, ly, l, e))) /* speculative decoding: keep the state inputs */
		return st;
	return fwd__ring_waves(f, l, e);
}
