/*
 * model/dspark.c: the DSpark drafter of the 0731 release (model/dspark.h;
 * dsv4-0731.md "DSpark forward"; docs/speculation.md), a struct spec_drafter.
 *
 * State per sequence: one ring of `sliding_window` context rows per stage
 * (row p % W holds position p), the drafter's own memory, not the block
 * pool. commit: for every committed position p (the target step's flat
 * rows), main_x = main_norm(main_proj(captures of the target layers)), and
 * each stage writes kv_norm(wkv(main_x)) with RoPE at p (and the FP8
 * simulation) into its ring. Only committed positions are ever written, so
 * a rejected draft leaves no trace by construction; propose writes nothing
 * to the rings. propose: the block [anchor, noise x (B-1)] at positions
 * P+1 .. P+B (P the last committed position, anchor the token after it)
 * through the stages (each query sees the ring's last W positions and all B
 * block rows) and the last stage's head, then the Markov head in order:
 * logits_i += w2 . w1[prev], d_i = argmax, prev = d_i.
 *
 * Prefix-cache hits: when committed positions complete a block (block
 * mode), the rings as they are then are kept with the block id; a sequence
 * whose first commit starts at a block boundary after a hit takes them from
 * the block before it, so its rings are those a run from position 0 would
 * hold. Without such a snapshot (slot mode, or a block it never saw
 * completed) the rings start afresh there; the verify rule keeps the output
 * exact regardless, the drafts only see less context.
 */
#include "model/dspark.h"

#include <stdlib.h>
#include <string.h>

#include "model/exec_cpu.h"
#include "model/forward.h"
#include "model/weights.h"

struct dsp_seq {
	uint64_t seq_id;
	bool used;
	uint32_t pos_begin, pos_end; /* positions held: [max(pos_begin, pos_end - W), pos_end) */
	float *ring;                 /* [n_stages, W, d] */
};

struct dsp_snap {
	uint32_t pos_begin, pos_end; /* the rings' positions when the block was completed */
	float *ring;                 /* [n_stages, W, d] or NULL */
};

struct dspark {
	struct model_exec_cpu *x;
	struct model_fwd *f;
	const struct model_weights *w;
	uint32_t K, B, BT, W, d, D, vocab, rank, n_stages, n_targets, max_tokens, max_seqs;
	int32_t noise;
	struct dsp_seq *seqs;
	uint32_t n_seqs_cap;
	struct dsp_snap *snaps;      /* [n_blocks]: the rings at the end of each completed block */
	uint32_t n_blocks;
	/* commit buffers */
	float *cap, *main_x, *kv;    /* [max_tokens, n_targets*D], [max_tokens, D], [max_tokens, d] */
	int32_t *pos;                /* [max_tokens] */
	uint32_t *rseq;              /* [max_tokens] index in seqs of each gathered row */
	/* propose buffers (a chunk of ch sequences) */
	uint32_t ch;
	int32_t *bids, *bpos;        /* [ch * B] */
	float *ctx[MODEL_MAX_DRAFT_LAYERS]; /* [ch * W, d] per stage */
	uint32_t *ctx_off;           /* [ch + 1] */
	float *logits;               /* [ch * B, vocab] */
	float *mk;                   /* [rank] */
	float *last;                 /* [max_seqs, K, vocab] the last propose's final logits (tests) */
	uint32_t n_last;
	bool *has_last;
};

static struct dsp_seq *dsp_find(struct dspark *m, uint64_t id, bool create)
{
	struct dsp_seq *free_slot = NULL;
	for (uint32_t i = 0; i < m->n_seqs_cap; i++) {
		if (m->seqs[i].used && m->seqs[i].seq_id == id)
			return &m->seqs[i];
		if (!m->seqs[i].used && !free_slot)
			free_slot = &m->seqs[i];
	}
	if (!create)
		return NULL;
	if (!free_slot) {
		uint32_t n = m->n_seqs_cap ? m->n_seqs_cap * 2 : 16;
		struct dsp_seq *s = realloc(m->seqs, n * sizeof *s);
		if (!s)
			return NULL;
		memset(s + m->n_seqs_cap, 0, (n - m->n_seqs_cap) * sizeof *s);
		free_slot = s + m->n_seqs_cap;
		m->seqs = s;
		m->n_seqs_cap = n;
	}
	if (!free_slot->ring) {
		free_slot->ring = calloc((size_t)m->n_stages * m->W * m->d, sizeof(float));
		if (!free_slot->ring)
			return NULL;
	}
	free_slot->used = true;
	free_slot->seq_id = id;
	free_slot->pos_begin = free_slot->pos_end = 0;
	return free_slot;
}

