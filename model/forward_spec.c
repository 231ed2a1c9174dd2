/*
 * model/forward_spec.c: verify rollback for speculative decoding
 * (model/forward.h, docs/speculation.md): what a step can write is saved
 * before it, and after it each sequence keeps a prefix of its tokens as if
 * only those had run.
 */
#include <stdlib.h>

#include "model/forward_internal.h"

/* ---- speculative decoding: verify rollback (docs/speculation.md) ----
 *
 * model_fwd_spec_save copies, for every covered sequence, everything a step
 * can write for it in layers [lb, le): the state areas of the block-table
 * entries from the one holding its token before the step to the one holding
 * its last token (ring, open compressor windows of the main and the
 * indexer compressor) and the compressed rows and indexer keys of every
 * window its tokens touch. With stash, the next model_fwd_run also keeps,
 * per layer, each covered token's state inputs: its KV row (after rope and
 * the FP8 simulation) and its compressor projections. model_fwd_spec_commit
 * restores the saved bytes and replays the state writes of the kept prefix
 * (rule 2 copies, the compressor op, the ring write) from those inputs: the
 * same ops on the same values as a step that only ever held the kept tokens. */

struct fwd_spec {
	float *save;                /* saved bytes, in f->mem */
	size_t save_cap, save_used; /* floats */
	const struct exec_step *step; /* the step the save covers (borrowed for the commit) */
	uint32_t *n_q;              /* [max_seqs] covered query tokens of each sequence (0: none) */
	int lb, le;                 /* covered layers */
	/* the stash */
	bool armed;                 /* the next model_fwd_run keeps the covered rows */
	bool stashed;               /* and it did */
	uint32_t n_stash, stash_cap;
	int64_t stash_w;            /* floats per row: kv d | kvp 2d | gp 2d | ikvp 2ID | igp 2ID */
	float *stash;               /* [n_layers, stash_cap, stash_w] in f->mem */
	int32_t *rows_h, *rows_d;   /* [stash_cap] flat rows of the stashed tokens (host, f->mem) */
	int32_t *idx_h, *idx_d;     /* [stash_cap] replay: stash row of each replayed token */
	uint32_t *base;             /* [max_seqs] first stash row of each sequence */
	uint32_t *roll, *qs;        /* commit scratch: [max_seqs], [max_seqs + 1] */
	struct exec_seq *rs;        /* [max_seqs] */
	int32_t *ids, *pos;         /* [stash_cap] */
};

void fwd__spec_free(struct model_fwd *f)
{
	struct fwd_spec *p = f->spec;
	if (!p)
		return;
	kern_mem_free(&f->mem, p->save);
	kern_mem_free(&f->mem, p->stash);
	if (p->rows_d != p->rows_h)
		kern_mem_free(&f->mem, p->rows_d);
	if (p->idx_d != p->idx_h)
		kern_mem_free(&f->mem, p->idx_d);
	free(p->rows_h);
	free(p->idx_h);
	free(p->n_q);
	free(p->base);
	free(p->roll);
	free(p->qs);
	free(p->rs);
	free(p->ids);
	free(p->pos);
	free(p);
	f->spec = NULL;
}

