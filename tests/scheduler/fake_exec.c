/*
 * tests/scheduler/fake_exec.c: the deterministic fake executor (fake_exec.h).
 */
#include "fake_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static inline uint64_t state_init(const struct fake_exec_options *o)
{
	return mix64(o->model_seed ^ 0x5151);
}

static inline uint64_t state_next(uint64_t h, int32_t tok, uint32_t pos)
{
	return mix64(h ^ mix64(((uint64_t)(uint32_t)tok << 32) ^ pos ^ 0xABCDEF));
}

/* Prompt log-probabilities (model/exec.h): entry pos + 1 from the state
 * after the token at pos and the scored token, so a skipped or misplaced
 * position leaves a wrong or empty entry (fake_prompt_entry recomputes it). */
static float plp_value(uint64_t h, int32_t target)
{
	return -(float)(1 + mix64(h ^ (uint64_t)(uint32_t)target) % 4096) / 256.0f;
}

static void plp_write(const struct fake_exec_options *o, const struct exec_seq *s, uint32_t pos, uint64_t h)
{
	struct exec_prompt_lp *lp = s->prompt_lp;
	if (!lp || !s->prompt_ids || pos + 1 >= s->n_prompt || !lp->logprob)
		return;
	lp->logprob[pos + 1] = plp_value(h, s->prompt_ids[pos + 1]);
	lp->rank[pos + 1] = 1 + (int32_t)(mix64(h) % 7);
	for (uint32_t k = 0; k < lp->n_top; k++) {
		lp->top_ids[(size_t)(pos + 1) * lp->n_top + k] = (int32_t)(mix64(h + k + 1) % o->vocab);
		lp->top_logprobs[(size_t)(pos + 1) * lp->n_top + k] = -(float)k;
	}
}

void fake_prompt_entry(const struct fake_exec_options *o, const int32_t *ids, uint32_t p, float *logprob,
		       int32_t *rank, int32_t *top0)
{
	uint64_t h = state_init(o);
	for (uint32_t i = 0; i < p; i++)
		h = state_next(h, ids[i], i);
	*logprob = plp_value(h, ids[p]);
	*rank = 1 + (int32_t)(mix64(h) % 7);
	*top0 = (int32_t)(mix64(h + 1) % o->vocab);
}

static void make_logits(const struct fake_exec_options *o, uint64_t h, float *l)
{
	for (uint32_t v = 0; v < o->vocab; v++) {
		uint64_t x = mix64(h + v * 0x9E3779B97F4A7C15ull);
		l[v] = (float)((double)(x >> 11) * 0x1.0p-53 * 8.0 - 4.0);
	}
	if (o->eos_token_id >= 0 && (uint32_t)o->eos_token_id < o->vocab)
		l[o->eos_token_id] += o->eos_bias;
}

struct exec_layer_mix fake_layer_mix(uint32_t block_tokens)
{
	uint32_t w = block_tokens < 32 ? block_tokens : 32;
	struct exec_layer_mix m = {
		.sliding_window = w,
		.swa = {.n_layers = 2, .ring_entry_bytes = 128},
		.csa = {.n_layers = 2, .compress_ratio = 4, .overlap = true, .kv_entry_bytes = 128,
			.indexer_entry_bytes = 64, .ring_entry_bytes = 128, .compressor_token_bytes = 512},
		.hca = {.n_layers = 2, .compress_ratio = 8, .kv_entry_bytes = 128, .ring_entry_bytes = 128,
			.compressor_token_bytes = 256},
	};
	return m;
}

static enum status fail(struct fake_exec *f, struct err *e, const char *fmt, unsigned a, unsigned b, unsigned c)
{
	char m[256];
	snprintf(m, sizeof(m), fmt, a, b, c);
	if (!f->error[0])
		snprintf(f->error, sizeof(f->error), "step %llu: %s", (unsigned long long)f->n_steps, m);
	return err_set(e, ST_INVALID, "fake executor: %s", m);
}

/* Feed the query tokens of seq i of st, which start at position p0, into
 * state *h: positions must follow p0 and every write must continue its block.
 * In block mode every block's state follows its last write; otherwise a block
 * holds a snapshot once its last position is written, and none while it is
 * being rewritten. */