/* main_x and the stage rows of the nt gathered rows, into their rings */
static enum status dsp_flush(struct dspark *m, uint32_t nt, struct err *e)
{
	enum status st;
	if (!nt)
		return ST_OK;
	if ((st = model_fwd_dspark_main(m->f, m->cap, nt, m->main_x, e)))
		return st;
	for (uint32_t k = 0; k < m->n_stages; k++) {
		if ((st = model_fwd_dspark_kv(m->f, (int)k, m->main_x, m->pos, nt, m->kv, e)))
			return st;
		for (uint32_t r = 0; r < nt; r++) {
			float *ring = m->seqs[m->rseq[r]].ring + (size_t)k * m->W * m->d;
			memcpy(ring + (size_t)((uint32_t)m->pos[r] % m->W) * m->d, m->kv + (size_t)r * m->d,
			       m->d * sizeof(float));
		}
	}
	return ST_OK;
}

/* The rings of s at the end of a block go with the block (block mode), for
 * a sequence that starts on it after a prefix-cache hit. */
static enum status dsp_snap_save(struct dspark *m, const struct dsp_seq *s, uint32_t blk, struct err *e)
{
	if (blk >= m->n_blocks)
		return err_set(e, ST_INVALID, "DSpark drafter: block %u of %u", blk, m->n_blocks);
	struct dsp_snap *q = &m->snaps[blk];
	size_t n = (size_t)m->n_stages * m->W * m->d;
	if (!q->ring && !(q->ring = malloc(n * sizeof(float))))
		return err_set(e, ST_NOMEM, "DSpark drafter: block snapshot");
	memcpy(q->ring, s->ring, n * sizeof(float));
	q->pos_begin = s->pos_begin;
	q->pos_end = s->pos_end;
	return ST_OK;
}

static enum status dsp_commit(void *ctx, const struct spec_draft_batch *b, struct err *e)
{
	struct dspark *m = ctx;
	const float *cap = model_fwd_dspark_captures(m->f);
	size_t cw = (size_t)m->n_targets * m->D;
	enum status st;
	for (uint32_t i = 0; i < b->n_seqs; i++) {
		const struct spec_draft_seq *d = &b->seqs[i];
		if (!d->n_commit)
			continue;
		const struct exec_seq *sq = &b->step->seqs[d->seq_index];
		const uint32_t *bt = b->step->block_ids + sq->block_table_start;
		bool block_mode = sq->state_slot == EXEC_NO_SLOT;
		struct dsp_seq *s = dsp_find(m, d->seq_id, true);
		if (!s)
			return err_set(e, ST_NOMEM, "DSpark drafter: sequence state");
		if (s->pos_end != d->pos0) {
			/* new, after a prefix-cache hit, or a recompute: the rings of the
			 * block before pos0 when it carries them, else afresh at pos0 */
			s->pos_begin = s->pos_end = d->pos0;
			uint32_t k = d->pos0 / m->BT;
			const struct dsp_snap *q = block_mode && d->pos0 && d->pos0 % m->BT == 0 && k <= sq->n_blocks &&
							   bt[k - 1] < m->n_blocks
						   ? &m->snaps[bt[k - 1]]
						   : NULL;
			if (q && q->ring && q->pos_end == d->pos0) {
				memcpy(s->ring, q->ring, (size_t)m->n_stages * m->W * m->d * sizeof(float));
				s->pos_begin = q->pos_begin;
			}
		}
		uint32_t si = (uint32_t)(s - m->seqs);
		/* segments that end at block boundaries (the snapshot) or fill the buffers */
		for (uint32_t t = 0; t < d->n_commit;) {
			uint32_t p = d->pos0 + t, end = (p / m->BT + 1) * m->BT - d->pos0;
			if (end > d->n_commit)
				end = d->n_commit;
			if (end - t > m->max_tokens)
				end = t + m->max_tokens;
			uint32_t nt = end - t;
			memcpy(m->cap, cap + (size_t)(d->row0 + t) * cw, (size_t)nt * cw * sizeof(float));
			for (uint32_t r = 0; r < nt; r++) {
				m->pos[r] = (int32_t)(p + r);
				m->rseq[r] = si;
			}
			if ((st = dsp_flush(m, nt, e)))
				return st;
			s->pos_end = d->pos0 + end;
			if (block_mode && s->pos_end % m->BT == 0 && s->pos_end / m->BT <= sq->n_blocks &&
			    (st = dsp_snap_save(m, s, bt[s->pos_end / m->BT - 1], e)))
				return st;
			t = end;
		}
	}
	return ST_OK;
}

