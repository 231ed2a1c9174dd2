/*
 * tests/scheduler/test_sched_core.c: the core scheduler against the fake
 * executor: admission refusals, chunked prefill budget, decode-first order,
 * prefix cache hits, LRU eviction, preemption, abort, n > 1 sharing, stop
 * handling, seed determinism, priority, deadlines, executor failures.
 */
#include <time.h>

#include "model/tokenizer.h"
#include "harness.h"

static uint64_t g_rng;

static void test_refusals(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.max_model_len = 512;
	struct sched_options so = {.max_queued_requests = 2, .max_num_seqs = 4};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[600];
	h_rand_tokens(prompt, 600, fo.vocab, &g_rng);
	struct h_req *r = h_req_new(prompt, 10, 1, 10, h_sp(0, 1));
	struct sched_request_params p = h_params(r);
	struct err e = {0};
	enum sched_refusal why;
	uint64_t id;

	p.n_prompt = 0;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) == ST_INVALID && why == SCHED_REFUSE_INVALID);
	p = h_params(r);
	p.prompt_ids = (int32_t[]){3, 999};
	p.n_prompt = 2;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	T_STR_CONTAINS(e.msg, "vocabulary");
	p = h_params(r);
	p.prompt_ids = prompt;
	p.n_prompt = 512;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_TOO_LONG);
	enum sched_req_param prm = SCHED_PARAM_NONE;
	T_CHECK(sched_check_param(h.s, &p, &prm, &e) == SCHED_REFUSE_TOO_LONG && prm == SCHED_PARAM_PROMPT);
	p.n_prompt = 500;
	p.max_tokens = 13;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_TOO_LONG);
	T_STR_CONTAINS(e.msg, "512");
	T_CHECK(sched_check_param(h.s, &p, &prm, &e) == SCHED_REFUSE_TOO_LONG && prm == SCHED_PARAM_MAX_TOKENS);
	p = h_params(r);
	p.n = 5;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	p = h_params(r);
	p.priority = 3;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	p = h_params(r);
	p.sampling.top_p = 0.0f;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	p = h_params(r);
	p.sampling.temperature = -1.0f;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	p = h_params(r);
	const char *stops[] = {"ab"};
	p.stop_strings = stops;
	p.n_stop_strings = 1;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID); /* no detokenizer */
	p = h_params(r);
	struct sched_logit_bias lb = {.token_id = 5, .bias = 1000.0f};
	p.sampling.logit_bias = &lb;
	p.sampling.n_logit_bias = 1;
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) && why == SCHED_REFUSE_INVALID);
	T_CHECK(r->n_events == 0);

	/* queue bound: two wait, the third is refused with 429 */
	p = h_params(r);
	p.sampling = sched_sampling_defaults();
	T_CHECK(sched_check(h.s, &p, &e) == SCHED_ACCEPTED);
	p.sampling = (struct sched_sampling){0};
	T_CHECK(sched_check(h.s, &p, &e) == SCHED_REFUSE_INVALID);
	T_CHECK(sched_check_param(h.s, &p, &prm, &e) == SCHED_REFUSE_INVALID && prm == SCHED_PARAM_TOP_P);
	p = h_params(r);
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) == ST_OK && why == SCHED_ACCEPTED);
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) == ST_OK);
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) == ST_BUSY && why == SCHED_REFUSE_QUEUE_FULL);
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_requests_waiting == 2 && st.n_refused[SCHED_REFUSE_QUEUE_FULL] == 1);
	T_CHECK(st.n_refused[SCHED_REFUSE_INVALID] >= 7 && st.n_refused[SCHED_REFUSE_TOO_LONG] == 2);
	/* once they run, the queue has room again */
	struct err e2 = {0};
	T_CHECK(sched_step(h.s, NULL, &e2) == ST_OK);
	T_CHECK(sched_submit(h.s, &p, &id, &why, &e) == ST_OK);
	h_run(&h, 1000);
	T_CHECK(r->ch[0].finished);
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_finished[SCHED_FINISH_LENGTH] == 3 && st.n_blocks_used == 0);
	h_close(&h);
	h_req_free(r);
}