static enum status feed_tokens(struct fake_exec *f, const struct exec_step *st, uint32_t i, const uint32_t *bt,
			       uint32_t p0, uint64_t *h, struct err *e)
{
	const struct fake_exec_options *o = &f->opt;
	const struct exec_seq *s = &st->seqs[i];
	uint32_t B = o->block_tokens, q0 = st->query_start[i], q1 = st->query_start[i + 1];
	for (uint32_t t = q0; t < q1; t++) {
		uint32_t pos = (uint32_t)st->positions[t];
		if (pos != p0 + (t - q0))
			return fail(f, e, "seq %u: position %u, expected %u", i, pos, p0 + (t - q0));
		uint32_t b = bt[pos / B];
		if (pos % B && f->blk_last_pos[b] != (int64_t)pos - 1)
			return fail(f, e, "seq %u: write at %u into block %u not contiguous", i, pos, b);
		*h = state_next(*h, st->token_ids[t], pos);
		plp_write(o, s, pos, *h);
		f->blk_last_pos[b] = pos;
		if (o->block_mode) {
			f->blk_snap_pos[b] = pos;
			f->blk_state[b] = *h;
		} else if (pos % B == B - 1) {
			f->blk_state[b] = *h;
			f->blk_snap_pos[b] = pos;
		} else if (pos % B == 0) {
			f->blk_snap_pos[b] = -1; /* the block is being rewritten */
		}
	}
	return ST_OK;
}

static enum status fake_step(void *ctx, const struct exec_step *st, struct exec_sample *out, struct err *e)
{
	struct fake_exec *f = ctx;
	const struct fake_exec_options *o = &f->opt;
	uint32_t B = o->block_tokens;
	f->n_steps++;
	if (f->step_sleep_us)
		usleep(f->step_sleep_us);
	if (f->fail_at_step >= 0 && f->n_steps == (uint64_t)f->fail_at_step + 1) {
		f->fail_at_step = -1;
		return err_set(e, ST_CUDA, "fake executor: injected failure");
	}
	if (!st->n_tokens || st->n_tokens > o->max_step_tokens || st->n_seqs > o->max_step_seqs)
		return fail(f, e, "batch of %u tokens / %u seqs over capacity (%u)", st->n_tokens, st->n_seqs,
			    o->max_step_tokens);
	if (st->query_start[0] != 0 || st->query_start[st->n_seqs] != st->n_tokens)
		return fail(f, e, "query_start does not span the batch (%u..%u of %u)", st->query_start[0],
			    st->query_start[st->n_seqs], st->n_tokens);
	struct fake_step_record rec = {.n_tokens = st->n_tokens, .n_seqs = st->n_seqs, .n_sample = st->n_sample};
	uint32_t k = 0;
	for (uint32_t i = 0; i < st->n_seqs; i++) {
		const struct exec_seq *s = &st->seqs[i];
		uint32_t q0 = st->query_start[i], q1 = st->query_start[i + 1];
		if (q1 <= q0 || q1 - q0 != s->n_context_tokens - s->n_cached_tokens)
			return fail(f, e, "seq %u: %u query tokens for context %u", i, q1 - q0, s->n_context_tokens);
		if (s->n_blocks != (s->n_context_tokens + B - 1) / B || s->block_table_start + s->n_blocks > st->n_block_ids)
			return fail(f, e, "seq %u: %u blocks for %u tokens", i, s->n_blocks, s->n_context_tokens);
		const uint32_t *bt = st->block_ids + s->block_table_start;
		for (uint32_t b = 0; b < s->n_blocks; b++)
			if (bt[b] >= o->n_blocks)
				return fail(f, e, "seq %u: block id %u >= %u", i, bt[b], o->n_blocks);
		uint32_t p0 = s->n_cached_tokens, sl = s->state_slot;
		uint64_t h = state_init(o);
		if (o->block_mode) {
			/* rules 1b/2b: the live state is the area of the block holding p-1 */
			if (sl != EXEC_NO_SLOT)
				return fail(f, e, "seq %u: state slot %u in block mode", i, sl, 0);
			if (s->restore_state && p0 % B)
				return fail(f, e, "seq %u: restart at %u, not a block boundary", i, p0, 0);
			if (p0) {
				uint32_t src = bt[(p0 - 1) / B];
				if (f->blk_snap_pos[src] != (int64_t)p0 - 1)
					return fail(f, e, "seq %u: block %u state is not at %u", i, src, p0 - 1);
				h = f->blk_state[src];
			}
			enum status rc = feed_tokens(f, st, i, bt, p0, &h, e);
			if (rc)
				return rc;
			goto sampled;
		}
		if (sl >= f->ex.info.n_state_slots)
			return fail(f, e, "seq %u: state slot %u out of range", i, sl, 0);
		for (uint32_t j = 0; j < i; j++)
			if (st->seqs[j].state_slot == sl)
				return fail(f, e, "seqs %u and %u share state slot %u", j, i, sl);
		if (s->restore_state) {
			if (p0 % B)
				return fail(f, e, "seq %u: restore at %u, not a block boundary", i, p0, 0);
			if (p0) {
				uint32_t src = bt[p0 / B - 1];
				if (f->blk_snap_pos[src] != (int64_t)p0 - 1)
					return fail(f, e, "seq %u: block %u has no snapshot at %u", i, src, p0 - 1);
				h = f->blk_state[src];
			}
		} else {
			if (f->slot_seq[sl] != s->seq_id || f->slot_pos[sl] != (int64_t)p0 - 1)
				return fail(f, e, "seq %u: slot %u holds another sequence or position (%u)", i, sl,
					    (unsigned)f->slot_pos[sl]);
			h = f->slot_state[sl];
		}
		enum status rc = feed_tokens(f, st, i, bt, p0, &h, e);
		if (rc)
			return rc;
		f->slot_state[sl] = h;
		f->slot_seq[sl] = s->seq_id;
		f->slot_pos[sl] = (int64_t)q1 - q0 + p0 - 1;
sampled:
		if (i < 64) {
			rec.seq_tokens[i] = q1 - q0;
			rec.seq_sample[i] = s->sample;
			rec.seq_ids[i] = s->seq_id;
		}
		if (s->sample) {
			make_logits(o, h, f->logits);
			struct kern_sample_history hist = {s->prompt_ids, s->n_prompt, s->output_ids, s->n_output};
			out[k].seq_index = i;
			enum status rc = kern_sample_ref(f->logits, o->vocab, s->sampling, &hist, s->n_output, f->work, &out[k].out);
			if (rc)
				return fail(f, e, "seq %u: sampling failed (%u)", i, (unsigned)-rc, 0);
			k++;
		}
	}
	if (k != st->n_sample)
		return fail(f, e, "n_sample %u but %u seqs sample", st->n_sample, k, 0);
	if (k && f->bad_token_at_step >= 0 && f->n_steps == (uint64_t)f->bad_token_at_step + 1) {
		f->bad_token_at_step = -1;
		out[0].out.token_id = (int32_t)o->vocab;
	}
	f->n_tokens_total += st->n_tokens;
	f->last = rec;
	if (f->n_records == f->cap_records) {
		uint32_t c = f->cap_records ? f->cap_records * 2 : 64;
		struct fake_step_record *r = realloc(f->records, c * sizeof(*r));
		if (r) {
			f->records = r;
			f->cap_records = c;
		}
	}
	if (f->n_records < f->cap_records)
		f->records[f->n_records++] = rec;
	return ST_OK;
}

