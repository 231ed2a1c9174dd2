/*
 * model/exec_tp.c: tensor-parallel serving over the executor interface
 * (model/exec_tp.h): the step-plan wire encoding, rank 0's broadcasting
 * wrapper executor, and the worker ranks' receive-and-run loop.
 *
 * It owns the one rule that keeps the ranks in step: rank 0 broadcasts
 * exactly one header (and, for a plan, one payload) per executor call, and a
 * worker answers each with exactly the same executor call. Everything else
 * (the forward pass's own collectives) follows from running the same plan.
 */
#include "model/exec_tp.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/log.h"

#define TP_MSG_MAGIC 0x534d5054u  /* "TPMS" */
#define TP_PLAN_MAGIC 0x4c505054u /* "TPPL" */
#define TP_PLAN_VERSION 3u /* 2: TP_SEQ_PROMPT_LP; 3: drafts and next_token */
#define TP_BOM 0x01020304u
#define TP_PLAN_HEADER_BYTES 28
/* Fixed part of one sequence record: u64 id, 8 x u32. */
#define TP_SEQ_FIXED_BYTES 40
/* Sampling parameters on the wire: 7 x 4 + u64 seed + 3 x u32. */
#define TP_SAMPLING_BYTES 48

enum tp_kind { TP_PLAN = 1, TP_PING = 2, TP_SHUTDOWN = 3, TP_RELEASE = 4 };

enum {
	TP_SEQ_RESTORE = 1u,
	TP_SEQ_SAMPLE = 2u,
	TP_SEQ_HAS_SAMPLING = 4u,
	TP_SEQ_PROMPT_LP = 8u, /* prompt log-probabilities: workers run the head on the same rows */
	TP_SEQ_NEXT_TOKEN = 16u, /* speculative decoding: next_token is set */
};

/* A worker's prompt_lp: the rows are run, nothing is written (rank 0 scores). */
static struct exec_prompt_lp tp_worker_prompt_lp;

/* ---- Encoding ---- */

static enum status buf_reserve(struct model_tp_buf *b, size_t more, struct err *e)
{
	if (b->n + more <= b->cap)
		return ST_OK;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->n + more)
		cap *= 2;
	uint8_t *p = realloc(b->data, cap);
	if (!p)
		return err_set(e, ST_NOMEM, "tensor parallel: out of memory for a %zu-byte step plan", cap);
	b->data = p;
	b->cap = cap;
	return ST_OK;
}

static void put(struct model_tp_buf *b, const void *p, size_t n)
{
	if (n)
		memcpy(b->data + b->n, p, n);
	b->n += n;
}

