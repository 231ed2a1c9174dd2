/*
 * scheduler/sched.c: the core's request side: create/destroy, admission
 * checks and refusals, submit, abort, events, sequence bookkeeping and the
 * metrics snapshot. Step planning lives in plan.c.
 */
#include "sched_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model/gram.h"
#include "model/tokenizer.h"
#include "common/log.h"
#include "common/timeutil.h"

const char *sched_finish_reason_str(enum sched_finish_reason r)
{
	static const char *const names[] = {"none", "stop", "length", "abort", "timeout", "shutdown", "error"};
	return (unsigned)r < ARRAY_LEN(names) ? names[r] : "?";
}

const uint32_t sched_iter_bucket_le[SCHED_ITER_BUCKETS - 1] = {1,   8,   16,   32,   64,   128,  256,
								512, 1024, 2048, 4096, 8192, 16384};

void sched_event_clear(struct sched_event *ev)
{
	if (!ev)
		return;
	free(ev->text);
	ev->text = NULL;
	ev->text_bytes = 0;
	free(ev->prompt_lp);
	ev->prompt_lp = NULL;
}

static inline uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

struct sched_sampling sched_sampling_defaults(void)
{
	struct sched_sampling p = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
	return p;
}

_Static_assert(SCHED_MAX_TOP_LOGPROBS == KERN_SAMPLE_MAX_TOP_LOGPROBS, "the sampling op returns this many");

const struct sched_options *sched_resolved_options(const struct sched *s)
{
	return &s->opt;
}

uint32_t sched_block_tokens(const struct sched *s)
{
	return s->B;
}

uint64_t sched_choice_seed(uint64_t seed, uint32_t choice)
{
	if (!choice)
		return seed;
	uint64_t x = seed ^ ((uint64_t)choice << 32);
	return splitmix(&x);
}

/* ---- create / destroy ---- */

enum status sched_create(struct sched **out, const struct sched_options *opt, struct exec *ex, struct err *e)
{
	*out = NULL;
	if (!ex || !ex->ops || !ex->ops->step)
		return err_set(e, ST_INVALID, "sched: executor has no step op");
	const struct exec_info *in = &ex->info;
	enum status st = exec_layer_mix_check(&in->mix, in->block_tokens, e);
	if (st)
		return err_prefix(e, "sched");
	if (!in->n_blocks || !in->vocab_size || !in->max_step_tokens || !in->max_step_seqs)
		return err_set(e, ST_INVALID,
			       "sched: executor reports %u blocks, %u state slots, vocab %u, step capacity %u tokens / %u seqs",
			       in->n_blocks, in->n_state_slots, in->vocab_size, in->max_step_tokens, in->max_step_seqs);
	struct sched *s = calloc(1, sizeof(*s));
	if (!s)
		return err_set(e, ST_NOMEM, "sched: out of memory");
	s->opt = opt ? *opt : (struct sched_options){0};
	struct sched_options *o = &s->opt;
	if (!o->max_num_seqs)
		o->max_num_seqs = SCHED_DEFAULT_MAX_NUM_SEQS;
	if (o->max_num_seqs > in->max_step_seqs)
		o->max_num_seqs = in->max_step_seqs;
	if (in->n_state_slots && o->max_num_seqs > in->n_state_slots)
		o->max_num_seqs = in->n_state_slots; /* slot mode: one live-state slot per running sequence */
	if (!o->max_num_batched_tokens)
		o->max_num_batched_tokens = SCHED_DEFAULT_MAX_BATCHED_TOKENS;
	if (o->max_num_batched_tokens > in->max_step_tokens)
		o->max_num_batched_tokens = in->max_step_tokens;
	if (o->max_num_batched_tokens < o->max_num_seqs)
		o->max_num_seqs = o->max_num_batched_tokens; /* every running decode must fit a step */
	if (!o->max_queued_requests)
		o->max_queued_requests = SCHED_DEFAULT_MAX_QUEUED_REQUESTS;
	if (!o->max_model_len || (in->max_model_len && o->max_model_len > in->max_model_len))
		o->max_model_len = in->max_model_len ? in->max_model_len : UINT32_MAX;
	uint64_t cache_tokens = (uint64_t)in->n_blocks * in->block_tokens;
	if (o->max_model_len > cache_tokens) {
		log_msg(LOG_WARN, "sched", "max_model_len %u exceeds the KV cache (%" PRIu64 " tokens); using the latter",
			o->max_model_len, cache_tokens);
		o->max_model_len = (uint32_t)cache_tokens;
	}
	s->ex = ex;
	s->B = in->block_tokens;
	s->next_req_id = 1;
	s->next_seq_id = 1;
	s->seed_state = (uint64_t)(time_wall_s() * 1e9) ^ (uint64_t)(uintptr_t)s;
	uint32_t T = o->max_num_batched_tokens, N = o->max_num_seqs;
	s->cap_block_ids = 1024;
	s->step_tokens = calloc(T, sizeof(int32_t));
	s->step_positions = calloc(T, sizeof(int32_t));
	s->step_seqs = calloc(N, sizeof(*s->step_seqs));
	s->step_seq_ptr = calloc(N, sizeof(*s->step_seq_ptr));
	s->step_query_start = calloc(N + 1, sizeof(uint32_t));
	s->step_block_ids = calloc(s->cap_block_ids, sizeof(uint32_t));
	s->step_samples = calloc(N, sizeof(*s->step_samples));
	s->n_slots = in->n_state_slots;
	s->free_slots = calloc(s->n_slots ? s->n_slots : 1, sizeof(uint32_t));
	for (uint32_t i = 0; s->free_slots && i < s->n_slots; i++)
		s->free_slots[s->n_free_slots++] = s->n_slots - 1 - i;
	if (pthread_mutex_init(&s->pub_mu, NULL)) {
		free(s);
		return err_set(e, ST_NOMEM, "sched: mutex init failed");
	}
	if (!s->step_tokens || !s->step_positions || !s->step_seqs || !s->step_seq_ptr || !s->step_query_start ||
	    !s->step_block_ids || !s->step_samples || !s->free_slots || sched_blocks_init(&s->bm, in->n_blocks)) {
		sched_destroy(s);
		return err_set(e, ST_NOMEM, "sched: out of memory for %u blocks", in->n_blocks);
	}
	sched__publish_stats(s);
	*out = s;
	log_msg(LOG_INFO, "sched",
		"blocks %u x %u tokens (%" PRIu64 " bytes each), max_num_seqs %u, max_num_batched_tokens %u, "
		"max_model_len %u, prefix caching %s",
		in->n_blocks, s->B, exec_block_bytes(&in->mix, s->B, in->n_state_slots > 0), N, T, o->max_model_len,
		o->disable_prefix_caching ? "off" : "on");
	return ST_OK;
}

