/*
 * scheduler/plan.c: one step: plan (decodes, running prefills, admissions),
 * run it on the executor, then process the samples (stop checks, events,
 * prefix-cache publication, forks of n > 1 parents).
 *
 * Planning order (serving.md 3.3): every running decode first, each taking a
 * new block when it crosses a block boundary and preempting the newest
 * running sequence when none is free; then running prefills in admission
 * order; then waiting sequences in queue order, each admitted only when the
 * blocks for all its known tokens (minus prefix-cache hits) are free. Any
 * prefill is chunked to what is left of max_num_batched_tokens.
 */
#include "sched_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "model/gram.h"

static inline uint32_t blocks_for(const struct sched *s, uint32_t tokens)
{
	return (tokens + s->B - 1) / s->B;
}

static bool seq_push_block(struct sched__seq *q, uint32_t id)
{
	if (q->n_blocks == q->cap_blocks) {
		uint32_t c = q->cap_blocks ? q->cap_blocks * 2 : 8;
		uint32_t *b = realloc(q->blocks, (size_t)c * sizeof(*b));
		if (!b)
			return false;
		q->blocks = b;
		q->cap_blocks = c;
	}
	q->blocks[q->n_blocks++] = id;
	return true;
}

/* Hash of full block k of q, computing the chain up to it on demand. */
static bool seq_hash_upto(struct sched *s, struct sched__seq *q, uint32_t n_full)
{
	if (!sched__seq_reserve_hashes(q, n_full))
		return false;
	for (uint32_t k = q->n_hashes; k < n_full; k++) {
		struct sched_block_hash parent = k ? q->hashes[k - 1] : sched_block_hash_root(q->req->salt);
		q->hashes[k] = sched_block_hash_next(parent, q->tokens + (size_t)k * s->B, s->B);
	}
	if (n_full > q->n_hashes)
		q->n_hashes = n_full;
	return true;
}

/* Recompute preemption: q gives back all its blocks and waits again. */
void sched__preempt(struct sched *s, struct sched__seq *q)
{
	sched__running_remove(s, q);
	sched__release_blocks(s, q);
	q->n_computed = 0;
	q->n_drafts = 0; /* proposed for the token after its last one: stale after the recompute */
	s->st.n_preemptions++;
	q->req->timing.n_preemptions++;
	log_msg(LOG_DEBUG, "sched", "request %" PRIu64 " choice %d preempted at %u tokens", q->req->id,
		q->choice == SCHED__PARENT ? -1 : (int)q->choice, q->n_tokens);
	if (!sched__waiting_insert(s, q))
		sched__finish_seq(s, q, SCHED_FINISH_ERROR, -1, -1, time_mono_s());
}

/* ---- Admission ---- */

