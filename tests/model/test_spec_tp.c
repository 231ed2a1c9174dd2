/*
 * tests/model/test_spec_tp.c: speculative decoding under tensor parallelism
 * (model/spec.h with a comm, model/exec_tp.c carrying the drafts), ranks as
 * threads over the CPU comm backend, world size 2, precision fp32 (where
 * world size 2 gives world size 1's logits to summation order).
 *
 * On the tiny June checkpoint (MTP, K = 1..3) and the tiny 0731 FP8 one
 * (DSpark, K = 1..5), a fresh random prompt for each K:
 *  - group A speculates; rank 0's draft hook replaces the drafts by the true
 *    greedy continuation corrupted at position j (step i: i mod (K + 1)
 *    accepted), and rank 1 runs rank 0's plans through the worker loop;
 *  - group B (also world size 2) proposes nothing and verifies exactly the
 *    drafts A accepted.
 * Every token of A and B equals the plain world-size-1 greedy output, and
 * after every step each rank's whole block pool (every layer's rings,
 * compressor windows, compressed rows, indexer keys, the MTP ring; DSpark's
 * drafter rings) in A is bit-identical to the same rank's in B: rejected
 * drafts leave no trace on any rank. For the largest K the drafter's own
 * drafts at world size 2 agree with world size 1's, and a verify that fails
 * on rank 0 alone fails on every rank while the group goes on.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "comm/comm.h"
#include "model/dspark.h"
#include "model/exec_tp.h"
#include "model/state.h"
#include "tests/model/fwd_harness.h"
#include "tests/model/route_gap.h"
#include "tests/model/spec_harness.h"
#include "tests/test.h"

#define BT 32
#define NB 8
#define NP 40
#define NGEN 36 /* positions to 76: past the block boundary at 64 and around the 32-row ring */
#define NGEN_OWN 16
#define MAX_K_MTP 3
#define MAX_K_DSPARK 5

static struct model_checkpoint *g_ck;

static struct model_exec_cpu *make(int rank, int world, struct comm *c, bool mtp)
{
	struct model_exec_cpu_options o = {.ck = g_ck, .block_tokens = BT, .n_blocks = NB, .max_step_tokens = 64,
					   .max_step_seqs = 4, .precision = MODEL_PREC_FP32, .load_mtp = mtp,
					   .rank = rank, .world_size = world, .comm = c};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &o, &e) == ST_OK, "create rank %d: %s", rank, e.msg);
	return x;
}

/* One world-size-2 group: rank 0 in the calling thread, rank 1 a thread
 * running the worker loop over its own speculating executor. steps_done
 * counts rank 1's finished steps, so the test reads its state only when it
 * has finished the step rank 0 returned from. */
struct group {
	struct comm_cpu_group *g;
	struct comm *c[2];
	struct model_exec_cpu *x[2];
	struct model_spec_exec *sx[2];
	void *dsp[2]; /* DSpark: each rank's drafter (owned by sx) */
	struct model_exec_tp *tp;
	struct exec counted; /* rank 1's executor, counting */
	atomic_uint steps_done;
	pthread_t th;
	bool started;
	enum status worker_st;
	char worker_msg[ERR_MSG_BYTES];
};

static enum status counted_step(void *ctx, const struct exec_step *s, struct exec_sample *out, struct err *e)
{
	struct group *gr = ctx;
	struct exec *in = model_spec_exec_exec(gr->sx[1]);
	enum status st = in->ops->step(in->ctx, s, out, e);
	atomic_fetch_add(&gr->steps_done, 1);
	return st;
}

static void counted_release(void *ctx, uint64_t id)
{
	struct group *gr = ctx;
	struct exec *in = model_spec_exec_exec(gr->sx[1]);
	in->ops->seq_release(in->ctx, id);
}

static const struct exec_ops counted_ops = {.step = counted_step, .seq_release = counted_release};

static void *worker_main(void *arg)
{
	struct group *gr = arg;
	struct err e = {0};
	gr->worker_st = model_exec_tp_worker_run(&gr->counted, gr->c[1], NULL, &e);
	snprintf(gr->worker_msg, sizeof gr->worker_msg, "%s", e.msg);
	return NULL;
}