void sched__seq_free(struct sched__seq *q)
{
	if (!q)
		return;
	free(q->tokens);
	free(q->blocks);
	free(q->hashes);
	sched_stop_fini(&q->stop);
	gram_state_destroy(q->gs);
	free(q->gmask);
	free(q);
}

static void req_free(struct sched__req *r)
{
	if (!r)
		return;
	free(r->prompt);
	free(r->plp);
	free(r->bias);
	free(r->bias_min);
	free(r->stop_ids);
	for (uint32_t i = 0; i < r->stops.n; i++)
		free(r->stops.strs[i]);
	free(r->stops.strs);
	free(r->stops.lens);
	free(r->seqs);
	free(r->finished);
	gram_release(r->grammar);
	free(r);
}

void sched_destroy(struct sched *s)
{
	if (!s)
		return;
	while (s->reqs_head) {
		struct sched__req *r = s->reqs_head;
		s->reqs_head = r->next;
		sched__seq_free(r->parent);
		for (uint32_t i = 0; r->seqs && i < r->n; i++)
			sched__seq_free(r->seqs[i]);
		req_free(r);
	}
	free(s->running);
	free(s->waiting);
	free(s->step_tokens);
	free(s->step_positions);
	free(s->step_seqs);
	free(s->step_seq_ptr);
	free(s->step_query_start);
	free(s->step_block_ids);
	free(s->step_samples);
	free(s->free_slots);
	sched_blocks_fini(&s->bm);
	pthread_mutex_destroy(&s->pub_mu);
	free(s);
}

/* ---- admission checks ---- */

static enum sched_refusal refuse(struct err *e, enum sched_req_param *param_out, enum sched_req_param param,
			       enum sched_refusal why, enum status st, const char *msg)
{
	err_set(e, st, "%s", msg);
	if (param_out)
		*param_out = param;
	return why;
}

enum sched_refusal sched_check(const struct sched *s, const struct sched_request_params *p, struct err *e)
{
	return sched_check_param(s, p, NULL, e);
}

