/*
 * model/forward_batch.c: a step's planning on the host. It checks the step
 * against the forward's capacities, cuts each sequence's chunk into segments
 * at block boundaries and the segments into waves (block rule 2,
 * model/forward_internal.h), and writes every index array the ops read into
 * the metadata arena, uploaded once.
 */
#include <string.h>

#include "model/forward_internal.h"

/* Check the step, cut it into segments and waves, and write every index
 * array the ops read into the metadata arena; one upload. */
enum status fwd__batch_prepare(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	uint32_t B = f->st->block_tokens;
	int64_t W = f->cfg->sliding_window;
	if (step->n_tokens > f->opt.max_tokens || step->n_seqs > f->opt.max_seqs)
		return err_set(e, ST_INVALID, "step of %u tokens / %u sequences exceeds %u / %u", step->n_tokens,
			       step->n_seqs, f->opt.max_tokens, f->opt.max_seqs);
	enum status st0 = fwd__meta_reset(f, e);
	if (st0)
		return st0;
	f->T = step->n_tokens;
	f->S = (int)step->n_seqs;
	f->n_segs = 0;
	f->max_wave = 0;
	for (uint32_t i = 0; i < step->n_tokens; i++)
		if (step->token_ids[i] < 0 || step->token_ids[i] >= f->V)
			return err_set(e, ST_INVALID, "token id %d outside the vocabulary", step->token_ids[i]);
	TAKE(f, f->ids, f->T);
	TAKE(f, f->pos, f->T);
	TAKE(f, f->q_off, f->S + 1);
	TAKE(f, f->start_pos, f->S);
	TAKE(f, f->bt, (int64_t)f->S * f->bt_stride);
	memcpy(f->ids, step->token_ids, (size_t)f->T * sizeof(int32_t));
	memcpy(f->pos, step->positions, (size_t)f->T * sizeof(int32_t));
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
		int32_t *bt = f->bt_h + (size_t)s * f->bt_stride;
		for (int32_t k = 0; k < f->bt_stride; k++) {
			int32_t b = -1;
			if ((uint32_t)k < sq->n_blocks) {
				uint32_t id = step->block_ids[sq->block_table_start + k];
				if (id >= f->st->n_blocks)
					return err_set(e, ST_INVALID, "sequence %d: block id %u of %u", s, id, f->st->n_blocks);
				b = (int32_t)id;
			}
			bt[k] = b;
		}
		f->entry_blk[s] = p ? bt[(p - 1) / B] : bt[0];
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
			g->blk = bt[k];
			g->prev_blk = pos % B == 0 && pos > 0 ? bt[k - 1] : -1;
			i = end;
		}
		int nw = f->n_segs - f->seg_first[s];
		if (nw > f->max_wave)
			f->max_wave = nw;
	}
	f->q_off[f->S] = (int32_t)step->n_tokens;
	f->seg_first[f->S] = f->n_segs;
	memcpy(f->bt, f->bt_h, (size_t)f->S * f->bt_stride * sizeof(int32_t));
	/* per kind of layer: the index-space row of each sequence's ring slot 0
	 * (attention's index sets run over [compressed pool | fresh kv | rings]) */
	for (int k = 0; k < f->n_kinds; k++) {
		TAKE(f, f->ring_row0[k], f->S);
		for (int s = 0; s < f->S; s++)
			f->ring_row0[k][s] = f->kind_rows[k] + (int64_t)f->T + (int64_t)f->entry_blk[s] * W;
	}
	/* the waves */
	for (int j = 0; j < f->max_wave; j++) {
		struct wave *wv = &f->waves[j];
		memset(wv, 0, sizeof *wv);
		int ns = 0;
		for (int s = 0; s < f->S; s++)
			ns += fwd__wave_seg(f, s, j) != NULL;
		wv->ns = ns;
		TAKE(f, wv->q_off, ns + 1);
		TAKE(f, wv->start, ns);
		TAKE(f, wv->slot, ns);
		TAKE(f, wv->bt, (int64_t)ns * f->bt_stride);
		TAKE(f, wv->ring_row0, ns);
		TAKE(f, wv->init_ids, ns);
		TAKE(f, wv->cp_dst, ns);
		TAKE(f, wv->cp_src, ns);
		uint32_t nt = 0;
		int k = 0;
		wv->q_off[0] = 0;
		for (int s = 0; s < f->S; s++) {
			const struct seg *g = fwd__wave_seg(f, s, j);
			if (!g)
				continue;
			if (g->pos0 == 0)
				wv->init_ids[wv->n_init++] = g->blk;
			else if (g->prev_blk >= 0) {
				wv->cp_dst[wv->n_cp] = g->blk;
				wv->cp_src[wv->n_cp++] = g->prev_blk;
			}
			wv->start[k] = g->pos0;
			wv->slot[k] = g->blk;
			wv->ring_row0[k] = (int64_t)g->blk * W;
			memcpy(wv->bt + (size_t)k * f->bt_stride, f->bt_h + (size_t)s * f->bt_stride,
			       (size_t)f->bt_stride * sizeof(int32_t));
			nt += g->i1 - g->i0;
			wv->q_off[++k] = (int32_t)nt;
		}
		wv->nt = nt;
		if (f->max_wave > 1) {
			TAKE(f, wv->gather, nt);
			uint32_t t = 0;
			for (int s = 0; s < f->S; s++) {
				const struct seg *g = fwd__wave_seg(f, s, j);
				if (!g)
					continue;
				for (uint32_t i = g->i0; i < g->i1; i++)
					wv->gather[t++] = (int32_t)i;
			}
		}
	}
	return fwd__meta_flush(f, e);
}