static bool group_open(struct group *gr, const struct spec_config *sc, bool no_propose, bool hook)
{
	memset(gr, 0, sizeof *gr);
	atomic_init(&gr->steps_done, 0);
	struct err e = {0};
	struct comm_cpu_group_options go = {.n_ranks = 2, .timeout_ms = 120000};
	T_CHECKF(comm_cpu_group_create(&gr->g, &go, &e) == ST_OK, "%s", e.msg);
	for (int r = 0; gr->g && r < 2; r++)
		T_CHECKF(comm_cpu_create(&gr->c[r], gr->g, r, &e) == ST_OK, "%s", e.msg);
	if (!gr->c[0] || !gr->c[1])
		return false;
	/* the executors are built one after the other: their creation makes no collective calls */
	for (int r = 0; r < 2; r++) {
		if (!(gr->x[r] = make(r, 2, gr->c[r], true)))
			return false;
		struct model_spec_exec_options so = {.x = gr->x[r], .cfg = *sc, .no_propose = no_propose,
						     .comm = gr->c[r], .draft_hook = r || !hook ? NULL : sh_hook};
		if (sc->method == MODEL_DRAFT_DSPARK) {
			T_CHECKF(spec_dspark_drafter_create(&so.drafter, gr->x[r], sc->num_speculative_tokens, &e) == ST_OK,
				 "DSpark drafter rank %d: %s", r, e.msg);
			if (!so.drafter.ops)
				return false;
			gr->dsp[r] = so.drafter.ctx;
		}
		T_CHECKF(model_spec_exec_create(&gr->sx[r], &so, &e) == ST_OK, "spec rank %d: %s", r, e.msg);
		if (!gr->sx[r])
			return false;
	}
	gr->counted = *model_spec_exec_exec(gr->sx[1]);
	gr->counted.ops = &counted_ops;
	gr->counted.ctx = gr;
	struct model_exec_tp_options to = {.inner = model_spec_exec_exec(gr->sx[0]), .comm = gr->c[0]};
	T_CHECKF(model_exec_tp_create(&gr->tp, &to, &e) == ST_OK, "%s", e.msg);
	if (!gr->tp)
		return false;
	T_CHECK(model_exec_tp_exec(gr->tp)->info.max_draft_tokens == sc->num_speculative_tokens);
	gr->started = pthread_create(&gr->th, NULL, worker_main, gr) == 0;
	T_CHECK(gr->started);
	return gr->started;
}

static void group_close(struct group *gr)
{
	model_exec_tp_destroy(gr->tp); /* SHUTDOWN ends the worker loop */
	if (!gr->started && gr->c[0])
		comm_abort(gr->c[0], "test group not started");
	if (gr->started) {
		pthread_join(gr->th, NULL);
		T_CHECKF(gr->worker_st == ST_OK, "rank 1: %s", gr->worker_msg);
	}
	for (int r = 0; r < 2; r++) {
		model_spec_exec_destroy(gr->sx[r]);
		model_exec_cpu_destroy(gr->x[r]);
		comm_destroy(gr->c[r]);
	}
	comm_cpu_group_destroy(gr->g);
}