static void test_chunked_budget_and_decode_first(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	struct sched_options so = {.max_num_batched_tokens = 48, .disable_prefix_caching = true};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[300];
	h_rand_tokens(prompt, 300, fo.vocab, &g_rng);
	struct h_req *a = h_req_new(prompt, 20, 1, 40, h_sp(0, 1));
	a->ignore_eos = true;
	T_CHECK(!h_submit(&h, a));
	struct err e = {0};
	uint32_t nt;
	T_CHECK(!sched_step(h.s, &nt, &e) && nt == 20 && h.f.last.seq_sample[0]);
	T_CHECK(!sched_step(h.s, &nt, &e) && nt == 1); /* a decodes alone */
	/* b: a 150-token prompt, chunked around a's decode */
	struct h_req *b = h_req_new(prompt + 20, 150, 1, 5, h_sp(0, 2));
	b->ignore_eos = true;
	T_CHECK(!h_submit(&h, b));
	uint32_t prefill = 0, steps = 0;
	while (!b->ch[0].n && steps < 20) {
		T_CHECK(!sched_step(h.s, &nt, &e));
		steps++;
		const struct fake_step_record *rec = &h.f.last;
		T_CHECK(rec->n_tokens <= 48);
		/* decode first: the first sequence is a's single token */
		T_CHECK(rec->n_seqs == 2 && rec->seq_tokens[0] == 1 && rec->seq_sample[0]);
		prefill += rec->seq_tokens[1];
		/* the budget is filled while prefill remains */
		if (prefill < 150)
			T_CHECK(rec->n_tokens == 48 && !rec->seq_sample[1]);
		else
			T_CHECK(rec->seq_sample[1]);
	}
	T_CHECK(prefill == 150 && steps == 4); /* 47 + 47 + 47 + 9 */
	struct sched_stats hs;
	sched_stats_get(h.s, &hs);
	/* steps so far: 20 tokens, 1, then 48, 48, 48, 10 */
	T_CHECK(hs.iter_tokens_count[0] == 1 && hs.iter_tokens_count[2] == 1 && hs.iter_tokens_count[3] == 1 &&
		hs.iter_tokens_count[4] == 3 && hs.iter_tokens_sum == 20 + 1 + 48 * 3 + 10 && hs.n_steps == 6);
	h_run(&h, 1000);
	T_CHECK(!h_check_ref(&h, a) && !h_check_ref(&h, b));
	h_close(&h);
	h_req_free(a);
	h_req_free(b);
}