enum sched_refusal sched_check_param(const struct sched *s, const struct sched_request_params *p,
				     enum sched_req_param *param, struct err *e)
{
	if (param)
		*param = SCHED_PARAM_NONE;
	char m[ERR_MSG_BYTES];
	const struct sched_sampling *sp = &p->sampling;
	uint32_t n = p->n ? p->n : 1;
	uint32_t vocab = s->ex->info.vocab_size;
	if (!p->n_prompt || !p->prompt_ids)
		return refuse(e, param, SCHED_PARAM_PROMPT, SCHED_REFUSE_INVALID, ST_INVALID, "prompt is empty");
	for (uint32_t i = 0; i < p->n_prompt; i++)
		if (p->prompt_ids[i] < 0 || (uint32_t)p->prompt_ids[i] >= vocab) {
			snprintf(m, sizeof(m), "prompt token %u: id %d outside the vocabulary (%u)", i, p->prompt_ids[i], vocab);
			return refuse(e, param, SCHED_PARAM_PROMPT, SCHED_REFUSE_INVALID, ST_INVALID, m);
		}
	if (n > SCHED_MAX_N || n > s->opt.max_num_seqs) {
		snprintf(m, sizeof(m), "n = %u exceeds the limit %u", n,
			 s->opt.max_num_seqs < SCHED_MAX_N ? s->opt.max_num_seqs : SCHED_MAX_N);
		return refuse(e, param, SCHED_PARAM_N, SCHED_REFUSE_INVALID, ST_INVALID, m);
	}
	if (!(sp->temperature >= 0.0f && sp->temperature <= 100.0f))
		return refuse(e, param, SCHED_PARAM_TEMPERATURE, SCHED_REFUSE_INVALID, ST_INVALID, "temperature must be >= 0");
	if (!(sp->top_p > 0.0f && sp->top_p <= 1.0f))
		return refuse(e, param, SCHED_PARAM_TOP_P, SCHED_REFUSE_INVALID, ST_INVALID, "top_p must be in (0, 1]");
	if (!(sp->min_p >= 0.0f && sp->min_p <= 1.0f))
		return refuse(e, param, SCHED_PARAM_MIN_P, SCHED_REFUSE_INVALID, ST_INVALID, "min_p must be in [0, 1]");
	if (sp->top_k < -1)
		return refuse(e, param, SCHED_PARAM_TOP_K, SCHED_REFUSE_INVALID, ST_INVALID, "top_k must be -1, 0 or positive");
	if (!(sp->presence_penalty >= -2.0f && sp->presence_penalty <= 2.0f) ||
	    !(sp->frequency_penalty >= -2.0f && sp->frequency_penalty <= 2.0f))
		return refuse(e, param, SCHED_PARAM_PENALTY, SCHED_REFUSE_INVALID, ST_INVALID, "presence_penalty and frequency_penalty must be in [-2, 2]");
	if (!(sp->repetition_penalty > 0.0f && sp->repetition_penalty <= 100.0f))
		return refuse(e, param, SCHED_PARAM_REPETITION_PENALTY, SCHED_REFUSE_INVALID, ST_INVALID, "repetition_penalty must be > 0");
	if (sp->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
		return refuse(e, param, SCHED_PARAM_TOP_LOGPROBS, SCHED_REFUSE_INVALID, ST_INVALID, "top_logprobs must be <= 20");
	if (sp->n_logit_bias > SCHED_MAX_LOGIT_BIAS || (sp->n_logit_bias && !sp->logit_bias))
		return refuse(e, param, SCHED_PARAM_LOGIT_BIAS, SCHED_REFUSE_INVALID, ST_INVALID, "logit_bias has more than 300 entries");
	for (uint32_t i = 0; i < sp->n_logit_bias; i++) {
		const struct sched_logit_bias *b = &sp->logit_bias[i];
		if (b->token_id < 0 || (uint32_t)b->token_id >= vocab || !(b->bias >= -100.0f && b->bias <= 100.0f)) {
			snprintf(m, sizeof(m), "logit_bias entry %u: token %d / bias %g out of range", i, b->token_id,
				 (double)b->bias);
			return refuse(e, param, SCHED_PARAM_LOGIT_BIAS, SCHED_REFUSE_INVALID, ST_INVALID, m);
		}
	}
	if (p->n_stop_token_ids > SCHED_MAX_STOP_TOKEN_IDS || (p->n_stop_token_ids && !p->stop_token_ids))
		return refuse(e, param, SCHED_PARAM_STOP_TOKEN_IDS, SCHED_REFUSE_INVALID, ST_INVALID, "too many stop_token_ids");
	if (p->n_stop_strings > SCHED_MAX_STOP_STRINGS || (p->n_stop_strings && !p->stop_strings))
		return refuse(e, param, SCHED_PARAM_STOP, SCHED_REFUSE_INVALID, ST_INVALID, "too many stop strings");
	if (p->n_stop_strings && !s->opt.detokenize)
		return refuse(e, param, SCHED_PARAM_STOP, SCHED_REFUSE_INVALID, ST_UNSUPPORTED, "stop strings need a detokenizer");
	for (uint32_t i = 0; i < p->n_stop_strings; i++) {
		size_t L = p->stop_strings[i] ? strlen(p->stop_strings[i]) : 0;
		if (!L || L > SCHED_MAX_STOP_STRING_BYTES)
			return refuse(e, param, SCHED_PARAM_STOP, SCHED_REFUSE_INVALID, ST_INVALID, "stop strings must be 1..256 bytes");
		/* whole characters: the text they are matched in is (model/detok.h) */
		for (size_t k = 0, l = 0; k < L; k += l)
			if (model_utf8_classify((const uint8_t *)p->stop_strings[i] + k, L - k, &l) != 1)
				return refuse(e, param, SCHED_PARAM_STOP, SCHED_REFUSE_INVALID, ST_INVALID,
					      "stop strings must be valid UTF-8");
	}
	if (p->min_tokens && p->max_tokens && p->min_tokens > p->max_tokens)
		return refuse(e, param, SCHED_PARAM_MIN_TOKENS, SCHED_REFUSE_INVALID, ST_INVALID, "min_tokens must not exceed max_tokens");
	if (p->prompt_top_logprobs > SCHED_MAX_TOP_LOGPROBS)
		return refuse(e, param, SCHED_PARAM_PROMPT_LOGPROBS, SCHED_REFUSE_INVALID, ST_INVALID, "prompt top logprobs must be <= 20");
	if (p->grammar && (!p->gram_vocab || gram_vocab_n_tokens(p->gram_vocab) > vocab))
		return refuse(e, param, SCHED_PARAM_GRAMMAR, SCHED_REFUSE_INVALID, ST_INVALID, "a grammar needs a vocabulary no larger than the model's");
	if (p->priority && s->opt.policy == SCHED_POLICY_FCFS)
		return refuse(e, param, SCHED_PARAM_PRIORITY, SCHED_REFUSE_INVALID, ST_INVALID, "priority requires the priority scheduling policy");
	uint32_t mml = s->opt.max_model_len;
	if (p->n_prompt >= mml || (p->max_tokens && (uint64_t)p->n_prompt + p->max_tokens > mml)) {
		snprintf(m, sizeof(m),
			 "this model's maximum context length is %u tokens; the request has %u prompt tokens and asks for "
			 "%u more", mml, p->n_prompt, p->max_tokens);
		return refuse(e, param, p->n_prompt >= mml ? SCHED_PARAM_PROMPT : SCHED_PARAM_MAX_TOKENS,
			      SCHED_REFUSE_TOO_LONG, ST_INVALID, m);
	}
	return SCHED_ACCEPTED;
}

/* ---- sequences ---- */

bool sched__seq_push_token(struct sched__seq *q, int32_t tok)
{
	if (q->n_tokens == q->cap_tokens) {
		uint32_t c = q->cap_tokens ? q->cap_tokens * 2 : 64;
		int32_t *t = realloc(q->tokens, (size_t)c * sizeof(*t));
		if (!t)
			return false;
		q->tokens = t;
		q->cap_tokens = c;
	}
	q->tokens[q->n_tokens++] = tok;
	return true;
}

bool sched__seq_reserve_hashes(struct sched__seq *q, uint32_t n)
{
	if (n <= q->cap_hashes)
		return true;
	uint32_t c = q->cap_hashes ? q->cap_hashes : 8;
	while (c < n)
		c *= 2;
	struct sched_block_hash *h = realloc(q->hashes, (size_t)c * sizeof(*h));
	if (!h)
		return false;
	q->hashes = h;
	q->cap_hashes = c;
	return true;
}

struct sched__seq *sched__seq_new(struct sched *s, struct sched__req *r, uint32_t choice, uint32_t n_target)
{
	struct sched__seq *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->seq_id = s->next_seq_id++;
	q->req = r;
	q->choice = choice;
	q->cap_tokens = r->n_prompt + 16;
	q->tokens = malloc((size_t)q->cap_tokens * sizeof(int32_t));
	if (!q->tokens) {
		free(q);
		return NULL;
	}
	memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
	q->n_tokens = r->n_prompt;
	q->n_target = n_target;
	q->slot = SCHED_BLOCK_NONE;
	q->sampling = r->sampling;
	q->sampling.seed = sched_choice_seed(r->sampling.seed, choice == SCHED__PARENT ? 0 : choice);
	q->sampling_min = q->sampling;
	if (r->bias_min) {
		q->sampling_min.logit_bias = r->bias_min;
		q->sampling_min.n_logit_bias = r->sampling.n_logit_bias + r->n_stop_ids +
					       (!r->ignore_eos && s->ex->info.eos_token_id >= 0);
	}
	if (r->grammar && choice != SCHED__PARENT) {
		struct err e = {0};
		q->gmask = calloc((s->ex->info.vocab_size + 31) / 32, sizeof(uint32_t));
		if (!q->gmask || gram_state_create(&q->gs, r->grammar, r->gvocab, &e)) {
			sched__seq_free(q);
			return NULL;
		}
	}
	return q;
}

static bool ptr_array_insert(struct sched__seq ***arr, uint32_t *n, uint32_t *cap, uint32_t at, struct sched__seq *q)
{
	if (*n == *cap) {
		uint32_t c = *cap ? *cap * 2 : 64;
		struct sched__seq **p = realloc(*arr, (size_t)c * sizeof(*p));
		if (!p)
			return false;
		*arr = p;
		*cap = c;
	}
	memmove(*arr + at + 1, *arr + at, (size_t)(*n - at) * sizeof(**arr));
	(*arr)[at] = q;
	(*n)++;
	return true;
}

static bool ptr_array_remove(struct sched__seq **arr, uint32_t *n, struct sched__seq *q)
{
	for (uint32_t i = *n; i-- > 0;)
		if (arr[i] == q) {
			memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof(*arr));
			(*n)--;
			return true;
		}
	return false;
}