enum status model_fwd_spec_enable(struct model_fwd *f, uint32_t max_stash_tokens, struct err *e)
{
	if (f->spec)
		return ST_OK;
	struct fwd_spec *p = calloc(1, sizeof *p);
	if (!p)
		return err_set(e, ST_NOMEM, "speculative decoding state");
	f->spec = p;
	uint32_t cap = max_stash_tokens ? max_stash_tokens : 1;
	if (cap > f->opt.max_tokens)
		cap = f->opt.max_tokens;
	p->stash_cap = cap;
	p->stash_w = 5 * f->d + 4 * f->ID;
	p->n_q = calloc(f->opt.max_seqs + 1, sizeof *p->n_q);
	p->base = calloc(f->opt.max_seqs + 1, sizeof *p->base);
	p->rows_h = calloc(cap, sizeof *p->rows_h);
	p->idx_h = calloc(cap, sizeof *p->idx_h);
	p->roll = calloc(f->opt.max_seqs + 1, sizeof *p->roll);
	p->qs = calloc(f->opt.max_seqs + 1, sizeof *p->qs);
	p->rs = calloc(f->opt.max_seqs + 1, sizeof *p->rs);
	p->ids = calloc(cap, sizeof *p->ids);
	p->pos = calloc(cap, sizeof *p->pos);
	enum status st = ST_OK;
	if (!p->n_q || !p->base || !p->rows_h || !p->idx_h || !p->roll || !p->qs || !p->rs || !p->ids || !p->pos)
		st = err_set(e, ST_NOMEM, "speculative decoding state");
	if (!st)
		st = fwd__mem_alloc(f, &p->stash, (size_t)f->w->n_layers * cap * (size_t)p->stash_w * sizeof(float), e);
	if (!st && f->mem.device) {
		if (!(st = fwd__mem_alloc(f, &p->rows_d, cap * sizeof(int32_t), e)))
			st = fwd__mem_alloc(f, &p->idx_d, cap * sizeof(int32_t), e);
	} else {
		p->rows_d = p->rows_h;
		p->idx_d = p->idx_h;
	}
	if (st)
		fwd__spec_free(f);
	return st;
}

/* The block id of table entry k of sequence s of step, or -1. */
static int64_t spec_blk(const struct exec_step *step, uint32_t s, uint32_t k)
{
	const struct exec_seq *sq = &step->seqs[s];
	return k < sq->n_blocks ? (int64_t)step->block_ids[sq->block_table_start + k] : -1;
}

/* Walk what a step can write for the covered sequences in the covered
 * layers, copying it to (save) or from (restore) p->save in one fixed order;
 * count only (dry) to size the buffer. */
static enum status spec_walk(struct model_fwd *f, int mode /* 0 dry, 1 save, 2 restore */, const uint32_t *only,
			     struct err *e)
{
	struct fwd_spec *p = f->spec;
	const struct exec_step *step = p->step;
	struct model_state *S = f->st;
	uint32_t B = S->block_tokens;
	int64_t W = f->cfg->sliding_window, d = f->d, id = f->ID;
	size_t at = 0;
	enum status st = ST_OK;
#define SPEC_COPY(ptr, nfl)                                                                              \
	do {                                                                                             \
		size_t n_ = (size_t)(nfl);                                                               \
		if (mode == 1)                                                                           \
			st = kern_mem_copy(&f->mem, p->save + at, (ptr), n_ * sizeof(float), e);         \
		else if (mode == 2 && (!only || only[s]))                                                \
			st = kern_mem_copy(&f->mem, (ptr), p->save + at, n_ * sizeof(float), e);         \
		if (st)                                                                                  \
			return st;                                                                       \
		at += n_;                                                                                \
	} while (0)
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		if (!p->n_q[s])
			continue;
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t p0 = sq->n_context_tokens - p->n_q[s], p1 = sq->n_context_tokens - 1;
		uint32_t e_lo = p0 ? (p0 - 1) / B : 0, e_hi = p1 / B;
		for (int l = p->lb; l < p->le; l++) {
			struct model_layer_state *q = &S->ls[l];
			for (uint32_t k = e_lo; k <= e_hi; k++) {
				int64_t b = spec_blk(step, s, k);
				if (b < 0)
					return err_set(e, ST_INVALID, "speculation: sequence %u has no block at entry %u", s, k);
				SPEC_COPY(q->ring + b * W * d, W * d);
				if (!q->ratio)
					continue;
				SPEC_COPY(q->cmp_kv + b * q->cmp_state_floats, q->cmp_state_floats);
				SPEC_COPY(q->cmp_score + b * q->cmp_state_floats, q->cmp_state_floats);
				if (q->indexer) {
					SPEC_COPY(q->icmp_kv + b * q->icmp_state_floats, q->icmp_state_floats);
					SPEC_COPY(q->icmp_score + b * q->icmp_state_floats, q->icmp_state_floats);
				}
			}
			if (!q->ratio)
				continue;
			for (uint32_t w = p0 / (uint32_t)q->ratio; w <= p1 / (uint32_t)q->ratio; w++) {
				int64_t b = spec_blk(step, s, w / (uint32_t)q->per_block);
				if (b < 0)
					continue;
				int64_t row = b * q->per_block + w % (uint32_t)q->per_block;
				SPEC_COPY(q->cmp + row * d, d);
				if (q->indexer)
					SPEC_COPY(q->ikeys + row * id, id);
			}
		}
	}
