/*
 * tests/model/test_dspark.c: DSpark speculation (model/dspark.h) at the
 * executor level on the tiny 0731 FP8 and NVFP4 checkpoints (generated into
 * the build directory's tiny-models-0731), reference precision, CPU.
 *
 *  - greedy: K = 1..5, the speculating executor with the drafter's own
 *    drafts produces the plain executor's greedy tokens token for token, a
 *    random 40-token prompt and 30 tokens on (blocks of 32 and 64, the
 *    32-token window and both compress ratios' windows crossed); then a second
 *    sequence with the same first 32 prompt tokens starts from the first's
 *    block 0 (a prefix-cache hit: its first step begins at position 32) and
 *    is equal to its own plain run too.
 *  - rollback: drafts replaced by the true continuation corrupted at draft
 *    j (j = 0..K in turn): after every step the drafter's rings (every
 *    stage, every position they hold) and the block pool are bit-identical
 *    to those of an executor given only the accepted drafts that never
 *    proposed (its drafter commits but never runs a block).
 *  - refusals: K = 0 / 6 and a drafter on an executor without the stages.
 */
#include "model/dspark.h"
#include "model/exec_cpu.h"
#include "model/forward.h"
#include "model/spec.h"
#include "model/state.h"
#include "tests/model/fwd_harness.h"
#include "tests/model/spec_harness.h"
#include "tests/test.h"

#define BT 32
#define NB 8
#define NP 40
#define NGEN 30
#define KMAX 5

static uint32_t V;

static struct model_exec_cpu *mk(struct model_checkpoint *ck, bool stages)
{
	return sh_exec(ck, BT, NB, stages, NULL);
}

/* A speculating executor with a DSpark drafter of K; *dctx its drafter's ctx. */
static struct model_spec_exec *mk_spec(struct model_exec_cpu *x, uint32_t K, bool no_propose, spec_draft_hook_fn hook,
				       void **dctx)
{
	struct err e = {0};
	struct spec_drafter dr;
	if (!x)
		return NULL;
	T_CHECKF(spec_dspark_drafter_create(&dr, x, K, &e) == ST_OK, "drafter: %s", e.msg);
	if (!dr.ops)
		return NULL;
	if (dctx)
		*dctx = dr.ctx;
	struct model_spec_exec_options o = {.x = x, .cfg = {MODEL_DRAFT_DSPARK, K}, .drafter = dr,
					    .no_propose = no_propose, .draft_hook = hook};
	struct model_spec_exec *sx = NULL;
	T_CHECKF(model_spec_exec_create(&sx, &o, &e) == ST_OK, "spec: %s", e.msg);
	return sx;
}

static void seq_init(struct sh_seq *q, uint64_t id)
{
	sh_seq_init(q, id, NP, BT, NB, 100000);
}

/* plain greedy: one token per step after the prefill */
static void run_plain(struct model_checkpoint *ck, struct sh_seq *c, uint32_t upto)
{
	struct model_exec_cpu *x = mk(ck, false);
	struct exec_sample o;
	while (x && c->n_tok < upto)
		if (!sh_step(model_exec_cpu_exec(x), c, NULL, 0, &o))
			break;
	model_exec_cpu_destroy(x);
}

/* speculative greedy with the drafter's own drafts; returns accepted drafts */
static uint32_t run_spec(struct exec *ex, struct sh_seq *a, uint32_t upto, uint32_t *n_steps)
{
	struct exec_sample o;
	int32_t drafts[EXEC_SPEC_MAX_DRAFT];
	uint32_t nd = 0, acc = 0;
	*n_steps = 0;
	while (a->n_tok < upto) {
		if (!sh_step(ex, a, drafts, nd, &o))
			break;
		acc += o.n_extra;
		nd = o.n_next_draft;
		memcpy(drafts, o.next_draft, sizeof drafts);
		++*n_steps;
	}
	return acc;
}

static int rings_diff(void *da, void *db, uint64_t id, int n_stages, uint32_t W, uint32_t d);