/* Waiting order: (priority, arrival order, choice); FCFS has priority 0 everywhere. */
static bool waits_before(const struct sched__seq *a, const struct sched__seq *b)
{
	if (a->req->priority != b->req->priority)
		return a->req->priority < b->req->priority;
	if (a->req->order != b->req->order)
		return a->req->order < b->req->order;
	return a->choice < b->choice;
}

bool sched__waiting_insert(struct sched *s, struct sched__seq *q)
{
	uint32_t at = s->n_waiting;
	while (at > 0 && waits_before(q, s->waiting[at - 1]))
		at--;
	q->state = SEQ_WAITING;
	return ptr_array_insert(&s->waiting, &s->n_waiting, &s->cap_waiting, at, q);
}

bool sched__running_append(struct sched *s, struct sched__seq *q)
{
	if ((s->n_slots && !s->n_free_slots) ||
	    !ptr_array_insert(&s->running, &s->n_running, &s->cap_running, s->n_running, q))
		return false;
	q->state = SEQ_RUNNING;
	q->slot = s->n_slots ? s->free_slots[--s->n_free_slots] : EXEC_NO_SLOT;
	q->slot_fresh = true;
	return true;
}

void sched__running_remove(struct sched *s, struct sched__seq *q)
{
	if (!ptr_array_remove(s->running, &s->n_running, q))
		return;
	if (s->n_slots)
		s->free_slots[s->n_free_slots++] = q->slot;
	q->slot = SCHED_BLOCK_NONE;
}

