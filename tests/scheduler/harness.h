/*
 * tests/scheduler/harness.h: shared set-up for the scheduler tests: a fake
 * executor plus a core scheduler, an event collector per request, and a
 * comparison of what was collected against fake_reference().
 */
#ifndef DSV4_TESTS_SCHEDULER_HARNESS_H
#define DSV4_TESTS_SCHEDULER_HARNESS_H

#include <stdlib.h>
#include <string.h>

#include "fake_exec.h"
#include "scheduler/scheduler.h"
#include "tests/test.h"

#define H_MAX_OUT 2048
#define H_MAX_N 8

struct h_choice {
	int32_t toks[H_MAX_OUT];
	uint32_t n;
	char text[4 * H_MAX_OUT + 1];
	uint32_t n_text;
	bool finished;
	struct sched_event fin;
	bool logprob_seen;
};

struct h_req {
	uint64_t id;
	struct h_choice ch[H_MAX_N];
	uint32_t n_events;
	bool bad_order; /* an event after FINISH */
	/* what was submitted, for the reference */
	int32_t *prompt;
	uint32_t n_prompt, n, max_tokens, min_tokens;
	struct kern_sampling_params sp; /* the fake executor's reference takes the op's arguments */
	struct sched_logit_bias req_bias[4]; /* sp's logit_bias in the scheduler's terms (h_params) */
	bool ignore_eos;
	int32_t stop_ids[4];
	uint32_t n_stop_ids;
	bool aborted;
};

static void h_on_event(void *user, struct sched_event *ev)
{
	struct h_req *r = user;
	r->n_events++;
	struct h_choice *c = &r->ch[ev->choice < H_MAX_N ? ev->choice : 0];
	if (c->finished)
		r->bad_order = true;
	if (ev->kind == SCHED_EV_TOKEN) {
		if (c->n < H_MAX_OUT)
			c->toks[c->n++] = ev->token_id;
		if (ev->text_bytes && c->n_text + ev->text_bytes < sizeof(c->text)) {
			memcpy(c->text + c->n_text, ev->text, ev->text_bytes);
			c->n_text += ev->text_bytes;
		}
		c->logprob_seen |= ev->sample.n_top > 0;
	} else {
		c->finished = true;
		c->fin = *ev;
		c->fin.text = NULL;
	}
	sched_event_clear(ev);
}

struct harness {
	struct fake_exec_options fo;
	struct fake_exec f;
	struct sched_options so;
	struct sched *s;
};

static inline struct fake_exec_options h_default_fake(void)
{
	struct fake_exec_options o = {.n_blocks = 64, .block_tokens = 16, .vocab = 256, .max_step_tokens = 64,
				      .max_step_seqs = 16, .max_model_len = 4096, .eos_token_id = 1,
				      .eos_bias = -3.0f, .model_seed = 7};
	return o;
}

static inline int h_open(struct harness *h, const struct fake_exec_options *fo, const struct sched_options *so)
{
	memset(h, 0, sizeof(*h));
	h->fo = *fo;
	if (fake_exec_init(&h->f, fo))
		return -1;
	h->so = so ? *so : (struct sched_options){0};
	struct err e = {0};
	if (sched_create(&h->s, &h->so, &h->f.ex, &e)) {
		fprintf(stderr, "sched_create: %s\n", e.msg);
		return -1;
	}
	return 0;
}

static inline void h_close(struct harness *h)
{
	sched_destroy(h->s);
	fake_exec_fini(&h->f);
}

static inline struct kern_sampling_params h_sp(float temperature, uint64_t seed)
{
	struct kern_sampling_params p = {.temperature = temperature, .top_p = 1.0f, .min_p = 0.0f,
					 .repetition_penalty = 1.0f, .seed = seed};
	return p;
}

/* The request's sampling parameters as the scheduler takes them, from the
 * sampling op's arguments the reference uses (at most 4 logit biases, into
 * bias; NULL where k has none). */
static inline struct sched_sampling h_sched_sampling(const struct kern_sampling_params *k,
						     struct sched_logit_bias *bias)
{
	struct sched_sampling s = {.temperature = k->temperature, .top_p = k->top_p, .top_k = k->top_k,
				   .min_p = k->min_p, .presence_penalty = k->presence_penalty,
				   .frequency_penalty = k->frequency_penalty,
				   .repetition_penalty = k->repetition_penalty, .seed = k->seed,
				   .logprobs = k->logprobs, .top_logprobs = k->top_logprobs};
	for (uint32_t i = 0; i < k->n_logit_bias && i < 4; i++)
		bias[i] = (struct sched_logit_bias){k->logit_bias[i].token_id, k->logit_bias[i].bias};
	s.logit_bias = k->n_logit_bias ? bias : NULL;
	s.n_logit_bias = k->n_logit_bias < 4 ? k->n_logit_bias : 4;
	return s;
}

static inline struct sched_sampling h_ssp(float temperature, uint64_t seed)
{
	struct kern_sampling_params k = h_sp(temperature, seed);
	return h_sched_sampling(&k, NULL);
}