static void test_prefix_cache(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	T_CHECK(!h_open(&h, &fo, NULL));
	int32_t prompt[200];
	h_rand_tokens(prompt, 200, fo.vocab, &g_rng);
	struct h_req *a = h_req_new(prompt, 100, 1, 8, h_sp(0.8f, 11));
	T_CHECK(!h_submit(&h, a));
	h_run(&h, 1000);
	T_CHECK(a->ch[0].fin.n_cached_tokens == 0);
	/* b shares a's first 100 tokens: 6 full blocks (96 tokens) come from the cache */
	struct h_req *b = h_req_new(prompt, 130, 1, 8, h_sp(0.8f, 12));
	uint64_t before = h.f.n_tokens_total;
	T_CHECK(!h_submit(&h, b));
	h_run(&h, 1000);
	T_CHECK(b->ch[0].fin.n_cached_tokens == 96);
	T_CHECK(h.f.n_tokens_total - before == (130 - 96) + b->ch[0].n - 1);
	T_CHECK(!h_check_ref(&h, a) && !h_check_ref(&h, b));
	/* the whole prompt cached: the last token is still recomputed */
	struct h_req *c = h_req_new(prompt, 96, 1, 4, h_sp(0, 0));
	T_CHECK(!h_submit(&h, c));
	h_run(&h, 1000);
	T_CHECK(c->ch[0].fin.n_cached_tokens == 80 && !h_check_ref(&h, c));
	/* chained hashes: same second block, different first block -> no hit */
	int32_t other[64];
	memcpy(other, prompt, sizeof(other));
	other[3] ^= 1;
	struct h_req *d = h_req_new(other, 64, 1, 4, h_sp(0, 0));
	T_CHECK(!h_submit(&h, d));
	h_run(&h, 1000);
	T_CHECK(d->ch[0].fin.n_cached_tokens == 0 && !h_check_ref(&h, d));
	/* chained hashes, the case that needs the chain: [P,Q] and [Q,R] cached,
	 * [P,R,...] may reuse P but not R (R's cached state follows Q, not P) */
	int32_t P[16], Q[16], R[16], pq[33], qr[33], pr[40];
	h_rand_tokens(P, 16, fo.vocab, &g_rng);
	h_rand_tokens(Q, 16, fo.vocab, &g_rng);
	h_rand_tokens(R, 16, fo.vocab, &g_rng);
	memcpy(pq, P, 64), memcpy(pq + 16, Q, 64), pq[32] = 9;
	memcpy(qr, Q, 64), memcpy(qr + 16, R, 64), qr[32] = 9;
	memcpy(pr, P, 64), memcpy(pr + 16, R, 64), memcpy(pr + 32, P, 32);
	struct h_req *c1 = h_req_new(pq, 33, 1, 2, h_sp(0, 0)), *c2 = h_req_new(qr, 33, 1, 2, h_sp(0, 0));
	struct h_req *c3 = h_req_new(pr, 40, 1, 4, h_sp(0, 0));
	T_CHECK(!h_submit(&h, c1) && !h_submit(&h, c2));
	h_run(&h, 1000);
	T_CHECK(!h_submit(&h, c3));
	h_run(&h, 1000);
	T_CHECKF(c3->ch[0].fin.n_cached_tokens == 16, "%u", c3->ch[0].fin.n_cached_tokens);
	T_CHECK(!h_check_ref(&h, c1) && !h_check_ref(&h, c2) && !h_check_ref(&h, c3));
	h_req_free(c1);
	h_req_free(c2);
	h_req_free(c3);
	/* a cache salt isolates tenants */
	struct h_req *s2 = h_req_new(prompt, 100, 1, 4, h_sp(0, 0));
	struct sched_request_params p = h_params(s2);
	p.cache_salt = 42;
	struct err e = {0};
	enum sched_refusal why;
	T_CHECK(!sched_submit(h.s, &p, &s2->id, &why, &e));
	h_run(&h, 1000);
	T_CHECK(s2->ch[0].fin.n_cached_tokens == 0 && !h_check_ref(&h, s2));
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.prefix_cache_hits_tokens == 96 + 80 + 16);
	T_CHECK(st.prefix_cache_queries_tokens == 100 + 130 + 96 + 64 + 33 + 33 + 40 + 100);
	T_CHECK(st.n_blocks_used == 0 && st.n_blocks_cached_free > 0);
	h_close(&h);
	h_req_free(a);
	h_req_free(b);
	h_req_free(c);
	h_req_free(d);
	h_req_free(s2);
}

static void test_lru_eviction(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.n_blocks = 16;
	T_CHECK(!h_open(&h, &fo, NULL));
	int32_t pa[64], pb[64], pc[192];
	h_rand_tokens(pa, 64, fo.vocab, &g_rng);
	h_rand_tokens(pb, 64, fo.vocab, &g_rng);
	h_rand_tokens(pc, 192, fo.vocab, &g_rng);
	/* a then b: 4 + 4 blocks cached (prompts of 64 plus 1 decode block each) */
	struct h_req *a = h_req_new(pa, 64, 1, 1, h_sp(0, 0)), *b = h_req_new(pb, 64, 1, 1, h_sp(0, 0));
	T_CHECK(!h_submit(&h, a));
	h_run(&h, 100);
	T_CHECK(!h_submit(&h, b));
	h_run(&h, 100);
	/* c needs 12 blocks: the 8 uncached free ones, then the 4 least recently used cached ones (a's) */
	struct h_req *c = h_req_new(pc, 192, 1, 1, h_sp(0, 0));
	T_CHECK(!h_submit(&h, c));
	h_run(&h, 100);
	/* a's prefix is gone, b's (more recent) is still there */
	struct h_req *a2 = h_req_new(pa, 64, 1, 1, h_sp(0, 0)), *b2 = h_req_new(pb, 64, 1, 1, h_sp(0, 0));
	T_CHECK(!h_submit(&h, b2));
	h_run(&h, 100);
	T_CHECK(!h_submit(&h, a2));
	h_run(&h, 100);
	T_CHECKF(b2->ch[0].fin.n_cached_tokens == 48, "%u", b2->ch[0].fin.n_cached_tokens);
	T_CHECKF(a2->ch[0].fin.n_cached_tokens == 0, "%u", a2->ch[0].fin.n_cached_tokens);
	T_CHECK(!h_check_ref(&h, a2) && !h_check_ref(&h, b2) && !h_check_ref(&h, c));
	h_close(&h);
	h_req_free(a);
	h_req_free(b);
	h_req_free(c);
	h_req_free(a2);
	h_req_free(b2);
}

