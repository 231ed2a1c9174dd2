/*
 * model/spec_mtp.c: the MTP drafter (model/spec.h) on the June release's
 * NextN layer (dsv4.md 3.11), run by the model executor's forward pass.
 *
 * commit: the MTP layer over every committed position p with the target's
 * pre-head streams at p and the token at p + 1; this writes the MTP ring
 * rows a plain run with the layer would hold, and its head at a sequence's
 * last committed position gives draft 1. propose: drafts 2..K reuse the one
 * layer on its own output streams and the previous draft, one position
 * further each time; those ring rows are speculative, so the MTP layer's
 * state is saved before the chain and restored after it
 * (model_fwd_spec_save / _commit with nothing kept). A chain never leaves
 * the block table of the step, so near a block's end it may propose fewer.
 * Streams, the chain and the MTP logits live where the forward's buffers do
 * (host or device: model_fwd_mem); only the drafted rows' logits come to the
 * host for their argmax.
 */
#include "model/spec.h"

#include <stdlib.h>
#include <string.h>

#include "model/exec_cpu.h"
#include "model/forward.h"
#include "kernels/device/mem.h"
#include "model/weights.h"

struct spec_mtp {
	struct model_exec_cpu *x;
	struct model_fwd *f;
	const struct kern_mem *mem; /* the forward's memory */
	uint32_t K, vocab, B, max_tokens, max_seqs;
	size_t row_floats;        /* one token's streams: hc_mult * hidden */
	float *streams;           /* [max_tokens, row_floats] the MTP step's input streams */
	float *chain;             /* [max_seqs, row_floats] each proposer's last MTP output streams */
	float *logits;            /* [max_seqs, vocab] in mem */
	float *logits_h;          /* [max_seqs, vocab] host: the rows whose argmax is a draft */
	int32_t *ids, *pos;       /* [max_tokens] */
	uint32_t *qs, *rows, *nq; /* [max_seqs + 1] */
	struct exec_seq *seqs;    /* [max_seqs] */
	struct exec_seq *save_seqs; /* [max_seqs] the chain's save step (must outlive propose) */
	uint32_t *save_qs;        /* [max_seqs + 1] */
	int32_t *d1;              /* [max_seqs] draft 1 of each proposer, from commit */
	uint32_t *last;           /* [max_seqs] its last committed position */
	uint32_t *who;            /* [max_seqs] batch index of each proposer */
	uint32_t n_prop;
};

static int32_t argmax(const float *row, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t v = 1; v < n; v++)
		if (row[v] > row[best])
			best = v;
	return (int32_t)best;
}

static enum status mtp_commit(void *ctx, const struct spec_draft_batch *b, struct err *e)
{
	struct spec_mtp *m = ctx;
	const struct exec_step *st = b->step;
	uint32_t nt = 0, ns = 0, nr = 0;
	m->n_prop = 0;
	for (uint32_t i = 0; i < b->n_seqs; i++) {
		const struct spec_draft_seq *d = &b->seqs[i];
		if (!d->n_commit)
			continue;
		if (nt + d->n_commit > m->max_tokens || ns >= m->max_seqs)
			return err_set(e, ST_INVALID, "MTP drafter: step over %u tokens", m->max_tokens);
		const struct exec_seq *sq = &st->seqs[d->seq_index];
		m->seqs[ns] = *sq;
		m->seqs[ns].n_cached_tokens = d->pos0;
		m->seqs[ns].n_context_tokens = d->pos0 + d->n_commit;
		m->seqs[ns].sample = false;
		m->seqs[ns].prompt_lp = NULL;
		m->seqs[ns].n_draft = 0;
		m->qs[ns] = nt;
		for (uint32_t k = 0; k < d->n_commit; k++) {
			m->ids[nt + k] = d->next_ids[k];
			m->pos[nt + k] = (int32_t)(d->pos0 + k);
		}
		enum status cs = kern_mem_copy(m->mem, m->streams + (size_t)nt * m->row_floats,
					       b->streams + (size_t)d->row0 * m->row_floats,
					       (size_t)d->n_commit * m->row_floats * sizeof(float), e);
		if (cs)
			return cs;
		nt += d->n_commit;
		if (d->n_propose) {
			m->rows[nr] = nt - 1;
			m->who[nr] = i;
			m->last[nr] = d->pos0 + d->n_commit - 1;
			nr++;
		}
		ns++;
	}
	if (!ns)
		return ST_OK;
	m->qs[ns] = nt;
	struct exec_step ms = {.n_tokens = nt, .token_ids = m->ids, .positions = m->pos, .n_seqs = ns,
			       .seqs = m->seqs, .query_start = m->qs, .block_ids = st->block_ids,
			       .n_block_ids = st->n_block_ids};
	enum status s = model_fwd_mtp_rows(m->f, &ms, m->streams, m->rows, nr, m->logits, e);
	if (s || !nr)
		return s;
	if ((s = kern_mem_download(m->mem, m->logits_h, m->logits, (size_t)nr * m->vocab * sizeof(float), e)))
		return s;
	const float *out = model_fwd_mtp_streams(m->f);
	for (uint32_t j = 0; j < nr; j++) {
		m->d1[j] = argmax(m->logits_h + (size_t)j * m->vocab, m->vocab);
		if ((s = kern_mem_copy(m->mem, m->chain + (size_t)j * m->row_floats,
				       out + (size_t)m->rows[j] * m->row_floats, m->row_floats * sizeof(float), e)))
			return s;
	}
	m->n_prop = nr;
	return ST_OK;
}