static void test_greedy(struct model_checkpoint *ck, const char *name)
{
	const struct model_config *cfg = model_checkpoint_config(ck);
	struct sh_seq c, c2;
	seq_init(&c, 1);
	seq_init(&c2, 2);
	memcpy(c2.toks, c.toks, BT * sizeof(int32_t)); /* the first block's tokens are shared */
	run_plain(ck, &c, NP + NGEN);
	run_plain(ck, &c2, NP + NGEN);
	for (uint32_t K = 1; K <= KMAX; K++) {
		struct model_exec_cpu *x = mk(ck, true);
		void *dx = NULL;
		struct model_spec_exec *sx = mk_spec(x, K, false, NULL, &dx);
		if (!sx) {
			model_exec_cpu_destroy(x);
			return;
		}
		T_CHECK(model_spec_exec_exec(sx)->info.max_draft_tokens == K);
		struct sh_seq a, a2;
		seq_init(&a, 1);
		memcpy(a.toks, c.toks, NP * sizeof(int32_t));
		uint32_t steps = 0, acc = run_spec(model_spec_exec_exec(sx), &a, NP + NGEN, &steps);
		uint32_t n = a.n_tok < c.n_tok ? a.n_tok : c.n_tok;
		T_CHECKF(n >= NP + NGEN && !memcmp(a.toks, c.toks, n * sizeof(int32_t)),
			 "%s K=%u: speculative greedy differs from plain", name, K);
		/* the prefix hit: sequence 2 on block 0 of sequence 1, its own blocks after it */
		seq_init(&a2, 2);
		memcpy(a2.toks, c2.toks, NP * sizeof(int32_t));
		a2.blocks[0] = 0;
		for (uint32_t i = 1; i < NB; i++)
			a2.blocks[i] = NB / 2 + i - 1 < NB ? NB / 2 + i - 1 : 0;
		a2.n_cached = BT;
		uint32_t steps2 = 0, acc2 = run_spec(model_spec_exec_exec(sx), &a2, NP + 10, &steps2);
		T_CHECKF(a2.n_tok >= NP + 10 && !memcmp(a2.toks, c2.toks, a2.n_tok * sizeof(int32_t)),
			 "%s K=%u: after a prefix hit speculative greedy differs from plain", name, K);
		fprintf(stderr, "%s K=%u: %u steps for %u tokens (%u drafts accepted); prefix hit: %u steps, %u accepted\n",
			name, K, steps, a.n_tok - NP, acc, steps2, acc2);
		if (K == KMAX) {
			/* the hit's drafter rings (taken from block 0's snapshot) equal those of a run from position 0 */
			struct model_exec_cpu *xr = mk(ck, true);
			void *dr = NULL;
			struct model_spec_exec *sr = mk_spec(xr, K, true, NULL, &dr);
			struct sh_seq r;
			seq_init(&r, 2);
			memcpy(r.toks, c2.toks, NP * sizeof(int32_t));
			uint32_t sr_steps = 0;
			if (sr)
				run_spec(model_spec_exec_exec(sr), &r, a2.n_tok, &sr_steps);
			int k = sr ? rings_diff(dx, dr, 2, (int)cfg->n_draft_layers, (uint32_t)cfg->sliding_window,
						(uint32_t)cfg->head_dim)
				   : 0;
			T_CHECKF(r.n_tok == a2.n_tok && k < 0, "%s: after a prefix hit the drafter rings of stage %d differ "
				 "from a run from position 0", name, k);
			model_spec_exec_destroy(sr);
			model_exec_cpu_destroy(xr);
		}
		model_spec_exec_destroy(sx);
		model_exec_cpu_destroy(x);
	}
}

/* ---- rollback: drafter rings and block pool bit-identical ---- */

static int rings_diff(void *da, void *db, uint64_t id, int n_stages, uint32_t W, uint32_t d)
{
	for (int k = 0; k < n_stages; k++) {
		const float *ra, *rb;
		uint32_t a0, a1, b0, b1;
		struct err e = {0};
		if (spec_dspark_ring(da, id, k, &ra, &a0, &a1, &e) || spec_dspark_ring(db, id, k, &rb, &b0, &b1, &e))
			return k;
		if (a0 != b0 || a1 != b1)
			return k;
		for (uint32_t p = a0; p < a1; p++)
			if (memcmp(ra + (size_t)(p % W) * d, rb + (size_t)(p % W) * d, d * sizeof(float)))
				return k;
	}
	return -1;
}

static int state_diff(const struct model_state *a, const struct model_state *b)
{
	size_t W = a->window, d = (size_t)a->head_dim, nb = a->n_blocks;
	for (int l = 0; l < a->n_layers; l++) {
		const struct model_layer_state *x = &a->ls[l], *y = &b->ls[l];
		if (memcmp(x->ring, y->ring, nb * W * d * sizeof(float)) ||
		    (x->cmp && memcmp(x->cmp, y->cmp, nb * (size_t)x->per_block * d * sizeof(float))) ||
		    (x->cmp_kv && memcmp(x->cmp_kv, y->cmp_kv, nb * (size_t)x->cmp_state_floats * sizeof(float))) ||
		    (x->ikeys &&
		     memcmp(x->ikeys, y->ikeys, nb * (size_t)x->per_block * (size_t)a->index_head_dim * sizeof(float))))
			return l;
	}
	return -1;
}