static void test_preemption(int caching)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.n_blocks = 12; /* 192 tokens for 4 requests that want ~100 each */
	fo.eos_bias = -20.0f;
	struct sched_options so = {.disable_prefix_caching = !caching};
	T_CHECK(!h_open(&h, &fo, &so));
	struct h_req *r[4];
	for (int i = 0; i < 4; i++) {
		int32_t prompt[40];
		h_rand_tokens(prompt, 40, fo.vocab, &g_rng);
		r[i] = h_req_new(prompt, 20 + 5 * i, 1, 70, h_sp(i % 2 ? 0.9f : 0.0f, 100 + i));
		if (i == 3)
			r[i]->sp.presence_penalty = 0.5f, r[i]->sp.repetition_penalty = 1.2f;
		T_CHECK(!h_submit(&h, r[i]));
	}
	h_run(&h, 5000);
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECKF(st.n_preemptions > 0, "no preemption happened");
	int preempted = 0;
	for (int i = 0; i < 4; i++) {
		T_CHECK(!h_check_ref(&h, r[i]));
		preempted += r[i]->ch[0].fin.timing.n_preemptions > 0;
		h_req_free(r[i]);
	}
	T_CHECK(preempted > 0);
	/* the oldest request is never the victim */
	T_CHECK(st.n_blocks_used == 0);
	h_close(&h);
}

static void test_abort(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	struct sched_options so = {.max_num_seqs = 1};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[100];
	h_rand_tokens(prompt, 100, fo.vocab, &g_rng);
	struct h_req *a = h_req_new(prompt, 100, 1, 50, h_sp(0, 0)), *b = h_req_new(prompt, 30, 1, 50, h_sp(0, 0));
	T_CHECK(!h_submit(&h, a) && !h_submit(&h, b));
	struct err e = {0};
	T_CHECK(!sched_step(h.s, NULL, &e)); /* a: first chunk of 64 */
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 7 && st.n_requests_running == 1 && st.n_requests_waiting == 1);
	T_CHECK(sched_abort(h.s, a->id, SCHED_FINISH_ABORT) == ST_OK);
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && st.n_requests_running == 0);
	T_CHECK(a->ch[0].finished && a->ch[0].fin.finish == SCHED_FINISH_ABORT);
	T_CHECK(sched_abort(h.s, a->id, SCHED_FINISH_ABORT) == ST_NOTFOUND);
	/* abort while waiting */
	T_CHECK(sched_abort(h.s, b->id, SCHED_FINISH_TIMEOUT) == ST_OK && b->ch[0].fin.finish == SCHED_FINISH_TIMEOUT);
	e = (struct err){0};
	T_CHECK(sched_check_invariants(h.s, &e) == ST_OK);
	T_CHECK(!sched_has_work(h.s));
	/* a deadline in the past times out at the next step */
	struct h_req *c = h_req_new(prompt, 10, 1, 50, h_sp(0, 0));
	struct sched_request_params p = h_params(c);
	p.deadline_s = 1e-9;
	enum sched_refusal why;
	T_CHECK(!sched_submit(h.s, &p, &c->id, &why, &e));
	T_CHECK(!sched_step(h.s, NULL, &e));
	T_CHECK(c->ch[0].fin.finish == SCHED_FINISH_TIMEOUT && c->ch[0].n == 0);
	/* shutdown */
	struct h_req *d = h_req_new(prompt, 10, 1, 50, h_sp(0, 0));
	T_CHECK(!h_submit(&h, d));
	T_CHECK(!sched_step(h.s, NULL, &e));
	sched_abort_all(h.s, SCHED_FINISH_SHUTDOWN);
	T_CHECK(d->ch[0].fin.finish == SCHED_FINISH_SHUTDOWN && !d->bad_order);
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && st.n_finished[SCHED_FINISH_ABORT] == 1);
	h_close(&h);
	h_req_free(a);
	h_req_free(b);
	h_req_free(c);
	h_req_free(d);
}