static enum status mtp_propose(void *ctx, struct spec_draft_batch *b, struct err *e)
{
	struct spec_mtp *m = ctx;
	const struct exec_step *st = b->step;
	uint32_t nr = m->n_prop, want = 0;
	m->n_prop = 0;
	/* draft 1 from commit; how far each chain may go inside its block table */
	uint32_t *len = m->nq; /* chain length (drafts) of proposer j */
	for (uint32_t j = 0; j < nr; j++) {
		struct spec_draft_seq *d = &b->seqs[m->who[j]];
		const struct exec_seq *sq = &st->seqs[d->seq_index];
		uint32_t n = d->n_propose < m->K ? d->n_propose : m->K;
		/* draft k is made at position last + k - 1: stay below n_blocks * B */
		uint64_t room = (uint64_t)sq->n_blocks * m->B - m->last[j]; /* positions last.. inside the table */
		if (n > room)
			n = (uint32_t)room;
		len[j] = n;
		d->drafts[0] = m->d1[j];
		d->n_drafts = n ? 1 : 0;
		if (n > want)
			want = n;
	}
	if (want <= 1)
		return ST_OK;
	/* save the MTP layer's state over the chain's positions last+1 .. last+len-1 */
	int l = model_exec_cpu_weights(m->x)->n_layers;
	uint32_t ns = 0;
	for (uint32_t j = 0; j < nr; j++) {
		if (len[j] < 2)
			continue;
		const struct exec_seq *sq = &st->seqs[b->seqs[m->who[j]].seq_index];
		m->save_seqs[ns] = *sq;
		m->save_seqs[ns].n_cached_tokens = m->last[j] + 1;
		m->save_seqs[ns].n_context_tokens = m->last[j] + len[j];
		ns++;
	}
	/* query_start of the save step: cumulative chain positions */
	uint32_t acc = 0;
	for (uint32_t j = 0, k = 0; j < nr; j++) {
		if (len[j] < 2)
			continue;
		m->save_qs[k] = acc;
		m->rows[k] = len[j] - 1;
		acc += len[j] - 1;
		k++;
	}
	m->save_qs[ns] = acc;
	struct exec_step ss = {.n_tokens = acc, .token_ids = NULL, .positions = NULL, .n_seqs = ns,
			       .seqs = m->save_seqs, .query_start = m->save_qs, .block_ids = st->block_ids,
			       .n_block_ids = st->n_block_ids};
	enum status s = model_fwd_spec_save(m->f, &ss, m->rows, l, l + 1, false, e);
	if (s)
		return s;
	for (uint32_t k = 2; k <= want && !s; k++) {
		uint32_t n = 0;
		for (uint32_t j = 0; j < nr; j++) {
			if (len[j] < k)
				continue;
			struct spec_draft_seq *d = &b->seqs[m->who[j]];
			const struct exec_seq *sq = &st->seqs[d->seq_index];
			uint32_t p = m->last[j] + k - 1;
			m->seqs[n] = *sq;
			m->seqs[n].n_cached_tokens = p;
			m->seqs[n].n_context_tokens = p + 1;
			m->seqs[n].sample = false;
			m->seqs[n].prompt_lp = NULL;
			m->seqs[n].n_draft = 0;
			m->qs[n] = n;
			m->ids[n] = d->drafts[k - 2];
			m->pos[n] = (int32_t)p;
			m->rows[n] = n;
			if (n != j && (s = kern_mem_copy(m->mem, m->chain + (size_t)n * m->row_floats,
							 m->chain + (size_t)j * m->row_floats, m->row_floats * sizeof(float),
							 e)))
				break;
			m->who[n] = m->who[j];
			m->last[n] = m->last[j];
			len[n] = len[j];
			n++;
		}
		if (s)
			break;
		nr = n;
		m->qs[n] = n;
		struct exec_step ms = {.n_tokens = n, .token_ids = m->ids, .positions = m->pos, .n_seqs = n,
				       .seqs = m->seqs, .query_start = m->qs, .block_ids = st->block_ids,
				       .n_block_ids = st->n_block_ids};
		if ((s = model_fwd_mtp_rows(m->f, &ms, m->chain, m->rows, n, m->logits, e)) ||
		    (s = kern_mem_copy(m->mem, m->chain, model_fwd_mtp_streams(m->f),
				       (size_t)n * m->row_floats * sizeof(float), e)) ||
		    (s = kern_mem_download(m->mem, m->logits_h, m->logits, (size_t)n * m->vocab * sizeof(float), e)))
			break;
		for (uint32_t j = 0; j < n; j++) {
			struct spec_draft_seq *d = &b->seqs[m->who[j]];
			d->drafts[k - 1] = argmax(m->logits_h + (size_t)j * m->vocab, m->vocab);
			d->n_drafts = k;
		}
	}
	/* the chain's ring rows were speculative: back to the committed state */
	enum status s2 = model_fwd_spec_commit(m->f, NULL, e);
	return s ? s : s2;
}

