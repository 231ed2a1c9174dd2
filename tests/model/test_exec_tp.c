/*
 * tests/model/test_exec_tp.c: the tensor-parallel step-plan protocol
 * (model/exec_tp.h) without a model.
 *
 * 1. Encoding: random plans (tokens, positions, block tables, sampling
 *    parameters with logit bias, histories) survive encode -> decode field by
 *    field and re-encode to the same bytes; every truncation and random byte
 *    corruption of an encoded plan decodes to ST_INVALID or to a plan whose
 *    arrays stay inside their bounds (ASan checks), never a crash.
 * 2. Protocol: over the cpu comm backend with 3 ranks, rank 0's wrapper
 *    executor broadcasts random plans, pings and releases; every worker's
 *    executor sees exactly rank 0's plans, in order; SHUTDOWN ends the
 *    workers with ST_OK.
 * 3. Failure: a worker that aborts the group in its step makes rank 0's next
 *    call fail, calls on_fail once, and nobody hangs.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "model/exec_tp.h"
#include "tests/test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return n ? (uint32_t)(g_rng % n) : 0;
}

/* A random plan with its own storage. */
struct rplan {
	struct exec_step step;
	int32_t tok[256], pos[256];
	uint32_t qs[9], blk[64];
	struct exec_seq seqs[8];
	struct kern_sampling_params sp[8];
	struct kern_logit_bias lb[8][4];
	int32_t prompt[8][40], output[8][40];
};

static void make_plan(struct rplan *p)
{
	memset(p, 0, sizeof *p);
	uint32_t n_seqs = rnd(9), n_tok = 0, n_blk = 0, n_sample = 0;
	for (uint32_t i = 0; i < n_seqs; i++) {
		uint32_t q = rnd(30);
		p->qs[i] = n_tok;
		for (uint32_t k = 0; k < q; k++) {
			p->tok[n_tok + k] = (int32_t)rnd(129280);
			p->pos[n_tok + k] = (int32_t)(100 + k);
		}
		n_tok += q;
		struct exec_seq *s = &p->seqs[i];
		s->seq_id = ((uint64_t)rnd(1u << 31) << 32) | rnd(1u << 31);
		s->n_cached_tokens = rnd(1000);
		s->n_context_tokens = s->n_cached_tokens + q;
		s->n_blocks = rnd(8);
		s->block_table_start = n_blk;
		for (uint32_t k = 0; k < s->n_blocks; k++)
			p->blk[n_blk + k] = rnd(5000);
		n_blk += s->n_blocks;
		s->state_slot = rnd(2) ? EXEC_NO_SLOT : rnd(64);
		s->restore_state = rnd(2);
		s->sample = q > 0 && rnd(2);
		n_sample += s->sample;
		s->n_draft = s->sample && q > 1 && rnd(2) ? 1 + rnd(q - 1 < 5 ? q - 1 : 5) : 0; /* speculative decoding */
		s->has_next_token = rnd(2);
		s->next_token = s->has_next_token ? (int32_t)rnd(129280) : 0;
		if (rnd(3)) {
			struct kern_sampling_params *sp = &p->sp[i];
			sp->temperature = (float)rnd(200) / 100.0f;
			sp->top_p = (float)(1 + rnd(100)) / 100.0f;
			sp->top_k = (int32_t)rnd(50) - 1;
			sp->min_p = (float)rnd(100) / 100.0f;
			sp->presence_penalty = (float)rnd(400) / 100.0f - 2.0f;
			sp->frequency_penalty = (float)rnd(400) / 100.0f - 2.0f;
			sp->repetition_penalty = (float)(1 + rnd(300)) / 100.0f;
			sp->seed = ((uint64_t)rnd(1u << 31) << 33) ^ rnd(1u << 31);
			sp->n_logit_bias = rnd(5);
			for (uint32_t k = 0; k < sp->n_logit_bias; k++)
				p->lb[i][k] = (struct kern_logit_bias){(int32_t)rnd(1000), (float)rnd(200) - 100.0f};
			sp->logit_bias = sp->n_logit_bias ? p->lb[i] : NULL;
			sp->logprobs = rnd(2);
			sp->top_logprobs = rnd(21);
			s->sampling = sp;
		}
		uint32_t np = rnd(41), no = rnd(41);
		for (uint32_t k = 0; k < np; k++)
			p->prompt[i][k] = (int32_t)rnd(129280);
		for (uint32_t k = 0; k < no; k++)
			p->output[i][k] = (int32_t)rnd(129280);
		s->prompt_ids = np ? p->prompt[i] : NULL;
		s->n_prompt = np;
		s->output_ids = no ? p->output[i] : NULL;
		s->n_output = no;
		static struct exec_prompt_lp plp; /* evaluation: only its presence travels */
		s->prompt_lp = np && rnd(3) == 0 ? &plp : NULL;
	}
	p->qs[n_seqs] = n_tok;
	p->step = (struct exec_step){.n_tokens = n_tok, .token_ids = p->tok, .positions = p->pos, .n_seqs = n_seqs,
				     .seqs = p->seqs, .query_start = p->qs, .block_ids = p->blk, .n_block_ids = n_blk,
				     .n_sample = n_sample};
}