static int32_t argmax(const float *row, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t v = 1; v < n; v++)
		if (row[v] > row[best])
			best = v;
	return (int32_t)best;
}

static inline float bf16f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* logits += w2 . w1[prev] (the Markov head; bf16 weights, fp32 sums). */
static void markov(struct dspark *m, const struct model_layer *ly, int32_t prev, float *logits)
{
	const uint16_t *w1 = ly->markov_w1 + (size_t)prev * m->rank;
	for (uint32_t j = 0; j < m->rank; j++)
		m->mk[j] = bf16f(w1[j]);
	for (uint32_t v = 0; v < m->vocab; v++) {
		const uint16_t *w2 = ly->markov_w2 + (size_t)v * m->rank;
		float s = 0;
		for (uint32_t j = 0; j < m->rank; j++)
			s += bf16f(w2[j]) * m->mk[j];
		logits[v] += s;
	}
}

static enum status dsp_propose(void *ctx, struct spec_draft_batch *b, struct err *e)
{
	struct dspark *m = ctx;
	const struct model_layer *last = &m->w->layers[m->w->n_layers + m->w->n_mtp + m->n_stages - 1];
	uint32_t idx[64];
	uint32_t i = 0;
	if (b->n_seqs > m->max_seqs)
		return err_set(e, ST_INVALID, "DSpark drafter: %u sequences > %u", b->n_seqs, m->max_seqs);
	m->n_last = b->n_seqs;
	for (uint32_t j = 0; j < b->n_seqs; j++)
		m->has_last[j] = false;
	while (i < b->n_seqs) {
		uint32_t n = 0;
		m->ctx_off[0] = 0;
		for (; i < b->n_seqs && n < m->ch && n < 64; i++) {
			struct spec_draft_seq *d = &b->seqs[i];
			d->n_drafts = 0;
			if (!d->n_propose || !d->n_commit)
				continue;
			struct dsp_seq *s = dsp_find(m, d->seq_id, false);
			if (!s)
				return err_set(e, ST_INVALID, "DSpark drafter: sequence %llu has no committed state",
					       (unsigned long long)d->seq_id);
			uint32_t P = s->pos_end - 1;
			uint32_t c0 = s->pos_end - s->pos_begin > m->W ? s->pos_end - m->W : s->pos_begin;
			uint32_t nc = s->pos_end - c0;
			for (uint32_t k = 0; k < m->n_stages; k++)
				for (uint32_t p = c0; p < s->pos_end; p++)
					memcpy(m->ctx[k] + (size_t)(m->ctx_off[n] + p - c0) * m->d,
					       s->ring + ((size_t)k * m->W + p % m->W) * m->d, m->d * sizeof(float));
			m->ctx_off[n + 1] = m->ctx_off[n] + nc;
			for (uint32_t t = 0; t < m->B; t++) {
				m->bids[n * m->B + t] = t ? m->noise : d->next_ids[d->n_commit - 1];
				m->bpos[n * m->B + t] = (int32_t)(P + 1 + t);
			}
			idx[n++] = i;
		}
		if (!n)
			continue;
		const float *cx[MODEL_MAX_DRAFT_LAYERS];
		for (uint32_t k = 0; k < m->n_stages; k++)
			cx[k] = m->ctx[k];
		struct model_fwd_dspark_block blk = {.n_seqs = n, .block_tokens = m->B, .n_head = m->K, .ids = m->bids,
						     .pos = m->bpos,
						     .ctx_kv = cx, .ctx_off = m->ctx_off};
		enum status st = model_fwd_dspark_draft(m->f, &blk, m->logits, e);
		if (st)
			return st;
		for (uint32_t j = 0; j < n; j++) {
			struct spec_draft_seq *d = &b->seqs[idx[j]];
			uint32_t K = d->n_propose < m->K ? d->n_propose : m->K;
			int32_t prev = d->next_ids[d->n_commit - 1];
			for (uint32_t t = 0; t < K; t++) {
				float *lg = m->logits + ((size_t)j * m->K + t) * m->vocab;
				markov(m, last, prev, lg);
				prev = d->drafts[t] = argmax(lg, m->vocab);
				memcpy(m->last + ((size_t)idx[j] * m->K + t) * m->vocab, lg, m->vocab * sizeof(float));
			}
			d->n_drafts = K;
			m->has_last[idx[j]] = true;
		}
	}
	return ST_OK;
}