static void fake_release(void *ctx, uint64_t seq_id)
{
	(void)seq_id;
	((struct fake_exec *)ctx)->n_released++;
}

static const struct exec_ops fake_ops = {.step = fake_step, .seq_release = fake_release};

int fake_exec_init(struct fake_exec *f, const struct fake_exec_options *o)
{
	memset(f, 0, sizeof(*f));
	f->opt = *o;
	f->fail_at_step = -1;
	f->bad_token_at_step = -1;
	uint32_t n_slots = o->n_state_slots ? o->n_state_slots : o->max_step_seqs;
	f->blk_state = calloc(o->n_blocks, sizeof(uint64_t));
	f->blk_last_pos = malloc(o->n_blocks * sizeof(int64_t));
	f->blk_snap_pos = malloc(o->n_blocks * sizeof(int64_t));
	f->slot_state = calloc(n_slots, sizeof(uint64_t));
	f->slot_seq = calloc(n_slots, sizeof(uint64_t));
	f->slot_pos = calloc(n_slots, sizeof(int64_t));
	f->logits = malloc(o->vocab * sizeof(float));
	f->work = malloc(kern_sample_workspace_bytes(o->vocab));
	if (!f->blk_state || !f->blk_last_pos || !f->blk_snap_pos || !f->slot_state || !f->slot_seq || !f->slot_pos ||
	    !f->logits || !f->work)
		return -1;
	for (uint32_t i = 0; i < o->n_blocks; i++)
		f->blk_last_pos[i] = f->blk_snap_pos[i] = -1;
	f->ex.ops = &fake_ops;
	f->ex.ctx = f;
	f->ex.info = (struct exec_info){
		.mix = fake_layer_mix(o->block_tokens),
		.block_tokens = o->block_tokens,
		.n_blocks = o->n_blocks,
		.n_state_slots = o->block_mode ? 0 : n_slots,
		.vocab_size = o->vocab,
		.eos_token_id = o->eos_token_id,
		.max_step_tokens = o->max_step_tokens,
		.max_step_seqs = o->max_step_seqs,
		.max_model_len = o->max_model_len,
	};
	return 0;
}