#undef SPEC_COPY
	p->save_used = at;
	return ST_OK;
}

enum status model_fwd_spec_save(struct model_fwd *f, const struct exec_step *step, const uint32_t *n_q,
				int layer_begin, int layer_end, bool stash, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p)
		return err_set(e, ST_INVALID, "speculation: model_fwd_spec_enable was not called");
	if (step->n_seqs > f->opt.max_seqs || layer_begin < 0 || layer_end > f->st->n_layers || layer_begin > layer_end)
		return err_set(e, ST_INVALID, "speculation: %u sequences, layers [%d, %d)", step->n_seqs, layer_begin,
			       layer_end);
	if (stash && layer_end > f->w->n_layers)
		return err_set(e, ST_INVALID, "speculation: the stash covers main layers only");
	p->step = step;
	p->lb = layer_begin;
	p->le = layer_end;
	p->armed = p->stashed = false;
	p->n_stash = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t nq = step->query_start[s + 1] - step->query_start[s];
		p->n_q[s] = n_q ? n_q[s] : 0;
		if (p->n_q[s] > nq || p->n_q[s] > step->seqs[s].n_context_tokens)
			return err_set(e, ST_INVALID, "speculation: sequence %u covers %u of its %u tokens", s, p->n_q[s], nq);
		p->base[s] = p->n_stash;
		if (stash && p->n_q[s]) {
			if (p->n_stash + p->n_q[s] > p->stash_cap)
				return err_set(e, ST_INVALID, "speculation: more than %u tokens to keep", p->stash_cap);
			for (uint32_t i = 0; i < p->n_q[s]; i++)
				p->rows_h[p->n_stash++] = (int32_t)(step->query_start[s + 1] - p->n_q[s] + i);
		}
	}
	enum status st = spec_walk(f, 0, NULL, e);
	if (st)
		return st;
	if (p->save_used > p->save_cap) {
		kern_mem_free(&f->mem, p->save);
		p->save = NULL;
		p->save_cap = 0;
		if ((st = fwd__mem_alloc(f, &p->save, p->save_used * sizeof(float), e)))
			return st;
		p->save_cap = p->save_used;
	}
	if ((st = spec_walk(f, 1, NULL, e)))
		return st;
	if (stash && p->n_stash) {
		if (p->rows_d != p->rows_h &&
		    (st = kern_mem_upload(&f->mem, p->rows_d, p->rows_h, p->n_stash * sizeof(int32_t), e)))
			return st;
		p->armed = true;
	}
	return ST_OK;
}

/* Between layer l's state inputs in the forward's buffers (kv, the
 * compressor projections) and its stash rows [kv d | kvp 2d | gp 2d |
 * ikvp 2ID | igp 2ID]: to_stash, the buffers' rows idx[0..n) into stash
 * rows 0..n; else stash rows idx[0..n) into the buffers' rows 0..n. */
static enum status spec_stash_move(struct model_fwd *f, const struct model_layer *ly, int l, bool to_stash,
				   const int32_t *idx, uint32_t n, struct err *e)
{
	struct fwd_spec *p = f->spec;
	int64_t d = f->d, id = f->ID, w = p->stash_w;
	int64_t cd = ly->ratio ? ly->cmp_wkv.w.rows : 0, ci = ly->ratio ? ly->idx_cmp_wkv.w.rows : 0;
	struct {
		float *buf;
		int64_t col, width;
	} in[] = {{f->kv, 0, d}, {f->kvp, d, cd}, {f->gp, 3 * d, cd}, {f->ikvp, 5 * d, ci}, {f->igp, 5 * d + 2 * id, ci}};
	int n_in = !ly->ratio ? 1 : f->st->ls[l].indexer ? 5 : 3;
	float *stash = p->stash + (size_t)l * p->stash_cap * (size_t)w;
	for (int i = 0; i < n_in; i++) {
		int64_t c = in[i].width;
		enum status st = to_stash ? fwd__copy_rows(f, stash + in[i].col, w, NULL, in[i].buf, c, idx, n, c, e)
					  : fwd__copy_rows(f, in[i].buf, c, NULL, stash + in[i].col, w, idx, n, c, e);
		if (st)
			return st;
	}
	return ST_OK;
}