static void dsp_seq_release(void *ctx, uint64_t seq_id)
{
	struct dspark *m = ctx;
	struct dsp_seq *s = dsp_find(m, seq_id, false);
	if (s)
		s->used = false;
}

static void dsp_destroy(void *ctx)
{
	struct dspark *m = ctx;
	if (!m)
		return;
	for (uint32_t i = 0; i < m->n_seqs_cap; i++)
		free(m->seqs[i].ring);
	free(m->seqs);
	for (uint32_t i = 0; m->snaps && i < m->n_blocks; i++)
		free(m->snaps[i].ring);
	free(m->snaps);
	free(m->cap);
	free(m->main_x);
	free(m->kv);
	free(m->pos);
	free(m->rseq);
	free(m->bids);
	free(m->bpos);
	for (uint32_t k = 0; k < MODEL_MAX_DRAFT_LAYERS; k++)
		free(m->ctx[k]);
	free(m->ctx_off);
	free(m->logits);
	free(m->mk);
	free(m->last);
	free(m->has_last);
	free(m);
}

static const struct spec_drafter_ops dsp_ops = {.name = "dspark",
						.commit = dsp_commit,
						.propose = dsp_propose,
						.seq_release = dsp_seq_release,
						.destroy = dsp_destroy};

enum status spec_dspark_drafter_create(struct spec_drafter *out, struct model_exec_cpu *x, uint32_t max_draft,
				       struct err *e)
{
	memset(out, 0, sizeof *out);
	const struct model_weights *w = model_exec_cpu_weights(x);
	const struct model_config *cfg = w->cfg;
	if (!w->n_dspark)
		return err_set(e, ST_INVALID, "DSpark speculation: the executor was created without the DSpark stages "
					     "(load_mtp on a 0731 checkpoint, CPU executor)");
	if (!max_draft || max_draft > (uint32_t)cfg->dspark.block_size || max_draft > SPEC_MAX_DSPARK_TOKENS)
		return err_set(e, ST_INVALID, "DSpark speculation: %u draft tokens (1..%lld)", max_draft,
			       (long long)cfg->dspark.block_size);
	if (w->n_dspark > MODEL_MAX_DRAFT_LAYERS)
		return err_set(e, ST_UNSUPPORTED, "DSpark speculation: %d stages (at most %d)", w->n_dspark,
			       MODEL_MAX_DRAFT_LAYERS);
	struct model_fwd *f = model_exec_cpu_fwd(x);
	enum status st = model_fwd_dspark_enable(f, e);
	if (st)
		return st;
	const struct exec *ex = model_exec_cpu_exec(x);
	struct dspark *m = calloc(1, sizeof *m);
	if (!m)
		return err_set(e, ST_NOMEM, "DSpark drafter");
	m->x = x;
	m->f = f;
	m->w = w;
	m->K = max_draft;
	m->B = (uint32_t)cfg->dspark.block_size;
	m->BT = ex->info.block_tokens;
	m->W = (uint32_t)cfg->sliding_window;
	m->d = (uint32_t)cfg->head_dim;
	m->D = (uint32_t)cfg->hidden_size;
	m->vocab = ex->info.vocab_size;
	m->rank = (uint32_t)cfg->dspark.markov_rank;
	m->n_stages = (uint32_t)w->n_dspark;
	m->n_targets = (uint32_t)cfg->dspark.n_target_layers;
	m->noise = (int32_t)cfg->dspark.noise_token_id;
	m->max_tokens = ex->info.max_step_tokens;
	m->n_blocks = ex->info.n_blocks;
	m->snaps = calloc(m->n_blocks ? m->n_blocks : 1, sizeof *m->snaps);
	m->ch = m->max_tokens / m->B;
	if (m->ch > 16)
		m->ch = 16;
	if (!m->ch) {
		dsp_destroy(m);
		return err_set(e, ST_INVALID, "DSpark drafter: %u step tokens < block of %u", m->max_tokens, m->B);
	}
	size_t T = m->max_tokens, S = ex->info.max_step_seqs + 1;
	m->max_seqs = (uint32_t)S;
	m->cap = malloc(T * m->n_targets * m->D * sizeof(float));
	m->main_x = malloc(T * m->D * sizeof(float));
	m->kv = malloc(T * m->d * sizeof(float));
	m->pos = malloc(T * sizeof(int32_t));
	m->rseq = malloc(T * sizeof(uint32_t));
	m->bids = malloc((size_t)m->ch * m->B * sizeof(int32_t));
	m->bpos = malloc((size_t)m->ch * m->B * sizeof(int32_t));
	bool ok = m->cap && m->main_x && m->kv && m->pos && m->rseq && m->bids && m->bpos;
	for (uint32_t k = 0; k < m->n_stages; k++)
		ok = ok && (m->ctx[k] = malloc((size_t)m->ch * m->W * m->d * sizeof(float))) != NULL;
	m->ctx_off = malloc(((size_t)m->ch + 1) * sizeof(uint32_t));
	m->logits = malloc((size_t)m->ch * m->B * m->vocab * sizeof(float));
	m->mk = malloc(m->rank * sizeof(float));
	m->last = malloc(S * m->K * m->vocab * sizeof(float));
	m->has_last = calloc(S, sizeof(bool));
	if (!ok || !m->snaps || !m->ctx_off || !m->logits || !m->mk || !m->last || !m->has_last) {
		dsp_destroy(m);
		return err_set(e, ST_NOMEM, "DSpark drafter buffers");
	}
	out->ops = &dsp_ops;
	out->ctx = m;
	return ST_OK;
}

enum status spec_dspark_ring(void *ctx, uint64_t seq_id, int stage, const float **ring, uint32_t *pos_begin,
			     uint32_t *pos_end, struct err *e)
{
	struct dspark *m = ctx;
	struct dsp_seq *s = dsp_find(m, seq_id, false);
	if (!s)
		return err_set(e, ST_NOTFOUND, "DSpark drafter: no sequence %llu", (unsigned long long)seq_id);
	if (stage < 0 || (uint32_t)stage >= m->n_stages)
		return err_set(e, ST_INVALID, "DSpark drafter: stage %d", stage);
	*ring = s->ring + (size_t)stage * m->W * m->d;
	*pos_begin = s->pos_end - s->pos_begin > m->W ? s->pos_end - m->W : s->pos_begin;
	*pos_end = s->pos_end;
	return ST_OK;
}

const float *spec_dspark_last_logits(void *ctx, uint32_t i)
{
	struct dspark *m = ctx;
	if (i >= m->n_last || !m->has_last[i])
		return NULL;
	return m->last + (size_t)i * m->K * m->vocab;
}
