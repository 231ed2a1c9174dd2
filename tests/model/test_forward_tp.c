/*
 * tests/model/test_forward_tp.c: tensor-parallel CPU executors (ranks as
 * threads over the CPU comm backend) against world size 1, on the tiny
 * fp8 (FP8 + MXFP4) and nvfp4 checkpoints, world sizes 2 and 4: heads,
 * o_groups (wo_b column shards inside one FP8 block), experts and the
 * vocabulary split. Two sequences in mixed steps (prefill chunks and
 * decodes); every rank's logits of every token must match world size 1.
 *
 * Precision fp32 (the comparison is about sharding, not rounding). The
 * tolerance 1e-4 allows for the different fp32 summation order of the
 * all-reduces (wo_b and the MoE output are sums of per-rank partials).
 */
#include <pthread.h>

#include "comm/comm.h"
#include "tests/model/fwd_harness.h"
#include "tests/model/route_gap.h"
#include "tests/test.h"

#define N_A 60
#define N_B 40
#define N_TOK (N_A + N_B)

static struct model_checkpoint *g_ck;
static int32_t g_ids_a[N_A], g_ids_b[N_B];
static uint32_t g_vocab;

struct rank_job {
	int rank, world;
	struct comm_cpu_group *group;
	float *logits; /* [N_TOK, vocab] in step order */
	enum status st;
	char msg[ERR_MSG_BYTES];
};

/* The fixed step schedule: (A 37, B 40), (A 1, B 0), (A 22). */
static enum status run_schedule(struct model_exec_cpu *x, float *logits, struct err *e)
{
	struct fh_pool pool = {.n = 16};
	struct fh_seq a = {.id = 1, .ids = g_ids_a, .n_ids = N_A}, b = {.id = 2, .ids = g_ids_b, .n_ids = N_B};
	struct fh_seq *s1[2] = {&b, &a};
	uint32_t c1[2] = {N_B, 37};
	enum status st = fh_step(x, &pool, s1, c1, 2, logits, e);
	if (st)
		return st;
	struct fh_seq *s2[1] = {&a};
	uint32_t c2 = 1, c3 = N_A - 38;
	if ((st = fh_step(x, &pool, s2, &c2, 1, logits + (size_t)(N_B + 37) * g_vocab, e)))
		return st;
	return fh_step(x, &pool, s2, &c3, 1, logits + (size_t)(N_B + 38) * g_vocab, e);
}

static struct model_exec_cpu *make(int rank, int world, struct comm *c, struct err *e)
{
	struct model_exec_cpu_options o = {.ck = g_ck, .block_tokens = 32, .n_blocks = 16, .max_step_tokens = 128,
					   .max_step_seqs = 4, .precision = MODEL_PREC_FP32, .rank = rank,
					   .world_size = world, .comm = c, .dev = fh_device()};
	struct model_exec_cpu *x = NULL;
	return model_exec_cpu_create(&x, &o, e) == ST_OK ? x : NULL;
}

static void *rank_main(void *arg)
{
	struct rank_job *j = arg;
	struct err e = {0};
	struct comm *c = NULL;
	struct model_exec_cpu *x = NULL;
	j->st = comm_cpu_create(&c, j->group, j->rank, &e);
	if (!j->st) {
		x = make(j->rank, j->world, c, &e);
		j->st = x ? run_schedule(x, j->logits, &e) : e.st;
		if (j->st)
			comm_abort(c, "test rank failed");
	}
	snprintf(j->msg, sizeof j->msg, "%s", e.msg);
	model_exec_cpu_destroy(x);
	comm_destroy(c);
	return NULL;
}

static void check_world(const char *variant, int world, const float *ref)
{
	struct comm_cpu_group *g = NULL;
	struct err e = {0};
	struct comm_cpu_group_options go = {.n_ranks = world, .timeout_ms = 120000};
	T_CHECKF(comm_cpu_group_create(&g, &go, &e) == ST_OK, "%s", e.msg);
	if (!g)
		return;
	struct rank_job jobs[4];
	pthread_t th[4];
	for (int r = 0; r < world; r++) {
		jobs[r] = (struct rank_job){.rank = r, .world = world, .group = g};
		jobs[r].logits = malloc((size_t)N_TOK * g_vocab * sizeof(float));
		pthread_create(&th[r], NULL, rank_main, &jobs[r]);
	}
	for (int r = 0; r < world; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < world; r++) {
		T_CHECKF(jobs[r].st == ST_OK, "%s world %d rank %d: %s", variant, world, r, jobs[r].msg);
		if (jobs[r].st == ST_OK) {
			double d = fh_max_abs_diff(ref, jobs[r].logits, (size_t)N_TOK * g_vocab);
			fprintf(stderr, "%s world size %d, rank %d vs world size 1: max |logit diff| %.3g\n", variant, world,
				r, d);
			T_CHECKF(d <= 1e-4, "%s world %d rank %d: %g", variant, world, r, d);
		}
		free(jobs[r].logits);
	}
	comm_cpu_group_destroy(g);
}

int main(void)
{
	if (!fh_tiny_dir())
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	fh_rng_state ^= test_seed();
	rg_install(); /* before any executor: the reference runs measure their routing margins */
	const char *variants[] = {"fp8", "nvfp4"};
	for (int v = 0; v < 2; v++) {
		g_ck = fh_open(variants[v]);
		T_CHECK(g_ck != NULL);
		if (!g_ck)
			break;
		g_vocab = (uint32_t)model_checkpoint_config(g_ck)->vocab_size;
		struct err e = {0};
		struct model_exec_cpu *x = NULL;
		float *ref = malloc((size_t)N_TOK * g_vocab * sizeof(float));
		/* prompts whose reference routes every token with a margin: another
		 * world size may route a near-tie the other way (route_gap.h) */
		for (int attempt = 0; attempt < 10; attempt++) {
			g_ids_a[0] = g_ids_b[0] = 0;
			for (int i = 1; i < N_A; i++)
				g_ids_a[i] = (int32_t)fh_rand(g_vocab);
			for (int i = 1; i < N_B; i++)
				g_ids_b[i] = (int32_t)fh_rand(g_vocab);
			model_exec_cpu_destroy(x); /* a fresh reference executor for each prompt pair */
			x = make(0, 1, NULL, &e);
			T_CHECKF(x != NULL, "%s", e.msg);
			if (!x)
				break;
			long n_routed = 0;
			rg_begin();
			T_CHECKF(run_schedule(x, ref, &e) == ST_OK, "%s", e.msg);
			double gap = rg_end(&n_routed);
			fprintf(stderr, "%s: %ld routing decisions, smallest margin %.3g\n", variants[v], n_routed, gap);
			T_CHECKF(attempt < 9 || gap >= RG_NEAR_TIE, "%s: 10 prompts with a routing near-tie", variants[v]);
			if (gap >= RG_NEAR_TIE)
				break;
		}
		if (x) {
			model_exec_cpu_destroy(x);
			check_world(variants[v], 2, ref);
			if (v == 0)
				check_world(variants[v], 4, ref);
		}
		/* a world size that does not divide the heads is refused at load */
		struct model_exec_cpu *bad = make(0, 3, NULL, &e);
		T_CHECK(bad == NULL && e.st == ST_UNSUPPORTED);
		model_exec_cpu_destroy(bad);
		free(ref);
		model_checkpoint_destroy(g_ck);
	}
	return test_exit();
}