static bool same_ids(const int32_t *a, const int32_t *b, uint32_t n)
{
	return n == 0 || (a && b && !memcmp(a, b, (size_t)n * 4));
}

static bool same_plan(const struct exec_step *a, const struct exec_step *b)
{
	if (a->n_tokens != b->n_tokens || a->n_seqs != b->n_seqs || a->n_block_ids != b->n_block_ids ||
	    a->n_sample != b->n_sample)
		return false;
	if (!same_ids(a->token_ids, b->token_ids, a->n_tokens) || !same_ids(a->positions, b->positions, a->n_tokens) ||
	    memcmp(a->query_start, b->query_start, ((size_t)a->n_seqs + 1) * 4) ||
	    (a->n_block_ids && memcmp(a->block_ids, b->block_ids, (size_t)a->n_block_ids * 4)))
		return false;
	for (uint32_t i = 0; i < a->n_seqs; i++) {
		const struct exec_seq *x = &a->seqs[i], *y = &b->seqs[i];
		if (x->seq_id != y->seq_id || x->n_cached_tokens != y->n_cached_tokens ||
		    x->n_context_tokens != y->n_context_tokens || x->n_blocks != y->n_blocks ||
		    x->block_table_start != y->block_table_start || x->state_slot != y->state_slot ||
		    x->restore_state != y->restore_state || x->sample != y->sample || x->n_prompt != y->n_prompt ||
		    x->n_output != y->n_output || !same_ids(x->prompt_ids, y->prompt_ids, x->n_prompt) ||
		    !same_ids(x->output_ids, y->output_ids, x->output_ids ? x->n_output : 0) ||
		    !x->sampling != !y->sampling || !x->prompt_lp != !y->prompt_lp || x->n_draft != y->n_draft ||
		    x->has_next_token != y->has_next_token || x->next_token != y->next_token)
			return false;
		if (x->sampling) {
			const struct kern_sampling_params *p = x->sampling, *q = y->sampling;
			if (p->temperature != q->temperature || p->top_p != q->top_p || p->top_k != q->top_k ||
			    p->min_p != q->min_p || p->presence_penalty != q->presence_penalty ||
			    p->frequency_penalty != q->frequency_penalty || p->repetition_penalty != q->repetition_penalty ||
			    p->seed != q->seed || p->n_logit_bias != q->n_logit_bias || p->logprobs != q->logprobs ||
			    p->top_logprobs != q->top_logprobs)
				return false;
			for (uint32_t k = 0; k < p->n_logit_bias; k++)
				if (p->logit_bias[k].token_id != q->logit_bias[k].token_id ||
				    p->logit_bias[k].bias != q->logit_bias[k].bias)
					return false;
		}
	}
	return true;
}

/* Reads every array of a decoded plan (ASan sees any out-of-bounds). */
static uint64_t touch(const struct exec_step *s)
{
	uint64_t h = 0;
	for (uint32_t i = 0; i < s->n_tokens; i++)
		h += (uint64_t)s->token_ids[i] + (uint64_t)s->positions[i];
	for (uint32_t i = 0; i <= s->n_seqs; i++)
		h += s->query_start[i];
	for (uint32_t i = 0; i < s->n_seqs; i++) {
		const struct exec_seq *q = &s->seqs[i];
		for (uint32_t k = 0; k < q->n_blocks; k++)
			h += s->block_ids[q->block_table_start + k];
		for (uint32_t k = 0; k < q->n_prompt; k++)
			h += (uint64_t)q->prompt_ids[k];
		for (uint32_t k = 0; q->output_ids && k < q->n_output; k++)
			h += (uint64_t)q->output_ids[k];
		if (q->sampling)
			for (uint32_t k = 0; k < q->sampling->n_logit_bias; k++)
				h += (uint64_t)q->sampling->logit_bias[k].token_id;
	}
	return h;
}