void sched__release_blocks(struct sched *s, struct sched__seq *q)
{
	/* Reverse order: the tail blocks go to the LRU end first, so a shared
	 * prefix outlives the suffix that only this sequence used. */
	for (uint32_t i = q->n_blocks; i-- > 0;)
		sched_blocks_release(&s->bm, q->blocks[i]);
	q->n_blocks = 0;
	if (s->ex->ops->seq_release)
		s->ex->ops->seq_release(s->ex->ctx, q->seq_id);
}

/* ---- events ---- */

void sched__emit(struct sched *s, struct sched__req *r, struct sched_event *ev)
{
	(void)s;
	ev->request_id = r->id;
	if (r->on_event)
		r->on_event(r->user, ev);
	else
		sched_event_clear(ev);
}

static void emit_finish(struct sched *s, struct sched__req *r, uint32_t choice, const struct sched__seq *q,
			enum sched_finish_reason reason, int32_t stop_tok, int32_t stop_str, double now)
{
	if (r->finished[choice])
		return;
	r->finished[choice] = true;
	r->n_unfinished--;
	if (!r->n_unfinished)
		r->timing.finish_s = now;
	s->st.n_finished[reason]++;
	struct sched_event ev = {
		.kind = SCHED_EV_FINISH,
		.choice = choice,
		.token_id = -1,
		.time_s = now,
		.finish = reason,
		.stop_token_id = stop_tok,
		.stop_string_index = stop_str,
		.n_prompt_tokens = r->n_prompt,
		.n_output_tokens = q ? q->n_tokens - r->n_prompt : 0,
		.n_cached_tokens = r->n_cached_tokens,
		.timing = r->timing,
	};
	ev.timing.finish_s = now;
	sched__emit(s, r, &ev);
}

static void seq_detach(struct sched *s, struct sched__seq *q)
{
	if (q->state == SEQ_RUNNING)
		sched__running_remove(s, q);
	else if (q->state == SEQ_WAITING)
		ptr_array_remove(s->waiting, &s->n_waiting, q);
	sched__release_blocks(s, q);
	q->state = SEQ_DONE;
}

void sched__finish_seq(struct sched *s, struct sched__seq *q, enum sched_finish_reason r, int32_t stop_tok,
		       int32_t stop_str, double now)
{
	struct sched__req *rq = q->req;
	seq_detach(s, q);
	if (q->choice == SCHED__PARENT) {
		rq->parent = NULL;
	} else {
		emit_finish(s, rq, q->choice, q, r, stop_tok, stop_str, now);
		rq->seqs[q->choice] = NULL;
	}
	sched__seq_free(q);
}

void sched__req_maybe_free(struct sched *s, struct sched__req *r)
{
	if (r->n_unfinished || r->parent)
		return;
	if (r->prev)
		r->prev->next = r->next;
	else
		s->reqs_head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	s->n_reqs--;
	s->n_unscheduled_reqs -= r->timing.first_scheduled_s == 0.0;
	req_free(r);
}

/* ---- submit / abort ---- */

/* Admission of a request: the parameter checks, then room in the queue. */
static enum sched_refusal submit_admit(const struct sched *s, const struct sched_request_params *p, struct err *e)
{
	enum sched_refusal rf = sched_check(s, p, e);
	if (rf == SCHED_ACCEPTED) {
		uint32_t n_waiting_reqs = s->n_unscheduled_reqs;
		if (n_waiting_reqs >= s->opt.max_queued_requests) {
			rf = SCHED_REFUSE_QUEUE_FULL;
			err_set(e, ST_BUSY, "the queue is full (%u requests waiting)", n_waiting_reqs);
		}
	}
	return rf;
}

/* The request's own copy of its prompt and sampling parameters (the
 * caller's buffers are not kept); false when out of memory. */