static void mtp_destroy(void *ctx)
{
	struct spec_mtp *m = ctx;
	if (!m)
		return;
	kern_mem_free(m->mem, m->streams);
	kern_mem_free(m->mem, m->chain);
	kern_mem_free(m->mem, m->logits);
	free(m->logits_h);
	free(m->ids);
	free(m->pos);
	free(m->qs);
	free(m->rows);
	free(m->nq);
	free(m->seqs);
	free(m->save_seqs);
	free(m->save_qs);
	free(m->d1);
	free(m->last);
	free(m->who);
	free(m);
}

static const struct spec_drafter_ops mtp_ops = {
	.name = "mtp", .commit = mtp_commit, .propose = mtp_propose, .seq_release = NULL, .destroy = mtp_destroy};

enum status spec_mtp_drafter_create(struct spec_drafter *out, struct model_exec_cpu *x, uint32_t max_draft,
				    struct err *e)
{
	memset(out, 0, sizeof *out);
	const struct model_weights *w = model_exec_cpu_weights(x);
	if (!w->n_mtp)
		return err_set(e, ST_INVALID, "MTP speculation: the executor was created without the MTP layer (load_mtp)");
	if (!max_draft || max_draft > SPEC_MAX_MTP_TOKENS)
		return err_set(e, ST_INVALID, "MTP speculation: %u draft tokens (1..%d)", max_draft, SPEC_MAX_MTP_TOKENS);
	const struct exec *ex = model_exec_cpu_exec(x);
	struct spec_mtp *m = calloc(1, sizeof *m);
	if (!m)
		return err_set(e, ST_NOMEM, "MTP drafter");
	m->x = x;
	m->f = model_exec_cpu_fwd(x);
	m->K = max_draft;
	m->vocab = ex->info.vocab_size;
	m->B = ex->info.block_tokens;
	m->max_tokens = ex->info.max_step_tokens;
	m->max_seqs = ex->info.max_step_seqs;
	m->row_floats = (size_t)w->cfg->hc_mult * (size_t)w->cfg->hidden_size;
	size_t S = m->max_seqs + 1, T = m->max_tokens + 1;
	m->mem = model_fwd_mem(m->f);
	struct err ae = {0};
	if (kern_mem_alloc(m->mem, T * m->row_floats * sizeof(float), (void **)&m->streams, &ae) ||
	    kern_mem_alloc(m->mem, S * m->row_floats * sizeof(float), (void **)&m->chain, &ae) ||
	    kern_mem_alloc(m->mem, S * m->vocab * sizeof(float), (void **)&m->logits, &ae)) {
		mtp_destroy(m);
		return err_set(e, ST_NOMEM, "MTP drafter buffers: %s", ae.msg);
	}
	m->logits_h = malloc(S * m->vocab * sizeof(float));
	m->ids = malloc(T * sizeof(int32_t));
	m->pos = malloc(T * sizeof(int32_t));
	m->qs = malloc((S + 1) * sizeof(uint32_t));
	m->rows = malloc(T * sizeof(uint32_t));
	m->nq = malloc(S * sizeof(uint32_t));
	m->seqs = calloc(S, sizeof *m->seqs);
	m->save_seqs = calloc(S, sizeof *m->save_seqs);
	m->save_qs = malloc((S + 1) * sizeof(uint32_t));
	m->d1 = malloc(S * sizeof(int32_t));
	m->last = malloc(S * sizeof(uint32_t));
	m->who = malloc(S * sizeof(uint32_t));
	if (!m->logits_h || !m->ids || !m->pos || !m->qs || !m->rows || !m->nq || !m->seqs ||
	    !m->save_seqs || !m->save_qs || !m->d1 || !m->last || !m->who) {
		mtp_destroy(m);
		return err_set(e, ST_NOMEM, "MTP drafter buffers");
	}
	out->ops = &mtp_ops;
	out->ctx = m;
	return ST_OK;
}