static void test_n_sharing(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	struct sched_options so = {.disable_prefix_caching = true};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[150];
	h_rand_tokens(prompt, 150, fo.vocab, &g_rng);
	struct h_req *r = h_req_new(prompt, 150, 4, 12, h_sp(1.0f, 5));
	T_CHECK(!h_submit(&h, r));
	uint32_t peak = 0;
	while (sched_has_work(h.s)) {
		struct err e = {0};
		T_CHECK(!sched_step(h.s, NULL, &e));
		T_CHECK(!sched_check_invariants(h.s, &e));
		struct sched_stats st;
		sched_stats_get(h.s, &st);
		peak = st.n_blocks_used > peak ? st.n_blocks_used : peak;
	}
	T_CHECK(!h.f.error[0]);
	T_CHECK(!h_check_ref(&h, r));
	/* 144 shared prompt tokens (9 blocks) computed once, then 6 per child */
	uint32_t gen = 0;
	for (int c = 0; c < 4; c++)
		gen += r->ch[c].n;
	T_CHECKF(h.f.n_tokens_total == 144 + 4 * 6 + gen - 4, "%llu", (unsigned long long)h.f.n_tokens_total);
	T_CHECKF(peak <= 9 + 4 * 2, "peak %u blocks", peak);
	/* the choices differ (different seeds) */
	T_CHECK(memcmp(r->ch[0].toks, r->ch[1].toks, 12 * sizeof(int32_t)) || r->ch[0].n != r->ch[1].n);
	h_close(&h);
	h_req_free(r);
}