static bool req_copy_prompt_sampling(struct sched *s, struct sched__req *r, const struct sched_request_params *p,
				     uint32_t n)
{
	r->id = p->request_id ? p->request_id : s->next_req_id++;
	r->n = n;
	r->n_unfinished = n;
	r->n_prompt = p->n_prompt;
	r->prompt = malloc((size_t)p->n_prompt * sizeof(int32_t));
	r->seqs = calloc(n, sizeof(*r->seqs));
	r->finished = calloc(n, sizeof(*r->finished));
	if (!r->prompt || !r->seqs || !r->finished)
		return false;
	memcpy(r->prompt, p->prompt_ids, (size_t)p->n_prompt * sizeof(int32_t));
	/* the request's parameters become the sampling op's arguments here, once */
	const struct sched_sampling *q = &p->sampling;
	r->sampling = (struct kern_sampling_params){
		.temperature = q->temperature, .top_p = q->top_p, .top_k = q->top_k, .min_p = q->min_p,
		.presence_penalty = q->presence_penalty, .frequency_penalty = q->frequency_penalty,
		.repetition_penalty = q->repetition_penalty, .seed = q->seed, .n_logit_bias = q->n_logit_bias,
		.logprobs = q->logprobs || q->top_logprobs, .top_logprobs = q->top_logprobs};
	if (!p->has_seed)
		r->sampling.seed = splitmix(&s->seed_state);
	if (q->n_logit_bias) {
		r->bias = malloc((size_t)q->n_logit_bias * sizeof(*r->bias));
		if (!r->bias)
			return false;
		for (uint32_t i = 0; i < q->n_logit_bias; i++)
			r->bias[i] = (struct kern_logit_bias){q->logit_bias[i].token_id, q->logit_bias[i].bias};
	}
	r->sampling.logit_bias = r->bias;
	r->max_tokens = p->max_tokens ? p->max_tokens : s->opt.max_model_len - p->n_prompt;
	r->score_only = p->score_only;
	if (p->grammar) {
		r->grammar = gram_retain(p->grammar);
		r->gvocab = p->gram_vocab;
	}
	return true;
}

/* Room for the prompt log-probabilities, when asked for; false when out of memory. */
static bool req_alloc_prompt_logprobs(struct sched__req *r, const struct sched_request_params *p)
{
	if (p->prompt_logprobs) {
		/* one block: the struct, then logprob, rank, top ids, top logprobs */
		size_t np = p->n_prompt, nt = p->prompt_top_logprobs;
		r->plp = calloc(1, sizeof(*r->plp) + np * (8 + 8 * nt));
		if (!r->plp)
			return false;
		float *f = (float *)(r->plp + 1);
		r->plp->n_top = (uint32_t)nt;
		r->plp->logprob = f;
		r->plp->rank = (int32_t *)(f + np);
		r->plp->top_ids = nt ? (int32_t *)(f + 2 * np) : NULL;
		r->plp->top_logprobs = nt ? f + 2 * np + np * nt : NULL;
	}
	return true;
}

/* The request's copy of its stop conditions; with min_tokens, the logit
 * biases that hold every stop token (and EOS) off until then. False when
 * out of memory. */
static bool req_copy_stops(const struct sched *s, struct sched__req *r, const struct sched_request_params *p)
{
	r->ignore_eos = p->ignore_eos;
	if (p->n_stop_token_ids) {
		r->stop_ids = malloc((size_t)p->n_stop_token_ids * sizeof(int32_t));
		if (!r->stop_ids)
			return false;
		memcpy(r->stop_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t));
		r->n_stop_ids = p->n_stop_token_ids;
	}
	if (p->n_stop_strings) {
		r->stops.strs = calloc(p->n_stop_strings, sizeof(char *));
		r->stops.lens = calloc(p->n_stop_strings, sizeof(uint32_t));
		if (!r->stops.strs || !r->stops.lens)
			return false;
		r->stops.n = p->n_stop_strings;
		for (uint32_t i = 0; i < p->n_stop_strings; i++) {
			r->stops.strs[i] = strdup(p->stop_strings[i]);
			if (!r->stops.strs[i])
				return false;
			r->stops.lens[i] = (uint32_t)strlen(p->stop_strings[i]);
		}
	}
	r->min_tokens = p->min_tokens;
	r->include_stop_str = p->include_stop_str_in_output;
	r->keep_special = p->keep_special_tokens;
	if (p->min_tokens) {
		uint32_t nb = p->sampling.n_logit_bias, k = nb;
		r->bias_min = malloc((size_t)(nb + r->n_stop_ids + 1) * sizeof(*r->bias_min));
		if (!r->bias_min)
			return false;
		if (nb)
			memcpy(r->bias_min, r->bias, (size_t)nb * sizeof(*r->bias_min));
		for (uint32_t i = 0; i < r->n_stop_ids; i++)
			r->bias_min[k++] = (struct kern_logit_bias){r->stop_ids[i], -INFINITY};
		if (!r->ignore_eos && s->ex->info.eos_token_id >= 0)
			r->bias_min[k++] = (struct kern_logit_bias){s->ex->info.eos_token_id, -INFINITY};
	}
	return true;
}