/* Admit the waiting head q if its blocks fit; false leaves everything unchanged. */
static bool admit(struct sched *s, struct sched__seq *q, double now)
{
	struct sched__req *r = q->req;
	uint32_t n_hit = 0, n_hit_free = 0;
	if (!s->opt.disable_prefix_caching) {
		/* At least one token is recomputed so that the last one yields logits;
		 * a parent samples nothing and may be served entirely from cache. */
		uint32_t max_hit = q->choice == SCHED__PARENT ? q->n_target / s->B : (q->n_target - 1) / s->B;
		/* prompt logprobs: the cache may not skip a row still to be scored */
		if (r->plp && max_hit > r->plp_rows / s->B)
			max_hit = r->plp_rows / s->B;
		if (!seq_hash_upto(s, q, max_hit))
			return false;
		while (n_hit < max_hit) {
			uint32_t id = sched_blocks_lookup(&s->bm, q->hashes[n_hit]);
			if (id == SCHED_BLOCK_NONE)
				break;
			n_hit_free += s->bm.b[id].in_free;
			n_hit++;
		}
	}
	uint32_t need = blocks_for(s, q->n_target) - n_hit;
	if (sched_blocks_n_free(&s->bm) - n_hit_free < need)
		return false;
	for (uint32_t k = 0; k < n_hit; k++) {
		uint32_t id = sched_blocks_lookup(&s->bm, q->hashes[k]);
		sched_blocks_ref(&s->bm, id);
		if (!seq_push_block(q, id)) {
			sched_blocks_release(&s->bm, id);
			sched__release_blocks(s, q);
			return false;
		}
	}
	for (uint32_t k = 0; k < need; k++) {
		uint32_t id = sched_blocks_alloc(&s->bm);
		CHECK(id != SCHED_BLOCK_NONE);
		if (!seq_push_block(q, id)) {
			sched_blocks_release(&s->bm, id);
			sched__release_blocks(s, q);
			return false;
		}
	}
	q->n_computed = n_hit * s->B;
	if (!s->opt.disable_prefix_caching) {
		s->st.prefix_cache_queries_tokens += q->n_target;
		s->st.prefix_cache_hits_tokens += (uint64_t)n_hit * s->B;
	}
	if (!r->looked_up) {
		r->looked_up = true;
		r->n_cached_tokens = q->n_computed < r->n_prompt ? q->n_computed : r->n_prompt;
	}
	if (r->timing.first_scheduled_s == 0.0) {
		r->timing.first_scheduled_s = now;
		s->n_unscheduled_reqs--;
	}
	memmove(s->waiting, s->waiting + 1, (size_t)(s->n_waiting - 1) * sizeof(*s->waiting));
	s->n_waiting--;
	if (!sched__running_append(s, q)) {
		sched__release_blocks(s, q);
		q->n_computed = 0;
		sched__waiting_insert(s, q);
		return false;
	}
	return true;
}

/* The parent of an n > 1 request has computed the shared full blocks: create
 * the children on top of them. A child that does not fit now (sequence limit
 * or blocks) waits without blocks and later finds the prefix in the cache
 * (or recomputes it when caching is off). */
static void fork_parent(struct sched *s, struct sched__seq *parent, double now)
{
	struct sched__req *r = parent->req;
	/* The parent leaves the running list (and its slot) first; it keeps its
	 * blocks until every child holds its own references. */
	sched__running_remove(s, parent);
	parent->state = SEQ_DONE;
	for (uint32_t i = 0; i < r->n; i++) {
		if (r->finished[i] || r->seqs[i])
			continue;
		struct sched__seq *c = sched__seq_new(s, r, i, r->n_prompt);
		if (!c || !sched__seq_reserve_hashes(c, parent->n_hashes)) {
			sched__seq_free(c);
			continue; /* leaves the choice unfinished; the request aborts below */
		}
		if (parent->n_hashes)
			memcpy(c->hashes, parent->hashes, (size_t)parent->n_hashes * sizeof(*c->hashes));
		c->n_hashes = parent->n_hashes;
		r->seqs[i] = c;
		uint32_t extra = blocks_for(s, c->n_target) - parent->n_blocks;
		bool fits = s->n_running < s->opt.max_num_seqs && sched_blocks_n_free(&s->bm) >= extra;
		bool ok = fits;
		for (uint32_t k = 0; ok && k < parent->n_blocks; k++) {
			sched_blocks_ref(&s->bm, parent->blocks[k]);
			ok = seq_push_block(c, parent->blocks[k]);
			if (!ok)
				sched_blocks_release(&s->bm, parent->blocks[k]);
		}
		for (uint32_t k = 0; ok && k < extra; k++) {
			uint32_t id = sched_blocks_alloc(&s->bm);
			ok = id != SCHED_BLOCK_NONE && seq_push_block(c, id);
			if (!ok && id != SCHED_BLOCK_NONE)
				sched_blocks_release(&s->bm, id);
		}
		if (ok && sched__running_append(s, c)) {
			c->n_computed = parent->n_computed;
			continue;
		}
		sched__release_blocks(s, c);
		c->n_computed = 0;
		if (!sched__waiting_insert(s, c))
			sched__finish_seq(s, c, SCHED_FINISH_ERROR, -1, -1, now);
	}
	sched__finish_seq(s, parent, SCHED_FINISH_NONE, -1, -1, now);
	bool lost = false;
	for (uint32_t i = 0; i < r->n; i++)
		lost |= !r->finished[i] && !r->seqs[i];
	if (lost) {
		log_msg(LOG_ERROR, "sched", "request %" PRIu64 ": out of memory forking %u choices", r->id, r->n);
		sched_abort(s, r->id, SCHED_FINISH_ERROR);
	}
}