static void test_stops(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	fo.eos_bias = -50.0f;
	struct sched_options so = {.detokenize = fake_detok};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[20];
	h_rand_tokens(prompt, 20, fo.vocab, &g_rng);
	struct h_req *ref = h_req_new(prompt, 20, 1, 60, h_sp(0.7f, 99));
	T_CHECK(!h_submit(&h, ref));
	h_run(&h, 1000);
	T_CHECK(!h_check_ref(&h, ref) && ref->ch[0].n == 60);
	/* full text, and the byte offset where each token starts */
	char full[512];
	uint32_t off[61], nfull = 0;
	for (uint32_t i = 0; i < 60; i++) {
		off[i] = nfull;
		nfull += fake_detok(NULL, ref->ch[0].toks[i], false, full + nfull, 8);
	}
	off[60] = nfull;
	full[nfull] = 0;
	T_CHECK(ref->ch[0].n_text == nfull && !memcmp(ref->ch[0].text, full, nfull));
	/* a stop string straddling the boundary between tokens b-1 and b (plus one
	 * more byte each side if any), from b = 31 on: the first that is whole
	 * UTF-8 (the scheduler refuses others; fake_detok splits characters) */
	char stop[16];
	for (uint32_t b = 31; b < 58; b++) {
		uint32_t at = off[b];
		uint32_t s0 = at - 1 > off[b - 1] ? at - 1 : off[b - 1];
		uint32_t s1 = at + 1 < off[b + 1] ? at + 1 : off[b + 1];
		memcpy(stop, full + s0, s1 - s0 + 1);
		stop[s1 - s0 + 1] = 0;
		bool whole = true;
		for (size_t k = 0, l = 0, L = strlen(stop); whole && k < L; k += l)
			whole = model_utf8_classify((const uint8_t *)stop + k, L - k, &l) == 1;
		if (whole)
			break;
	}
	const char *first = strstr(full, stop);
	uint32_t want_bytes = (uint32_t)(first - full);
	struct h_req *r = h_req_new(prompt, 20, 1, 60, h_sp(0.7f, 99));
	struct sched_request_params p = h_params(r);
	const char *stops[] = {"zzzz", stop};
	p.stop_strings = stops;
	p.n_stop_strings = 2;
	struct err e = {0};
	enum sched_refusal why;
	T_CHECK(!sched_submit(h.s, &p, &r->id, &why, &e));
	h_run(&h, 1000);
	T_CHECK(r->ch[0].finished && r->ch[0].fin.finish == SCHED_FINISH_STOP && r->ch[0].fin.stop_string_index == 1);
	T_CHECKF(r->ch[0].n_text == want_bytes && !memcmp(r->ch[0].text, full, want_bytes), "text %u bytes, want %u",
		 r->ch[0].n_text, want_bytes);
	T_CHECK(!strstr(r->ch[0].text, stop));
	/* tokens up to the one completing the match are generated */
	uint32_t last = 0;
	while (off[last + 1] < want_bytes + strlen(stop))
		last++;
	T_CHECKF(r->ch[0].n == last + 1, "%u tokens, want %u", r->ch[0].n, last + 1);
	for (uint32_t i = 0; i < r->ch[0].n; i++)
		T_CHECK(r->ch[0].toks[i] == ref->ch[0].toks[i]);

	/* the same with include_stop_str_in_output */
	struct h_req *r2 = h_req_new(prompt, 20, 1, 60, h_sp(0.7f, 99));
	p = h_params(r2);
	p.stop_strings = stops;
	p.n_stop_strings = 2;
	p.include_stop_str_in_output = true;
	T_CHECK(!sched_submit(h.s, &p, &r2->id, &why, &e));
	h_run(&h, 1000);
	uint32_t with = want_bytes + (uint32_t)strlen(stop);
	T_CHECKF(r2->ch[0].n_text == with && !memcmp(r2->ch[0].text, full, with), "%u vs %u", r2->ch[0].n_text, with);
	T_CHECK(r2->ch[0].n == r->ch[0].n && r2->ch[0].fin.stop_string_index == 1);
	h_req_free(r2);

	/* stop token id: the 10th generated token stops it; text excludes it */
	struct h_req *t = h_req_new(prompt, 20, 1, 60, h_sp(0.7f, 99));
	t->stop_ids[0] = ref->ch[0].toks[9];
	t->n_stop_ids = 1;
	T_CHECK(!h_submit(&h, t));
	h_run(&h, 1000);
	T_CHECK(!h_check_ref(&h, t));
	uint32_t first_hit = 0;
	while (ref->ch[0].toks[first_hit] != t->stop_ids[0])
		first_hit++;
	T_CHECK(t->ch[0].n == first_hit + 1 && t->ch[0].fin.stop_token_id == t->stop_ids[0]);
	T_CHECK(t->ch[0].n_text == off[first_hit]);

	/* eos stops unless ignore_eos: force eos by logit_bias */
	struct kern_logit_bias lb = {.token_id = 1, .bias = 100.0f};
	struct h_req *u = h_req_new(prompt, 20, 1, 5, h_sp(0, 0));
	u->sp.logit_bias = &lb;
	u->sp.n_logit_bias = 1;
	T_CHECK(!h_submit(&h, u));
	struct h_req *v = h_req_new(prompt, 20, 1, 5, h_sp(0, 0));
	v->sp.logit_bias = &lb;
	v->sp.n_logit_bias = 1;
	v->ignore_eos = true;
	T_CHECK(!h_submit(&h, v));
	h_run(&h, 1000);
	T_CHECK(u->ch[0].n == 1 && u->ch[0].fin.finish == SCHED_FINISH_STOP && u->ch[0].fin.stop_token_id == 1);
	T_CHECK(v->ch[0].n == 5 && v->ch[0].fin.finish == SCHED_FINISH_LENGTH && v->ch[0].fin.n_output_tokens == 5);
	T_CHECK(!h_check_ref(&h, u) && !h_check_ref(&h, v));

	/* min_tokens: eos (forced by the bias) and a stop id are masked for the
	 * first 6 tokens, so the 7th token is eos */
	struct h_req *w = h_req_new(prompt, 20, 2, 20, h_sp(0.9f, 3));
	w->sp.logit_bias = &lb;
	w->sp.n_logit_bias = 1;
	w->stop_ids[0] = ref->ch[0].toks[0];
	w->n_stop_ids = 1;
	struct sched_request_params pw = h_params(w);
	pw.min_tokens = 6;
	T_CHECK(!sched_submit(h.s, &pw, &w->id, &why, &e));
	pw.min_tokens = 21;
	T_CHECK(sched_submit(h.s, &pw, NULL, &why, &e) == ST_INVALID && why == SCHED_REFUSE_INVALID);
	h_run(&h, 1000);
	for (uint32_t c = 0; c < 2; c++) {
		int32_t want[32], stopped;
		struct kern_sampling_params sp = w->sp;
		sp.seed = sched_choice_seed(w->sp.seed, c);
		uint32_t n = fake_reference_min(&h.fo, prompt, 20, &sp, 20, 6, false, w->stop_ids, 1, 4096, want, &stopped);
		T_CHECK(n == 7 && stopped == 1);
		T_CHECK(w->ch[c].n == n && !memcmp(w->ch[c].toks, want, n * sizeof(int32_t)));
		T_CHECK(w->ch[c].fin.finish == SCHED_FINISH_STOP && w->ch[c].fin.stop_token_id == 1);
		for (uint32_t i = 0; i < 6; i++)
			T_CHECK(w->ch[c].toks[i] != 1 && w->ch[c].toks[i] != w->stop_ids[0]);
	}
	h_req_free(w);
	h_close(&h);
	h_req_free(ref);
	h_req_free(r);
	h_req_free(t);
	h_req_free(u);
	h_req_free(v);
}