/* The hook in fwd__attention(): layer l's state inputs of the stashed rows. */
enum status fwd__spec_stash(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p->armed || l < p->lb || l >= p->le)
		return ST_OK;
	if (p->step->n_tokens != f->T)
		return err_set(e, ST_INVALID, "speculation: the stash was armed for another step");
	enum status st = spec_stash_move(f, ly, l, true, p->rows_d, p->n_stash, e);
	if (!st && l == p->le - 1) {
		p->armed = false;
		p->stashed = true;
	}
	return st;
}

enum status model_fwd_spec_commit(struct model_fwd *f, const uint32_t *n_keep, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p || !p->step)
		return err_set(e, ST_INVALID, "speculation: commit without a save");
	const struct exec_step *step = p->step;
	p->armed = false;
	/* which sequences roll back: those that keep less than they covered */
	uint32_t *roll = p->roll;
	uint32_t n_roll = 0, n_replay = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t k = n_keep ? n_keep[s] : 0;
		if (k > p->n_q[s])
			return err_set(e, ST_INVALID, "speculation: sequence %u keeps %u of %u tokens", s, k, p->n_q[s]);
		roll[s] = p->n_q[s] && k < p->n_q[s];
		n_roll += roll[s];
		n_replay += roll[s] && k;
	}
	enum status st = ST_OK;
	if (n_roll && (st = spec_walk(f, 2, roll, e)))
		return st;
	p->step = NULL;
	if (!n_replay)
		return ST_OK;
	if (!p->stashed)
		return err_set(e, ST_INVALID, "speculation: a partial keep needs the stash of the step");
	p->stashed = false;
	/* the replay step: the kept prefix of every rolled-back sequence */
	uint32_t ns = 0, nt = 0, *qs = p->qs;
	struct exec_seq *rs = p->rs;
	int32_t *ids = p->ids, *pos = p->pos;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t k = n_keep ? n_keep[s] : 0;
		if (!roll[s] || !k)
			continue;
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t i0 = step->query_start[s + 1] - p->n_q[s];
		rs[ns] = *sq;
		rs[ns].n_cached_tokens = sq->n_context_tokens - p->n_q[s];
		rs[ns].n_context_tokens = rs[ns].n_cached_tokens + k;
		rs[ns].sample = false;
		rs[ns].prompt_lp = NULL;
		qs[ns++] = nt;
		for (uint32_t i = 0; i < k; i++) {
			ids[nt] = step->token_ids[i0 + i];
			pos[nt] = step->positions[i0 + i];
			p->idx_h[nt++] = (int32_t)(p->base[s] + i);
		}
	}
	qs[ns] = nt;
	struct exec_step r = {.n_tokens = nt, .token_ids = ids, .positions = pos, .n_seqs = ns, .seqs = rs,
			      .query_start = qs, .block_ids = step->block_ids, .n_block_ids = step->n_block_ids};
	if ((st = fwd__batch_prepare(f, &r, e)))
		return st;
	if (p->idx_d != p->idx_h && (st = kern_mem_upload(&f->mem, p->idx_d, p->idx_h, nt * sizeof(int32_t), e)))
		return st;
	for (int l = p->lb; l < p->le; l++) {
		const struct model_layer *ly = &f->w->layers[l];
		if ((st = spec_stash_move(f, ly, l, false, p->idx_d, nt, e)))
			return st;
		if (ly->ratio && (st = fwd__compress_waves(f, ly, l, e)))
			return st;
		if ((st = fwd__ring_waves(f, l, e)))
			return st;
	}
	return kern_mem_sync(&f->mem, e);
}