/* ---- Sample processing ---- */

static bool is_stop_token(const struct sched__req *r, int32_t tok, int32_t eos)
{
	if (!r->ignore_eos && eos >= 0 && tok == eos)
		return true;
	for (uint32_t i = 0; i < r->n_stop_ids; i++)
		if (r->stop_ids[i] == tok)
			return true;
	return false;
}

/* Returns true when q finished (it is freed then). */
static bool process_sample(struct sched *s, struct sched__seq *q, const struct kern_sample_out *so, double now)
{
	struct sched__req *r = q->req;
	int32_t tok = so->token_id;
	if (r->score_only) {
		/* echo with max_tokens 0: the prompt was the point; the sample is dropped */
		sched__finish_seq(s, q, SCHED_FINISH_LENGTH, -1, -1, now);
		return true;
	}
	if (q->gs && gram_state_accept_token(q->gs, tok) != ST_OK) {
		/* the executor chose a token outside the mask (a scripted test
		 * executor; the empty-mask guard's eos): the choice goes on unconstrained */
		log_msg(LOG_WARN, "sched", "request %" PRIu64 ": token %d is outside its grammar; the rest is unconstrained",
			r->id, tok);
		gram_state_destroy(q->gs);
		q->gs = NULL;
	}
	if (!sched__seq_push_token(q, tok)) {
		sched__finish_seq(s, q, SCHED_FINISH_ERROR, -1, -1, now);
		return true;
	}
	q->n_target = q->n_tokens;
	s->st.generation_tokens++;
	if (r->timing.first_token_s == 0.0)
		r->timing.first_token_s = now;
	uint32_t n_out = q->n_tokens - r->n_prompt;
	/* The first min_tokens tokens were sampled with the stop ids masked (so a
	 * stop id there is an ordinary token); stop strings are matched from the
	 * token that reaches min_tokens on, as vLLM does. */
	bool stop_tok = n_out > r->min_tokens && is_stop_token(r, tok, s->ex->info.eos_token_id);
	bool length = n_out >= r->max_tokens || q->n_tokens >= s->opt.max_model_len;
	int32_t stop_str = -1;
	struct sched_event ev = {.kind = SCHED_EV_TOKEN, .choice = q->choice, .token_id = tok, .time_s = now,
				 .sample = *so, .stop_token_id = -1, .stop_string_index = -1};
	if (s->opt.detokenize) {
		char buf[SCHED_MAX_TOKEN_BYTES];
		uint32_t nb = stop_tok ? 0 : s->opt.detokenize(s->opt.detok_ctx, tok, r->keep_special, buf, sizeof(buf));
		if (nb > sizeof(buf))
			nb = sizeof(buf);
		bool nomem = false;
		const struct sched_stop_set *set = n_out >= r->min_tokens ? &r->stops : NULL;
		stop_str = sched_stop_feed(&q->stop, set, buf, nb, stop_tok || length, &ev.text, &ev.text_bytes, &nomem);
		if (!nomem && stop_str >= 0 && r->include_stop_str) {
			uint32_t L = r->stops.lens[stop_str];
			char *t = realloc(ev.text, (size_t)ev.text_bytes + L + 1);
			if (t) {
				memcpy(t + ev.text_bytes, r->stops.strs[stop_str], L);
				ev.text_bytes += L;
				t[ev.text_bytes] = 0;
				ev.text = t;
			}
			nomem = !t;
		}
		if (nomem) {
			sched_event_clear(&ev);
			sched__finish_seq(s, q, SCHED_FINISH_ERROR, -1, -1, now);
			return true;
		}
	}
	sched__emit(s, r, &ev);
	if (stop_tok)
		sched__finish_seq(s, q, SCHED_FINISH_STOP, tok, -1, now);
	else if (stop_str >= 0)
		sched__finish_seq(s, q, SCHED_FINISH_STOP, -1, stop_str, now);
	else if (length)
		sched__finish_seq(s, q, SCHED_FINISH_LENGTH, -1, -1, now);
	return stop_tok || stop_str >= 0 || length;
}