static void test_rollback(struct model_checkpoint *ck)
{
	const uint32_t K = KMAX;
	const struct model_config *cfg = model_checkpoint_config(ck);
	struct sh_seq c, a, b;
	seq_init(&c, 7);
	run_plain(ck, &c, NP + NGEN + K + 2);
	sh_hook_st = (struct sh_hook_state){.truth = c.toks, .n_prompt = NP, .vocab = V};
	a = b = c;
	a.n_tok = b.n_tok = NP;
	a.n_cached = b.n_cached = 0;
	struct model_exec_cpu *xa = mk(ck, true), *xb = mk(ck, true);
	void *da = NULL, *db = NULL;
	struct model_spec_exec *sa = mk_spec(xa, K, false, sh_hook, &da), *sb = mk_spec(xb, K, true, NULL, &db);
	if (!sa || !sb)
		goto out;
	struct sh_lockstep ls = {.ea = model_spec_exec_exec(sa), .eb = model_spec_exec_exec(sb), .a = &a, .b = &b,
				 .max_drafts = K};
	uint32_t bad_ring = 0, bad_state = 0;
	sh_lockstep_prefill(&ls);
	while (a.n_tok < NP + NGEN) {
		if (!sh_lockstep_step(&ls))
			break;
		int k = rings_diff(da, db, 7, (int)cfg->n_draft_layers, (uint32_t)cfg->sliding_window,
				   (uint32_t)cfg->head_dim);
		if (k >= 0 && bad_ring++ < 3)
			fprintf(stderr, "step %u (position %u): drafter ring of stage %d differs\n", ls.steps, a.n_cached,
				k);
		int l = state_diff(model_exec_cpu_state(xa), model_exec_cpu_state(xb));
		if (l >= 0 && bad_state++ < 3)
			fprintf(stderr, "step %u (position %u): layer %d state differs\n", ls.steps, a.n_cached, l);
		ls.steps++;
	}
	T_CHECK(!memcmp(a.toks, c.toks, a.n_tok * sizeof(int32_t)));
	const uint32_t *acc = ls.accepted_at;
	fprintf(stderr, "rollback: %u steps to %u tokens; accepted 0..5: %u %u %u %u %u %u; ring mismatches %u, "
			"state mismatches %u\n", ls.steps, a.n_tok, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], bad_ring,
		bad_state);
	T_CHECK(bad_ring == 0 && bad_state == 0);
	for (uint32_t j = 0; j <= K; j++)
		T_CHECKF(ls.accepted_at[j] > 0, "no step accepted %u drafts", j);
out:
	model_spec_exec_destroy(sa);
	model_spec_exec_destroy(sb);
	model_exec_cpu_destroy(xa);
	model_exec_cpu_destroy(xb);
}

static void test_refusals(struct model_checkpoint *ck)
{
	struct err e = {0};
	struct spec_drafter dr;
	struct model_exec_cpu *x = mk(ck, false);
	T_CHECK(x && spec_dspark_drafter_create(&dr, x, 3, &e) == ST_INVALID && strstr(e.msg, "stages"));
	model_exec_cpu_destroy(x);
	x = mk(ck, true);
	T_CHECK(x && spec_dspark_drafter_create(&dr, x, 0, &e) == ST_INVALID);
	T_CHECK(x && spec_dspark_drafter_create(&dr, x, 6, &e) == ST_INVALID);
	model_exec_cpu_destroy(x);
}

int main(void)
{
	srand((unsigned)test_seed());
	const char *variants[] = {"fp8", "nvfp4"};
	for (int i = 0; i < 2; i++) {
		struct model_checkpoint *ck = fh_open_0731(variants[i]);
		if (!ck) {
			fprintf(stderr, "no tiny 0731 checkpoint %s\n", variants[i]);
			return 1;
		}
		V = (uint32_t)model_checkpoint_config(ck)->vocab_size;
		if (i == 0) {
			test_refusals(ck);
			test_rollback(ck);
		}
		test_greedy(ck, variants[i]);
		model_checkpoint_destroy(ck);
	}
	return test_exit();
}