static void put_u32(struct model_tp_buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct model_tp_buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(struct model_tp_buf *b, float v) { put(b, &v, 4); }

enum status model_exec_tp_plan_encode(const struct exec_step *s, struct model_tp_buf *b, struct err *e)
{
	b->n = 0;
	size_t need = TP_PLAN_HEADER_BYTES + (size_t)s->n_tokens * 8 + ((size_t)s->n_seqs + 1) * 4 +
		      (size_t)s->n_block_ids * 4;
	for (uint32_t i = 0; i < s->n_seqs; i++) {
		const struct exec_seq *q = &s->seqs[i];
		need += TP_SEQ_FIXED_BYTES + 8;
		if (q->sampling)
			need += TP_SAMPLING_BYTES + (size_t)q->sampling->n_logit_bias * 8;
		need += ((size_t)(q->prompt_ids ? q->n_prompt : 0) + (q->output_ids ? q->n_output : 0)) * 4;
	}
	enum status st = buf_reserve(b, need, e);
	if (st)
		return st;
	put_u32(b, TP_PLAN_MAGIC);
	put_u32(b, TP_PLAN_VERSION);
	put_u32(b, TP_BOM);
	put_u32(b, s->n_tokens);
	put_u32(b, s->n_seqs);
	put_u32(b, s->n_block_ids);
	put_u32(b, s->n_sample);
	put(b, s->token_ids, (size_t)s->n_tokens * 4);
	put(b, s->positions, (size_t)s->n_tokens * 4);
	if (s->query_start) {
		put(b, s->query_start, ((size_t)s->n_seqs + 1) * 4);
	} else {
		/* a step with no sequences may leave query_start NULL */
		for (uint32_t i = 0; i <= s->n_seqs; i++)
			put_u32(b, i == s->n_seqs ? s->n_tokens : 0);
	}
	put(b, s->block_ids, (size_t)s->n_block_ids * 4);
	for (uint32_t i = 0; i < s->n_seqs; i++) {
		const struct exec_seq *q = &s->seqs[i];
		const struct kern_sampling_params *sp = q->sampling;
		uint32_t flags = (q->restore_state ? TP_SEQ_RESTORE : 0) | (q->sample ? TP_SEQ_SAMPLE : 0) |
				 (sp ? TP_SEQ_HAS_SAMPLING : 0) | (q->prompt_lp ? TP_SEQ_PROMPT_LP : 0) |
				 (q->has_next_token ? TP_SEQ_NEXT_TOKEN : 0);
		put_u64(b, q->seq_id);
		put_u32(b, q->n_cached_tokens);
		put_u32(b, q->n_context_tokens);
		put_u32(b, q->n_blocks);
		put_u32(b, q->block_table_start);
		put_u32(b, q->state_slot);
		put_u32(b, q->n_draft);
		put(b, &q->next_token, 4);
		put_u32(b, flags);
		if (sp) {
			put_f32(b, sp->temperature);
			put_f32(b, sp->top_p);
			put(b, &sp->top_k, 4);
			put_f32(b, sp->min_p);
			put_f32(b, sp->presence_penalty);
			put_f32(b, sp->frequency_penalty);
			put_f32(b, sp->repetition_penalty);
			put_u64(b, sp->seed);
			uint32_t nb = sp->logit_bias ? sp->n_logit_bias : 0;
			put_u32(b, nb);
			put_u32(b, sp->logprobs ? 1u : 0u);
			put_u32(b, sp->top_logprobs);
			for (uint32_t k = 0; k < nb; k++) {
				put(b, &sp->logit_bias[k].token_id, 4);
				put_f32(b, sp->logit_bias[k].bias);
			}
		}
		uint32_t np = q->prompt_ids ? q->n_prompt : 0, no = q->output_ids ? q->n_output : 0;
		put_u32(b, np);
		put(b, q->prompt_ids, (size_t)np * 4);
		put_u32(b, q->n_output);
		put_u32(b, no);
		put(b, q->output_ids, (size_t)no * 4);
	}
	return ST_OK;
}

/* ---- Decoding ---- */

struct rd {
	const uint8_t *p;
	size_t left;
};

static bool get(struct rd *r, void *out, size_t n)
{
	if (n > r->left)
		return false;
	if (n)
		memcpy(out, r->p, n);
	r->p += n;
	r->left -= n;
	return true;
}

static bool get_u32(struct rd *r, uint32_t *v) { return get(r, v, 4); }

struct bump {
	uint8_t *base;
	size_t used, cap;
};

static void *take(struct bump *m, size_t n, size_t align)
{
	size_t at = (m->used + align - 1) & ~(align - 1);
	if (at > m->cap || n > m->cap - at)
		return NULL;
	m->used = at + n;
	return m->base + at;
}

void model_exec_tp_plan_free(struct model_tp_plan *p)
{
	if (!p)
		return;
	free(p->mem);
	memset(p, 0, sizeof *p);
}

static enum status bad_plan(struct err *e, const char *what)
{
	return err_set(e, ST_INVALID, "tensor parallel: corrupt step plan: %s", what);
}

enum status model_exec_tp_plan_decode(struct model_tp_plan *p, const uint8_t *data, size_t n, struct err *e)
{
	struct rd r = {.p = data, .left = n};
	uint32_t h[7];
	if (!get(&r, h, sizeof h))
		return bad_plan(e, "shorter than its header");
	if (h[0] != TP_PLAN_MAGIC)
		return bad_plan(e, "bad magic");
	if (h[2] != TP_BOM)
		return err_set(e, ST_INVALID, "tensor parallel: step plan from a rank of another byte order");
	if (h[1] != TP_PLAN_VERSION)
		return err_set(e, ST_INVALID, "tensor parallel: step plan version %u, this dsv4 speaks %u", h[1],
			       TP_PLAN_VERSION);
	uint32_t n_tokens = h[3], n_seqs = h[4], n_block_ids = h[5], n_sample = h[6];
	/* Counts bounded by the bytes they need before anything is sized by them. */
	if ((uint64_t)n_tokens * 8 + ((uint64_t)n_seqs + 1) * 4 + (uint64_t)n_seqs * (TP_SEQ_FIXED_BYTES + 8) +
		    (uint64_t)n_block_ids * 4 > r.left)
		return bad_plan(e, "counts exceed the message");
	if (n_sample > n_seqs)
		return bad_plan(e, "more samples than sequences");
	/* Every decoded array is at most as large as its bytes on the wire;
	 * the structs and alignment come on top. */
	size_t cap = n + (size_t)n_seqs * (sizeof(struct exec_seq) + sizeof(struct kern_sampling_params) + 64) + 256;
	if (cap > p->mem_cap) {
		void *m = malloc(cap);
		if (!m)
			return err_set(e, ST_NOMEM, "tensor parallel: out of memory decoding a %zu-byte plan", n);
		free(p->mem);
		p->mem = m;
		p->mem_cap = cap;
	}
	struct bump m = {.base = p->mem, .cap = p->mem_cap};
	int32_t *tok = take(&m, (size_t)n_tokens * 4, 8), *pos = take(&m, (size_t)n_tokens * 4, 8);
	uint32_t *qs = take(&m, ((size_t)n_seqs + 1) * 4, 8), *blk = take(&m, (size_t)n_block_ids * 4, 8);
	struct exec_seq *seqs = take(&m, (size_t)n_seqs * sizeof *seqs, 8);
	if (!tok || !pos || !qs || !blk || !seqs)
		return bad_plan(e, "sizes"); /* cannot happen: cap covers them */
	get(&r, tok, (size_t)n_tokens * 4);
	get(&r, pos, (size_t)n_tokens * 4);
	get(&r, qs, ((size_t)n_seqs + 1) * 4);
	get(&r, blk, (size_t)n_block_ids * 4);
	if (qs[0] != 0 || qs[n_seqs] != n_tokens)
		return bad_plan(e, "query_start does not span the tokens");
	for (uint32_t i = 0; i < n_seqs; i++)
		if (qs[i + 1] < qs[i])
			return bad_plan(e, "query_start is not monotone");
	uint32_t n_sampling_seqs = 0;
	for (uint32_t i = 0; i < n_seqs; i++) {
		struct exec_seq *q = &seqs[i];
		memset(q, 0, sizeof *q);
		uint32_t f[7], flags;
		if (!get(&r, &q->seq_id, 8) || !get(&r, f, sizeof f) || !get_u32(&r, &flags))
			return bad_plan(e, "truncated sequence record");
		q->n_cached_tokens = f[0];
		q->n_context_tokens = f[1];
		q->n_blocks = f[2];
		q->block_table_start = f[3];
		q->state_slot = f[4];
		q->n_draft = f[5];
		memcpy(&q->next_token, &f[6], 4);
		if (flags & ~(TP_SEQ_RESTORE | TP_SEQ_SAMPLE | TP_SEQ_HAS_SAMPLING | TP_SEQ_PROMPT_LP | TP_SEQ_NEXT_TOKEN))
			return bad_plan(e, "unknown sequence flags");
		q->prompt_lp = flags & TP_SEQ_PROMPT_LP ? &tp_worker_prompt_lp : NULL;
		q->restore_state = flags & TP_SEQ_RESTORE;
		q->sample = flags & TP_SEQ_SAMPLE;
		q->has_next_token = flags & TP_SEQ_NEXT_TOKEN;
		if (q->n_draft > EXEC_SPEC_MAX_DRAFT || (q->n_draft && !q->sample) ||
		    (q->n_draft && q->n_draft >= qs[i + 1] - qs[i]))
			return bad_plan(e, "drafts outside the sequence's sampled query");
		n_sampling_seqs += q->sample;
		if ((uint64_t)q->block_table_start + q->n_blocks > n_block_ids)
			return bad_plan(e, "block table outside block_ids");
		if (flags & TP_SEQ_HAS_SAMPLING) {
			struct kern_sampling_params *sp = take(&m, sizeof *sp, 8);
			uint32_t nb, lp;
			if (!sp)
				return bad_plan(e, "sizes");
			memset(sp, 0, sizeof *sp);
			if (!get(&r, &sp->temperature, 4) || !get(&r, &sp->top_p, 4) || !get(&r, &sp->top_k, 4) ||
			    !get(&r, &sp->min_p, 4) || !get(&r, &sp->presence_penalty, 4) ||
			    !get(&r, &sp->frequency_penalty, 4) || !get(&r, &sp->repetition_penalty, 4) ||
			    !get(&r, &sp->seed, 8) || !get_u32(&r, &nb) || !get_u32(&r, &lp) ||
			    !get_u32(&r, &sp->top_logprobs))
				return bad_plan(e, "truncated sampling parameters");
			if ((uint64_t)nb * 8 > r.left)
				return bad_plan(e, "logit bias exceeds the message");
			sp->logprobs = lp != 0;
			sp->n_logit_bias = nb;
			if (nb) {
				struct kern_logit_bias *lb = take(&m, (size_t)nb * sizeof *lb, 8);
				if (!lb)
					return bad_plan(e, "sizes");
				for (uint32_t k = 0; k < nb; k++) {
					get(&r, &lb[k].token_id, 4);
					get(&r, &lb[k].bias, 4);
				}
				sp->logit_bias = lb;
			}
			q->sampling = sp;
		}
		uint32_t np, no;
		if (!get_u32(&r, &np) || (uint64_t)np * 4 > r.left)
			return bad_plan(e, "prompt exceeds the message");
		int32_t *pi = take(&m, (size_t)np * 4, 8);
		if (!pi)
			return bad_plan(e, "sizes");
		get(&r, pi, (size_t)np * 4);
		q->prompt_ids = np ? pi : NULL;
		q->n_prompt = np;
		if (!get_u32(&r, &q->n_output) || !get_u32(&r, &no) || (uint64_t)no * 4 > r.left)
			return bad_plan(e, "output history exceeds the message");
		int32_t *oi = take(&m, (size_t)no * 4, 8);
		if (!oi)
			return bad_plan(e, "sizes");
		get(&r, oi, (size_t)no * 4);
		q->output_ids = no ? oi : NULL;
		if (no && no != q->n_output)
			return bad_plan(e, "output history length differs from n_output");
	}
	if (r.left)
		return bad_plan(e, "trailing bytes");
	if (n_sampling_seqs != n_sample)
		return bad_plan(e, "n_sample differs from the sampling sequences");
	p->step = (struct exec_step){.n_tokens = n_tokens, .token_ids = tok, .positions = pos, .n_seqs = n_seqs,
				     .seqs = seqs, .query_start = qs, .block_ids = blk, .n_block_ids = n_block_ids,
				     .n_sample = n_sample};
	return ST_OK;
}

/* ---- Messages ---- */

static void msg_pack(uint8_t h[MODEL_TP_HEADER_BYTES], enum tp_kind kind, uint64_t arg)
{
	uint32_t a = TP_MSG_MAGIC, k = (uint32_t)kind;
	memcpy(h, &a, 4);
	memcpy(h + 4, &k, 4);
	memcpy(h + 8, &arg, 8);
}

/* ---- Rank 0 ---- */

struct model_exec_tp {
	struct exec ex;
	struct exec *inner;
	struct comm *comm;
	void (*on_fail)(void *ctx, const char *msg);
	void *fail_ctx;
	struct model_tp_buf buf;
	atomic_bool failed;
	bool shut_down;
	char fail_msg[ERR_MSG_BYTES];
};

static void tp_fail(struct model_exec_tp *t, const char *msg)
{
	if (atomic_load(&t->failed))
		return;
	snprintf(t->fail_msg, sizeof t->fail_msg, "%s", msg);
	atomic_store(&t->failed, true);
	log_msg(LOG_ERROR, "tp", "tensor parallel group failed: %s", msg);
	comm_abort(t->comm, "rank 0 saw the group fail");
	if (t->on_fail)
		t->on_fail(t->fail_ctx, msg);
}

static enum status tp_failed_err(struct model_exec_tp *t, struct err *e)
{
	return err_set(e, ST_ABORTED, "tensor parallel group failed: %s", t->fail_msg);
}

static enum status tp_send(struct model_exec_tp *t, enum tp_kind kind, uint64_t arg, const uint8_t *payload,
			   struct err *e)
{
	uint8_t h[MODEL_TP_HEADER_BYTES];
	msg_pack(h, kind, arg);
	enum status st = comm_broadcast(t->comm, h, h, sizeof h, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e);
	if (!st && kind == TP_PLAN && arg)
		st = comm_broadcast(t->comm, payload, (void *)payload, (size_t)arg, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e);
	if (st && !t->shut_down)
		tp_fail(t, e->msg);
	return st;
}

static enum status tp_step(void *ctx, const struct exec_step *s, struct exec_sample *out, struct err *e)
{
	struct model_exec_tp *t = ctx;
	if (atomic_load(&t->failed))
		return tp_failed_err(t, e);
	enum status st = model_exec_tp_plan_encode(s, &t->buf, e);
	if (st)
		return st; /* nothing sent: the workers are still in step */
	if ((st = tp_send(t, TP_PLAN, t->buf.n, t->buf.data, e)))
		return st;
	st = t->inner->ops->step(t->inner->ctx, s, out, e);
	if (st && comm_status(t->comm) != ST_OK)
		tp_fail(t, e->msg);
	return st;
}

static void tp_seq_release(void *ctx, uint64_t seq_id)
{
	struct model_exec_tp *t = ctx;
	if (!t->inner->ops->seq_release || atomic_load(&t->failed))
		return;
	struct err e = {0};
	if (tp_send(t, TP_RELEASE, seq_id, NULL, &e) == ST_OK)
		t->inner->ops->seq_release(t->inner->ctx, seq_id);
}

static const struct exec_ops tp_ops = {.step = tp_step, .seq_release = tp_seq_release};

enum status model_exec_tp_create(struct model_exec_tp **out, const struct model_exec_tp_options *opt,
				 struct err *e)
{
	*out = NULL;
	if (!opt || !opt->inner || !opt->comm)
		return err_set(e, ST_INVALID, "tensor parallel: needs an executor and a comm");
	if (comm_rank(opt->comm) != 0)
		return err_set(e, ST_INVALID, "tensor parallel: the broadcasting executor runs on rank 0, not %d",
			       comm_rank(opt->comm));
	struct model_exec_tp *t = calloc(1, sizeof *t);
	if (!t)
		return err_set(e, ST_NOMEM, "tensor parallel: out of memory");
	t->inner = opt->inner;
	t->comm = opt->comm;
	t->on_fail = opt->on_fail;
	t->fail_ctx = opt->fail_ctx;
	atomic_init(&t->failed, false);
	t->ex.ops = &tp_ops;
	t->ex.ctx = t;
	t->ex.info = opt->inner->info;
	*out = t;
	return ST_OK;
}

struct exec *model_exec_tp_exec(struct model_exec_tp *t) { return &t->ex; }
bool model_exec_tp_failed(const struct model_exec_tp *t) { return atomic_load(&t->failed); }

enum status model_exec_tp_ping(struct model_exec_tp *t, struct err *e)
{
	if (atomic_load(&t->failed))
		return tp_failed_err(t, e);
	return tp_send(t, TP_PING, 0, NULL, e);
}

void model_exec_tp_shutdown(struct model_exec_tp *t)
{
	if (!t || t->shut_down)
		return;
	t->shut_down = true;
	if (atomic_load(&t->failed))
		return;
	struct err e = {0};
	if (tp_send(t, TP_SHUTDOWN, 0, NULL, &e))
		log_msg(LOG_INFO, "tp", "shutdown message not delivered (the group is already gone): %s", e.msg);
}

void model_exec_tp_destroy(struct model_exec_tp *t)
{
	if (!t)
		return;
	model_exec_tp_shutdown(t);
	free(t->buf.data);
	free(t);
}

/* ---- Workers ---- */

enum status model_exec_tp_worker_run(struct exec *inner, struct comm *comm, uint64_t *n_steps_out, struct err *e)
{
	struct model_tp_buf buf = {0};
	struct model_tp_plan plan = {0};
	struct exec_sample *out = NULL;
	uint32_t cap_out = 0;
	uint64_t n_steps = 0;
	enum status st = ST_OK;
	int rank = comm_rank(comm);
	for (;;) {
		uint8_t h[MODEL_TP_HEADER_BYTES];
		if ((st = comm_broadcast(comm, NULL, h, sizeof h, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e)))
			break;
		uint32_t magic, kind;
		uint64_t arg;
		memcpy(&magic, h, 4);
		memcpy(&kind, h + 4, 4);
		memcpy(&arg, h + 8, 8);
		if (magic != TP_MSG_MAGIC) {
			st = err_set(e, ST_INVALID, "tensor parallel rank %d: bad message magic 0x%08x from rank 0", rank,
				     magic);
			comm_abort(comm, e->msg);
			break;
		}
		if (kind == TP_PING)
			continue;
		if (kind == TP_SHUTDOWN) {
			log_msg(LOG_INFO, "tp", "rank %d: rank 0 shut the group down after %llu steps", rank,
				(unsigned long long)n_steps);
			break;
		}
		if (kind == TP_RELEASE) {
			if (inner->ops->seq_release)
				inner->ops->seq_release(inner->ctx, arg);
			continue;
		}
		if (kind != TP_PLAN) {
			st = err_set(e, ST_INVALID, "tensor parallel rank %d: unknown message kind %u", rank, kind);
			comm_abort(comm, e->msg);
			break;
		}
		buf.n = 0;
		if ((st = buf_reserve(&buf, (size_t)arg, e))) {
			comm_abort(comm, e->msg);
			break;
		}
		if ((st = comm_broadcast(comm, NULL, buf.data, (size_t)arg, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e)))
			break;
		if ((st = model_exec_tp_plan_decode(&plan, buf.data, (size_t)arg, e))) {
			comm_abort(comm, e->msg);
			break;
		}
		if (plan.step.n_sample > cap_out) {
			struct exec_sample *o = realloc(out, (size_t)plan.step.n_sample * sizeof *o);
			if (!o) {
				st = err_set(e, ST_NOMEM, "tensor parallel rank %d: out of memory", rank);
				comm_abort(comm, e->msg);
				break;
			}
			out = o;
			cap_out = plan.step.n_sample;
		}
		n_steps++;
		st = inner->ops->step(inner->ctx, &plan.step, out, e);
		if (st) {
			if (comm_status(comm) != ST_OK)
				break;
			/* As rank 0: a failed step ends its requests; the group goes on. */
			log_msg(LOG_WARN, "tp", "rank %d: step %llu failed: %s", rank, (unsigned long long)n_steps, e->msg);
			err_clear(e);
			st = ST_OK;
		}
	}
	free(buf.data);
	model_exec_tp_plan_free(&plan);
	free(out);
	if (n_steps_out)
		*n_steps_out = n_steps;
	return st;
}