/* A grammar that allows no token would fail the whole step in the sampling
 * op: allow eos instead (the choice stops there) and say so once. */
static void gram_guard_mask(struct sched *s, struct sched__seq *q)
{
	uint32_t nw = (s->ex->info.vocab_size + 31) / 32, any = 0;
	for (uint32_t i = 0; i < nw && !any; i++)
		any = q->gmask[i];
	int32_t eos = s->ex->info.eos_token_id;
	if (any || eos < 0)
		return;
	q->gmask[eos >> 5] |= 1u << (eos & 31);
	char tail[256];
	uint32_t n = 0, n_out = q->n_tokens - q->req->n_prompt;
	for (uint32_t t = n_out > 64 ? q->n_tokens - 64 : q->req->n_prompt; s->opt.detokenize && t < q->n_tokens; t++)
		n += s->opt.detokenize(s->opt.detok_ctx, q->tokens[t], false, tail + n, (uint32_t)(sizeof tail - 1 - n));
	tail[n] = 0;
	log_msg(LOG_ERROR, "sched", "request %" PRIu64 ": the grammar allows no token after %u tokens (ending '%s'); "
		"stopping it", q->req->id, n_out, tail);
}

/* Publish q's newly completed blocks in the prefix cache. */
static void publish_blocks(struct sched *s, struct sched__seq *q, uint32_t old_computed)
{
	uint32_t from = old_computed / s->B, to = q->n_computed / s->B;
	if (s->opt.disable_prefix_caching || to <= from || !seq_hash_upto(s, q, to))
		return;
	for (uint32_t k = from; k < to; k++)
		sched_blocks_publish(&s->bm, q->blocks[k], q->hashes[k]);
}

/* ---- speculative decoding (docs/speculation.md) ----
 * A running decode whose executor proposed drafts verifies up to K of them
 * in its step: its query is [t, d1..dk], it takes the blocks those positions
 * need when they are free (never preempting for a draft) and k more tokens of
 * the budget. No drafts while min_tokens holds eos back (the rows would need
 * two parameter sets), for a structured-output choice (its mask follows the
 * accepted tokens), or in a step that computes prompt log-probabilities.
 * The step's answer is processed token by token exactly as plain decodes
 * would be: each accepted draft is pushed, counted as computed and its
 * completed block published before the next token is looked at, so stop
 * tokens, stop strings, max_tokens and max_model_len cut the run at the
 * same token, and the prefix cache hashes only tokens that were accepted. */

static uint32_t spec_k(const struct sched *s)
{
	uint32_t k = s->ex->info.max_draft_tokens;
	return k < EXEC_SPEC_MAX_DRAFT ? k : EXEC_SPEC_MAX_DRAFT;
}

static void spec_plan(struct sched *s, struct sched__seq *q, uint32_t *budget)
{
	struct sched__req *r = q->req;
	uint32_t K = spec_k(s), n_out = q->n_tokens - r->n_prompt;
	q->sched_draft = 0;
	if (!K || !q->n_drafts || q->sched_tokens != 1 || !q->sched_sample || q->gs || n_out < r->min_tokens)
		return;
	uint32_t nd = q->n_drafts < K ? q->n_drafts : K;
	if (nd > *budget)
		nd = *budget;
	/* the step makes at most nd + 1 tokens: no draft past max_tokens or max_model_len */
	uint32_t room = r->max_tokens > n_out + 1 ? r->max_tokens - n_out - 1 : 0;
	if (nd > room)
		nd = room;
	room = s->opt.max_model_len > q->n_tokens + 1 ? s->opt.max_model_len - q->n_tokens - 1 : 0;
	if (nd > room)
		nd = room;
	while (nd && q->n_blocks < blocks_for(s, q->n_computed + 1 + nd)) {
		uint32_t id = sched_blocks_alloc(&s->bm);
		if (id == SCHED_BLOCK_NONE)
			break;
		if (!seq_push_block(q, id)) {
			sched_blocks_release(&s->bm, id);
			break;
		}
	}
	uint32_t held = q->n_blocks * s->B - (q->n_computed + 1); /* draft positions its blocks hold */
	if (nd > held)
		nd = held;
	q->sched_draft = nd;
	q->sched_tokens += nd;
	*budget -= nd;
}