static void test_seed_determinism(void)
{
	int32_t prompt[50];
	h_rand_tokens(prompt, 50, 256, &g_rng);
	int32_t out[3][40];
	uint32_t n[3];
	for (int run = 0; run < 3; run++) {
		struct harness h;
		struct fake_exec_options fo = h_default_fake();
		fo.eos_bias = -50.0f;
		struct sched_options so = {.max_num_batched_tokens = run == 2 ? 7 : 0};
		T_CHECK(!h_open(&h, &fo, &so));
		struct h_req *others[6] = {0};
		if (run >= 1) /* different batch company and step boundaries */
			for (int i = 0; i < 6; i++) {
				others[i] = h_req_new(prompt + i, 30, 1, 20 + i, h_sp(1.0f, 1000 + i));
				T_CHECK(!h_submit(&h, others[i]));
			}
		struct h_req *r = h_req_new(prompt, 50, 1, 40, h_sp(1.0f, 123456789));
		r->sp.top_k = 50;
		r->sp.top_p = 0.9f;
		r->sp.logprobs = true;
		r->sp.top_logprobs = 3;
		T_CHECK(!h_submit(&h, r));
		h_run(&h, 5000);
		T_CHECK(!h_check_ref(&h, r) && r->ch[0].logprob_seen);
		n[run] = r->ch[0].n;
		memcpy(out[run], r->ch[0].toks, sizeof(out[run]));
		for (int i = 0; i < 6; i++)
			h_req_free(others[i]);
		h_req_free(r);
		h_close(&h);
	}
	T_CHECK(n[0] == 40 && n[1] == 40 && n[2] == 40);
	T_CHECK(!memcmp(out[0], out[1], sizeof(out[0])) && !memcmp(out[0], out[2], sizeof(out[0])));
}

static void test_priority(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	struct sched_options so = {.policy = SCHED_POLICY_PRIORITY, .max_num_seqs = 1};
	T_CHECK(!h_open(&h, &fo, &so));
	int32_t prompt[10];
	h_rand_tokens(prompt, 10, fo.vocab, &g_rng);
	struct h_req *lo = h_req_new(prompt, 10, 1, 3, h_sp(0, 0)), *hi = h_req_new(prompt, 10, 1, 3, h_sp(0, 0));
	struct sched_request_params p = h_params(lo);
	p.priority = 5;
	struct err e = {0};
	enum sched_refusal why;
	T_CHECK(!sched_submit(h.s, &p, &lo->id, &why, &e));
	p = h_params(hi);
	p.priority = -1;
	T_CHECK(!sched_submit(h.s, &p, &hi->id, &why, &e));
	T_CHECK(!sched_step(h.s, NULL, &e));
	T_CHECK(hi->ch[0].n == 1 && lo->ch[0].n == 0);
	h_run(&h, 100);
	T_CHECK(hi->ch[0].fin.timing.finish_s <= lo->ch[0].fin.timing.first_scheduled_s);
	h_close(&h);
	h_req_free(lo);
	h_req_free(hi);
}

/* Under the priority policy the victim of a preemption is the lowest
 * priority, even when it is the older one. */