/* The request's first sequences into the waiting queue; false when out of memory. */
static bool req_enqueue(struct sched *s, struct sched__req *r, const struct sched_request_params *p, uint32_t n)
{
	/* n > 1 with at least one full block before the last prompt token: a
	 * parent computes the shared full blocks once. */
	uint32_t shared = (p->n_prompt - 1) / s->B * s->B;
	if (n > 1 && shared > 0) {
		r->parent = sched__seq_new(s, r, SCHED__PARENT, shared);
		if (!r->parent || !sched__waiting_insert(s, r->parent))
			return false;
	} else {
		for (uint32_t i = 0; i < n; i++) {
			r->seqs[i] = sched__seq_new(s, r, i, p->n_prompt);
			if (!r->seqs[i] || !sched__waiting_insert(s, r->seqs[i]))
				return false;
		}
	}
	return true;
}

/* Undo a request that failed half-way: its sequences leave the waiting
 * queue, then the request is freed. */
static void req_unwind(struct sched *s, struct sched__req *r, uint32_t n)
{
	if (r->parent) {
		ptr_array_remove(s->waiting, &s->n_waiting, r->parent);
		sched__seq_free(r->parent);
	}
	for (uint32_t i = 0; r->seqs && i < n; i++)
		if (r->seqs[i]) {
			ptr_array_remove(s->waiting, &s->n_waiting, r->seqs[i]);
			sched__seq_free(r->seqs[i]);
		}
	req_free(r);
}

enum status sched_submit(struct sched *s, const struct sched_request_params *p, uint64_t *id_out,
			 enum sched_refusal *why, struct err *e)
{
	enum sched_refusal rf = submit_admit(s, p, e);
	if (why)
		*why = rf;
	if (rf != SCHED_ACCEPTED) {
		s->st.n_refused[rf]++;
		sched__publish_stats(s);
		return e ? e->st : ST_INVALID;
	}
	uint32_t n = p->n ? p->n : 1;
	struct sched__req *r = calloc(1, sizeof(*r));
	if (!r)
		goto nomem;
	if (!req_copy_prompt_sampling(s, r, p, n) || !req_alloc_prompt_logprobs(r, p) || !req_copy_stops(s, r, p))
		goto nomem_req;
	r->priority = p->priority;
	r->order = s->next_order++;
	r->salt = p->cache_salt;
	r->deadline_s = p->deadline_s;
	r->timing.arrival_s = p->arrival_s > 0 ? p->arrival_s : time_mono_s();
	r->on_event = p->on_event;
	r->user = p->user;
	if (!req_enqueue(s, r, p, n))
		goto nomem_req;
	r->next = s->reqs_head;
	if (s->reqs_head)
		s->reqs_head->prev = r;
	s->reqs_head = r;
	s->n_reqs++;
	s->n_unscheduled_reqs++;
	if (r->deadline_s > 0 && (s->next_deadline_s == 0 || r->deadline_s < s->next_deadline_s))
		s->next_deadline_s = r->deadline_s;
	s->st.prompt_tokens += p->n_prompt;
	if (id_out)
		*id_out = r->id;
	sched__publish_stats(s);
	return ST_OK;

nomem_req:
	req_unwind(s, r, n);
nomem:
	if (why)
		*why = SCHED_REFUSE_NOMEM;
	s->st.n_refused[SCHED_REFUSE_NOMEM]++;
	return err_set(e, ST_NOMEM, "out of memory queueing the request");
}

static void abort_req(struct sched *s, struct sched__req *r, enum sched_finish_reason reason, double now)
{
	if (r->parent)
		sched__finish_seq(s, r->parent, reason, -1, -1, now);
	for (uint32_t i = 0; i < r->n; i++) {
		if (r->seqs[i])
			sched__finish_seq(s, r->seqs[i], reason, -1, -1, now);
		else
			emit_finish(s, r, i, NULL, reason, -1, -1, now);
	}
	sched__req_maybe_free(s, r);
}

enum status sched_abort(struct sched *s, uint64_t request_id, enum sched_finish_reason reason)
{
	for (struct sched__req *r = s->reqs_head; r; r = r->next)
		if (r->id == request_id) {
			abort_req(s, r, reason, time_mono_s());
			sched__publish_stats(s);
			return ST_OK;
		}
	return ST_NOTFOUND;
}

void sched_abort_all(struct sched *s, enum sched_finish_reason reason)
{
	double now = time_mono_s();
	while (s->reqs_head)
		abort_req(s, s->reqs_head, reason, now);
	sched__publish_stats(s);
}

/* Deadlines are checked once per step, before planning. */
void sched__check_deadlines(struct sched *s, double now)
{
	/* next_deadline_s is a lower bound on the live deadlines (finished
	 * requests may leave it early: the scan then just recomputes it) */
	if (s->next_deadline_s == 0 || now < s->next_deadline_s)
		return;
	double next = 0;
	struct sched__req *r = s->reqs_head;
	while (r) {
		struct sched__req *nx = r->next;
		if (r->deadline_s > 0 && now >= r->deadline_s)
			abort_req(s, r, SCHED_FINISH_TIMEOUT, now);
		else if (r->deadline_s > 0 && (next == 0 || r->deadline_s < next))
			next = r->deadline_s;
		r = nx;
	}
	s->next_deadline_s = next;
}

bool sched_has_work(const struct sched *s)
{
	return s->n_running || s->n_waiting;
}

/* ---- stats ---- */