/* A step that computes prompt log-probabilities carries no drafts (model/exec.h). */
static void spec_strip(struct sched *s, uint32_t n_sched)
{
	bool plp = false;
	for (uint32_t j = 0; j < n_sched && !plp; j++) {
		const struct sched__seq *q = s->step_seq_ptr[j];
		plp = q->req->plp && q->n_computed + 1 < q->req->n_prompt;
	}
	for (uint32_t j = 0; plp && j < n_sched; j++) {
		struct sched__seq *q = s->step_seq_ptr[j];
		q->sched_tokens -= q->sched_draft;
		q->sched_draft = 0;
	}
}

/* The executor's answer for a drafting sequence must stay inside its drafts. */
static bool spec_sample_ok(const struct sched *s, const struct sched__seq *q, const struct exec_sample *sm)
{
	uint32_t V = s->ex->info.vocab_size;
	if (sm->n_extra > q->sched_draft || (spec_k(s) && sm->n_next_draft > spec_k(s)))
		return false;
	for (uint32_t i = 0; i < sm->n_extra; i++)
		if (sm->extra[i].token_id < 0 || (uint32_t)sm->extra[i].token_id >= V)
			return false;
	for (uint32_t i = 0; spec_k(s) && i < sm->n_next_draft; i++)
		if (sm->next_draft[i] < 0 || (uint32_t)sm->next_draft[i] >= V)
			return false;
	return true;
}

/* The tokens of one sampled sequence, in order; returns true when q finished. */
static bool spec_process(struct sched *s, struct sched__seq *q, const struct exec_sample *sm, double now)
{
	uint32_t n_new = 1 + (q->sched_draft ? sm->n_extra : 0);
	if (q->sched_draft) {
		s->st.spec_num_drafts++;
		s->st.spec_num_draft_tokens += q->sched_draft;
		s->st.spec_num_accepted_tokens += sm->n_extra;
		for (uint32_t i = 0; i < sm->n_extra; i++)
			s->st.spec_accepted_per_pos[i]++;
	}
	for (uint32_t i = 0; i < n_new; i++) {
		if (process_sample(s, q, i ? &sm->extra[i - 1] : &sm->out, now))
			return true;
		if (i + 1 < n_new) {
			/* an accepted draft: the step computed it */
			uint32_t old = q->n_computed++;
			publish_blocks(s, q, old);
		}
	}
	/* blocks taken for rejected drafts go back */
	uint32_t need = blocks_for(s, q->n_tokens);
	while (q->n_blocks > need)
		sched_blocks_release(&s->bm, q->blocks[--q->n_blocks]);
	q->n_drafts = 0;
	if (spec_k(s) && !q->gs) {
		q->n_drafts = sm->n_next_draft;
		memcpy(q->drafts, sm->next_draft, sm->n_next_draft * sizeof(int32_t));
	}
	return false;
}

/* ---- The step ---- */

static void schedule_chunk(struct sched *s, struct sched__seq *q, uint32_t *budget, uint32_t *n_sched)
{
	uint32_t pending = q->n_target - q->n_computed;
	uint32_t chunk = pending < *budget ? pending : *budget;
	if (!chunk || q->sched_tokens)
		return;
	q->sched_tokens = chunk;
	q->sched_sample = q->choice != SCHED__PARENT && q->n_computed + chunk == q->n_target;
	*budget -= chunk;
	s->step_seq_ptr[(*n_sched)++] = q;
}

/* Whom to preempt: under FCFS the newest admitted sequence (vLLM); under the
 * priority policy the lowest priority (largest value), latest arrival first. */
static uint32_t victim_index(const struct sched *s)
{
	uint32_t best = s->n_running - 1;
	if (s->opt.policy != SCHED_POLICY_PRIORITY)
		return best;
	for (uint32_t i = s->n_running; i-- > 0;) {
		const struct sched__req *a = s->running[i]->req, *b = s->running[best]->req;
		if (a->priority > b->priority || (a->priority == b->priority && a->order > b->order))
			best = i;
	}
	return best;
}