static void test_encoding(void)
{
	struct rplan *p = malloc(sizeof *p);
	struct model_tp_buf b = {0}, b2 = {0};
	struct model_tp_plan d = {0};
	struct err e = {0};
	int n_truncated = 0, n_corrupt_ok = 0;
	for (int it = 0; it < 300; it++) {
		make_plan(p);
		T_CHECK(model_exec_tp_plan_encode(&p->step, &b, &e) == ST_OK);
		T_CHECKF(model_exec_tp_plan_decode(&d, b.data, b.n, &e) == ST_OK, "iteration %d: %s", it, e.msg);
		T_CHECKF(same_plan(&p->step, &d.step), "iteration %d: decoded plan differs", it);
		T_CHECK(model_exec_tp_plan_encode(&d.step, &b2, &e) == ST_OK);
		T_CHECKF(b2.n == b.n && !memcmp(b.data, b2.data, b.n), "iteration %d: re-encoding differs", it);
		/* truncations */
		for (int k = 0; k < 8; k++) {
			size_t n = rnd((uint32_t)b.n);
			err_clear(&e);
			T_CHECKF(model_exec_tp_plan_decode(&d, b.data, n, &e) == ST_INVALID,
				 "a plan cut to %zu of %zu bytes decoded", n, b.n);
			n_truncated++;
		}
		/* corruption: invalid or in bounds */
		for (int k = 0; k < 8; k++) {
			memcpy(b2.data, b.data, b.n);
			for (int f = 0; f < 3; f++)
				b2.data[rnd((uint32_t)b.n)] ^= (uint8_t)(1u << rnd(8));
			err_clear(&e);
			if (model_exec_tp_plan_decode(&d, b2.data, b.n, &e) == ST_OK) {
				(void)touch(&d.step);
				n_corrupt_ok++;
			}
		}
	}
	fprintf(stderr, "encoding: 300 random plans round-tripped, %d truncations refused, %d corrupted plans still "
			"decodable (in bounds)\n", n_truncated, n_corrupt_ok);
	free(b.data);
	free(b2.data);
	model_exec_tp_plan_free(&d);
	free(p);
}

/* ---- Protocol over the cpu backend ---- */

#define N_RANKS 3
#define N_PLANS 40

struct rec_exec {
	struct exec ex;
	struct comm *comm;
	struct model_tp_buf seen[N_PLANS + 8];
	int n_seen;
	int n_released;
	int fail_at; /* -1 = never: abort the group at this step */
};

static enum status rec_step(void *ctx, const struct exec_step *s, struct exec_sample *out, struct err *e)
{
	struct rec_exec *r = ctx;
	if (r->n_seen == r->fail_at) {
		comm_abort(r->comm, "test worker fails on purpose");
		return err_set(e, ST_ABORTED, "test worker failed");
	}
	if (r->n_seen < N_PLANS + 8) {
		enum status st = model_exec_tp_plan_encode(s, &r->seen[r->n_seen], e);
		if (st)
			return st;
		r->n_seen++;
	}
	for (uint32_t k = 0; k < s->n_sample; k++)
		memset(&out[k], 0, sizeof out[k]);
	return ST_OK;
}

static void rec_release(void *ctx, uint64_t id)
{
	(void)id;
	((struct rec_exec *)ctx)->n_released++;
}

static const struct exec_ops rec_ops = {.step = rec_step, .seq_release = rec_release};

struct worker_job {
	struct comm_cpu_group *g;
	int rank;
	struct rec_exec rx;
	enum status st;
	char msg[ERR_MSG_BYTES];
};

static void *worker_main(void *arg)
{
	struct worker_job *j = arg;
	struct err e = {0};
	struct comm *c = NULL;
	j->st = comm_cpu_create(&c, j->g, j->rank, &e);
	if (!j->st) {
		j->rx.comm = c;
		j->rx.ex.ops = &rec_ops;
		j->rx.ex.ctx = &j->rx;
		j->st = model_exec_tp_worker_run(&j->rx.ex, c, NULL, &e);
	}
	snprintf(j->msg, sizeof j->msg, "%s", e.msg);
	comm_destroy(c);
	return NULL;
}

static int g_n_fail_calls;

static void on_fail(void *ctx, const char *msg)
{
	(void)ctx;
	(void)msg;
	g_n_fail_calls++;
}