void fake_exec_fini(struct fake_exec *f)
{
	free(f->blk_state);
	free(f->blk_last_pos);
	free(f->blk_snap_pos);
	free(f->slot_state);
	free(f->slot_seq);
	free(f->slot_pos);
	free(f->logits);
	free(f->work);
	free(f->records);
	memset(f, 0, sizeof(*f));
}

uint32_t fake_reference(const struct fake_exec_options *o, const int32_t *prompt, uint32_t n_prompt,
			const struct kern_sampling_params *sp, uint32_t max_tokens, bool ignore_eos,
			const int32_t *stop_ids, uint32_t n_stop_ids, uint32_t max_model_len, int32_t *out,
			int32_t *stopped_by)
{
	return fake_reference_min(o, prompt, n_prompt, sp, max_tokens, 0, ignore_eos, stop_ids, n_stop_ids,
				  max_model_len, out, stopped_by);
}

uint32_t fake_reference_min(const struct fake_exec_options *o, const int32_t *prompt, uint32_t n_prompt,
			    const struct kern_sampling_params *sp_in, uint32_t max_tokens, uint32_t min_tokens,
			    bool ignore_eos, const int32_t *stop_ids, uint32_t n_stop_ids, uint32_t max_model_len,
			    int32_t *out, int32_t *stopped_by)
{
	struct kern_logit_bias masked[400];
	struct kern_sampling_params sp_min = *sp_in;
	uint32_t nb = 0;
	for (uint32_t i = 0; i < sp_in->n_logit_bias; i++)
		masked[nb++] = sp_in->logit_bias[i];
	for (uint32_t i = 0; i < n_stop_ids; i++)
		masked[nb++] = (struct kern_logit_bias){stop_ids[i], -INFINITY};
	if (!ignore_eos)
		masked[nb++] = (struct kern_logit_bias){o->eos_token_id, -INFINITY};
	sp_min.logit_bias = masked;
	sp_min.n_logit_bias = nb;
	float *l = malloc(o->vocab * sizeof(float));
	void *work = malloc(kern_sample_workspace_bytes(o->vocab));
	uint64_t h = state_init(o);
	uint32_t pos = 0, n = 0;
	for (; pos < n_prompt; pos++)
		h = state_next(h, prompt[pos], pos);
	*stopped_by = -1;
	while (n < max_tokens && n_prompt + n < max_model_len) {
		make_logits(o, h, l);
		struct kern_sample_history hist = {prompt, n_prompt, out, n};
		struct kern_sample_out so;
		const struct kern_sampling_params *sp = n < min_tokens ? &sp_min : sp_in;
		if (kern_sample_ref(l, o->vocab, sp, &hist, n, work, &so))
			break;
		out[n++] = so.token_id;
		bool stop = n > min_tokens && !ignore_eos && so.token_id == o->eos_token_id;
		for (uint32_t i = 0; i < n_stop_ids && n > min_tokens; i++)
			stop |= so.token_id == stop_ids[i];
		if (stop) {
			*stopped_by = so.token_id;
			break;
		}
		h = state_next(h, so.token_id, pos++);
	}
	free(l);
	free(work);
	return n;
}

uint32_t fake_detok(void *ctx, int32_t token_id, bool keep_special, char *buf, uint32_t cap)
{
	(void)ctx;
	(void)keep_special;
	if (cap < 3)
		return 0;
	if (token_id % 17 == 5) {
		buf[0] = (char)0xC3;
		return 1;
	}
	if (token_id % 17 == 6) {
		buf[0] = (char)0xA9;
		return 1;
	}
	uint64_t x = mix64((uint64_t)token_id * 7919u + 17);
	uint32_t n = 1 + (uint32_t)(x % 3);
	for (uint32_t i = 0; i < n; i++)
		buf[i] = "abcd"[(x >> (8 + 2 * i)) & 3];
	return n;
}