/* Take an already scheduled sequence out of the step being planned. */
static void unschedule(struct sched *s, struct sched__seq *q, uint32_t *budget, uint32_t *n_sched)
{
	for (uint32_t j = 0; j < *n_sched; j++)
		if (s->step_seq_ptr[j] == q) {
			memmove(s->step_seq_ptr + j, s->step_seq_ptr + j + 1, (*n_sched - j - 1) * sizeof(*s->step_seq_ptr));
			(*n_sched)--;
			*budget += q->sched_tokens;
			q->sched_tokens = 0;
			q->sched_draft = 0;
			q->sched_sample = false;
			return;
		}
}

static uint32_t plan(struct sched *s, double now)
{
	uint32_t budget = s->opt.max_num_batched_tokens, n_sched = 0;
	for (uint32_t i = 0; i < s->n_running; i++)
		s->running[i]->sched_tokens = s->running[i]->sched_draft = 0;

	/* 1. decodes */
	for (uint32_t i = 0; i < s->n_running && budget; i++) {
		struct sched__seq *q = s->running[i];
		if (q->n_target - q->n_computed != 1)
			continue;
		bool preempted_self = false;
		while (q->n_blocks < blocks_for(s, q->n_target)) {
			uint32_t id = sched_blocks_alloc(&s->bm);
			if (id != SCHED_BLOCK_NONE) {
				if (!seq_push_block(q, id)) {
					sched_blocks_release(&s->bm, id);
					sched__preempt(s, q);
					preempted_self = true;
					break;
				}
				continue;
			}
			uint32_t v = victim_index(s);
			struct sched__seq *victim = s->running[v];
			if (victim->sched_tokens) /* priority policy: may be older and already scheduled */
				unschedule(s, victim, &budget, &n_sched);
			sched__preempt(s, victim);
			if (victim == q) {
				preempted_self = true;
				break;
			}
			if (v < i)
				i--; /* q moved down one slot */
		}
		if (preempted_self) {
			i--; /* q left the list; the next one moved into slot i */
			continue;
		}
		schedule_chunk(s, q, &budget, &n_sched);
		spec_plan(s, q, &budget);
	}
	/* 2. running prefills */
	for (uint32_t i = 0; i < s->n_running && budget; i++)
		schedule_chunk(s, s->running[i], &budget, &n_sched);
	/* 3. admissions */
	while (s->n_waiting && budget && s->n_running < s->opt.max_num_seqs) {
		struct sched__seq *q = s->waiting[0];
		if (!admit(s, q, now))
			break;
		if (q->choice == SCHED__PARENT && q->n_computed == q->n_target) {
			uint32_t first_new = s->n_running - 1; /* q's slot; children append after it */
			fork_parent(s, q, now);
			for (uint32_t i = first_new; i < s->n_running && budget; i++)
				schedule_chunk(s, s->running[i], &budget, &n_sched);
			continue;
		}
		schedule_chunk(s, q, &budget, &n_sched);
	}
	return n_sched;
}