void sched__publish_stats(struct sched *s)
{
	struct sched_stats *st = &s->st;
	/* requests with a running sequence, counted once each: O(running) */
	uint32_t run = 0;
	s->stats_epoch++;
	for (uint32_t i = 0; i < s->n_running; i++) {
		struct sched__req *r = s->running[i]->req;
		if (r->stats_epoch != s->stats_epoch) {
			r->stats_epoch = s->stats_epoch;
			run++;
		}
	}
	st->n_requests_running = run;
	st->n_requests_waiting = s->n_reqs - run;
	st->n_seqs_running = s->n_running;
	st->n_seqs_waiting = s->n_waiting;
	st->n_blocks_total = s->bm.n;
	st->n_blocks_used = s->bm.n - s->bm.n_free;
	st->n_blocks_cached_free = s->bm.n_cached_free;
	st->kv_usage = s->bm.n ? (double)st->n_blocks_used / s->bm.n : 0.0;
	pthread_mutex_lock(&s->pub_mu);
	s->pub = *st;
	pthread_mutex_unlock(&s->pub_mu);
}

void sched_stats_get(struct sched *s, struct sched_stats *out)
{
	pthread_mutex_lock(&s->pub_mu);
	*out = s->pub;
	pthread_mutex_unlock(&s->pub_mu);
}

/* ---- invariants ---- */

static void count_refs(const struct sched__seq *q, uint32_t *ref)
{
	if (q)
		for (uint32_t i = 0; i < q->n_blocks; i++)
			ref[q->blocks[i]]++;
}

enum status sched_check_invariants(struct sched *s, struct err *e)
{
	uint32_t *ref = calloc(s->bm.n ? s->bm.n : 1, sizeof(uint32_t));
	if (!ref)
		return err_set(e, ST_NOMEM, "out of memory");
	enum status st = ST_OK;
	uint32_t n_run = 0, n_wait = 0, n_unsched = 0, n_reqs = 0;
	uint8_t *slot_used = calloc(s->n_slots ? s->n_slots : 1, 1);
	if (!slot_used) {
		free(ref);
		return err_set(e, ST_NOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < s->n_free_slots; i++)
		slot_used[s->free_slots[i]]++;
	for (struct sched__req *r = s->reqs_head; r && !st; r = r->next) {
		n_reqs++;
		n_unsched += r->timing.first_scheduled_s == 0.0;
		if (r->deadline_s > 0 && r->n_unfinished && (s->next_deadline_s == 0 || r->deadline_s < s->next_deadline_s))
			st = err_set(e, ST_INVALID, "request %" PRIu64 ": deadline %.3f before the next checked %.3f", r->id,
				     r->deadline_s, s->next_deadline_s);
		for (uint32_t i = 0; i <= r->n && !st; i++) {
			const struct sched__seq *q = i < r->n ? r->seqs[i] : r->parent;
			if (!q)
				continue;
			count_refs(q, ref);
			n_run += q->state == SEQ_RUNNING;
			if (q->state == SEQ_RUNNING && q->slot < s->n_slots)
				slot_used[q->slot]++;
			if (s->n_slots && (q->state == SEQ_RUNNING) != (q->slot != SCHED_BLOCK_NONE))
				st = err_set(e, ST_INVALID, "seq %" PRIu64 ": state %d with slot %u", q->seq_id, q->state, q->slot);
			n_wait += q->state == SEQ_WAITING;
			if (q->state == SEQ_WAITING && q->n_blocks)
				st = err_set(e, ST_INVALID, "waiting seq %" PRIu64 " holds %u blocks", q->seq_id, q->n_blocks);
			else if (q->state == SEQ_RUNNING && q->n_blocks != (q->n_target + s->B - 1) / s->B &&
				 !(q->n_target - q->n_computed == 1 && q->n_blocks == (q->n_target - 1 + s->B - 1) / s->B))
				st = err_set(e, ST_INVALID, "running seq %" PRIu64 " holds %u blocks for %u tokens",
					     q->seq_id, q->n_blocks, q->n_target);
			else if (q->n_computed > q->n_target || q->n_target > q->n_tokens)
				st = err_set(e, ST_INVALID, "seq %" PRIu64 ": computed %u target %u tokens %u", q->seq_id,
					     q->n_computed, q->n_target, q->n_tokens);
		}
	}
	if (!st && (n_reqs != s->n_reqs || n_unsched != s->n_unscheduled_reqs))
		st = err_set(e, ST_INVALID, "%u requests (%u never scheduled), counters %u (%u)", n_reqs, n_unsched,
			     s->n_reqs, s->n_unscheduled_reqs);
	if (!st && (n_run != s->n_running || n_wait != s->n_waiting))
		st = err_set(e, ST_INVALID, "running/waiting %u/%u, lists %u/%u", n_run, n_wait, s->n_running,
			     s->n_waiting);
	for (uint32_t i = 0; !st && i < s->n_slots; i++)
		if (slot_used[i] != 1)
			st = err_set(e, ST_INVALID, "state slot %u used %u times (free or running)", i, slot_used[i]);
	if (!st)
		st = sched_blocks_check(&s->bm, ref, e);
	free(slot_used);
	free(ref);
	return st;
}