/* Waits until rank 1 has finished n steps (bounded: a lost rank fails the test). */
static bool group_wait(struct group *gr, unsigned n)
{
	for (int i = 0; i < 60000; i++) {
		if (atomic_load(&gr->steps_done) >= n)
			return true;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	return false;
}

/* The block pools of two executors of the same rank, bit for bit; the first
 * differing layer (what names the array) or -1. */
static int state_diff(const struct model_state *a, const struct model_state *b, const char **what)
{
	size_t W = a->window, d = (size_t)a->head_dim, nb = a->n_blocks;
	for (int l = 0; l < a->n_layers; l++) {
		const struct model_layer_state *x = &a->ls[l], *y = &b->ls[l];
		const float *p[7][2] = {{x->ring, y->ring},   {x->cmp, y->cmp},         {x->cmp_kv, y->cmp_kv},
					{x->cmp_score, y->cmp_score}, {x->ikeys, y->ikeys}, {x->icmp_kv, y->icmp_kv},
					{x->icmp_score, y->icmp_score}};
		size_t len[7] = {nb * W * d,
				 nb * (size_t)x->per_block * d,
				 nb * (size_t)x->cmp_state_floats,
				 nb * (size_t)x->cmp_state_floats,
				 nb * (size_t)x->per_block * (size_t)a->index_head_dim,
				 nb * (size_t)x->icmp_state_floats,
				 nb * (size_t)x->icmp_state_floats};
		static const char *names[7] = {"ring", "cmp", "cmp_kv", "cmp_score", "ikeys", "icmp_kv", "icmp_score"};
		for (int i = 0; i < 7; i++)
			if (p[i][0] && len[i] && memcmp(p[i][0], p[i][1], len[i] * sizeof(float))) {
				*what = names[i];
				return l;
			}
	}
	return -1;
}

/* sh_lockstep_step, except that A may propose fewer than K drafts: the MTP
 * chain stays inside the step's block table, so right before a block
 * boundary it is shorter (which schedule of acceptances meets one depends on
 * K). Returns the tokens A made (0 after a failed step). */
static uint32_t lockstep_step(struct sh_lockstep *ls)
{
	struct exec_sample o;
	struct sh_seq *a = ls->a, *b = ls->b;
	const uint32_t K = ls->max_drafts, nd = ls->n_drafts, want = ls->steps % (K + 1);
	const uint32_t acc = want < nd ? want : nd;
	T_CHECKF(nd >= 1 && nd <= K, "A proposed %u drafts at %u", nd, a->n_tok);
	sh_hook_st.next = a->n_tok + acc + 1;
	sh_hook_st.corrupt = (ls->steps + 1) % (K + 1);
	uint32_t made = sh_step(ls->ea, a, ls->drafts, nd, &o);
	if (!made)
		return 0;
	ls->accepted_at[o.n_extra]++;
	T_CHECKF(o.n_extra == acc, "step %u: accepted %u, expected %u", ls->steps, o.n_extra, acc);
	ls->n_drafts = o.n_next_draft;
	memcpy(ls->drafts, o.next_draft, sizeof ls->drafts);
	uint32_t made_b = sh_step(ls->eb, b, a->toks + b->n_tok, made - 1, &o);
	T_CHECKF(made_b == made && o.n_extra == made - 1, "B made %u of %u", made_b, made);
	return made;
}

/* DSpark: the drafter rings of sequence id, stage by stage, over the
 * positions they hold; the first differing stage or -1. */
static int rings_diff(void *da, void *db, uint64_t id, const struct model_config *cfg)
{
	uint32_t W = (uint32_t)cfg->sliding_window, d = (uint32_t)cfg->head_dim;
	for (int k = 0; k < (int)cfg->n_draft_layers; k++) {
		const float *ra, *rb;
		uint32_t a0, a1, b0, b1;
		struct err e = {0};
		if (spec_dspark_ring(da, id, k, &ra, &a0, &a1, &e) || spec_dspark_ring(db, id, k, &rb, &b0, &b1, &e) ||
		    a0 != b0 || a1 != b1)
			return k;
		for (uint32_t p = a0; p < a1; p++)
			if (memcmp(ra + (size_t)(p % W) * d, rb + (size_t)(p % W) * d, d * sizeof(float)))
				return k;
	}
	return -1;
}

static void test_spec(enum model_draft_kind method, uint32_t K, const int32_t *truth, uint32_t vocab)
{
	const char *name = method == MODEL_DRAFT_DSPARK ? "DSpark" : "MTP";
	struct sh_seq a, b;
	sh_seq_init(&a, 7, NP, BT, NB, 1);
	memcpy(a.toks, truth, NP * sizeof(int32_t));
	b = a;
	sh_hook_st = (struct sh_hook_state){.truth = truth, .n_prompt = NP, .vocab = vocab};
	struct spec_config sc = {method, K};
	struct group ga, gb;
	bool ok = group_open(&ga, &sc, false, true) && group_open(&gb, &sc, true, false);
	if (ok) {
		struct sh_lockstep ls = {.ea = model_exec_tp_exec(ga.tp), .eb = model_exec_tp_exec(gb.tp), .a = &a,
					 .b = &b, .max_drafts = K, .check_b_accepts_all = true};
		uint32_t bad_state = 0, bad_tok = 0, n_steps = 1;
		sh_lockstep_prefill(&ls);
		while (a.n_tok < NP + NGEN) {
			if (!lockstep_step(&ls))
				break;
			n_steps++;
			bad_tok += memcmp(a.toks, truth, a.n_tok * sizeof(int32_t)) != 0 ||
				   memcmp(b.toks, truth, b.n_tok * sizeof(int32_t)) != 0;
			T_CHECK(group_wait(&ga, n_steps) && group_wait(&gb, n_steps));
			for (int r = 0; r < 2; r++) {
				const char *what = "";
				int l = state_diff(model_exec_cpu_state(ga.x[r]), model_exec_cpu_state(gb.x[r]), &what);
				if (l >= 0 && bad_state++ < 3)
					fprintf(stderr, "%s K %u step %u (position %u): rank %d layer %d %s differs\n", name, K,
						ls.steps, a.n_cached, r, l, what);
				int k = ga.dsp[r] ? rings_diff(ga.dsp[r], gb.dsp[r], a.id, model_checkpoint_config(g_ck)) : -1;
				if (k >= 0 && bad_state++ < 3)
					fprintf(stderr, "%s K %u step %u (position %u): rank %d drafter ring of stage %d differs\n",
						name, K, ls.steps, a.n_cached, r, k);
			}
			ls.steps++;
		}
		fprintf(stderr, "%s K %u, world size 2: %u verify steps to %u tokens; accepted 0..%u drafts: %u %u %u %u %u %u; "
				"state mismatches %u, token mismatches %u\n", name, K, ls.steps, a.n_tok, K, ls.accepted_at[0],
			ls.accepted_at[1], ls.accepted_at[2], ls.accepted_at[3], ls.accepted_at[4], ls.accepted_at[5],
			bad_state, bad_tok);
		T_CHECK(bad_state == 0);
		T_CHECK(bad_tok == 0);
		for (uint32_t j = 0; j <= K; j++)
			T_CHECKF(ls.accepted_at[j] > 0, "K %u: no step accepted %u drafts", K, j);
	}
	group_close(&ga);
	group_close(&gb);
}

/* The drafter's own drafts: a world-size-2 group and a world-size-1
 * speculating executor, each verifying what it proposed, make the plain
 * tokens, and the drafts agree (the drafter is sharded like the target; an
 * argmax may flip where the fp32 summation order moves a near tie, so 90 %
 * agreement is asked, where a wrongly sharded drafter agrees by chance). */
static void test_own_drafts(enum model_draft_kind method, uint32_t K, const int32_t *truth)
{
	struct spec_config sc = {method, K};
	struct sh_seq a, b;
	sh_seq_init(&a, 9, NP, BT, NB, 1);
	memcpy(a.toks, truth, NP * sizeof(int32_t));
	b = a;
	struct group g;
	struct model_exec_cpu *x1 = make(0, 1, NULL, true);
	struct model_spec_exec *s1 = NULL;
	struct err e = {0};
	struct model_spec_exec_options so = {.x = x1, .cfg = sc};
	T_CHECKF(x1 && model_spec_exec_create(&s1, &so, &e) == ST_OK, "world size 1: %s", e.msg);
	uint32_t n_drafts = 0, n_same = 0, n_acc = 0, bad_tok = 0;
	if (group_open(&g, &sc, false, false) && s1) {
		struct exec_sample oa, ob;
		int32_t da[EXEC_SPEC_MAX_DRAFT], db[EXEC_SPEC_MAX_DRAFT];
		uint32_t na = 0, nb = 0;
		while (a.n_tok < NP + NGEN_OWN) {
			if (!sh_step(model_exec_tp_exec(g.tp), &a, da, na, &oa) || !sh_step(model_spec_exec_exec(s1), &b, db, nb, &ob))
				break;
			n_acc += oa.n_extra;
			bad_tok += memcmp(a.toks, truth, a.n_tok * sizeof(int32_t)) != 0 ||
				   memcmp(b.toks, truth, b.n_tok * sizeof(int32_t)) != 0;
			na = oa.n_next_draft;
			nb = ob.n_next_draft;
			memcpy(da, oa.next_draft, sizeof da);
			memcpy(db, ob.next_draft, sizeof db);
			if (a.n_tok == b.n_tok) /* the same tokens so far: the same drafts are due */
				for (uint32_t i = 0; i < na && i < nb; i++) {
					n_drafts++;
					n_same += da[i] == db[i];
				}
		}
	}
	fprintf(stderr, "%s K %u own drafts: world size 2 agrees with world size 1 on %u of %u drafts, accepted %u; "
			"token mismatches %u\n", method == MODEL_DRAFT_DSPARK ? "DSpark" : "MTP", K, n_same, n_drafts, n_acc,
		bad_tok);
	T_CHECK(bad_tok == 0);
	T_CHECK(n_drafts > 0 && n_same * 10 >= n_drafts * 9);
	if (g.tp && a.n_tok > NP) {
		/* a verify that fails on rank 0 alone (its sampler refuses top_p 0;
		 * workers do not sample) fails on every rank, and the group goes on */
		int32_t d = a.toks[a.n_tok - 1];
		a.sp.top_p = 0.0f;
		struct exec_sample o;
		struct err e = {0};
		T_CHECK(sh_step_status(model_exec_tp_exec(g.tp), &a, &d, 1, &o, &e) != ST_OK);
		struct sh_seq f;
		sh_seq_init(&f, 11, 8, BT, NB, 5000);
		T_CHECK(sh_step(model_exec_tp_exec(g.tp), &f, NULL, 0, &o) == 1);
		T_CHECK(!model_exec_tp_failed(g.tp));
	}
	group_close(&g);
	model_spec_exec_destroy(s1);
	model_exec_cpu_destroy(x1);
}

/* The plain world-size-1 greedy run of a fresh random prompt; returns the
 * smallest gap between the top two logprobs over its picks, and the
 * smallest routing margin in *route_gap (route_gap.h). */
static float run_plain(struct sh_seq *c, uint32_t upto, double *route_gap)
{
	sh_seq_init(c, 7, NP, BT, NB, 5000);
	c->sp.logprobs = true;
	c->sp.top_logprobs = 2;
	struct model_exec_cpu *xc = make(0, 1, NULL, false);
	struct exec_sample o;
	float gap = INFINITY;
	rg_begin();
	while (xc && c->n_tok < upto) {
		if (!sh_step(model_exec_cpu_exec(xc), c, NULL, 0, &o))
			break;
		if (o.out.n_top == 2)
			gap = fminf(gap, o.out.top_logprobs[0] - o.out.top_logprobs[1]);
	}
	*route_gap = rg_end(NULL);
	model_exec_cpu_destroy(xc);
	c->sp.logprobs = false;
	c->sp.top_logprobs = 0;
	return gap;
}

/* World size 2 sums in another order: its logits differ from world size 1's
 * by ~1e-5 at most, so where two of the 129280 random-weight logits are
 * closer than that its greedy pick may be the other one, with correct code
 * (a few in 10^5 a token, ~300 tokens a run); and where two experts' scores
 * are within ~1e-6 it may route the token differently (route_gap.h). Truths
 * with a top-2 gap under NEAR_TIE or a routing margin under RG_NEAR_TIE are
 * drawn again (a fresh prompt; ~10 % of them). */
#define NEAR_TIE 1e-4f

int main(void)
{
	if (!fh_tiny_dir())
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	srand((unsigned)test_seed());
	rg_install(); /* before any executor: the plain runs measure their routing margins */
	/* the June release (one MTP layer, K = 1..3), then the 0731 release (three DSpark stages, K = 1..5) */
	for (int ckp = 0; ckp < 2; ckp++) {
		g_ck = ckp ? fh_open_0731("fp8") : fh_open("bf16");
		T_CHECKF(g_ck != NULL, "no tiny %s checkpoint", ckp ? "0731" : "June");
		if (!g_ck)
			break;
		uint32_t V = (uint32_t)model_checkpoint_config(g_ck)->vocab_size;
		enum model_draft_kind method = ckp ? MODEL_DRAFT_DSPARK : MODEL_DRAFT_MTP;
		uint32_t max_k = ckp ? MAX_K_DSPARK : MAX_K_MTP;
		for (uint32_t K = 1; K <= max_k; K++) {
			struct sh_seq c;
			int tries = 0;
			float gap;
			double rgap;
			while (((gap = run_plain(&c, NP + NGEN + max_k + 2, &rgap)) < NEAR_TIE || rgap < RG_NEAR_TIE) &&
			       ++tries < 10)
				fprintf(stderr, "K %u: the plain run has a near-tie (top-2 gap %g, routing margin %g): another "
						"prompt\n", K, gap, rgap);
			T_CHECKF(tries < 10, "K %u: 10 prompts with a near-tie", K);
			fprintf(stderr, "K %u: plain world-size-1 run, smallest top-2 logprob gap %g, routing margin %g\n", K,
				gap, rgap);
			test_spec(method, K, c.toks, V);
			if (K == max_k)
				test_own_drafts(method, K, c.toks);
		}
		model_checkpoint_destroy(g_ck);
	}
	return test_exit();
}