static bool build_step(struct sched *s, uint32_t n_sched, struct exec_step *st)
{
	uint32_t n_tok = 0, n_bid = 0, n_sample = 0;
	for (uint32_t j = 0; j < n_sched; j++)
		n_bid += s->step_seq_ptr[j]->n_blocks;
	if (n_bid > s->cap_block_ids) {
		uint32_t c = s->cap_block_ids;
		while (c < n_bid)
			c *= 2;
		uint32_t *p = realloc(s->step_block_ids, (size_t)c * sizeof(*p));
		if (!p)
			return false;
		s->step_block_ids = p;
		s->cap_block_ids = c;
	}
	n_bid = 0;
	for (uint32_t j = 0; j < n_sched; j++) {
		struct sched__seq *q = s->step_seq_ptr[j];
		struct sched__req *r = q->req;
		struct exec_seq *es = &s->step_seqs[j];
		s->step_query_start[j] = n_tok;
		uint32_t n_known = q->sched_tokens - q->sched_draft; /* then the drafts */
		for (uint32_t t = 0; t < q->sched_tokens; t++) {
			s->step_tokens[n_tok] = t < n_known ? q->tokens[q->n_computed + t] : q->drafts[t - n_known];
			s->step_positions[n_tok] = (int32_t)(q->n_computed + t);
			n_tok++;
		}
		*es = (struct exec_seq){
			.seq_id = q->seq_id,
			.n_cached_tokens = q->n_computed,
			.n_context_tokens = q->n_computed + q->sched_tokens,
			.n_blocks = blocks_for(s, q->n_computed + q->sched_tokens),
			.block_table_start = n_bid,
			.state_slot = q->slot,
			.restore_state = q->slot_fresh,
			.sample = q->sched_sample,
			.n_draft = q->sched_draft,
			.has_next_token = q->n_computed + n_known < q->n_tokens,
			.next_token = q->n_computed + n_known < q->n_tokens ? q->tokens[q->n_computed + n_known] : -1,
		};
		memcpy(s->step_block_ids + n_bid, q->blocks, (size_t)es->n_blocks * sizeof(uint32_t));
		n_bid += es->n_blocks;
		if (r->plp && q->n_computed + 1 < r->n_prompt) {
			es->prompt_lp = r->plp;
			es->prompt_ids = r->prompt;
			es->n_prompt = r->n_prompt;
		}
		if (q->sched_sample) {
			bool below_min = q->n_tokens - r->n_prompt < r->min_tokens;
			es->sampling = below_min ? &q->sampling_min : &q->sampling;
			if (q->gs) {
				/* structured outputs: the tokens the grammar allows now; once
				 * the output is complete min_tokens no longer holds eos back */
				gram_state_fill_mask(q->gs, q->gmask);
				gram_guard_mask(s, q);
				q->sampling_g = gram_state_is_complete(q->gs) ? q->sampling : *es->sampling;
				q->sampling_g.allow_mask = q->gmask;
				es->sampling = &q->sampling_g;
			}
			es->prompt_ids = r->prompt;
			es->n_prompt = r->n_prompt;
			es->output_ids = q->tokens + r->n_prompt;
			es->n_output = q->n_tokens - r->n_prompt;
			n_sample++;
		}
	}
	s->step_query_start[n_sched] = n_tok;
	*st = (struct exec_step){
		.n_tokens = n_tok,
		.token_ids = s->step_tokens,
		.positions = s->step_positions,
		.n_seqs = n_sched,
		.seqs = s->step_seqs,
		.query_start = s->step_query_start,
		.block_ids = s->step_block_ids,
		.n_block_ids = n_bid,
		.n_sample = n_sample,
	};
	return true;
}

/* An executor failure: every request with a sequence in the step ends with an error. */
static void fail_step(struct sched *s, uint32_t n_sched)
{
	uint64_t *ids = malloc((size_t)n_sched * sizeof(uint64_t));
	for (uint32_t j = 0; j < n_sched; j++) {
		if (ids)
			ids[j] = s->step_seq_ptr[j]->req->id;
		else
			sched__finish_seq(s, s->step_seq_ptr[j], SCHED_FINISH_ERROR, -1, -1, time_mono_s());
	}
	for (uint32_t j = 0; ids && j < n_sched; j++)
		sched_abort(s, ids[j], SCHED_FINISH_ERROR); /* ST_NOTFOUND for repeats: fine */
	free(ids);
}