/* A request with its own collector (freed by h_req_free). */
static inline struct h_req *h_req_new(const int32_t *prompt, uint32_t n_prompt, uint32_t n, uint32_t max_tokens,
				      struct kern_sampling_params sp)
{
	struct h_req *r = calloc(1, sizeof(*r));
	r->prompt = malloc(n_prompt * sizeof(int32_t));
	memcpy(r->prompt, prompt, n_prompt * sizeof(int32_t));
	r->n_prompt = n_prompt;
	r->n = n;
	r->max_tokens = max_tokens;
	r->sp = sp;
	return r;
}

static inline void h_req_free(struct h_req *r)
{
	if (r) {
		free(r->prompt);
		free(r);
	}
}

static inline struct sched_request_params h_params(struct h_req *r)
{
	struct sched_request_params p = {.prompt_ids = r->prompt, .n_prompt = r->n_prompt,
					 .sampling = h_sched_sampling(&r->sp, r->req_bias),
					 .has_seed = true, .max_tokens = r->max_tokens, .min_tokens = r->min_tokens, .n = r->n,
					 .ignore_eos = r->ignore_eos, .stop_token_ids = r->stop_ids,
					 .n_stop_token_ids = r->n_stop_ids, .on_event = h_on_event, .user = r};
	return p;
}

static inline enum status h_submit(struct harness *h, struct h_req *r)
{
	struct sched_request_params p = h_params(r);
	struct err e = {0};
	enum sched_refusal why;
	enum status st = sched_submit(h->s, &p, &r->id, &why, &e);
	if (st)
		fprintf(stderr, "submit refused: %s\n", e.msg);
	return st;
}

/* Step until idle (or max_steps), checking invariants after every step. */
static inline uint32_t h_run(struct harness *h, uint32_t max_steps)
{
	uint32_t steps = 0;
	while (sched_has_work(h->s) && steps < max_steps) {
		struct err e = {0};
		uint32_t nt;
		enum status st = sched_step(h->s, &nt, &e);
		T_CHECKF(st == ST_OK, "step: %s", e.msg);
		e = (struct err){0};
		st = sched_check_invariants(h->s, &e);
		T_CHECKF(st == ST_OK, "invariants after step %u: %s", steps, e.msg);
		if (st)
			break;
		steps++;
	}
	T_CHECKF(!h->f.error[0], "%s", h->f.error);
	return steps;
}

/* Compare every choice of r with fake_reference(). Returns mismatches. */
static inline int h_check_ref(struct harness *h, const struct h_req *r)
{
	int bad = 0;
	int32_t *ref = malloc(H_MAX_OUT * sizeof(int32_t));
	uint32_t mml = h->fo.max_model_len;
	if (mml > h->fo.n_blocks * h->fo.block_tokens)
		mml = h->fo.n_blocks * h->fo.block_tokens;
	for (uint32_t c = 0; c < r->n; c++) {
		struct kern_sampling_params sp = r->sp;
		sp.seed = sched_choice_seed(r->sp.seed, c);
		int32_t stopped;
		uint32_t mt = r->max_tokens ? r->max_tokens : H_MAX_OUT;
		uint32_t n = fake_reference_min(&h->fo, r->prompt, r->n_prompt, &sp, mt, r->min_tokens, r->ignore_eos,
						r->stop_ids, r->n_stop_ids, mml, ref, &stopped);
		const struct h_choice *ch = &r->ch[c];
		bool same = ch->finished && ch->n == n && !memcmp(ch->toks, ref, n * sizeof(int32_t));
		if (!same) {
			bad++;
			fprintf(stderr, "request %llu choice %u: got %u tokens (finished %d), reference %u; first diff at ",
				(unsigned long long)r->id, c, ch->n, ch->finished, n);
			uint32_t i = 0;
			while (i < n && i < ch->n && ch->toks[i] == ref[i])
				i++;
			fprintf(stderr, "%u\n", i);
		}
		enum sched_finish_reason want = stopped >= 0 ? SCHED_FINISH_STOP : SCHED_FINISH_LENGTH;
		if (ch->finished && ch->fin.finish != want) {
			bad++;
			fprintf(stderr, "request %llu choice %u: finish %s, want %s\n", (unsigned long long)r->id, c,
				sched_finish_reason_str(ch->fin.finish), sched_finish_reason_str(want));
		}
	}
	free(ref);
	return bad;
}

static inline void h_rand_tokens(int32_t *t, uint32_t n, uint32_t vocab, uint64_t *rng)
{
	for (uint32_t i = 0; i < n; i++) {
		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		t[i] = 2 + (int32_t)((*rng >> 33) % (vocab - 2)); /* never 0 (bos) or 1 (eos) */
	}
}

static inline uint64_t h_seed(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	uint64_t v = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu (DSV4_TEST_SEED to repeat)\n", (unsigned long long)v);
	return v;
}

#endif