static void run_group(int fail_rank)
{
	struct comm_cpu_group *g = NULL;
	struct err e = {0};
	struct comm_cpu_group_options go = {.n_ranks = N_RANKS, .timeout_ms = 20000};
	T_CHECK(comm_cpu_group_create(&g, &go, &e) == ST_OK);
	struct worker_job *jobs = calloc(N_RANKS, sizeof *jobs);
	pthread_t th[N_RANKS];
	for (int r = 1; r < N_RANKS; r++) {
		jobs[r].g = g;
		jobs[r].rank = r;
		jobs[r].rx.fail_at = r == fail_rank ? 5 : -1;
		pthread_create(&th[r], NULL, worker_main, &jobs[r]);
	}
	struct comm *c0 = NULL;
	T_CHECK(comm_cpu_create(&c0, g, 0, &e) == ST_OK);
	struct rec_exec *r0 = calloc(1, sizeof *r0);
	r0->ex.ops = &rec_ops;
	r0->ex.ctx = r0;
	r0->comm = c0;
	r0->fail_at = -1;
	struct model_exec_tp *tp = NULL;
	g_n_fail_calls = 0;
	struct model_exec_tp_options to = {.inner = &r0->ex, .comm = c0, .on_fail = on_fail};
	T_CHECK(model_exec_tp_create(&tp, &to, &e) == ST_OK);
	struct exec *ex = model_exec_tp_exec(tp);
	struct rplan *p = malloc(sizeof *p);
	struct exec_sample out[8];
	int n_ok = 0, n_fail = 0, n_release = 0;
	for (int i = 0; i < N_PLANS; i++) {
		make_plan(p);
		err_clear(&e);
		if (ex->ops->step(ex->ctx, &p->step, out, &e) == ST_OK)
			n_ok++;
		else
			n_fail++;
		if (rnd(3) == 0) {
			err_clear(&e);
			if (model_exec_tp_ping(tp, &e))
				n_fail += 0; /* counted by the next step */
		}
		if (rnd(4) == 0) {
			ex->ops->seq_release(ex->ctx, rnd(100));
			n_release++;
		}
	}
	free(p);
	model_exec_tp_destroy(tp);
	for (int r = 1; r < N_RANKS; r++)
		pthread_join(th[r], NULL);
	if (fail_rank < 0) {
		T_CHECKF(n_ok == N_PLANS, "%d of %d steps failed", n_fail, N_PLANS);
		T_CHECK(g_n_fail_calls == 0);
		for (int r = 1; r < N_RANKS; r++) {
			T_CHECKF(jobs[r].st == ST_OK, "rank %d: %s", r, jobs[r].msg);
			T_CHECKF(jobs[r].rx.n_seen == r0->n_seen, "rank %d ran %d plans, rank 0 %d", r, jobs[r].rx.n_seen,
				 r0->n_seen);
			T_CHECK(jobs[r].rx.n_released == n_release && r0->n_released == n_release);
			for (int i = 0; i < jobs[r].rx.n_seen && i < r0->n_seen; i++)
				T_CHECKF(jobs[r].rx.seen[i].n == r0->seen[i].n &&
						 !memcmp(jobs[r].rx.seen[i].data, r0->seen[i].data, r0->seen[i].n),
					 "rank %d plan %d differs from rank 0's", r, i);
		}
		fprintf(stderr, "protocol: %d plans, %d releases, every worker saw rank 0's plans\n", n_ok, n_release);
	} else {
		/* plan 5 reached every rank (rank 0's own step of it succeeds);
		 * the broadcast of plan 6 finds the group broken */
		T_CHECKF(n_ok == 6 && n_fail == N_PLANS - 6, "%d steps ok, %d failed (expected 6 and %d)", n_ok, n_fail,
			 N_PLANS - 6);
		T_CHECKF(g_n_fail_calls == 1, "on_fail called %d times", g_n_fail_calls);
		for (int r = 1; r < N_RANKS; r++)
			T_CHECKF(jobs[r].st != ST_OK, "rank %d ended OK after the group failed", r);
		fprintf(stderr, "failure: rank %d aborted at step 5; rank 0 failed %d later steps: %s\n", fail_rank,
			n_fail, e.msg);
	}
	for (int r = 0; r < N_RANKS; r++) {
		struct rec_exec *rx = r ? &jobs[r].rx : r0;
		for (int i = 0; i < N_PLANS + 8; i++)
			free(rx->seen[i].data);
	}
	comm_destroy(c0);
	comm_cpu_group_destroy(g);
	free(r0);
	free(jobs);
}

int main(void)
{
	g_rng ^= test_seed();
	test_encoding();
	run_group(-1);
	run_group(2);
	return test_exit();
}