enum status sched_step(struct sched *s, uint32_t *n_tokens_out, struct err *e)
{
	double now = time_mono_s();
	if (n_tokens_out)
		*n_tokens_out = 0;
	sched__check_deadlines(s, now);
	uint32_t n_sched = plan(s, now);
	if (!n_sched) {
		sched__publish_stats(s);
		return ST_OK;
	}
	struct exec_step st;
	spec_strip(s, n_sched);
	if (spec_k(s))
		memset(s->step_samples, 0, n_sched * sizeof(*s->step_samples));
	if (!build_step(s, n_sched, &st)) {
		fail_step(s, n_sched);
		sched__publish_stats(s);
		return err_set(e, ST_NOMEM, "sched: out of memory building a step");
	}
	enum status rc = s->ex->ops->step(s->ex->ctx, &st, s->step_samples, e);
	if (rc) {
		log_msg(LOG_ERROR, "sched", "executor step failed (%s): %s; aborting %u sequences", status_str(rc),
			e ? e->msg : "", n_sched);
		fail_step(s, n_sched);
		sched__publish_stats(s);
		return rc;
	}
	/* The executor's answer must name the sampling sequences in order with
	 * valid ids; anything else is an executor failure, not a crash. */
	for (uint32_t j = 0, k = 0; j < n_sched; j++) {
		if (!s->step_seqs[j].sample)
			continue;
		const struct exec_sample *sm = &s->step_samples[k++];
		if (sm->seq_index != j || sm->out.token_id < 0 || (uint32_t)sm->out.token_id >= s->ex->info.vocab_size ||
		    !spec_sample_ok(s, s->step_seq_ptr[j], sm)) {
			log_msg(LOG_ERROR, "sched", "executor returned sample %u for sequence %u, token %d (vocab %u)", k - 1,
				sm->seq_index, sm->out.token_id, s->ex->info.vocab_size);
			fail_step(s, n_sched);
			sched__publish_stats(s);
			return err_set(e, ST_INVALID, "sched: the executor returned an invalid sample");
		}
	}
	now = time_mono_s();
	for (uint32_t j = 0; j < n_sched; j++) {
		struct sched__seq *q = s->step_seq_ptr[j];
		uint32_t old = q->n_computed, adv = q->sched_tokens - q->sched_draft; /* accepted drafts: spec_process */
		q->n_computed += adv;
		q->slot_fresh = false;
		uint32_t last_known = q->n_tokens - 1; /* a decode's one token is the last sampled one */
		s->st.prefill_computed_tokens += adv - (q->sched_sample && old == last_known);
		publish_blocks(s, q, old);
	}
	/* Prompt logprobs: rows up to each scheduled sequence's new n_computed
	 * are scored (prefix hits never start past plp_rows); once all
	 * n_prompt - 1 are, the entries go out in one event, before any token. */
	for (uint32_t j = 0; j < n_sched; j++) {
		struct sched__seq *q = s->step_seq_ptr[j];
		struct sched__req *r = q->req;
		if (!r->plp)
			continue;
		uint32_t rows = q->n_computed < r->n_prompt - 1 ? q->n_computed : r->n_prompt - 1;
		if (rows > r->plp_rows)
			r->plp_rows = rows;
		if (r->plp_rows < r->n_prompt - 1)
			continue;
		struct sched_event ev = {.kind = SCHED_EV_PROMPT_LOGPROBS, .choice = 0, .token_id = -1, .time_s = now,
					 .prompt_lp = r->plp, .n_prompt_tokens = r->n_prompt, .stop_token_id = -1,
					 .stop_string_index = -1};
		r->plp = NULL;
		r->plp_rows = r->n_prompt;
		sched__emit(s, r, &ev);
	}
	/* Samples come back in batch order; seqs may finish (and requests free)
	 * below, so nothing reads step_seq_ptr[j] after its own sample. */
	uint32_t k = 0;
	for (uint32_t j = 0; j < n_sched; j++) {
		struct sched__seq *q = s->step_seq_ptr[j];
		if (q->choice == SCHED__PARENT) {
			if (q->n_computed == q->n_target)
				fork_parent(s, q, now);
			continue;
		}
		if (!q->sched_sample)
			continue;
		struct sched__req *r = q->req;
		spec_process(s, q, &s->step_samples[k++], now);
		sched__req_maybe_free(s, r);
	}
	s->st.n_steps++;
	s->st.last_step_tokens = st.n_tokens;
	s->st.iter_tokens_sum += st.n_tokens;
	uint32_t b = 0;
	while (b < SCHED_ITER_BUCKETS - 1 && st.n_tokens > sched_iter_bucket_le[b])
		b++;
	s->st.iter_tokens_count[b]++;
	sched__publish_stats(s);
	if (n_tokens_out)
		*n_tokens_out = st.n_tokens;
	return ST_OK;
}