static void test_priority_preemption(void)
{
	for (int policy = 0; policy < 2; policy++) {
		struct harness h;
		struct fake_exec_options fo = h_default_fake();
		fo.n_blocks = 8;
		fo.eos_bias = -50.0f;
		struct sched_options so = {.policy = policy ? SCHED_POLICY_PRIORITY : SCHED_POLICY_FCFS,
					   .disable_prefix_caching = true};
		T_CHECK(!h_open(&h, &fo, &so));
		int32_t prompt[40];
		h_rand_tokens(prompt, 40, fo.vocab, &g_rng);
		struct h_req *lo = h_req_new(prompt, 40, 1, 40, h_sp(0, 0)), *hi = h_req_new(prompt + 1, 39, 1, 40, h_sp(0, 0));
		struct sched_request_params p = h_params(lo);
		p.priority = policy ? 5 : 0;
		struct err e = {0};
		enum sched_refusal why;
		T_CHECK(!sched_submit(h.s, &p, &lo->id, &why, &e));
		T_CHECK(!sched_step(h.s, NULL, &e)); /* lo is admitted first */
		p = h_params(hi);
		T_CHECK(!sched_submit(h.s, &p, &hi->id, &why, &e));
		h_run(&h, 1000);
		T_CHECK(!h_check_ref(&h, lo) && !h_check_ref(&h, hi));
		/* FCFS preempts the newer (hi), priority the lower-priority (lo) */
		T_CHECKF((policy ? lo : hi)->ch[0].fin.timing.n_preemptions > 0 &&
				 (policy ? hi : lo)->ch[0].fin.timing.n_preemptions == 0,
			 "policy %d: lo %u hi %u preemptions", policy, lo->ch[0].fin.timing.n_preemptions,
			 hi->ch[0].fin.timing.n_preemptions);
		h_close(&h);
		h_req_free(lo);
		h_req_free(hi);
	}
}

static void test_executor_failure(void)
{
	struct harness h;
	struct fake_exec_options fo = h_default_fake();
	T_CHECK(!h_open(&h, &fo, NULL));
	int32_t prompt[30];
	h_rand_tokens(prompt, 30, fo.vocab, &g_rng);
	struct h_req *a = h_req_new(prompt, 30, 2, 10, h_sp(0, 0));
	T_CHECK(!h_submit(&h, a));
	struct err e = {0};
	T_CHECK(!sched_step(h.s, NULL, &e));
	h.f.fail_at_step = (int32_t)h.f.n_steps;
	T_CHECK(sched_step(h.s, NULL, &e) == ST_CUDA);
	T_CHECK(a->ch[0].fin.finish == SCHED_FINISH_ERROR && a->ch[1].fin.finish == SCHED_FINISH_ERROR);
	struct sched_stats st;
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && !sched_has_work(h.s));
	/* the scheduler carries on */
	struct h_req *b = h_req_new(prompt, 30, 1, 10, h_sp(0, 0));
	T_CHECK(!h_submit(&h, b));
	h_run(&h, 100);
	T_CHECK(!h_check_ref(&h, b));
	/* a sample outside the vocabulary is an executor failure too */
	struct h_req *c = h_req_new(prompt, 30, 1, 10, h_sp(0, 0));
	T_CHECK(!h_submit(&h, c));
	h.f.bad_token_at_step = (int32_t)h.f.n_steps;
	T_CHECK(sched_step(h.s, NULL, &e) == ST_INVALID);
	T_CHECK(c->ch[0].finished && c->ch[0].fin.finish == SCHED_FINISH_ERROR && c->ch[0].n == 0);
	sched_stats_get(h.s, &st);
	T_CHECK(st.n_blocks_used == 0 && !sched_has_work(h.s));
	h_req_free(c);
	h_close(&h);
	h_req_free(a);
	h_req_free(b);
}

int main(void)
{
	g_rng = h_seed();
	test_refusals();
	test_chunked_budget_and_decode_first();
	test_prefix_cache();
	test_lru_eviction();
	test_preemption(1);
	test_preemption(0);
	test_abort();
	test_n_sharing();
	test_stops();
	test_seed_determinism();
	test_priority();
	test_priority_preemption();
	test_executor_failure();
	return test_exit();
}
